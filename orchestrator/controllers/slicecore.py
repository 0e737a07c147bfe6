"""The pure core of the EndpointSlice controllers: which slices a Service should have, and the
fewest writes that get there from the slices it has.

Theory of operation
-------------------
Two sources give a Service's backends as *groups*: a port set (`PortKey`, the slice's `ports`)
and the endpoints that serve exactly those ports.

* `pod_groups(service, pods)` (the EndpointSlice controller, Services with a selector): each pod
  matching the selector that has an IP of the Service's family and is not finished becomes one
  endpoint: `addresses` [its IP], `conditions` (serving = pod Ready; terminating = pod being
  deleted; ready = serving and not terminating, or always with `publishNotReadyAddresses`, as
  upstream), `nodeName`, `targetRef`, and `hostname` = `spec.hostname` when `spec.subdomain`
  is the Service's name (StatefulSet pods, for DNS). Each service port's `targetPort` is
  resolved per pod (a name through the pod's container ports; unresolved ports are left out of
  that pod's port set), so pods with different resolved ports land in different groups.
* `endpoints_groups(endpoints)` (mirroring, Services without a selector whose Endpoints someone
  else writes, e.g. `default/kubernetes`): each subset is a group; `addresses` are ready,
  `notReadyAddresses` not ready, as upstream's mirroring controller.

`plan(service, groups, existing, managed_by, address_type)` turns groups into a `Plan` against
the slices this manager already has for the Service (the others are not its business):

1. existing slices whose port set is no longer wanted are deleted;
2. for each wanted port set, each existing slice of that set keeps the wanted endpoints it
   already holds (updated in place when their conditions changed), up to `MAX_PER_SLICE`,
   and drops the rest; an endpoint listed twice keeps its first place (so nothing moves
   needlessly);
3. the endpoints not placed yet fill the slices of that set that are already being written,
   then those with room, then new slices (`generateName: <service>-`), `MAX_PER_SLICE` each;
4. a slice left empty is deleted, except that a Service with no endpoints at all keeps (or
   gets) one empty placeholder slice, as upstream, so "no backends" is visible;
5. labels: the Service's own labels, plus `kubernetes.io/service-name`, the manager's
   `endpointslice.kubernetes.io/managed-by` (and `service.kubernetes.io/headless` for a
   headless Service); owner: the Service (controller reference). A slice whose labels or owner
   differ is rewritten too.

Everything is sorted (endpoints by address, ports by name), so equal inputs give equal objects
and an unchanged result plans no write at all (the controller's "minimal writes").

Invariants: every planned slice has at most `MAX_PER_SLICE` endpoints, all of one port set; no
endpoint (by address and target) is in two planned slices; only slices carrying this manager's
label are updated or deleted; no I/O, no clock, no randomness (names come from generateName).
"""

from __future__ import annotations

import copy
import functools
import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from orchestrator.controllers.podutil import (
    is_pod_ready,
    selector_matches,
    target_port,
)
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.discovery_v1 import LABEL_MANAGED_BY, LABEL_SERVICE_NAME

__all__ = [
    "CONTROLLER_NAME",
    "HEADLESS_LABEL",
    "MAX_PER_SLICE",
    "MIRROR_NAME",
    "SKIP_MIRROR_LABEL",
    "Plan",
    "PortKey",
    "address_type_of",
    "desired_slices",
    "endpoints_groups",
    "mirrored_slices",
    "plan",
    "pod_groups",
    "slice_port_key",
]

CONTROLLER_NAME = "endpointslice-controller.k8s.io"
MIRROR_NAME = "endpointslicemirroring-controller.k8s.io"
HEADLESS_LABEL = "service.kubernetes.io/headless"
SKIP_MIRROR_LABEL = "endpointslice.kubernetes.io/skip-mirror"
MAX_PER_SLICE = 100  # --max-endpoints-per-slice's default

# (name, port, protocol, appProtocol), sorted: one slice's `ports`
PortKey = tuple[tuple[str, int, str, str], ...]
Groups = dict[PortKey, list[Obj]]


@dataclass
class Plan:
    """The writes that bring a Service's slices (of one manager) to the wanted state."""

    create: list[Obj] = field(default_factory=list)  # bodies with generateName
    update: list[Obj] = field(default_factory=list)  # existing objects, changed
    delete: list[Obj] = field(default_factory=list)  # existing objects to delete

    @property
    def empty(self) -> bool:
        return not (self.create or self.update or self.delete)


# ------------------------------------------------------------------------------- groups
def address_type_of(service: Obj) -> str:
    """IPv4 or IPv6: the Service's first IP family (IPv4 when unset)."""
    families = (service.get("spec") or {}).get("ipFamilies") or []
    return "IPv6" if families and families[0] == "IPv6" else "IPv4"


@functools.lru_cache(maxsize=65536)  # pod IPs repeat on every plan; parsing dominated it
def _family(ip: str) -> str | None:
    try:
        return "IPv4" if ipaddress.ip_address(ip).version == 4 else "IPv6"
    except ValueError:
        return None


def _pod_ip(pod: Obj, address_type: str) -> str | None:
    status = pod.get("status") or {}
    candidates = [str(p.get("ip") or "") for p in status.get("podIPs") or [] if isinstance(p, dict)]
    if status.get("podIP"):
        candidates.insert(0, str(status["podIP"]))
    for ip in candidates:
        if ip and _family(ip) == address_type:
            return ip
    return None


def _target_ref(kind: str, meta: Obj) -> Obj:
    ref = {"kind": kind, "namespace": meta.get("namespace", ""), "name": meta.get("name", "")}
    if meta.get("uid"):
        ref["uid"] = meta["uid"]
    return ref


def pod_groups(service: Obj, pods: Iterable[Obj]) -> Groups:
    """The wanted endpoints of a Service with a selector, by port set (module doc)."""
    spec = service.get("spec") or {}
    svc_name = (service.get("metadata") or {}).get("name")
    selector = spec.get("selector") or {}
    publish_not_ready = bool(spec.get("publishNotReadyAddresses"))
    address_type = address_type_of(service)
    svc_ports = [p for p in spec.get("ports") or [] if isinstance(p, dict)]
    groups: Groups = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        pod_spec = pod.get("spec") or {}
        if not selector_matches(selector, meta.get("labels") or {}):
            continue
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        ip = _pod_ip(pod, address_type)
        if ip is None:
            continue
        ports = []
        for sp in svc_ports:
            number = target_port(pod, sp.get("targetPort", sp.get("port")))
            if number is not None:
                ports.append(
                    (
                        str(sp.get("name") or ""),
                        number,
                        str(sp.get("protocol") or "TCP"),
                        str(sp.get("appProtocol") or ""),
                    )
                )
        serving = is_pod_ready(pod)
        terminating = bool(meta.get("deletionTimestamp"))
        endpoint: Obj = {
            "addresses": [ip],
            "conditions": {
                "ready": publish_not_ready or (serving and not terminating),
                "serving": serving,
                "terminating": terminating,
            },
            "targetRef": _target_ref("Pod", meta),
        }
        if pod_spec.get("hostname") and svc_name and pod_spec.get("subdomain") == svc_name:
            endpoint["hostname"] = pod_spec["hostname"]
        if pod_spec.get("nodeName"):
            endpoint["nodeName"] = pod_spec["nodeName"]
        groups.setdefault(tuple(sorted(ports)), []).append(endpoint)
    return groups


def endpoints_groups(endpoints: Obj, address_type: str) -> Groups:
    """The endpoints to mirror from an Endpoints object, by port set (module doc); addresses
    not of `address_type` are left out."""
    groups: Groups = {}
    for subset in endpoints.get("subsets") or []:
        if not isinstance(subset, dict):
            continue
        ports = tuple(
            sorted(
                (
                    str(p.get("name") or ""),
                    int(p.get("port") or 0),
                    str(p.get("protocol") or "TCP"),
                    str(p.get("appProtocol") or ""),
                )
                for p in subset.get("ports") or []
                if isinstance(p, dict)
            )
        )
        out = groups.setdefault(ports, [])
        for key, ready in (("addresses", True), ("notReadyAddresses", False)):
            for addr in subset.get(key) or []:
                if not isinstance(addr, dict) or _family(str(addr.get("ip") or "")) != address_type:
                    continue
                endpoint: Obj = {"addresses": [addr["ip"]], "conditions": {"ready": ready}}
                if addr.get("hostname"):
                    endpoint["hostname"] = addr["hostname"]
                if addr.get("nodeName"):
                    endpoint["nodeName"] = addr["nodeName"]
                if isinstance(addr.get("targetRef"), dict):
                    endpoint["targetRef"] = dict(addr["targetRef"])
                out.append(endpoint)
        if not out:
            del groups[ports]
    return groups


# ------------------------------------------------------------------------------- planning
def _ports_body(key: PortKey) -> list[Obj]:
    out = []
    for name, port, protocol, app in key:
        p: Obj = {"name": name, "port": port, "protocol": protocol}
        if app:
            p["appProtocol"] = app
        out.append(p)
    return out


def slice_port_key(slice_: Obj) -> PortKey:
    """The port set of an existing slice (defaults applied: name "", protocol TCP)."""
    return tuple(
        sorted(
            (
                str(p.get("name") or ""),
                int(p.get("port") or 0),
                str(p.get("protocol") or "TCP"),
                str(p.get("appProtocol") or ""),
            )
            for p in slice_.get("ports") or []
            if isinstance(p, dict)
        )
    )


def _endpoint_id(ep: Obj) -> tuple[str, str]:
    ref = ep.get("targetRef") or {}
    first = (ep.get("addresses") or [""])[0]
    return str(first), str(ref.get("uid") or ref.get("name") or "")


def _sorted(endpoints: list[Obj]) -> list[Obj]:
    return sorted(endpoints, key=_endpoint_id)


def _labels(service: Obj, managed_by: str) -> dict[str, str]:
    meta = service.get("metadata") or {}
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    for reserved in (LABEL_SERVICE_NAME, LABEL_MANAGED_BY, HEADLESS_LABEL):
        labels.pop(reserved, None)
    labels[LABEL_SERVICE_NAME] = str(meta.get("name", ""))
    labels[LABEL_MANAGED_BY] = managed_by
    if (service.get("spec") or {}).get("clusterIP") == "None":
        labels[HEADLESS_LABEL] = ""
    return labels


def _owner(service: Obj) -> Obj:
    meta = service.get("metadata") or {}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "name": meta.get("name", ""),
        "uid": meta.get("uid", ""),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _new_slice(service: Obj, labels: dict[str, str], address_type: str) -> Obj:
    meta = service.get("metadata") or {}
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "generateName": f"{meta.get('name', '')}-",
            "namespace": meta.get("namespace", ""),
            "labels": dict(labels),
            "ownerReferences": [_owner(service)],
        },
        "addressType": address_type,
        "endpoints": [],
        "ports": [],
    }


def _same_owner(slice_: Obj, owner: Obj) -> bool:
    refs = (slice_.get("metadata") or {}).get("ownerReferences") or []
    want = {k: owner[k] for k in ("apiVersion", "kind", "name", "uid", "controller")}
    return len(refs) == 1 and {k: refs[0].get(k) for k in want} == want


@dataclass
class _Kept:
    slice: Obj
    endpoints: list[Obj]
    key: PortKey
    changed: bool


def plan(
    service: Obj,
    groups: Groups,
    existing: Sequence[Obj],
    managed_by: str,
    address_type: str,
    *,
    placeholder: bool = True,
    max_per_slice: int = MAX_PER_SLICE,
) -> Plan:
    """The writes from `existing` (any slices; only this manager's are considered) to the
    slices `groups` call for (module doc); `placeholder`: keep one empty slice when there are
    no endpoints at all."""
    labels = _labels(service, managed_by)
    owner = _owner(service)
    mine = sorted(
        (
            s
            for s in existing
            if ((s.get("metadata") or {}).get("labels") or {}).get(LABEL_MANAGED_BY) == managed_by
        ),
        key=lambda s: str((s.get("metadata") or {}).get("name", "")),
    )
    wanted_by_key: dict[PortKey, dict[tuple[str, str], Obj]] = {}
    for key, eps in groups.items():
        by_id = wanted_by_key.setdefault(key, {})
        for ep in eps:
            by_id.setdefault(_endpoint_id(ep), ep)  # listed twice: the first one counts
    placeholder_needed = placeholder and not any(wanted_by_key.values())
    if placeholder_needed:
        wanted_by_key = {(): {}}
    out = Plan()
    kept: list[_Kept] = []
    placed: set[tuple[PortKey, tuple[str, str]]] = set()
    for s in mine:
        key = slice_port_key(s)
        if s.get("addressType") != address_type or key not in wanted_by_key:
            out.delete.append(s)
            continue
        wanted = wanted_by_key[key]
        have = [ep for ep in s.get("endpoints") or [] if isinstance(ep, dict)]
        now: list[Obj] = []
        for ep in have:
            eid = _endpoint_id(ep)
            if eid in wanted and (key, eid) not in placed and len(now) < max_per_slice:
                placed.add((key, eid))
                now.append(wanted[eid])
        changed = _sorted(now) != have or (s.get("ports") or []) != _ports_body(key)
        kept.append(_Kept(s, now, key, changed))
    for key in sorted(wanted_by_key):
        todo = [ep for eid, ep in sorted(wanted_by_key[key].items()) if (key, eid) not in placed]
        # fill slices already being written first, then the fullest with room (fewest writes)
        for k in sorted(
            (k for k in kept if k.key == key), key=lambda k: (not k.changed, -len(k.endpoints))
        ):
            room = max_per_slice - len(k.endpoints)
            if todo and room > 0:
                k.endpoints.extend(todo[:room])
                del todo[:room]
                k.changed = True
        while todo:
            new = _new_slice(service, labels, address_type)
            new["endpoints"] = _sorted(todo[:max_per_slice])
            new["ports"] = _ports_body(key)
            del todo[:max_per_slice]
            out.create.append(new)
    for k in kept:
        if not k.endpoints:
            if placeholder_needed:
                placeholder_needed = False  # the first empty one stays as the placeholder
            else:
                out.delete.append(k.slice)
                continue
        meta = k.slice.get("metadata") or {}
        if k.changed or (meta.get("labels") or {}) != labels or not _same_owner(k.slice, owner):
            updated = copy.deepcopy(k.slice)
            updated["endpoints"] = _sorted(k.endpoints)
            updated["ports"] = _ports_body(k.key)
            updated.setdefault("metadata", {})["labels"] = dict(labels)
            updated["metadata"]["ownerReferences"] = [owner]
            out.update.append(updated)
    if placeholder_needed:
        out.create.append(_new_slice(service, labels, address_type))
    return out


def desired_slices(service: Obj, pods: Iterable[Obj], existing_slices: Sequence[Obj]) -> Plan:
    """The EndpointSlice controller's plan for a Service with a selector over `pods`."""
    return plan(
        service,
        pod_groups(service, pods),
        existing_slices,
        CONTROLLER_NAME,
        address_type_of(service),
    )


def mirrored_slices(service: Obj, endpoints: Obj, existing_slices: Sequence[Obj]) -> Plan:
    """The mirroring controller's plan for a selector-less Service and its `endpoints`."""
    address_type = address_type_of(service)
    groups = endpoints_groups(endpoints, address_type)
    return plan(service, groups, existing_slices, MIRROR_NAME, address_type, placeholder=False)
