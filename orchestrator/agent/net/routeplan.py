"""The pod network's pure planner: Nodes -> the routes, neighbours and FDB entries to program.

Theory of operation
-------------------
Every node owns one `spec.podCIDR`. To reach another node's pods, a node needs (flannel's
scheme, with flannel's names so that flannel-aware tools read our Nodes):

* `host-gw` (nodes on one L2 segment): a route `<their podCIDR> via <their InternalIP>`.
* `vxlan` (routed networks): one vxlan device `flannel.1` (VNI 1, UDP 8472, no learning) whose
  address is our podCIDR's network address /32; per other node a route `<their podCIDR> via
  <their podCIDR's network address> dev flannel.1 onlink`, a permanent neighbour entry (that
  address -> their VTEP MAC) and an FDB entry (their VTEP MAC -> their public IP). The MAC
  and public IP come from the Node annotations `flannel.alpha.coreos.com/backend-data`
  (`{"VNI":1,"VtepMAC":"..."}`) and `.../public-ip` (default: the InternalIP).
* `none`: nothing (the user brings a network).

`node_net(node)` reads one Node (None while it has no podCIDR; `NodeNetError` for a malformed
one, which the caller logs and skips); `plan(...)` turns all of them into a `NetState`;
`diff(desired, current)` says what to add and remove. No I/O here: `routes.RouteDriver`
programs the result.

Invariants: our own node never gets a route; a node whose podCIDR lies outside the cluster CIDR
or overlaps ours or an earlier (by name) node's is skipped with a problem message, so two
routes never claim one prefix; a vxlan node without a VTEP MAC yet is skipped (it has not
published it: the route would black-hole).
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.kube.objects import Obj

__all__ = [
    "ANN_BACKEND_DATA",
    "ANN_BACKEND_TYPE",
    "ANN_PUBLIC_IP",
    "BACKENDS",
    "VXLAN_DEVICE",
    "VXLAN_PORT",
    "VXLAN_VNI",
    "Changes",
    "Fdb",
    "Neighbour",
    "NetState",
    "NodeNet",
    "NodeNetError",
    "Route",
    "backend_annotations",
    "diff",
    "node_net",
    "plan",
    "reusable_mac",
    "vtep_mac",
]

BACKENDS = ("vxlan", "host-gw", "none")
ANN_BACKEND_TYPE = "flannel.alpha.coreos.com/backend-type"
ANN_BACKEND_DATA = "flannel.alpha.coreos.com/backend-data"
ANN_PUBLIC_IP = "flannel.alpha.coreos.com/public-ip"
VXLAN_DEVICE = "flannel.1"
VXLAN_VNI = 1
VXLAN_PORT = 8472
_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")


class NodeNetError(ValueError):
    """A Node whose network facts cannot be used (the message names the Node and field)."""


@dataclass(frozen=True, order=True, slots=True)
class NodeNet:
    """What the pod network needs of one Node (also what the local store keeps of it)."""

    name: str
    pod_cidr: str  # normalized network, e.g. "10.42.1.0/24"
    internal_ip: str
    public_ip: str  # the VXLAN underlay address: the public-ip annotation, else the InternalIP
    vtep_mac: str = ""  # lower-case, "" when not published

    def to_json(self) -> Obj:
        return {
            "name": self.name,
            "podCIDR": self.pod_cidr,
            "internalIP": self.internal_ip,
            "publicIP": self.public_ip,
            "vtepMAC": self.vtep_mac,
        }

    @classmethod
    def from_json(cls, data: Obj) -> NodeNet:
        """The inverse of `to_json` (NodeNetError if the stored form is damaged)."""
        try:
            return cls(
                str(data["name"]),
                str(ipaddress.ip_network(str(data["podCIDR"]))),
                str(ipaddress.ip_address(str(data["internalIP"]))),
                str(ipaddress.ip_address(str(data["publicIP"]))),
                _mac(str(data.get("vtepMAC") or ""), str(data["name"])),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise NodeNetError(f"stored node network entry {data!r} is damaged: {exc}") from None


@dataclass(frozen=True, order=True, slots=True)
class Route:
    dst: str  # "10.42.1.0/24"
    gateway: str
    device: str = ""  # "" = the kernel's choice (host-gw); VXLAN_DEVICE with onlink (vxlan)


@dataclass(frozen=True, order=True, slots=True)
class Neighbour:
    ip: str
    mac: str


@dataclass(frozen=True, order=True, slots=True)
class Fdb:
    mac: str
    dst: str


@dataclass(frozen=True, slots=True)
class NetState:
    """Routes, neighbours and FDB entries: desired (`plan`) or programmed (the driver's read)."""

    routes: frozenset[Route] = frozenset()
    neighbours: frozenset[Neighbour] = frozenset()
    fdb: frozenset[Fdb] = frozenset()


@dataclass(frozen=True, slots=True)
class Changes:
    """What `diff` asks for; removals are applied before additions (a moved prefix)."""

    add_routes: tuple[Route, ...] = ()
    del_routes: tuple[Route, ...] = ()
    add_neighbours: tuple[Neighbour, ...] = ()
    del_neighbours: tuple[Neighbour, ...] = ()
    add_fdb: tuple[Fdb, ...] = ()
    del_fdb: tuple[Fdb, ...] = ()

    def __bool__(self) -> bool:
        return any(
            (
                self.add_routes,
                self.del_routes,
                self.add_neighbours,
                self.del_neighbours,
                self.add_fdb,
                self.del_fdb,
            )
        )


@dataclass(frozen=True, slots=True)
class Plan:
    state: NetState
    problems: tuple[str, ...] = field(default=())


def _mac(text: str, node: str) -> str:
    mac = text.strip().lower()
    if mac and not _MAC.match(mac):
        raise NodeNetError(f"node {node}: VtepMAC {text!r} is not a MAC address")
    return mac


def node_net(node: Obj) -> NodeNet | None:
    """The network facts of a Node; None while it has no podCIDR or no InternalIP yet."""
    meta = node.get("metadata") or {}
    name = str(meta.get("name") or "")
    cidr = str((node.get("spec") or {}).get("podCIDR") or "")
    addresses = (node.get("status") or {}).get("addresses") or []
    internal = next(
        (
            str(a.get("address") or "")
            for a in addresses
            if isinstance(a, dict) and a.get("type") == "InternalIP"
        ),
        "",
    )
    if not name or not cidr or not internal:
        return None
    annotations = meta.get("annotations") or {}
    try:
        network = ipaddress.ip_network(cidr, strict=True)
    except ValueError as exc:
        raise NodeNetError(f"node {name}: spec.podCIDR {cidr!r} is not a network: {exc}") from None
    try:
        ip = ipaddress.ip_address(internal)
    except ValueError:
        raise NodeNetError(f"node {name}: InternalIP {internal!r} is not an address") from None
    public_text = str(annotations.get(ANN_PUBLIC_IP) or "") or internal
    try:
        public = ipaddress.ip_address(public_text)
    except ValueError:
        raise NodeNetError(
            f"node {name}: {ANN_PUBLIC_IP} {public_text!r} is not an address"
        ) from None
    mac = vtep_mac(annotations, name)
    return NodeNet(name, str(network), str(ip), str(public), mac)


def vtep_mac(annotations: Mapping[str, Any], name: str) -> str:
    """The VtepMAC of a Node's `backend-data` annotation, lower-case; "" when none."""
    data_text = annotations.get(ANN_BACKEND_DATA)
    if not data_text:
        return ""
    try:
        data = json.loads(str(data_text))
    except ValueError:
        raise NodeNetError(f"node {name}: {ANN_BACKEND_DATA} is not JSON") from None
    return _mac(str(data.get("VtepMAC") or ""), name) if isinstance(data, dict) else ""


def reusable_mac(mac: str) -> bool:
    """Whether a published VtepMAC can be put back on our vxlan device: a unicast, non-zero
    MAC (the kernel refuses others; such an annotation is replaced by a fresh one)."""
    if not _MAC.match(mac.lower()):
        return False
    first = int(mac[:2], 16)
    return not first & 1 and mac.lower() != "00:00:00:00:00:00"


def backend_annotations(backend: str, public_ip: str, vtep_mac: str = "") -> dict[str, str]:
    """The flannel annotations a node publishes about itself."""
    out = {ANN_BACKEND_TYPE: backend, ANN_PUBLIC_IP: public_ip}
    if backend == "vxlan":
        out[ANN_BACKEND_DATA] = json.dumps(
            {"VNI": VXLAN_VNI, "VtepMAC": vtep_mac}, separators=(",", ":")
        )
    return out


def plan(
    backend: str,
    own_name: str,
    nodes: Iterable[NodeNet],
    cluster_cidr: ipaddress.IPv4Network | ipaddress.IPv6Network,
) -> Plan:
    """The desired state for node `own_name` (module doc); `problems` name skipped nodes."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown flannel backend {backend!r} (one of {', '.join(BACKENDS)})")
    by_name = {n.name: n for n in nodes}
    if backend == "none":
        return Plan(NetState())
    problems: list[str] = []
    taken: list[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str]] = []
    own = by_name.get(own_name)
    if own is not None:
        taken.append((ipaddress.ip_network(own.pod_cidr), own_name))
    routes: set[Route] = set()
    neighbours: set[Neighbour] = set()
    fdb: set[Fdb] = set()
    for name in sorted(by_name):
        if name == own_name:
            continue
        n = by_name[name]
        net = ipaddress.ip_network(n.pod_cidr)
        # same family checked first: subnet_of would raise TypeError across families
        if net.version != cluster_cidr.version or not net.subnet_of(cluster_cidr):  # type: ignore[arg-type]
            problems.append(
                f"node {name}: podCIDR {net} is outside the cluster CIDR {cluster_cidr}"
            )
            continue
        clash = next((other for prefix, other in taken if prefix.overlaps(net)), None)
        if clash is not None:
            problems.append(f"node {name}: podCIDR {net} overlaps node {clash}'s; skipped")
            continue
        if backend == "host-gw":
            routes.add(Route(str(net), n.internal_ip))
        else:
            if not n.vtep_mac:
                problems.append(f"node {name}: no VtepMAC published yet ({ANN_BACKEND_DATA})")
                continue
            gateway = str(net.network_address)
            routes.add(Route(str(net), gateway, VXLAN_DEVICE))
            neighbours.add(Neighbour(gateway, n.vtep_mac))
            fdb.add(Fdb(n.vtep_mac, n.public_ip))
        taken.append((net, name))
    return Plan(NetState(frozenset(routes), frozenset(neighbours), frozenset(fdb)), tuple(problems))


def diff(desired: NetState, current: NetState) -> Changes:
    """What turns `current` into `desired` (sorted, so the order is deterministic)."""
    return Changes(
        add_routes=tuple(sorted(desired.routes - current.routes)),
        del_routes=tuple(sorted(current.routes - desired.routes)),
        add_neighbours=tuple(sorted(desired.neighbours - current.neighbours)),
        del_neighbours=tuple(sorted(current.neighbours - desired.neighbours)),
        add_fdb=tuple(sorted(desired.fdb - current.fdb)),
        del_fdb=tuple(sorted(current.fdb - desired.fdb)),
    )
