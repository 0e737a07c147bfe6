"""`RaftStore`: the `Store` interface over a Raft node whose state machine is the MVCC store.

Writes are proposed through Raft (a follower forwards them to the leader) and return once
applied here; failed commands raise their `StoreError`. Reads are linearizable by default: a
ReadIndex barrier (the leader confirms with a quorum that it still leads), then a local read;
`linearizable=False` reads the local copy at once (possibly stale; Kubernetes' resourceVersion
"0"). Watches are served by the `WatchHub`, fed after every applied batch.

Local reads are batched: reads that wait while one batch runs on the state machine's database
thread run together in the next batch (one thread hand-off for all of them instead of one
each). A read is still issued only after its own barrier, so it sees at least the state it
must. A local `get` of a recently written key needs no database at all: the values the last
applied writes left (`RECENT_BYTES` of them) are kept from the apply events, so the API
server's update loop, which reads the object it is about to replace locally first, skips the
thread hand-off for the objects that are being worked on (`recent.RecentValues`, which also
keeps what local database reads found).

Invariants: a request that cannot reach a quorum fails with `NoQuorum` after `quorum_timeout`
instead of hanging; a retry happens only when the earlier attempt certainly had no effect (no
leader, refused, or its log entry was overwritten). A leader that is only slow (overloaded: it
applied entries during the wait, so a quorum answers; or it is the only voter) is not a lost
quorum: its requests wait another `quorum_timeout` each time, up to `overload_timeout` in all, so an
overloaded server slows down instead of failing writes it would have committed a moment later
(and inviting retries that add to the load). Only the leader compacts automatically; every
server checkpoints its WAL.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import trio

from orchestrator.observability import RAFT_PROPOSALS_FAILED, bind_store
from orchestrator.raft.node import (
    Busy,
    Deposed,
    NodeConfig,
    NotLeader,
    OutcomeUnknown,
    ProposalLost,
    RaftNode,
    ReadAborted,
)
from orchestrator.raft.waiters import CallbackWaiter
from orchestrator.store.api import ListResult, decode_continue, encode_continue
from orchestrator.store.fencing import Fenced, current_fence
from orchestrator.store.mvcc import MVCCStore
from orchestrator.store.recent import UNKNOWN, RecentValues
from orchestrator.store.types import (
    Compacted,
    Compare,
    Event,
    KeyValue,
    NoQuorum,
    StoreError,
    StoreStatus,
    TxnOp,
    TxnResult,
    Unavailable,
    WriteResult,
    encode_compact,
    encode_create,
    encode_delete,
    encode_put,
    encode_txn,
)
from orchestrator.store.watch import Watcher, WatchHub

log = logging.getLogger("orchestrator.store")

T = TypeVar("T")


class _Expired(Exception):
    """A write's waiter reached its quorum deadline (raised by the waiter, see `_expire`)."""


@dataclass(frozen=True)
class CompactionPolicy:
    """etcd's --auto-compaction-mode/-retention: "periodic" keeps `retention` seconds of
    history, "revision" keeps the last `retention` revisions. Checked every `interval` s; see
    `Compactor` for when a check compacts."""

    mode: str = "periodic"
    retention: float = 300.0
    interval: float = 30.0
    batch: int = 1000  # revisions a compaction should free at least (see Compactor)

    @classmethod
    def parse(cls, text: str) -> CompactionPolicy:
        """'5m', '300s', '1h' (periodic) or '10000' (revisions); '0' disables."""
        text = text.strip()
        units = {"s": 1, "m": 60, "h": 3600}
        if text and text[-1] in units:
            seconds = float(text[:-1]) * units[text[-1]]
            return cls("periodic", seconds, max(1.0, min(seconds / 10, 60.0)))
        return cls("revision", float(int(text)), 5.0)


class Compactor:
    """When automatic compaction compacts, and to which revision (pure: the caller passes the
    clock and the store's revisions; `RaftStore._auto_compact` calls `due` every
    `policy.interval` seconds on every server and acts on the leader).

    The target is the newest revision the policy lets go: periodic, the revision sampled at
    least `retention` seconds ago; revision mode, `revision - retention`. A compaction is a Raft
    entry, a delete in the store and a WAL checkpoint (fsyncs), so it is not worth making for a
    handful of revisions: one is due only once it frees at least `batch` revisions (in
    revision mode at most `retention`, so small retentions still compact), or, periodic, once
    the previous one is `retention` seconds old. Busy, that is every `interval`; idle (the node
    Leases' few revisions a minute), once per retention period, as etcd (periodic retention
    under an hour), kine and kube-apiserver (every 5 minutes) compact. So history is kept for
    at least `retention` and at most about twice that (periodic) or `retention` plus one batch
    (revision mode).
    """

    def __init__(self, policy: CompactionPolicy, now: float) -> None:
        self.policy = policy
        self._samples: deque[tuple[float, int]] = deque()  # (time, revision), oldest first
        self._target = 0  # the newest revision sampled at least `retention` ago (periodic)
        self._last = now  # when the last compaction was made (or the compactor started)

    def due(self, now: float, revision: int, compacted: int) -> int | None:
        """Record a sample; the revision to compact to now, or None."""
        policy = self.policy
        if policy.mode == "periodic":
            self._samples.append((now, revision))
            while self._samples and self._samples[0][0] <= now - policy.retention:
                self._target = self._samples.popleft()[1]
            target = self._target
            batch = policy.batch
            overdue = now - self._last >= policy.retention
        else:
            target = revision - math.floor(policy.retention)
            batch = max(1, min(policy.batch, math.floor(policy.retention)))
            overdue = False
        floor = max(compacted, 1)
        if target <= floor or (target - floor < batch and not overdue):
            return None
        return target

    def compacted(self, now: float) -> None:
        """A compaction was made (or found already made) at `now`."""
        self._last = now


@dataclass(eq=False, slots=True)
class _Read:
    """One local read waiting for its batch: `fn(*args)`, then `ok` and `value` (the result,
    or the exception it raised)."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    done: trio.Event = field(default_factory=trio.Event)
    ok: bool = False
    value: Any = None


def _run_reads(batch: list[_Read]) -> None:
    """Run a batch of reads (on the state machine's thread), each on its own."""
    for r in batch:
        try:
            r.value = r.fn(*r.args)
            r.ok = True
        except Exception as exc:  # delivered to the reader, not to the batch
            r.value = exc


class _History:
    """The WatchHub's view of durable history (read on the state machine's thread)."""

    def __init__(self, node: RaftNode, mvcc: MVCCStore) -> None:
        self.node = node
        self.mvcc = mvcc

    async def events_since(self, revision: int, prefix: str, limit: int) -> list[Event]:
        result: list[Event] = await self.node.read_state_machine(
            self.mvcc.events_since, revision, prefix, limit
        )
        return result

    def current_revision(self) -> int:
        return self.mvcc.revision()

    def compact_revision(self) -> int:
        return self.mvcc.compact_revision()


class RaftStore:
    """The `Store` over its own Raft node (made here, with this store's observers: it is
    complete once constructed). `open_store(data_dir)` opens the MVCC store, the node's state
    machine; `run()` starts the node, which opens it."""

    def __init__(
        self,
        cfg: NodeConfig,
        open_store: Callable[[Path], MVCCStore],
        *,
        quorum_timeout: float = 5.0,
        overload_timeout: float = 60.0,
        compaction: CompactionPolicy | None = None,
        checkpoint_interval: float = 30.0,
    ) -> None:
        self._open_store = open_store
        self.node = RaftNode(
            cfg, self._open, on_apply=self._on_apply, on_snapshot=self._on_snapshot
        )
        self.quorum_timeout = quorum_timeout
        self.overload_timeout = overload_timeout  # see the module doc
        self.compaction = compaction or CompactionPolicy()
        self.checkpoint_interval = checkpoint_interval
        # Both set by `_open`, which the node calls when it starts, before its first apply.
        self.mvcc: MVCCStore
        self.hub: WatchHub
        self._nursery: trio.Nursery | None = None
        # Write deadlines, [deadline, seq, waiter-or-None, applied index, final deadline] in a
        # heap: one task fails the waiters that reach theirs, which is cheaper than a cancel
        # scope per write (see `_write`), or gives them more time (`_progressed`).
        self._deadlines: list[list[Any]] = []
        self._deadline_seq = itertools.count()
        self._sweep = trio.CancelScope()  # the `_expire` task's current sleep
        self._reads: trio.MemorySendChannel[_Read] | None = None  # while `_reader` runs
        self.recent = RecentValues()  # recently written keys' live values (store/recent.py)

    def _open(self, data_dir: Path) -> MVCCStore:
        """The node's state machine factory (on the state machine's thread, before the node's
        loop starts: nothing else runs yet): open the store and the watch hub over it, which
        starts at the store's revision, so it exists before the first applied batch."""
        mvcc = self._open_store(data_dir)
        self.mvcc = mvcc
        self.hub = WatchHub(_History(self.node, mvcc))
        return mvcc

    def _on_apply(self, events: Sequence[Event]) -> None:
        """The node applied a batch whose writes made `events`."""
        events = self.recent.share_prev(events)
        self.recent.remember(events)
        try:
            self.hub.publish(events, self.mvcc.revision())
        except ValueError:
            log.exception("watch hub out of step with the store; restarting watches")
            self._new_hub("watch restarted by the server: watch again from your revision")

    def _on_snapshot(self) -> None:
        # The store jumped to the snapshot's revision without events: watchers must catch up
        # from the durable history, which a fresh hub makes them do (their clients resume).
        self.recent.clear()  # the revision jumped without events
        self._new_hub("server caught up by snapshot: watch again from your revision")

    def _new_hub(self, reason: str) -> None:
        old, self.hub = self.hub, WatchHub(_History(self.node, self.mvcc))
        old.close(reason)
        if self._nursery is not None:
            self._nursery.start_soon(self.hub.run)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.node.run)  # opens the store (`_open`)
            bind_store(self.mvcc)
            self._nursery = nursery
            await nursery.start(self.hub.run)
            await nursery.start(self._reader)
            nursery.start_soon(self._auto_compact)
            nursery.start_soon(self._expire)
            nursery.start_soon(self._checkpoint)
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self.hub.close("server shutting down")

    # ------------------------------------------------------------------ helpers
    async def _with_quorum(self, what: str, attempt: Callable[[], Awaitable[T]]) -> T:
        """Run `attempt`, retrying while that is safe, for at most quorum_timeout seconds (more
        while this leader makes progress: see `_progressed`)."""
        delay = 0.01
        final = trio.current_time() + self.overload_timeout
        while True:
            applied = self.node.applied_index()
            with trio.move_on_after(self.quorum_timeout):
                while True:
                    try:
                        return await attempt()
                    except (NotLeader, Busy, ReadAborted, ProposalLost):
                        pass  # certainly no effect: retry (a leader may be elected meanwhile)
                    except OutcomeUnknown as exc:
                        raise NoQuorum(f"{what}: {exc}") from exc
                    await trio.sleep(delay)
                    delay = min(delay * 2, 0.2)
            if not self._progressed(applied, final):
                raise self._no_quorum(what)

    def _progressed(self, applied: int, final: float) -> bool:
        """Whether a request that waited since the applied index was `applied` may wait on,
        `final` (its `overload_timeout`) not passed: this server leads and either applied
        entries since (a quorum answers; it is busy, not cut off) or is the only voter (its
        quorum is itself: a wait is only its own backlog)."""
        node = self.node
        if not node.is_leader or trio.current_time() >= final:
            return False
        return node.applied_index() > applied or node.conf().voters == {node.id}

    def _no_quorum(self, what: str) -> NoQuorum:
        return NoQuorum(
            f"{what}: no quorum answered within {self.quorum_timeout:g}s"
            + (" (the write may or may not have been applied)" if what != "read" else "")
        )

    async def _expire(self) -> None:
        """Fail each pending write's waiter at its deadline (see `_write`). Wakes at most about
        every 10 ms under load: a write may give up up to that much after its deadline; and
        only for a write still pending (one that finished is dropped when it reaches the top
        of the heap)."""
        heap = self._deadlines
        while True:
            # `_write` moves this scope's deadline earlier if a new write's deadline comes first.
            with trio.CancelScope(deadline=heap[0][0] + 0.01 if heap else math.inf) as scope:
                self._sweep = scope
                await trio.sleep_forever()
            now = trio.current_time()
            later = []
            while heap and heap[0][0] <= now:
                item = heapq.heappop(heap)
                w = item[2]
                if w is None:
                    continue
                if self._progressed(item[3], item[4]):  # busy, not cut off: wait on
                    item[0], item[3] = now + self.quorum_timeout, self.node.applied_index()
                    later.append(item)
                    continue
                w.fail(_Expired())
                RAFT_PROPOSALS_FAILED.inc()  # no quorum in time: outcome unknown
            for item in later:
                heapq.heappush(heap, item)
            # Writes that finished are dropped from the top now, not one wake-up each at their
            # deadlines: serial writes (each done long before the next one's deadline) would
            # otherwise wake this task once per write, 10 ms apart.
            while heap and heap[0][2] is None:
                heapq.heappop(heap)

    async def _write(self, what: str, command: bytes) -> Any:
        """`_with_quorum(what, lambda: node.propose(command))`, with the same retries and the
        same bound, but the bound is enforced by `_expire` failing the proposal's waiter at the
        deadline instead of by a cancel scope around each write (one of the larger per-write
        costs on the leader). As with the cancel scope, the proposal itself is not withdrawn:
        only the wait ends, and the outcome is reported unknown."""
        now = trio.current_time()
        deadline = now + self.quorum_timeout
        final = now + self.overload_timeout
        delay = 0.01
        fence = current_fence()  # see store/fencing.py: checked again on every retry
        while True:
            applied = self.node.applied_index()
            waiter = self.node.submit(command, fence_term=fence)
            item: list[Any] = [deadline, next(self._deadline_seq), waiter, applied, final]
            heapq.heappush(self._deadlines, item)
            if deadline + 0.01 < self._sweep.deadline:
                self._sweep.deadline = deadline + 0.01
            try:
                result = await waiter.wait()
                break
            except (NotLeader, Busy, ReadAborted, ProposalLost):
                pass  # certainly no effect: retry (a leader may be elected meanwhile)
            except OutcomeUnknown as exc:
                raise NoQuorum(f"{what}: {exc}") from exc
            except Deposed as exc:
                raise Fenced(f"{what} refused (fenced): {exc}") from None
            except _Expired:
                raise self._no_quorum(what) from None
            finally:
                item[2] = None  # done with it: the heap keeps no result alive until the deadline
            if trio.current_time() + delay >= deadline:
                await trio.sleep_until(deadline)
                raise self._no_quorum(what)
            await trio.sleep(delay)
            delay = min(delay * 2, 0.2)
        error = getattr(result, "error", None)
        if isinstance(error, StoreError):
            raise error
        return result

    def submit_write(
        self, command: bytes, done: Callable[[Any, BaseException | None], None]
    ) -> None:
        """One attempt at a write without a task of its own (the client port's fast path).

        `done(result, None)` or `done(None, error)` is called once, from the node's loop or the
        deadline sweep: `error` is a StoreError (the command's own failure, or NoQuorum at the
        deadline), or one of NotLeader, Busy, ReadAborted, ProposalLost when the attempt
        certainly had no effect and the caller should retry the usual way (`update`, ...).
        Unfenced: for clients of the store, not for controllers."""
        now = trio.current_time()
        deadline = now + self.quorum_timeout
        final = now + self.overload_timeout
        item: list[Any] = [
            deadline,
            next(self._deadline_seq),
            None,
            self.node.applied_index(),
            final,
        ]

        def finish(value: Any, error: BaseException | None) -> None:
            item[2] = None
            if error is None:
                failure = getattr(value, "error", None)
                if isinstance(failure, StoreError):
                    done(None, failure)
                else:
                    done(value, None)
            elif isinstance(error, _Expired):
                done(None, self._no_quorum("write"))
            elif isinstance(error, OutcomeUnknown):
                done(None, NoQuorum(f"write: {error}"))
            else:
                done(None, error)

        waiter = CallbackWaiter(finish)
        item[2] = waiter
        self.node.submit(command, waiter=waiter)
        heapq.heappush(self._deadlines, item)
        if deadline + 0.01 < self._sweep.deadline:
            self._sweep.deadline = deadline + 0.01

    async def _read(self, linearizable: bool, fn: Callable[..., T], *args: Any) -> T:
        if linearizable:
            await self._with_quorum("read", self.node.read_barrier)
        reads = self._reads
        if reads is None:
            result: T = await self.node.read_state_machine(fn, *args)
            return result
        req = _Read(fn, args)
        reads.send_nowait(req)
        await req.done.wait()
        if req.ok:
            return req.value  # type: ignore[no-any-return]
        if isinstance(req.value, BaseException):
            raise req.value
        raise Unavailable("the store stopped before the read ran")

    async def _reader(self, *, task_status: trio.TaskStatus[None]) -> None:
        """Run the queued local reads, all those queued at once in one thread call."""
        send, receive = trio.open_memory_channel[_Read](math.inf)
        self._reads = send
        task_status.started()
        try:
            async for first in receive:
                batch = [first]
                while True:
                    try:
                        batch.append(receive.receive_nowait())
                    except trio.WouldBlock:
                        break
                try:
                    await self.node.read_state_machine(_run_reads, batch)
                finally:
                    for r in batch:  # a read the batch did not reach fails (see `_read`)
                        r.done.set()
        finally:
            self._reads = None
            send.close()
            while True:
                try:
                    receive.receive_nowait().done.set()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break

    # ------------------------------------------------------------------ Store
    async def create(self, key: str, value: bytes) -> KeyValue:
        res: WriteResult = await self._write("create", encode_create(key, value))
        assert res.kv is not None
        return res.kv

    async def update(
        self, key: str, value: bytes, *, expected_mod_revision: int | None = None
    ) -> KeyValue:
        res: WriteResult = await self._write(
            "update", encode_put(key, value, expected_mod_revision)
        )
        assert res.kv is not None
        return res.kv

    async def delete(self, key: str, *, expected_mod_revision: int | None = None) -> KeyValue:
        res: WriteResult = await self._write("delete", encode_delete(key, expected_mod_revision))
        assert res.prev_kv is not None
        return res.prev_kv

    async def txn(
        self, compares: list[Compare], success: list[TxnOp], failure: list[TxnOp]
    ) -> TxnResult:
        res: TxnResult = await self._write("txn", encode_txn(compares, success, failure))
        return res

    async def get(
        self, key: str, *, revision: int = 0, linearizable: bool = True
    ) -> KeyValue | None:
        if not linearizable and not revision:
            recent = self.recent.get(key)
            if recent is not UNKNOWN:
                # Cancellable like any read, but no yield: a task switch per local read was
                # a measurable share of the update loop, which yields at its write anyway.
                await trio.lowlevel.checkpoint_if_cancelled()
                return recent  # type: ignore[return-value]
            kv, at = await self._read(False, self._get_at_revision, key)
            self.recent.remember_read(key, kv, at)
            return kv
        return await self._read(linearizable, self.mvcc.get, key, revision)

    def _get_at_revision(self, key: str) -> tuple[KeyValue | None, int]:
        """On the database thread: the key's live value and the revision it was read at."""
        return self.mvcc.get(key), self.mvcc.revision()

    async def list(
        self,
        prefix: str,
        *,
        limit: int = 0,
        continue_token: str | None = None,
        revision: int = 0,
        linearizable: bool = True,
    ) -> ListResult:
        start_after = ""
        if continue_token:
            revision, start_after = decode_continue(continue_token)
            linearizable = False  # the page is pinned to the first page's revision

        def page() -> ListResult:
            r = self.mvcc.range(prefix, start_after=start_after, limit=limit, revision=revision)
            token = encode_continue(r.revision, r.kvs[-1].key) if r.more and r.kvs else None
            return ListResult(r.kvs, r.revision, token, r.count - len(r.kvs) if r.more else 0)

        return await self._read(linearizable, page)

    def watch(
        self, prefix: str, start_revision: int = 0, *, progress_notify: bool = False
    ) -> Watcher:
        return self.hub.watch(prefix, start_revision, progress_notify=progress_notify)

    async def compact(self, revision: int) -> None:
        await self._write("compact", encode_compact(revision))

    async def current_revision(self, *, linearizable: bool = True) -> int:
        return await self._read(linearizable, self.mvcc.revision)

    async def status(self) -> StoreStatus:
        result: StoreStatus = await self.node.read_state_machine(self.mvcc.status)
        return result

    # ------------------------------------------------------------------ upkeep
    async def _auto_compact(self) -> None:
        policy = self.compaction
        if policy.retention <= 0:
            return
        compactor = Compactor(policy, time.monotonic())
        while True:
            await trio.sleep(policy.interval)
            now = time.monotonic()
            target = compactor.due(now, self.mvcc.revision(), self.mvcc.compact_revision())
            if target is None or not self.node.is_leader:
                continue
            try:
                await self.compact(target)
                compactor.compacted(now)
                log.info("compacted history up to revision %d", target)
            except Compacted:
                compactor.compacted(now)  # someone else did (a manual compaction)
            except StoreError as exc:
                log.warning("automatic compaction to %d failed: %s", target, exc)

    async def _checkpoint(self) -> None:
        while True:
            await trio.sleep(self.checkpoint_interval)
            await self.node.read_state_machine(self.mvcc.maybe_checkpoint)
