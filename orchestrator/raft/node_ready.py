"""The driver's Ready step: persist, send, apply, advance, and the snapshots (the middle layer
of `RaftNode`; see `orchestrator.raft.node` for the theory of operation, steps 0-4).

`_handle_ready` takes one `Ready` from the core through installing a received snapshot,
persisting entries and hard state in one SQLite transaction, sending (a leader before its own
persist, anyone else after), applying committed entries (resolving the proposals and reads that
wait for them, updating the peer address book from conf changes), `advance()`, and compacting the
log behind a synced state machine. Only the loop (`RaftNode._loop`) calls it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import trio

from orchestrator import observability as metrics
from orchestrator.raft.errors import (
    OutcomeUnknown,
    ProposalLost,
    ReadAborted,
)
from orchestrator.raft.membership import (
    book,
    member_context,
    pack_snapshot,
    unbook,
    unpack_snapshot,
)
from orchestrator.raft.node_state import ENVELOPE, NodeState, parse_addr
from orchestrator.raft.statemachine import Applied
from orchestrator.raft.types import (
    ConfChange,
    ConfChangeType,
    Entry,
    EntryType,
    HardState,
    Message,
    MsgType,
    NodeId,
    Ready,
    Role,
    Snapshot,
    SnapshotMeta,
)
from orchestrator.raft.waiters import Waiter, proposal_count

# The same logger as the rest of the driver.
log = logging.getLogger("orchestrator.raft.node")


class ReadyHandler(NodeState):
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
        # A Ready that only moves the commit index is not saved (`Ready.commit_only`): saving it
        # cost a SQLite transaction and a thread hop on every commit of every server.
        if rd.must_persist() and not rd.commit_only(self.core.prev_hs):
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
        self.transport.send_now(messages)
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
                self.transport.send_now(rd.messages)
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
            if e.type is EntryType.NORMAL and len(e.data) >= ENVELOPE.size:
                origin, rid = ENVELOPE.unpack_from(e.data)
                mine.append((e.index, rid) if origin == self.id else None)
                sm_entries.append(Entry(e.term, e.index, e.type, e.data[ENVELOPE.size :]))
            else:
                mine.append(None)
                sm_entries.append(e)
        return sm_entries, mine

    async def _apply(self, entries: list[Entry]) -> None:
        sm_entries, mine = self._strip(entries)
        here = self._apply_here(entries, sm_entries)
        if here is None:
            applied = await self._sm_db.run(self.sm.apply, sm_entries)
            await self._applied(entries, mine, applied)
            return
        applied, commit_due = here
        await self._applied(entries, mine, applied)
        if commit_due:
            # The applies share a transaction, committed once it is old enough: on the state
            # machine's thread, while the waiters answered above run.
            assert self._applies_now is not None
            await self._sm_db.run(self._applies_now.commit)

    def _apply_here(
        self, entries: list[Entry], sm_entries: list[Entry]
    ) -> tuple[Applied[Any], bool] | None:
        """Apply a few small entries on the event loop, without a hop to the state machine's
        thread and back (two thread wake-ups, often the larger part of a lone write's time
        and CPU), if the state machine can (`AppliesNow`, see `statemachine`: no fsync, no
        commit, nothing that could take long) and its thread is idle. Returns what was
        applied and whether a commit is due; None: not applied."""
        sm = self._applies_now
        if sm is None or any(e.type is EntryType.CONF_CHANGE for e in entries):
            return None

        def apply_now() -> tuple[Applied[Any], bool] | None:
            assert sm is not None
            applied = sm.apply_now(sm_entries)
            return None if applied is None else (applied, sm.commit_due())

        try:
            return self._sm_db.run_here_nowait(apply_now)
        except trio.WouldBlock:
            return None  # a call is running on the thread: queue behind it

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
