"""The trio driver that runs one Raft server: core + SQLite storage + state machine + transport.

Theory of operation
-------------------
One task (`_loop`) owns the `RaftCore`; nothing else touches it. Everything that wants the core
(peer messages from the transport, client proposals and reads, ticks) appends to an inbox and
wakes the loop. Each turn the loop drains the whole inbox — all proposals that arrived become one
`propose()` call, hence one log append, one fsync and one AppendEntries per follower (group
commit); for a state machine that accepts batches they are also packed into few entries, so the
costs per entry (log row, message slot, envelope, bookkeeping) are paid once per batch — then
works through every `Ready`:

    0. install a received snapshot into the state machine (durably, before the log forgets);
    1. persist entries + hard state (+ the snapshot's metadata) in ONE SQLite transaction;
    2. send the messages (only now: votes and acknowledgements must be durable first; a
       leader's own messages are the exception, they go out before step 1 so the followers'
       fsyncs overlap its own: it counts its own log only after this Ready is persisted);
    3. apply committed entries (the state machine records its applied index in the same
       transaction), resolve the waiting proposals and reads. Steps 1 and 3 are two calls
       queued at once on one worker thread (`_persist_and_apply`): a leader applies entries
       that earlier Readies persisted first and answers their proposals while its new entries
       are persisted; everyone else persists first and sends (step 2) while it applies;
    4. `advance()`, then maybe compact the log behind a synced state machine.

Ticks are coalesced: while the loop is busy (a slow fsync), at most one tick waits, so a slow
disk delays elections instead of triggering a burst of them.

When the transport sees a peer's process go away (its connections closed or reset, or refused),
the loop reports it to the core (`report_peer_down`: a follower whose leader that was campaigns
within a few ticks instead of an election timeout), in order with the peer's messages: only
once every message the transport had received before it has been stepped, so a last heartbeat
still on its way through the inbox is not mistaken for news from a live leader.

Invariants: the core is only touched by `_loop`; an entry is applied only after it is persisted
on this server, in index order, once (the state machine skips what it applied already); a
proposal resolves only when its entry is applied (success, if the entry at its index has its
term) or overwritten (`ProposalLost`); a read barrier resolves only once the state machine has
applied the read index confirmed by a quorum. The peer address book (node id -> "host:port")
travels in conf-change contexts and in snapshots, and is persisted with the Raft log.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import struct
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import trio

from orchestrator import observability as metrics
from orchestrator.dbthread import DbThread
from orchestrator.raft.core import RaftConfig, RaftCore, bootstrap
from orchestrator.raft.membership import (
    book,
    member_context,
    pack_snapshot,
    promote_change,
    unbook,
    unpack_snapshot,
)
from orchestrator.raft.statemachine import Applied, StateMachine, pack_batch
from orchestrator.raft.status import Status
from orchestrator.raft.storage import RaftStorage
from orchestrator.raft.transport import Address, Faults, PeerTLS, PeerTransport
from orchestrator.raft.types import (
    NONE,
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    HardState,
    InvalidChange,
    LeaderBusy,
    Message,
    MsgType,
    NodeId,
    ProposalDropped,
    Ready,
    Role,
    Snapshot,
    SnapshotMeta,
)
from orchestrator.raft.waiters import BatchWaiter, Waiter, proposal_count

log = logging.getLogger("orchestrator.raft.node")


class RaftError(Exception):
    """Base of the errors a caller of RaftNode sees."""


class NotLeader(RaftError):
    """This server cannot take the request; `leader` / `leader_addr` say who can (if known)."""

    def __init__(self, reason: str, leader: NodeId, leader_addr: str | None) -> None:
        super().__init__(f"{reason} (leader: {leader_addr or 'unknown'})")
        self.leader = leader
        self.leader_addr = leader_addr


class ProposalLost(RaftError):
    """The proposal's log entry was replaced by another leader's: it was NOT committed."""


class Busy(RaftError):
    """The leader cannot take this request right now (transfer or membership change under
    way); retry shortly."""


class InvalidRequest(RaftError):
    """A membership change or transfer that cannot succeed as asked."""


class OutcomeUnknown(RaftError):
    """The proposal may or may not have been committed (e.g. this server caught up by snapshot)."""


class ReadAborted(RaftError):
    """Leadership changed before the read point was confirmed; retry."""


class Deposed(RaftError):
    """A fenced proposal (`submit(..., fence_term=T)`) found this server no longer the leader
    of term T: it was neither appended nor forwarded. Not retryable in term T."""


def parse_addr(text: str) -> Address:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"address {text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


@dataclass
class NodeConfig:
    node_id: NodeId
    data_dir: Path
    peer_listen: str  # HOST:PORT this server listens on for peers (port 0 = any)
    advertise: str | None = None  # HOST:PORT peers use to reach us (default: peer_listen)
    founders: dict[NodeId, str] = field(default_factory=dict)  # a new cluster's voters
    tick_interval: float = 0.1
    election_tick: int = 10
    heartbeat_tick: int = 1
    snapshot_every: int = 10_000  # applied entries between snapshots
    keep_tail: int = 5_000  # entries kept after a snapshot for slow followers
    # The same two bounds in bytes of entry data: batch entries can be 256 KiB each, so counting
    # entries alone would let the log (kept in memory too) grow to gigabytes.
    snapshot_every_bytes: int = 32 * 1024 * 1024
    keep_tail_bytes: int = 16 * 1024 * 1024
    max_inflight: int = 4  # appends in flight per follower; fewer, bigger batches cost less CPU
    seed: int | None = None
    faults: Faults | None = None
    # Mutual TLS on the peer port (`transport.PeerTLS`); every server sets it. None: plain TCP,
    # for in-process tests and benchmarks only.
    peer_tls: PeerTLS | None = None


_ENVELOPE = struct.Struct("!QQ")  # origin node id, request id


# Payload bytes per batch entry: a few hundred commands of 1 KiB, well under the 1 MiB a message
# carries, so one batch never holds up a follower's catch-up for long.
_BATCH_BYTES = 256 * 1024


class RaftNode:
    """One Raft server. Start with `await nursery.start(node.run)`.

    Observers are given at construction and called on the trio thread, from the loop:
    `on_apply(events)` after each applied batch, with the events the state machine returned
    for it (`statemachine.Applied`; their type is the state machine's); `on_snapshot()` after
    a received snapshot replaced the state machine (no events: an observer catches up from the
    state machine itself). An observer must not block; an exception it raises is logged, not
    propagated."""

    def __init__(
        self,
        cfg: NodeConfig,
        state_machine: Callable[[Path], StateMachine[Any]],
        *,
        on_apply: Callable[[Sequence[Any]], None] | None = None,
        on_snapshot: Callable[[], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self._on_apply = on_apply
        self._on_snapshot = on_snapshot
        self.id = cfg.node_id
        self._sm_factory = state_machine
        self._rng = random.Random(cfg.seed)
        self._raft_db = DbThread()
        self._sm_db = DbThread()
        self.storage: RaftStorage
        self.sm: StateMachine[Any]
        self.core: RaftCore
        self.transport: PeerTransport
        self.peers: dict[NodeId, str] = {}
        self._snapshot = Snapshot(SnapshotMeta())
        self._wake = trio.Event()
        self._inbox: list[Message] = []
        self._requests: list[tuple[str, Any, Waiter]] = []
        self._tick_pending = False
        # Peers the transport saw go away, each with the count of messages it had received by
        # then; reported to the core once that many have been stepped (`_step_inbox`).
        self._peers_down: deque[tuple[NodeId, int]] = deque()
        self._stepped = 0  # messages taken from the transport and stepped into the core
        # Normal proposals carry an envelope (origin node id, request id) so the proposer
        # recognises its entry when applied, also when a follower forwarded it to the leader.
        # Request ids start at a random point so that entries replayed after a restart can
        # never be mistaken for new requests.
        self._rid = itertools.count(int.from_bytes(os.urandom(7), "big"))
        self._waiters: dict[int, Waiter] = {}  # request id -> waiter
        self._batches = False  # pack proposals that arrive together (see statemachine.py)
        self._applied_bytes = 0  # entry data applied since the last snapshot
        self._by_index: dict[int, tuple[int, int]] = {}  # index -> (term, request id), leader only
        self._conf_waiters: dict[int, tuple[int, Waiter]] = {}  # index -> (term, waiter)
        self.auto_promote: set[NodeId] = set()  # learners to promote once caught up
        self._reads: dict[bytes, Waiter] = {}  # read context -> waiter (before ReadState)
        self._read_waits: list[tuple[int, Waiter]] = []  # (read index, waiter)
        # Read contexts must be unique across the cluster (the leader keys pending ReadIndex
        # requests by context, followers' and its own alike) and across restarts (an answer to
        # an earlier incarnation's request must not release a newer one): node id, a random
        # per-process tag, a counter.
        self._ctx_prefix = b"%d:%s:" % (self.id, os.urandom(4).hex().encode())
        self._ctx = itertools.count(1)
        self._applied_event = trio.Event()
        self._sm_applied = 0
        self._db_bytes = 0
        self.leader_changes = 0
        # (last index, proposals, perf_counter at append) of the leader's proposal batches not
        # yet applied, oldest first: raft_commit_duration_seconds.
        self._commit_clock: deque[tuple[int, int, float]] = deque()
        self._role_changed = trio.Event()  # set (and replaced) when role, leader or term change

    # ------------------------------------------------------------------ public API
    @property
    def is_leader(self) -> bool:
        return self.core.role is Role.LEADER

    @property
    def leader_id(self) -> NodeId:
        return self.core.lead

    def leader_addr(self) -> str | None:
        return self.peers.get(self.core.lead) if self.core.lead != NONE else None

    def applied_index(self) -> int:
        return self.core.log.applied

    def is_member(self, node_id: NodeId) -> bool:
        """Is `node_id` a voter or a learner of the configuration this server knows?"""
        return node_id in self.core.conf.members()

    async def propose(self, data: bytes) -> Any:
        """Replicate one command; returns the state machine's result once applied here."""
        return await self._request("propose", data)

    def submit(
        self, data: bytes, *, fence_term: int | None = None, waiter: Waiter | None = None
    ) -> Waiter:
        """`propose` without waiting: queue the command and return its waiter (`await
        waiter.wait()` gives the result or raises). The caller may `fail()` the waiter itself,
        e.g. at a deadline: that only stops the wait, not the proposal, as cancelling would.

        With `fence_term=T` the command is appended only if, when the loop takes it, this server
        is the leader of term T (so its entry carries term T); otherwise the waiter fails with
        `Deposed` and the command is never forwarded to another leader. `waiter` may be a
        `CallbackWaiter` to be called back instead of awaited."""
        w = waiter if waiter is not None else Waiter()
        if fence_term is None:
            self._requests.append(("propose", data, w))
        else:
            self._requests.append(("fenced", (data, fence_term), w))
        self._wake.set()
        return w

    async def read_barrier(self) -> None:
        """Return once a read of the local state machine is linearizable (ReadIndex)."""
        await self._request("read", None)

    async def change_membership(self, cc: ConfChange) -> None:
        await self._request("conf", cc)

    async def transfer_leadership(self, target: NodeId) -> None:
        await self._request("transfer", target)

    def leadership(self) -> tuple[bool, int]:
        """(this server is the leader, its current term)."""
        return self.core.role is Role.LEADER, self.core.term

    async def wait_role_change(self) -> None:
        """Return after the next change of role, leader or term (check `leadership()`)."""
        await self._role_changed.wait()

    async def wait_leader(self) -> NodeId:
        while self.core.lead == NONE:
            await self._applied_event.wait()
        return self.core.lead

    async def read_state_machine(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn(*args)` against the state machine on its database thread."""
        return await self._sm_db.run(fn, *args)

    def status(self) -> Status:
        """This server's Raft state now (term, leader, indexes, membership, and on a leader
        every member's progress), with the peer addresses and storage figures."""
        return replace(
            self.core.status(),
            peers=dict(self.peers),
            db_bytes=self._db_bytes,
            snapshot_index=self._snapshot.meta.index,
            leader_changes=self.leader_changes,
        )

    # Cheap reads for callers that poll (gauges, readiness, membership checks): no `Status`
    # is built. Like everything here they read the core between two turns of the loop.
    def conf(self) -> ConfState:
        """The membership (voters, learners) as this server knows it now."""
        return self.core.conf

    def commit_index(self) -> int:
        return self.core.log.committed

    def term_at(self, index: int) -> int | None:
        """The term of the log entry at `index`, None if the log no longer (or not yet) has
        it."""
        return self.core.log.term(index)

    def storage_bytes(self) -> int:
        """The Raft database's size (with its WAL) when last measured (open, snapshots)."""
        return self._db_bytes

    # ------------------------------------------------------------------ running
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        cfg = self.cfg
        cfg.data_dir.mkdir(parents=True, exist_ok=True)
        self.storage = await self._raft_db.run(RaftStorage, cfg.data_dir / "raft.db")
        self.sm = await self._sm_db.run(self._sm_factory, cfg.data_dir)
        self._batches = bool(getattr(self.sm, "accepts_batches", False))
        try:
            await self._open()
            metrics.bind_raft_node(self)
            async with trio.open_nursery() as nursery:
                await nursery.start(self.transport.run)
                nursery.start_soon(self._forward_inbound)
                nursery.start_soon(self._ticker)
                if self.core.conf.voters == {self.id}:
                    self.core.campaign()  # a lone server need not wait an election timeout
                    self._wake.set()
                await nursery.start(self._loop)
                task_status.started()
        finally:
            with trio.CancelScope(shield=True):
                await self._raft_db.run(self.storage.close)
                await self._sm_db.run(self.sm.close)

    async def _open(self) -> None:
        cfg = self.cfg
        state = await self._raft_db.run(self.storage.load)
        self.peers, self.auto_promote = unbook(await self._raft_db.run(self.storage.load_peers))
        hard_state, entries = state.hard_state, state.entries
        fresh = state.snapshot is None and not entries and hard_state.term == 0
        if fresh and cfg.founders:
            if self.id not in cfg.founders:
                raise ValueError(f"node {self.id} is not among the founders {sorted(cfg.founders)}")
            hard_state, entries = bootstrap(cfg.founders)
            await self._raft_db.run(self.storage.save, hard_state, entries)
            self.peers = dict(cfg.founders)
            await self._raft_db.run(self.storage.save_peers, self.peers)
        applied = self._sm_applied = await self._sm_db.run(self.sm.applied_index)
        if state.snapshot is not None:
            self._snapshot = Snapshot(state.snapshot.meta)
            if applied < state.snapshot.meta.index:
                # Cannot happen: the state machine is synced before the log is compacted and
                # before a received snapshot is recorded. Refuse rather than skip entries.
                raise RuntimeError(
                    f"{cfg.data_dir}: the state machine (applied {applied}) is behind the Raft "
                    f"snapshot ({state.snapshot.meta.index}); restore this server from a backup "
                    "or remove it and join it again"
                )
        self.core = RaftCore(
            RaftConfig(
                id=self.id,
                election_tick=cfg.election_tick,
                heartbeat_tick=cfg.heartbeat_tick,
                max_inflight=cfg.max_inflight,
            ),
            random.Random(self._rng.random()),
            hard_state=hard_state,
            snapshot=self._snapshot.meta,
            entries=entries,
            applied=applied,
        )
        self._db_bytes = await self._raft_db.run(self.storage.size_bytes)
        advertise = cfg.advertise or cfg.peer_listen
        self.peers[self.id] = advertise
        self.transport = PeerTransport(
            self.id,
            parse_addr(cfg.peer_listen),
            {pid: parse_addr(a) for pid, a in self.peers.items() if pid != self.id},
            faults=cfg.faults,
            rng=random.Random(self._rng.random()),
            on_peer_down=self._on_peer_down,
            tls=cfg.peer_tls,
            # A server that knows no membership yet (joining) admits whoever calls with a
            # server certificate: the leader that added it. `_set_peers` ends that.
            admit_unknown=not self.core.conf.members(),
        )
        log.info(
            "node %d open: term %d, commit %d, applied %d, %d entries, snapshot at %d",
            self.id,
            hard_state.term,
            hard_state.commit,
            applied,
            len(entries),
            self._snapshot.meta.index,
        )

    async def _forward_inbound(self) -> None:
        inbound = self.transport.inbound
        async for m in inbound:
            inbox = self._inbox  # the loop takes the list and leaves a new one each turn
            inbox.append(m)
            # Also whatever came with it, without a yield per message (as `async for` would):
            # messages that arrived together (both followers' acknowledgements) are stepped in
            # one turn of the loop rather than one turn each.
            while True:
                try:
                    inbox.append(inbound.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            self._wake.set()
            if len(inbox) > 10_000:
                await trio.lowlevel.checkpoint()  # let the loop drain a flood

    def _on_peer_down(self, peer: NodeId) -> None:
        self._peers_down.append((peer, self.transport.statistics().received))
        self._wake.set()

    def _step_inbox(self, inbox: list[Message]) -> None:
        core = self.core
        down = self._peers_down
        if not down:
            for m in inbox:
                core.step(m)
            self._stepped += len(inbox)
            return
        # A report goes in after the messages the transport had received before it.
        for m in inbox:
            while down and down[0][1] <= self._stepped:
                core.report_peer_down(down.popleft()[0])
            core.step(m)
            self._stepped += 1
        while down and down[0][1] <= self._stepped:
            core.report_peer_down(down.popleft()[0])

    async def _ticker(self) -> None:
        while True:
            await trio.sleep(self.cfg.tick_interval)
            self._tick_pending = True
            self._wake.set()

    async def _request(self, kind: str, arg: Any) -> Any:
        w = Waiter()
        self._requests.append((kind, arg, w))
        self._wake.set()
        return await w.wait()

    async def _loop(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        core = self.core
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            inbox, self._inbox = self._inbox, []
            self._step_inbox(inbox)
            if self._tick_pending:
                self._tick_pending = False
                core.tick()
                self._maybe_promote()
            requests, self._requests = self._requests, []
            self._handle_requests(requests)
            while core.has_ready():
                await self._handle_ready(core.ready())

    def _handle_requests(self, requests: list[tuple[str, Any, Waiter]]) -> None:
        core = self.core
        proposals: list[tuple[bytes, Waiter]] = []
        for kind, arg, w in requests:
            try:
                if kind == "fenced":
                    arg, term = arg
                    if core.role is not Role.LEADER or core.term != term:
                        w.fail(Deposed(f"not the leader of term {term} (term {core.term})"))
                        metrics.RAFT_PROPOSALS_FAILED.inc()
                        continue
                    kind = "propose"  # appended below, in this same turn: its entry has `term`
                if kind == "propose":
                    proposals.append((arg, w))
                elif kind == "read":
                    ctx = self._ctx_prefix + b"%d" % next(self._ctx)
                    core.read_index(ctx)
                    self._reads[ctx] = w
                elif kind == "conf":
                    index, term = core.propose_conf_change(arg)
                    self._conf_waiters[index] = (term, w)
                elif kind == "transfer":
                    core.transfer_leadership(arg)
                    w.set(None)
            except ProposalDropped as exc:
                w.fail(self._refusal(exc))
                if kind == "conf":
                    metrics.RAFT_PROPOSALS_FAILED.inc()
        if not proposals:
            return
        batch, rids = self._entry_data(proposals)
        try:
            if core.role is Role.LEADER:
                first, term = core.propose(batch)
                for i, rid in enumerate(rids):
                    self._by_index[first + i] = (term, rid)
                self._commit_clock.append(
                    (first + len(batch) - 1, len(proposals), time.perf_counter())
                )
            else:
                core.forward(batch)  # the leader appends them; we recognise them when applied
        except ProposalDropped as exc:
            err = self._refusal(exc)
            for rid in rids:
                self._waiters.pop(rid).fail(err)
            metrics.RAFT_PROPOSALS_FAILED.inc(len(proposals))

    def _entry_data(self, proposals: list[tuple[bytes, Waiter]]) -> tuple[list[bytes], list[int]]:
        """The entries' payloads for `proposals`, each with its envelope, and the request id each
        entry's waiter is registered under. A state machine that accepts batches gets the
        commands that arrived together packed into few entries (up to `_BATCH_BYTES` each, a
        command over that alone); a batch has one envelope and one waiter for all its commands."""
        batch: list[bytes] = []
        rids: list[int] = []
        n = len(proposals)
        i = 0
        while i < n:
            j = i + 1
            if self._batches:
                size = len(proposals[i][0])
                while j < n and size + len(proposals[j][0]) <= _BATCH_BYTES:
                    size += len(proposals[j][0])
                    j += 1
            rid = next(self._rid)
            if j == i + 1:
                cmd, w = proposals[i]
                batch.append(_ENVELOPE.pack(self.id, rid) + cmd)
                self._waiters[rid] = w
            else:
                group = proposals[i:j]
                batch.append(_ENVELOPE.pack(self.id, rid) + pack_batch([c for c, _ in group]))
                self._waiters[rid] = BatchWaiter([w for _, w in group])
            rids.append(rid)
            i = j
        return batch, rids

    def _maybe_promote(self) -> None:
        """As leader, promote one caught-up learner that joined asking for it (one membership
        change at a time: the core refuses a second while one is pending)."""
        core = self.core
        if core.role is not Role.LEADER or not self.auto_promote:
            return
        for nid in sorted(self.auto_promote & core.conf.learners):
            pr = core.prs.get(nid)
            if pr is not None and pr.match >= core.log.committed:
                try:
                    core.propose_conf_change(promote_change(nid))
                    log.info("node %d: promoting caught-up learner %d to voter", self.id, nid)
                except ProposalDropped:
                    pass  # another change is pending; try again next tick
                return

    def _refusal(self, exc: ProposalDropped) -> RaftError:
        if isinstance(exc, InvalidChange):
            return InvalidRequest(exc.reason)
        if isinstance(exc, LeaderBusy):
            return Busy(exc.reason)
        return NotLeader(exc.reason, exc.leader, self.peers.get(exc.leader))

    async def _handle_ready(self, rd: Ready) -> None:
        core = self.core
        for note in rd.notes:
            log.info("node %d: %s", self.id, note)
        # A received snapshot goes into the state machine (durably) before the Raft storage
        # forgets the log it replaces: a crash in between then only repeats the install.
        if rd.snapshot is not None:
            await self._install_snapshot(rd.snapshot)
        # A leader's messages do not depend on its own fsync (it counts its own log only
        # once this Ready is persisted: acknowledgements are handled after it), so they go
        # first and the followers' fsyncs overlap the leader's (Raft thesis §10.2.1).
        # Everyone else's (votes, acknowledgements) must wait until the state is durable.
        early = core.role is Role.LEADER
        snaps_sent = await self._send(rd.messages) if early else []
        # 1. persist: one transaction for the whole batch.
        applied = sent = False
        if rd.must_persist():
            snap = None if rd.snapshot is None else Snapshot(rd.snapshot.meta)  # metadata only
            if rd.committed and snap is None:
                # Persist and apply on one worker thread (holding both databases' turns), as two
                # calls queued at once: one thread hop per Ready, and whichever result others
                # wait for is acted on while the other call runs (see `_persist_and_apply`).
                sent = await self._persist_and_apply(rd, early)
                self._observe_save()
                applied = True
            else:
                await self._raft_db.run(self.storage.save, rd.hard_state, rd.entries, snap)
                self._observe_save()
        # 2. send.
        if not early and not sent:
            snaps_sent = await self._send(rd.messages)
        # 3. apply.
        if rd.committed and not applied:
            await self._apply(rd.committed)
        for rs in rd.read_states:
            w = self._reads.pop(rs.context, None)
            if w is not None:
                self._read_waits.append((rs.index, w))
        self._release_reads()
        if rd.soft_state is not None:
            self._on_soft_state_change(rd)
        # 4. advance.
        core.advance(rd)
        for to in snaps_sent:
            core.report_snapshot(to, True)
        if rd.committed:
            self._applied_bytes += sum(len(e.data) for e in rd.committed)
        if (
            core.log.applied - self._snapshot.meta.index >= self.cfg.snapshot_every
            or self._applied_bytes >= self.cfg.snapshot_every_bytes
        ):
            await self._take_snapshot()
        self._applied_event.set()
        self._applied_event = trio.Event()

    async def _send(self, messages: list[Message]) -> list[NodeId]:
        """Send; a SNAP gets a snapshot of the state machine as it is now. Returns the nodes a
        snapshot went to."""
        snaps_sent = []
        for m in messages:
            if m.type is MsgType.SNAP:
                m.snapshot = await self._current_snapshot()
                snaps_sent.append(m.to)
            self.transport.send(m)
        return snaps_sent

    async def _current_snapshot(self) -> Snapshot:
        """The state machine at its applied index, which (between Readies) is the core's: the
        core knows that index's term and the membership there."""
        core = self.core
        index, sm_data = await self._sm_db.run(self.sm.snapshot)
        term = core.log.term(index)
        assert term is not None, f"applied index {index} below the log's start"
        meta = SnapshotMeta(index, term, core.conf)
        return Snapshot(meta, pack_snapshot(book(self.peers, self.auto_promote), sm_data))

    async def _install_snapshot(self, snap: Snapshot) -> None:
        book, sm_data = unpack_snapshot(snap.data)
        await self._sm_db.run(self.sm.restore, snap.meta.index, sm_data)
        await self._sm_db.run(self.sm.sync)
        self._sm_applied = snap.meta.index
        self._snapshot = Snapshot(snap.meta)
        peers, self.auto_promote = unbook(book)
        peers[self.id] = self.peers[self.id]
        await self._set_peers(peers)
        # Whatever we proposed may be inside the snapshot or not: we cannot tell any more.
        err = OutcomeUnknown("this server caught up by snapshot; outcome unknown")
        metrics.RAFT_PROPOSALS_FAILED.inc(
            sum(proposal_count(w) for w in self._waiters.values()) + len(self._conf_waiters)
        )
        self._commit_clock.clear()
        for w in self._waiters.values():
            w.fail(err)
        for _, w in self._conf_waiters.values():
            w.fail(err)
        self._waiters.clear()
        self._by_index.clear()
        self._conf_waiters.clear()
        log.info("node %d installed snapshot at index %d", self.id, snap.meta.index)
        if self._on_snapshot is not None:
            self._notify(self._on_snapshot)

    def _notify(self, hook: Callable[..., None], *args: Any) -> None:
        try:
            hook(*args)
        except Exception:
            # An observer's bug must not stop consensus on this server.
            log.exception("node %d: error in an apply observer", self.id)

    def _observe_save(self) -> None:
        seconds = self.storage.last_save_seconds
        if seconds is not None:
            metrics.RAFT_WAL_FSYNC_DURATION.observe(seconds)

    async def _persist_and_apply(self, rd: Ready, early: bool) -> bool:
        """Persist `rd` and apply `rd.committed` in one hop to the Raft database's thread, as
        two calls queued back to back. A leader whose committed entries were all persisted by
        earlier Readies (the usual case) applies first and answers the proposals while its
        new entries are persisted; anyone else persists first (an entry is never applied
        before it is durable here) and sends its acknowledgements, which promise only what is
        persisted, while the apply runs. Returns whether `rd.messages` were sent (never when
        one is a snapshot: `_send` needs the state machine, whose turn is held here).

        Conf changes take the plain path (persist, then apply, then `_applied`, which saves
        the address book through the Raft database's turn held here)."""
        sm_entries, mine = self._strip(rd.committed)
        plain = any(e.type is EntryType.CONF_CHANGE for e in rd.committed)
        persisted = not rd.entries or rd.committed[-1].index < rd.entries[0].index
        send = not early and not plain and all(m.type is not MsgType.SNAP for m in rd.messages)
        async with self._raft_db.steps_with(self._sm_db) as steps:
            if early and persisted and not plain:
                applying = steps.submit(self.sm.apply, sm_entries)
                saving = steps.submit(self.storage.save, rd.hard_state, rd.entries)
                await self._applied(rd.committed, mine, await applying.result())
                await saving.result()
                return False
            if not (send and rd.messages):
                # Nothing to do in between (a lone server, whose proposals commit in the Ready
                # that persists them; a leader's conf change): one call, one wake-up.
                both = steps.submit(self._save_then_apply, rd.hard_state, rd.entries, sm_entries)
                applied = await both.result()
            else:
                saving = steps.submit(self.storage.save, rd.hard_state, rd.entries)
                applying = steps.submit(self.sm.apply, sm_entries)
                await saving.result()
                for m in rd.messages:
                    self.transport.send(m)
                applied = await applying.result()
        await self._applied(rd.committed, mine, applied)
        return send

    def _save_then_apply(
        self, hard_state: HardState | None, entries: list[Entry], sm_entries: list[Entry]
    ) -> Applied[Any]:
        """On the Raft database's thread, holding both turns: persist, then apply."""
        self.storage.save(hard_state, entries)
        return self.sm.apply(sm_entries)

    def _strip(self, entries: list[Entry]) -> tuple[list[Entry], list[tuple[int, int] | None]]:
        """Strip the envelopes: the state machine sees only the command. Also returns, per
        entry, (index, request id) when this server proposed it."""
        mine: list[tuple[int, int] | None] = []
        sm_entries = []
        for e in entries:
            if e.type is EntryType.NORMAL and len(e.data) >= _ENVELOPE.size:
                origin, rid = _ENVELOPE.unpack_from(e.data)
                mine.append((e.index, rid) if origin == self.id else None)
                sm_entries.append(Entry(e.term, e.index, e.type, e.data[_ENVELOPE.size :]))
            else:
                mine.append(None)
                sm_entries.append(e)
        return sm_entries, mine

    async def _apply(self, entries: list[Entry]) -> None:
        sm_entries, mine = self._strip(entries)
        applied = await self._sm_db.run(self.sm.apply, sm_entries)
        await self._applied(entries, mine, applied)

    async def _applied(
        self, entries: list[Entry], mine: list[tuple[int, int] | None], applied: Applied[Any]
    ) -> None:
        """After the state machine applied `entries`: notify, resolve the waiters."""
        self._sm_applied = last = entries[-1].index
        clock = self._commit_clock
        if clock and clock[0][0] <= last:
            now = time.perf_counter()
            while clock and clock[0][0] <= last:
                _, n, started = clock.popleft()
                metrics.RAFT_COMMIT_DURATION.observe_many(now - started, n)
        if self._on_apply is not None:
            self._notify(self._on_apply, applied.events)
        peers_changed = False
        peers = dict(self.peers)
        for e, res, own in zip(entries, applied.results, mine, strict=True):
            if e.type is EntryType.CONF_CHANGE:
                cc = ConfChange.decode(e.data)
                if cc.type is ConfChangeType.REMOVE:
                    peers.pop(cc.node_id, None)
                    self.auto_promote.discard(cc.node_id)
                elif cc.type is ConfChangeType.ADD_VOTER:
                    self.auto_promote.discard(cc.node_id)
                elif cc.context:
                    addr, promote = member_context(cc.context)
                    if addr is not None:
                        peers[cc.node_id] = addr
                    if promote:
                        self.auto_promote.add(cc.node_id)
                peers_changed = True
                conf = self._conf_waiters.pop(e.index, None)
                if conf is not None:
                    self._resolve(conf[1], conf[0], e, None)
            if own is not None:
                w = self._waiters.pop(own[1], None)
                if w is not None:
                    w.set(res)
            expected = self._by_index.pop(e.index, None)
            if expected is not None and expected[0] != e.term:
                # Our entry at this index was replaced by another leader's: not committed.
                w = self._waiters.pop(expected[1], None)
                if w is not None:
                    w.fail(ProposalLost(f"entry {e.index} was overwritten by term {e.term}"))
                    metrics.RAFT_PROPOSALS_FAILED.inc(proposal_count(w))
        if peers_changed:
            await self._set_peers(peers)

    @staticmethod
    def _resolve(w: Waiter, term: int, e: Entry, result: Any) -> None:
        if term == e.term:
            w.set(result)
        else:
            w.fail(ProposalLost(f"entry {e.index} was overwritten by term {e.term}"))
            metrics.RAFT_PROPOSALS_FAILED.inc()

    async def _set_peers(self, peers: dict[NodeId, str]) -> None:
        old = self.peers
        self.peers = peers
        self.transport.admit_unknown = False  # the membership is known from now on
        for pid in old.keys() - peers.keys():
            if pid != self.id:
                self.transport.remove_peer(pid)
        for pid, addr in peers.items():
            if pid != self.id and old.get(pid) != addr:
                try:
                    self.transport.set_peer(pid, parse_addr(addr))
                except ValueError as exc:
                    # Validated before proposing; a bad address in the log must not stop us.
                    log.error("node %d: member %d has an unusable address: %s", self.id, pid, exc)
        await self._raft_db.run(self.storage.save_peers, book(peers, self.auto_promote))

    def _release_reads(self) -> None:
        if not self._read_waits:
            return
        keep = []
        for idx, w in self._read_waits:
            if idx <= self._sm_applied:
                w.set(None)
            else:
                keep.append((idx, w))
        self._read_waits = keep

    def _on_soft_state_change(self, rd: Ready) -> None:
        ss = rd.soft_state
        assert ss is not None
        if ss.role is not Role.LEADER:
            for w in self._reads.values():
                w.fail(ReadAborted("leadership changed; retry the read"))
            self._reads.clear()
        self._role_changed.set()
        self._role_changed = trio.Event()
        prev = self.core.prev_ss
        if ss.leader != prev.leader:
            self.leader_changes += 1
            metrics.RAFT_LEADER_CHANGES.inc()
            log.info(
                "node %d: leader is now %s (term %d)", self.id, ss.leader or "unknown", ss.term
            )

    async def _take_snapshot(self) -> None:
        """Compact the log behind the state machine: its database is the snapshot, so make it
        durable and record only the metadata (index, term, membership) with the log."""
        core = self.core
        await self._sm_db.run(self.sm.sync)
        index = self._sm_applied
        term = core.log.term(index)
        if term is None:
            return
        meta = SnapshotMeta(index, term, core.conf)
        upto = max(core.log.offset, index - self.cfg.keep_tail)
        # Fewer entries if those would hold more than keep_tail_bytes of data.
        budget = self.cfg.keep_tail_bytes
        log_ = core.log
        for i in range(index, upto, -1):
            budget -= len(log_.entries[i - log_.offset - 1].data)
            if budget < 0:
                upto = i
                break
        await self._raft_db.run(self.storage.compact, Snapshot(meta), upto)
        core.compact(meta, upto)
        self._snapshot = Snapshot(meta)
        self._applied_bytes = 0
        self._db_bytes = await self._raft_db.run(self.storage.size_bytes)
        log.info("node %d: snapshot at %d, log compacted to %d", self.id, index, upto)
