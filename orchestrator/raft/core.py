"""The Raft consensus core: a deterministic state machine with no I/O, clock or global randomness.

Theory of operation
-------------------
The driver feeds the core four kinds of input — `tick()` (abstract time), `step(message)` (a
message from a peer), `propose(...)` / `propose_conf_change(...)` / `read_index(...)` /
`transfer_leadership(...)` (local requests) — and repeatedly takes a `Ready` batch of output:

    rd = core.ready()
    persist rd.snapshot, rd.entries and rd.hard_state   (one durable transaction)
    send rd.messages                                    (only after the persist)
    apply rd.snapshot, then rd.committed entries        (to the state machine)
    core.advance(rd)

Nothing else changes the core between `ready()` and `advance()`. Randomness (the election
timeout jitter) comes from the `random.Random` passed in, so a seed replays a run exactly.

The algorithm follows the Raft paper and etcd-io/raft:
- elections with pre-vote (a partitioned node does not inflate terms) and check-quorum (a leader
  that has not heard from a quorum for an election timeout steps down; followers that heard from
  a leader within that time ignore disruptive vote requests: the "leader lease");
- fast failover: when the driver reports that the leader's process is gone (`report_peer_down`:
  its connection was closed or reset, or refused — what a kernel does for a killed process),
  a follower forgets that leader, so it no longer holds the lease for it, and campaigns (with
  pre-vote) a few ticks later instead of after a whole randomized election timeout. The voters
  campaign in turn (`down_campaign_delay`: lowest id first, two ticks apart) so that the ones
  that saw the same crash do not split the vote. A pre-vote only wins once a quorum stopped
  hearing from the leader, so a connection reset under a live leader disrupts nothing; a
  machine that vanishes without closing its connections is still found by the timeout;
- replication with batching (a `Ready` carries every proposal since the last one), pipelining
  (up to `max_inflight` appends in flight per follower) and fast back-off on mismatch (the
  follower's hint skips a whole divergent term per round trip); a new commit index goes to a
  follower that acknowledged the leader's whole log as a COMMIT message, which is not answered
  (etcd-raft sends an empty append and gets an answer that says nothing new: for a lone write
  that was a third of the messages);
- a leader only commits entries of its own term by counting replicas (§5.4.2), and appends an
  empty entry when elected so that happens promptly;
- snapshots: the driver compacts the log after saving a state-machine snapshot; followers behind
  the compaction point are sent a SNAP message whose data the driver fills in;
- single-server membership changes (add learner, add/promote voter, remove) as log entries, one
  at a time, taking effect when applied; learners replicate but never vote or count;
- ReadIndex: a read is linearizable once the state machine has applied the commit index the
  leader had when a quorum confirmed it was still leader (followers forward to the leader);
- leadership transfer: the leader brings the target up to date and tells it to campaign now.

Layout: the core is one class built in three layers, each calling only itself and those below:
`core_state.CoreState` (fields, observation, role transitions, membership bookkeeping) <-
`core_replication.ReplicationCore` (sending and receiving the log, commit, ReadIndex) <-
`RaftCore` here (time, elections, message dispatch, local requests, membership changes taking
effect, Ready/Advance).

Invariants (checked by the simulation): at most one leader per term; logs that share an
(index, term) are identical up to it; committed entries are never lost or changed.
"""

from __future__ import annotations

from collections.abc import Iterable

from orchestrator.raft.core_replication import ReplicationCore
from orchestrator.raft.progress import ProgressState
from orchestrator.raft.types import (
    NONE,
    ConfChange,
    ConfChangeType,
    Entry,
    EntryType,
    HardState,
    InvalidChange,
    LeaderBusy,
    Message,
    MsgType,
    NodeId,
    ProposalDropped,
    ReadState,
    Ready,
    Role,
    SnapshotMeta,
)

TRANSFER_CONTEXT = b"transfer"  # marks a campaign caused by leadership transfer
# After the leader is reported down, the remaining voters campaign in id order, the first after
# DOWN_FIRST_TICKS (at least one whole tick: the others see the same closed connections
# meanwhile and stop holding the lease), each next one DOWN_STEP_TICKS later: more than a
# whole pre-vote + vote round apart, so they do not split the vote.
DOWN_FIRST_TICKS = 2
DOWN_STEP_TICKS = 2
FORWARD_DEDUP_WINDOW = 8192  # forwarded proposals remembered per leadership, to drop duplicates
FORWARD_DEDUP_BYTES = 16 * 1024 * 1024  # ... and at most this much of their data
# The messages only a leader sends to its followers (a sign of a live leader in its term).
_FROM_LEADER = (MsgType.APP, MsgType.HEARTBEAT, MsgType.SNAP, MsgType.COMMIT)


def bootstrap(voters: Iterable[NodeId]) -> tuple[HardState, list[Entry]]:
    """The persisted state every founding member of a new cluster starts from: one committed
    ADD_VOTER entry per founder, so a member that joins later learns the founders by
    replicating the log like any other entry."""
    entries = [
        Entry(1, i, EntryType.CONF_CHANGE, ConfChange(ConfChangeType.ADD_VOTER, nid).encode())
        for i, nid in enumerate(sorted(voters), start=1)
    ]
    return HardState(term=1, vote=NONE, commit=len(entries)), entries


class RaftCore(ReplicationCore):
    """The Raft state machine; the layers below it (`ReplicationCore`, `CoreState`) hold its
    fields, replication and ReadIndex. Its public methods are the whole interface."""

    def _become_leader(self) -> None:
        self._reset(self.term)
        self.role = Role.LEADER
        self.lead = self.id
        for pr in self.prs.values():
            pr.recent_active = True
        # An empty entry of our term lets us commit (and serve reads) promptly, and no
        # membership change may be proposed until everything before it is applied.
        self._append([Entry(self.term, self.log.last_index() + 1)])
        self.pending_conf_index = self.log.last_index()
        self.notes.append(f"became leader at term {self.term}")

    # ------------------------------------------------------------------ time
    def tick(self) -> None:
        if self.role is Role.LEADER:
            self._tick_heartbeat()
        else:
            self.election_elapsed += 1
            if self.promotable() and (
                self.election_elapsed >= self.randomized_timeout
                or 0 < self.down_campaign_at <= self.election_elapsed
            ):
                self.election_elapsed = 0
                self._campaign(pre=self.cfg.pre_vote, transfer=False)

    def _tick_heartbeat(self) -> None:
        self.heartbeat_elapsed += 1
        self.election_elapsed += 1
        if self.election_elapsed >= self.cfg.election_tick:
            self.election_elapsed = 0
            if self.leaving:
                self.notes.append("removed from the voters: stepping down")
                self.become_follower(self.term, NONE)
                return
            if self.cfg.check_quorum:
                if not self._quorum_active():
                    self.notes.append(f"stepping down at term {self.term}: quorum not heard from")
                    self.become_follower(self.term, NONE)
                    return
                for pid, pr in self.prs.items():
                    pr.recent_active = pid == self.id
            if self.lead_transferee != NONE:
                self.notes.append(f"leadership transfer to {self.lead_transferee} timed out")
                self.lead_transferee = NONE
        if self.heartbeat_elapsed >= self.cfg.heartbeat_tick:
            self.heartbeat_elapsed = 0
            self._bcast_heartbeat(self._last_read_context())

    def _quorum_active(self) -> bool:
        active = sum(
            1
            for pid in self.conf.voters
            if pid == self.id or (pid in self.prs and self.prs[pid].recent_active)
        )
        return active * 2 > len(self.conf.voters)

    # ------------------------------------------------------------------ elections
    def _campaign(self, *, pre: bool, transfer: bool) -> None:
        if pre:
            self._become_pre_candidate()
            kind, term = MsgType.PRE_VOTE, self.term + 1
        else:
            self._become_candidate()
            kind, term = MsgType.VOTE, self.term
        if self._poll(self.id, True) == "won":
            # A single-voter cluster wins at once.
            if pre:
                self._campaign(pre=False, transfer=transfer)
            else:
                self._become_leader()
            return
        ctx = TRANSFER_CONTEXT if transfer else b""
        for pid in sorted(self.conf.voters):
            if pid != self.id:
                self._send(
                    Message(
                        kind,
                        pid,
                        self.id,
                        term,
                        log_term=self.log.last_term(),
                        index=self.log.last_index(),
                        context=ctx,
                    )
                )

    def _poll(self, pid: NodeId, granted: bool) -> str:
        if pid in self.conf.voters:
            self.votes.setdefault(pid, granted)
        yes = sum(1 for v in self.votes.values() if v)
        no = len(self.votes) - yes
        quorum = len(self.conf.voters) // 2 + 1
        if yes >= quorum:
            return "won"
        if no >= quorum:
            return "lost"
        return "pending"

    # ------------------------------------------------------------------ messages in
    def step(self, m: Message) -> None:
        if not self._accept_sender(m):
            return
        if m.term > self.term:
            if m.type in (MsgType.VOTE, MsgType.PRE_VOTE):
                forced = m.context == TRANSFER_CONTEXT
                in_lease = (
                    self.cfg.check_quorum
                    and self.lead != NONE
                    and self.election_elapsed < self.cfg.election_tick
                )
                if in_lease and not forced:
                    return  # we heard from a live leader recently: ignore the disruption
            if m.type is MsgType.PRE_VOTE or (m.type is MsgType.PRE_VOTE_RESP and not m.reject):
                pass  # pre-votes never change our term
            elif m.type in _FROM_LEADER:
                self.become_follower(m.term, m.frm)
            else:
                self.become_follower(m.term, NONE)
        elif m.term < self.term:
            if m.type in (MsgType.APP, MsgType.HEARTBEAT, MsgType.COMMIT):
                # A deposed leader (e.g. after a partition heals) learns our term from this.
                self._send(Message(MsgType.APP_RESP, m.frm, self.id, self.term))
            elif m.type is MsgType.PRE_VOTE:
                self._send(Message(MsgType.PRE_VOTE_RESP, m.frm, self.id, self.term, reject=True))
            return

        if m.type in (MsgType.VOTE, MsgType.PRE_VOTE):
            self._handle_vote_request(m)
        elif self.role is Role.LEADER:
            self._step_leader(m)
        elif self.role is Role.FOLLOWER:
            self._step_follower(m)
        else:
            self._step_candidate(m)

    def _accept_sender(self, m: Message) -> bool:
        members = self.conf.members()
        if m.frm == self.id or m.to != self.id:
            self.notes.append(f"dropped {m.type.name} from {m.frm} to {m.to}: misaddressed")
            return False
        # A server that is joining knows no members yet: it learns them from the leader (and
        # may be asked for its vote, if it was added as a voter straight away).
        if m.frm in members or not members:
            return True
        # A member added by a change we hold but have not seen committed (we were cut off)
        # may be campaigning legitimately: refusing it could leave the cluster leaderless.
        if m.type in (MsgType.VOTE, MsgType.PRE_VOTE) and m.frm in self._pending_members():
            return True
        # A leader elected after changes we have not caught up with (we were down while it
        # was added) must be able to reach us, or we never catch up. Accept it when we have
        # not heard from a leader we know for an election timeout: a healthy follower thus
        # ignores an outsider's claims (and its high term).
        heard_recently = self.lead != NONE and self.election_elapsed < self.cfg.election_tick
        if (
            m.type in _FROM_LEADER
            and m.term >= self.term
            and (m.frm == self.lead or not heard_recently)
        ):
            return True
        # Anything else from a non-member is dropped. (Peers authenticate each other in a later
        # layer; until then an outsider can at most confuse a server that has no live leader.)
        self.notes.append(f"dropped {m.type.name} from non-member {m.frm}")
        return False

    def _pending_members(self) -> set[NodeId]:
        log = self.log
        return {
            ConfChange.decode(e.data).node_id
            for e in log.entries[log.committed - log.offset :]
            if e.type is EntryType.CONF_CHANGE
        }

    def _handle_vote_request(self, m: Message) -> None:
        pre = m.type is MsgType.PRE_VOTE
        can_vote = (
            self.vote == m.frm
            or (self.vote == NONE and self.lead == NONE)
            or (pre and m.term > self.term)
        )
        resp = MsgType.PRE_VOTE_RESP if pre else MsgType.VOTE_RESP
        if can_vote and self.log.is_up_to_date(m.index, m.log_term):
            # A pre-vote answer carries the candidate's future term so it is not discarded.
            self._send(Message(resp, m.frm, self.id, m.term))
            if not pre:
                self.election_elapsed = 0
                self.down_campaign_at = 0
                self.vote = m.frm
        else:
            self._send(Message(resp, m.frm, self.id, self.term, reject=True))

    def _step_candidate(self, m: Message) -> None:
        t = m.type
        if t in _FROM_LEADER:
            self.become_follower(m.term, m.frm)
            self._step_follower(m)
        elif (t is MsgType.PRE_VOTE_RESP and self.role is Role.PRE_CANDIDATE) or (
            t is MsgType.VOTE_RESP and self.role is Role.CANDIDATE
        ):
            result = self._poll(m.frm, not m.reject)
            if result == "won":
                if self.role is Role.PRE_CANDIDATE:
                    self._campaign(pre=False, transfer=False)
                else:
                    self._become_leader()
                    self._bcast_append()
            elif result == "lost":
                self.become_follower(self.term, NONE)

    def _step_follower(self, m: Message) -> None:
        t = m.type
        if t is MsgType.APP:
            self.election_elapsed = 0
            self.down_campaign_at = 0
            self.lead = m.frm
            self._handle_append(m)
        elif t is MsgType.COMMIT:
            # The leader knows we hold its log up to (at least) this commit index: only commit.
            self.election_elapsed = 0
            self.down_campaign_at = 0
            self.lead = m.frm
            self.log.commit_to(min(m.commit, self.log.last_index()))
        elif t is MsgType.HEARTBEAT:
            self.election_elapsed = 0
            self.down_campaign_at = 0
            self.lead = m.frm
            self.log.commit_to(min(m.commit, self.log.last_index()))
            self._send(
                Message(MsgType.HEARTBEAT_RESP, m.frm, self.id, self.term, context=m.context)
            )
        elif t is MsgType.SNAP:
            self.election_elapsed = 0
            self.down_campaign_at = 0
            self.lead = m.frm
            self._handle_snapshot(m)
        elif t is MsgType.TIMEOUT_NOW:
            if self.promotable():
                self.notes.append(f"campaigning at once: leadership transfer from {m.frm}")
                self._campaign(pre=False, transfer=True)
        elif t is MsgType.READ_INDEX_RESP:
            self.read_states.append(ReadState(m.index, m.context))

    def _step_leader(self, m: Message) -> None:
        pr = self.prs.get(m.frm)
        t = m.type
        if t is MsgType.READ_INDEX:
            self._read_index(m.context, m.frm)
            return
        if t is MsgType.PROP:
            if self.lead_transferee == NONE and not self.leaving and m.frm in self.conf.members():
                # The network may deliver a forward twice; appending it twice would apply the
                # command twice. Forwarded data is unique (callers put a request id in it).
                fresh = [
                    e.data
                    for e in m.entries
                    if e.type is EntryType.NORMAL and e.data not in self.forwarded
                ]
                for d in fresh:
                    if d not in self.forwarded:
                        self.forwarded[d] = None
                        self.forwarded_bytes += len(d)
                while (
                    len(self.forwarded) > FORWARD_DEDUP_WINDOW
                    or self.forwarded_bytes > FORWARD_DEDUP_BYTES
                ) and self.forwarded:
                    oldest = next(iter(self.forwarded))
                    del self.forwarded[oldest]
                    self.forwarded_bytes -= len(oldest)
                if fresh:
                    self.propose(fresh)
            return
        if pr is None:
            return
        if t is MsgType.APP_RESP:
            pr.recent_active = True
            if m.reject:
                hint = m.reject_hint
                if m.log_term > 0:
                    hint = self.log.find_conflict_by_term(hint, m.log_term)
                if pr.maybe_decrease_to(m.index, hint):
                    if pr.state is ProgressState.REPLICATE:
                        pr.become_probe()
                    self._send_append(m.frm)
                return
            was_paused = pr.is_paused()
            if pr.maybe_update(m.index):
                if pr.state is ProgressState.PROBE:
                    pr.become_replicate()
                elif pr.state is ProgressState.SNAPSHOT and pr.match >= pr.pending_snapshot:
                    pr.become_probe()
                    pr.become_replicate()
                if self._maybe_commit():
                    self._bcast_append()
                elif was_paused:
                    self._send_append(m.frm)
                while self._send_append(m.frm, allow_empty=False):
                    pass
                if m.frm == self.lead_transferee and pr.match == self.log.last_index():
                    self._send(Message(MsgType.TIMEOUT_NOW, m.frm, self.id, self.term))
        elif t is MsgType.HEARTBEAT_RESP:
            pr.recent_active = True
            pr.probe_sent = False
            if pr.state is ProgressState.REPLICATE and pr.is_paused():
                pr.inflight.popleft()
            if pr.match < self.log.last_index():
                self._send_append(m.frm)
            if m.context:
                self._ack_read(m.context, m.frm)

    # ------------------------------------------------------------------ local requests
    def propose(self, data: list[bytes]) -> tuple[int, int]:
        """Append normal entries (one per item) as leader. Returns (first index, term); the
        entries are committed when they are applied with that term at those indexes."""
        self._check_can_propose()
        first = self.log.last_index() + 1
        if not data:
            return first, self.term
        self._append([Entry(self.term, first + i, EntryType.NORMAL, d) for i, d in enumerate(data)])
        self._bcast_append()
        return first, self.term

    def forward(self, data: list[bytes]) -> None:
        """As a follower, hand proposals to the leader (fire and forget: the caller recognises
        its entries when they are applied, e.g. by an id inside the data, or times out)."""
        if self.role is Role.LEADER:
            self.propose(data)
            return
        if self.lead == NONE:
            raise ProposalDropped("no leader known", NONE)
        entries = [Entry(0, 0, EntryType.NORMAL, d) for d in data]
        self._send(Message(MsgType.PROP, self.lead, self.id, self.term, entries=entries))

    def propose_conf_change(self, cc: ConfChange) -> tuple[int, int]:
        self._check_can_propose()
        if self.pending_conf_index > self.log.applied:
            raise LeaderBusy("another membership change is still pending; retry", self.lead)
        voters = self.conf.voters
        if cc.type is ConfChangeType.REMOVE:
            if cc.node_id not in self.conf.members():
                raise InvalidChange(f"node {cc.node_id} is not a member", self.lead)
            if voters == {cc.node_id}:
                raise InvalidChange("cannot remove the last voter", self.lead)
        elif cc.node_id in voters:  # adding or promoting an existing voter
            raise InvalidChange(f"node {cc.node_id} is already a voter", self.lead)
        index = self.log.last_index() + 1
        self._append([Entry(self.term, index, EntryType.CONF_CHANGE, cc.encode())])
        self.pending_conf_index = index
        self._bcast_append()
        return index, self.term

    def _check_can_propose(self) -> None:
        if self.role is not Role.LEADER:
            raise ProposalDropped("not the leader", self.lead)
        if self.lead_transferee != NONE or self.leaving:
            raise LeaderBusy("leadership transfer in progress", self.lead)

    def transfer_leadership(self, target: NodeId) -> None:
        if self.role is not Role.LEADER:
            raise ProposalDropped("not the leader", self.lead)
        if target == self.id:
            return
        if target not in self.conf.voters:
            raise InvalidChange(f"node {target} is not a voter", self.lead)
        self.lead_transferee = target
        self.election_elapsed = 0  # the transfer must finish within an election timeout
        if self.prs[target].match == self.log.last_index():
            self._send(Message(MsgType.TIMEOUT_NOW, target, self.id, self.term))
        else:
            self._send_append(target)

    def campaign(self) -> None:
        """Start an election now (used by tests and for a fast start of a lone server)."""
        if self.promotable() and self.role is not Role.LEADER:
            self._campaign(pre=self.cfg.pre_vote, transfer=False)

    def report_peer_down(self, peer: NodeId) -> None:
        """The driver saw `peer`'s process go away: a connection with it was closed or reset
        by its side, or refused (a killed process's sockets are closed by its kernel at once; a
        machine that loses power closes nothing, and is found out by the election timeout).

        Only news about our leader matters, to a follower: it forgets the leader — so it no
        longer holds the lease for it and answers other candidates' pre-votes, and requests
        fail at once instead of being forwarded to nobody — and, if it may vote, campaigns
        (pre-vote) `down_campaign_delay` ticks from now instead of after a whole randomized
        election timeout. If the leader is in fact alive (a connection reset on the way), it
        and every follower that still hears from it turn that pre-vote down, and its next
        message makes us follow it again: nothing is disrupted. Without pre-vote and
        check-quorum (no lease to protect the leader) we only forget the leader."""
        if self.role is not Role.FOLLOWER or peer == NONE or peer != self.lead:
            return
        self.lead = NONE
        self.notes.append(f"leader {peer} is down (its connection closed)")
        if self.promotable() and self.cfg.pre_vote and self.cfg.check_quorum:
            self.down_campaign_at = self.election_elapsed + self.down_campaign_delay(peer)

    def down_campaign_delay(self, leader: NodeId) -> int:
        """Ticks to wait before campaigning after `leader` was reported down: the voters other
        than the leader take turns in id order (see DOWN_FIRST_TICKS), so that those that saw
        the same crash do not all campaign at once and split the vote."""
        others = sorted(v for v in self.conf.voters if v != leader)
        rank = others.index(self.id) if self.id in others else len(others)
        return DOWN_FIRST_TICKS + DOWN_STEP_TICKS * rank

    def report_snapshot(self, to: NodeId, ok: bool) -> None:
        """The driver finished (or failed) sending a snapshot to `to`."""
        pr = self.prs.get(to)
        if self.role is not Role.LEADER or pr is None or pr.state is not ProgressState.SNAPSHOT:
            return
        if not ok:
            pr.pending_snapshot = 0
        pr.become_probe()
        pr.probe_sent = True  # wait for the follower's answer (or a heartbeat) before probing

    def compact(self, snapshot: SnapshotMeta, upto: int) -> None:
        """The driver saved `snapshot` of the state machine; forget log entries up to `upto`."""
        self.log.compact(snapshot, upto)

    def _after_conf_change(self) -> None:
        if self.role is not Role.LEADER:
            return
        if not self.promotable():
            self._hand_over()
            return
        if self.lead_transferee != NONE and self.lead_transferee not in self.conf.voters:
            self.lead_transferee = NONE
        if self._maybe_commit():
            self._bcast_append()
        for pid in self.prs:
            if pid != self.id and self.prs[pid].state is ProgressState.PROBE:
                self._send_append(pid)

    def _hand_over(self) -> None:
        """We were removed while leading. The others may not know yet that the removal is
        committed (in a cluster of two, the survivor still counts on our vote), so tell them the
        commit index and ask the most up-to-date voter to campaign at once; step down after an
        election timeout whatever happens."""
        self.leaving = True
        self.election_elapsed = 0
        others = [v for v in self.conf.voters if v in self.prs]
        self.notes.append("removed from the voters: handing over leadership")
        if not others:
            return
        self._bcast_append()
        target = max(others, key=lambda v: (self.prs[v].match, -v))
        self.lead_transferee = target
        if self.prs[target].match == self.log.last_index():
            self._send(Message(MsgType.TIMEOUT_NOW, target, self.id, self.term))

    # ------------------------------------------------------------------ ready / advance
    def has_ready(self) -> bool:
        log = self.log
        return bool(
            self.msgs
            or self.read_states
            or self.notes
            or log.stable < log.last_index()
            or log.pending_snapshot is not None
            or log.committed > log.applied
            or self.hard_state() != self.prev_hs
            or self.soft_state() != self.prev_ss
        )

    def ready(self) -> Ready:
        log = self.log
        hs = self.hard_state()
        ss = self.soft_state()
        rd = Ready(
            hard_state=hs if hs != self.prev_hs else None,
            entries=log.unstable(),
            snapshot=log.pending_snapshot,
            committed=log.next_committed(self.cfg.max_apply_entries),
            messages=self._superseded_commits_dropped() if self.commits_queued else self.msgs,
            read_states=self.read_states,
            soft_state=ss if ss != self.prev_ss else None,
            notes=self.notes,
        )
        self.msgs, self.read_states, self.notes = [], [], []
        self.commits_queued = False
        return rd

    def _superseded_commits_dropped(self) -> list[Message]:
        """The messages without each COMMIT that a later APP or COMMIT to the same follower
        makes redundant (it carries the same or a later commit index): a write committed and
        the next proposed in one turn send the follower one message, not two."""
        msgs = self.msgs
        later: set[NodeId] = set()
        kept: list[Message] = []
        for m in reversed(msgs):
            if m.type is MsgType.COMMIT:
                if m.to in later:
                    continue
                later.add(m.to)
            elif m.type is MsgType.APP:
                later.add(m.to)
            kept.append(m)
        kept.reverse()
        return kept

    def advance(self, rd: Ready) -> None:
        log = self.log
        if rd.hard_state is not None:
            self.prev_hs = rd.hard_state
        if rd.soft_state is not None:
            self.prev_ss = rd.soft_state
        if rd.snapshot is not None:
            log.pending_snapshot = None
            log.applied = max(log.applied, rd.snapshot.meta.index)
        if rd.entries:
            last = rd.entries[-1]
            if log.term(last.index) == last.term:
                log.stable = max(log.stable, last.index)
        conf_changed = False
        for e in rd.committed:
            if e.type is EntryType.CONF_CHANGE:
                self._apply_conf_change(ConfChange.decode(e.data))
                conf_changed = True
        if rd.committed:
            log.applied = rd.committed[-1].index
        if conf_changed:
            self._after_conf_change()
