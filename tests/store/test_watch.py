"""Tests for the watch fan-out (`orchestrator.store.watch`).

`FakeStore` plays both the MVCC store and its apply loop: it keeps the committed history (every
event, plus a compaction point), implements `HistorySource` over it, and publishes each commit to
the hub after appending it to the history — the same order the real apply loop must follow.
Hooks in `events_since` let a test run code while a replay is in flight (before the snapshot is
taken, or after it is taken and before it is returned), which is where a replay can lose or
duplicate live events.

Every response is checked against the history with `check_responses`: a response with revision
R means the watcher now has exactly the matching events with start <= revision <= R.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.store.types import Compacted, Event, EventType, KeyValue
from orchestrator.store.watch import Watcher, WatchHub, WatchResponse

Hook = Callable[[], Awaitable[None]]


def rev(e: Event) -> int:
    return e.kv.mod_revision


class FakeStore:
    """Committed history + compaction point (a `HistorySource`) wired to a `WatchHub`.

    `events_since` answers either like a plain `LIMIT` query (cut at exactly `limit` events,
    possibly inside a revision) or, with `whole_revisions=True`, like `MVCCStore.events_since`
    (whole revisions only: fewer than `limit` when the next revision does not fit, more when the
    first one alone is bigger)."""

    def __init__(self, *, whole_revisions: bool = False, **hub_kwargs: Any) -> None:
        self.whole_revisions = whole_revisions
        self.history: list[Event] = []
        self.rev = 0
        self.compacted = 0
        self.live: dict[str, KeyValue] = {}
        self.reads = 0
        self.before_read: Hook | None = None  # runs before the snapshot is taken
        self.after_read: Hook | None = None  # runs after the snapshot, before it is returned
        self.hub = WatchHub(self, **hub_kwargs)

    # ---- HistorySource
    async def events_since(self, revision: int, prefix: str, limit: int) -> list[Event]:
        self.reads += 1
        await trio.lowlevel.checkpoint()
        if self.before_read is not None:
            await self.before_read()
        out = self._snapshot(revision, prefix, limit)
        if self.after_read is not None:
            await self.after_read()
        return out

    def _snapshot(self, revision: int, prefix: str, limit: int) -> list[Event]:
        if revision <= self.compacted:
            raise Compacted("required revision has been compacted", self.compacted)
        matching = [e for e in self.history if rev(e) >= revision and e.kv.key.startswith(prefix)]
        if not self.whole_revisions:
            return matching[:limit]
        out: list[Event] = []
        i = 0
        while i < len(matching):
            j = i
            while j < len(matching) and rev(matching[j]) == rev(matching[i]):
                j += 1
            if out and len(out) + j - i > limit:
                break
            out += matching[i:j]
            i = j
        return out

    def current_revision(self) -> int:
        return self.rev

    def compact_revision(self) -> int:
        return self.compacted

    # ---- writes (the apply loop)
    def commit(self, ops: list[tuple[str, bytes | None]]) -> int:
        """One revision: puts (value) and deletes (None); deletes of absent keys are no-ops."""
        self.rev += 1
        events: list[Event] = []
        for key, value in ops:
            prev = self.live.get(key)
            if value is None:
                if prev is None:
                    continue
                del self.live[key]
                events.append(Event(EventType.DELETE, KeyValue(key, b"", 0, self.rev, 0), prev))
            else:
                kv = KeyValue(
                    key,
                    value,
                    prev.create_revision if prev else self.rev,
                    self.rev,
                    prev.version + 1 if prev else 1,
                )
                self.live[key] = kv
                events.append(Event(EventType.PUT, kv, prev))
        self.history.extend(events)
        self.hub.publish(events, self.rev)
        return self.rev

    def put(self, key: str, value: bytes = b"v") -> int:
        return self.commit([(key, value)])

    def delete(self, key: str) -> int:
        return self.commit([(key, None)])

    def noop(self) -> int:
        return self.commit([])

    def compact(self, revision: int) -> None:
        self.compacted = max(self.compacted, revision)

    def expected(self, prefix: str, start: int) -> list[Event]:
        return [e for e in self.history if rev(e) >= start and e.kv.key.startswith(prefix)]


def check_responses(responses: list[WatchResponse], expected: list[Event]) -> list[Event]:
    """Check the invariants of a watcher's responses; return the events received."""
    got: list[Event] = []
    last_revision = -1
    seen_revisions: set[int] = set()
    for r in responses:
        revisions = {rev(e) for e in r.events}
        assert not revisions & seen_revisions, "a revision was split across responses"
        seen_revisions |= revisions
        assert r.revision >= last_revision, "response revision went back"
        last_revision = r.revision
        if r.progress or r.canceled:
            assert r.events == []
        got.extend(r.events)
        assert got == [e for e in expected if rev(e) <= r.revision], (
            f"after a response at revision {r.revision} the watcher should have exactly the "
            f"events up to it"
        )
    return got


async def read_until_progress(w: Watcher) -> list[WatchResponse]:
    """Ask for a bookmark and read until it arrives (or the watch ends)."""
    w._hub.notify_progress()
    out: list[WatchResponse] = []
    async for r in w:
        out.append(r)
        if r.progress:
            break
    return out


async def next_response(w: Watcher) -> WatchResponse:
    return await w.__anext__()


# ---------------------------------------------------------------------------- basics
async def test_watch_from_now_receives_live_events() -> None:
    store = FakeStore()
    store.put("/a/old")
    with trio.fail_after(5):
        async with store.hub.watch("/a/") as w:
            assert w.start_revision == 2
            store.put("/a/1")
            store.put("/b/1")
            store.commit([("/a/2", b"x"), ("/a/3", b"y")])
            r = await next_response(w)
            assert [e.kv.key for e in r.events] == ["/a/1", "/a/2", "/a/3"]
            assert r.revision == store.rev == 4
            assert not r.progress
            assert not r.canceled
            responses = [r, *await read_until_progress(w)]
            assert responses[-1] == WatchResponse([], 4, progress=True)
            check_responses(responses, store.expected("/a/", 2))
        assert store.hub.statistics()["watchers"] == 0


async def test_watch_from_ring() -> None:
    """(a) the start revision is still in the in-memory ring: no database read."""
    store = FakeStore(ring_size=100)
    for i in range(10):
        store.put(f"/a/{i}")
    with trio.fail_after(5):
        w = store.hub.watch("/a/", 4)
        store.put("/a/live")
        responses = await read_until_progress(w)
        got = check_responses(responses, store.expected("/a/", 4))
        assert [rev(e) for e in got] == list(range(4, 12))
        assert store.reads == 0
        assert store.hub.statistics()["replays"] == 0
        store.put("/a/later")
        r = await next_response(w)
        assert [e.kv.key for e in r.events] == ["/a/later"]
        w.cancel()


async def test_ring_keeps_to_its_byte_budget() -> None:
    """Big values: the ring keeps fewer events than `ring_size`, dropping whole revisions,
    and a watcher older than the ring replays from the history, in order."""
    store = FakeStore(ring_size=100, ring_bytes=1000)
    for i in range(30):
        store.commit([(f"/a/{i % 4}", bytes([i]) * 100), (f"/b/{i}", b"x")])
        stats = store.hub.statistics()
        assert stats["ring_bytes"] <= 1000
    assert 2 < stats["ring_events"] < 20
    assert stats["ring_events"] % 2 == 0  # whole revisions only
    with trio.fail_after(5):
        w = store.hub.watch("/a/", 2)
        responses = await read_until_progress(w)
        check_responses(responses, store.expected("/a/", 2))
        assert store.reads > 0
        w.cancel()


@pytest.mark.parametrize("whole_revisions", [False, True])
async def test_replay_from_durable_history_in_batches(whole_revisions: bool) -> None:
    """(b) older than the ring: replayed from the history in `replay_batch` batches, then live."""
    store = FakeStore(ring_size=4, replay_batch=3, whole_revisions=whole_revisions)
    for i in range(20):
        store.put(f"/a/{i % 5}")
    stats = store.hub.statistics()
    assert stats["ring_start_revision"] == 17
    assert stats["ring_end_revision"] == 20
    with trio.fail_after(5):
        w = store.hub.watch("/a/", 2)
        responses = await read_until_progress(w)
        got = check_responses(responses, store.expected("/a/", 2))
        assert len(got) == 19
        assert all(len(r.events) <= 3 for r in responses)
        # revisions 2..17 from the history: a full batch of 3 holds back its last revision (it
        # might be cut short), so 2 per read; then 18..20 from the ring
        assert store.reads == 8
        assert store.hub.statistics()["replays"] == 1
        store.put("/a/live")
        r = await next_response(w)
        assert [rev(e) for e in r.events] == [21]
        w.cancel()


@pytest.mark.parametrize("whole_revisions", [False, True])
async def test_replay_races_with_concurrent_publishes(whole_revisions: bool) -> None:
    """Events published while `events_since` is awaited (before or after its snapshot) are
    delivered exactly once, even when the ring rolls over during the replay."""
    store = FakeStore(ring_size=2, replay_batch=2, whole_revisions=whole_revisions)
    for i in range(10):
        store.put(f"/a/{i}")
    n = 0

    async def publish_some() -> None:
        nonlocal n
        if n < 30:
            for _ in range(2):
                n += 1
                store.put(f"/a/r{n}")
                store.put(f"/b/r{n}")

    store.before_read = publish_some
    store.after_read = publish_some
    with trio.fail_after(5):
        w = store.hub.watch("/a/", 1)
        responses = await read_until_progress(w)
        got = check_responses(responses, store.expected("/a/", 1))
        assert len(got) == 10 + 30
        assert store.reads > 5
        w.cancel()


@pytest.mark.parametrize("whole_revisions", [False, True])
async def test_replay_with_nothing_matching_while_matches_are_published(
    whole_revisions: bool,
) -> None:
    """An empty history answer only proves 'nothing up to the revision the hub had published
    before the read': a matching event published after the snapshot was taken (and before the
    answer came back) must still arrive, although the ring has already moved past it."""
    store = FakeStore(ring_size=1, whole_revisions=whole_revisions)
    for i in range(10):
        store.put(f"/b/{i}")
    done = False

    async def publish_after_snapshot() -> None:
        nonlocal done
        if not done:
            done = True
            store.put("/a/x")
            store.put("/b/roll")  # the ring now starts after /a/x

    store.after_read = publish_after_snapshot
    with trio.fail_after(5):
        w = store.hub.watch("/a/", 1)
        responses = await read_until_progress(w)
        got = check_responses(responses, store.expected("/a/", 1))
        assert [e.kv.key for e in got] == ["/a/x"]
        w.cancel()


async def test_ring_catch_up_never_splits_a_revision() -> None:
    store = FakeStore(ring_size=100, replay_batch=3)
    for i in range(6):
        store.commit([(f"/a/{i}x", b"1"), (f"/a/{i}y", b"2")])
    with trio.fail_after(5):
        w = store.hub.watch("/a/", 1)
        responses = await read_until_progress(w)
        assert len(check_responses(responses, store.expected("/a/", 1))) == 12
        assert [len(r.events) for r in responses] == [4, 4, 4, 0]
        assert store.reads == 0
        w.cancel()


@pytest.mark.parametrize("whole_revisions", [False, True])
async def test_replay_batch_boundary_inside_a_revision(whole_revisions: bool) -> None:
    """A full batch may end in the middle of a revision (one txn = several events at one
    revision), or stop short of `limit` at a revision boundary with more to come; a revision
    bigger than the batch is read whole. Responses never split a revision."""
    store = FakeStore(ring_size=0, replay_batch=3, whole_revisions=whole_revisions)
    store.commit([("/a/1", b"1"), ("/a/2", b"2")])
    store.commit([("/a/3", b"3"), ("/a/4", b"4")])
    store.commit([(f"/a/big{i}", b"x") for i in range(7)])
    store.commit([("/a/5", b"5"), ("/b/skip", b"s"), ("/a/6", b"6")])
    with trio.fail_after(5):
        w = store.hub.watch("/a/", 1)
        responses = await read_until_progress(w)
        check_responses(responses, store.expected("/a/", 1))
        assert store.reads >= 4  # the 7-event revision needed a wider read
        w.cancel()


async def test_future_revision_waits_and_never_returns_older_events() -> None:
    """(c) etcd #20221: a watch on a future revision only ever gets revisions >= its start."""
    store = FakeStore()
    store.put("/a/0")
    with trio.fail_after(5):
        w = store.hub.watch("/a/", 5)
        r = (await read_until_progress(w))[-1]
        assert r == WatchResponse([], 1, progress=True)  # bookmark at the store's revision
        store.put("/a/2")
        store.put("/a/3")
        store.put("/a/4")
        store.commit([("/a/5", b"x"), ("/a/5b", b"y")])
        store.put("/a/6")
        responses = await read_until_progress(w)
        got = check_responses(responses, store.expected("/a/", 5))
        assert [e.kv.key for e in got] == ["/a/5", "/a/5b", "/a/6"]
        assert responses[-1].revision == 6
        w.cancel()


async def test_future_revision_reached_with_a_noop() -> None:
    store = FakeStore()
    with trio.fail_after(5):
        w = store.hub.watch("", 2)
        store.noop()  # revision 1
        store.noop()  # revision 2, no events
        store.put("/x")  # revision 3
        responses = await read_until_progress(w)
        assert [rev(e) for e in check_responses(responses, store.expected("", 2))] == [3]
        w.cancel()


async def test_prev_kv_can_be_left_out() -> None:
    store = FakeStore()
    store.put("/a", b"1")
    with trio.fail_after(5):
        with_prev = store.hub.watch("/a")
        without = store.hub.watch("/a", prev_kv=False)
        store.put("/a", b"2")
        r1 = await next_response(with_prev)
        r2 = await next_response(without)
        assert r1.events[0].prev_kv is not None
        assert r1.events[0].prev_kv.value == b"1"
        assert r2.events[0].prev_kv is None
        assert r2.events[0].kv == r1.events[0].kv
        store.hub.close()


# ---------------------------------------------------------------------------- compaction
async def test_start_at_or_below_compaction_is_canceled() -> None:
    store = FakeStore(ring_size=100)
    for i in range(10):
        store.put(f"/a/{i}")
    store.compact(6)
    with trio.fail_after(5):
        for start in (1, 6):
            w = store.hub.watch("/a/", start)
            responses = [r async for r in w]
            assert len(responses) == 1
            r = responses[0]
            assert r.canceled
            assert r.cancel_reason == "compacted"
            assert r.compact_revision == 6
            assert r.events == []
        # just above the compaction revision is fine, even though the ring covers less
        w = store.hub.watch("/a/", 7)
        got = check_responses(await read_until_progress(w), store.expected("/a/", 7))
        assert len(got) == 4
        w.cancel()
    assert store.hub.statistics()["watchers"] == 0


async def test_compaction_during_replay() -> None:
    """The history is compacted while `events_since` is in flight: `Compacted` from the source
    cancels the watcher (etcd #18089: never silently skip the compacted deletes)."""
    store = FakeStore(ring_size=2, replay_batch=100)
    for i in range(10):
        store.put(f"/a/{i}")
        store.delete(f"/a/{i}")

    async def compact() -> None:
        store.compact(15)

    store.before_read = compact
    with trio.fail_after(5):
        w = store.hub.watch("/a/", 3)
        responses = [r async for r in w]
        assert responses == [
            WatchResponse([], 2, canceled=True, cancel_reason="compacted", compact_revision=15)
        ]
    assert store.hub.statistics()["watchers"] == 0


@pytest.mark.parametrize("whole_revisions", [False, True])
async def test_compaction_between_replay_batches(whole_revisions: bool) -> None:
    store = FakeStore(ring_size=2, replay_batch=4, whole_revisions=whole_revisions)
    for i in range(20):
        store.put(f"/a/{i}")
    with trio.fail_after(5):
        w = store.hub.watch("/a/", 1)
        first = await next_response(w)
        assert [rev(e) for e in first.events] == [1, 2, 3]  # 4 held back (full batch)
        store.compact(6)  # revisions 4 and 5 are still needed: gone
        responses = [first, *[r async for r in w]]
        check_responses(responses, store.expected("/a/", 1))
        last = responses[-1]
        assert last.canceled
        assert last.cancel_reason == "compacted"
        assert last.compact_revision == 6
        assert last.revision == 3


async def test_compaction_does_not_affect_caught_up_watchers() -> None:
    store = FakeStore(ring_size=2, replay_batch=4)
    for i in range(10):
        store.put(f"/a/{i}")
    with trio.fail_after(5):
        w = store.hub.watch("/a/", 1)
        await read_until_progress(w)
        store.compact(10)
        store.put("/a/after")
        r = await next_response(w)
        assert [rev(e) for e in r.events] == [11]
        assert not r.canceled
        w.cancel()


# ---------------------------------------------------------------------------- slow consumers
async def test_slow_consumer_is_canceled_not_buffered() -> None:
    store = FakeStore(buffer_limit=5)
    with trio.fail_after(5):
        slow = store.hub.watch("/a/")
        fast = store.hub.watch("/a/")
        for i in range(5):
            store.put(f"/a/{i}")
        assert store.hub.statistics()["buffered_events"] == 10
        assert len((await next_response(fast)).events) == 5
        store.put("/a/5")
        assert store.hub.statistics()["buffered_events"] == 1  # slow's buffer was dropped
        r = await next_response(slow)
        assert r == WatchResponse(
            [],
            0,
            canceled=True,
            cancel_reason="watcher too slow: 6 events behind; re-list and watch again",
        )
        with pytest.raises(StopAsyncIteration):
            await next_response(slow)
        stats = store.hub.statistics()
        assert stats["cancelled_slow"] == 1
        assert stats["watchers"] == 1
        # the fast one is unaffected
        r = await next_response(fast)
        assert [e.kv.key for e in r.events] == ["/a/5"]
        fast.cancel()


async def test_slow_reader_catching_up_is_not_canceled() -> None:
    """A watcher replaying history buffers nothing, so reading slowly while the store keeps
    writing does not cancel it; it catches up batch by batch."""
    store = FakeStore(ring_size=3, buffer_limit=2, replay_batch=2)
    for i in range(10):
        store.put(f"/a/{i}")
    with trio.fail_after(5):
        w = store.hub.watch("/a/", 1)
        responses: list[WatchResponse] = []
        for i in range(10):
            responses.append(await next_response(w))
            store.put(f"/a/more{i}")
        responses += await read_until_progress(w)
        assert len(check_responses(responses, store.expected("/a/", 1))) == 20
        assert store.hub.statistics()["cancelled_slow"] == 0
        w.cancel()


# ---------------------------------------------------------------------------- fan-out
async def test_prefix_filtering_and_many_watchers() -> None:
    store = FakeStore()
    prefixes = ["", "/p/", "/p/1", "/p/10", "/p/1/", "/q/", "/p/10/x", "/p/100/"]
    prefixes += [f"/n/{i}/" for i in range(300)]
    with trio.fail_after(5):
        watchers = [(p, store.hub.watch(p)) for p in prefixes]
        watchers.append(("/p/1", store.hub.watch("/p/1")))  # two watchers, one prefix
        assert store.hub.statistics()["prefixes"] == len(prefixes)
        for key in ["/p/1/a", "/p/10/x", "/p/10/y", "/p/2", "/q/z", "/n/7/k", "/n/77/k", "/r"]:
            store.put(key)
        store.delete("/p/10/x")
        for p, w in watchers:
            responses = await read_until_progress(w)
            got = check_responses(responses, store.expected(p, 1))
            assert all(e.kv.key.startswith(p) for e in got)
        store.hub.close()


async def test_txn_events_keep_publish_order() -> None:
    store = FakeStore()
    with trio.fail_after(5):
        w = store.hub.watch("/a/")
        store.commit([("/a/z", b"1"), ("/a/b", b"2"), ("/a/m", b"3")])
        r = await next_response(w)
        assert [e.kv.key for e in r.events] == ["/a/z", "/a/b", "/a/m"]
        w.cancel()


def test_publish_rejects_going_back_in_time() -> None:
    store = FakeStore()
    store.put("/a")
    kv = KeyValue("/a", b"", 1, 1, 1)
    with pytest.raises(ValueError, match="out of order"):
        store.hub.publish([Event(EventType.PUT, kv)], 2)
    with pytest.raises(ValueError, match="going back"):
        store.hub.publish([], 0)
    with pytest.raises(ValueError, match="start_revision"):
        store.hub.watch("", -1)


def test_ring_is_bounded() -> None:
    store = FakeStore(ring_size=10)
    for i in range(5000):
        store.commit([(f"/k{i}", b"a"), (f"/j{i}", b"b"), (f"/l{i}", b"c")])
    stats = store.hub.statistics()
    assert stats["ring_events"] <= 10
    assert stats["ring_end_revision"] == 5000
    assert stats["ring_start_revision"] == 5000 - stats["ring_events"] // 3 + 1
    assert len(store.hub._ring_revs) <= 2 * 1024 + 10


# ---------------------------------------------------------------------------- progress
async def test_progress_comes_after_pending_events() -> None:
    store = FakeStore()
    with trio.fail_after(5):
        w = store.hub.watch("/a/")
        store.put("/a/1")
        store.put("/b/1")
        store.hub.notify_progress()
        store.hub.notify_progress()  # coalesced
        assert await next_response(w) == WatchResponse([store.history[0]], 2)
        assert await next_response(w) == WatchResponse([], 2, progress=True)
        store.put("/b/2")
        store.hub.notify_progress()
        assert await next_response(w) == WatchResponse([], 3, progress=True)
        w.cancel()


async def test_progress_waits_until_a_replaying_watcher_caught_up() -> None:
    """A bookmark means 'everything up to here was delivered': a watcher still replaying
    history only gets it after the last event, never ahead of events it has not received."""
    store = FakeStore(ring_size=1, replay_batch=2)
    for i in range(7):
        store.put(f"/a/{i}")
    with trio.fail_after(5):
        w = store.hub.watch("/a/", 1, progress_notify=True)
        store.hub.notify_progress()
        responses = []
        async for r in w:
            responses.append(r)
            if r.progress:
                break
        got = check_responses(responses, store.expected("/a/", 1))
        assert len(got) == 7
        assert not any(r.progress for r in responses[:-1])
        assert responses[-1].progress
        assert responses[-1].revision == 7
        w.cancel()


async def test_periodic_progress_notifications(autojump_clock: trio.testing.MockClock) -> None:
    store = FakeStore(progress_interval=5)
    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            await nursery.start(store.hub.run)
            t0 = trio.current_time()
            notified = store.hub.watch("/a/", progress_notify=True)
            quiet = store.hub.watch("/a/")
            r = await next_response(notified)
            assert r == WatchResponse([], 0, progress=True)
            assert trio.current_time() - t0 == pytest.approx(5)
            store.put("/a/1")
            assert (await next_response(notified)).events == store.history
            assert await next_response(notified) == WatchResponse([], 1, progress=True)
            assert trio.current_time() - t0 == pytest.approx(10)
            assert (await next_response(quiet)).events == store.history
            with trio.move_on_after(60) as scope:  # nothing more for a watcher without it
                await next_response(quiet)
            assert scope.cancelled_caught
            store.hub.close("bye")
            r = await next_response(notified)
            assert r.canceled
            assert r.cancel_reason == "bye"
        # run() returned by itself once the hub closed


# ---------------------------------------------------------------------------- lifecycle
async def test_close_cancels_every_watcher() -> None:
    store = FakeStore(ring_size=1, replay_batch=1)
    for i in range(5):
        store.put(f"/a/{i}")
    with trio.fail_after(5):
        live = store.hub.watch("/a/")
        replaying = store.hub.watch("/a/", 1)
        assert len((await next_response(replaying)).events) == 1
        results: dict[str, list[WatchResponse]] = {}

        async def consume(name: str, w: Watcher) -> None:
            results[name] = [r async for r in w]

        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume, "live", live)
            await trio.testing.wait_all_tasks_blocked()
            store.hub.close("server shutting down")
            nursery.start_soon(consume, "replaying", replaying)
        cancel = WatchResponse([], 5, canceled=True, cancel_reason="server shutting down")
        assert results["live"] == [cancel]
        assert results["replaying"] == [
            WatchResponse([], 1, canceled=True, cancel_reason="server shutting down")
        ]
        after = store.hub.watch("/a/")
        assert [r async for r in after] == [cancel]
        store.put("/a/ignored")
        assert store.hub.statistics()["watchers"] == 0


async def test_close_while_replay_in_flight() -> None:
    store = FakeStore(ring_size=1)
    for i in range(5):
        store.put(f"/a/{i}")

    async def close() -> None:
        store.hub.close("closing")

    store.after_read = close
    with trio.fail_after(5):
        w = store.hub.watch("/a/", 1)
        assert [r async for r in w] == [
            WatchResponse([], 0, canceled=True, cancel_reason="closing")
        ]


async def test_cancelled_consumer_task_removes_the_watcher() -> None:
    store = FakeStore()
    with trio.fail_after(5):
        w = store.hub.watch("/a/")
        async with trio.open_nursery() as nursery:

            async def consume() -> None:
                async for _ in w:
                    pass  # pragma: no cover

            nursery.start_soon(consume)
            await trio.testing.wait_all_tasks_blocked()
            assert store.hub.statistics()["watchers"] == 1
            nursery.cancel_scope.cancel()
        assert store.hub.statistics()["watchers"] == 0
        store.put("/a/x")
        with pytest.raises(StopAsyncIteration):
            await next_response(w)


async def test_consumer_cancelled_during_replay() -> None:
    store = FakeStore(ring_size=1)
    for i in range(5):
        store.put(f"/a/{i}")
    gate = trio.Event()

    async def block() -> None:
        await gate.wait()

    store.before_read = block
    with trio.fail_after(5):
        w = store.hub.watch("/a/", 1)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(next_response, w)
            await trio.testing.wait_all_tasks_blocked()
            assert store.hub.statistics()["unsynced"] == 1
            nursery.cancel_scope.cancel()
        assert store.hub.statistics()["watchers"] == 0
        with pytest.raises(StopAsyncIteration):
            await next_response(w)


async def test_context_manager_and_cancel_from_another_task() -> None:
    store = FakeStore()
    with trio.fail_after(5):
        async with store.hub.watch("/a/") as w:
            assert store.hub.statistics()["watchers"] == 1
        assert store.hub.statistics()["watchers"] == 0

        w = store.hub.watch("/a/")
        got: list[WatchResponse] = []

        async def consume() -> None:
            got.extend([r async for r in w])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume)
            await trio.testing.wait_all_tasks_blocked()
            w.cancel()
        assert got == []
        assert store.hub.statistics()["watchers"] == 0


async def test_one_reader_at_a_time() -> None:
    store = FakeStore()
    with trio.fail_after(5):
        w = store.hub.watch("/a/")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(next_response, w)
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(trio.BusyResourceError):
                await next_response(w)
            store.put("/a/1")
        w.cancel()


# ---------------------------------------------------------------------------- property test
KEYS = ["/a/1", "/a/2", "/ab", "/b/1", "x"]
PREFIXES = ["", "/a/", "/a", "/b/", "/a/1", "zzz"]


class GatedStore(FakeStore):
    """`events_since` stops twice (before and after its snapshot) until the test lets it go,
    so publishes, compactions and reads interleave with replays in every order."""

    def __init__(self, *, whole_revisions: bool, **hub_kwargs: Any) -> None:
        super().__init__(whole_revisions=whole_revisions, **hub_kwargs)
        self.gates: list[trio.Event] = []
        self.auto = False

    async def _gate(self) -> None:
        if not self.auto:
            gate = trio.Event()
            self.gates.append(gate)
            await gate.wait()

    async def events_since(self, revision: int, prefix: str, limit: int) -> list[Event]:
        await self._gate()
        out = self._snapshot(revision, prefix, limit)
        await self._gate()
        return out


@dataclass
class Tracked:
    w: Watcher
    prefix: str
    credits: trio.MemorySendChannel[None]
    inbox: trio.MemoryReceiveChannel[None]
    responses: list[WatchResponse] = field(default_factory=list)
    unlimited: bool = False
    owner_canceled: bool = False
    done: bool = False


# An operation is (kind, a, b); the kinds are weighted towards writes and reads.
KINDS = (
    ["put"] * 6
    + ["txn"] * 2
    + ["delete"] * 2
    + ["noop", "compact", "progress", "cancel"]
    + ["watch"] * 3
    + ["read"] * 6
    + ["db"] * 4
)
ops_strategy = st.lists(
    st.tuples(st.sampled_from(KINDS), st.integers(0, 63), st.integers(0, 63)),
    min_size=20,
    max_size=100,
)


async def run_scenario(
    ring_size: int,
    buffer_limit: int,
    replay_batch: int,
    whole_revisions: bool,
    prefill: int,
    ops: list[tuple[str, int, int]],
) -> tuple[GatedStore, list[Tracked]]:
    store = GatedStore(
        ring_size=ring_size,
        buffer_limit=buffer_limit,
        replay_batch=replay_batch,
        whole_revisions=whole_revisions,
    )
    hub = store.hub
    tracked: list[Tracked] = []

    async def consume(t: Tracked) -> None:
        while True:
            if not t.unlimited:
                await t.inbox.receive()
            try:
                r = await t.w.__anext__()
            except StopAsyncIteration:
                break
            t.responses.append(r)
            if r.canceled or (t.unlimited and r.progress and r.revision == store.rev):
                break
        t.done = True

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            for _ in range(prefill):
                store.put(KEYS[store.rev % len(KEYS)])
            for kind, a, b in ops:
                if kind == "put":
                    store.put(KEYS[a % len(KEYS)], str(store.rev).encode())
                elif kind == "delete":
                    store.delete(KEYS[a % len(KEYS)])
                elif kind == "txn":  # bit i of a: write KEYS[i]; bit i of b: as a delete
                    store.commit(
                        [
                            (k, None if b >> i & 1 else b"t")
                            for i, k in enumerate(KEYS)
                            if a >> i & 1
                        ]
                    )
                elif kind == "noop":
                    store.noop()
                elif kind == "watch":
                    start = 0 if b == 0 else 1 + (b - 1) % (store.rev + 3)
                    prefix = PREFIXES[a % len(PREFIXES)]
                    send, recv = trio.open_memory_channel[None](float("inf"))
                    t = Tracked(hub.watch(prefix, start), prefix, send, recv)
                    tracked.append(t)
                    nursery.start_soon(consume, t)
                elif kind == "read" and tracked:
                    t = tracked[a % len(tracked)]
                    for _ in range(1 + b % 3):
                        t.credits.send_nowait(None)
                elif kind == "db" and store.gates:
                    store.gates.pop(a % len(store.gates)).set()
                elif kind == "compact":
                    store.compact(min(store.rev, store.compacted + a % 6))
                elif kind == "progress":
                    hub.notify_progress()
                elif kind == "cancel" and tracked and b % 4 == 0:
                    t = tracked[a % len(tracked)]
                    t.owner_canceled = True  # it may end without any response
                    t.w.cancel()
                await trio.testing.wait_all_tasks_blocked()
            # Finale: let every reader and every database read run freely until caught up.
            store.auto = True
            for t in tracked:
                t.unlimited = True
                t.credits.send_nowait(None)
            hub.notify_progress()
            await trio.testing.wait_all_tasks_blocked()
            while store.gates:
                store.gates.pop(0).set()
                await trio.testing.wait_all_tasks_blocked()
    return store, tracked


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ring_size=st.integers(0, 6),
    buffer_limit=st.integers(1, 6),
    replay_batch=st.integers(1, 4),
    whole_revisions=st.booleans(),
    prefill=st.integers(0, 12),
    ops=ops_strategy,
)
def test_random_interleavings_deliver_exact_history(
    ring_size: int,
    buffer_limit: int,
    replay_batch: int,
    whole_revisions: bool,
    prefill: int,
    ops: list[tuple[str, int, int]],
) -> None:
    store, tracked = trio.run(
        run_scenario, ring_size, buffer_limit, replay_batch, whole_revisions, prefill, ops
    )
    active = 0
    for t in tracked:
        assert t.done
        expected = store.expected(t.prefix, t.w.start_revision)
        got = check_responses(t.responses, expected)
        last = t.responses[-1] if t.responses else None
        if last is not None and last.canceled:
            if last.cancel_reason == "compacted":
                assert last.compact_revision >= last.revision + 1
                assert last.compact_revision <= store.compacted
            else:
                assert last.cancel_reason.startswith("watcher too slow:")
        elif not t.owner_canceled:
            assert got == expected
            assert last is not None
            assert last.progress
            assert last.revision == store.rev
            active += 1
    stats = store.hub.statistics()
    assert stats["watchers"] == active
    assert stats["buffered_events"] == 0
    assert stats["ring_events"] <= ring_size
