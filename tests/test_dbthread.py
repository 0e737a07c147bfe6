"""`open_wal`: how every database of the project is opened (WAL, chosen fsync, bounded WAL);
`DbThread.steps_with`: calls queued at once on one database thread, holding two turns."""

from __future__ import annotations

import gc
import operator
import os
import threading
import weakref
from pathlib import Path

import pytest
import trio
import trio.testing

from orchestrator import dbthread
from orchestrator.dbthread import WAL_SIZE_LIMIT, DbThread, open_wal


def test_open_wal_settings(tmp_path: Path) -> None:
    conn = open_wal(tmp_path / "a.db", synchronous="NORMAL")
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
        assert conn.execute("PRAGMA journal_size_limit").fetchone()[0] == WAL_SIZE_LIMIT
    finally:
        conn.close()


def test_open_wal_page_size_applies_to_a_new_file_only(tmp_path: Path) -> None:
    """Small pages for the fsynced databases (flash: a commit writes whole pages); a file made
    with another page size keeps it (SQLite cannot change it in WAL mode), and opens fine."""
    path = tmp_path / "p.db"
    conn = open_wal(path, synchronous="FULL", page_size=1024)
    try:
        conn.execute("CREATE TABLE t (v)")
        assert conn.execute("PRAGMA page_size").fetchone()[0] == 1024
    finally:
        conn.close()
    conn = open_wal(path, synchronous="FULL", page_size=4096)
    try:
        assert conn.execute("PRAGMA page_size").fetchone()[0] == 1024
    finally:
        conn.close()
    old = tmp_path / "old.db"
    conn = open_wal(old, synchronous="FULL")
    conn.execute("CREATE TABLE t (v)")
    conn.close()
    conn = open_wal(old, synchronous="FULL", page_size=1024)
    try:
        assert conn.execute("PRAGMA page_size").fetchone()[0] == 4096
        conn.execute("INSERT INTO t VALUES (1)")
    finally:
        conn.close()


@pytest.mark.parametrize("size", [0, 256, 1000, 131072])
def test_open_wal_refuses_a_bad_page_size(tmp_path: Path, size: int) -> None:
    with pytest.raises(ValueError, match="power of two"):
        open_wal(tmp_path / "x.db", synchronous="FULL", page_size=size)
    assert not (tmp_path / "x.db").exists()


def test_wal_is_cut_back_to_its_limit_after_a_burst(tmp_path: Path) -> None:
    """One transaction larger than the limit grows the WAL past it; once SQLite has
    checkpointed it (automatically, at 1,000 pages) the next write restarts the WAL and cuts
    the file back, instead of leaving it at its high-water mark for good."""
    path = tmp_path / "b.db"
    conn = open_wal(path, synchronous="FULL")
    try:
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB)")
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "INSERT INTO t (v) VALUES (?)",
            ((os.urandom(1000),) for _ in range(3 * WAL_SIZE_LIMIT // 1000)),
        )
        conn.execute("COMMIT")
        assert os.path.getsize(f"{path}-wal") > WAL_SIZE_LIMIT
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t (v) VALUES (x'00')")
        conn.execute("COMMIT")
        assert os.path.getsize(f"{path}-wal") <= WAL_SIZE_LIMIT
        assert (
            conn.execute("SELECT count(*) FROM t").fetchone()[0] == 3 * WAL_SIZE_LIMIT // 1000 + 1
        )
    finally:
        conn.close()


# ---------------------------------------------------------------------------- steps_with
# Real threads, so no mock clock: every wait below is on an event (threading.Event on the
# database's thread, trio waits on the trio side), each bounded, never on elapsed time.


async def test_steps_run_back_to_back_while_the_caller_handles_the_first_result() -> None:
    """Both calls are queued at once: the second runs on the thread while the caller is still
    acting on the first's result (here: the second waits for the caller to say it got it)."""
    db, other = DbThread(), DbThread()
    got_first = threading.Event()
    order: list[str] = []

    def second() -> bool:
        order.append("second started")
        return got_first.wait(timeout=10)  # False: the caller only got the first result after

    with trio.fail_after(20):
        async with db.steps_with(other) as steps:
            one = steps.submit(order.append, "first")
            two = steps.submit(second)
            assert await one.result() is None
            order.append("caller has the first result")
            got_first.set()
            assert await two.result() is True
    assert order[0] == "first"
    assert set(order[1:]) == {"second started", "caller has the first result"}


async def test_steps_hold_both_turns_until_every_queued_call_returned() -> None:
    """A caller that leaves the block early (here with an exception, before awaiting anything)
    still holds both databases until its queued call is over: a later `run` on either database
    cannot overlap it. The call's own exception reaches the caller that awaits it."""
    db, other = DbThread(), DbThread()
    gate = threading.Event()
    order: list[str] = []

    def slow() -> None:
        gate.wait(timeout=10)
        order.append("queued call done")

    async def give_up() -> None:
        async with db.steps_with(other) as steps:
            steps.submit(slow)
            raise KeyError("caller gives up")

    async def leave_early() -> None:
        with pytest.raises(KeyError):
            await give_up()

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(leave_early)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(db.run, order.append, "next call on db")
            nursery.start_soon(other.run, order.append, "next call on other")
            await trio.testing.wait_all_tasks_blocked()
            assert order == []  # both wait for the turns, held by the early leaver
            gate.set()
        assert order[0] == "queued call done"
        assert sorted(order[1:]) == ["next call on db", "next call on other"]

        async with db.steps_with(other) as steps:
            failing = steps.submit(operator.truediv, 1, 0)
            with pytest.raises(ZeroDivisionError):
                await failing.result()


class _Result:
    """A call's result that can be watched for being freed (weakref)."""


async def test_results_are_freed_when_the_block_ends_without_the_cyclic_collector() -> None:
    """A Ready's write results go when its block does, by reference counting: the cyclic
    collector, which would otherwise free them, spent tens of ms per pass over them."""
    db, other = DbThread(), DbThread()
    gc.disable()
    try:
        with trio.fail_after(20):
            async with db.steps_with(other) as steps:
                step = steps.submit(_Result)
                freed = weakref.ref(await step.result())
            del steps, step
            # The thread may still be inside the job that delivered the result (its frame holds
            # it for a moment after handing it over); a later call on the same thread runs
            # only once that job has returned.
            await db.run(int)
            assert freed() is None
    finally:
        gc.enable()


async def test_an_idle_thread_exits_with_its_pipe_and_the_next_call_starts_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dbthread, "IDLE_SECONDS", 0.01)
    db = DbThread()
    with trio.fail_after(20):
        assert await db.run(threading.get_ident) != threading.get_ident()
        for _ in range(3):  # woken through its pipe, the same thread serves the next calls
            assert await db.run(operator.add, 1, 2) == 3
        thread = db._thread
        assert thread is not None
        assert db._pipe is not None
        await trio.to_thread.run_sync(thread.join, 10)  # exits once idle
        assert not thread.is_alive()
        assert db._thread is None
        assert db._pipe is None  # closed with it: an idle database holds no descriptors
        assert await db.run(operator.mul, 2, 3) == 6  # a new thread (and pipe) serves it
        assert db._thread is not None
        assert db._thread is not thread


async def test_a_thread_whose_pipe_is_a_high_descriptor_still_wakes() -> None:
    """A busy server has more than 1024 descriptors open; the thread waits with poll, which
    (unlike select) takes any descriptor."""
    held: list[int] = []
    try:
        while not held or held[-1] < 1100:
            held.append(os.dup(0 if not held else held[0]))
        db = DbThread()
        with trio.fail_after(20):
            assert await db.run(operator.add, 1, 2) == 3
            assert db._pipe is not None
            assert min(db._pipe) > 1024
            for _ in range(3):  # each call wakes the waiting thread through the pipe
                await trio.sleep(0.01)
                assert await db.run(operator.add, 2, 2) == 4
    finally:
        for fd in held:
            os.close(fd)


# ---------------------------------------------------------------------------- run_here_nowait
async def test_run_here_nowait_runs_on_the_calling_thread_when_the_turn_is_free() -> None:
    db = DbThread()
    assert db.run_here_nowait(threading.get_ident) == threading.get_ident()
    with trio.fail_after(20):
        assert await db.run(threading.get_ident) != threading.get_ident()  # the turn is back


async def test_run_here_nowait_refuses_while_a_call_holds_the_turn() -> None:
    db = DbThread()
    started, release = threading.Event(), threading.Event()

    def held() -> None:
        started.set()
        release.wait(10)

    ran: list[int] = []
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(db.run, held)
            await trio.to_thread.run_sync(started.wait, 10)
            with pytest.raises(trio.WouldBlock):
                db.run_here_nowait(ran.append, 1)
            release.set()
    assert ran == []
    assert db.run_here_nowait(ran.append, 2) is None
    assert ran == [2]
