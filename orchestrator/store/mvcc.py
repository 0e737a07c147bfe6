"""The replicated etcd-style MVCC key space, in one SQLite file: the Raft state machine.

Theory of operation
-------------------
Raft hands `apply` batches of committed entries; each NORMAL entry carries one msgpack command
(`types.encode_*`) or several packed by `raft.statemachine.pack_batch` (one result each, as if
they were consecutive entries). `apply` runs the whole batch of entries inside ONE SQLite
savepoint, which also records the new applied index, so a batch is all-or-nothing. Consecutive
batches share one SQLite transaction: the first `apply` after a commit begins it, and the first
one that finds it `commit_interval` old (100 ms) commits it, as etcd's backend batches its bbolt
transactions (100 ms). The pages that many batches write (the index leaves every writer's keys
sit in) are then written to the WAL once per commit instead of once per batch: about a fifth
less CPU per put at a few dozen puts per batch than a commit per batch, and 100 ms about 8 %
less than 50 ms at a few thousand puts/s (each hot leaf is written half as often). Reads use the
same connection, so they see every applied batch at once; `commit()` (and `sync`, `snapshot`,
`restore`, `maybe_checkpoint`, `close`, which call it) ends the transaction. A crash loses the
applies of the open transaction only, together with the applied index that covers them: the
driver hands those entries again (the Raft log keeps everything above the synced state machine).

Layout (etcd's, mapped onto SQLite; store-notes §1):

- `history` is the revision-keyed store, like etcd's bbolt bucket keyed by (main, sub). Its rowid
  `id` is `revision << 8 | sub`, where `sub` is the rank of the key among the keys written by
  that revision (a transaction writes up to MAX_TXN_OPS < 256 keys; a single command has sub 0).
  So the table's own B-tree *is* the "index on revision" (watch replay is a rowid range scan and
  every insert appends at the right edge of the tree), and `ORDER BY id` is revision order with
  key order inside a revision. One row per write: PUT rows carry the value, `create_rev` and
  `version`; DELETE rows (tombstones) an empty value and zeros. The index `history_key (key)`
  holds (key, id) pairs: "newest row of key K at or below revision R" is one index seek.
- `kv` is the current-state index, like etcd's in-memory key index: key -> `hid` (the history id
  of the key's live row; `mod_revision = hid >> 8`), `create_rev`, `version`. It holds no value:
  the value lives once, in the history row `hid` points at, so a put writes its value once
  rather than twice (kv + history) or three times (plus a `prev_value` copy). Measured with raw
  SQL, 1 KiB puts: 1.7-1.9x the apply rate and 1/2-1/3 of the file size of the layout with
  values in kv and history and prev_* columns.
- `prev_kv` is not stored either: the previous state of a key is its previous history row, and
  compaction (below) never removes the predecessor of a row above the compact revision unless
  it is a tombstone (whose successor's `prev_kv` is None anyway).
- `meta` (one row): applied_index, revision, compact_revision, logical_bytes. The store starts at
  revision 1 with no keys (as etcd does), so the first write gets revision 2 and revision 0
  always means "current" in reads.

A successful write command (create, put, delete, or a txn whose chosen branch changes at least
one key) takes revision `revision + 1`; a txn with several writes takes one revision for all of
them; reads, failed commands, a txn whose branch only reads, compaction and noop take none.
Every write also makes `Event`s (with `prev_kv`): `apply` returns them with its results
(`Applied.events`; the driver hands them to the watch layer) and appends them to an in-memory
ring of recent events (`history_ring` events at least, fewer if they exceed a 64 MiB budget)
that serves `events_since` for recent revisions without touching SQLite; older revisions are
read from `history`.

Compaction `compact(C)` deletes history rows with revision <= C except, per key, the newest row
at or below C when it is a PUT. Hence a read at any revision R >= C still finds, for each key,
its newest row <= R (either above C, untouched, or that kept row), and tombstones <= C are gone
together with everything they superseded. After the compacting transaction commits, a
`wal_checkpoint(TRUNCATE)` returns the WAL file to zero bytes (kine's unbounded WAL, §6).

Invariants
----------
- Exactly-once apply: the applied index is written in the same transaction (and savepoint) as
  the effects of the entries up to it; entries at or below it are skipped (result None), so
  replaying entries after a crash or reopen has no second effect. A batch that fails is rolled
  back to its savepoint alone: the batches before it in the open transaction stay.
- Determinism: a command's result and effects depend only on the command and the store content
  (and `quota_bytes`, which must therefore be the same on every member). A command that fails
  (validation, CAS, quota) returns a result with `error` set and changes nothing; `apply` only
  raises for a broken log (non-contiguous entries) or an SQLite failure, and then the whole
  batch is rolled back.
- One revision per successful write command; revisions have no gaps: every revision from 2 to
  `revision()` has at least one history row until compacted.
- `logical_bytes` = Σ over history rows of len(key) + len(value) + Σ over kv rows of len(key)
  (UTF-8 bytes), maintained in the same transaction as the rows. It is the quota's measure:
  deterministic on every replica, unlike file sizes. A write that would raise it above
  `quota_bytes` fails with QuotaExceeded; deletes (which never raise it) and compaction (which
  lowers it) are always accepted, which is etcd's NOSPACE recovery path.
- Not thread-safe: one caller at a time (`DbThread`), hence `check_same_thread=False`.

Decisions
---------
- Deleting a missing key is `KeyNotFound` for the delete command, with or without an expected
  revision, so callers learn that nothing happened. Inside a txn a delete of a missing key is a
  no-op (etcd semantics; guard it with a compare): it makes no event and, alone, no revision.
- put with an expected mod_revision: 0 means "must not exist"; a mismatch (including "expected a
  revision but the key is absent") is `Conflict` carrying the current KeyValue (or None).
- A txn may not write the same key twice in one branch (etcd: "duplicate key given in txn
  request"); each of compares / success / failure holds at most MAX_TXN_OPS items (TooLarge).
  Reads inside a txn see its earlier writes. A txn that fails its quota check reports
  succeeded=False with error QuotaExceeded.
- Keys are non-empty str of at most MAX_KEY_BYTES UTF-8 bytes, without NUL characters.
- `events_since(R)` requires R > compact_revision once anything was compacted: the events of
  revision C itself are incomplete after compact(C), because its tombstones are gone. (etcd's
  watchable store also accepts R == C, which is how a watch can miss that revision's deletes.)
  A watcher that has seen revision R resumes from R + 1, so it survives compact(C) for C <= R.
  A revision's events are never split by `limit` (watch atomicity).
- compact(C) with C <= compact_revision fails with Compacted, with C > revision with
  FutureRevision; neither changes anything.
"""

from __future__ import annotations

import bisect
import os
import sqlite3
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import msgpack

from orchestrator.dbthread import open_wal
from orchestrator.raft.statemachine import BATCH_TAG, Applied, unpack_batch
from orchestrator.raft.types import Entry, EntryType
from orchestrator.store.types import (
    MAX_KEY_BYTES,
    MAX_TXN_OPS,
    MAX_VALUE_BYTES,
    Compacted,
    CompareTarget,
    Conflict,
    Event,
    EventType,
    FutureRevision,
    InvalidRequest,
    KeyExists,
    KeyNotFound,
    KeyValue,
    Op,
    QuotaExceeded,
    RangeResult,
    StoreError,
    StoreStatus,
    TooLarge,
    TxnResult,
    WriteResult,
)

if TYPE_CHECKING:
    from orchestrator.raft.statemachine import StateMachine

DEFAULT_QUOTA_BYTES = 2 * 1024**3  # etcd's default --quota-backend-bytes
DEFAULT_HISTORY_RING = 10_000  # recent events kept in memory for events_since
DEFAULT_MAX_WAL_BYTES = 16 * 1024**2  # maybe_checkpoint() truncates the WAL above this
# How long applies add to one SQLite transaction before one of them commits it (see `apply`):
# etcd's backend batch interval. Longer only replays more entries after a crash.
DEFAULT_COMMIT_INTERVAL = 0.1
SCHEMA_VERSION = 1

_SUB_BITS = 8  # history.id = revision << _SUB_BITS | sub
assert MAX_TXN_OPS < 1 << _SUB_BITS
_PUT = int(EventType.PUT)
_DELETE = int(EventType.DELETE)
_CACHE_KIB = 16 * 1024  # page cache (negative cache_size = KiB)
_RING_MAX_BYTES = 64 * 1024**2  # byte budget of the event ring (values can be 1.5 MiB)
_NO_UPPER = b"\xff"  # a BLOB compares above every TEXT: "no upper bound" for key ranges
_NO_LIMIT = -1  # SQLite LIMIT -1 = unlimited
_COMPARE_OPS = frozenset({"=", "!=", "<", ">"})
_INT_TARGETS = frozenset({CompareTarget.MOD, CompareTarget.CREATE, CompareTarget.VERSION})

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (id INTEGER PRIMARY KEY CHECK (id = 1),"
    " applied_index INTEGER NOT NULL, revision INTEGER NOT NULL,"
    " compact_revision INTEGER NOT NULL, logical_bytes INTEGER NOT NULL)",
    "INSERT OR IGNORE INTO meta VALUES (1, 0, 1, 0, 0)",
    # Value last: columns before it are read without touching overflow pages.
    "CREATE TABLE IF NOT EXISTS history (id INTEGER PRIMARY KEY, key TEXT NOT NULL,"
    " type INTEGER NOT NULL, create_rev INTEGER NOT NULL, version INTEGER NOT NULL,"
    " value BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS history_key ON history (key)",  # = (key, id)
    "CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY NOT NULL, hid INTEGER NOT NULL,"
    " create_rev INTEGER NOT NULL, version INTEGER NOT NULL) WITHOUT ROWID",
)

_SQL_META_LOAD = (
    "SELECT applied_index, revision, compact_revision, logical_bytes FROM meta WHERE id = 1"
)
_SQL_META_SAVE = (
    "UPDATE meta SET applied_index = ?, revision = ?, compact_revision = ?, logical_bytes = ?"
    " WHERE id = 1"
)
# The live row of a key: (hid, create_rev, version, value).
_SQL_CURRENT = (
    "SELECT k.hid, k.create_rev, k.version, h.value FROM kv AS k"
    " JOIN history AS h ON h.id = k.hid WHERE k.key = ?"
)
_SQL_HISTORY_INSERT = (
    "INSERT INTO history (id, key, type, create_rev, version, value) VALUES (?, ?, ?, ?, ?, ?)"
)
_SQL_KV_INSERT = "INSERT INTO kv (key, hid, create_rev, version) VALUES (?, ?, ?, ?)"
_SQL_KV_UPDATE = "UPDATE kv SET hid = ?, version = ? WHERE key = ?"
_SQL_KV_DELETE = "DELETE FROM kv WHERE key = ?"
_SQL_KV_COUNT = "SELECT COUNT(*) FROM kv"

# The newest row of a key strictly below history id ?2 (= at or below a revision).
_SQL_GET_AT = (
    "SELECT type, create_rev, id, version, value FROM history"
    " WHERE key = ? AND id < ? ORDER BY id DESC LIMIT 1"
)
# ?1 lower bound (inclusive), ?2 upper bound (exclusive), ?3 limit.
_SQL_RANGE = (
    "SELECT k.key, h.value, k.create_rev, k.hid, k.version FROM kv AS k"
    " JOIN history AS h ON h.id = k.hid WHERE k.key >= ?1 AND k.key < ?2"
    " ORDER BY k.key LIMIT ?3"
)
_SQL_COUNT = "SELECT COUNT(*) FROM kv WHERE key >= ?1 AND key < ?2"
# State at a past revision R (?3 = (R + 1) << _SUB_BITS): keys whose live row is at or below R
# are unchanged since R; the keys written after R (found by a rowid range scan of the history
# after R; NOT INDEXED keeps the planner off a full scan of the key index) take their newest row
# at or below R, if it is a PUT.
_PAST_ARMS = (
    "SELECT k.key AS key, h.value, k.create_rev, k.hid, k.version FROM kv AS k"
    " JOIN history AS h ON h.id = k.hid WHERE k.key >= ?1 AND k.key < ?2 AND k.hid < ?3"
    " UNION ALL"
    " SELECT h.key AS key, h.value, h.create_rev, h.id, h.version"
    " FROM (SELECT DISTINCT key FROM history NOT INDEXED"
    " WHERE id >= ?3 AND key >= ?1 AND key < ?2) AS c"
    " JOIN history AS h ON h.id ="
    " (SELECT MAX(x.id) FROM history AS x WHERE x.key = c.key AND x.id < ?3)"
    " WHERE h.type = 0"
)
_SQL_RANGE_AT = _PAST_ARMS + " ORDER BY 1 LIMIT ?4"
_SQL_COUNT_AT = "SELECT COUNT(*) FROM (" + _PAST_ARMS + ")"
# Events with id >= ?1 and ?2 <= key < ?3, in id order, each with its predecessor row.
_SQL_EVENTS = (
    "SELECT h.id, h.key, h.type, h.create_rev, h.version, h.value,"
    " p.type, p.create_rev, p.id, p.version, p.value"
    " FROM history AS h LEFT JOIN history AS p ON p.id ="
    " (SELECT MAX(x.id) FROM history AS x WHERE x.key = h.key AND x.id < h.id)"
    " WHERE h.id >= ?1 AND +h.key >= ?2 AND +h.key < ?3"
    " ORDER BY h.id LIMIT ?4"
)
# Compaction window ?1 <= id < ?2 (revisions above the previous compaction, up to the new one):
# for each key written in it, every row below its newest row in the window, and that newest
# row too if it is a tombstone. Keys not written in the window keep their (PUT) base row.
_COMPACT_DOOMED = (
    "SELECT h.id FROM (SELECT key, MAX(id) AS top FROM history"
    " WHERE id >= ?1 AND id < ?2 GROUP BY key) AS t"
    " JOIN history AS h ON h.key = t.key AND h.id <= t.top"
    " WHERE h.id < t.top OR h.type = 1"
)
_SQL_COMPACT_BYTES = (
    "SELECT COALESCE(SUM(length(CAST(key AS BLOB)) + length(value)), 0) FROM history"
    " WHERE id IN (" + _COMPACT_DOOMED + ")"
)
_SQL_COMPACT_DELETE = "DELETE FROM history WHERE id IN (" + _COMPACT_DOOMED + ")"
_SQL_CHECKPOINT = "PRAGMA wal_checkpoint(TRUNCATE)"


class _Invalid(Exception):
    """A malformed command (internal: becomes a result with `error` set)."""

    def __init__(self, error: StoreError) -> None:
        super().__init__(str(error))
        self.error = error


def _key_bytes(key: Any) -> int:
    """The UTF-8 size of a valid key; raises _Invalid for anything that is not a valid key."""
    if not isinstance(key, str) or not key:
        raise _Invalid(InvalidRequest(f"key must be a non-empty string, got {key!r:.80}"))
    try:
        n = len(key.encode())
    except UnicodeEncodeError:
        raise _Invalid(InvalidRequest(f"key {key!r:.80} is not valid Unicode")) from None
    if n > MAX_KEY_BYTES:
        raise _Invalid(TooLarge(f"key {key[:40]!r}... is {n} bytes, over {MAX_KEY_BYTES}"))
    if "\x00" in key:
        raise _Invalid(InvalidRequest(f"key {key!r:.80} contains a NUL character"))
    return n


def _check_value(key: str, value: Any) -> int:
    if not isinstance(value, bytes):
        raise _Invalid(InvalidRequest(f"value of {key!r} must be bytes"))
    if len(value) > MAX_VALUE_BYTES:
        raise _Invalid(TooLarge(f"value of {key!r} is {len(value)} bytes, over {MAX_VALUE_BYTES}"))
    return len(value)


def _check_revision(what: str, rev: Any) -> int | None:
    """An expected revision: None or a non-negative int (bool is not an int here)."""
    if rev is None:
        return None
    if isinstance(rev, bool) or not isinstance(rev, int) or rev < 0:
        raise _Invalid(InvalidRequest(f"{what} must be a non-negative integer or nil"))
    return rev


def _prefix_end(prefix: str) -> str | bytes:
    """The smallest string above every string starting with `prefix` (_NO_UPPER if none)."""
    chars = list(prefix)
    while chars and chars[-1] == "\U0010ffff":
        chars.pop()
    if not chars:
        return _NO_UPPER
    cp = ord(chars[-1]) + 1
    if 0xD800 <= cp <= 0xDFFF:  # surrogates cannot be stored; skip to the next scalar value
        cp = 0xE000
    chars[-1] = chr(cp)
    return "".join(chars)


def _check_text(what: str, text: Any) -> None:
    """Reads take any str that SQLite can bind (valid Unicode); InvalidRequest otherwise."""
    if not isinstance(text, str):
        raise InvalidRequest(f"{what} must be a string, got {type(text).__name__}")
    try:
        text.encode()
    except UnicodeEncodeError:
        raise InvalidRequest(f"{what} {text!r:.80} is not valid Unicode") from None


def _bounds(prefix: str, start_after: str) -> tuple[str, str | bytes]:
    _check_text("prefix", prefix)
    _check_text("start_after", start_after)
    # key > s  <=>  key >= s + "\0", the immediate successor of s in code point order.
    lower = max(prefix, start_after + "\x00") if start_after else prefix
    return lower, _prefix_end(prefix)


def _compare(kv: KeyValue | None, target: str, op: str, operand: Any) -> bool:
    actual: Any
    if target == CompareTarget.VALUE:
        actual = None if kv is None else kv.value
        if actual is None or operand is None:
            same = actual is None and operand is None
            return same if op == "=" else (not same if op == "!=" else False)
    elif kv is None:
        actual = 0
    elif target == CompareTarget.MOD:
        actual = kv.mod_revision
    elif target == CompareTarget.CREATE:
        actual = kv.create_revision
    else:
        actual = kv.version
    if op == "=":
        return bool(actual == operand)
    if op == "!=":
        return bool(actual != operand)
    if op == "<":
        return bool(actual < operand)
    return bool(actual > operand)


def _take_whole_revisions(events: Iterable[Event], limit: int) -> list[Event]:
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


def _write_put(
    conn: sqlite3.Connection, key: str, value: bytes, prev: KeyValue | None, rev: int, hid: int
) -> KeyValue:
    """Write a put of `key` as history row `hid` at revision `rev` and point the current-state
    index at it; `prev` is the key's live value (None: this put creates it)."""
    if prev is None:
        conn.execute(_SQL_HISTORY_INSERT, (hid, key, _PUT, rev, 1, value))
        conn.execute(_SQL_KV_INSERT, (key, hid, rev, 1))
        return KeyValue(key, value, rev, rev, 1)
    kv = KeyValue(key, value, prev.create_revision, rev, prev.version + 1)
    conn.execute(_SQL_HISTORY_INSERT, (hid, key, _PUT, kv.create_revision, kv.version, value))
    conn.execute(_SQL_KV_UPDATE, (hid, kv.version, key))
    return kv


class MVCCStore:
    """See the module docstring. Synchronous; call through a `DbThread`."""

    accepts_batches = True  # an entry may hold several commands (raft/statemachine.py)

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        quota_bytes: int = DEFAULT_QUOTA_BYTES,
        history_ring: int = DEFAULT_HISTORY_RING,
        commit_interval: float = DEFAULT_COMMIT_INTERVAL,
    ) -> None:
        self._path = os.fspath(path)
        self._commit_interval = commit_interval
        self._txn_since = 0.0  # time.monotonic() when the open apply transaction began
        self._quota = quota_bytes
        self._ring_size = max(0, history_ring)
        self._applied = 0
        self._rev = 1
        self._compact = 0
        self._logical = 0
        # Recent events in (revision, key) order; complete for every revision >= _ring_floor.
        self._ring: list[Event] = []
        self._ring_bytes = 0  # Σ _event_bytes over the ring
        self._ring_floor = 2
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
        conn.execute(f"PRAGMA cache_size=-{_CACHE_KIB}")
        conn.execute("PRAGMA temp_store=MEMORY")
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            if version == 0:
                for sql in _SCHEMA:
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
        self._reset_events()  # the ring starts empty: complete from the next revision on
        conn.execute(_SQL_CHECKPOINT)

    def _load_meta(self) -> None:
        row = self._db().execute(_SQL_META_LOAD).fetchone()
        self._applied, self._rev, self._compact, self._logical = (int(x) for x in row)

    def _reset_events(self) -> None:
        self._ring = []
        self._ring_bytes = 0
        self._ring_floor = self._rev + 1

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError(f"{self._path}: store is closed")
        return self._conn

    # ------------------------------------------------------------------ StateMachine
    def applied_index(self) -> int:
        return self._applied

    def apply(self, entries: Sequence[Entry]) -> Applied[Event]:
        """Apply, in one transaction, every entry above the applied index; see the module doc.

        Returns one result per entry: None for skipped, empty and conf-change entries, else a
        WriteResult (create, put, delete, compact, noop, unknown) or TxnResult (txn); and the
        events of the writes, in order.
        Raises ValueError (applying nothing) if the new entries do not continue the applied
        index contiguously: skipping an index would silently lose a committed command.
        """
        conn = self._db()
        applied = self._applied
        expected = applied + 1
        for e in entries:
            if e.index <= applied:
                continue
            if e.index != expected:
                raise ValueError(f"entry {e.index} does not follow applied index {expected - 1}")
            expected += 1
        if expected == applied + 1:
            return Applied([None] * len(entries))

        results: list[object] = []
        events: list[Event] = []
        self._compacted = False
        if not conn.in_transaction:
            conn.execute("BEGIN IMMEDIATE")
            self._txn_since = time.monotonic()
        # This batch's writes and the applied index it reaches are all-or-nothing inside the
        # (possibly longer) transaction: on a failure it rolls back to here.
        conn.execute("SAVEPOINT apply")
        try:
            for e in entries:
                if e.index <= applied or e.type != EntryType.NORMAL or not e.data:
                    results.append(None)  # conf changes only advance the index
                elif e.data[:1] == BATCH_TAG:
                    results.append(self._execute_batch(e.data, events))
                else:
                    results.append(self._execute(e.data, events))
            conn.execute(_SQL_META_SAVE, (expected - 1, self._rev, self._compact, self._logical))
            conn.execute("RELEASE apply")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK TO apply")
                conn.execute("RELEASE apply")
            self._load_meta()  # the cached counters may have moved with the rolled-back writes
            raise
        self._applied = expected - 1
        if events:
            self._ring_extend(events)
        if self._compacted:
            # Outside the transaction: a checkpoint cannot run inside one. TRUNCATE brings the
            # WAL, which now holds the compaction's page changes, back to zero bytes.
            self.commit()
            conn.execute(_SQL_CHECKPOINT)
        elif time.monotonic() - self._txn_since >= self._commit_interval:
            self.commit()
        return Applied(results, events)

    def commit(self) -> None:
        """Commit the applies made since the last commit (a no-op if there are none)."""
        conn = self._db()
        if conn.in_transaction:
            conn.execute("COMMIT")

    def snapshot(self) -> tuple[int, bytes]:
        """The applied index and the whole database image at exactly that index."""
        conn = self._db()
        self.commit()
        conn.execute(_SQL_CHECKPOINT)  # everything in the main file; WAL back to zero
        return self._applied, conn.serialize()

    def restore(self, index: int, data: bytes) -> None:
        """Replace the whole database with a `snapshot()` image whose applied index is `index`.

        The image is opened and checked in memory first (SQLite format, integrity, schema
        version, applied index); on any mismatch ValueError is raised and nothing changes.
        Then SQLite's backup API copies it over the file in one write transaction. The event
        ring is cleared: watchers must resume via `events_since`.
        """
        conn = self._db()
        self.commit()  # the applies so far stand until the restore replaces them all
        image = bytearray(data)
        if len(image) < 100 or not image.startswith(b"SQLite format 3\x00"):
            raise ValueError("snapshot is not an SQLite database image")
        # The image of a WAL database says so in its header (bytes 18-19 = 2); an in-memory
        # database cannot use WAL, so present it as a rollback-journal database.
        image[18] = image[19] = 1
        mem = sqlite3.connect(":memory:", isolation_level=None)
        try:
            try:
                mem.deserialize(bytes(image))
                check = mem.execute("PRAGMA quick_check").fetchone()[0]
                version = int(mem.execute("PRAGMA user_version").fetchone()[0])
                page_size = int(mem.execute("PRAGMA page_size").fetchone()[0])
                row = mem.execute(_SQL_META_LOAD).fetchone() if version == SCHEMA_VERSION else None
            except sqlite3.DatabaseError as exc:
                raise ValueError(f"snapshot is not a readable store database: {exc}") from exc
            if check != "ok":
                raise ValueError(f"snapshot fails the integrity check: {check}")
            if row is None:
                raise ValueError(f"snapshot has schema version {version}, not {SCHEMA_VERSION}")
            if int(row[0]) != index:
                raise ValueError(f"snapshot is at applied index {row[0]}, expected {index}")
            own = int(conn.execute("PRAGMA page_size").fetchone()[0])
            if page_size != own:
                raise ValueError(f"snapshot page size {page_size} differs from ours ({own})")
            mem.backup(conn)  # pages=-1: one step, one write transaction on `conn`
        finally:
            mem.close()
        self._load_meta()
        self._reset_events()
        conn.execute(_SQL_CHECKPOINT)

    def close(self) -> None:
        """Commit and close the connection; idempotent."""
        if self._conn is not None:
            self.commit()
            conn, self._conn = self._conn, None
            conn.close()

    # ------------------------------------------------------------------ commands
    def _execute_batch(
        self, data: bytes, events: list[Event]
    ) -> list[WriteResult | TxnResult | None] | WriteResult:
        try:
            commands = unpack_batch(data)
        except ValueError as exc:
            return self._fail(InvalidRequest(str(exc)))
        # An empty command is a no-op with no result, as an empty entry is.
        return [self._execute(c, events) if c else None for c in commands]

    def _execute(self, data: bytes, events: list[Event]) -> WriteResult | TxnResult:
        try:
            cmd: Any = msgpack.unpackb(data, raw=False)
        except Exception as exc:  # msgpack raises many types for garbage input
            return self._fail(InvalidRequest(f"undecodable command: {type(exc).__name__}"))
        if not isinstance(cmd, list) or not cmd or not isinstance(cmd[0], str):
            return self._fail(InvalidRequest("command is not an array starting with an op name"))
        op = cmd[0]
        try:
            if op == Op.PUT:
                if len(cmd) != 4:
                    raise _Invalid(InvalidRequest("put takes [key, value, expected|nil]"))
                return self._put(cmd[1], cmd[2], _check_revision("expected", cmd[3]), events)
            if op == Op.CREATE:
                if len(cmd) != 3:
                    raise _Invalid(InvalidRequest("create takes [key, value]"))
                return self._put(cmd[1], cmd[2], None, events, create=True)
            if op == Op.DELETE:
                if len(cmd) != 3:
                    raise _Invalid(InvalidRequest("delete takes [key, expected|nil]"))
                return self._delete(cmd[1], _check_revision("expected", cmd[2]), events)
            if op == Op.TXN:
                return self._txn(cmd, events)
            if op == Op.COMPACT:
                if len(cmd) != 2:
                    raise _Invalid(InvalidRequest("compact takes [revision]"))
                return self._compact_to(_check_revision("revision", cmd[1]))
            if op == Op.NOOP:
                if len(cmd) != 1:
                    raise _Invalid(InvalidRequest("noop takes no arguments"))
                return WriteResult(self._rev)
        except _Invalid as bad:
            if op == Op.TXN:
                return TxnResult(False, self._rev, error=bad.error)
            return self._fail(bad.error)
        return self._fail(InvalidRequest(f"unknown operation {op!r:.40}"))

    def _fail(self, error: StoreError) -> WriteResult:
        return WriteResult(self._rev, error=error)

    def _current(self, key: str) -> KeyValue | None:
        row = self._db().execute(_SQL_CURRENT, (key,)).fetchone()
        if row is None:
            return None
        return KeyValue(key, row[3], row[1], row[0] >> _SUB_BITS, row[2])

    def _put(
        self,
        key: Any,
        value: Any,
        expected: int | None,
        events: list[Event],
        *,
        create: bool = False,
    ) -> WriteResult:
        kb = _key_bytes(key)
        vb = _check_value(key, value)
        conn = self._db()
        row = conn.execute(_SQL_CURRENT, (key,)).fetchone()
        prev = None if row is None else KeyValue(key, row[3], row[1], row[0] >> _SUB_BITS, row[2])
        if create and prev is not None:
            return self._fail(KeyExists(f"key {key!r} already exists"))
        if expected is not None and (0 if prev is None else prev.mod_revision) != expected:
            return self._fail(
                Conflict(
                    f"key {key!r} is at mod_revision {0 if prev is None else prev.mod_revision},"
                    f" expected {expected}",
                    prev,
                )
            )
        delta = kb + vb if prev is not None else 2 * kb + vb
        if self._logical + delta > self._quota:
            return self._fail(
                QuotaExceeded(
                    f"put of {key!r} ({delta} bytes) would exceed the quota of {self._quota}"
                    " bytes: compact and delete"
                )
            )
        rev = self._rev + 1
        kv = _write_put(conn, key, value, prev, rev, rev << _SUB_BITS)
        self._rev = rev
        self._logical += delta
        events.append(Event(EventType.PUT, kv, prev))
        return WriteResult(rev, kv, prev)

    def _delete(self, key: Any, expected: int | None, events: list[Event]) -> WriteResult:
        _key_bytes(key)
        prev = self._current(key)
        if prev is None:
            return self._fail(KeyNotFound(f"key {key!r} does not exist"))
        if expected is not None and prev.mod_revision != expected:
            return self._fail(
                Conflict(
                    f"key {key!r} is at mod_revision {prev.mod_revision}, expected {expected}", prev
                )
            )
        rev = self._rev + 1
        self._write_tombstone(key, rev << _SUB_BITS)
        self._rev = rev
        events.append(Event(EventType.DELETE, KeyValue(key, b"", 0, rev, 0), prev))
        return WriteResult(rev, None, prev)

    def _write_tombstone(self, key: str, hid: int) -> None:
        # logical_bytes: +len(key) for the tombstone row, -len(key) for the kv row: unchanged.
        conn = self._db()
        conn.execute(_SQL_HISTORY_INSERT, (hid, key, _DELETE, 0, 0, b""))
        conn.execute(_SQL_KV_DELETE, (key,))

    @staticmethod
    def _parse_ops(what: str, raw: Any) -> list[tuple[str, str, Any]]:
        if not isinstance(raw, list):
            raise _Invalid(InvalidRequest(f"txn {what} must be an array"))
        if len(raw) > MAX_TXN_OPS:
            raise _Invalid(TooLarge(f"txn {what} has {len(raw)} ops, over {MAX_TXN_OPS}"))
        ops: list[tuple[str, str, Any]] = []
        written: set[str] = set()
        for o in raw:
            if not isinstance(o, list) or not o:
                raise _Invalid(InvalidRequest(f"txn {what} op must be a non-empty array"))
            kind = o[0]
            if kind == "get" and len(o) == 2:
                _key_bytes(o[1])
                ops.append(("get", o[1], None))
                continue
            if kind == "put" and len(o) == 3:
                _key_bytes(o[1])
                _check_value(o[1], o[2])
            elif kind == "delete" and len(o) == 2:
                _key_bytes(o[1])
            else:
                raise _Invalid(InvalidRequest(f"txn {what} op {o!r:.80} is malformed"))
            if o[1] in written:
                raise _Invalid(InvalidRequest(f"txn {what} writes key {o[1]!r} twice"))
            written.add(o[1])
            ops.append((kind, o[1], o[2] if kind == "put" else None))
        return ops

    def _txn(self, cmd: list[Any], events: list[Event]) -> TxnResult:
        if len(cmd) != 4 or not isinstance(cmd[1], list):
            raise _Invalid(InvalidRequest("txn takes [compares, success ops, failure ops]"))
        if len(cmd[1]) > MAX_TXN_OPS:
            raise _Invalid(TooLarge(f"txn has {len(cmd[1])} compares, over {MAX_TXN_OPS}"))
        compares: list[tuple[str, str, str, Any]] = []
        for c in cmd[1]:
            if not isinstance(c, list) or len(c) != 4:
                raise _Invalid(InvalidRequest("txn compare must be [key, target, op, operand]"))
            key, target, op, operand = c
            _key_bytes(key)
            if op not in _COMPARE_OPS:
                raise _Invalid(InvalidRequest(f"txn compare op {op!r:.20} is not = != < >"))
            if target in _INT_TARGETS:
                if isinstance(operand, bool) or not isinstance(operand, int):
                    raise _Invalid(InvalidRequest(f"txn compare on {target} needs an integer"))
            elif target == CompareTarget.VALUE:
                if operand is not None and not isinstance(operand, bytes):
                    raise _Invalid(InvalidRequest("txn compare on value needs bytes or nil"))
            else:
                raise _Invalid(InvalidRequest(f"txn compare target {target!r:.20} is unknown"))
            compares.append((key, target, op, operand))
        success = self._parse_ops("success", cmd[2])
        failure = self._parse_ops("failure", cmd[3])

        state: dict[str, KeyValue | None] = {}

        def current(key: str) -> KeyValue | None:
            if key not in state:
                state[key] = self._current(key)
            return state[key]

        succeeded = all(_compare(current(k), t, o, v) for k, t, o, v in compares)
        ops = success if succeeded else failure
        # Writes that change something, with their predecessors (each key at most once).
        changes: dict[str, KeyValue | None] = {}
        delta = 0
        for kind, key, value in ops:
            if kind == "get":
                continue
            prev = current(key)
            if kind == "put":
                kb = len(key.encode())
                delta += kb + len(value) + (0 if prev is not None else kb)
                changes[key] = prev
            elif prev is not None:
                changes[key] = prev
        if delta > 0 and self._logical + delta > self._quota:
            return TxnResult(
                False,
                self._rev,
                error=QuotaExceeded(
                    f"txn ({delta} bytes) would exceed the quota of {self._quota} bytes:"
                    " compact and delete"
                ),
            )
        rev = self._rev + 1 if changes else self._rev
        subs = {key: i for i, key in enumerate(sorted(changes))}
        conn = self._db()
        responses: list[KeyValue | None] = []
        new_events: list[Event] = []
        for kind, key, value in ops:
            if kind == "get":
                responses.append(current(key))
            elif key not in changes:
                continue  # delete of a missing key: nothing to do
            elif kind == "put":
                prev = changes[key]
                kv = _write_put(conn, key, value, prev, rev, rev << _SUB_BITS | subs[key])
                state[key] = kv
                new_events.append(Event(EventType.PUT, kv, prev))
            else:
                self._write_tombstone(key, rev << _SUB_BITS | subs[key])
                state[key] = None
                new_events.append(
                    Event(EventType.DELETE, KeyValue(key, b"", 0, rev, 0), changes[key])
                )
        new_events.sort(key=lambda ev: ev.kv.key)
        events.extend(new_events)
        self._rev = rev
        self._logical += delta
        return TxnResult(succeeded, rev, responses)

    def _compact_to(self, target: int | None) -> WriteResult:
        if target is None:
            raise _Invalid(InvalidRequest("compact takes a revision"))
        if target <= self._compact:
            return self._fail(
                Compacted(
                    f"revision {target} is already compacted (compact revision {self._compact})",
                    self._compact,
                )
            )
        if target > self._rev:
            return self._fail(
                FutureRevision(f"cannot compact to revision {target}: the store is at {self._rev}")
            )
        conn = self._db()
        window = ((self._compact + 1) << _SUB_BITS, (target + 1) << _SUB_BITS)
        freed = int(conn.execute(_SQL_COMPACT_BYTES, window).fetchone()[0])
        conn.execute(_SQL_COMPACT_DELETE, window)
        self._logical -= freed
        self._compact = target
        self._compacted = True
        self.compactions += 1
        return WriteResult(self._rev)

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
        _check_text("key", key)
        rev = self._read_revision(revision)
        if rev == self._rev:
            return self._current(key)
        row = self._db().execute(_SQL_GET_AT, (key, (rev + 1) << _SUB_BITS)).fetchone()
        if row is None or row[0] != _PUT:
            return None
        return KeyValue(key, row[4], row[1], row[2] >> _SUB_BITS, row[3])

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
        lower, upper = _bounds(prefix, start_after)
        conn = self._db()
        current = rev == self._rev
        args: tuple[Any, ...] = (
            (lower, upper) if current else (lower, upper, (rev + 1) << _SUB_BITS)
        )
        count_sql = _SQL_COUNT if current else _SQL_COUNT_AT
        if count_only:
            count = int(conn.execute(count_sql, args).fetchone()[0])
            return RangeResult([], rev, False, count)
        rows = conn.execute(
            _SQL_RANGE if current else _SQL_RANGE_AT, (*args, limit + 1 if limit else _NO_LIMIT)
        ).fetchall()
        more = bool(limit) and len(rows) > limit
        if more:
            del rows[limit:]
        kvs = [KeyValue(r[0], r[1], r[2], r[3] >> _SUB_BITS, r[4]) for r in rows]
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
        lower, upper = _bounds(prefix, "")
        if self._ring_size and revision >= self._ring_floor:
            ring = self._ring
            start = bisect.bisect_left(ring, revision, key=lambda ev: ev.kv.mod_revision)
            return _take_whole_revisions(
                (ev for ev in ring[start:] if ev.kv.key.startswith(prefix)), limit
            )
        # A revision has at most MAX_TXN_OPS events: limit + MAX_TXN_OPS rows always reach
        # the end of the revision that straddles the limit.
        rows = (
            self._db()
            .execute(
                _SQL_EVENTS,
                (
                    max(revision, 0) << _SUB_BITS,
                    lower,
                    upper,
                    limit + MAX_TXN_OPS if limit else _NO_LIMIT,
                ),
            )
            .fetchall()
        )
        events = []
        for hid, key, kind, create, version, value, ptype, pcreate, pid, pversion, pvalue in rows:
            rev = hid >> _SUB_BITS
            prev = (
                None
                if ptype != _PUT
                else KeyValue(key, pvalue, pcreate, pid >> _SUB_BITS, pversion)
            )
            if kind == _PUT:
                events.append(
                    Event(EventType.PUT, KeyValue(key, value, create, rev, version), prev)
                )
            else:
                events.append(Event(EventType.DELETE, KeyValue(key, b"", 0, rev, 0), prev))
        return _take_whole_revisions(events, limit)

    def _ring_extend(self, events: list[Event]) -> None:
        """Append to the ring; past 2x its event count or its byte budget, drop the oldest
        events in bulk (amortized O(1) per event) down to 1x / half the budget."""
        if not self._ring_size:
            return
        ring = self._ring
        ring.extend(events)
        self._ring_bytes += sum(_event_bytes(ev) for ev in events)
        if len(ring) <= 2 * self._ring_size and self._ring_bytes <= _RING_MAX_BYTES:
            return
        cut = max(0, len(ring) - self._ring_size)
        dropped = sum(_event_bytes(ev) for ev in ring[:cut])
        while cut < len(ring) and self._ring_bytes - dropped > _RING_MAX_BYTES // 2:
            dropped += _event_bytes(ring[cut])
            cut += 1
        if cut:
            self._ring_floor = ring[cut - 1].kv.mod_revision + 1
            del ring[:cut]
            self._ring_bytes -= dropped

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
        keys = int(self._db().execute(_SQL_KV_COUNT).fetchone()[0])
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
        self._db().execute(_SQL_CHECKPOINT)
        return True


def _event_bytes(ev: Event) -> int:
    return len(ev.kv.key) + len(ev.kv.value) + (0 if ev.prev_kv is None else len(ev.prev_kv.value))


def _file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0


if TYPE_CHECKING:
    # Static proof that the class satisfies the protocol the driver programs against.
    _check: type[StateMachine[Event]] = MVCCStore
