"""TaintToleration: the filter (every NoSchedule/NoExecute taint tolerated) and the score (fewer
untolerated PreferNoSchedule taints), with `kube.taints.tolerates` as the one matching rule."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from orchestrator.kube.taints import Taint, Toleration, tolerates
from orchestrator.scheduler.info import NodeInfo, PodInfo
from orchestrator.scheduler.plugins.base import OK, NodeFilter, Reasons, normalize

__all__ = ["TaintToleration", "TaintTolerationScore"]


def _taint_reason(key: str, value: str) -> Reasons:
    return (f"node(s) had untolerated taint {{{key}: {value}}}",)


@dataclass(frozen=True)
class TaintToleration:
    """Every NoSchedule/NoExecute taint on the node is tolerated by the pod."""

    name: str = "TaintToleration"

    def cache_key(self, pod: PodInfo) -> Hashable:
        return pod.tolerations

    def prepare(self, pod: PodInfo) -> NodeFilter:
        tolerations = pod.tolerations
        verdicts: dict[tuple[str, str, str], Reasons] = {}

        def untolerated(node: NodeInfo) -> Reasons:
            for taint in node.hard_taints:
                found = verdicts.get(taint)
                if found is None:
                    tolerated = any(tolerates(t, *taint) for t in tolerations)
                    found = verdicts[taint] = OK if tolerated else _taint_reason(*taint[:2])
                if found:
                    return found
            return OK

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


def _tolerated(tolerations: Sequence[Toleration], taint: Taint) -> bool:
    return any(tolerates(t, *taint) for t in tolerations)


@dataclass(frozen=True)
class TaintTolerationScore:
    """Fewer PreferNoSchedule taints the pod does not tolerate scores higher."""

    name: str = "TaintToleration"

    def cache_key(self, pod: PodInfo) -> None:
        return None  # normalised over the nodes scored

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
        return normalize(raw, reverse=True)
