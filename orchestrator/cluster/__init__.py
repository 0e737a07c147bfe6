"""Cluster membership: servers joining a cluster (`join`), the members' client addresses
(`members`) and the API endpoints every server publishes for agents (`apiendpoints`)."""
