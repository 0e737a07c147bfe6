"""NodeAffinity: the filter (`spec.nodeSelector` and the required terms, compiled once per pod
by `PodInfo`) and the score (the weights of the preferred terms a node matches)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Final

from orchestrator.scheduler.info import NodeInfo, PodInfo
from orchestrator.scheduler.plugins.base import NodeFilter, Reasons, normalize

__all__ = ["ERR_AFFINITY", "NodeAffinity", "NodeAffinityScore"]

ERR_AFFINITY: Final = "node(s) didn't match Pod's node affinity/selector"
_AFFINITY: Final = (ERR_AFFINITY,)


@dataclass(frozen=True)
class NodeAffinity:
    """`spec.nodeSelector` and the required node affinity terms."""

    name: str = "NodeAffinity"

    def cache_key(self, pod: PodInfo) -> Hashable | None:
        return None if pod.required is not None else ()

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
class NodeAffinityScore:
    """Sum of the weights of the preferred node affinity terms a node matches."""

    name: str = "NodeAffinity"

    def cache_key(self, pod: PodInfo) -> None:
        return None  # normalised over the nodes scored

    def score(self, pod: PodInfo, nodes: Sequence[NodeInfo]) -> list[int] | None:
        preferred = pod.preferred
        if not preferred:
            return None
        raw = [sum(weight for weight, match in preferred if match(node)) for node in nodes]
        return normalize(raw)
