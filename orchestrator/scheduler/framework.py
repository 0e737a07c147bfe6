"""The scheduling framework: run the configured filter and score plugins for one pod and pick
a node (`Framework.schedule_one`).

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

The plugins live in `scheduler.plugins` (one module per family; the defaults, their order
and weights in its `__init__`).

Cost per pod: O(visited nodes * relevant checks) for filtering and O(feasible nodes * score
plugins) for scoring, all on precomputed numbers; nothing iterates over the cluster's pods.

The shape memo (`Framework._filter_memo`). When every node is visited (clusters up to 100
nodes) and every filter declares its verdict cacheable for this pod (`cache_key`, see
`plugins.base`), the nodes' verdicts, and the weighted sum of the cacheable scores (the
per-node ones: LeastAllocated, BalancedAllocation), are memoized per pod shape (the plugins'
keys together) until a node changes (`NodeInfo.version`): a workload's next pod recomputes only
the node its predecessor went to, and finds the feasible nodes without visiting the others. The
other score plugins (normalised over the feasible nodes) then run as usual, with the configured
weights, on top of the memoized sums. `Framework(memo=False)` turns the memo off (the tests
compare both paths).

`Decision.message` is the FailedScheduling text, built like upstream's `FitError`:
"0/3 nodes are available: 1 Insufficient cpu, 2 node(s) didn't match Pod's node
affinity/selector." (reason counts sorted as strings, then joined).
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from orchestrator.scheduler.cache import SchedulerCache
from orchestrator.scheduler.info import NodeInfo, PodInfo
from orchestrator.scheduler.plugins import (
    DEFAULT_FILTERS,
    DEFAULT_SCORES,
    FilterPlugin,
    NodeFilter,
    Reasons,
    ScorePlugin,
)
from orchestrator.scheduler.plugins.base import OK

__all__ = [
    "DEFAULT_FRAMEWORK",
    "ERR_NO_NODES",
    "Decision",
    "Framework",
    "check_node",
    "failure_message",
    "num_feasible_nodes_to_find",
    "schedule_one",
]

Obj = Mapping[str, Any]
Weighted = Sequence[tuple[ScorePlugin, int]]

MIN_FEASIBLE_NODES_TO_FIND: Final = 100
MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND: Final = 5
BASE_PERCENTAGE_OF_NODES_TO_SCORE: Final = 50
ERR_NO_NODES: Final = "no nodes available to schedule pods"
# Pod shapes kept in the memo (`Framework._filter_memo`); a cluster's pods rarely come in more
# shapes than this, and past it the memo starts over.
MEMO_KEYS: Final = 64


def check_node(plugin: FilterPlugin, pod: PodInfo, node: NodeInfo) -> Reasons:
    """Why `plugin` rejects `node` for `pod`; `()` when it passes (or the plugin skips)."""
    run = plugin.prepare(pod)
    if run is None:
        return OK
    reasons: dict[str, Reasons] = {}
    kept = run([node], reasons)
    return OK if kept else reasons[node.name]


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
    is `SchedulerCache.next_start_index` (and the shape memo the cache holds for it)."""

    filters: Sequence[FilterPlugin] = DEFAULT_FILTERS
    scores: Weighted = DEFAULT_SCORES
    percentage_of_nodes_to_score: int | None = None
    memo: bool = True  # False: never use the shape memo (module doc)

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
        plan = self._memo_plan(info, len(nodes)) if self.memo else None
        cached: list[int] | None = None
        scores: Weighted = self.scores
        if plan is None:
            feasible, reasons = self._filter(info, cache, nodes)
        else:
            key, memoized, scores = plan
            feasible, reasons, cached = self._filter_memo(info, key, memoized, cache, nodes)
        if not feasible:
            return Decision(None, reasons, len(nodes), info)
        if len(feasible) == 1:
            return Decision(feasible[0].name, reasons, len(nodes), info)
        totals = self._score(info, feasible, scores, cached)
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
        filters = _checks(self, pod)
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

    def _memo_plan(
        self, pod: PodInfo, count: int
    ) -> tuple[tuple[Hashable, ...], Weighted, Weighted] | None:
        """Whether the shape memo (`_filter_memo`) applies to `pod`, and how: (its key, the
        score plugins it sums per node, the score plugins left to run over the feasible nodes).
        None when it does not apply: a search that stops short of all nodes, or a filter that
        cannot reuse its verdicts for this pod (its `cache_key` is None: e.g. the pod names its
        node, has required node affinity or host ports).

        The key is every plugin's `cache_key` (None for the scores that are not memoized, so the
        key also says which are) and the framework's identity."""
        if num_feasible_nodes_to_find(count, self.percentage_of_nodes_to_score) < count:
            return None
        key: list[Hashable] = [id(self)]
        for plugin in self.filters:
            part = plugin.cache_key(pod)
            if part is None:
                return None
            key.append(part)
        memoized: list[tuple[ScorePlugin, int]] = []
        rest: list[tuple[ScorePlugin, int]] = []
        for scorer, weight in self.scores:
            part = scorer.cache_key(pod)
            key.append(part)
            (rest if part is None else memoized).append((scorer, weight))
        return tuple(key), memoized, rest

    def _filter_memo(
        self,
        pod: PodInfo,
        key: tuple[Hashable, ...],
        memoized: Weighted,
        cache: SchedulerCache,
        nodes: list[NodeInfo],
    ) -> tuple[list[NodeInfo], dict[str, Reasons], list[int]]:
        """`_filter` when it visits every node (the memo's condition), plus the feasible nodes'
        weighted sums of the `memoized` (per-node, cacheable) score plugins.

        Why: a node's verdict and those scores depend only on the node's state and on `key`
        (the plugins' declarations), and between two pods of one workload only the node the
        first went to changes. So the cache keeps, per `key`, every node's verdict with the
        `NodeInfo.version` it was computed at (bumped by every change to the node), and the
        feasible nodes, reasons and sums they add up to; a scheduling cycle recomputes the
        nodes whose version moved and adjusts those lists. Same nodes, order, reasons and
        scores as `_filter` and the plugins (tested)."""
        count = len(nodes)
        start = cache.next_start_index % count
        memo: _ShapeMemo | None = cache.shape_memo.get(key)
        if (
            memo is None
            or memo.framework is not self
            or memo.nodes is not nodes
            or (memo.start != start)
        ):
            if len(cache.shape_memo) >= MEMO_KEYS:
                cache.shape_memo.clear()
            memo = cache.shape_memo[key] = _ShapeMemo(self, pod, memoized, nodes, start)
        else:
            memo.refresh(pod)
        # Every node was visited: the next search starts where this one did, (start + count).
        cache.next_start_index = start
        return list(memo.feasible), dict(memo.reasons), list(memo.resource)

    def _score(
        self,
        pod: PodInfo,
        nodes: list[NodeInfo],
        scores: Weighted,
        base: list[int] | None = None,
    ) -> list[int]:
        """Weighted totals per node of `scores`, added to `base` (the memoized sums) if given."""
        totals = [0] * len(nodes) if base is None else base
        for plugin, weight in scores:
            result = plugin.score(pod, nodes)
            if result is None:
                continue
            if weight == 1:
                totals = [t + s for t, s in zip(totals, result, strict=True)]
            else:
                totals = [t + weight * s for t, s in zip(totals, result, strict=True)]
        return totals


def _checks(framework: Framework, pod: PodInfo) -> list[NodeFilter]:
    return [f for f in (p.prepare(pod) for p in framework.filters) if f is not None]


def _verdict(
    pod: PodInfo, node: NodeInfo, checks: list[NodeFilter], memoized: Weighted
) -> tuple[Reasons, int]:
    """(why the checks reject the node or `()`, its weighted memoized scores if feasible)."""
    found: dict[str, Reasons] = {}
    for run in checks:
        if not run([node], found):
            return found[node.name], 0
    total = 0
    for plugin, weight in memoized:
        score = plugin.score(pod, [node])  # None: the plugin skips this pod (0 for every node)
        if score is not None:
            total += weight * score[0]
    return OK, total


class _ShapeMemo:
    """`Framework._filter_memo`'s state for one pod shape: over the nodes in search order,
    each one's version and verdict as computed, and what they add up to."""

    __slots__ = ("checks", "feasible", "framework", "memoized", "nodes", "order", "position",
                 "reasons", "resource", "start", "verdicts", "versions")  # fmt: skip

    def __init__(
        self,
        framework: Framework,
        pod: PodInfo,
        memoized: Weighted,
        nodes: list[NodeInfo],
        start: int,
    ) -> None:
        self.framework = framework
        self.memoized = memoized
        self.nodes = nodes  # the cache's node list (a new list whenever nodes come or go)
        self.start = start
        self.order = nodes[start:] + nodes[:start]
        # The filters specialised for the shape: `prepare` reads only what the key holds.
        self.checks = _checks(framework, pod)
        self.versions = [n.version for n in self.order]
        self.verdicts = [_verdict(pod, n, self.checks, memoized) for n in self.order]
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

    def refresh(self, pod: PodInfo) -> None:
        """Recompute the nodes that changed since; `pod` has this memo's shape."""
        versions = self.versions
        changed = [i for i, n in enumerate(self.order) if n.version != versions[i]]
        if not changed:
            return
        checks, memoized = self.checks, self.memoized
        retotal = False
        for i in changed:
            n = self.order[i]
            versions[i] = n.version
            verdict = self.verdicts[i] = _verdict(pod, n, checks, memoized)
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
