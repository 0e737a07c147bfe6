"""NodeResourcesFit: the filter (requests fit in what is left of allocatable, one more pod fits)
and the resource scores (LeastAllocated, its default score; NodeResourcesBalancedAllocation).
Both scores are per node (no normalisation over the nodes), so they are cacheable per shape."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Final

from orchestrator.scheduler.info import NodeInfo, PodInfo
from orchestrator.scheduler.plugins.base import MAX_NODE_SCORE, NodeFilter, Reasons

__all__ = ["ERR_TOO_MANY_PODS", "BalancedAllocation", "LeastAllocated", "NodeResourcesFit"]

ERR_TOO_MANY_PODS: Final = "Too many pods"


@dataclass(frozen=True)
class NodeResourcesFit:
    """Requests fit in allocatable minus what is already requested; one more pod fits."""

    name: str = "NodeResourcesFit"

    def cache_key(self, pod: PodInfo) -> Hashable:
        scalar = tuple(sorted(pod.scalar.items())) if pod.scalar else ()
        return (pod.cpu, pod.memory, pod.ephemeral, scalar)

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


@dataclass(frozen=True)
class LeastAllocated:
    """NodeResourcesFit's default score: the mean free fraction of CPU and memory after placing
    the pod, counting a container without requests as 100m / 200Mi. A resource the node lacks
    or would exceed scores 0."""

    name: str = "NodeResourcesFit"

    def cache_key(self, pod: PodInfo) -> Hashable:
        return (pod.nonzero_cpu, pod.nonzero_memory)  # a node's score: its own numbers only

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

    def cache_key(self, pod: PodInfo) -> Hashable:
        return (pod.best_effort, pod.cpu, pod.memory)  # a node's score: its own numbers only

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
