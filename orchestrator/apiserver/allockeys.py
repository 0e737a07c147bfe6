"""The store keys that record which Service holds which ClusterIP and NodePort (pure).

Kubernetes since 1.27 keeps one IPAddress object per allocated ClusterIP, and its create fails
when the address is taken; this is the same idea with internal keys, outside every API
resource's prefix (no watch or list of a resource sees them):

- `/registry/orchestrator.dev/ipallocations/<ip>` for each address in `spec.clusterIPs`;
- `/registry/orchestrator.dev/portallocations/<port>` for each `nodePort` (one key per port
  number, whatever the protocol, as Kubernetes' port allocator; one Service may use a node port
  for a TCP and a UDP port of the same number).

The value names the holder (`owner_value`): namespace, name and uid of the Service.

Invariant (kept by `storage.ObjectStore`, which writes the keys in the same transaction as the
Service): the keys present are exactly the union of `held_keys` over the stored Services —
a key is created only if absent, so no two Services hold one value. `apiserver.services`'s
repair pass restores it should anything have broken it.
"""

from __future__ import annotations

import ipaddress

import msgpack

from orchestrator.kube.objects import Obj

__all__ = [
    "IP_PREFIX",
    "PORT_PREFIX",
    "SERVICES",
    "held_keys",
    "ip_key",
    "owner_value",
    "port_key",
    "value_of_key",
]

IP_PREFIX = "/registry/orchestrator.dev/ipallocations/"
PORT_PREFIX = "/registry/orchestrator.dev/portallocations/"
SERVICES = ("", "services")  # (group, plural) of the only kind that holds such keys


def ip_key(ip: str) -> str:
    return IP_PREFIX + ip


def port_key(port: int) -> str:
    return f"{PORT_PREFIX}{port}"


def _ips(spec: Obj) -> list[str]:
    ips = spec.get("clusterIPs")
    if not isinstance(ips, list) or not ips:
        ips = [spec.get("clusterIP")]
    out = []
    for ip in ips:
        if not isinstance(ip, str) or ip in ("", "None"):
            continue
        try:
            out.append(str(ipaddress.ip_address(ip)))  # one spelling per address
        except ValueError:
            continue
    return out


def held_keys(svc: Obj) -> frozenset[str]:
    """The allocation keys a stored Service holds: its ClusterIPs and NodePorts."""
    spec = svc.get("spec")
    if not isinstance(spec, dict):
        return frozenset()
    keys = {ip_key(ip) for ip in _ips(spec)}
    for port in spec.get("ports") or []:
        if isinstance(port, dict):
            node_port = port.get("nodePort")
            if type(node_port) is int and node_port > 0:
                keys.add(port_key(node_port))
    return frozenset(keys)


def owner_value(svc: Obj) -> bytes:
    """What an allocation key holds: who has it."""
    meta = svc.get("metadata") or {}
    packed: bytes = msgpack.packb(
        {
            "namespace": meta.get("namespace", ""),
            "name": meta.get("name", ""),
            "uid": meta.get("uid", ""),
        },
        use_bin_type=True,
    )
    return packed


def value_of_key(key: str) -> str:
    """The address or port a key stands for ("10.43.0.5", "30080")."""
    if key.startswith(IP_PREFIX):
        return key[len(IP_PREFIX) :]
    if key.startswith(PORT_PREFIX):
        return key[len(PORT_PREFIX) :]
    return key
