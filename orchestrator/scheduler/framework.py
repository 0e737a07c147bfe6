"""Filter and score plugins, and `schedule_one`: pick a node for one pod.

Theory of operation (upstream's scheduling cycle, without preemption, run synchronously):

1. **Prepare.** The pod is parsed once into a `PodInfo`. Each filter plugin's `prepare(pod)`
   returns a per-node check specialised for this pod, or None when it has nothing to check
   (no host ports → no port check; no selector or affinity → no affinity check). This plays
   upstream's PreFilter role, and keeps the per-node work to the checks that matter.
2. **Filter.** Nodes are visited from `cache.next_start_index`, wrapping around. A node is
   feasible when every check returns `()`; the first check that fails records its reasons for the
   node (reasons are upstream's strings, e.g. "Insufficient cpu"). The search stops once
   `num_feasible_nodes_to_find(n)` feasible nodes are found: all nodes below 100, else
   `percentage_of_nodes_to_score` of them (adaptive by default: `max(5, 50 - n/125)` %, at least
   100 nodes). The start index then advances past the nodes visited, so successive pods look at
   different nodes first.
3. **Score.** With one feasible node there is nothing to compare. Otherwise each score plugin
   returns, for the feasible nodes in order, integers already normalised to 0..100 (or None when
   it cannot tell them apart for this pod, which skips it); the framework adds them up weighted.
4. **Select.** The highest total wins; ties are broken uniformly at random with the caller's RNG,
   so a seeded `random.Random` makes decisions reproducible.

Default plugins, in upstream order and weights: filters NodeReady (not upstream: a node whose
Ready condition is not True is skipped unless the pod tolerates the not-ready taint),
NodeUnschedulable, NodeName, TaintToleration, NodeAffinity (nodeSelector + required terms),
NodePorts, NodeResourcesFit; scores TaintToleration (3, fewer untolerated PreferNoSchedule
taints), NodeAffinity (2, preferred terms), OwnerSpread (2, fewer pods of the same controller on
the node and in its zone, as upstream's SelectorSpread), NodeResourcesFit (1, LeastAllocated),
NodeResourcesBalancedAllocation (1).

Cost per pod: O(visited nodes * relevant checks) for filtering and O(feasible nodes * score
plugins) for scoring, all on precomputed numbers; nothing iterates over the cluster's pods. With
the default plugins and every node visited (clusters up to 100 nodes), the nodes' verdicts and
resource scores for a pod shape (requests, tolerations) are memoized until a node changes
(`Framework._filter_memo`): a workload's next pod recomputes only the node its predecessor went
to, and finds the feasible nodes without visiting the others.

`Decision.message` is the FailedScheduling text, built like upstream's `FitError`:
"0/3 nodes are available: 1 Insufficient cpu, 2 node(s) didn't match Pod's node
affinity/selector." (reason counts sorted as strings, then joined).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from orchestrator.scheduler.cache import SchedulerCache
from orchestrator.scheduler.info import NodeInfo, PodInfo, Taint, Toleration, tolerates

__all__ = [
    "DEFAULT_FILTERS",
    "DEFAULT_FRAMEWORK",
    "DEFAULT_SCORES",
    "BalancedAllocation",
    "Decision",
    "FilterPlugin",
    "Framework",
    "LeastAllocated",
    "NodeAffinity",
    "NodeAffinityScore",
    "NodeFilter",
    "NodeName",
    "NodePorts",
    "NodeReady",
    "NodeResourcesFit",
    "NodeUnschedulable",
    "OwnerSpread",
    "ScorePlugin",
    "TaintToleration",
    "TaintTolerationScore",
    "check_node",
    "failure_message",
    "num_feasible_nodes_to_find",
    "schedule_one",
]

Obj = Mapping[str, Any]
Reasons = tuple[str, ...]
NodeFilter = Callable[[list[NodeInfo], dict[str, Reasons]], list[NodeInfo]]
"""A filter specialised for one pod: returns the nodes that pass, in order, and records in the
dict why each other node fails (upstream's reason strings)."""

MAX_NODE_SCORE: Final = 100
MIN_FEASIBLE_NODES_TO_FIND: Final = 100
MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND: Final = 5
BASE_PERCENTAGE_OF_NODES_TO_SCORE: Final = 50

ERR_NOT_READY: Final = "node(s) were not ready"
ERR_UNSCHEDULABLE: Final = "node(s) were unschedulable"
ERR_NODE_NAME: Final = "node(s) didn't match the requested node name"
ERR_AFFINITY: Final = "node(s) didn't match Pod's node affinity/selector"
ERR_PORTS: Final = "node(s) didn't have free ports for the requested pod ports"
ERR_TOO_MANY_PODS: Final = "Too many pods"
ERR_NO_NODES: Final = "no nodes available to schedule pods"

_OK: Final[Reasons] = ()
_NOT_READY: Final = (ERR_NOT_READY,)
_UNSCHEDULABLE: Final = (ERR_UNSCHEDULABLE,)
_NODE_NAME: Final = (ERR_NODE_NAME,)
_AFFINITY: Final = (ERR_AFFINITY,)
_PORTS: Final = (ERR_PORTS,)


class FilterPlugin(Protocol):
    """A hard constraint. `prepare` returns the filter specialised for `pod`, or None to skip."""

    @property
    def name(self) -> str: ...

    def prepare(self, pod: PodInfo) -> NodeFilter | None: ...


class ScorePlugin(Protocol):
    """A preference. `score` returns one 0..100 integer per node, in order, or None when every
    node would score the same for this pod (the plugin is then skipped)."""

    @property
    def name(self) -> str: ...

    def score(self, pod: PodInfo, nodes: Sequence[NodeInfo]) -> list[int] | None: ...


def check_node(plugin: FilterPlugin, pod: PodInfo, node: NodeInfo) -> Reasons:
    """Why `plugin` rejects `node` for `pod`; `()` when it passes (or the plugin skips)."""
    run = plugin.prepare(pod)
    if run is None:
        return _OK
    reasons: dict[str, Reasons] = {}
    kept = run([node], reasons)
    return _OK if kept else reasons[node.name]


# --- filters -------------------------------------------------------------------------------------
#
# Each filter first keeps the passing nodes with a comprehension over plain attributes (no call per
# node in the common case), and walks the nodes again to record reasons only when some failed.


def _ready(nodes: list[NodeInfo], reasons: dict[str, Reasons]) -> list[NodeInfo]:
    kept = [n for n in nodes if n.ready]
    if len(kept) != len(nodes):
        for n in nodes:
            if not n.ready:
                reasons[n.name] = _NOT_READY
    return kept


def _schedulable(nodes: list[NodeInfo], reasons: dict[str, Reasons]) -> list[NodeInfo]:
    kept = [n for n in nodes if not n.unschedulable]
    if len(kept) != len(nodes):
        for n in nodes:
            if n.unschedulable:
                reasons[n.name] = _UNSCHEDULABLE
    return kept


@dataclass(frozen=True)
class NodeReady:
    """Ready condition True, unless the pod tolerates the `node.kubernetes.io/not-ready`
    NoSchedule taint (which upstream's node lifecycle puts on such nodes)."""

    name: str = "NodeReady"

    def prepare(self, pod: PodInfo) -> NodeFilter | None:
        return None if pod.tolerates_not_ready else _ready


@dataclass(frozen=True)
class NodeUnschedulable:
    """`spec.unschedulable` (cordon), unless the pod tolerates the unschedulable taint."""

    name: str = "NodeUnschedulable"

    def prepare(self, pod: PodInfo) -> NodeFilter | None:
        return None if pod.tolerates_unschedulable else _schedulable


@dataclass(frozen=True)
class NodeName:
    """`spec.nodeName`, when the pod names its node."""

    name: str = "NodeName"

    def prepare(self, pod: PodInfo) -> NodeFilter | None:
        wanted = pod.node_name
        if not wanted:
            return None

        def run(nodes: list[NodeInfo], reasons: dict[str, Reasons]) -> list[NodeInfo]:
            kept = []
            for n in nodes:
                if n.name == wanted:
                    kept.append(n)
                else:
                    reasons[n.name] = _NODE_NAME
            return kept

        return run


def _taint_reason(key: str, value: str) -> Reasons:
    return (f"node(s) had untolerated taint {{{key}: {value}}}",)


@dataclass(frozen=True)
class TaintToleration:
    """Every NoSchedule/NoExecute taint on the node is tolerated by the pod."""

    name: str = "TaintToleration"

    def prepare(self, pod: PodInfo) -> NodeFilter:
        tolerations = pod.tolerations
        verdicts: dict[tuple[str, str, str], Reasons] = {}

        def untolerated(node: NodeInfo) -> Reasons:
            for taint in node.hard_taints:
                found = verdicts.get(taint)
                if found is None:
                    tolerated = any(tolerates(t, *taint) for t in tolerations)
                    found = verdicts[taint] = _OK if tolerated else _taint_reason(*taint[:2])
                if found:
                    return found
            return _OK

        def run(nodes: list[NodeInfo], reasons: dict[str, Reasons]) -> list[NodeInfo]:
            kept = []
            for n in nodes:
                if n.hard_taints:
                    failed = untolerated(n)
                    if failed:
                        reasons[n.name] = failed
                        continue
                kept.append(n)
            return kept

        return run


@dataclass(frozen=True)
class NodeAffinity:
    """`spec.nodeSelector` and the required node affinity terms."""

    name: str = "NodeAffinity"

    def prepare(self, pod: PodInfo) -> NodeFilter | None:
        match = pod.required
        if match is None:
            return None

        def run(nodes: list[NodeInfo], reasons: dict[str, Reasons]) -> list[NodeInfo]:
            kept = []
            for n in nodes:
                if match(n):
                    kept.append(n)
                else:
                    reasons[n.name] = _AFFINITY
            return kept

        return run


@dataclass(frozen=True)
class NodePorts:
    """Host ports the pod wants are free on the node."""

    name: str = "NodePorts"

    def prepare(self, pod: PodInfo) -> NodeFilter | None:
        ports = pod.host_ports
        if not ports:
            return None

        def run(nodes: list[NodeInfo], reasons: dict[str, Reasons]) -> list[NodeInfo]:
            kept = []
            for n in nodes:
                if n.ports and n.port_conflict(ports):
                    reasons[n.name] = _PORTS
                else:
                    kept.append(n)
            return kept

        return run


@dataclass(frozen=True)
class NodeResourcesFit:
    """Requests fit in allocatable minus what is already requested; one more pod fits."""

    name: str = "NodeResourcesFit"

    def prepare(self, pod: PodInfo) -> NodeFilter:
        cpu, memory, ephemeral, scalar = pod.cpu, pod.memory, pod.ephemeral, pod.scalar

        def insufficient(node: NodeInfo) -> Reasons:
            reasons: list[str] = []
            if node.pod_count + 1 > node.alloc_pods:
                reasons.append(ERR_TOO_MANY_PODS)
            if cpu and cpu > node.alloc_cpu - node.cpu:
                reasons.append("Insufficient cpu")
            if memory and memory > node.alloc_memory - node.memory:
                reasons.append("Insufficient memory")
            if ephemeral and ephemeral > node.alloc_ephemeral - node.ephemeral:
                reasons.append("Insufficient ephemeral-storage")
            for name, value in scalar.items():
                if value > node.alloc_scalar.get(name, 0) - node.scalar.get(name, 0):
                    reasons.append(f"Insufficient {name}")
            return tuple(reasons)

        def run(nodes: list[NodeInfo], reasons: dict[str, Reasons]) -> list[NodeInfo]:
            if ephemeral or scalar or not cpu or not memory:
                kept = []
                for n in nodes:
                    failed = insufficient(n)
                    if failed:
                        reasons[n.name] = failed
                    else:
                        kept.append(n)
                return kept
            # The common pod asks for cpu and memory only: no call per node.
            kept = [
                n
                for n in nodes
                if n.pod_count < n.alloc_pods
                and cpu <= n.alloc_cpu - n.cpu
                and memory <= n.alloc_memory - n.memory
            ]
            if len(kept) != len(nodes):
                fits = set(map(id, kept))
                for n in nodes:
                    if id(n) not in fits:
                        reasons[n.name] = insufficient(n)
            return kept

        return run


# --- scores --------------------------------------------------------------------------------------


def _normalize(raw: list[int], *, reverse: bool = False) -> list[int] | None:
    """Upstream's DefaultNormalizeScore; None when all raw scores are equal."""
    high = max(raw)
    if high == min(raw):
        return None
    if reverse:
        return [MAX_NODE_SCORE - MAX_NODE_SCORE * s // high for s in raw]
    return [MAX_NODE_SCORE * s // high for s in raw]


def _tolerated(tolerations: Sequence[Toleration], taint: Taint) -> bool:
    return any(tolerates(t, *taint) for t in tolerations)


@dataclass(frozen=True)
class TaintTolerationScore:
    """Fewer PreferNoSchedule taints the pod does not tolerate scores higher."""

    name: str = "TaintToleration"

    def score(self, pod: PodInfo, nodes: Sequence[NodeInfo]) -> list[int] | None:
        tainted = [n.soft_taints for n in nodes if n.soft_taints]
        if not tainted:
            return None
        tolerations = [t for t in pod.tolerations if t[3] in ("", "PreferNoSchedule")]
        counts: dict[tuple[Taint, ...], int] = {}
        for taints in tainted:
            if taints not in counts:
                counts[taints] = sum(1 for t in taints if not _tolerated(tolerations, t))
        raw = [counts[n.soft_taints] if n.soft_taints else 0 for n in nodes]
        return _normalize(raw, reverse=True)


@dataclass(frozen=True)
class NodeAffinityScore:
    """Sum of the weights of the preferred node affinity terms a node matches."""

    name: str = "NodeAffinity"

    def score(self, pod: PodInfo, nodes: Sequence[NodeInfo]) -> list[int] | None:
        preferred = pod.preferred
        if not preferred:
            return None
        raw = [sum(weight for weight, match in preferred if match(node)) for node in nodes]
        return _normalize(raw)


ZONE_WEIGHTING: Final = 2 / 3


def _owner_counts(pod: PodInfo, nodes: Sequence[NodeInfo]) -> tuple[list[int], int] | None:
    """The pods of `pod`'s controller on each node, and their maximum; None when the pod has no
    controller or none of these nodes holds one of its pods."""
    owner = pod.owner
    if owner is None:
        return None
    counts = [node.owners.get(owner, 0) for node in nodes]
    high = max(counts)
    return None if high == 0 else (counts, high)


@dataclass(frozen=True)
class OwnerSpread:
    """Spread pods of one controller (the controller ownerReference) across nodes and zones.

    As upstream's SelectorSpread: a node scores 100 * (max - count) / max over the feasible
    nodes; when nodes carry a zone label, 2/3 of the score comes from the same formula over
    per-zone counts."""

    name: str = "OwnerSpread"

    def score(self, pod: PodInfo, nodes: Sequence[NodeInfo]) -> list[int] | None:
        spread = _owner_counts(pod, nodes)
        if spread is None:
            return None  # no pod of this owner on any of these nodes: all score 100
        counts, high = spread
        zones: dict[str, int] = {}
        for node, count in zip(nodes, counts, strict=True):
            if node.zone is not None:
                zones[node.zone] = zones.get(node.zone, 0) + count
        if not zones:
            if high == min(counts):
                return None
            return [MAX_NODE_SCORE * (high - c) // high for c in counts]
        zone_high = max(zones.values())
        zone_part = {
            zone: ZONE_WEIGHTING
            * (MAX_NODE_SCORE * (zone_high - c) / zone_high if zone_high else MAX_NODE_SCORE)
            for zone, c in zones.items()
        }
        node_weight = 1 - ZONE_WEIGHTING
        return [
            int(
                MAX_NODE_SCORE * (high - count) / high * node_weight + zone_part[node.zone]
                if node.zone is not None
                else MAX_NODE_SCORE * (high - count) / high
            )
            for node, count in zip(nodes, counts, strict=True)
        ]


@dataclass(frozen=True)
class LeastAllocated:
    """NodeResourcesFit's default score: the mean free fraction of CPU and memory after placing
    the pod, counting a container without requests as 100m / 200Mi. A resource the node lacks
    or would exceed scores 0."""

    name: str = "NodeResourcesFit"

    def score(self, pod: PodInfo, nodes: Sequence[NodeInfo]) -> list[int]:
        cpu, memory = pod.nonzero_cpu, pod.nonzero_memory
        out = []
        for n in nodes:
            alloc = n.alloc_cpu
            free = alloc - n.nonzero_cpu - cpu
            cpu_score = free * MAX_NODE_SCORE // alloc if alloc and free >= 0 else 0
            alloc = n.alloc_memory
            free = alloc - n.nonzero_memory - memory
            memory_score = free * MAX_NODE_SCORE // alloc if alloc and free >= 0 else 0
            out.append((cpu_score + memory_score) // 2)
        return out


@dataclass(frozen=True)
class BalancedAllocation:
    """Prefer nodes whose CPU and memory fractions stay close after placing the pod:
    100 * (1 - |cpu fraction - memory fraction| / 2), fractions capped at 1; a node lacking one
    of the resources scores 100. Skipped for best-effort pods."""

    name: str = "NodeResourcesBalancedAllocation"

    def score(self, pod: PodInfo, nodes: Sequence[NodeInfo]) -> list[int] | None:
        if pod.best_effort:
            return None
        cpu, memory = pod.cpu, pod.memory
        out = []
        for n in nodes:
            if n.alloc_cpu and n.alloc_memory:
                cpu_fraction = (n.cpu + cpu) / n.alloc_cpu
                if cpu_fraction > 1.0:
                    cpu_fraction = 1.0
                memory_fraction = (n.memory + memory) / n.alloc_memory
                if memory_fraction > 1.0:
                    memory_fraction = 1.0
                std = abs(cpu_fraction - memory_fraction) / 2
                out.append(int((1 - std) * MAX_NODE_SCORE))
            else:
                out.append(MAX_NODE_SCORE)
        return out


DEFAULT_FILTERS: Final[tuple[FilterPlugin, ...]] = (
    NodeReady(),
    NodeUnschedulable(),
    NodeName(),
    TaintToleration(),
    NodeAffinity(),
    NodePorts(),
    NodeResourcesFit(),
)
_LEAST_ALLOCATED: Final = LeastAllocated()
_BALANCED: Final = BalancedAllocation()
_NODE_AFFINITY: Final = NodeAffinityScore()
# `_plain_totals` is these, with these weights, for nodes without soft taints or zones.
DEFAULT_SCORES: Final[tuple[tuple[ScorePlugin, int], ...]] = (
    (TaintTolerationScore(), 3),
    (_NODE_AFFINITY, 2),
    (OwnerSpread(), 2),
    (_LEAST_ALLOCATED, 1),
    (_BALANCED, 1),
)
# Pod shapes kept in the memo (`Framework._filter_memo`); a cluster's pods rarely come in more
# shapes than this, and past it the memo starts over.
MEMO_KEYS: Final = 64


# --- the cycle -----------------------------------------------------------------------------------


def num_feasible_nodes_to_find(num_nodes: int, percentage: int | None = None) -> int:
    """How many feasible nodes to look for before scoring (upstream's numFeasibleNodesToFind).

    `percentage` None is adaptive: 50 % minus 1 % per 125 nodes, at least 5 %."""
    if num_nodes < MIN_FEASIBLE_NODES_TO_FIND:
        return num_nodes
    if percentage is None:
        percentage = max(
            MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND,
            BASE_PERCENTAGE_OF_NODES_TO_SCORE - num_nodes // 125,
        )
    if percentage >= 100:
        return num_nodes
    return max(MIN_FEASIBLE_NODES_TO_FIND, num_nodes * percentage // 100)


def failure_message(num_nodes: int, reasons: Mapping[str, Reasons]) -> str:
    """The FailedScheduling text: "0/N nodes are available: <count> <reason>, ...."."""
    if num_nodes == 0:
        return ERR_NO_NODES
    histogram: dict[str, int] = {}
    for node_reasons in reasons.values():
        for reason in node_reasons:
            histogram[reason] = histogram.get(reason, 0) + 1
    message = f"0/{num_nodes} nodes are available:"
    parts = sorted(f"{count} {reason}" for reason, count in histogram.items())
    if parts:
        message += f" {', '.join(parts)}."
    return message


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of one scheduling attempt.

    `node` is the chosen node's name, or None when the pod fits nowhere (or is invalid: `error`
    says why). `reasons` maps each node filtered out to why; `pod` is the parsed pod, to hand to
    `SchedulerCache.assume` without parsing it again."""

    node: str | None
    reasons: Mapping[str, Reasons] = field(default_factory=dict)
    num_nodes: int = 0
    pod: PodInfo | None = None
    error: str | None = None

    @property
    def message(self) -> str:
        """For the Scheduled / FailedScheduling event and the PodScheduled condition."""
        if self.error is not None:
            return self.error
        if self.node is not None:
            who = f"{self.pod.namespace}/{self.pod.name}" if self.pod is not None else "pod"
            return f"Successfully assigned {who} to {self.node}"
        return failure_message(self.num_nodes, self.reasons)


@dataclass(frozen=True)
class Framework:
    """A plugin configuration. Immutable: the only state of a scheduling cycle that outlives it
    is `SchedulerCache.next_start_index`."""

    filters: Sequence[FilterPlugin] = DEFAULT_FILTERS
    scores: Sequence[tuple[ScorePlugin, int]] = DEFAULT_SCORES
    percentage_of_nodes_to_score: int | None = None

    def schedule_one(
        self, pod: Obj | PodInfo, cache: SchedulerCache, rng: random.Random, now: float
    ) -> Decision:
        """Choose a node for `pod`. Expires stale assumptions first; does not assume."""
        cache.expire(now)
        nodes = cache.nodes()
        if isinstance(pod, PodInfo):
            info = pod
        else:
            try:
                info = PodInfo.from_pod(pod)
            except ValueError as exc:
                return Decision(None, {}, len(nodes), None, str(exc))
        if not nodes:
            return Decision(None, {}, 0, info)
        key = self._memo_key(info, len(nodes))
        resource = None
        plain = False
        if key is None:
            feasible, reasons = self._filter(info, cache, nodes)
        else:
            feasible, reasons, resource, plain = self._filter_memo(info, key, cache, nodes)
        if not feasible:
            return Decision(None, reasons, len(nodes), info)
        if len(feasible) == 1:
            return Decision(feasible[0].name, reasons, len(nodes), info)
        if resource is not None and plain:
            totals = _plain_totals(info, feasible, resource)
        else:
            totals = self._score(info, feasible, resource)
        best = max(totals)
        winners = [i for i, total in enumerate(totals) if total == best]
        pick = winners[0] if len(winners) == 1 else winners[rng.randrange(len(winners))]
        return Decision(feasible[pick].name, reasons, len(nodes), info)

    def _filter(
        self, pod: PodInfo, cache: SchedulerCache, nodes: list[NodeInfo]
    ) -> tuple[list[NodeInfo], dict[str, Reasons]]:
        count = len(nodes)
        wanted = num_feasible_nodes_to_find(count, self.percentage_of_nodes_to_score)
        start = cache.next_start_index % count
        filters = [f for f in (plugin.prepare(pod) for plugin in self.filters) if f is not None]
        feasible: list[NodeInfo] = []
        reasons: dict[str, Reasons] = {}
        visited = 0
        # Visit just enough nodes to find the rest of `wanted`, until found or all visited, so
        # the search never looks further than upstream's node-by-node one would.
        while visited < count and len(feasible) < wanted:
            size = min(wanted - len(feasible), count - visited)
            first = (start + visited) % count
            last = first + size
            chunk = nodes[first:last] if last <= count else nodes[first:] + nodes[: last - count]
            visited += size
            for run in filters:
                chunk = run(chunk, reasons)
                if not chunk:
                    break
            feasible += chunk
        cache.next_start_index = (start + visited) % count
        return feasible, reasons

    def _memo_key(self, pod: PodInfo, count: int) -> tuple[Any, ...] | None:
        """What the default filters and resource scores read of `pod`, as the key of the per-node
        memo (`_filter_memo`); None when the memo does not apply: other plugins, a search that
        stops short of all nodes, or filters that read more of the pod (its node name, node
        affinity, host ports)."""
        if (
            self.filters is not DEFAULT_FILTERS
            or self.scores is not DEFAULT_SCORES
            or pod.node_name
            or pod.required is not None
            or pod.host_ports
            or num_feasible_nodes_to_find(count, self.percentage_of_nodes_to_score) < count
        ):
            return None
        scalar = tuple(sorted(pod.scalar.items())) if pod.scalar else ()
        return (
            pod.cpu,
            pod.memory,
            pod.ephemeral,
            scalar,
            pod.nonzero_cpu,
            pod.nonzero_memory,
            pod.tolerations,
        )

    def _filter_memo(
        self, pod: PodInfo, key: tuple[Any, ...], cache: SchedulerCache, nodes: list[NodeInfo]
    ) -> tuple[list[NodeInfo], dict[str, Reasons], list[int], bool]:
        """`_filter` when it visits every node (the memo's condition), plus the feasible nodes'
        LeastAllocated + BalancedAllocation scores (both weight 1), and whether no feasible
        node has a soft taint or a zone (`_plain_totals` then scores).

        Why: a node's verdict and those two scores depend only on the node's state and on `key`
        (a pod's requests and tolerations), and between two pods of one workload only the node
        the first went to changes. So the cache keeps, per `key`, every node's verdict with the
        `NodeInfo.version` it was computed at (bumped by every change to the node), and the
        feasible nodes, reasons and scores they add up to; a scheduling cycle recomputes the
        nodes whose version moved and adjusts those lists. Same nodes, order, reasons and
        scores as `_filter` and the plugins (tested)."""
        count = len(nodes)
        start = cache.next_start_index % count
        memo: _ShapeMemo | None = cache.shape_memo.get(key)
        if memo is None or memo.nodes is not nodes or memo.start != start:
            if len(cache.shape_memo) >= MEMO_KEYS:
                cache.shape_memo.clear()
            memo = cache.shape_memo[key] = _ShapeMemo(self, pod, nodes, start)
        else:
            memo.refresh(pod)
        # Every node was visited: the next search starts where this one did, (start + count).
        cache.next_start_index = start
        return list(memo.feasible), dict(memo.reasons), list(memo.resource), memo.plain

    def _score(
        self, pod: PodInfo, nodes: list[NodeInfo], resource: list[int] | None = None
    ) -> list[int]:
        """Weighted totals per node; `resource`: the resource scores already summed (memo)."""
        totals = [0] * len(nodes) if resource is None else resource
        for plugin, weight in self.scores:
            if resource is not None and (plugin is _LEAST_ALLOCATED or plugin is _BALANCED):
                continue
            scores = plugin.score(pod, nodes)
            if scores is None:
                continue
            if weight == 1:
                totals = [t + s for t, s in zip(totals, scores, strict=True)]
            else:
                totals = [t + weight * s for t, s in zip(totals, scores, strict=True)]
        return totals


def _plain_totals(pod: PodInfo, nodes: list[NodeInfo], resource: list[int]) -> list[int]:
    """`Framework._score` of the default plugins over `nodes` without soft taints or zones,
    given their resource scores: TaintToleration then scores nothing and OwnerSpread is its
    zoneless formula, here added in the same pass as the sum."""
    totals = resource
    affinity = _NODE_AFFINITY.score(pod, nodes)
    if affinity is not None:
        totals = [t + 2 * s for t, s in zip(totals, affinity, strict=True)]
    spread = _owner_counts(pod, nodes)
    if spread is None:
        return totals  # OwnerSpread: no pod of the owner on these nodes, all score alike
    counts, high = spread
    return [
        t + 2 * (MAX_NODE_SCORE * (high - c) // high) for t, c in zip(totals, counts, strict=True)
    ]


def _checks(framework: Framework, pod: PodInfo) -> list[NodeFilter]:
    return [f for f in (p.prepare(pod) for p in framework.filters) if f is not None]


def _verdict(pod: PodInfo, node: NodeInfo, checks: list[NodeFilter]) -> tuple[Reasons, int]:
    """(why the checks reject the node or `()`, its resource score if feasible)."""
    found: dict[str, Reasons] = {}
    for run in checks:
        if not run([node], found):
            return found[node.name], 0
    score = _LEAST_ALLOCATED.score(pod, [node])[0]
    balanced = _BALANCED.score(pod, [node])  # None for a best-effort pod
    return _OK, score if balanced is None else score + balanced[0]


class _ShapeMemo:
    """`Framework._filter_memo`'s state for one pod shape: over the nodes in search order,
    each one's version and verdict as computed, and what they add up to."""

    __slots__ = ("checks", "feasible", "nodes", "order", "plain", "position", "reasons",
                 "resource", "start", "verdicts", "versions")  # fmt: skip

    def __init__(self, framework: Framework, pod: PodInfo, nodes: list[NodeInfo], start: int):
        self.nodes = nodes  # the cache's node list (a new list whenever nodes come or go)
        self.start = start
        self.order = nodes[start:] + nodes[:start]
        # The filters specialised for the shape: `prepare` reads only what the key holds.
        self.checks = _checks(framework, pod)
        self.versions = [n.version for n in self.order]
        self.verdicts = [_verdict(pod, n, self.checks) for n in self.order]
        self._total()

    def _total(self) -> None:
        self.feasible: list[NodeInfo] = []
        self.resource: list[int] = []
        self.reasons: dict[str, Reasons] = {}
        self.position: dict[int, int] = {}  # search position -> index in feasible
        for i, (n, (reasons, score)) in enumerate(zip(self.order, self.verdicts, strict=True)):
            if reasons:
                self.reasons[n.name] = reasons
            else:
                self.position[i] = len(self.feasible)
                self.feasible.append(n)
                self.resource.append(score)
        self.plain = not any(n.soft_taints or n.zone is not None for n in self.feasible)

    def refresh(self, pod: PodInfo) -> None:
        """Recompute the nodes that changed since; `pod` has this memo's shape."""
        versions = self.versions
        changed = [i for i, n in enumerate(self.order) if n.version != versions[i]]
        if not changed:
            return
        checks = self.checks
        retotal = False
        for i in changed:
            n = self.order[i]
            versions[i] = n.version
            if n.soft_taints or n.zone is not None:
                self.plain = False  # until `_total` looks again
            verdict = self.verdicts[i] = _verdict(pod, n, checks)
            at = self.position.get(i)
            if verdict[0] or at is None:
                retotal = True  # feasibility or reasons may have changed
            else:
                self.resource[at] = verdict[1]
        if retotal:
            self._total()


DEFAULT_FRAMEWORK: Final = Framework()


def schedule_one(
    pod: Obj | PodInfo,
    cache: SchedulerCache,
    rng: random.Random,
    now: float,
    framework: Framework = DEFAULT_FRAMEWORK,
) -> Decision:
    """`framework.schedule_one(pod, cache, rng, now)` with the default plugins."""
    return framework.schedule_one(pod, cache, rng, now)
