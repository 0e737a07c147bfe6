"""The agent's side of the pod network: pod network, node proxy, node-local cluster DNS."""
