"""OwnerSpread: spread the pods of one controller across nodes and zones (upstream's
SelectorSpread, keyed by the controller ownerReference instead of selectors)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from orchestrator.scheduler.info import NodeInfo, PodInfo
from orchestrator.scheduler.plugins.base import MAX_NODE_SCORE

__all__ = ["ZONE_WEIGHTING", "OwnerSpread"]


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

    def cache_key(self, pod: PodInfo) -> None:
        return None  # relative to the other nodes scored

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
