"""Run blocking sqlite3 work off the trio event loop, one call at a time per database; and open
the project's SQLite databases the one way they are opened (`open_wal`).

Job: `DbThread.run(fn, *args)` executes `fn(*args)` on a worker thread and returns its result (or
re-raises its exception) to the calling task, so that fsync-heavy SQLite commits never stall the
event loop.

Invariants:
- One `DbThread` per database, and at most one call in flight per `DbThread`: every call goes
  through the instance's own `CapacityLimiter(1)`, so calls are strictly serialized in the order
  the limiter grants them (FIFO). A sqlite3 connection is therefore never used by two threads at
  the same time, and the storage classes need no locks of their own.
- Consecutive calls may land on *different* pool threads, which is why the connections used
  through a `DbThread` are opened with `check_same_thread=False`; that is safe only because of
  the serialization above.
- `run_with` holds a second instance's turn too, for one call that touches both databases
  (taking `other`'s limiter, then this one's); it is the only nested acquisition.
- Cancelling a caller does not abandon its thread: trio waits for `fn` to return (the default
  `abandon_on_cancel=False`), so a cancelled call still holds the limiter until the database work
  is really over and the next call cannot overlap it.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from typing import Literal, TypeVar, TypeVarTuple, Unpack

import trio

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class DbThread:
    """Serializes blocking calls against one database onto trio's worker threads."""

    def __init__(self) -> None:
        self._limiter = trio.CapacityLimiter(1)

    async def run(self, fn: Callable[[Unpack[Ts]], T], *args: *Ts) -> T:
        """Run `fn(*args)` in a worker thread once no other call on this database is running."""
        return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    async def run_with(self, other: DbThread, fn: Callable[[Unpack[Ts]], T], *args: *Ts) -> T:
        """Like `run`, but `fn` may also use `other`'s database: it runs once neither database
        has a call running, holding both turns (other's first; the only place that takes two,
        so no lock-order cycle)."""
        async with other._limiter:
            return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)


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
