"""The scheduling queue: which pending pod to try next, and when to retry the ones that failed.

Theory of operation (upstream's PriorityQueue, single-threaded, time passed in). Every pending
pod the queue knows is in exactly one place:

* **active** — ready to be tried; `pop` takes the highest `spec.priority`, then the earliest
  arrival (FIFO). A heap of (-priority, seq) with lazy invalidation.
* **backoff** — failed recently; waits `backoff(attempts)` = 1 s doubling per attempt, capped at
  10 s, from the time it failed, then moves to active. A heap of (ready_at, seq).
* **unschedulable** — no node fits; waits for a cluster event that may change that
  (`move_all_to_active_or_backoff`: node added or changed, assigned pod deleted) or at most
  `max_unschedulable` (5 min), then goes to active, or to backoff if its backoff has not yet
  run out. A dict in the order pods became unschedulable, so the 5-minute flush stops at the
  first pod still too young.
* **in flight** — handed out by `pop` and not yet reported back. The driver reports exactly one
  of `done` (bound), `add_unschedulable` (no fit) or `add_backoff` (an error such as a failed
  bind). If a move event arrived while the pod was in flight, `add_unschedulable` sends it to
  backoff instead: the event may already have made it schedulable (upstream's moveRequestCycle).

Informer events: `add` for a pending pod (new or changed; a changed spec or labels wakes an
unschedulable pod, a status-only change does not — the scheduler's own PodScheduled condition
must not loop it), `delete` when it is deleted or bound. A pod deleted while in flight is dropped
when reported back.

Each `pop` counts an attempt for the pod; attempts survive requeueing and reset only when the pod
leaves the queue. `next_deadline()` tells the driver when to call `pop` again if nothing else
happens. All operations are O(log n) except the move on a cluster event, which is linear in the
unschedulable pods (as upstream without queueing hints), which is why the driver should move
only on scheduling-relevant changes (`SchedulerCache.update_node` returns whether there was one).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from orchestrator.scheduler.info import pod_key

__all__ = [
    "DEFAULT_INITIAL_BACKOFF",
    "DEFAULT_MAX_BACKOFF",
    "DEFAULT_MAX_UNSCHEDULABLE",
    "QueueStatistics",
    "SchedulingQueue",
]

Obj = Mapping[str, Any]
DEFAULT_INITIAL_BACKOFF: Final = 1.0
DEFAULT_MAX_BACKOFF: Final = 10.0
DEFAULT_MAX_UNSCHEDULABLE: Final = 300.0

Place = Literal["active", "backoff", "unschedulable", "in_flight"]


@dataclass(frozen=True, slots=True)
class QueueStatistics:
    active: int
    backoff: int
    unschedulable: int
    in_flight: int


@dataclass(slots=True)
class _Entry:
    key: str
    pod: Obj
    priority: int
    place: Place
    token: int = 0
    """Matches the entry's one live heap item; older heap items are stale."""
    attempts: int = 0
    cycle: int = 0
    """Scheduling cycle of the last pop."""
    backoff_until: float = 0.0
    unschedulable_since: float = 0.0
    deleted: bool = False


def _priority(pod: Obj) -> int:
    value = (pod.get("spec") or {}).get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _shape(pod: Obj) -> tuple[Any, Any]:
    return (pod.get("spec"), (pod.get("metadata") or {}).get("labels"))


class SchedulingQueue:
    """Active (priority, FIFO), backoff (1 → 10 s) and unschedulable (event or 5 min) pods."""

    def __init__(
        self,
        *,
        initial_backoff: float = DEFAULT_INITIAL_BACKOFF,
        max_backoff: float = DEFAULT_MAX_BACKOFF,
        max_unschedulable: float = DEFAULT_MAX_UNSCHEDULABLE,
    ) -> None:
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self.max_unschedulable = max_unschedulable
        # Invariants: every key in `_entries` has exactly one place; an "active" entry has one
        # heap item in `_active` with its token, a "backoff" entry one in `_backoff`, an
        # "unschedulable" entry is in `_unschedulable`; counts mirror the places.
        self._entries: dict[str, _Entry] = {}
        self._active: list[tuple[int, int, int, str]] = []  # (-priority, seq, token, key)
        self._backoff: list[tuple[float, int, int, str]] = []  # (ready_at, seq, token, key)
        self._unschedulable: dict[str, _Entry] = {}
        self._counts: dict[Place, int] = {
            "active": 0,
            "backoff": 0,
            "unschedulable": 0,
            "in_flight": 0,
        }
        self._seq = 0
        self._cycle = 0
        self._move_cycle = -1

    # --- informer events -------------------------------------------------------------------------

    def add(self, pod: Obj, now: float) -> None:
        """A pending pod was created or changed (level-based: either way, call this)."""
        key = pod_key(pod)
        entry = self._entries.get(key)
        if entry is None:
            entry = _Entry(key=key, pod=pod, priority=_priority(pod), place="active")
            self._entries[key] = entry
            self._counts["active"] += 1
            self._push_active(entry)
            return
        old = entry.pod
        entry.pod = pod
        priority = _priority(pod)
        if entry.place == "active" and priority != entry.priority:
            entry.priority = priority
            self._push_active(entry)
        entry.priority = priority
        if entry.place == "unschedulable" and _shape(old) != _shape(pod):
            self._wake(entry, now)

    def delete(self, pod: Obj | str) -> None:
        """The pod was deleted or bound: forget it."""
        key = pod if isinstance(pod, str) else pod_key(pod)
        entry = self._entries.get(key)
        if entry is None:
            return
        if entry.place == "in_flight":
            entry.deleted = True
            return
        self._remove(entry)

    def move_all_to_active_or_backoff(self, now: float, event: str = "") -> int:
        """A cluster event (`event` names it, e.g. "NodeAdd") may make unschedulable pods fit:
        move them all out. Returns how many moved."""
        self._move_cycle = self._cycle
        entries = list(self._unschedulable.values())
        for entry in entries:
            self._wake(entry, now)
        return len(entries)

    # --- the scheduling loop ---------------------------------------------------------------------

    def pop(self, now: float) -> Obj | None:
        """The next pod to schedule, or None. Moves due backoff and stale unschedulable pods to
        active first. The pod is in flight until reported back."""
        self.flush(now)
        heap = self._active
        while heap:
            _, _, token, key = heapq.heappop(heap)
            entry = self._entries.get(key)
            if entry is None or entry.place != "active" or entry.token != token:
                continue
            self._move(entry, "in_flight")
            entry.attempts += 1
            self._cycle += 1
            entry.cycle = self._cycle
            return entry.pod
        return None

    def done(self, pod: Obj | str) -> None:
        """The pod was scheduled (assumed and bound): it leaves the queue."""
        key = pod if isinstance(pod, str) else pod_key(pod)
        entry = self._entries.get(key)
        if entry is not None and entry.place == "in_flight":
            self._remove(entry)

    def add_unschedulable(self, pod: Obj, now: float) -> None:
        """No node fits the popped pod: park it until a cluster event or the 5-minute flush
        (or back it off if an event arrived while it was in flight)."""
        entry = self._returned(pod)
        if entry is None:
            return
        entry.backoff_until = now + self.backoff_duration(entry.attempts)
        if self._move_cycle >= entry.cycle:
            self._to_backoff(entry)
        else:
            self._move(entry, "unschedulable")
            entry.unschedulable_since = now
            self._unschedulable[entry.key] = entry

    def add_backoff(self, pod: Obj, now: float) -> None:
        """Scheduling the popped pod failed with an error (e.g. the bind call): retry after its
        backoff."""
        entry = self._returned(pod)
        if entry is None:
            return
        entry.backoff_until = now + self.backoff_duration(entry.attempts)
        self._to_backoff(entry)

    def flush(self, now: float) -> None:
        """Move backoff pods whose time has come, and pods unschedulable for longer than
        `max_unschedulable`, to active. `pop` calls this; a driver need not."""
        heap = self._backoff
        while heap and heap[0][0] <= now:
            _, _, token, key = heapq.heappop(heap)
            entry = self._entries.get(key)
            if entry is not None and entry.place == "backoff" and entry.token == token:
                self._move(entry, "active")
                self._push_active(entry)
        if self._unschedulable:
            limit = now - self.max_unschedulable
            stale = []
            for entry in self._unschedulable.values():
                if entry.unschedulable_since > limit:
                    break
                stale.append(entry)
            for entry in stale:
                self._wake(entry, now)

    def next_deadline(self) -> float | None:
        """The earliest time at which a waiting pod becomes ready by itself (backoff over, or
        5 minutes unschedulable), or None. Pods already active are ready now: check
        `statistics().active` first."""
        times: list[float] = []
        heap = self._backoff
        while heap:
            _, _, token, key = heap[0]
            entry = self._entries.get(key)
            if entry is not None and entry.place == "backoff" and entry.token == token:
                times.append(heap[0][0])
                break
            heapq.heappop(heap)
        for entry in self._unschedulable.values():
            times.append(entry.unschedulable_since + self.max_unschedulable)
            break
        return min(times) if times else None

    def backoff_duration(self, attempts: int) -> float:
        """`initial_backoff` doubled per attempt after the first, capped at `max_backoff`."""
        duration = self.initial_backoff
        for _ in range(1, attempts):
            duration *= 2
            if duration >= self.max_backoff:
                return self.max_backoff
        return min(duration, self.max_backoff)

    def attempts(self, pod: Obj | str) -> int:
        """How many times the pod has been popped since it entered the queue (0 if unknown)."""
        entry = self._entries.get(pod if isinstance(pod, str) else pod_key(pod))
        return 0 if entry is None else entry.attempts

    def statistics(self) -> QueueStatistics:
        c = self._counts
        return QueueStatistics(c["active"], c["backoff"], c["unschedulable"], c["in_flight"])

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, pod: object) -> bool:
        if isinstance(pod, str):
            return pod in self._entries
        if isinstance(pod, Mapping):
            return pod_key(pod) in self._entries
        return False

    # --- internals -------------------------------------------------------------------------------

    def _returned(self, pod: Obj) -> _Entry | None:
        key = pod_key(pod)
        entry = self._entries.get(key)
        if entry is None:
            # Not popped from this queue (e.g. the driver restarted it): start tracking it.
            entry = _Entry(key=key, pod=pod, priority=_priority(pod), place="in_flight")
            entry.attempts = 1
            entry.cycle = self._cycle
            self._entries[key] = entry
            self._counts["in_flight"] += 1
        if entry.place != "in_flight":
            return None  # reported twice, or re-added meanwhile: it is already queued
        if entry.deleted:
            self._remove(entry)
            return None
        return entry

    def _wake(self, entry: _Entry, now: float) -> None:
        del self._unschedulable[entry.key]
        if now < entry.backoff_until:
            self._move(entry, "backoff")
            self._push_backoff(entry)
        else:
            self._move(entry, "active")
            self._push_active(entry)

    def _to_backoff(self, entry: _Entry) -> None:
        self._move(entry, "backoff")
        self._push_backoff(entry)

    def _move(self, entry: _Entry, place: Place) -> None:
        self._counts[entry.place] -= 1
        self._counts[place] += 1
        entry.place = place

    def _remove(self, entry: _Entry) -> None:
        del self._entries[entry.key]
        self._counts[entry.place] -= 1
        if entry.place == "unschedulable":
            del self._unschedulable[entry.key]
        entry.token += 1  # invalidates any heap item

    def _push_active(self, entry: _Entry) -> None:
        self._seq += 1
        entry.token += 1
        heapq.heappush(self._active, (-entry.priority, self._seq, entry.token, entry.key))

    def _push_backoff(self, entry: _Entry) -> None:
        self._seq += 1
        entry.token += 1
        heapq.heappush(self._backoff, (entry.backoff_until, self._seq, entry.token, entry.key))
