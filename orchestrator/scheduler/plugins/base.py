"""The plugin interface of the scheduler's framework: `FilterPlugin`, `ScorePlugin`, and what
plugins share (reason tuples, score normalisation).

A plugin is a small immutable object; the framework (`scheduler.framework`) calls it once per
scheduling attempt, never per node, and the plugin answers with per-node results.

Caching contract (`cache_key`). A plugin declares whether its result for a node can be reused
for every pod of the same *shape*: `cache_key(pod)` returns a hashable value (the part of the pod
the plugin reads, e.g. its requests) when the verdict of a filter, or the score of a score
plugin, for one node depends only on that node's state and on that value; or None when it
cannot be reused for this pod. Two pods with equal keys must get the same per-node results.
A score plugin can only be cacheable when a node's score does not depend on the other nodes
being scored (no normalisation over them): LeastAllocated is, OwnerSpread is not. The
framework's memo (`Framework._filter_memo`) keys its per-node verdicts and cached scores on the
plugins' keys together, and `NodeInfo.version` tells it which nodes changed since.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Final, Protocol

from orchestrator.scheduler.info import NodeInfo, PodInfo

__all__ = [
    "MAX_NODE_SCORE",
    "OK",
    "FilterPlugin",
    "NodeFilter",
    "Reasons",
    "ScorePlugin",
    "normalize",
]

Reasons = tuple[str, ...]
NodeFilter = Callable[[list[NodeInfo], dict[str, Reasons]], list[NodeInfo]]
"""A filter specialised for one pod: returns the nodes that pass, in order, and records in the
dict why each other node fails (upstream's reason strings)."""

MAX_NODE_SCORE: Final = 100
OK: Final[Reasons] = ()


class FilterPlugin(Protocol):
    """A hard constraint. `prepare` returns the filter specialised for `pod`, or None to skip.
    `cache_key`: see the module doc (None: this pod's verdicts cannot be reused)."""

    @property
    def name(self) -> str: ...

    def prepare(self, pod: PodInfo) -> NodeFilter | None: ...

    def cache_key(self, pod: PodInfo) -> Hashable | None: ...


class ScorePlugin(Protocol):
    """A preference. `score` returns one 0..100 integer per node, in order, or None when every
    node would score the same for this pod (the plugin is then skipped). `cache_key`: see the
    module doc (None: the score depends on more than the node and the key)."""

    @property
    def name(self) -> str: ...

    def score(self, pod: PodInfo, nodes: Sequence[NodeInfo]) -> list[int] | None: ...

    def cache_key(self, pod: PodInfo) -> Hashable | None: ...


def normalize(raw: list[int], *, reverse: bool = False) -> list[int] | None:
    """Upstream's DefaultNormalizeScore; None when all raw scores are equal."""
    high = max(raw)
    if high == min(raw):
        return None
    if reverse:
        return [MAX_NODE_SCORE - MAX_NODE_SCORE * s // high for s in raw]
    return [MAX_NODE_SCORE * s // high for s in raw]
