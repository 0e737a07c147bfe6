"""`Status`: a snapshot of one Raft server's state for people and tools (as etcd-io/raft's).

The core fills in what it knows (`RaftCore.status()`: term, leader, indexes, membership and,
on a leader, each peer's progress); the driver adds what only it knows (`RaftNode.status()`:
peer addresses, the last snapshot, the Raft database's size, leader changes). Frozen: a
status is a value taken at one moment, safe to hand to any task. `to_wire()` is the form the
client port's `status` operation sends (and `orchestrator status` prints).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.raft.progress import ProgressState
from orchestrator.raft.types import NodeId, Role


@dataclass(frozen=True, slots=True)
class PeerProgress:
    """The leader's view of one peer's log (etcd-io/raft's `tracker.Progress`, read only)."""

    match: int  # the highest index known replicated on the peer
    next: int  # the next index the leader sends it
    state: ProgressState
    learner: bool

    def to_wire(self) -> dict[str, Any]:
        return {
            "match": self.match,
            "next": self.next,
            "state": self.state.name.lower(),
            "learner": self.learner,
        }


@dataclass(frozen=True, slots=True)
class Status:
    id: NodeId
    term: int
    role: Role
    lead: NodeId  # NONE (0) when unknown
    commit: int
    applied: int
    last_index: int
    first_index: int
    voters: tuple[NodeId, ...]  # sorted
    learners: tuple[NodeId, ...]  # sorted
    # On a leader, every member's progress (itself included); empty elsewhere.
    progress: Mapping[NodeId, PeerProgress] = field(default_factory=dict)
    # Filled in by the driver (`RaftNode.status()`):
    peers: Mapping[NodeId, str] = field(default_factory=dict)  # node id -> "host:port"
    snapshot_index: int = 0
    db_bytes: int = 0  # the Raft database's size at the last snapshot
    leader_changes: int = 0

    @property
    def is_leader(self) -> bool:
        return self.role is Role.LEADER

    def to_wire(self) -> dict[str, Any]:
        """Plain data (msgpack, JSON): the client port's `status` answer."""
        return {
            "id": self.id,
            "term": self.term,
            "role": self.role.name.lower(),
            "leader": self.lead,
            "commit": self.commit,
            "applied": self.applied,
            "last_index": self.last_index,
            "first_index": self.first_index,
            "voters": list(self.voters),
            "learners": list(self.learners),
            "progress": {pid: p.to_wire() for pid, p in self.progress.items()},
            "peers": dict(self.peers),
            "db_bytes": self.db_bytes,
            "snapshot_index": self.snapshot_index,
            "leader_changes": self.leader_changes,
        }
