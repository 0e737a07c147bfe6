"""The leader's view of one follower: how far its log matches, and how to send to it.

States (as in etcd-io/raft):
- PROBE: we do not know where the follower's log ends; send one append at a time and wait for
  its answer (or a heartbeat answer) before the next.
- REPLICATE: the follower is keeping up; appends are pipelined optimistically (`next` moves
  ahead before acknowledgement) with at most `max_inflight` unacknowledged messages.
- SNAPSHOT: the follower needs a snapshot; nothing else is sent until it is acknowledged or
  reported failed.

Invariant: match < next; in REPLICATE, `inflight` holds the last index of each unacknowledged
append in increasing order.
"""

from __future__ import annotations

from collections import deque
from enum import IntEnum


class ProgressState(IntEnum):
    PROBE = 0
    REPLICATE = 1
    SNAPSHOT = 2


class Progress:
    __slots__ = (
        "inflight",
        "is_learner",
        "match",
        "max_inflight",
        "next",
        "pending_snapshot",
        "probe_sent",
        "recent_active",
        "state",
    )

    def __init__(self, next_index: int, max_inflight: int, is_learner: bool = False) -> None:
        self.match = 0
        self.next = next_index
        self.state = ProgressState.PROBE
        self.probe_sent = False
        self.pending_snapshot = 0
        self.recent_active = False
        self.inflight: deque[int] = deque()
        self.max_inflight = max_inflight
        self.is_learner = is_learner

    def __repr__(self) -> str:
        return f"Progress({self.state.name} match={self.match} next={self.next})"

    def is_paused(self) -> bool:
        if self.state is ProgressState.PROBE:
            return self.probe_sent
        if self.state is ProgressState.REPLICATE:
            return len(self.inflight) >= self.max_inflight
        return True

    def become_probe(self) -> None:
        if self.state is ProgressState.SNAPSHOT:
            self.next = max(self.match + 1, self.pending_snapshot + 1)
        else:
            self.next = self.match + 1
        self._reset(ProgressState.PROBE)

    def become_replicate(self) -> None:
        self.next = self.match + 1
        self._reset(ProgressState.REPLICATE)

    def become_snapshot(self, index: int) -> None:
        self._reset(ProgressState.SNAPSHOT)
        self.pending_snapshot = index

    def _reset(self, state: ProgressState) -> None:
        self.state = state
        self.probe_sent = False
        self.pending_snapshot = 0
        self.inflight.clear()

    def sent_entries(self, last_index: int, count: int) -> None:
        """Record that an append ending at last_index (count entries) went out."""
        if self.state is ProgressState.REPLICATE:
            if count:
                self.next = last_index + 1
                self.inflight.append(last_index)
        else:
            self.probe_sent = True

    def maybe_update(self, index: int) -> bool:
        """An acknowledgement up to index; returns whether match advanced."""
        updated = index > self.match
        if updated:
            self.match = index
            self.probe_sent = False
        self.next = max(self.next, index + 1)
        inflight = self.inflight
        while inflight and inflight[0] <= index:
            inflight.popleft()
        return updated

    def maybe_decrease_to(self, rejected: int, match_hint: int) -> bool:
        """A rejection of the append whose previous index was `rejected`; returns False when
        the rejection is stale (answers an append we have since superseded)."""
        if self.state is ProgressState.REPLICATE:
            if rejected <= self.match:
                return False
            self.next = self.match + 1
            return True
        if self.next - 1 != rejected:
            return False
        self.next = max(min(rejected, match_hint + 1), self.match + 1, 1)
        self.probe_sent = False
        return True
