"""The cluster's address plan and the pure cores of pod networking and Services.

Shared by the server (IPAM, Service allocators, EndpointSlices) and the node agent (CNI,
routes, node proxy, DNS): nothing here does I/O.
"""
