"""Tests for the durable Raft storage (real SQLite files) and for DbThread serialization."""

from __future__ import annotations

import sqlite3
import tempfile
import threading
import time
from pathlib import Path

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.dbthread import DbThread
from orchestrator.raft import storage
from orchestrator.raft.storage import (
    LoadedState,
    RaftStorage,
    StorageCorrupt,
    StorageError,
)
from orchestrator.raft.types import (
    ConfState,
    Entry,
    EntryType,
    HardState,
    Snapshot,
    SnapshotMeta,
)


def ents(first: int, last: int, term: int) -> list[Entry]:
    return [
        Entry(term, i, EntryType.NORMAL, f"e{i}t{term}".encode()) for i in range(first, last + 1)
    ]


def snap(index: int, term: int, data: bytes = b"state") -> Snapshot:
    return Snapshot(
        SnapshotMeta(index, term, ConfState(frozenset({1, 2, 3}), frozenset({4}))), data
    )


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "raft.db"


def reopen(s: RaftStorage, path: Path) -> RaftStorage:
    s.close()
    return RaftStorage(path)


def raw(path: Path) -> sqlite3.Connection:
    """A second connection that edits the file behind the storage's back, to fake corruption."""
    return sqlite3.connect(path, isolation_level=None)


def test_fresh_storage_is_empty(db_path: Path) -> None:
    s = RaftStorage(db_path)
    assert s.load() == LoadedState(HardState(), None, [])
    s.close()


def test_round_trip_survives_reopen(db_path: Path) -> None:
    s = RaftStorage(db_path)
    hs = HardState(term=3, vote=2, commit=4)
    entries = [*ents(1, 3, 1), Entry(2, 4, EntryType.CONF_CHANGE, b"\x01\x02"), Entry(3, 5)]
    s.save(hs, entries)
    assert s.load() == LoadedState(hs, None, entries)
    s = reopen(s, db_path)
    assert s.load() == LoadedState(hs, None, entries)
    s.close()


def test_hard_state_only_and_empty_save(db_path: Path) -> None:
    s = RaftStorage(db_path)
    s.save(HardState(1, 1, 0), ents(1, 2, 1))
    s.save(HardState(2, 0, 2), [])
    s.save(None, [])  # nothing to do
    loaded = s.load()
    assert loaded.hard_state == HardState(2, 0, 2)
    assert loaded.entries == ents(1, 2, 1)
    s.close()


def test_only_a_commit_move_is_written_without_an_fsync(db_path: Path) -> None:
    """As etcd's MustSync: entries, term or vote changes are fsynced; a save that only moves
    the commit index is committed unsynced (its data still there), the connection back on FULL."""
    s = RaftStorage(db_path)
    s.save(HardState(1, 1, 0), ents(1, 2, 1))
    assert s.last_save_seconds is not None  # an fsync to observe
    s.save(HardState(1, 1, 2), [])
    assert s.last_save_seconds is None  # unsynced: nothing to observe
    assert s._db().execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL again
    s.save(HardState(2, 0, 2), [])  # a new term is fsynced
    assert s.last_save_seconds is not None
    s = reopen(s, db_path)
    assert s.load().hard_state == HardState(2, 0, 2)
    s.save(HardState(2, 0, 2), [])  # the stored term and vote are known after a load
    assert s.last_save_seconds is None
    s.close()


def test_conflicting_entries_truncate_the_tail(db_path: Path) -> None:
    s = RaftStorage(db_path)
    s.save(HardState(1, 1, 0), ents(1, 5, 1))
    s.save(HardState(2, 2, 0), ents(3, 4, 2))
    assert s.load().entries == ents(1, 2, 1) + ents(3, 4, 2)  # entry 5 is gone
    s.save(None, ents(5, 6, 2))  # plain append
    s = reopen(s, db_path)
    assert s.load().entries == ents(1, 2, 1) + ents(3, 6, 2)
    s.close()


def test_invalid_saves_are_refused_and_write_nothing(db_path: Path) -> None:
    s = RaftStorage(db_path)
    s.save(HardState(1, 1, 0), ents(1, 3, 1))
    before = s.load()
    with pytest.raises(ValueError, match="gap"):
        s.save(HardState(9, 9, 9), ents(5, 6, 1))
    with pytest.raises(ValueError, match="contiguous"):
        s.save(None, [Entry(1, 4), Entry(1, 6)])
    assert s.load() == before
    s.save(None, [], snap(10, 2))
    with pytest.raises(ValueError, match="snapshot index"):
        s.save(None, ents(10, 11, 2))
    with pytest.raises(ValueError, match="older"):
        s.save(None, [], snap(9, 2))
    s.close()


def test_snapshot_install_replaces_the_log(db_path: Path) -> None:
    s = RaftStorage(db_path)
    s.save(HardState(1, 1, 3), ents(1, 5, 1))
    sn = snap(3, 1, b"leader state")  # even an older-than-log snapshot drops every entry
    s.save(HardState(2, 0, 3), [], sn)
    assert s.load() == LoadedState(HardState(2, 0, 3), sn, [])
    sn2 = snap(20, 2, b"newer")
    s.save(HardState(3, 0, 20), ents(21, 22, 3), sn2)  # snapshot and entries in one batch
    s = reopen(s, db_path)
    assert s.load() == LoadedState(HardState(3, 0, 20), sn2, ents(21, 22, 3))
    s.close()


def stored(path: Path) -> list[int]:
    with raw(path) as c:
        return [r[0] for r in c.execute("SELECT idx FROM entries ORDER BY idx")]


def test_compact_drops_entries_up_to_upto(db_path: Path) -> None:
    s = RaftStorage(db_path)
    s.save(HardState(1, 1, 10), ents(1, 10, 1))
    sn = snap(7, 1)
    s.compact(sn, upto=5)
    # Entries 6 and 7 stay on disk for slow followers, but load() starts after the snapshot.
    assert s.load() == LoadedState(HardState(1, 1, 10), sn, ents(8, 10, 1))
    s.save(HardState(1, 1, 10), [])  # (entry 5 goes in the save after: 4 per transaction)
    assert stored(db_path) == list(range(6, 11))
    s.save(None, ents(9, 9, 2))  # appends after a compaction still truncate correctly
    s.compact(snap(9, 2), upto=9)
    s = reopen(s, db_path)
    assert s.load() == LoadedState(HardState(1, 1, 10), snap(9, 2), [])
    s.close()


@pytest.fixture
def ten_entries(db_path: Path, monkeypatch: pytest.MonkeyPatch) -> RaftStorage:
    """A storage holding entries 1..10 (commit 10), dropping two per transaction."""
    monkeypatch.setattr(storage, "DROP_PER_TRANSACTION", 2)
    s = RaftStorage(db_path)
    s.save(HardState(1, 1, 10), ents(1, 10, 1))
    return s


def test_compaction_drops_a_few_entries_per_transaction(
    db_path: Path, ten_entries: RaftStorage
) -> None:
    s = ten_entries
    s.compact(snap(8, 1), upto=7)
    assert stored(db_path) == list(range(3, 11))  # two in compact's own transaction
    s.save(HardState(1, 1, 10), [])  # a commit-only save drops two more
    assert stored(db_path) == list(range(5, 11))
    s.save(None, ents(11, 11, 1))
    assert stored(db_path) == list(range(7, 12))
    # A restart forgets what is left to drop; load() still starts after the snapshot.
    s = reopen(s, db_path)
    assert s.load() == LoadedState(HardState(1, 1, 10), snap(8, 1), ents(9, 11, 1))
    s.save(None, ents(12, 12, 1))
    assert stored(db_path) == list(range(7, 13))
    # The next compaction drops from the oldest stored entry, the leftovers first.
    s.compact(snap(10, 1), upto=10)
    assert stored(db_path) == list(range(9, 13))
    s.save(None, ents(13, 13, 1))
    s.save(None, ents(14, 14, 1))
    assert stored(db_path) == list(range(11, 15))
    assert s.load() == LoadedState(HardState(1, 1, 10), snap(10, 1), ents(11, 14, 1))
    s.close()


def test_a_failed_compaction_marks_nothing_for_dropping(
    db_path: Path, ten_entries: RaftStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = ten_entries

    def fail(*_: object) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    with monkeypatch.context() as m:
        m.setattr(RaftStorage, "_write_snapshot", staticmethod(fail))
        with pytest.raises(sqlite3.OperationalError):
            s.compact(snap(8, 1), upto=8)
    for i in range(11, 16):
        s.save(None, ents(i, i, 1))
    assert stored(db_path) == list(range(1, 16))  # no snapshot covers them: all kept
    s.close()


def test_compact_refuses_bad_arguments(db_path: Path) -> None:
    s = RaftStorage(db_path)
    s.save(None, ents(1, 10, 1))
    s.compact(snap(5, 1), upto=5)
    with pytest.raises(ValueError, match="beyond"):
        s.compact(snap(6, 1), upto=7)
    with pytest.raises(ValueError, match="older"):
        s.compact(snap(4, 1), upto=4)
    with pytest.raises(ValueError, match="term"):
        s.compact(snap(8, 5), upto=6)  # entry 8 has term 1
    assert s.load().snapshot == snap(5, 1)
    s.close()


def test_load_detects_a_gap(db_path: Path) -> None:
    s = RaftStorage(db_path)
    s.save(None, ents(1, 5, 1))
    with raw(db_path) as c:
        c.execute("DELETE FROM entries WHERE idx = 3")
    with pytest.raises(StorageCorrupt, match="gap"):
        s.load()
    s.close()


def test_load_detects_log_not_starting_at_one(db_path: Path) -> None:
    s = RaftStorage(db_path)
    s.save(None, ents(1, 5, 1))
    with raw(db_path) as c:
        c.execute("DELETE FROM entries WHERE idx = 1")
    with pytest.raises(StorageCorrupt, match="no snapshot"):
        s.load()
    s.close()


def test_load_detects_entries_missing_after_snapshot(db_path: Path) -> None:
    s = RaftStorage(db_path)
    s.save(None, ents(6, 8, 2), snap(5, 1))
    with raw(db_path) as c:
        c.execute("DELETE FROM entries WHERE idx = 6")
    with pytest.raises(StorageCorrupt, match="missing"):
        s.load()
    s.close()


def test_load_detects_term_mismatch_at_snapshot(db_path: Path) -> None:
    s = RaftStorage(db_path)
    s.save(None, ents(1, 6, 1))
    s.compact(snap(4, 1), upto=2)
    with raw(db_path) as c:
        c.execute("UPDATE entries SET term = 7 WHERE idx = 4")
    with pytest.raises(StorageCorrupt, match="term"):
        s.load()
    s.close()


def test_load_detects_unknown_entry_type(db_path: Path) -> None:
    s = RaftStorage(db_path)
    s.save(None, ents(1, 2, 1))
    with raw(db_path) as c:
        c.execute("UPDATE entries SET type = 42 WHERE idx = 2")
    with pytest.raises(StorageCorrupt, match="type"):
        s.load()
    s.close()


def test_unknown_schema_version_is_refused(db_path: Path) -> None:
    RaftStorage(db_path).close()
    with raw(db_path) as c:
        c.execute("UPDATE meta SET value = 99 WHERE key = 'schema_version'")
    with pytest.raises(StorageCorrupt, match="schema version"):
        RaftStorage(db_path)


def test_file_is_wal_and_full_sync(db_path: Path) -> None:
    s = RaftStorage(db_path)
    with raw(db_path) as c:
        assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    s.save(None, ents(1, 1, 1))
    assert s.size_bytes() > 0
    before = s.size_bytes()
    s.save(None, [Entry(1, i, data=b"x" * 1000) for i in range(2, 50)])
    assert s.size_bytes() > before
    s.close()


def test_new_log_file_has_small_pages_and_an_old_one_still_loads(tmp_path: Path) -> None:
    """A new log file uses 1 KiB pages (flash: each fsynced commit writes whole pages); a file
    made with 4 KiB pages by an older build keeps them and reads back the same."""
    s = RaftStorage(tmp_path / "new.db")
    s.save(HardState(1, 1, 0), ents(1, 3, 1))
    s.close()
    conn = sqlite3.connect(tmp_path / "new.db")
    assert conn.execute("PRAGMA page_size").fetchone()[0] == storage.PAGE_SIZE == 1024
    conn.close()
    old = tmp_path / "old.db"
    conn = sqlite3.connect(old)
    conn.execute("PRAGMA page_size=4096")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.close()
    s = RaftStorage(old)
    big = [Entry(1, i, EntryType.NORMAL, bytes([i]) * 5000) for i in range(1, 4)]
    s.save(HardState(1, 1, 2), big)
    s.close()
    s = RaftStorage(old)
    try:
        assert s.load() == LoadedState(HardState(1, 1, 2), None, big)
    finally:
        s.close()
    with raw(old) as c:
        assert c.execute("PRAGMA page_size").fetchone()[0] == 4096


def test_closed_storage_raises(db_path: Path) -> None:
    s = RaftStorage(db_path)
    s.close()
    s.close()  # idempotent
    with pytest.raises(StorageError, match="closed"):
        s.load()


# ---- model-based test ------------------------------------------------------------------------


class LogModel:
    """What the storage should hold: everything on disk, including the compaction tail."""

    def __init__(self) -> None:
        self.hs = HardState()
        self.snap: Snapshot | None = None
        self.log: dict[int, Entry] = {}

    @property
    def snap_index(self) -> int:
        return 0 if self.snap is None else self.snap.meta.index

    @property
    def last(self) -> int:
        return max([self.snap_index, *self.log])

    def expected(self) -> LoadedState:
        kept = [self.log[i] for i in sorted(self.log) if i > self.snap_index]
        return LoadedState(self.hs, self.snap, kept)


hard_states = st.builds(
    HardState,
    st.integers(0, 1000),
    st.integers(0, 7),
    st.integers(0, 1000),
)


def draw_entries(data: st.DataObject, first: int) -> list[Entry]:
    n = data.draw(st.integers(0, 6), label="n")
    term = data.draw(st.integers(1, 9), label="term")
    types = data.draw(st.lists(st.sampled_from(EntryType), min_size=n, max_size=n), label="types")
    payload = data.draw(st.binary(max_size=16), label="payload")
    return [Entry(term, first + k, types[k], payload) for k in range(n)]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_random_saves_match_in_memory_model(data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "raft.db"
        s = RaftStorage(path)
        model = LogModel()
        try:
            for _ in range(data.draw(st.integers(1, 15), label="steps")):
                kind = data.draw(
                    st.sampled_from(["append", "install", "compact", "hard_state", "reopen"]),
                    label="op",
                )
                if kind == "append":
                    first = data.draw(st.integers(model.snap_index + 1, model.last + 1))
                    entries = draw_entries(data, first)
                    hs = data.draw(st.none() | hard_states)
                    s.save(hs, entries)
                    if entries:
                        model.log = {i: e for i, e in model.log.items() if i < first}
                        model.log.update({e.index: e for e in entries})
                    if hs is not None:
                        model.hs = hs
                elif kind == "install":
                    index = data.draw(st.integers(model.snap_index, model.last + 5))
                    sn = snap(index, data.draw(st.integers(1, 9)), data.draw(st.binary(max_size=8)))
                    entries = draw_entries(data, index + 1)
                    s.save(None, entries, sn)
                    model.snap = sn
                    model.log = {e.index: e for e in entries}
                elif kind == "compact":
                    index = data.draw(st.integers(model.snap_index, model.last))
                    upto = data.draw(st.integers(0, index))
                    at = model.log.get(index)
                    term = at.term if at is not None else data.draw(st.integers(1, 9))
                    sn = snap(index, term)
                    s.compact(sn, upto)
                    model.snap = sn
                    model.log = {i: e for i, e in model.log.items() if i > upto}
                elif kind == "hard_state":
                    model.hs = data.draw(hard_states)
                    s.save(model.hs, [])
                else:
                    s = reopen(s, path)
                assert s.load() == model.expected()
            s = reopen(s, path)
            assert s.load() == model.expected()
        finally:
            s.close()


# ---- DbThread --------------------------------------------------------------------------------


async def test_dbthread_never_overlaps_calls() -> None:
    db = DbThread()
    lock = threading.Lock()
    active = 0
    max_active = 0
    order: list[int] = []

    def work(i: int) -> int:
        nonlocal active, max_active
        with lock:
            active += 1
            max_active = max(max_active, active)
        time.sleep(0.005)  # widen the window in which an overlap would be seen
        with lock:
            order.append(i)
            active -= 1
        return i * 10

    results: dict[int, int] = {}

    async def call(i: int) -> None:
        results[i] = await db.run(work, i)

    async with trio.open_nursery() as nursery:
        for i in range(10):
            nursery.start_soon(call, i)

    assert max_active == 1
    assert sorted(order) == list(range(10))
    assert results == {i: i * 10 for i in range(10)}


async def test_dbthread_cancelled_call_still_blocks_the_next_one() -> None:
    db = DbThread()
    started = trio.Event()
    release = threading.Event()
    first_done = threading.Event()
    second_saw_first_done: list[bool] = []

    token = trio.lowlevel.current_trio_token()

    def slow() -> None:
        trio.from_thread.run_sync(started.set, trio_token=token)
        release.wait(5)
        first_done.set()

    def after() -> None:
        second_saw_first_done.append(first_done.is_set())

    async def cancelled_caller() -> None:
        with trio.move_on_after(0.01):
            await db.run(slow)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancelled_caller)
        await started.wait()
        nursery.start_soon(db.run, after)
        await trio.sleep(0.05)  # well past the caller's deadline
        assert second_saw_first_done == []  # `slow` still owns the database
        release.set()

    assert second_saw_first_done == [True]


async def test_dbthread_propagates_exceptions(db_path: Path) -> None:
    db = DbThread()
    s = await db.run(RaftStorage, db_path)
    await db.run(s.save, HardState(1, 1, 0), ents(1, 3, 1))
    with pytest.raises(ValueError, match="gap"):
        await db.run(s.save, None, ents(9, 9, 1))
    loaded = await db.run(s.load)
    assert loaded.entries == ents(1, 3, 1)
    await db.run(s.close)


def test_dbthread_serves_successive_trio_runs() -> None:
    """The database's thread outlives one trio run and answers the next run's calls."""
    db = DbThread()
    assert trio.run(db.run, int, "7") == 7
    assert trio.run(db.run, int, "8") == 8
