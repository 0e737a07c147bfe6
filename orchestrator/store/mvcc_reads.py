"""The MVCC store's fields, setup and read side: the bottom layer of `MVCCStore`.

`MVCCReader` opens the SQLite file (schema, metadata) and serves every read: `get`, `range`
and `events_since` (from the history table) at the current or an older revision, the store's
status, `sync`
and `maybe_checkpoint`. `MVCCStore` (`mvcc`) adds the Raft state machine (apply, snapshot,
restore) and the write commands on top; the module docstring of `mvcc` states the
invariants of both. Synchronous; call through a `DbThread`.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable
from typing import Any

from orchestrator.dbthread import open_wal
from orchestrator.store.mvcc_checks import (
    bounds,
    check_text,
)
from orchestrator.store.mvcc_sql import (
    CACHE_KIB,
    NO_LIMIT,
    PUT,
    SCHEMA,
    SCHEMA_VERSION,
    SQL_CHECKPOINT,
    SQL_COUNT,
    SQL_COUNT_AT,
    SQL_CURRENT,
    SQL_EVENTS,
    SQL_GET_AT,
    SQL_KV_COUNT,
    SQL_META_LOAD,
    SQL_RANGE,
    SQL_RANGE_AT,
    SUB_BITS,
)
from orchestrator.store.types import (
    MAX_TXN_OPS,
    Compacted,
    Event,
    EventType,
    FutureRevision,
    InvalidRequest,
    KeyValue,
    RangeResult,
    StoreStatus,
)

DEFAULT_QUOTA_BYTES = 2 * 1024**3  # etcd's default --quota-backend-bytes
DEFAULT_MAX_WAL_BYTES = 16 * 1024**2  # maybe_checkpoint() truncates the WAL above this
# How long applies add to one SQLite transaction before one of them commits it (see `apply`):
# etcd's backend batch interval. Longer only replays more entries after a crash.
DEFAULT_COMMIT_INTERVAL = 0.1


class MVCCReader:
    """The store's state and reads; see `orchestrator.store.mvcc` for the whole store."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        quota_bytes: int = DEFAULT_QUOTA_BYTES,
        commit_interval: float = DEFAULT_COMMIT_INTERVAL,
    ) -> None:
        self._path = os.fspath(path)
        self._commit_interval = commit_interval
        self._txn_since = 0.0  # time.monotonic() when the open apply transaction began
        self._quota = quota_bytes
        self._applied = 0
        self._rev = 1
        self._compact = 0
        self._logical = 0
        self._compacted = False  # a compaction ran in the current apply batch
        self.compactions = 0  # compactions applied since this object was made (for metrics)
        # NORMAL, not FULL: the Raft log is the durable record (fsynced before anything is
        # acknowledged), so this database need not fsync each commit. WAL+NORMAL stays
        # consistent: a power cut can only lose the last commits, moving the applied index
        # back; the driver then replays those entries from the log, or restores the durable
        # snapshot if the log was compacted past them (it only compacts behind a snapshot
        # fsynced in the Raft database). This halves the fsyncs on the write path.
        # Transactions are explicit, so the applied index commits with the changes it covers.
        self._conn: sqlite3.Connection | None = open_wal(self._path, synchronous="NORMAL")
        try:
            self._init_db()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ setup
    def _init_db(self) -> None:
        conn = self._db()
        conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
        conn.execute("PRAGMA temp_store=MEMORY")
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            if version == 0:
                for sql in SCHEMA:
                    conn.execute(sql)
                conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            elif version != SCHEMA_VERSION:
                raise RuntimeError(
                    f"{self._path}: store schema version {version}, this code reads"
                    f" {SCHEMA_VERSION}; restore a snapshot or use a matching release"
                )
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        self._load_meta()
        conn.execute(SQL_CHECKPOINT)

    def _load_meta(self) -> None:
        row = self._db().execute(SQL_META_LOAD).fetchone()
        self._applied, self._rev, self._compact, self._logical = (int(x) for x in row)

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError(f"{self._path}: store is closed")
        return self._conn

    def commit(self) -> None:
        """Commit the applies made since the last commit (a no-op if there are none)."""
        conn = self._db()
        if conn.in_transaction:
            conn.execute("COMMIT")

    def close(self) -> None:
        """Commit and close the connection; idempotent."""
        if self._conn is not None:
            self.commit()
            conn, self._conn = self._conn, None
            conn.close()

    def _current(self, key: str) -> KeyValue | None:
        row = self._db().execute(SQL_CURRENT, (key,)).fetchone()
        if row is None:
            return None
        return KeyValue(key, row[3], row[1], row[0] >> SUB_BITS, row[2])

    # ------------------------------------------------------------------ reads
    def _read_revision(self, revision: int) -> int:
        if isinstance(revision, bool) or not isinstance(revision, int) or revision < 0:
            raise InvalidRequest(f"revision must be a non-negative integer, got {revision!r}")
        if revision == 0:
            return self._rev
        if revision > self._rev:
            raise FutureRevision(f"revision {revision} is ahead of the store ({self._rev})")
        if revision < self._compact:
            raise Compacted(
                f"revision {revision} has been compacted (compact revision {self._compact})",
                self._compact,
            )
        return revision

    def get(self, key: str, revision: int = 0) -> KeyValue | None:
        """The key at `revision` (0 = current), None if absent then.

        Raises Compacted below the compact revision, FutureRevision above the current one.
        """
        check_text("key", key)
        rev = self._read_revision(revision)
        if rev == self._rev:
            return self._current(key)
        row = self._db().execute(SQL_GET_AT, (key, (rev + 1) << SUB_BITS)).fetchone()
        if row is None or row[0] != PUT:
            return None
        return KeyValue(key, row[4], row[1], row[2] >> SUB_BITS, row[3])

    def range(
        self,
        prefix: str,
        *,
        start_after: str = "",
        limit: int = 0,
        revision: int = 0,
        count_only: bool = False,
    ) -> RangeResult:
        """Keys starting with `prefix` ("" = all) and above `start_after`, in key order, as of
        `revision` (0 = current); at most `limit` of them (0 = no limit).

        `more` says whether keys were left out by the limit; `count` is the number of keys in
        the whole range (prefix, after start_after) at that revision, as etcd's count. With
        `count_only` no keys are returned. Paging with start_after = the last key of the
        previous page and the revision of the first page gives a consistent snapshot.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise InvalidRequest(f"limit must be a non-negative integer, got {limit!r}")
        rev = self._read_revision(revision)
        lower, upper = bounds(prefix, start_after)
        conn = self._db()
        current = rev == self._rev
        args: tuple[Any, ...] = (lower, upper) if current else (lower, upper, (rev + 1) << SUB_BITS)
        count_sql = SQL_COUNT if current else SQL_COUNT_AT
        if count_only:
            count = int(conn.execute(count_sql, args).fetchone()[0])
            return RangeResult([], rev, False, count)
        rows = conn.execute(
            SQL_RANGE if current else SQL_RANGE_AT, (*args, limit + 1 if limit else NO_LIMIT)
        ).fetchall()
        more = bool(limit) and len(rows) > limit
        if more:
            del rows[limit:]
        kvs = [KeyValue(r[0], r[1], r[2], r[3] >> SUB_BITS, r[4]) for r in rows]
        count = int(conn.execute(count_sql, args).fetchone()[0]) if more else len(kvs)
        return RangeResult(kvs, rev, more, count)

    def events_since(self, revision: int, prefix: str = "", limit: int = 0) -> list[Event]:
        """Events with revision >= `revision` for keys starting with `prefix`, in revision
        order and key order within a revision, at most `limit` (0 = all) but never splitting a
        revision (a first revision bigger than `limit` comes whole).

        Raises Compacted if `revision` <= compact_revision (once compacted at all): the
        events of the compact revision itself are incomplete, its tombstones being gone. So
        a watcher that has seen everything up to revision R resumes with R + 1, which works
        while R >= compact_revision. A revision above the current one gives [].
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise InvalidRequest(f"limit must be a non-negative integer, got {limit!r}")
        if isinstance(revision, bool) or not isinstance(revision, int):
            raise InvalidRequest(f"revision must be an integer, got {revision!r}")
        if self._compact > 0 and revision <= self._compact:
            raise Compacted(
                f"events since revision {revision} have been compacted (compact revision"
                f" {self._compact}): re-list and watch from a later revision",
                self._compact,
            )
        lower, upper = bounds(prefix, "")
        # A revision has at most MAX_TXN_OPS events: limit + MAX_TXN_OPS rows always reach
        # the end of the revision that straddles the limit.
        rows = (
            self._db()
            .execute(
                SQL_EVENTS,
                (
                    max(revision, 0) << SUB_BITS,
                    lower,
                    upper,
                    limit + MAX_TXN_OPS if limit else NO_LIMIT,
                ),
            )
            .fetchall()
        )
        events = []
        for hid, key, kind, create, version, value, ptype, pcreate, pid, pversion, pvalue in rows:
            rev = hid >> SUB_BITS
            prev = (
                None if ptype != PUT else KeyValue(key, pvalue, pcreate, pid >> SUB_BITS, pversion)
            )
            if kind == PUT:
                events.append(
                    Event(EventType.PUT, KeyValue(key, value, create, rev, version), prev)
                )
            else:
                events.append(Event(EventType.DELETE, KeyValue(key, b"", 0, rev, 0), prev))
        return take_whole_revisions(events, limit)

    @property
    def path(self) -> str:
        """The database file (its WAL is this path + "-wal")."""
        return self._path

    def revision(self) -> int:
        return self._rev

    def compact_revision(self) -> int:
        return self._compact

    def logical_bytes(self) -> int:
        """The quota's measure (see the module docstring)."""
        return self._logical

    def status(self) -> StoreStatus:
        keys = int(self._db().execute(SQL_KV_COUNT).fetchone()[0])
        return StoreStatus(
            revision=self._rev,
            compact_revision=self._compact,
            applied_index=self._applied,
            db_bytes=_file_size(self._path),
            wal_bytes=_file_size(self._path + "-wal"),
            keys=keys,
            quota_bytes=self._quota,
        )

    def sync(self) -> None:
        """Make everything applied durable: a checkpoint syncs the WAL and the database file
        (commits alone are not fsynced; see `open_wal` in `__init__`)."""
        self.commit()
        self._db().execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def maybe_checkpoint(self, max_wal_bytes: int = DEFAULT_MAX_WAL_BYTES) -> bool:
        """Checkpoint and truncate the WAL if it is larger than `max_wal_bytes`; returns
        whether it did. Call between applies (e.g. from a periodic task via the DbThread); it
        commits the applies of an open transaction in any case, so that one left open by the
        last applies before a quiet spell does not stay open for long."""
        self.commit()
        if _file_size(self._path + "-wal") <= max_wal_bytes:
            return False
        self._db().execute(SQL_CHECKPOINT)
        return True


def _file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0


def take_whole_revisions(events: Iterable[Event], limit: int) -> list[Event]:
    """Up to `limit` events (0 = all) ending at a revision boundary; a first revision with more
    than `limit` events is returned whole. `events` must hold every event of each revision it
    reaches into (up to MAX_TXN_OPS past the limit)."""
    out: list[Event] = []
    for ev in events:
        if limit > 0 and len(out) >= limit and ev.kv.mod_revision != out[-1].kv.mod_revision:
            break
        out.append(ev)
    if limit > 0 and len(out) > limit:
        last = out[-1].kv.mod_revision
        cut = len(out)
        while cut > 0 and out[cut - 1].kv.mod_revision == last:
            cut -= 1
        if cut > 0:
            del out[cut:]
    return out
