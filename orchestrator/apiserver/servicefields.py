"""A Service's allocated fields: what a write keeps, drops, checks and assigns (pure).

Kubernetes' Service REST storage, without storage:

- `carry_over(new, old)` (an update, before admission; Kubernetes' `patchAllocatedValues` and
  `dropTypeDependentFields`): a body that leaves out `clusterIP(s)`, `ipFamilies`,
  `ipFamilyPolicy` or a port's `nodePort` keeps the stored ones (`kubectl apply` of a manifest
  without them is not a change); a type change to `ExternalName` drops the ClusterIP fields, and
  one to a type without node ports drops the node ports, when the body left them as they were.
- `Assigner.assign(obj, old)` (after admission): checks the ClusterIP and node ports a user
  chose (a valid address of the service CIDR's family, inside it; ports inside the node port
  range; one family, single-stack) and fills what is missing from the allocators: `clusterIP`,
  `clusterIPs`, `ipFamilies`, `ipFamilyPolicy: SingleStack` for every type but `ExternalName`
  (`clusterIP: None` is headless: no address), and a node port per port for `NodePort` and
  `LoadBalancer` (unless `allocateLoadBalancerNodePorts: false`); two ports of one number
  (TCP and UDP) share one node port. It returns the allocation keys it chose itself, so a
  write that finds one taken by another API server can pick again.

Invariants: the input objects are never modified (the result copies what it changes: its
sub-trees may be shared with the stored object); values the old object holds are kept as
they are, never re-checked; every refusal is a 422 with the field and Kubernetes' wording.
The allocators are only the API server's view (`apiserver.services`): what makes a value
this Service's is the store key created with it (`storage.ObjectStore`).
"""

from __future__ import annotations

import ipaddress
import random
from typing import Any

from orchestrator.apiserver.allockeys import held_keys, ip_key, port_key
from orchestrator.kube import errors
from orchestrator.kube.errors import Cause
from orchestrator.kube.objects import Obj
from orchestrator.network.errors import AllocationError, RangeFull
from orchestrator.network.settings import NetworkSettings
from orchestrator.network.svcalloc import ClusterIPAllocator, NodePortAllocator

__all__ = ["Assigner", "carry_over", "needs_cluster_ip", "needs_node_ports"]

_IP_FIELDS = ("clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy")


def _type(spec: Obj) -> str:
    return str(spec.get("type") or "ClusterIP")


def needs_cluster_ip(spec: Obj) -> bool:
    return _type(spec) != "ExternalName"


def needs_node_ports(spec: Obj) -> bool:
    kind = _type(spec)
    return kind == "NodePort" or (
        kind == "LoadBalancer" and spec.get("allocateLoadBalancerNodePorts") is not False
    )


def _spec(obj: Obj) -> Obj:
    spec = obj.get("spec")
    return spec if isinstance(spec, dict) else {}


def _ports(spec: Obj) -> list[Obj]:
    ports = spec.get("ports")
    return [p for p in ports if isinstance(p, dict)] if isinstance(ports, list) else []


def _node_port(port: Obj) -> int:
    value = port.get("nodePort")
    return value if type(value) is int and value > 0 else 0


def carry_over(new: Obj, old: Obj) -> Obj:
    """`new` with the allocated values of `old` it left out (module doc); `new` if none."""
    new_spec, old_spec = _spec(new), _spec(old)
    spec = dict(new_spec)
    if needs_cluster_ip(old_spec) and needs_cluster_ip(spec):
        if not spec.get("clusterIP") and not spec.get("clusterIPs"):
            for f in ("clusterIP", "clusterIPs"):
                if old_spec.get(f):
                    spec[f] = old_spec[f]
        for f in ("ipFamilies", "ipFamilyPolicy"):
            if not spec.get(f) and old_spec.get(f):
                spec[f] = old_spec[f]
    elif needs_cluster_ip(old_spec) and _unchanged_ips(spec, old_spec):
        for f in _IP_FIELDS:  # -> ExternalName: drop what the body kept as it was
            spec.pop(f, None)
    ports = _ports(spec)
    if _ports(old_spec) and ports:
        old_node_ports = {_node_port(p) for p in _ports(old_spec)} - {0}
        if needs_node_ports(old_spec) and needs_node_ports(spec):
            # Missing node ports: the old one of the port of the same name, unless another
            # port of the body uses it (Kubernetes matches by name: a port's number may change).
            used = {_node_port(p) for p in ports}
            by_name = {str(p.get("name") or ""): _node_port(p) for p in _ports(old_spec)}
            patched = []
            for p in ports:
                if not _node_port(p):
                    value = by_name.get(str(p.get("name") or ""), 0)
                    if value and value not in used:
                        p = {**p, "nodePort": value}
                patched.append(p)
            ports = patched
        elif needs_node_ports(old_spec) and not needs_node_ports(spec):
            ports = [
                {k: v for k, v in p.items() if k != "nodePort"}
                if _node_port(p) in old_node_ports
                else p
                for p in ports
            ]
        spec["ports"] = ports
    if spec == new_spec:
        return new
    return {**new, "spec": spec}


def _unchanged_ips(spec: Obj, old_spec: Obj) -> bool:
    return spec.get("clusterIP") in (None, "", old_spec.get("clusterIP")) and spec.get(
        "clusterIPs"
    ) in (None, [], old_spec.get("clusterIPs"))


def _invalid(name: str, causes: list[Cause]) -> errors.ApiError:
    return errors.invalid("Service", "", name, causes)


def _cause(field: str, value: Any, message: str, reason: str = "FieldValueInvalid") -> Cause:
    return Cause(field, f"Invalid value: {value!r}: {message}", reason)


class Assigner:
    """Checks and fills a Service's allocated fields from the API server's allocators."""

    def __init__(
        self,
        settings: NetworkSettings,
        rng: random.Random | None,
        ips: ClusterIPAllocator | None = None,
        ports: NodePortAllocator | None = None,
    ) -> None:
        self.settings = settings
        self.rng = rng
        self.family = "IPv4" if settings.service_cidr.version == 4 else "IPv6"
        self.ips = ips or new_ip_allocator(settings)
        self.ports = ports or NodePortAllocator()
        # Set when an allocator said "full": the view may be stale (values freed by another
        # API server, or picks of writes that failed); the caller reloads it from the store.
        self.stale = False

    def assign(self, obj: Obj, old: Obj | None) -> tuple[Obj, frozenset[str]]:
        """`obj` with its allocated fields checked and filled, and the allocation keys chosen
        here (not by the user); raises a 422 `ApiError` (module doc)."""
        name = str((obj.get("metadata") or {}).get("name") or "")
        spec = dict(_spec(obj))
        held = held_keys(old) if old is not None else frozenset()
        auto: set[str] = set()
        if needs_cluster_ip(spec):
            self._assign_ip(name, spec, held, auto)
        else:
            if spec.get("clusterIP") or spec.get("clusterIPs"):
                raise _invalid(
                    name,
                    [
                        Cause(
                            "spec.clusterIPs",
                            "Forbidden: may not be set for ExternalName services",
                            "FieldValueForbidden",
                        )
                    ],
                )
            for f in _IP_FIELDS:
                spec.pop(f, None)
        if _ports(spec):
            spec["ports"] = self._assign_ports(name, spec, held, auto)
        return {**obj, "spec": spec}, frozenset(auto)

    def _assign_ip(self, name: str, spec: Obj, held: frozenset[str], auto: set[str]) -> None:
        ips = spec.get("clusterIPs") or []
        ip = spec.get("clusterIP") or ""
        if not isinstance(ips, list) or not all(isinstance(i, str) for i in ips):
            raise _invalid(name, [_cause("spec.clusterIPs", ips, "must be a list of IPs")])
        if ips and ip and ips[0] != ip:
            raise _invalid(
                name, [_cause("spec.clusterIPs[0]", ips[0], "must match `clusterIP` when set")]
            )
        ip = ip or (ips[0] if ips else "")
        if len(ips) > 1:
            raise _invalid(
                name,
                [
                    _cause(
                        "spec.clusterIPs",
                        ips,
                        f"this cluster is single-stack ({self.family}): one IP at most",
                    )
                ],
            )
        policy = spec.get("ipFamilyPolicy") or "SingleStack"
        if policy == "RequireDualStack":
            raise _invalid(
                name,
                [
                    _cause(
                        "spec.ipFamilyPolicy",
                        policy,
                        "this cluster is not configured for dual-stack services",
                    )
                ],
            )
        families = spec.get("ipFamilies") or []
        if isinstance(families, list) and policy == "PreferDualStack":
            families = [f for f in families if f == self.family]
        if families not in ([], [self.family]):
            raise _invalid(
                name,
                [
                    _cause(
                        "spec.ipFamilies",
                        families,
                        f"this cluster serves {self.family} only (--service-cidr "
                        f"{self.settings.service_cidr})",
                    )
                ],
            )
        if ip == "None":
            if _type(spec) in ("NodePort", "LoadBalancer"):
                raise _invalid(
                    name,
                    [
                        _cause(
                            "spec.clusterIP",
                            ip,
                            "may not be set to 'None' for LoadBalancer or NodePort services",
                        )
                    ],
                )
            address = "None"
        elif ip:
            try:
                parsed = ipaddress.ip_address(ip)
            except ValueError:
                raise _invalid(
                    name,
                    [
                        _cause(
                            "spec.clusterIP",
                            ip,
                            "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
                        )
                    ],
                ) from None
            address = str(parsed)
            if ip_key(address) not in held:
                try:
                    self.ips.check(parsed)
                except AllocationError as exc:
                    raise _invalid(
                        name,
                        [_cause("spec.clusterIPs", [ip], f"failed to allocate IP {ip}: {exc}")],
                    ) from None
                self.ips.occupy(parsed)  # the store key decides; this keeps picks off it
        else:
            try:
                address = str(self.ips.allocate(self.rng))
            except RangeFull as exc:
                self.stale = True
                raise _invalid(
                    name, [Cause("spec.clusterIPs", f"failed to allocate a serviceIP: {exc}")]
                ) from None
            auto.add(ip_key(address))
        spec["clusterIP"] = address
        spec["clusterIPs"] = [address]
        spec["ipFamilies"] = [self.family]
        spec["ipFamilyPolicy"] = policy

    def _assign_ports(
        self, name: str, spec: Obj, held: frozenset[str], auto: set[str]
    ) -> list[Obj]:
        ports = [dict(p) for p in _ports(spec)]
        if not needs_node_ports(spec) and not any(_node_port(p) for p in ports):
            return ports
        by_number: dict[Any, int] = {}  # port number -> its node port, shared across protocols
        seen: dict[tuple[int, Any], int] = {}  # (node port, protocol) -> index
        causes: list[Cause] = []
        for i, p in enumerate(ports):
            value = _node_port(p)
            if not value:
                continue
            field = f"spec.ports[{i}].nodePort"
            key = (value, p.get("protocol", "TCP"))
            if key in seen:
                causes.append(Cause(field, f"Duplicate value: {value}", "FieldValueDuplicate"))
                continue
            seen[key] = i
            by_number.setdefault(p.get("port"), value)
            if port_key(value) in held:
                continue
            try:
                self.ports.check(value)
            except AllocationError as exc:
                causes.append(_cause(field, value, str(exc)))
                continue
            self.ports.occupy(value)
        if causes:
            raise _invalid(name, causes)
        if not needs_node_ports(spec):
            return ports
        for p in ports:
            if _node_port(p):
                continue
            shared = by_number.get(p.get("port"))
            if shared is not None:
                p["nodePort"] = shared
                continue
            try:
                value = self.ports.allocate(self.rng)
            except RangeFull as exc:
                self.stale = True
                raise _invalid(
                    name,
                    [Cause("spec.ports[].nodePort", f"failed to allocate a nodePort: {exc}")],
                ) from None
            auto.add(port_key(value))
            p["nodePort"] = value
            by_number[p.get("port")] = value
        return ports

    def forget(self, keys: frozenset[str]) -> None:
        """Free these values in the view (a released Service's, a dry run's picks)."""
        for key in keys:
            _, _, value = key.rpartition("/")
            if "portallocations" in key:
                self.ports.release(int(value))
            else:
                self.ips.release(value)


def new_ip_allocator(settings: NetworkSettings) -> ClusterIPAllocator:
    """The ClusterIP allocator of `settings`: the kubernetes Service's address and the cluster
    DNS address are handed out only when asked for."""
    return ClusterIPAllocator(
        settings.service_cidr,
        reserved=(settings.kubernetes_service_ip, settings.cluster_dns),
    )
