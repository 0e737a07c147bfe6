"""The work queue: the pure core (unit tests, a Hypothesis model test) and the trio driver."""

from __future__ import annotations

import gc
import math
from collections.abc import Hashable

import pytest
import trio
import trio.testing
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from orchestrator.controllers.runtime.ratelimit import (
    ItemExponential,
    ItemFastSlow,
    TokenBucket,
)
from orchestrator.controllers.runtime.workqueue import (
    QueueCore,
    QueueShutDown,
    QueueStatistics,
    WorkQueue,
)
from orchestrator.metrics import Registry


def drain_core(core: QueueCore[str], now: float = 0.0) -> list[str]:
    out = []
    while len(core):
        item = core.get(now)
        out.append(item)
        core.done(item, now)
    return out


# ---- core: the basic contract ----------------------------------------------------------------


def test_fifo_and_dedup() -> None:
    core: QueueCore[str] = QueueCore()
    assert core.add("a", 0.0)
    assert core.add("b", 0.0)
    assert not core.add("a", 0.0)  # merged
    assert core.add("c", 0.0)
    assert len(core) == 3
    assert drain_core(core) == ["a", "b", "c"]
    assert core.statistics() == QueueStatistics(
        depth=0, processing=0, waiting=0, adds=3, retries=0, shutting_down=False
    )
    core.check_invariants()


def test_stingy_readd_while_processing_is_deferred_until_done() -> None:
    core: QueueCore[str] = QueueCore()
    core.add("a", 0.0)
    assert core.get(0.0) == "a"
    assert not core.add("a", 1.0)  # being processed: not handed out again
    assert not core.add("a", 2.0)  # and merged
    assert len(core) == 0
    core.check_invariants()
    assert core.done("a", 3.0)  # re-queued
    assert len(core) == 1
    assert core.get(3.0) == "a"
    assert not core.done("a", 4.0)
    assert len(core) == 0
    assert core.adds == 2
    core.check_invariants()


def test_readd_goes_to_the_back_of_the_queue() -> None:
    core: QueueCore[str] = QueueCore()
    core.add("a", 0.0)
    core.add("b", 0.0)
    item = core.get(0.0)
    core.add("a", 0.0)
    core.add("c", 0.0)
    core.done(item, 0.0)
    assert drain_core(core) == ["b", "c", "a"]


def test_get_on_empty_and_done_without_get_are_errors() -> None:
    core: QueueCore[str] = QueueCore()
    with pytest.raises(IndexError, match="check len"):
        core.get(0.0)
    core.add("a", 0.0)
    with pytest.raises(ValueError, match=r"'a'.*not being processed"):
        core.done("a", 0.0)
    core.get(0.0)
    core.done("a", 0.0)
    with pytest.raises(ValueError, match="exactly once"):
        core.done("a", 0.0)


def test_add_after_releases_in_ready_order() -> None:
    core: QueueCore[str] = QueueCore()
    assert not core.add_after("late", 5.0, 0.0)
    assert not core.add_after("early", 1.0, 0.0)
    assert not core.add_after("tie", 1.0, 0.0)
    assert core.next_ready_at() == 1.0
    assert core.release_due(0.999) == 0
    assert core.release_due(1.0) == 2
    assert core.next_ready_at() == 5.0
    assert drain_core(core) == ["early", "tie"]
    assert core.release_due(100.0) == 1
    assert core.next_ready_at() is None
    assert drain_core(core) == ["late"]
    assert core.retries == 3


def test_add_after_only_moves_earlier() -> None:
    core: QueueCore[str] = QueueCore()
    core.add_after("a", 10.0, 0.0)
    core.add_after("a", 20.0, 0.0)  # later: ignored
    assert core.next_ready_at() == 10.0
    core.add_after("a", 3.0, 1.0)  # earlier (4.0): moves
    assert core.next_ready_at() == 4.0
    assert core.statistics().waiting == 1
    core.check_invariants()
    assert core.release_due(4.0) == 1
    assert core.next_ready_at() is None  # the stale 10.0 entry is gone with it
    assert core.release_due(100.0) == 0
    assert drain_core(core) == ["a"]


def test_add_after_non_positive_delay_is_add() -> None:
    core: QueueCore[str] = QueueCore()
    assert core.add_after("a", 0.0, 0.0)
    assert core.add_after("b", -1.0, 0.0)
    assert core.next_ready_at() is None
    assert core.retries == 2
    assert drain_core(core) == ["a", "b"]


def test_waiting_item_that_is_already_dirty_is_merged_when_due() -> None:
    core: QueueCore[str] = QueueCore()
    core.add_after("a", 1.0, 0.0)
    core.add("a", 0.5)
    assert core.release_due(1.0) == 0  # already queued
    assert drain_core(core) == ["a"]
    assert core.adds == 1


def test_heap_is_compacted_after_many_moves() -> None:
    core: QueueCore[str] = QueueCore()
    for i in range(1000):
        core.add_after("a", 1000.0 - i, 0.0)
    assert len(core._heap) <= 2 * 1 + 65
    assert core.next_ready_at() == 1.0
    core.check_invariants()


def test_add_rate_limited_uses_the_limiter() -> None:
    core: QueueCore[str] = QueueCore(ItemExponential(1.0, 8.0))
    for expected in (1.0, 2.0, 4.0, 8.0, 8.0):
        core.add_rate_limited("a", 0.0)
        assert core.next_ready_at() == expected
        core.release_due(expected)
        assert drain_core(core, expected) == ["a"]
    assert core.num_requeues("a") == 5
    core.forget("a")
    assert core.num_requeues("a") == 0


def test_shutdown_refuses_adds_drops_waiting_and_keeps_queued() -> None:
    core: QueueCore[str] = QueueCore()
    core.add("a", 0.0)
    core.add("b", 0.0)
    core.get(0.0)  # a is processing
    core.add("a", 0.0)  # dirty again
    core.add_after("w", 1.0, 0.0)
    core.shutdown()
    assert core.shutting_down
    assert not core.add("c", 0.0)
    assert not core.add_after("d", 1.0, 0.0)
    assert not core.add_rate_limited("e", 0.0)
    assert core.num_requeues("e") == 0  # the limiter was not consulted
    assert core.next_ready_at() is None
    assert core.release_due(10.0) == 0
    assert core.get(0.0) == "b"
    assert core.done("a", 0.0)  # re-add from before the shutdown still counts
    core.done("b", 0.0)
    assert drain_core(core) == ["a"]
    assert core.statistics().shutting_down


def test_processing_times() -> None:
    core: QueueCore[str] = QueueCore()
    core.add("a", 0.0)
    core.add("b", 0.0)
    assert core.longest_running(5.0) == 0.0
    assert core.unfinished_work(5.0) == 0.0
    core.get(1.0)
    core.get(3.0)
    assert core.is_processing("a")
    assert core.longest_running(5.0) == 4.0
    assert core.unfinished_work(5.0) == 6.0
    assert core.processing_count == 2


# ---- core against a model (Hypothesis) -------------------------------------------------------

ITEMS = st.sampled_from(["a", "b", "c", "d", "e"])


class QueueAgainstModel(RuleBasedStateMachine):
    """The core against a deliberately naive model: lists and sets, sorted on every release.

    Checks stingy (never handed out while held), dedup (one queued copy), fairness (exact FIFO
    order, delayed items released by ready time then scheduling order) and no loss (an item
    added after its last hand-out is handed out again once everything is drained).
    """

    def __init__(self) -> None:
        super().__init__()
        self.core: QueueCore[str] = QueueCore(ItemFastSlow(1.0, 3.0, 2))
        self.now = 0.0
        self.queue: list[str] = []
        self.dirty: set[str] = set()
        self.processing: set[str] = set()
        self.waiting: dict[str, tuple[float, int]] = {}
        self.seq = 0
        self.failures: dict[str, int] = {}
        self.shut = False
        # Items added (or re-added) since they were last handed out: must not be lost.
        self.owed: set[str] = set()

    def _model_add(self, item: str) -> None:
        if self.shut or item in self.dirty:
            return
        self.dirty.add(item)
        self.owed.add(item)
        if item not in self.processing:
            self.queue.append(item)

    def _model_add_after(self, item: str, delay: float) -> None:
        if self.shut:
            return
        if delay <= 0:
            self._model_add(item)
            return
        at = self.now + delay
        if item in self.waiting and self.waiting[item][0] <= at:
            return
        self.seq += 1
        self.waiting[item] = (at, self.seq)

    def _model_release(self) -> None:
        due = sorted((v, k) for k, v in self.waiting.items() if v[0] <= self.now)
        for _, item in due:
            del self.waiting[item]
            self._model_add(item)

    @rule(item=ITEMS)
    def add(self, item: str) -> None:
        self.core.add(item, self.now)
        self._model_add(item)

    @rule(item=ITEMS, delay=st.sampled_from([-1.0, 0.0, 0.5, 1.0, 2.0, 5.0]))
    def add_after(self, item: str, delay: float) -> None:
        self.core.add_after(item, delay, self.now)
        self._model_add_after(item, delay)

    @rule(item=ITEMS)
    def add_rate_limited(self, item: str) -> None:
        self.core.add_rate_limited(item, self.now)
        if not self.shut:
            n = self.failures[item] = self.failures.get(item, 0) + 1
            self._model_add_after(item, 1.0 if n <= 2 else 3.0)

    @rule(item=ITEMS)
    def forget(self, item: str) -> None:
        self.core.forget(item)
        self.failures.pop(item, None)

    @rule(dt=st.sampled_from([0.0, 0.5, 1.0, 3.0]))
    def tick(self, dt: float) -> None:
        self.now += dt
        self.core.release_due(self.now)
        self._model_release()

    @precondition(lambda self: bool(self.queue))
    @rule()
    def get(self) -> None:
        item = self.core.get(self.now)
        assert item == self.queue.pop(0), "not FIFO"
        assert item not in self.processing, "handed out twice (not stingy)"
        self.dirty.discard(item)
        self.processing.add(item)
        self.owed.discard(item)

    @precondition(lambda self: bool(self.processing))
    @rule(data=st.data())
    def done(self, data: st.DataObject) -> None:
        item = data.draw(st.sampled_from(sorted(self.processing)))
        self.core.done(item, self.now)
        self.processing.discard(item)
        if item in self.dirty:
            self.queue.append(item)

    @rule()
    def shutdown(self) -> None:
        self.core.shutdown()
        self.shut = True
        self.waiting.clear()

    @invariant()
    def agrees_with_model(self) -> None:
        self.core.check_invariants()
        assert list(self.core._queue) == self.queue
        assert set(self.core._dirty) == self.dirty
        assert set(self.core._processing) == self.processing
        assert self.core._waiting == self.waiting
        assert self.core.next_ready_at() == min((v[0] for v in self.waiting.values()), default=None)
        for item in "abcde":
            assert self.core.num_requeues(item) == self.failures.get(item, 0)

    def teardown(self) -> None:
        # No loss: finish every held item, let every delay expire, drain; everything owed comes out.
        for item in sorted(self.processing):
            self.core.done(item, self.now)
        self.core.release_due(math.inf)
        handed_out = set()
        while len(self.core):
            item = self.core.get(self.now)
            handed_out.add(item)
            self.core.done(item, self.now)
        assert self.owed <= handed_out, f"lost {self.owed - handed_out}"


TestQueueAgainstModel = QueueAgainstModel.TestCase
TestQueueAgainstModel.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)


# ---- the trio driver on a mock clock ---------------------------------------------------------


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


async def test_add_then_get_and_get_always_checkpoints(
    autojump_clock: trio.testing.MockClock,
) -> None:
    q: WorkQueue[str] = WorkQueue("t")
    q.add("a")
    q.add("a")
    assert len(q) == 1
    assert q.depth == 1
    with trio.testing.assert_checkpoints():
        assert await q.get() == "a"
    q.done("a")
    with pytest.raises(trio.WouldBlock):
        q.get_nowait()


async def test_blocked_getter_is_woken_by_add(autojump_clock: trio.testing.MockClock) -> None:
    q: WorkQueue[str] = WorkQueue("t")
    got: list[str] = []

    async def worker() -> None:
        got.append(await q.get())

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker)
            await trio.testing.wait_all_tasks_blocked()
            assert q.statistics().tasks_waiting == 1
            q.add("x")
    assert got == ["x"]


async def test_cancelled_getter_loses_nothing(autojump_clock: trio.testing.MockClock) -> None:
    q: WorkQueue[str] = WorkQueue("t")
    with trio.move_on_after(1):
        await q.get()
    q.add("a")
    with trio.CancelScope() as scope:
        scope.cancel()
        with pytest.raises(trio.Cancelled):
            await q.get()  # cancelled before taking anything
    assert len(q) == 1
    assert await q.get() == "a"


async def test_add_after_fires_at_the_right_virtual_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    q: WorkQueue[str] = WorkQueue("t")
    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            await nursery.start(q.run)
            start = trio.current_time()
            q.add_after("b", 5.0)
            q.add_after("a", 2.0)
            assert await q.get() == "a"
            assert trio.current_time() - start == pytest.approx(2.0)
            assert await q.get() == "b"
            assert trio.current_time() - start == pytest.approx(5.0)
            nursery.cancel_scope.cancel()


async def test_earlier_readd_moves_the_deadline(autojump_clock: trio.testing.MockClock) -> None:
    q: WorkQueue[str] = WorkQueue("t")
    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            await nursery.start(q.run)
            start = trio.current_time()
            q.add_after("a", 60.0)
            await trio.sleep(1.0)
            q.add_after("a", 2.0)  # due at 3 s now, not 60 s
            q.add_after("a", 30.0)  # later: ignored
            assert await q.get() == "a"
            assert trio.current_time() - start == pytest.approx(3.0)
            q.done("a")
            assert q.statistics().waiting == 0
            nursery.cancel_scope.cancel()


async def test_rate_limited_readds_back_off_exponentially(
    autojump_clock: trio.testing.MockClock,
) -> None:
    q: WorkQueue[str] = WorkQueue("t", rate_limiter=ItemExponential(0.005, 1000.0))
    gaps: list[float] = []
    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            await nursery.start(q.run)
            q.add("k")
            item = await q.get()
            for _ in range(6):
                last = trio.current_time()
                q.add_rate_limited(item)  # the reconcile failed
                q.done(item)
                item = await q.get()
                gaps.append(trio.current_time() - last)
            assert q.num_requeues("k") == 6
            q.forget("k")
            q.done(item)
            assert q.num_requeues("k") == 0
            nursery.cancel_scope.cancel()
    assert gaps == pytest.approx([0.005, 0.01, 0.02, 0.04, 0.08, 0.16])


async def test_default_limiter_bucket_spreads_a_storm(
    autojump_clock: trio.testing.MockClock,
) -> None:
    q: WorkQueue[int] = WorkQueue("t", rate_limiter=TokenBucket(10.0, 2))
    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            await nursery.start(q.run)
            start = trio.current_time()
            for i in range(4):
                q.add_rate_limited(i)
            times = []
            for _ in range(4):
                item = await q.get()
                times.append(trio.current_time() - start)
                q.done(item)
            nursery.cancel_scope.cancel()
    assert times == pytest.approx([0.0, 0.0, 0.1, 0.2])


async def test_shutdown_wakes_blocked_getters(autojump_clock: trio.testing.MockClock) -> None:
    q: WorkQueue[str] = WorkQueue("t")
    stopped: list[int] = []

    async def worker(n: int) -> None:
        with pytest.raises(QueueShutDown):
            await q.get()
        stopped.append(n)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            for n in range(3):
                nursery.start_soon(worker, n)
            await trio.testing.wait_all_tasks_blocked()
            q.shutdown()
    assert sorted(stopped) == [0, 1, 2]
    q.add("ignored")
    assert len(q) == 0
    with pytest.raises(QueueShutDown, match="'t' is shut down"):
        q.get_nowait()


async def test_shutdown_still_hands_out_queued_items_and_stops_run(
    autojump_clock: trio.testing.MockClock,
) -> None:
    q: WorkQueue[str] = WorkQueue("t")
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await nursery.start(q.run)
            q.add("a")
            q.add_after("delayed", 1.0)
            q.shutdown()  # run() returns by itself; the nursery can close
    assert q.shutting_down
    assert await q.get() == "a"
    q.done("a")
    with pytest.raises(QueueShutDown):
        await q.get()
    assert q.statistics().waiting == 0


async def test_run_twice_is_an_error(autojump_clock: trio.testing.MockClock) -> None:
    q: WorkQueue[str] = WorkQueue("t")
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await nursery.start(q.run)
            with pytest.raises(RuntimeError, match="already running"):
                await q.run()
            nursery.cancel_scope.cancel()
    # Cancelled cleanly: it can run again.
    with trio.move_on_after(1):
        await q.run()


async def test_drain_waits_for_done(autojump_clock: trio.testing.MockClock) -> None:
    q: WorkQueue[str] = WorkQueue("t")
    q.add("a")
    q.add("b")
    a = await q.get()
    b = await q.get()
    drained_at: list[float] = []

    async def drain() -> None:
        await q.shutdown_with_drain()
        drained_at.append(trio.current_time())

    start = trio.current_time()
    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain)
            await trio.sleep(1.0)
            q.done(a)
            await trio.sleep(1.0)
            assert drained_at == []
            q.done(b)
    assert drained_at == [pytest.approx(start + 2.0)]
    assert q.statistics().processing == 0


async def test_drain_with_nothing_processing_returns_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    q: WorkQueue[str] = WorkQueue("t")
    start = trio.current_time()
    with trio.testing.assert_checkpoints():
        await q.shutdown_with_drain()
    assert trio.current_time() == start


async def test_two_workers_never_hold_the_same_item(
    autojump_clock: trio.testing.MockClock,
) -> None:
    q: WorkQueue[str] = WorkQueue("t")
    held: set[str] = set()
    processed: list[str] = []
    max_concurrent = 0

    async def worker() -> None:
        nonlocal max_concurrent
        while True:
            try:
                item = await q.get()
            except QueueShutDown:
                return
            assert item not in held, f"{item} handed to two workers"
            held.add(item)
            max_concurrent = max(max_concurrent, len(held))
            await trio.sleep(1.0)  # while we hold it, producers re-add it
            held.discard(item)
            processed.append(item)
            q.done(item)

    with trio.fail_after(1000):
        async with trio.open_nursery() as nursery:
            await nursery.start(q.run)
            for _ in range(4):
                nursery.start_soon(worker)
            for round_ in range(20):
                for item in ("a", "b", "c"):
                    q.add(item)
                q.add_after("a", 0.5)
                await trio.sleep(0.3 if round_ % 2 else 0.7)
            await q.shutdown_with_drain()
    assert max_concurrent <= 3
    assert set(processed) == {"a", "b", "c"}
    assert len(processed) < 3 * 20  # dedup merged adds


async def test_statistics(autojump_clock: trio.testing.MockClock) -> None:
    q: WorkQueue[str] = WorkQueue("t")
    q.add("a")
    q.add("b")
    q.add_after("c", 10.0)
    await q.get()
    assert q.statistics() == QueueStatistics(
        depth=1, processing=1, waiting=1, adds=2, retries=1, shutting_down=False, tasks_waiting=0
    )


# ---- metrics ---------------------------------------------------------------------------------


def _sample(text: str, line_start: str) -> float:
    for line in text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {line_start!r} in:\n{text}")


async def test_queue_updates_its_metrics(autojump_clock: trio.testing.MockClock) -> None:
    registry = Registry()
    q: WorkQueue[str] = WorkQueue("pods", metrics=registry)
    other: WorkQueue[str] = WorkQueue("nodes", metrics=registry)
    other.add("n")
    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            await nursery.start(q.run)
            q.add("a")
            q.add("a")
            q.add("b")
            text = registry.render()
            assert _sample(text, 'workqueue_depth{name="pods"}') == 2
            assert _sample(text, 'workqueue_adds_total{name="pods"}') == 2
            assert _sample(text, 'workqueue_depth{name="nodes"}') == 1

            await trio.sleep(0.25)
            a = await q.get()  # queued 0.25 s
            await trio.sleep(2.0)
            b = await q.get()  # queued 2.25 s; a has run 2 s
            await trio.sleep(1.0)
            text = registry.render()
            assert _sample(text, 'workqueue_depth{name="pods"}') == 0
            assert _sample(text, 'workqueue_longest_running_processor_seconds{name="pods"}') == (
                pytest.approx(3.0)
            )
            assert _sample(text, 'workqueue_unfinished_work_seconds{name="pods"}') == (
                pytest.approx(4.0)
            )
            prefix = "workqueue_queue_duration_seconds"
            assert _sample(text, f'{prefix}_bucket{{name="pods",le="1"}}') == 1
            assert _sample(text, f'{prefix}_bucket{{name="pods",le="10"}}') == 2
            assert _sample(text, f'{prefix}_sum{{name="pods"}}') == pytest.approx(2.5)
            assert _sample(text, f'{prefix}_count{{name="pods"}}') == 2

            q.done(a)
            q.add_rate_limited(b)
            q.done(b)
            text = registry.render()
            assert _sample(text, 'workqueue_work_duration_seconds_count{name="pods"}') == 2
            assert _sample(text, 'workqueue_work_duration_seconds_sum{name="pods"}') == (
                pytest.approx(4.0)
            )
            assert _sample(text, 'workqueue_retries_total{name="pods"}') == 1
            assert _sample(text, 'workqueue_longest_running_processor_seconds{name="pods"}') == 0
            nursery.cancel_scope.cancel()


async def test_a_collected_queue_reports_zero(autojump_clock: trio.testing.MockClock) -> None:
    registry = Registry()
    q: WorkQueue[Hashable] = WorkQueue("gone", metrics=registry)
    q.add("a")
    await q.get()
    await trio.sleep(1.0)
    key = 'workqueue_longest_running_processor_seconds{name="gone"}'
    assert _sample(registry.render(), key) == 1.0
    del q
    gc.collect()
    assert _sample(registry.render(), key) == 0.0
