"""The scheduler's plugins, one module per family, and the default configuration.

* `base` — the `FilterPlugin` / `ScorePlugin` protocols and their caching contract.
* `node` — NodeReady, NodeUnschedulable, NodeName.
* `taints` — TaintToleration (filter and score).
* `affinity` — NodeAffinity (filter and score).
* `ports` — NodePorts.
* `resources` — NodeResourcesFit (filter), LeastAllocated and BalancedAllocation (scores).
* `spread` — OwnerSpread.

Default plugins, in upstream order and weights: filters NodeReady (not upstream: a node whose
Ready condition is not True is skipped unless the pod tolerates the not-ready taint),
NodeUnschedulable, NodeName, TaintToleration, NodeAffinity (nodeSelector + required terms),
NodePorts, NodeResourcesFit; scores TaintToleration (3, fewer untolerated PreferNoSchedule
taints), NodeAffinity (2, preferred terms), OwnerSpread (2, fewer pods of the same controller on
the node and in its zone, as upstream's SelectorSpread), NodeResourcesFit (1, LeastAllocated),
NodeResourcesBalancedAllocation (1).
"""

from __future__ import annotations

from typing import Final

from orchestrator.scheduler.plugins.affinity import ERR_AFFINITY, NodeAffinity, NodeAffinityScore
from orchestrator.scheduler.plugins.base import (
    MAX_NODE_SCORE,
    FilterPlugin,
    NodeFilter,
    Reasons,
    ScorePlugin,
)
from orchestrator.scheduler.plugins.node import (
    ERR_NODE_NAME,
    ERR_NOT_READY,
    ERR_UNSCHEDULABLE,
    NodeName,
    NodeReady,
    NodeUnschedulable,
)
from orchestrator.scheduler.plugins.ports import ERR_PORTS, NodePorts
from orchestrator.scheduler.plugins.resources import (
    ERR_TOO_MANY_PODS,
    BalancedAllocation,
    LeastAllocated,
    NodeResourcesFit,
)
from orchestrator.scheduler.plugins.spread import OwnerSpread
from orchestrator.scheduler.plugins.taints import TaintToleration, TaintTolerationScore

__all__ = [
    "DEFAULT_FILTERS",
    "DEFAULT_SCORES",
    "ERR_AFFINITY",
    "ERR_NODE_NAME",
    "ERR_NOT_READY",
    "ERR_PORTS",
    "ERR_TOO_MANY_PODS",
    "ERR_UNSCHEDULABLE",
    "MAX_NODE_SCORE",
    "BalancedAllocation",
    "FilterPlugin",
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
    "Reasons",
    "ScorePlugin",
    "TaintToleration",
    "TaintTolerationScore",
]

DEFAULT_FILTERS: Final[tuple[FilterPlugin, ...]] = (
    NodeReady(),
    NodeUnschedulable(),
    NodeName(),
    TaintToleration(),
    NodeAffinity(),
    NodePorts(),
    NodeResourcesFit(),
)
DEFAULT_SCORES: Final[tuple[tuple[ScorePlugin, int], ...]] = (
    (TaintTolerationScore(), 3),
    (NodeAffinityScore(), 2),
    (OwnerSpread(), 2),
    (LeastAllocated(), 1),
    (BalancedAllocation(), 1),
)
