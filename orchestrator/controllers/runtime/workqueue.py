"""The controllers' work queue: client-go's `util/workqueue` contract, as a pure core + trio driver.

Theory of operation
-------------------
Controllers enqueue object *keys*; workers take a key, reconcile it, and report back:

    key = await queue.get()              # blocks; raises QueueShutDown once shut down and empty
    try:
        result = await reconcile(key)
    except Exception:
        queue.add_rate_limited(key)      # retry later, backing off per key
    else:
        queue.forget(key)                # success: clear the key's back-off history
    finally:
        queue.done(key)                  # always: forgetting `done` wedges the key forever

The promises (client-go `doc.go`), kept by `QueueCore`:

* **fair**: items are handed out in the order they were added (FIFO);
* **stingy**: an item is never handed to two workers at once, and N adds of an item before it
  is processed are processed once ("dirty" set = dedup);
* **re-add while processing**: an item added while a worker holds it is queued again when that
  worker calls `done`, so the latest state is always reconciled after the latest add;
* **delays**: `add_after(item, d)` keeps the item in a min-heap until `now + d` (`d <= 0` is a
  plain add); an item already waiting only ever moves *earlier*. `add_rate_limited(item)` is
  `add_after(item, rate_limiter.when(item, now))`; `forget` clears the limiter's history only;
* **shutdown**: adds are ignored, waiting (delayed) items are dropped, workers still get the
  items already queued, then `get` raises `QueueShutDown`. `shutdown_with_drain` also waits
  until no item is being processed.

Split into a pure core and a thin driver: `QueueCore` holds all bookkeeping and takes `now` as an
argument — no trio, no clock, deterministic, tested exhaustively and against a model. `WorkQueue`
is the thin trio driver: it reads the clock, parks getters (`get`) and drainers, and its `run()`
task sleeps until the earliest delayed item is due (the sleep's deadline is moved earlier when an
earlier item arrives: no polling), then releases it into the queue. Without `run()` delayed items
never become ready. Given a metrics `Registry`, the queue maintains client-go's `workqueue_*`
metrics (labelled with its name) through the core's `QueueObserver` hooks.
"""

from __future__ import annotations

import heapq
import math
import weakref
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace
from typing import Generic, Protocol, TypeVar

import trio

from orchestrator.controllers.runtime.metrics import WorkqueueMetrics
from orchestrator.controllers.runtime.ratelimit import RateLimiter, default_controller_rate_limiter
from orchestrator.metrics import Registry

__all__ = [
    "QueueCore",
    "QueueObserver",
    "QueueShutDown",
    "QueueStatistics",
    "WorkQueue",
]

T = TypeVar("T", bound=Hashable)


class QueueShutDown(Exception):
    """The queue was shut down and has no more items to hand out: the worker should exit."""


@dataclass(frozen=True)
class QueueStatistics:
    """A snapshot of a queue (`statistics()`)."""

    depth: int
    """Items ready to be handed out by `get` (the FIFO's length; client-go `Len()`)."""
    processing: int
    """Items handed out by `get` and not yet `done`."""
    waiting: int
    """Items scheduled by `add_after` / `add_rate_limited` and not yet due."""
    adds: int
    """Total adds that marked an item as needing processing (duplicates merged are not counted)."""
    retries: int
    """Total `add_after` / `add_rate_limited` calls accepted (client-go's retries metric)."""
    shutting_down: bool
    """Whether `shutdown()` was called."""
    tasks_waiting: int = 0
    """Tasks blocked in `get()` (the trio driver only; always 0 for a bare core)."""


class QueueObserver(Protocol):
    """Hooks the core calls as things happen (for metrics). Must not call back into the queue."""

    def added(self, dirty: int) -> None:
        """An item became dirty (needs processing); `dirty` is the new number of such items."""
        ...

    def got(self, queued_for: float, dirty: int) -> None:
        """An item was handed out after `queued_for` seconds since it was added."""
        ...

    def finished(self, worked_for: float) -> None:
        """An item was `done` after `worked_for` seconds of processing."""
        ...

    def retried(self) -> None:
        """`add_after` (or `add_rate_limited`) was accepted."""
        ...


class _NoObserver:
    def added(self, dirty: int) -> None:
        pass

    def got(self, queued_for: float, dirty: int) -> None:
        pass

    def finished(self, worked_for: float) -> None:
        pass

    def retried(self) -> None:
        pass


class QueueCore(Generic[T]):
    """All the work queue's bookkeeping, without I/O: every method takes `now` (seconds).

    Return values tell a driver whom to wake: `add`, `add_after`, `add_rate_limited` and `done`
    return True when an item was appended to the ready FIFO (wake one getter); `release_due`
    returns how many were. `next_ready_at()` is when the earliest delayed item is due.
    """

    def __init__(
        self, rate_limiter: RateLimiter | None = None, observer: QueueObserver | None = None
    ) -> None:
        self.rate_limiter: RateLimiter = (
            rate_limiter if rate_limiter is not None else default_controller_rate_limiter()
        )
        self._observer: QueueObserver = observer if observer is not None else _NoObserver()
        # The ready FIFO, in the order items were added (fairness).
        # Invariant: every element is in `_dirty` and not in `_processing`; no element twice.
        self._queue: deque[T] = deque()
        # Items that need processing -> when they were added (for the queue-duration metric).
        # Invariant: a dirty item is either in `_queue` or in `_processing` (re-added while being
        # processed; `done` moves it to `_queue`), never both. `get` removes the item.
        self._dirty: dict[T, float] = {}
        # Items handed out by `get` and not yet `done` -> when they were handed out.
        # Invariant (stingy): disjoint from `_queue`; an item is here at most once.
        self._processing: dict[T, float] = {}
        # Delayed items -> (ready_at, seq) of their live heap entry.
        # Invariant: every item here has exactly one heap entry equal to its value; other heap
        # entries are stale (left by a move earlier) and skipped. Independent of `_dirty`: a
        # due item goes through `add`, which merges it if it is already dirty.
        self._waiting: dict[T, tuple[float, int]] = {}
        # Min-heap of (ready_at, seq, item); `seq` breaks ties in scheduling order and keeps
        # items from ever being compared.
        self._heap: list[tuple[float, int, T]] = []
        self._seq = 0
        self._shutting_down = False
        self.adds = 0
        self.retries = 0

    # ---- adding ------------------------------------------------------------------------------

    def add(self, item: T, now: float) -> bool:
        """Mark `item` as needing processing. True if it was appended to the ready FIFO.

        Ignored after shutdown; merged if already dirty; deferred to `done` if being processed.
        """
        if self._shutting_down or item in self._dirty:
            return False
        self._dirty[item] = now
        self.adds += 1
        self._observer.added(len(self._dirty))
        if item in self._processing:
            return False
        self._queue.append(item)
        return True

    def add_after(self, item: T, delay: float, now: float) -> bool:
        """Add `item` at `now + delay`; `delay <= 0` adds now (then True if appended).

        If the item is already waiting, its ready time only moves earlier. Counts as a retry.
        """
        if self._shutting_down:
            return False
        self.retries += 1
        self._observer.retried()
        if delay <= 0:
            return self.add(item, now)
        ready_at = now + delay
        current = self._waiting.get(item)
        if current is not None and current[0] <= ready_at:
            return False
        self._seq += 1
        self._waiting[item] = (ready_at, self._seq)
        heapq.heappush(self._heap, (ready_at, self._seq, item))
        if len(self._heap) > 2 * len(self._waiting) + 64:
            self._compact()
        return False

    def add_rate_limited(self, item: T, now: float, *, at_least: float = 0.0) -> bool:
        """`add_after(item, rate_limiter.when(item, now))`: retry with the limiter's back-off,
        or after `at_least` seconds if that is later (a server's Retry-After)."""
        if self._shutting_down:
            return False
        return self.add_after(item, max(self.rate_limiter.when(item, now), at_least), now)

    def forget(self, item: T) -> None:
        """Clear the rate limiter's history of `item` (it still needs `done`)."""
        self.rate_limiter.forget(item)

    def num_requeues(self, item: T) -> int:
        """How many rate-limited retries of `item` since the last `forget`."""
        return self.rate_limiter.num_requeues(item)

    # ---- delayed items -----------------------------------------------------------------------

    def _drop_stale(self) -> None:
        heap = self._heap
        while heap and self._waiting.get(heap[0][2]) != heap[0][:2]:
            heapq.heappop(heap)

    def _compact(self) -> None:
        self._heap = [(at, seq, item) for item, (at, seq) in self._waiting.items()]
        heapq.heapify(self._heap)

    def next_ready_at(self) -> float | None:
        """When the earliest delayed item is due, or None if none is waiting."""
        self._drop_stale()
        return self._heap[0][0] if self._heap else None

    def release_due(self, now: float) -> int:
        """Add every delayed item due at `now` (earliest first); return how many were appended."""
        appended = 0
        while True:
            self._drop_stale()
            if not self._heap or self._heap[0][0] > now:
                return appended
            _, _, item = heapq.heappop(self._heap)
            del self._waiting[item]
            appended += self.add(item, now)

    # ---- processing --------------------------------------------------------------------------

    def __len__(self) -> int:
        """Items ready to be handed out."""
        return len(self._queue)

    def get(self, now: float) -> T:
        """Hand out the oldest ready item; it is now being processed until `done`.

        `IndexError` when nothing is ready: check `len()` (or `shutting_down`) first.
        """
        if not self._queue:
            raise IndexError("QueueCore.get(): no item is ready; check len() before calling get()")
        item = self._queue.popleft()
        added_at = self._dirty.pop(item)
        self._processing[item] = now
        self._observer.got(now - added_at, len(self._dirty))
        return item

    def done(self, item: T, now: float) -> bool:
        """`item` is processed. True if it was re-added meanwhile and is now queued again.

        `ValueError` if `item` is not being processed: call `done` exactly once per `get`.
        """
        try:
            started = self._processing.pop(item)
        except KeyError:
            raise ValueError(
                f"done({item!r}): this item is not being processed; call done() exactly once "
                "for each item returned by get()"
            ) from None
        self._observer.finished(now - started)
        if item in self._dirty:
            self._queue.append(item)
            return True
        return False

    def is_processing(self, item: T) -> bool:
        return item in self._processing

    @property
    def processing_count(self) -> int:
        return len(self._processing)

    def longest_running(self, now: float) -> float:
        """Seconds the longest-held item has been processed (0 if none)."""
        return max((now - t for t in self._processing.values()), default=0.0)

    def unfinished_work(self, now: float) -> float:
        """Sum of seconds every item being processed has been held so far."""
        return sum(now - t for t in self._processing.values())

    # ---- shutdown ----------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Refuse further adds and drop delayed items; ready items can still be taken."""
        self._shutting_down = True
        self._waiting.clear()
        self._heap.clear()

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    def statistics(self) -> QueueStatistics:
        return QueueStatistics(
            depth=len(self._queue),
            processing=len(self._processing),
            waiting=len(self._waiting),
            adds=self.adds,
            retries=self.retries,
            shutting_down=self._shutting_down,
        )

    def check_invariants(self) -> None:
        """Assert the invariants written next to the fields (for tests)."""
        assert len(set(self._queue)) == len(self._queue), "an item is queued twice"
        for item in self._queue:
            assert item in self._dirty, f"{item!r} is queued but not dirty"
            assert item not in self._processing, f"{item!r} is queued and being processed"
        queued = set(self._queue)
        for item in self._dirty:
            assert (item in queued) != (item in self._processing), f"dirty {item!r} is lost"
        live = [e for e in self._heap if self._waiting.get(e[2]) == e[:2]]
        assert len(live) == len(self._waiting), "a waiting item has no live heap entry"


class _MetricsObserver:
    """Feeds one queue's `workqueue_*` children (label `name`)."""

    def __init__(self, families: WorkqueueMetrics, name: str) -> None:
        self._depth = families.depth.labels(name)
        self._adds = families.adds.labels(name)
        self._queue_duration = families.queue_duration.labels(name)
        self._work_duration = families.work_duration.labels(name)
        self._retries = families.retries.labels(name)

    def added(self, dirty: int) -> None:
        self._adds.inc()
        self._depth.set(dirty)

    def got(self, queued_for: float, dirty: int) -> None:
        self._queue_duration.observe(queued_for)
        self._depth.set(dirty)

    def finished(self, worked_for: float) -> None:
        self._work_duration.observe(worked_for)

    def retried(self) -> None:
        self._retries.inc()


class WorkQueue(Generic[T]):
    """A rate-limited, delaying work queue for trio tasks (see the module docstring).

    `run()` must be running (under a nursery) for `add_after` / `add_rate_limited` items to
    become ready. `clock` supplies `now` for the core and the metrics; it must be on trio's time
    base (the default, `trio.current_time`), since `run()` sleeps until the core's deadlines.
    With `metrics`, the queue keeps `workqueue_*{name=...}` up to date in that registry; give
    each queue in a registry a distinct name. `workqueue_depth` counts dirty items (as client-go
    does: including items re-added while being processed).
    """

    def __init__(
        self,
        name: str,
        rate_limiter: RateLimiter | None = None,
        metrics: Registry | None = None,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self.name = name
        self._clock = clock
        observer: QueueObserver | None = None
        if metrics is not None:
            families = WorkqueueMetrics(metrics)
            observer = _MetricsObserver(families, name)
        self._core: QueueCore[T] = QueueCore(rate_limiter, observer)
        if metrics is not None:
            # Weak: the registry outlives queues; a collected queue reports 0.
            core_ref = weakref.ref(self._core)

            def longest() -> float:
                core = core_ref()
                return core.longest_running(clock()) if core is not None else 0.0

            def unfinished() -> float:
                core = core_ref()
                return core.unfinished_work(clock()) if core is not None else 0.0

            families.longest_running.labels(name).set_function(longest)
            families.unfinished_work.labels(name).set_function(unfinished)
        self._getters = trio.lowlevel.ParkingLot()
        self._drainers = trio.lowlevel.ParkingLot()
        # The `run()` task's sleep; its deadline is the earliest delayed item's ready time.
        self._timer: trio.CancelScope | None = None
        self._running = False

    @property
    def rate_limiter(self) -> RateLimiter:
        return self._core.rate_limiter

    def __len__(self) -> int:
        """Items ready to be handed out."""
        return len(self._core)

    @property
    def depth(self) -> int:
        return len(self._core)

    @property
    def shutting_down(self) -> bool:
        return self._core.shutting_down

    def statistics(self) -> QueueStatistics:
        return replace(self._core.statistics(), tasks_waiting=len(self._getters))

    # ---- producers ---------------------------------------------------------------------------

    def add(self, item: T) -> None:
        """Mark `item` as needing processing (merged with a pending add; ignored after shutdown)."""
        if self._core.add(item, self._clock()):
            self._getters.unpark()

    def add_after(self, item: T, delay: float) -> None:
        """Add `item` after `delay` seconds (`<= 0`: now); an earlier call for it wins."""
        if self._core.add_after(item, delay, self._clock()):
            self._getters.unpark()
        self._reschedule()

    def add_rate_limited(self, item: T, *, at_least: float = 0.0) -> None:
        """Add `item` after the rate limiter's delay for it (one more failure recorded), or
        after `at_least` seconds if that is later (the Retry-After of a 429)."""
        if self._core.add_rate_limited(item, self._clock(), at_least=at_least):
            self._getters.unpark()
        self._reschedule()

    def forget(self, item: T) -> None:
        """Clear `item`'s rate-limiter history (after success). Still call `done`."""
        self._core.forget(item)

    def num_requeues(self, item: T) -> int:
        return self._core.num_requeues(item)

    def _reschedule(self) -> None:
        if self._timer is None:
            return
        ready_at = self._core.next_ready_at()
        if ready_at is not None and ready_at < self._timer.deadline:
            self._timer.deadline = ready_at

    # ---- consumers ---------------------------------------------------------------------------

    def get_nowait(self) -> T:
        """The oldest ready item, now held by the caller until `done`.

        `trio.WouldBlock` if none is ready; `QueueShutDown` if none is and the queue is shut down.
        """
        if len(self._core):
            return self._core.get(self._clock())
        if self._core.shutting_down:
            raise QueueShutDown(f"work queue {self.name!r} is shut down")
        raise trio.WouldBlock

    async def get(self) -> T:
        """Wait for the oldest ready item; the caller holds it until `done(item)`.

        Raises `QueueShutDown` once the queue is shut down and no ready item is left.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        parked = False
        while True:
            try:
                item = self.get_nowait()
            except trio.WouldBlock:
                await self._getters.park()
                parked = True
                continue
            if not parked:
                # Always yield, but never lose the item to a cancellation once taken.
                await trio.lowlevel.cancel_shielded_checkpoint()
            return item

    def done(self, item: T) -> None:
        """Processing of `item` finished (success or not); re-queue it if it was re-added."""
        if self._core.done(item, self._clock()):
            self._getters.unpark()
        if not self._core.processing_count:
            self._drainers.unpark_all()

    # ---- lifecycle ---------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop accepting adds, drop delayed items, wake every blocked `get` and stop `run()`."""
        self._core.shutdown()
        self._getters.unpark_all()
        if self._timer is not None:
            self._timer.cancel()

    async def shutdown_with_drain(self) -> None:
        """`shutdown()`, then wait until no item is being processed (every `get` got its `done`)."""
        self.shutdown()
        await trio.lowlevel.checkpoint()
        while self._core.processing_count:
            await self._drainers.park()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Move delayed items into the queue when due, until shutdown (then return) or cancelled."""
        if self._running:
            raise RuntimeError(f"work queue {self.name!r}: run() is already running")
        self._running = True
        try:
            task_status.started()
            while not self._core.shutting_down:
                released = self._core.release_due(self._clock())
                if released:
                    self._getters.unpark(count=released)
                ready_at = self._core.next_ready_at()
                with trio.CancelScope(deadline=math.inf if ready_at is None else ready_at) as timer:
                    self._timer = timer
                    await trio.sleep_forever()
                self._timer = None
            await trio.lowlevel.checkpoint()
        finally:
            self._timer = None
            self._running = False
