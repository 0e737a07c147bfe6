"""What the scheduler precomputes about a pod (`PodInfo`) and a node (`NodeInfo`).

Theory of operation: filtering and scoring run once per (pod, node) pair, so everything that can
be worked out once per pod or once per node is, and the per-pair work is a few integer
comparisons and dict lookups.

* `PodInfo.from_pod(pod)` parses the pod once per scheduling attempt: effective resource requests
  (containers summed, init containers as a maximum, restartable "sidecar" init containers added,
  `spec.overhead` on top, a limit standing in for a missing request as API defaulting does); the
  "non-zero" requests used by scoring (100m CPU and 200Mi memory for a container without a
  request, as upstream); host ports; the node selector and required node affinity compiled into
  one predicate; preferred affinity terms compiled into (weight, predicate) pairs; tolerations;
  the controller owner's UID (for spreading); `spec.priority`.
* `NodeInfo` holds a node's static facts (allocatable, labels, taints split into hard
  NoSchedule/NoExecute and soft PreferNoSchedule, readiness, cordon, zone), recomputed by
  `set_node` when the Node object changes, plus running totals of what the pods counted on it
  request: resources, pod count, host ports in use and pods per owner. `add_pod`/`remove_pod` keep
  the totals exact; the scheduler cache is the only caller.

Resources are integers: CPU in milli-cores, everything else (memory, ephemeral-storage,
extended resources such as `nvidia.com/gpu`, hugepages) in whole units (bytes for memory).

Label selection follows `NodeSelectorRequirement`: `In`/`NotIn`/`Exists`/`DoesNotExist`/
`Gt`/`Lt` on labels (`NotIn` and `DoesNotExist` match a node without the label) and `In`/`NotIn`
on the `metadata.name` field. A term ANDs its requirements; a term list ORs its terms; an empty
term or an invalid requirement matches nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from orchestrator.kube.conditions import condition_true
from orchestrator.kube.taints import Taint, Toleration, tolerates, toleration_of
from orchestrator.scheduler.quantity import parse_cpu_milli, parse_value

__all__ = [
    "DEFAULT_CPU_REQUEST_MILLI",
    "DEFAULT_MEMORY_REQUEST",
    "NodeInfo",
    "NodeMatcher",
    "PodInfo",
    "pod_key",
]

Obj = Mapping[str, Any]
NodeMatcher = Callable[["NodeInfo"], bool]
"""A compiled node selector: True when the node matches."""
Port = tuple[str, str, int]
"""(hostIP, protocol, hostPort) with hostIP "0.0.0.0" and protocol "TCP" by default."""

DEFAULT_CPU_REQUEST_MILLI: Final = 100
DEFAULT_MEMORY_REQUEST: Final = 200 * 1024 * 1024
ZONE_LABEL: Final = "topology.kubernetes.io/zone"
_LEGACY_ZONE_LABEL: Final = "failure-domain.beta.kubernetes.io/zone"
UNSCHEDULABLE_TAINT: Final = "node.kubernetes.io/unschedulable"
NOT_READY_TAINT: Final = "node.kubernetes.io/not-ready"
_ANY_IP: Final = "0.0.0.0"
_NZ_CPU: Final = "\0nonzero-cpu"
_NZ_MEMORY: Final = "\0nonzero-memory"
_EMPTY: Final[Mapping[str, str]] = {}


def pod_key(pod: Obj) -> str:
    """The identity the cache and queue use: the UID, else "namespace/name"."""
    meta = pod.get("metadata") or {}
    uid = meta.get("uid")
    if uid:
        return str(uid)
    return f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}"


# --- resources -----------------------------------------------------------------------------------


def _parse_resource(name: str, value: Any) -> int:
    return parse_cpu_milli(value) if name == "cpu" else parse_value(value)


def _container_requests(container: Obj, where: str) -> dict[str, int]:
    resources = container.get("resources") or {}
    requests: Mapping[str, Any] = resources.get("requests") or _EMPTY
    limits: Mapping[str, Any] = resources.get("limits") or _EMPTY
    out: dict[str, int] = {}
    for source, field in ((limits, "limits"), (requests, "requests")):
        for name, raw in source.items():
            try:
                value = _parse_resource(name, raw)
            except ValueError as exc:
                raise ValueError(f"{where}.resources.{field}.{name}: {exc}") from None
            if value < 0:
                raise ValueError(f"{where}.resources.{field}.{name}: {raw!r} is negative")
            out[name] = value  # requests overwrite limits: a limit only fills a missing request
    out[_NZ_CPU] = out.get("cpu", 0) if "cpu" in out else DEFAULT_CPU_REQUEST_MILLI
    out[_NZ_MEMORY] = out.get("memory", 0) if "memory" in out else DEFAULT_MEMORY_REQUEST
    return out


def _add(total: dict[str, int], more: Mapping[str, int]) -> None:
    for name, value in more.items():
        total[name] = total.get(name, 0) + value


def _max(total: dict[str, int], other: Mapping[str, int]) -> None:
    for name, value in other.items():
        if value > total.get(name, 0):
            total[name] = value


def _pod_requests(spec: Obj) -> dict[str, int]:
    """Effective requests, as k8s.io/component-helpers/resource.PodRequests computes them."""
    total: dict[str, int] = {}
    for i, container in enumerate(spec.get("containers") or ()):
        _add(total, _container_requests(container, f"spec.containers[{i}]"))
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for i, container in enumerate(spec.get("initContainers") or ()):
        requests = _container_requests(container, f"spec.initContainers[{i}]")
        if container.get("restartPolicy") == "Always":
            _add(total, requests)
            _add(sidecars, requests)
            _max(init_peak, sidecars)
        else:
            running = dict(sidecars)
            _add(running, requests)
            _max(init_peak, running)
    _max(total, init_peak)
    overhead: Mapping[str, Any] = spec.get("overhead") or _EMPTY
    for name, raw in overhead.items():
        try:
            value = _parse_resource(name, raw)
        except ValueError as exc:
            raise ValueError(f"spec.overhead.{name}: {exc}") from None
        total[name] = total.get(name, 0) + value
        if name == "cpu":
            total[_NZ_CPU] = total.get(_NZ_CPU, 0) + value
        elif name == "memory":
            total[_NZ_MEMORY] = total.get(_NZ_MEMORY, 0) + value
    return total


def _host_ports(spec: Obj) -> tuple[Port, ...]:
    ports: list[Port] = []
    containers = list(spec.get("containers") or ())
    for container in spec.get("initContainers") or ():
        if container.get("restartPolicy") == "Always":
            containers.append(container)
    for container in containers:
        for port in container.get("ports") or ():
            host_port = port.get("hostPort") or 0
            if isinstance(host_port, int) and host_port > 0:
                ports.append(
                    (port.get("hostIP") or _ANY_IP, port.get("protocol") or "TCP", host_port)
                )
    return tuple(ports)


# --- selectors -----------------------------------------------------------------------------------


def _never(node: NodeInfo) -> bool:
    return False


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _compile_label_requirement(req: Obj) -> NodeMatcher:
    key = req.get("key")
    op = req.get("operator")
    values: Sequence[Any] = req.get("values") or ()
    if not isinstance(key, str) or not key:
        return _never
    if op == "In":
        wanted = frozenset(values)
        return lambda node: node.labels.get(key) in wanted
    if op == "NotIn":
        unwanted = frozenset(values)
        return lambda node: node.labels.get(key) not in unwanted
    if op == "Exists":
        return lambda node: key in node.labels
    if op == "DoesNotExist":
        return lambda node: key not in node.labels
    if op in ("Gt", "Lt") and len(values) == 1:
        bound = _int_or_none(values[0])
        if bound is None:
            return _never
        if op == "Gt":

            def greater(node: NodeInfo) -> bool:
                have = _int_or_none(node.labels.get(key))
                return have is not None and have > bound

            return greater

        def less(node: NodeInfo) -> bool:
            have = _int_or_none(node.labels.get(key))
            return have is not None and have < bound

        return less
    return _never


def _compile_field_requirement(req: Obj) -> NodeMatcher:
    if req.get("key") != "metadata.name":
        return _never
    values = frozenset(req.get("values") or ())
    if req.get("operator") == "In":
        return lambda node: node.name in values
    if req.get("operator") == "NotIn":
        return lambda node: node.name not in values
    return _never


def _all_of(matchers: list[NodeMatcher]) -> NodeMatcher:
    if len(matchers) == 1:
        return matchers[0]
    if len(matchers) == 2:
        first, second = matchers
        return lambda node: first(node) and second(node)
    frozen = tuple(matchers)
    return lambda node: all(m(node) for m in frozen)


def compile_term(term: Obj | None) -> NodeMatcher | None:
    """One `NodeSelectorTerm` as a predicate; None for an empty (or null) term."""
    if not term:
        return None
    matchers = [_compile_label_requirement(r) for r in term.get("matchExpressions") or ()]
    matchers += [_compile_field_requirement(r) for r in term.get("matchFields") or ()]
    if not matchers:
        return None
    return _all_of(matchers)


def _compile_required(node_selector: Mapping[str, str], affinity: Obj) -> NodeMatcher | None:
    matchers: list[NodeMatcher] = []
    if node_selector:
        items = tuple(node_selector.items())
        if len(items) == 1:
            ((k, v),) = items
            matchers.append(lambda node: node.labels.get(k) == v)
        else:
            matchers.append(lambda node: all(node.labels.get(k) == v for k, v in items))
    node_affinity = affinity.get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is not None:
        terms = [compile_term(t) for t in required.get("nodeSelectorTerms") or ()]
        live = tuple(t for t in terms if t is not None)
        if not live:
            matchers.append(_never)
        elif len(live) == 1:
            matchers.append(live[0])
        else:
            matchers.append(lambda node: any(t(node) for t in live))
    if not matchers:
        return None
    return _all_of(matchers)


def _compile_preferred(affinity: Obj) -> tuple[tuple[int, NodeMatcher], ...]:
    preferred = (affinity.get("nodeAffinity") or {}).get(
        "preferredDuringSchedulingIgnoredDuringExecution"
    ) or ()
    out: list[tuple[int, NodeMatcher]] = []
    for term in preferred:
        weight = term.get("weight") or 0
        matcher = compile_term(term.get("preference"))
        if isinstance(weight, int) and weight > 0 and matcher is not None:
            out.append((weight, matcher))
    return tuple(out)


# --- tolerations ---------------------------------------------------------------------------------


def _tolerations(spec: Obj) -> tuple[Toleration, ...]:
    return tuple(toleration_of(t) for t in spec.get("tolerations") or ())


def owner_of(meta: Obj) -> str | None:
    """The uid of the controller among a pod's ownerReferences (metadata), or None."""
    for ref in meta.get("ownerReferences") or ():
        if ref.get("controller"):
            uid = ref.get("uid")
            return str(uid) if uid else None
    return None


class PodInfo:
    """A pod parsed once for scheduling. Build with `PodInfo.from_pod`; treat as immutable."""

    __slots__ = (
        "best_effort",
        "cpu",
        "ephemeral",
        "host_ports",
        "key",
        "memory",
        "name",
        "namespace",
        "node_name",
        "nonzero_cpu",
        "nonzero_memory",
        "owner",
        "pod",
        "preferred",
        "priority",
        "required",
        "scalar",
        "tolerates_not_ready",
        "tolerates_unschedulable",
        "tolerations",
    )

    key: str
    pod: Obj
    namespace: str
    name: str
    cpu: int
    memory: int
    ephemeral: int
    scalar: dict[str, int]
    nonzero_cpu: int
    nonzero_memory: int
    best_effort: bool
    host_ports: tuple[Port, ...]
    node_name: str
    required: NodeMatcher | None
    preferred: tuple[tuple[int, NodeMatcher], ...]
    tolerations: tuple[Toleration, ...]
    tolerates_unschedulable: bool
    tolerates_not_ready: bool
    owner: str | None
    priority: int

    @classmethod
    def from_pod(cls, pod: Obj, *, strict: bool = True) -> PodInfo:
        """Parse `pod`. With `strict`, an unparsable quantity raises `ValueError` naming the
        field; without, the pod's requests count as zero (for pods already bound elsewhere)."""
        self = cls.__new__(cls)
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        self.pod = pod
        self.key = pod_key(pod)
        self.namespace = meta.get("namespace") or "default"
        self.name = meta.get("name") or ""
        try:
            requests = _pod_requests(spec)
        except ValueError as exc:
            if strict:
                raise ValueError(f"pod {self.namespace}/{self.name}: {exc}") from None
            requests = {}
        self.cpu = requests.pop("cpu", 0)
        self.memory = requests.pop("memory", 0)
        self.ephemeral = requests.pop("ephemeral-storage", 0)
        self.nonzero_cpu = requests.pop(_NZ_CPU, 0)
        self.nonzero_memory = requests.pop(_NZ_MEMORY, 0)
        requests.pop("pods", None)
        self.scalar = {k: v for k, v in requests.items() if v}
        self.best_effort = not (self.cpu or self.memory or self.ephemeral or self.scalar)
        self.host_ports = _host_ports(spec)
        self.node_name = spec.get("nodeName") or ""
        affinity = spec.get("affinity") or {}
        self.required = _compile_required(spec.get("nodeSelector") or _EMPTY, affinity)
        self.preferred = _compile_preferred(affinity)
        self.tolerations = _tolerations(spec)
        self.tolerates_unschedulable = any(
            tolerates(t, UNSCHEDULABLE_TAINT, "", "NoSchedule") for t in self.tolerations
        )
        # Every pod tolerates not-ready NoExecute for 300 s (DefaultTolerationSeconds); only a
        # NoSchedule toleration (DaemonSet-style) lets it onto a node that is not ready.
        self.tolerates_not_ready = any(
            tolerates(t, NOT_READY_TAINT, "", "NoSchedule") for t in self.tolerations
        )
        self.owner = owner_of(meta)
        priority = spec.get("priority")
        self.priority = priority if isinstance(priority, int) else 0
        return self

    def __repr__(self) -> str:
        return f"PodInfo({self.namespace}/{self.name})"


def _quantities(status: Obj) -> Mapping[str, Any]:
    allocatable = status.get("allocatable")
    if allocatable is None:
        allocatable = status.get("capacity")
    return allocatable or _EMPTY


def _lenient(name: str, raw: Any) -> int:
    try:
        return max(0, _parse_resource(name, raw))
    except ValueError:
        return 0


class NodeInfo:
    """One node's static facts and the running totals of the pods counted on it."""

    __slots__ = (
        "alloc_cpu",
        "alloc_ephemeral",
        "alloc_memory",
        "alloc_pods",
        "alloc_scalar",
        "cpu",
        "ephemeral",
        "hard_taints",
        "labels",
        "memory",
        "name",
        "node",
        "nonzero_cpu",
        "nonzero_memory",
        "owners",
        "pod_count",
        "pods",
        "ports",
        "ready",
        "scalar",
        "soft_taints",
        "unschedulable",
        "version",
        "zone",
    )

    name: str
    node: Obj | None
    labels: Mapping[str, str]
    alloc_cpu: int
    alloc_memory: int
    alloc_ephemeral: int
    alloc_pods: int
    alloc_scalar: dict[str, int]
    ready: bool
    unschedulable: bool
    hard_taints: tuple[Taint, ...]
    soft_taints: tuple[Taint, ...]
    zone: str | None
    cpu: int
    memory: int
    ephemeral: int
    scalar: dict[str, int]
    nonzero_cpu: int
    nonzero_memory: int
    pod_count: int
    ports: dict[tuple[str, int], dict[str, int]]
    owners: dict[str, int]
    pods: dict[str, PodInfo]
    version: int

    def __init__(self, name: str) -> None:
        self.name = name
        # Bumped by every change below (facts or counted pods): what the framework memoizes
        # about a node is valid only while the version it was computed at holds.
        self.version = 0
        self.node = None
        self.labels = _EMPTY
        self.alloc_cpu = self.alloc_memory = self.alloc_ephemeral = self.alloc_pods = 0
        self.alloc_scalar = {}
        self.ready = False
        self.unschedulable = False
        self.hard_taints = ()
        self.soft_taints = ()
        self.zone = None
        self.cpu = self.memory = self.ephemeral = 0
        self.nonzero_cpu = self.nonzero_memory = 0
        self.pod_count = 0
        self.scalar = {}
        self.ports = {}
        self.owners = {}
        self.pods = {}

    def __repr__(self) -> str:
        return f"NodeInfo({self.name}, pods={self.pod_count})"

    def set_node(self, node: Obj | None) -> bool:
        """Recompute the static facts; True when anything the scheduler looks at changed."""
        before = self._facts()
        self.version += 1
        self.node = node
        if node is None:
            self.labels = _EMPTY
            self.alloc_cpu = self.alloc_memory = self.alloc_ephemeral = self.alloc_pods = 0
            self.alloc_scalar = {}
            self.ready = self.unschedulable = False
            self.hard_taints = self.soft_taints = ()
            self.zone = None
            return before != self._facts()
        meta = node.get("metadata") or {}
        spec = node.get("spec") or {}
        status = node.get("status") or {}
        self.labels = dict(meta.get("labels") or _EMPTY)
        alloc = {name: _lenient(name, raw) for name, raw in _quantities(status).items()}
        self.alloc_cpu = alloc.pop("cpu", 0)
        self.alloc_memory = alloc.pop("memory", 0)
        self.alloc_ephemeral = alloc.pop("ephemeral-storage", 0)
        self.alloc_pods = alloc.pop("pods", 0)
        self.alloc_scalar = alloc
        self.ready = condition_true(status, "Ready")
        self.unschedulable = bool(spec.get("unschedulable"))
        taints = [
            (str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
            for t in spec.get("taints") or ()
        ]
        self.hard_taints = tuple(t for t in taints if t[2] in ("NoSchedule", "NoExecute"))
        self.soft_taints = tuple(t for t in taints if t[2] == "PreferNoSchedule")
        self.zone = self.labels.get(ZONE_LABEL) or self.labels.get(_LEGACY_ZONE_LABEL)
        return before != self._facts()

    def _facts(self) -> tuple[object, ...]:
        return (
            self.node is None,
            self.labels,
            self.alloc_cpu,
            self.alloc_memory,
            self.alloc_ephemeral,
            self.alloc_pods,
            self.alloc_scalar,
            self.ready,
            self.unschedulable,
            self.hard_taints,
            self.soft_taints,
        )

    def add_pod(self, pod: PodInfo) -> None:
        """Count `pod` on this node (the caller guarantees it is not counted yet)."""
        self.version += 1
        self.pods[pod.key] = pod
        self.pod_count += 1
        self.cpu += pod.cpu
        self.memory += pod.memory
        self.ephemeral += pod.ephemeral
        self.nonzero_cpu += pod.nonzero_cpu
        self.nonzero_memory += pod.nonzero_memory
        if pod.scalar:
            _add(self.scalar, pod.scalar)
        for ip, protocol, port in pod.host_ports:
            ips = self.ports.setdefault((protocol, port), {})
            ips[ip] = ips.get(ip, 0) + 1
        if pod.owner is not None:
            self.owners[pod.owner] = self.owners.get(pod.owner, 0) + 1

    def remove_pod(self, key: str) -> PodInfo | None:
        """Stop counting the pod with `key`; returns what was counted, or None."""
        pod = self.pods.pop(key, None)
        if pod is None:
            return None
        self.version += 1
        self.pod_count -= 1
        self.cpu -= pod.cpu
        self.memory -= pod.memory
        self.ephemeral -= pod.ephemeral
        self.nonzero_cpu -= pod.nonzero_cpu
        self.nonzero_memory -= pod.nonzero_memory
        for name, value in pod.scalar.items():
            left = self.scalar[name] - value
            if left:
                self.scalar[name] = left
            else:
                del self.scalar[name]
        for ip, protocol, port in pod.host_ports:
            ips = self.ports[(protocol, port)]
            if ips[ip] == 1:
                del ips[ip]
                if not ips:
                    del self.ports[(protocol, port)]
            else:
                ips[ip] -= 1
        if pod.owner is not None:
            if self.owners[pod.owner] == 1:
                del self.owners[pod.owner]
            else:
                self.owners[pod.owner] -= 1
        return pod

    def port_conflict(self, ports: Iterable[Port]) -> bool:
        """True when any wanted (ip, protocol, port) clashes with one in use (0.0.0.0 clashes
        with every address, as `HostPortInfo.CheckConflict`)."""
        for ip, protocol, port in ports:
            used = self.ports.get((protocol, port))
            if used and (ip == _ANY_IP or ip in used or _ANY_IP in used):
                return True
        return False
