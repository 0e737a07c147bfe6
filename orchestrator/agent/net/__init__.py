"""The agent's side of the cluster network: pod network, node proxy, node-local DNS."""
