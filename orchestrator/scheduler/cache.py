"""The scheduler's view of the cluster: nodes and what the pods on them already take.

Theory of operation: the cache is fed by the driver from two informers (nodes, and pods that have
a `spec.nodeName`) and by the scheduler's own decisions. Its one promise is that **a node is never
overcommitted because the watch lags**: the moment the scheduler picks a node it `assume`s the pod
there, so the next decision already sees the resources, host ports and spreading counts taken,
long before the bound pod comes back through the watch.

A pod's lifecycle in the cache::

    (absent) --assume--> assumed --add_pod/update_pod/confirm (bound pod seen)--> counted
       ^                    |  \\--forget (binding failed)--> (absent)
       |                    \\--expire(now), TTL after assume/finish_binding--> (absent)
       \\--remove_pod (deleted, or terminal phase)-- counted

* `add_pod` and `update_pod` are the same level-based operation: the pod's latest state replaces
  whatever was counted for its key (UID, else namespace/name). A pod seen with a node name is
  counted on that node, confirming an assumption (moving it if the API says another node). A pod
  seen without one (still pending) or in phase Succeeded/Failed is not counted, except that a
  pending pod keeps its assumption: the update is older than our binding.
* `assume` counts at once and arms a deadline `now + assumed_ttl`; `finish_binding` re-arms it
  when the bind call returns. An assumption neither confirmed nor forgotten by then is dropped by
  `expire(now)` (the framework calls it on every decision), so a lost watch event cannot pin
  resources forever. Deadlines sit in a heap with lazy invalidation: `expire` costs O(log n) per
  expired pod, nothing when none are due.
* Nodes: `add_node`/`update_node` (same operation) recompute the node's static facts and keep its
  pod totals; `update_node` says whether anything scheduling cares about changed, so the driver
  moves unschedulable pods only then and not on every heartbeat. `remove_node` hides the node from
  scheduling but keeps its pods counted until their own delete events arrive, so totals stay exact
  if the node comes back. A pod may arrive before its node: it is counted on a placeholder.
* `nodes()` is the list the framework iterates, in insertion order (deterministic with a seeded
  RNG), rebuilt only when the set of nodes changes. `next_start_index` is where the framework's
  next search for feasible nodes begins (it rotates, as upstream's `nextStartNodeIndex`).

Nothing here does I/O or reads a clock; times are passed in as floats (seconds).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from orchestrator.scheduler.info import NodeInfo, PodInfo, owner_of, pod_key

__all__ = ["DEFAULT_ASSUMED_TTL", "CacheStatistics", "SchedulerCache"]

Obj = Mapping[str, Any]
DEFAULT_ASSUMED_TTL: Final = 30.0
_TERMINAL: Final = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, slots=True)
class CacheStatistics:
    nodes: int
    """Nodes with a Node object (schedulable or not)."""
    pods: int
    """Pods counted on any node, assumed ones included."""
    assumed: int
    """Pods assumed and not yet confirmed, forgotten or expired."""


def _key_of(pod: Obj | PodInfo | str) -> str:
    if isinstance(pod, str):
        return pod
    if isinstance(pod, PodInfo):
        return pod.key
    return pod_key(pod)


class SchedulerCache:
    """Nodes, their requested resources, host ports and per-owner pod counts; assumed pods."""

    def __init__(self, *, assumed_ttl: float = DEFAULT_ASSUMED_TTL) -> None:
        self.assumed_ttl = assumed_ttl
        self.next_start_index = 0
        # The framework's per-pod-shape memo (`Framework._filter_memo`); the cache only holds it.
        self.shape_memo: dict[Any, Any] = {}
        # Invariants: every NodeInfo with a Node object is in `_nodes`; every counted pod key is
        # in `_pod_node`, mapped to the NodeInfo whose `pods` holds it; `_assumed` ⊆ `_pod_node`
        # and maps to the live deadline; `_deadlines` holds (deadline, seq, key) entries, stale
        # when `_assumed.get(key) != deadline`.
        self._infos: dict[str, NodeInfo] = {}
        self._nodes: dict[str, NodeInfo] = {}
        self._node_list: list[NodeInfo] | None = None
        self._pod_node: dict[str, NodeInfo] = {}
        self._assumed: dict[str, float] = {}
        self._deadlines: list[tuple[float, int, str]] = []
        self._seq = 0

    # --- nodes -----------------------------------------------------------------------------------

    def add_node(self, node: Obj) -> bool:
        """Add or update a node; True when a scheduling-relevant fact changed (always for a new
        node)."""
        name = str((node.get("metadata") or {}).get("name") or "")
        if not name:
            raise ValueError("node without metadata.name")
        info = self._infos.get(name)
        if info is None:
            info = self._infos[name] = NodeInfo(name)
        changed = info.set_node(node)
        if name not in self._nodes:
            self._nodes[name] = info
            self._node_list = None
        return changed

    update_node = add_node

    def remove_node(self, node: Obj | str) -> None:
        """Hide the node from scheduling; its pods stay counted until they are removed."""
        name = node if isinstance(node, str) else str((node.get("metadata") or {}).get("name"))
        info = self._nodes.pop(name, None)
        if info is None:
            return
        self._node_list = None
        info.set_node(None)
        if not info.pods:
            del self._infos[name]

    def nodes(self) -> list[NodeInfo]:
        """Nodes with a Node object, in the order they were first added. Do not mutate."""
        if self._node_list is None:
            self._node_list = list(self._nodes.values())
        return self._node_list

    def get_node(self, name: str) -> NodeInfo | None:
        return self._nodes.get(name)

    # --- pods from informer events ---------------------------------------------------------------

    def add_pod(self, pod: Obj) -> None:
        """Level-based: count `pod` as it now is (see the module docstring)."""
        key = pod_key(pod)
        node_name = (pod.get("spec") or {}).get("nodeName") or ""
        phase = (pod.get("status") or {}).get("phase")
        if not node_name or phase in _TERMINAL:
            if not node_name and key in self._assumed:
                return  # an update older than our binding: keep the assumption
            self._uncount(key)
            return
        current = self._pod_node.get(key)
        if key in self._assumed:
            del self._assumed[key]
            if current is not None and current.name == node_name:
                info = current.pods[key]
                info.pod = pod  # resources cannot change between assume and bind
                return
        elif current is not None and current.name == node_name:
            info = current.pods[key]
            if info.owner == owner_of(pod.get("metadata") or {}):
                # The same pod (the key is its UID) on the same node, a status update say: what
                # is counted, its requests and ports, cannot change; only its controller can.
                info.pod = pod
                return
        self._uncount(key)
        self._count(PodInfo.from_pod(pod, strict=False), node_name)

    update_pod = add_pod
    confirm = add_pod

    def remove_pod(self, pod: Obj | PodInfo | str) -> None:
        """Stop counting the pod (deleted), assumed or not."""
        key = _key_of(pod)
        self._assumed.pop(key, None)
        self._uncount(key)

    # --- the scheduler's own decisions -----------------------------------------------------------

    def assume(self, pod: Obj | PodInfo, node_name: str, now: float) -> None:
        """Count `pod` on `node_name` at once, before binding. Raises `ValueError` if the pod is
        already counted (assumed or bound) or the node is unknown."""
        info = pod if isinstance(pod, PodInfo) else PodInfo.from_pod(pod)
        if info.key in self._pod_node:
            raise ValueError(f"pod {info.namespace}/{info.name} is already in the scheduler cache")
        if node_name not in self._nodes:
            raise ValueError(f"cannot assume pod {info.namespace}/{info.name}: no node {node_name}")
        self._count(info, node_name)
        self._arm(info.key, now)

    def finish_binding(self, pod: Obj | PodInfo | str, now: float) -> None:
        """The bind call returned: the assumption now expires `assumed_ttl` after `now`."""
        key = _key_of(pod)
        if key in self._assumed:
            self._arm(key, now)

    def forget(self, pod: Obj | PodInfo | str) -> None:
        """Drop an assumption (binding failed). A no-op for pods not assumed."""
        key = _key_of(pod)
        if self._assumed.pop(key, None) is not None:
            self._uncount(key)

    def expire(self, now: float) -> list[str]:
        """Drop assumptions whose deadline is ≤ `now`; returns their keys."""
        expired: list[str] = []
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            deadline, _, key = heapq.heappop(heap)
            if self._assumed.get(key) == deadline:
                del self._assumed[key]
                self._uncount(key)
                expired.append(key)
        return expired

    def is_assumed(self, pod: Obj | PodInfo | str) -> bool:
        return _key_of(pod) in self._assumed

    def node_of(self, pod: Obj | PodInfo | str) -> str | None:
        """The node the pod is counted on, or None."""
        info = self._pod_node.get(_key_of(pod))
        return None if info is None else info.name

    def statistics(self) -> CacheStatistics:
        return CacheStatistics(
            nodes=len(self._nodes), pods=len(self._pod_node), assumed=len(self._assumed)
        )

    # --- internals -------------------------------------------------------------------------------

    def _arm(self, key: str, now: float) -> None:
        deadline = now + self.assumed_ttl
        self._assumed[key] = deadline
        self._seq += 1
        heapq.heappush(self._deadlines, (deadline, self._seq, key))

    def _count(self, info: PodInfo, node_name: str) -> None:
        node = self._infos.get(node_name)
        if node is None:
            node = self._infos[node_name] = NodeInfo(node_name)
        node.add_pod(info)
        self._pod_node[info.key] = node

    def _uncount(self, key: str) -> None:
        node = self._pod_node.pop(key, None)
        if node is None:
            return
        node.remove_pod(key)
        if node.node is None and not node.pods:
            del self._infos[node.name]
