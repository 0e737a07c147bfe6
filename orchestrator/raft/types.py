"""Value types shared by the Raft core, its storage, its transport and its driver.

Everything here is an immutable value (or, for `Message` and `Ready`, a plain record that is
never mutated after it leaves the core). Nothing here does I/O.

Invariants:
- `Entry.index` is 1-based and contiguous inside a log; index 0 / term 0 is the empty log.
- A `ConfState` always has disjoint `voters` and `learners`.
- `Ready.entries` must be durable (with `Ready.hard_state`) before any of `Ready.messages` is sent;
  an entry at index i in `Ready.entries` replaces every persisted entry at index >= i.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

import msgpack

NodeId = int
NONE: NodeId = 0  # "no node": no vote cast, no leader known. Real node ids are >= 1.


class MsgType(IntEnum):
    APP = 1  # AppendEntries (also carries the leader's commit index)
    APP_RESP = 2
    VOTE = 3
    VOTE_RESP = 4
    PRE_VOTE = 5
    PRE_VOTE_RESP = 6
    HEARTBEAT = 7
    HEARTBEAT_RESP = 8
    SNAP = 9  # InstallSnapshot; the driver fills in the snapshot data before sending
    TIMEOUT_NOW = 10  # leadership transfer: "campaign now, skipping pre-vote"
    READ_INDEX = 11  # follower asks the leader for a read index (context identifies the read)
    READ_INDEX_RESP = 12
    PROP = 13  # a follower forwards proposals (entries carry only data) to the leader
    # The leader's new commit index for a follower known to hold the leader's whole log (sent
    # instead of an AppendEntries without entries). Not answered: the answer would tell the
    # leader nothing it does not know (heartbeats keep checking that the follower is alive).
    COMMIT = 14


class EntryType(IntEnum):
    NORMAL = 0
    CONF_CHANGE = 1


class ConfChangeType(IntEnum):
    ADD_LEARNER = 0
    ADD_VOTER = 1  # adds a new voter, or promotes an existing learner
    REMOVE = 2


class Role(IntEnum):
    FOLLOWER = 0
    PRE_CANDIDATE = 1
    CANDIDATE = 2
    LEADER = 3


@dataclass(frozen=True, slots=True)
class Entry:
    term: int
    index: int
    type: EntryType = EntryType.NORMAL
    data: bytes = b""


@dataclass(frozen=True, slots=True)
class ConfState:
    voters: frozenset[NodeId] = frozenset()
    learners: frozenset[NodeId] = frozenset()

    def members(self) -> frozenset[NodeId]:
        return self.voters | self.learners


@dataclass(frozen=True, slots=True)
class ConfChange:
    """One single-server membership change. `context` carries the member's peer address."""

    type: ConfChangeType
    node_id: NodeId
    context: bytes = b""

    def encode(self) -> bytes:
        return msgpack.packb([int(self.type), self.node_id, self.context])  # type: ignore[no-any-return]  # msgpack is untyped

    @classmethod
    def decode(cls, data: bytes) -> ConfChange:
        kind, node_id, context = msgpack.unpackb(data)
        return cls(ConfChangeType(kind), int(node_id), bytes(context))


@dataclass(frozen=True, slots=True)
class HardState:
    """What must survive a crash: current term, vote in that term, and the commit index."""

    term: int = 0
    vote: NodeId = NONE
    commit: int = 0


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    index: int = 0
    term: int = 0
    conf: ConfState = ConfState()


@dataclass(frozen=True, slots=True)
class Snapshot:
    meta: SnapshotMeta
    data: bytes = b""


@dataclass(slots=True)
class Message:
    type: MsgType
    to: NodeId
    frm: NodeId
    term: int
    log_term: int = 0
    index: int = 0
    entries: list[Entry] = field(default_factory=list)
    commit: int = 0
    reject: bool = False
    reject_hint: int = 0
    snapshot: Snapshot | None = None
    context: bytes = b""


@dataclass(frozen=True, slots=True)
class ReadState:
    """A linearizable read may be served once the state machine has applied `index`."""

    index: int
    context: bytes


@dataclass(frozen=True, slots=True)
class SoftState:
    """Volatile state the driver may want to observe; reported when it changes."""

    leader: NodeId
    role: Role
    term: int


@dataclass(slots=True)
class Ready:
    """A batch of work for the driver: persist, then send, then apply, then `advance(ready)`."""

    hard_state: HardState | None = None
    entries: list[Entry] = field(default_factory=list)
    snapshot: Snapshot | None = None
    committed: list[Entry] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    read_states: list[ReadState] = field(default_factory=list)
    soft_state: SoftState | None = None
    notes: list[str] = field(default_factory=list)  # things worth logging (drops, elections)

    def must_persist(self) -> bool:
        return self.hard_state is not None or bool(self.entries) or self.snapshot is not None

    def commit_only(self, saved: HardState) -> bool:
        """Does this Ready only move the commit index (no entries, no snapshot, term and vote
        as `saved`)? The drivers do not save it: the commit index is volatile in Raft; after a
        restart the stored, older one is relearnt from the leader (or recommitted by a lone
        server) and the state machine skips what it applied already."""
        hs = self.hard_state
        return (
            hs is not None
            and not self.entries
            and self.snapshot is None
            and (hs.term, hs.vote) == (saved.term, saved.vote)
        )


class ProposalDropped(Exception):
    """A proposal the core refused: not the leader, a transfer in progress, or a conf change
    while another is pending. `leader` is the best known leader (NONE if unknown)."""

    def __init__(self, reason: str, leader: NodeId = NONE) -> None:
        super().__init__(reason)
        self.reason = reason
        self.leader = leader


class LeaderBusy(ProposalDropped):
    """We are the leader but cannot take this now (a transfer or membership change is under
    way): retry shortly."""


class InvalidChange(ProposalDropped):
    """A membership change or transfer that can never succeed as asked (unknown node, ...)."""
