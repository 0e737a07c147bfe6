"""Agent-side networking: pod network, node proxy, node-local DNS (issue 19)."""
