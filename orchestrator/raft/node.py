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
disk delays elections instead of triggering a burst of them. Each tick's lateness (from its due
time on the ticker's fixed grid to reaching the core) is `raft_tick_lateness_seconds`.

A Ready that only moves the commit index is not saved, and its entries, if few and small, are
applied on the event loop (`statemachine.AppliesNow`): a lone write's commit makes no thread hop.

When the transport sees a peer's process go away (its connections closed or reset, or refused),
the loop reports it to the core (`report_peer_down`: a follower whose leader that was campaigns
within a few ticks instead of an election timeout), in order with the peer's messages: only
once every message the transport had received before it has been stepped, so a last heartbeat
still on its way through the inbox is not mistaken for news from a live leader.

Layout: `RaftNode` is one class built in layers, each calling only itself and those below:
`node_state.NodeState` (`NodeConfig`, the fields) <- `node_ready.ReadyHandler` (steps 0-4 of
one Ready: persist, send, apply, advance, snapshots) <- `RaftNode` here (the public API, `run`,
the loop, requests). The errors callers see are in `errors` (re-exported here).

Invariants: the core is only touched by `_loop`; an entry is applied only after it is persisted
on this server, in index order, once (the state machine skips what it applied already); a
proposal resolves only when its entry is applied (success, if the entry at its index has its
term) or overwritten (`ProposalLost`); a read barrier resolves only once the state machine has
applied the read index confirmed by a quorum. The peer address book (node id -> "host:port")
travels in conf-change contexts and in snapshots, and is persisted with the Raft log.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import trio

from orchestrator import observability as metrics
from orchestrator.raft.core import RaftCore, bootstrap
from orchestrator.raft.core_state import RaftConfig
from orchestrator.raft.errors import (
    Busy,
    Deposed,
    InvalidRequest,
    NotLeader,
    OutcomeUnknown,
    ProposalLost,
    RaftError,
    ReadAborted,
)
from orchestrator.raft.membership import (
    promote_change,
    unbook,
)
from orchestrator.raft.node_ready import ReadyHandler
from orchestrator.raft.node_state import ENVELOPE, NodeConfig, parse_addr
from orchestrator.raft.statemachine import AppliesNow, pack_batch
from orchestrator.raft.status import Status
from orchestrator.raft.storage import RaftStorage
from orchestrator.raft.transport import PeerTransport
from orchestrator.raft.types import (
    NONE,
    ConfChange,
    ConfState,
    InvalidChange,
    LeaderBusy,
    Message,
    NodeId,
    ProposalDropped,
    Role,
    Snapshot,
)
from orchestrator.raft.waiters import BatchWaiter, Waiter

__all__ = [
    "Busy",
    "Deposed",
    "InvalidRequest",
    "NodeConfig",
    "NotLeader",
    "OutcomeUnknown",
    "ProposalLost",
    "RaftError",
    "RaftNode",
    "ReadAborted",
    "parse_addr",
]

log = logging.getLogger("orchestrator.raft.node")


# Payload bytes per batch entry: a few hundred commands of 1 KiB, well under the 1 MiB a message
# carries, so one batch never holds up a follower's catch-up for long.
_BATCH_BYTES = 256 * 1024


class RaftNode(ReadyHandler):
    """One Raft server. Start with `await nursery.start(node.run)`.

    Observers are given at construction and called on the trio thread, from the loop:
    `on_apply(events)` after each applied batch, with the events the state machine returned
    for it (`statemachine.Applied`; their type is the state machine's); `on_snapshot()` after
    a received snapshot replaced the state machine (no events: an observer catches up from the
    state machine itself). An observer must not block; an exception it raises is logged, not
    propagated."""

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
        self._applies_now = self.sm if isinstance(self.sm, AppliesNow) else None
        try:
            await self._open()
            metrics.bind_raft_node(self)
            async with trio.open_nursery() as nursery:
                await nursery.start(self.transport.run)
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
            on_message=self._on_message,
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

    def _on_message(self, m: Message) -> bool:
        """From the transport's connection task: into the inbox, and wake the loop (messages
        that arrive together are stepped in one turn). False: the inbox is full (the loop is
        far behind, e.g. a flood during a slow fsync), the transport drops the message."""
        inbox = self._inbox  # the loop takes the list and leaves a new one each turn
        if len(inbox) >= self.transport.queue_size:
            return False
        inbox.append(m)
        self._wake.set()
        return True

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
        """Due times on a fixed grid (no drift from how late each wake-up was); a tick that is
        still pending when the next falls due is not repeated (coalesced), and after a stall the
        grid restarts from now rather than catching up in a burst."""
        interval = self.cfg.tick_interval
        due = trio.current_time() + interval
        while True:
            await trio.sleep_until(due)
            if self._tick_due is None:
                self._tick_due = due
                self._wake.set()
            due += interval
            now = trio.current_time()
            if due <= now:
                due = now + interval

    def _observe_tick(self, lateness: float) -> None:
        """How long after its due time a tick reached the core: the loop's own delay (behind
        an fsync, an apply, or other tasks holding the event loop)."""
        metrics.RAFT_TICK_LATENESS.observe(lateness)
        self.ticks += 1
        if lateness > self.tick_lateness_max:
            self.tick_lateness_max = lateness

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
            if self._tick_due is not None:
                self._observe_tick(trio.current_time() - self._tick_due)
                self._tick_due = None
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
                batch.append(ENVELOPE.pack(self.id, rid) + cmd)
                self._waiters[rid] = w
            else:
                group = proposals[i:j]
                batch.append(ENVELOPE.pack(self.id, rid) + pack_batch([c for c, _ in group]))
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
