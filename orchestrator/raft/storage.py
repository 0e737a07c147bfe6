"""Durable Raft storage (log, hard state, snapshot) in one SQLite file.

Job: persist what the Raft core hands out in a `Ready` batch before any message of that batch is
sent, and give it all back on restart. The class is synchronous; call it through a `DbThread` so
the fsyncs never block the event loop.

Invariants:
- Every mutation is exactly one SQLite transaction, committed with `synchronous=FULL` in WAL mode,
  so after `save`/`compact` returns the change survives a power cut, and a crash mid-call leaves
  the previous state intact (a whole Ready batch is all-or-nothing: group commit). The one
  exception, as in etcd (`MustSync`): a save that only moves the commit index is not fsynced
  itself (the next fsync of the WAL covers it). The commit index is volatile state in Raft: a
  lower one after a power cut is learnt again from the leader (or recommitted by a lone server),
  and the state machine skips what it applied already. It halves a lone server's fsyncs. (The
  driver now skips such saves altogether, `node_ready`: the next save with entries or a term or
  vote change stores the commit index with them.)
- The stored log is contiguous. Without a snapshot it starts at index 1; with one it starts at or
  before `snapshot.index + 1` (`compact` may keep a tail of entries the snapshot already covers),
  and an entry stored at the snapshot's index has the snapshot's term. `save` refuses writes that
  would break this, and `load` raises `StorageCorrupt` if it finds the file in any other shape.
- An entry written at index i replaces every stored entry at index >= i (Raft log truncation).
- A snapshot received from the leader (`save(..., snapshot=...)`) replaces the whole log; a
  locally made one (`compact`) only drops the entries up to `upto`, and not all at once: each
  transaction (`compact`'s and every later `save`'s) deletes at most `DROP_PER_TRANSACTION` of
  them, oldest first. Under load a snapshot covers tens of MiB of entries, and deleting those
  in one transaction (SQLite reads every overflow page it frees) held the Raft loop for about
  200 ms; a few per save cost each save a millisecond or so. The entries waiting to be dropped
  are below the snapshot, so `load` never returns them, and a restart only leaves them for the
  next `compact`, which drops from the oldest stored entry.
- The connection is opened with `check_same_thread=False` because `DbThread` may run successive
  calls on different pool threads; it never runs two at once, so no locking is needed here.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import msgpack

from orchestrator.dbthread import open_wal
from orchestrator.raft.types import ConfState, Entry, EntryType, HardState, Snapshot, SnapshotMeta

SCHEMA_VERSION = 1
# Entries covered by a local snapshot that one transaction deletes, at most (see the module doc):
# a batch entry holds up to 256 KiB of commands, so about 1 MiB.
DROP_PER_TRANSACTION = 4
# Page size of a new log file. Each fsynced commit writes every page it touched to the WAL as a
# whole frame: with 4 KiB pages a 1 KiB entry cost a 4 KiB leaf frame plus the hard state's
# 4 KiB page, about 8 KiB of flash per entry; with 1 KiB pages the same commit writes 2-3 KiB
# (a larger entry takes overflow pages, about its own size). An existing file keeps its size.
PAGE_SIZE = 1024
# SQLite checkpoints the WAL into the database file once it holds this many pages (its default
# is 1,000: 1 MiB of 1 KiB pages). 4 MiB, as with 4 KiB pages: each checkpoint costs two fsyncs
# and rewrites the pages every commit touches (the hard state, the log's last leaf) once more.
WAL_AUTOCHECKPOINT_PAGES = 4096

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS entries ("
    " idx INTEGER PRIMARY KEY, term INTEGER NOT NULL, type INTEGER NOT NULL, data BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS hard_state ("
    " id INTEGER PRIMARY KEY CHECK (id = 1),"
    " term INTEGER NOT NULL, vote INTEGER NOT NULL, commit_idx INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS snapshot ("
    " id INTEGER PRIMARY KEY CHECK (id = 1), idx INTEGER NOT NULL, term INTEGER NOT NULL,"
    " voters BLOB NOT NULL, learners BLOB NOT NULL, data BLOB NOT NULL)",
    # The peer address book (node id -> "host:port"), kept by the driver as membership
    # changes are applied; addresses are not part of the Raft core's state.
    "CREATE TABLE IF NOT EXISTS peers (id INTEGER PRIMARY KEY, addr TEXT NOT NULL)",
)

# Statements are module constants so sqlite3's per-connection statement cache keeps them
# prepared: on the write path each one is compiled once per connection, not once per batch.
_SQL_INSERT_ENTRY = "INSERT INTO entries (idx, term, type, data) VALUES (?, ?, ?, ?)"
_SQL_TRUNCATE_FROM = "DELETE FROM entries WHERE idx >= ?"
_SQL_COMPACT_UPTO = "DELETE FROM entries WHERE idx <= ?"
_SQL_DELETE_ALL_ENTRIES = "DELETE FROM entries"
_SQL_LAST_INDEX = "SELECT max(idx) FROM entries"
_SQL_FIRST_INDEX = "SELECT min(idx) FROM entries"
_SQL_TERM_AT = "SELECT term FROM entries WHERE idx = ?"
_SQL_SNAPSHOT_INDEX = "SELECT idx FROM snapshot WHERE id = 1"
_SQL_UPSERT_HARD_STATE = (
    "INSERT INTO hard_state (id, term, vote, commit_idx) VALUES (1, ?, ?, ?)"
    " ON CONFLICT (id) DO UPDATE SET"
    " term = excluded.term, vote = excluded.vote, commit_idx = excluded.commit_idx"
)
_SQL_UPSERT_SNAPSHOT = (
    "INSERT INTO snapshot (id, idx, term, voters, learners, data) VALUES (1, ?, ?, ?, ?, ?)"
    " ON CONFLICT (id) DO UPDATE SET idx = excluded.idx, term = excluded.term,"
    " voters = excluded.voters, learners = excluded.learners, data = excluded.data"
)


class StorageError(Exception):
    """The storage file cannot be used."""


class StorageCorrupt(StorageError):
    """The file's contents break an invariant of the Raft log; refusing to start from it."""


@dataclass(frozen=True, slots=True)
class LoadedState:
    """Everything a Raft node needs to restart. `entries` follow `snapshot` (if any) without a
    gap; entries the snapshot already covers are not included."""

    hard_state: HardState
    snapshot: Snapshot | None
    entries: list[Entry]


def _check_contiguous(entries: Sequence[Entry]) -> None:
    for prev, cur in pairwise(entries):
        if cur.index != prev.index + 1:
            raise ValueError(f"entries not contiguous: index {prev.index} followed by {cur.index}")


class RaftStorage:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = os.fspath(path)
        # FULL: the WAL is fsynced at every commit, so a returned save() is on disk. Every
        # mutation below is an explicit BEGIN IMMEDIATE ... COMMIT.
        try:
            self._conn: sqlite3.Connection | None = open_wal(
                self._path, synchronous="FULL", page_size=PAGE_SIZE
            )
        except sqlite3.OperationalError as exc:
            raise StorageError(str(exc)) from exc
        # Seconds the last `save` took (its transaction, fsync included), None if it wrote
        # nothing: the driver observes it as raft_wal_fsync_duration_seconds.
        self.last_save_seconds: float | None = None
        self._term_vote: tuple[int, int] | None = None  # as stored; None: not known yet
        # Entries up to `_drop_upto` are covered by a local snapshot and still to be deleted;
        # those up to `_dropped` are gone (see `_drop_some`).
        self._drop_upto = 0
        self._dropped = 0
        try:
            self._init_db()
        except BaseException:
            self.close()
            raise

    def _init_db(self) -> None:
        self._db().execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT_PAGES}")
        with self._transaction() as c:
            for stmt in _SCHEMA:
                c.execute(stmt)
            c.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)",
                (SCHEMA_VERSION,),
            )
            row = c.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row[0] != SCHEMA_VERSION:
            raise StorageCorrupt(
                f"{self._path}: schema version {row[0]}, this build understands {SCHEMA_VERSION}"
            )

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StorageError(f"{self._path}: storage is closed")
        return self._conn

    @contextmanager
    def _transaction(self, *, sync: bool = True) -> Iterator[sqlite3.Connection]:
        conn = self._db()
        if not sync:
            conn.execute("PRAGMA synchronous=OFF")  # only outside a transaction
        try:
            # IMMEDIATE takes the write lock up front, so the reads used for validation inside
            # the transaction see the state the writes will be applied to.
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        finally:
            if not sync:
                conn.execute("PRAGMA synchronous=FULL")

    # ---- reading -------------------------------------------------------------------------

    def load(self) -> LoadedState:
        conn = self._db()
        # A read transaction so the three tables are read from one consistent WAL snapshot.
        conn.execute("BEGIN")
        try:
            hs_row = conn.execute(
                "SELECT term, vote, commit_idx FROM hard_state WHERE id = 1"
            ).fetchone()
            snap_row = conn.execute(
                "SELECT idx, term, voters, learners, data FROM snapshot WHERE id = 1"
            ).fetchone()
            # From the snapshot index on: older entries (a tail kept for slow followers, or
            # ones still to be dropped) are covered by the snapshot.
            entry_rows = conn.execute(
                "SELECT idx, term, type, data FROM entries WHERE idx >= ? ORDER BY idx",
                (0 if snap_row is None else snap_row[0],),
            ).fetchall()
        finally:
            conn.execute("COMMIT")

        hard_state = HardState() if hs_row is None else HardState(*hs_row)
        self._term_vote = (hard_state.term, hard_state.vote)
        snapshot = None if snap_row is None else self._decode_snapshot(snap_row)
        entries = [self._decode_entry(r) for r in entry_rows]
        self._check_log(snapshot, entries)
        # The entry at the snapshot index (read to check its term) is covered by the snapshot;
        # the core's log starts right after it.
        if snapshot is not None and entries and entries[0].index == snapshot.meta.index:
            entries = entries[1:]
        return LoadedState(hard_state, snapshot, entries)

    def _decode_snapshot(self, row: tuple[Any, ...]) -> Snapshot:
        idx, term, voters_raw, learners_raw, data = row
        try:
            voters = frozenset(int(v) for v in msgpack.unpackb(voters_raw))
            learners = frozenset(int(v) for v in msgpack.unpackb(learners_raw))
        except Exception as exc:
            raise StorageCorrupt(f"{self._path}: undecodable snapshot membership: {exc}") from exc
        if voters & learners:
            raise StorageCorrupt(f"{self._path}: snapshot voters and learners overlap")
        return Snapshot(SnapshotMeta(idx, term, ConfState(voters, learners)), bytes(data))

    def _decode_entry(self, row: tuple[Any, ...]) -> Entry:
        idx, term, kind, data = row
        try:
            etype = EntryType(kind)
        except ValueError as exc:
            raise StorageCorrupt(f"{self._path}: entry {idx} has unknown type {kind!r}") from exc
        return Entry(term, idx, etype, bytes(data))

    def _check_log(self, snapshot: Snapshot | None, entries: list[Entry]) -> None:
        for prev, cur in pairwise(entries):
            if cur.index != prev.index + 1:
                raise StorageCorrupt(
                    f"{self._path}: log has a gap: entry {prev.index} followed by {cur.index}"
                )
        if not entries:
            return
        first = entries[0].index
        if snapshot is None:
            if first != 1:
                raise StorageCorrupt(
                    f"{self._path}: log starts at index {first} but there is no snapshot"
                )
            return
        snap = snapshot.meta
        if first > snap.index + 1:
            raise StorageCorrupt(
                f"{self._path}: log starts at index {first}, after snapshot index {snap.index}"
                " (entries missing)"
            )
        if first <= snap.index <= entries[-1].index:
            at_snap = entries[snap.index - first]
            if at_snap.term != snap.term:
                raise StorageCorrupt(
                    f"{self._path}: entry {snap.index} has term {at_snap.term},"
                    f" snapshot says {snap.term}"
                )

    def size_bytes(self) -> int:
        """On-disk size of the database plus its write-ahead log."""
        total = 0
        for p in (self._path, self._path + "-wal"):
            with suppress(FileNotFoundError):  # no WAL file between checkpoints/after close
                total += os.path.getsize(p)
        return total

    # ---- writing -------------------------------------------------------------------------

    def save(
        self,
        hard_state: HardState | None,
        entries: Sequence[Entry],
        snapshot: Snapshot | None = None,
    ) -> None:
        """Persist one Ready batch in one transaction.

        Order inside the transaction: the snapshot (which drops the whole log), then the entries
        (which truncate the log at entries[0].index), then the hard state. Raises ValueError,
        writing nothing, if the entries would leave a gap, reach back into the snapshot, or the
        snapshot is older than the stored one.
        """
        self.last_save_seconds = None
        if hard_state is None and not entries and snapshot is None:
            return
        _check_contiguous(entries)
        start = time.perf_counter()
        commit_only = (
            snapshot is None
            and not entries
            and hard_state is not None
            and (hard_state.term, hard_state.vote) == self._term_vote
        )
        with self._transaction(sync=not commit_only) as conn:
            stored_snap = self._stored_snapshot_index(conn)
            if snapshot is not None:
                if snapshot.meta.index < stored_snap:
                    raise ValueError(
                        f"snapshot at {snapshot.meta.index} is older than the stored one"
                        f" at {stored_snap}"
                    )
                self._write_snapshot(conn, snapshot)
                conn.execute(_SQL_DELETE_ALL_ENTRIES)
                snap_index = last = snapshot.meta.index
            else:
                snap_index = stored_snap
                last_row = conn.execute(_SQL_LAST_INDEX).fetchone()[0]
                last = max(snap_index, 0 if last_row is None else last_row)
            if entries:
                first = entries[0].index
                if first <= snap_index:
                    raise ValueError(
                        f"entry {first} is at or below the snapshot index {snap_index}"
                    )
                if first > last + 1:
                    raise ValueError(f"entry {first} would leave a gap after last index {last}")
                conn.execute(_SQL_TRUNCATE_FROM, (first,))
                conn.executemany(
                    _SQL_INSERT_ENTRY, [(e.index, e.term, int(e.type), e.data) for e in entries]
                )
            if hard_state is not None:
                conn.execute(
                    _SQL_UPSERT_HARD_STATE, (hard_state.term, hard_state.vote, hard_state.commit)
                )
            dropped = self._drop_some(conn, self._dropped, self._drop_upto)
        self._dropped = dropped
        if hard_state is not None:
            self._term_vote = (hard_state.term, hard_state.vote)
        if not commit_only:  # an unsynced commit is not an fsync to observe
            self.last_save_seconds = time.perf_counter() - start

    def compact(self, snapshot: Snapshot, upto: int) -> None:
        """Store a locally made snapshot (one transaction) and drop the log entries up to
        `upto`: the first few in that transaction, the rest a few per later `save` (see the
        module doc).

        `upto` may be below the snapshot index to keep a tail of entries for slow followers.
        """
        if upto > snapshot.meta.index:
            raise ValueError(f"compact upto {upto} is beyond snapshot index {snapshot.meta.index}")
        with self._transaction() as conn:
            stored_snap = self._stored_snapshot_index(conn)
            if snapshot.meta.index < stored_snap:
                raise ValueError(
                    f"snapshot at {snapshot.meta.index} is older than the stored one"
                    f" at {stored_snap}"
                )
            # A kept entry at the snapshot index must agree with it, or load() would reject
            # the file; refuse here, while the caller can still see the bug.
            row = conn.execute(_SQL_TERM_AT, (snapshot.meta.index,)).fetchone()
            if upto < snapshot.meta.index and row is not None and row[0] != snapshot.meta.term:
                raise ValueError(
                    f"entry {snapshot.meta.index} has term {row[0]},"
                    f" snapshot says {snapshot.meta.term}"
                )
            self._write_snapshot(conn, snapshot)
            # Deleted a few at a time from the oldest stored entry on (see the module doc).
            first = conn.execute(_SQL_FIRST_INDEX).fetchone()[0]
            drop_upto = max(self._drop_upto, upto)
            dropped = self._drop_some(conn, upto if first is None else first - 1, drop_upto)
        # Only once committed: a failed transaction must not leave entries marked for deletion
        # that no stored snapshot covers.
        self._drop_upto, self._dropped = drop_upto, dropped

    @staticmethod
    def _drop_some(conn: sqlite3.Connection, dropped: int, drop_upto: int) -> int:
        """Inside a write transaction: delete the next few (`DROP_PER_TRANSACTION`) of the
        entries up to `drop_upto`, those up to `dropped` being gone already. Returns what is
        gone once the transaction commits."""
        if dropped >= drop_upto:
            return dropped
        upto = min(drop_upto, dropped + DROP_PER_TRANSACTION)
        conn.execute(_SQL_COMPACT_UPTO, (upto,))
        return upto

    @staticmethod
    def _stored_snapshot_index(conn: sqlite3.Connection) -> int:
        row = conn.execute(_SQL_SNAPSHOT_INDEX).fetchone()
        return 0 if row is None else int(row[0])

    @staticmethod
    def _write_snapshot(conn: sqlite3.Connection, snapshot: Snapshot) -> None:
        m = snapshot.meta
        conn.execute(
            _SQL_UPSERT_SNAPSHOT,
            (
                m.index,
                m.term,
                msgpack.packb(sorted(m.conf.voters)),
                msgpack.packb(sorted(m.conf.learners)),
                snapshot.data,
            ),
        )

    def load_peers(self) -> dict[int, str]:
        rows = self._db().execute("SELECT id, addr FROM peers").fetchall()
        return {int(i): str(a) for i, a in rows}

    def save_peers(self, peers: dict[int, str]) -> None:
        """Replace the address book (one transaction)."""
        with self._transaction() as conn:
            conn.execute("DELETE FROM peers")
            conn.executemany("INSERT INTO peers (id, addr) VALUES (?, ?)", sorted(peers.items()))

    def close(self) -> None:
        """Close the connection; idempotent. Every committed change is already durable."""
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.close()
