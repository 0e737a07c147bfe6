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
- `run_with` holds a second instance's turn too, for one call that touches both databases
  (taking `other`'s turn, then this one's); it is the only nested acquisition.
- Cancelling a caller does not abandon its call: the caller waits for `fn` to return, so a
  cancelled call still holds the turn until the database work is really over and the next call
  cannot overlap it.

Why not `trio.to_thread.run_sync`: a hop there names and renames the worker thread (two
`prctl` calls), copies the context and goes through a capacity limiter and thread cache; this
hand-off is a queue put and a `run_sync_soon`, measurably less CPU per Raft batch (every Ready
of every server makes one).
"""

from __future__ import annotations

import contextlib
import os
import queue
import sqlite3
import threading
from collections.abc import Callable
from functools import partial
from typing import Any, Literal, TypeVar, TypeVarTuple, Unpack

import outcome
import trio

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class DbThread:
    """Serializes blocking calls against one database onto a thread of its own."""

    def __init__(self) -> None:
        self._turn = trio.Lock()  # held by the one caller whose call is running (FIFO)
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._state = threading.Lock()  # guards _thread against its idle exit
        self._thread: threading.Thread | None = None

    async def run(self, fn: Callable[[Unpack[Ts]], T], *args: *Ts) -> T:
        """Run `fn(*args)` on this database's thread once no other call on it is running."""
        async with self._turn:
            return await self._call(fn, args)

    async def run_with(self, other: DbThread, fn: Callable[[Unpack[Ts]], T], *args: *Ts) -> T:
        """Like `run`, but `fn` may also use `other`'s database: it runs once neither database
        has a call running, holding both turns (other's first; the only place that takes two,
        so no lock-order cycle)."""
        async with other._turn, self._turn:
            return await self._call(fn, args)

    async def _call(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        task = trio.lowlevel.current_task()
        token = trio.lowlevel.current_trio_token()

        def deliver(result: outcome.Outcome[T]) -> None:  # on the database's thread
            token.run_sync_soon(trio.lowlevel.reschedule, task, result)

        job: _Job = (partial(fn, *args), deliver)
        with self._state:
            self._jobs.put(job)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._work, name="orchestrator-db", daemon=True
                )
                self._thread.start()
        # Not abortable: a cancelled caller still waits for `fn` to return, so its turn (and
        # the database) is not handed to the next call while `fn` runs.
        result: T = await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)
        return result

    def _work(self) -> None:
        while True:
            try:
                fn, deliver = self._jobs.get(timeout=IDLE_SECONDS)
            except queue.Empty:
                with self._state:
                    if self._jobs.empty():  # else a job came in meanwhile: keep going
                        self._thread = None
                        return
                continue
            # If the caller's trio run is over, nobody is left to tell: serve the next call.
            with contextlib.suppress(trio.RunFinishedError):
                deliver(outcome.capture(fn))
            del fn, deliver  # nothing of the call stays alive while the thread waits


IDLE_SECONDS = 10.0  # an idle database's thread exits; the next call starts a new one
_Job = tuple[Callable[[], Any], Callable[[Any], None]]


# The WAL file is cut back to this size whenever SQLite restarts it from its start (after a
# checkpoint). Normally the WAL stays below it (SQLite checkpoints every 1,000 pages, 4 MiB); a
# burst (one large transaction, or checkpoints held off) may grow it further, and without a
# limit the file would keep that size for good: this bounds the WAL on disk (kine's unbounded
# WAL, k3s#5033). Above the usual size, so the WAL is not shrunk and regrown at every restart.
WAL_SIZE_LIMIT = 8 * 1024**2


def open_wal(
    path: str | os.PathLike[str], *, synchronous: Literal["FULL", "NORMAL"]
) -> sqlite3.Connection:
    """A connection in WAL mode with the given durability and the WAL bounded to
    `WAL_SIZE_LIMIT` after each restart, for use through a `DbThread`: `check_same_thread=False`
    (see above) and `isolation_level=None`, so that transactions are explicit (BEGIN IMMEDIATE
    ... COMMIT) and nothing is committed behind the caller's back."""
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    try:
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
