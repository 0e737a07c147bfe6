"""Filters on the node itself: readiness (NodeReady), cordon (NodeUnschedulable), and the
node a pod names (NodeName).

Each filter first keeps the passing nodes with a comprehension over plain attributes (no call per
node in the common case), and walks the nodes again to record reasons only when some failed.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Final

from orchestrator.scheduler.info import NodeInfo, PodInfo
from orchestrator.scheduler.plugins.base import NodeFilter, Reasons

__all__ = ["ERR_NODE_NAME", "ERR_NOT_READY", "ERR_UNSCHEDULABLE", "NodeName", "NodeReady",
           "NodeUnschedulable"]  # fmt: skip

ERR_NOT_READY: Final = "node(s) were not ready"
ERR_UNSCHEDULABLE: Final = "node(s) were unschedulable"
ERR_NODE_NAME: Final = "node(s) didn't match the requested node name"

_NOT_READY: Final = (ERR_NOT_READY,)
_UNSCHEDULABLE: Final = (ERR_UNSCHEDULABLE,)
_NODE_NAME: Final = (ERR_NODE_NAME,)


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

    def cache_key(self, pod: PodInfo) -> Hashable:
        return pod.tolerates_not_ready

    def prepare(self, pod: PodInfo) -> NodeFilter | None:
        return None if pod.tolerates_not_ready else _ready


@dataclass(frozen=True)
class NodeUnschedulable:
    """`spec.unschedulable` (cordon), unless the pod tolerates the unschedulable taint."""

    name: str = "NodeUnschedulable"

    def cache_key(self, pod: PodInfo) -> Hashable:
        return pod.tolerates_unschedulable

    def prepare(self, pod: PodInfo) -> NodeFilter | None:
        return None if pod.tolerates_unschedulable else _schedulable


@dataclass(frozen=True)
class NodeName:
    """`spec.nodeName`, when the pod names its node."""

    name: str = "NodeName"

    def cache_key(self, pod: PodInfo) -> Hashable | None:
        return None if pod.node_name else ()

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
