"""The replicated etcd-style MVCC key space, in one SQLite file: the Raft state machine.

Theory of operation
-------------------
Raft hands `apply` batches of committed entries; each NORMAL entry carries one msgpack command
(`types.encode_*`) or several packed by `raft.statemachine.pack_batch` (one result each, as if
they were consecutive entries). `apply` runs the whole batch of entries inside ONE SQLite
savepoint, which also records the new applied index, so a batch is all-or-nothing. Consecutive
batches share one SQLite transaction: the first `apply` after a commit begins it, and the first
one that finds it `commit_interval` old (30 s; `RaftStore`'s upkeep also commits every 30 s), or
finds that it changed `COMMIT_CHANGES` rows (about 1,000 puts), commits it, as etcd's backend
batches its bbolt transactions (every 100 ms there). The pages that many batches write (the
index leaves every writer's keys sit in) are then written to the WAL once per commit instead of
once per batch: about a fifth less CPU per put at a few dozen puts per batch than a commit per
batch, and 100 ms about 8 % less than 50 ms at a few thousand puts/s (each hot leaf is written
half as often); 30 s rather than 100 ms is for flash (store.db WAL bytes per key write at a
churn of 10 writes/s: 6.7 KiB at 100 ms, 1.8 KiB at 30 s; see
`mvcc_reads.DEFAULT_COMMIT_INTERVAL`). `apply_now`, the driver's apply of a few small commands
on its event loop (no thread hop for a lone write), never commits: the driver commits on the
database's thread when `commit_due()`. Reads use the same connection, so they see every applied
batch at once; `commit()` (and `sync`, `snapshot`, `restore`, `maybe_checkpoint`, `close`, which
call it) ends the transaction. A crash loses the applies of the open transaction only, together
with the applied index that covers them: the driver hands those entries again (the Raft log
keeps everything above the synced state machine).

The tables and statements are in `mvcc_sql` (the layout), the command checks in
`mvcc_checks`, the snapshot image in `mvcc_snapshot`, the
fields, setup and reads in `mvcc_reads` (`MVCCReader`, which `MVCCStore` extends with apply
and the write commands).

A successful write command (create, put, delete, or a txn whose chosen branch changes at least
one key) takes revision `revision + 1`; a txn with several writes takes one revision for all of
them; reads, failed commands, a txn whose branch only reads, compaction and noop take none.
Every write also makes `Event`s (with `prev_kv`): `apply` returns them with its results
(`Applied.events`; the driver hands them to the watch layer, whose ring of recent events is the
one in-memory copy of recent history). `events_since` reads the `history` table: the watch hub
asks it only for revisions its ring no longer holds.

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

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgpack

from orchestrator.raft.statemachine import BATCH_TAG, Applied, unpack_batch
from orchestrator.raft.types import Entry, EntryType
from orchestrator.store.mvcc_checks import (
    COMPARE_OPS,
    INT_TARGETS,
    Invalid,
    check_revision,
    check_value,
    compare,
    key_bytes,
)
from orchestrator.store.mvcc_reads import COMMIT_CHANGES, DEFAULT_QUOTA_BYTES, MVCCReader
from orchestrator.store.mvcc_snapshot import database_image, install_image
from orchestrator.store.mvcc_sql import (
    DELETE,
    SQL_CHECKPOINT,
    SQL_COMPACT_BYTES,
    SQL_COMPACT_DELETE,
    SQL_CURRENT,
    SQL_HISTORY_INSERT,
    SQL_KV_DELETE,
    SQL_META_SAVE,
    SUB_BITS,
    write_put,
)
from orchestrator.store.types import (
    MAX_TXN_OPS,
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
    StoreError,
    TooLarge,
    TxnResult,
    WriteResult,
)

if TYPE_CHECKING:
    from orchestrator.raft.statemachine import StateMachine


__all__ = ["DEFAULT_QUOTA_BYTES", "MVCCStore"]


# `apply_now` applies at most this much command data on the caller's event loop: a lone write
# or a few (a few hundred microseconds of CPU), not the batches of a loaded server.
APPLY_NOW_BYTES = 16 * 1024
# In every encoded compact command (msgpack fixstr "compact"); a value holding these bytes only
# sends its entry to `apply`, which is always right.
_COMPACT_MARK = msgpack.packb(Op.COMPACT)


class MVCCStore(MVCCReader):
    """See the module docstring. Synchronous; call through a `DbThread`."""

    accepts_batches = True  # an entry may hold several commands (raft/statemachine.py)

    # ------------------------------------------------------------------ StateMachine
    def applied_index(self) -> int:
        return self._applied

    def apply_now(self, entries: Sequence[Entry]) -> Applied[Event] | None:
        """`apply` for a caller on an event loop (`raft.statemachine.AppliesNow`): only a few
        small commands (up to `APPLY_NOW_BYTES`) and no compaction (it deletes history in
        bulk, then checkpoints), and the transaction is left open whatever its age: the
        caller commits it on the database's thread when `commit_due()`. None: not applied."""
        if sum(len(e.data) for e in entries) > APPLY_NOW_BYTES or any(
            _COMPACT_MARK in e.data for e in entries
        ):
            return None
        return self._apply(entries, end=False)

    def commit_due(self) -> bool:
        """Is the open apply transaction `commit_interval` old, or has it changed
        `COMMIT_CHANGES` rows?"""
        conn = self._db()
        return conn.in_transaction and (
            time.monotonic() - self._txn_since >= self._commit_interval
            or conn.total_changes - self._txn_changes >= COMMIT_CHANGES
        )

    def apply(self, entries: Sequence[Entry]) -> Applied[Event]:
        """Apply, in one transaction, every entry above the applied index; see the module doc.

        Returns one result per entry: None for skipped, empty and conf-change entries, else a
        WriteResult (create, put, delete, compact, noop, unknown) or TxnResult (txn); and the
        events of the writes, in order.
        Raises ValueError (applying nothing) if the new entries do not continue the applied
        index contiguously: skipping an index would silently lose a committed command.
        """
        return self._apply(entries, end=True)

    def _apply(self, entries: Sequence[Entry], *, end: bool) -> Applied[Event]:
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
            self._txn_changes = conn.total_changes
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
            conn.execute(SQL_META_SAVE, (expected - 1, self._rev, self._compact, self._logical))
            conn.execute("RELEASE apply")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK TO apply")
                conn.execute("RELEASE apply")
            self._load_meta()  # the cached counters may have moved with the rolled-back writes
            raise
        self._applied = expected - 1
        if self._compacted:
            # Outside the transaction: a checkpoint cannot run inside one. TRUNCATE brings the
            # WAL, which now holds the compaction's page changes, back to zero bytes.
            self.commit()
            conn.execute(SQL_CHECKPOINT)
        elif end and self.commit_due():
            self.commit()
        return Applied(results, events)

    def snapshot(self) -> tuple[int, bytes]:
        """The applied index and the whole database image at exactly that index."""
        conn = self._db()
        self.commit()
        return self._applied, database_image(conn)

    def restore(self, index: int, data: bytes) -> None:
        """Replace the whole database with a `snapshot()` image whose applied index is `index`.

        The image is opened and checked in memory first (SQLite format, integrity, schema
        version, applied index); on any mismatch ValueError is raised and nothing changes.
        Then SQLite's backup API copies it over the file in one write transaction.
        """
        conn = self._db()
        self.commit()  # the applies so far stand until the restore replaces them all
        install_image(conn, index, data)
        self._load_meta()
        conn.execute(SQL_CHECKPOINT)

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
                    raise Invalid(InvalidRequest("put takes [key, value, expected|nil]"))
                return self._put(cmd[1], cmd[2], check_revision("expected", cmd[3]), events)
            if op == Op.CREATE:
                if len(cmd) != 3:
                    raise Invalid(InvalidRequest("create takes [key, value]"))
                return self._put(cmd[1], cmd[2], None, events, create=True)
            if op == Op.DELETE:
                if len(cmd) != 3:
                    raise Invalid(InvalidRequest("delete takes [key, expected|nil]"))
                return self._delete(cmd[1], check_revision("expected", cmd[2]), events)
            if op == Op.TXN:
                return self._txn(cmd, events)
            if op == Op.COMPACT:
                if len(cmd) != 2:
                    raise Invalid(InvalidRequest("compact takes [revision]"))
                return self._compact_to(check_revision("revision", cmd[1]))
            if op == Op.NOOP:
                if len(cmd) != 1:
                    raise Invalid(InvalidRequest("noop takes no arguments"))
                return WriteResult(self._rev)
        except Invalid as bad:
            if op == Op.TXN:
                return TxnResult(False, self._rev, error=bad.error)
            return self._fail(bad.error)
        return self._fail(InvalidRequest(f"unknown operation {op!r:.40}"))

    def _fail(self, error: StoreError) -> WriteResult:
        return WriteResult(self._rev, error=error)

    def _put(
        self,
        key: Any,
        value: Any,
        expected: int | None,
        events: list[Event],
        *,
        create: bool = False,
    ) -> WriteResult:
        kb = key_bytes(key)
        vb = check_value(key, value)
        conn = self._db()
        row = conn.execute(SQL_CURRENT, (key,)).fetchone()
        prev = None if row is None else KeyValue(key, row[3], row[1], row[0] >> SUB_BITS, row[2])
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
        kv = write_put(conn, key, value, prev, rev, rev << SUB_BITS)
        self._rev = rev
        self._logical += delta
        events.append(Event(EventType.PUT, kv, prev))
        return WriteResult(rev, kv, prev)

    def _delete(self, key: Any, expected: int | None, events: list[Event]) -> WriteResult:
        key_bytes(key)
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
        self._write_tombstone(key, rev << SUB_BITS)
        self._rev = rev
        events.append(Event(EventType.DELETE, KeyValue(key, b"", 0, rev, 0), prev))
        return WriteResult(rev, None, prev)

    def _write_tombstone(self, key: str, hid: int) -> None:
        # logical_bytes: +len(key) for the tombstone row, -len(key) for the kv row: unchanged.
        conn = self._db()
        conn.execute(SQL_HISTORY_INSERT, (hid, key, DELETE, 0, 0, b""))
        conn.execute(SQL_KV_DELETE, (key,))

    @staticmethod
    def _parse_ops(what: str, raw: Any) -> list[tuple[str, str, Any]]:
        if not isinstance(raw, list):
            raise Invalid(InvalidRequest(f"txn {what} must be an array"))
        if len(raw) > MAX_TXN_OPS:
            raise Invalid(TooLarge(f"txn {what} has {len(raw)} ops, over {MAX_TXN_OPS}"))
        ops: list[tuple[str, str, Any]] = []
        written: set[str] = set()
        for o in raw:
            if not isinstance(o, list) or not o:
                raise Invalid(InvalidRequest(f"txn {what} op must be a non-empty array"))
            kind = o[0]
            if kind == "get" and len(o) == 2:
                key_bytes(o[1])
                ops.append(("get", o[1], None))
                continue
            if kind == "put" and len(o) == 3:
                key_bytes(o[1])
                check_value(o[1], o[2])
            elif kind == "delete" and len(o) == 2:
                key_bytes(o[1])
            else:
                raise Invalid(InvalidRequest(f"txn {what} op {o!r:.80} is malformed"))
            if o[1] in written:
                raise Invalid(InvalidRequest(f"txn {what} writes key {o[1]!r} twice"))
            written.add(o[1])
            ops.append((kind, o[1], o[2] if kind == "put" else None))
        return ops

    def _txn(self, cmd: list[Any], events: list[Event]) -> TxnResult:
        if len(cmd) != 4 or not isinstance(cmd[1], list):
            raise Invalid(InvalidRequest("txn takes [compares, success ops, failure ops]"))
        if len(cmd[1]) > MAX_TXN_OPS:
            raise Invalid(TooLarge(f"txn has {len(cmd[1])} compares, over {MAX_TXN_OPS}"))
        compares: list[tuple[str, str, str, Any]] = []
        for c in cmd[1]:
            if not isinstance(c, list) or len(c) != 4:
                raise Invalid(InvalidRequest("txn compare must be [key, target, op, operand]"))
            key, target, op, operand = c
            key_bytes(key)
            if op not in COMPARE_OPS:
                raise Invalid(InvalidRequest(f"txn compare op {op!r:.20} is not = != < >"))
            if target in INT_TARGETS:
                if isinstance(operand, bool) or not isinstance(operand, int):
                    raise Invalid(InvalidRequest(f"txn compare on {target} needs an integer"))
            elif target == CompareTarget.VALUE:
                if operand is not None and not isinstance(operand, bytes):
                    raise Invalid(InvalidRequest("txn compare on value needs bytes or nil"))
            else:
                raise Invalid(InvalidRequest(f"txn compare target {target!r:.20} is unknown"))
            compares.append((key, target, op, operand))
        success = self._parse_ops("success", cmd[2])
        failure = self._parse_ops("failure", cmd[3])

        state: dict[str, KeyValue | None] = {}

        def current(key: str) -> KeyValue | None:
            if key not in state:
                state[key] = self._current(key)
            return state[key]

        succeeded = all(compare(current(k), t, o, v) for k, t, o, v in compares)
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
                kv = write_put(conn, key, value, prev, rev, rev << SUB_BITS | subs[key])
                state[key] = kv
                new_events.append(Event(EventType.PUT, kv, prev))
            else:
                self._write_tombstone(key, rev << SUB_BITS | subs[key])
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
            raise Invalid(InvalidRequest("compact takes a revision"))
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
        window = ((self._compact + 1) << SUB_BITS, (target + 1) << SUB_BITS)
        freed = int(conn.execute(SQL_COMPACT_BYTES, window).fetchone()[0])
        conn.execute(SQL_COMPACT_DELETE, window)
        self._logical -= freed
        self._compact = target
        self._compacted = True
        self.compactions += 1
        return WriteResult(self._rev)


if TYPE_CHECKING:
    # Static proof that the class satisfies the protocol the driver programs against.
    _check: type[StateMachine[Event]] = MVCCStore
