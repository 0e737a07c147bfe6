"""The Raft core's state: its configuration, fields, observation, role transitions and
membership bookkeeping (the bottom layer of `RaftCore`, see `orchestrator.raft.core`).

`RaftCore` is built in three layers, each calling only itself and the layers below:
`CoreState` (this module: the fields and the transitions every other part uses) <-
`ReplicationCore` (`core_replication`: sending the log, committing, ReadIndex) <- `RaftCore`
(`core`: time, elections, message handling, local requests, Ready/Advance). Only the driver
(`RaftNode`) touches a core; nothing here does I/O or reads a clock.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass

from orchestrator.raft.progress import Progress
from orchestrator.raft.raftlog import RaftLog
from orchestrator.raft.status import PeerProgress, Status
from orchestrator.raft.types import (
    NONE,
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Message,
    NodeId,
    ReadState,
    Role,
    SnapshotMeta,
    SoftState,
)

_EMPTY_HARD_STATE = HardState()
_EMPTY_SNAPSHOT = SnapshotMeta()


@dataclass(frozen=True, slots=True)
class RaftConfig:
    id: NodeId
    election_tick: int = 10
    heartbeat_tick: int = 1
    pre_vote: bool = True
    check_quorum: bool = True
    max_inflight: int = 64
    max_msg_bytes: int = 1 << 20
    max_apply_entries: int = 4096


@dataclass(slots=True)
class ReadRequest:
    index: int
    frm: NodeId  # NONE: a local request; else a follower to answer with READ_INDEX_RESP
    acks: set[NodeId]


class CoreState:
    def __init__(
        self,
        config: RaftConfig,
        rng: random.Random,
        *,
        hard_state: HardState = _EMPTY_HARD_STATE,
        snapshot: SnapshotMeta = _EMPTY_SNAPSHOT,
        entries: Iterable[Entry] = (),
        applied: int = 0,
    ) -> None:
        """Start (or restart from persisted state) a node.

        `snapshot.conf` is the membership at the snapshot point; committed conf-change entries
        after it are replayed here. A brand-new cluster's founders start from `bootstrap()`; a
        node that joins an existing cluster starts empty and learns the membership from the
        leader. `applied` is the state machine's applied index: committed entries after it are
        handed out again, the ones before it are not."""
        self.cfg = config
        self.id = config.id
        self.rng = rng
        self.log = RaftLog(snapshot, list(entries), hard_state.commit)
        self.term = hard_state.term
        self.vote = hard_state.vote
        self.lead: NodeId = NONE
        self.role = Role.FOLLOWER
        self.conf = snapshot.conf
        self.prs: dict[NodeId, Progress] = {}
        self.votes: dict[NodeId, bool] = {}
        self.msgs: list[Message] = []
        self.commits_queued = False  # msgs holds a COMMIT (ready() drops superseded ones)
        self.read_states: list[ReadState] = []
        self.notes: list[str] = []
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.randomized_timeout = 0
        # > 0: campaign when election_elapsed reaches it (the leader was reported down)
        self.down_campaign_at = 0
        self.lead_transferee: NodeId = NONE
        self.leaving = False
        self.forwarded: dict[bytes, None] = {}  # recent forwarded data, oldest first
        self.forwarded_bytes = 0  # the size of its keys
        self.pending_conf_index = 0
        self.reads: dict[bytes, ReadRequest] = {}  # insertion order = request order
        self.pending_reads: list[tuple[bytes, NodeId]] = []  # waiting for a commit in our term
        # Membership as of the commit index: conf changes are effective when committed entries
        # are applied; on restart, replay the ones between the snapshot and the commit index.
        for e in self.log.entries:
            if e.index > self.log.committed:
                break
            if e.type is EntryType.CONF_CHANGE:
                self._apply_conf_change(ConfChange.decode(e.data))
        self.log.applied = max(self.log.offset, min(applied, self.log.committed))
        self.prev_hs = HardState(self.term, self.vote, self.log.committed)
        self.prev_ss = SoftState(NONE, Role.FOLLOWER, self.term)
        self._reset_prs()
        self.become_follower(self.term, NONE)

    # ------------------------------------------------------------------ observation
    def soft_state(self) -> SoftState:
        return SoftState(self.lead, self.role, self.term)

    def hard_state(self) -> HardState:
        return HardState(self.term, self.vote, self.log.committed)

    def promotable(self) -> bool:
        return self.id in self.conf.voters

    def status(self) -> Status:
        return Status(
            id=self.id,
            term=self.term,
            role=self.role,
            lead=self.lead,
            commit=self.log.committed,
            applied=self.log.applied,
            last_index=self.log.last_index(),
            first_index=self.log.first_index(),
            voters=tuple(sorted(self.conf.voters)),
            learners=tuple(sorted(self.conf.learners)),
            progress={
                pid: PeerProgress(p.match, p.next, p.state, p.is_learner)
                for pid, p in sorted(self.prs.items())
            }
            if self.role is Role.LEADER
            else {},
        )

    # ------------------------------------------------------------------ role transitions
    def _reset(self, term: int) -> None:
        if term != self.term:
            self.term = term
            self.vote = NONE
        self.lead = NONE
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.down_campaign_at = 0
        self.randomized_timeout = self.cfg.election_tick + self.rng.randrange(
            self.cfg.election_tick
        )
        self.votes = {}
        self.lead_transferee = NONE
        self.leaving = False  # a removed leader handing over (see _hand_over)
        self.forwarded = {}
        self.forwarded_bytes = 0
        self.reads.clear()
        self.pending_reads.clear()
        self._reset_prs()

    def _reset_prs(self) -> None:
        last = self.log.last_index()
        self.prs = {
            pid: Progress(last + 1, self.cfg.max_inflight, pid in self.conf.learners)
            for pid in self.conf.members()
        }
        if self.id in self.prs:
            self.prs[self.id].match = last

    def become_follower(self, term: int, lead: NodeId) -> None:
        self._reset(term)
        self.role = Role.FOLLOWER
        self.lead = lead

    def _become_pre_candidate(self) -> None:
        # Pre-vote does not change term or vote: a node that cannot win disrupts nobody.
        self.role = Role.PRE_CANDIDATE
        self.lead = NONE
        self.votes = {}
        self.down_campaign_at = 0

    def _become_candidate(self) -> None:
        self._reset(self.term + 1)
        self.vote = self.id
        self.role = Role.CANDIDATE

    # ------------------------------------------------------------------ replication out
    def _send(self, m: Message) -> None:
        self.msgs.append(m)

    # ------------------------------------------------------------------ membership
    def _apply_conf_change(self, cc: ConfChange) -> None:
        voters, learners = set(self.conf.voters), set(self.conf.learners)
        nid = cc.node_id
        if cc.type is ConfChangeType.ADD_LEARNER:
            if nid not in voters:
                learners.add(nid)
        elif cc.type is ConfChangeType.ADD_VOTER:
            learners.discard(nid)
            voters.add(nid)
        else:
            voters.discard(nid)
            learners.discard(nid)
        self.conf = ConfState(frozenset(voters), frozenset(learners))
        last = self.log.last_index()
        for pid in list(self.prs):
            if pid not in self.conf.members():
                del self.prs[pid]
        for pid in self.conf.members():
            pr = self.prs.get(pid)
            if pr is None:
                pr = self.prs[pid] = Progress(last + 1, self.cfg.max_inflight)
                pr.recent_active = True
                if pid == self.id:
                    pr.match = last
            pr.is_learner = pid in learners
