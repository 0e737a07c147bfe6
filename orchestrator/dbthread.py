"""Run blocking sqlite3 work off the trio event loop, one call at a time per database; and open
the project's SQLite databases the one way they are opened (`open_wal`).

Job: `DbThread.run(fn, *args)` executes `fn(*args)` on the database's own thread and returns its
result (or re-raises its exception) to the calling task, so that fsync-heavy SQLite commits never
stall the event loop.

Invariants:
- One `DbThread` per database, and at most one call in flight per `DbThread`: every call holds
  the instance's turn (a FIFO `trio.Lock`) until its `fn` returned, and all calls run on the
  instance's one thread (started on demand, gone after `IDLE_SECONDS` without work). A sqlite3
  connection is therefore never used by two threads at the same time, and the storage classes
  need no locks of their own.
- A thread that exits when idle is replaced by a new one for the next call, which is why the
  connections used through a `DbThread` are opened with `check_same_thread=False`; that is safe
  only because of the serialization above.
- `steps_with` holds a second instance's turn too, for a few calls that touch both databases
  (taking `other`'s turn, then this one's); it is the only nested acquisition. It hands its
  calls to the thread at once (one job), so they run back to back, in order, without waiting
  for the caller; the caller takes their results one by one and can act on the first (send,
  answer) while the next one runs. The turns are held until every queued call has returned,
  also when the caller leaves early (an exception, a cancellation).
- `run_here_nowait` takes the same turn without waiting for it and runs its call on the
  calling thread instead: still one call at a time, the thread idle meanwhile.
- Cancelling a caller does not abandon its call: the caller waits for `fn` to return, so a
  cancelled call still holds the turn until the database work is really over and the next call
  cannot overlap it.

Why not `trio.to_thread.run_sync`: a hop there names and renames the worker thread (two
`prctl` calls), copies the context and goes through a capacity limiter and thread cache; this
hand-off is a deque append, a byte written to the thread's pipe and a `run_sync_soon`,
measurably less CPU per Raft batch (every Ready of every server makes one).
"""

from __future__ import annotations

import contextlib
import os
import select
import sqlite3
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any, Generic, Literal, TypeVar, TypeVarTuple, Unpack

import outcome
import trio

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class DbThread:
    """Serializes blocking calls against one database onto a thread of its own."""

    def __init__(self) -> None:
        self._turn = trio.Lock()  # held by the one caller whose call is running (FIFO)
        self._jobs: deque[_Job] = deque()
        self._state = threading.Lock()  # guards _thread and _pipe against the idle exit
        self._thread: threading.Thread | None = None
        # The thread sleeps reading this pipe; a job's byte wakes it. Not a queue.SimpleQueue:
        # its put wakes the thread while the caller holds the GIL, and a thread woken that way
        # (on a busy machine often at once, preempting the event loop) can only wait for the
        # GIL; os.write releases the GIL for the syscall, so the woken thread can run. Profiles
        # showed the event loop's thread descheduled inside SimpleQueue.put, holding the GIL,
        # in 5-12 % of its samples under load.
        self._pipe: tuple[int, int] | None = None

    async def run(self, fn: Callable[[Unpack[Ts]], T], *args: *Ts) -> T:
        """Run `fn(*args)` on this database's thread once no other call on it is running."""
        async with self._turn:
            return await self._call(fn, args)

    def run_here_nowait(self, fn: Callable[[Unpack[Ts]], T], *args: *Ts) -> T:
        """Run `fn(*args)` right here, on the calling (trio) thread, if no call is running or
        waiting: for calls known to be short (no fsync, no lock to wait for), where the two
        thread wake-ups of `run` would cost more than the call. Raises `trio.WouldBlock`
        (running nothing) if the database's turn is taken."""
        self._turn.acquire_nowait()
        try:
            return fn(*args)
        finally:
            self._turn.release()

    @contextlib.asynccontextmanager
    async def steps_with(self, other: DbThread) -> AsyncIterator[Steps]:
        """Hold `other`'s turn and this one's for a few calls queued at once with
        `Steps.submit` (on this instance's thread; they may use both databases) and awaited
        one by one: the thread runs them back to back while the caller handles each result as
        soon as it is there."""
        async with other._turn, self._turn:
            steps = Steps(self)
            try:
                yield steps
            finally:
                with trio.CancelScope(shield=True):
                    await steps.settle()
                # Each Step refers to its Steps: dropping the list breaks the cycle, so the
                # results (a Ready's worth of write results) are freed now rather than by the
                # cyclic collector, whose passes over thousands of them each took tens of ms.
                steps._steps = []

    def _submit(self, fn: Callable[[], Any], deliver: Callable[[Any], None]) -> None:
        with self._state:
            self._jobs.append((fn, deliver))
            if self._thread is None:
                r, w = os.pipe()
                os.set_blocking(w, False)
                self._pipe = (r, w)
                self._thread = threading.Thread(
                    target=self._work, args=(r,), name="orchestrator-db", daemon=True
                )
                self._thread.start()
            else:
                assert self._pipe is not None
                # A full pipe already holds a wake-up the thread has not read.
                with contextlib.suppress(BlockingIOError):
                    os.write(self._pipe[1], b"\0")

    async def _call(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        task = trio.lowlevel.current_task()
        token = trio.lowlevel.current_trio_token()

        def deliver(result: outcome.Outcome[T]) -> None:  # on the database's thread
            token.run_sync_soon(trio.lowlevel.reschedule, task, result)

        self._submit(partial(fn, *args), deliver)
        # Not abortable: a cancelled caller still waits for `fn` to return, so its turn (and
        # the database) is not handed to the next call while `fn` runs.
        result: T = await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)
        return result

    def _work(self, wake: int) -> None:
        jobs = self._jobs
        # poll, not select: select refuses descriptors above 1023, which a busy server has.
        waiting = select.poll()
        waiting.register(wake, select.POLLIN)
        while True:
            try:
                fn, deliver = jobs.popleft()
            except IndexError:
                if waiting.poll(IDLE_SECONDS * 1000):
                    os.read(wake, 4096)  # the wake-ups so far; their jobs are in the deque
                    continue
                with self._state:
                    if not jobs:  # else a job came in meanwhile: keep going
                        assert self._pipe is not None
                        for fd in self._pipe:
                            os.close(fd)
                        self._pipe = None
                        self._thread = None
                        return
                continue
            # If the caller's trio run is over, nobody is left to tell: serve the next call.
            with contextlib.suppress(trio.RunFinishedError):
                deliver(outcome.capture(fn))
            del fn, deliver  # nothing of the call stays alive while the thread waits


class Step(Generic[T]):
    """One call queued by `Steps.submit`; `await step.result()` gives its return value (or
    raises its exception)."""

    __slots__ = ("_outcome", "_steps", "_task")

    def __init__(self, steps: Steps) -> None:
        self._steps = steps
        self._outcome: outcome.Outcome[T] | None = None
        self._task: trio.lowlevel.Task | None = None

    def _deliver(self, result: outcome.Outcome[T]) -> None:  # on the trio thread
        self._outcome = result
        if self._task is not None:
            task, self._task = self._task, None
            trio.lowlevel.reschedule(task)

    async def result(self) -> T:
        self._steps.flush()
        if self._outcome is None:
            self._task = trio.lowlevel.current_task()
            # Not abortable, as `DbThread.run`: the call runs to its end whatever happens.
            await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)
        assert self._outcome is not None
        return self._outcome.unwrap()


class Steps:
    """The calls of one `DbThread.steps_with` block. `submit` collects calls; the first
    `result()` hands every call collected so far to the thread as ONE job (one wake-up of the
    thread: waking it once per call measurably cost more, the thread preempting the event loop
    while that still held the GIL), which delivers each call's result as soon as it returns."""

    def __init__(self, db: DbThread) -> None:
        self._db = db
        self._token = trio.lowlevel.current_trio_token()
        self._steps: list[Step[Any]] = []
        self._unsent: list[tuple[Callable[[], Any], Step[Any]]] = []

    def submit(self, fn: Callable[[Unpack[Ts]], T], *args: *Ts) -> Step[T]:
        """Queue `fn(*args)` (after the calls queued before it)."""
        step: Step[T] = Step(self)
        self._unsent.append((partial(fn, *args), step))
        self._steps.append(step)
        return step

    def flush(self) -> None:
        """Hand the calls queued since the last flush to the thread (`result()` does this)."""
        if not self._unsent:
            return
        calls, self._unsent = self._unsent, []
        token = self._token

        def run_all() -> None:  # on the database's thread
            for fn, step in calls:
                result = outcome.capture(fn)
                # If the caller's trio run is over, nobody is left to tell.
                with contextlib.suppress(trio.RunFinishedError):
                    token.run_sync_soon(step._deliver, result)

        self._db._submit(run_all, _ignore)

    async def settle(self) -> None:
        """Wait until every queued call has returned (their results stay with their steps)."""
        self.flush()
        for step in self._steps:
            if step._outcome is None:
                with contextlib.suppress(BaseException):
                    await step.result()


def _ignore(_: object) -> None:
    pass


IDLE_SECONDS = 10.0  # an idle database's thread exits; the next call starts a new one
_Job = tuple[Callable[[], Any], Callable[[Any], None]]


# The WAL file is cut back to this size whenever SQLite restarts it from its start (after a
# checkpoint). Normally the WAL stays below it (SQLite checkpoints every 1,000 pages, 4 MiB); a
# burst (one large transaction, or checkpoints held off) may grow it further, and without a
# limit the file would keep that size for good: this bounds the WAL on disk (kine's unbounded
# WAL, k3s#5033). Above the usual size, so the WAL is not shrunk and regrown at every restart.
WAL_SIZE_LIMIT = 8 * 1024**2


_PAGE_SIZES = frozenset(1 << n for n in range(9, 17))  # what SQLite accepts: 512 .. 65536


def open_wal(
    path: str | os.PathLike[str],
    *,
    synchronous: Literal["FULL", "NORMAL"],
    page_size: int | None = None,
) -> sqlite3.Connection:
    """A connection in WAL mode with the given durability and the WAL bounded to
    `WAL_SIZE_LIMIT` after each restart, for use through a `DbThread`: `check_same_thread=False`
    (see above) and `isolation_level=None`, so that transactions are explicit (BEGIN IMMEDIATE
    ... COMMIT) and nothing is committed behind the caller's back.

    `page_size` (a power of two from 512 to 65536) applies to a database this call creates; an
    existing file keeps the page size it was made with (SQLite cannot change it in WAL mode)."""
    if page_size is not None and page_size not in _PAGE_SIZES:
        raise ValueError(f"page_size must be a power of two from 512 to 65536, got {page_size}")
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    try:
        if page_size is not None:
            conn.execute(f"PRAGMA page_size={page_size}")  # before the first write, or ignored
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise sqlite3.OperationalError(
                f"{os.fspath(path)}: cannot use a WAL journal ({mode!r})"
            )
        conn.execute(f"PRAGMA synchronous={synchronous}")
        conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
    except BaseException:
        conn.close()
        raise
    return conn
