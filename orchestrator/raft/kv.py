"""A small replicated key-value state machine in SQLite, used to exercise Raft end to end.

Job: apply committed log entries carrying msgpack commands (put, delete, compare-and-swap, no-op)
to a `kv` table, serve local reads, and produce/restore snapshots. It implements the general
`StateMachine` protocol so the real MVCC store can replace it later.

Invariants:
- Exactly-once apply: the applied index lives in the same database as the data and is updated in
  the same transaction as the effects of the entries up to it; entries at or below it are skipped.
- Determinism: the result of a command depends only on the command and the current state, and a
  malformed command yields an `InvalidCommand` result (never an exception), so every replica
  applying the same log reaches the same state and the same results.
- Commits are not fsynced (WAL, `synchronous=NORMAL`): see `_init_db` for why that is safe.
  The connection uses `check_same_thread=False` because `DbThread` may run successive calls on
  different threads, never two at once.

Command format (msgpack array): ["put", key, value] | ["del", key] | ["cas", key, expected|nil, new]
| ["noop"]. Keys are str, values bytes.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgpack

from .types import Entry, EntryType

if TYPE_CHECKING:
    from .statemachine import StateMachine

_OP_PUT = "put"
_OP_DELETE = "del"
_OP_CAS = "cas"
_OP_NOOP = "noop"

_SQL_GET = "SELECT value FROM kv WHERE key = ?"
_SQL_PUT = (
    "INSERT INTO kv (key, value) VALUES (?, ?)"
    " ON CONFLICT (key) DO UPDATE SET value = excluded.value"
)
_SQL_DELETE = "DELETE FROM kv WHERE key = ?"
_SQL_GET_APPLIED = "SELECT idx FROM applied WHERE id = 1"
_SQL_SET_APPLIED = "UPDATE applied SET idx = ? WHERE id = 1"


@dataclass(frozen=True, slots=True)
class InvalidCommand:
    """The result of applying an entry whose data is not a well-formed command."""

    message: str


def _pack(obj: object) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]  # msgpack is untyped


def encode_put(key: str, value: bytes) -> bytes:
    return _pack([_OP_PUT, key, value])


def encode_delete(key: str) -> bytes:
    return _pack([_OP_DELETE, key])


def encode_cas(key: str, expected: bytes | None, new: bytes) -> bytes:
    """Set `key` to `new` only if its current value is `expected` (None: only if absent)."""
    return _pack([_OP_CAS, key, expected, new])


def encode_noop() -> bytes:
    return _pack([_OP_NOOP])


class KVStateMachine:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = os.fspath(path)
        # isolation_level=None: transactions are explicit so the applied index and the data
        # it covers are always committed together.
        self._conn: sqlite3.Connection | None = sqlite3.connect(
            self._path, check_same_thread=False, isolation_level=None
        )
        try:
            self._init_db()
        except BaseException:
            self.close()
            raise

    def _init_db(self) -> None:
        conn = self._db()
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise RuntimeError(f"{self._path}: cannot enable WAL journal (got {mode!r})")
        # NORMAL, not FULL: the Raft log is the durable record (fsynced before anything is
        # acknowledged), so this database need not fsync each commit. WAL+NORMAL stays
        # consistent: a power cut can only lose the last commits, moving the applied index
        # back; the driver then replays those entries from the log, or restores the durable
        # snapshot if the log was compacted past them (it only compacts behind a snapshot
        # fsynced in the Raft database). This halves the fsyncs on the write path.
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value BLOB NOT NULL)"
            )
            conn.execute(
                "CREATE TABLE IF NOT EXISTS applied"
                " (id INTEGER PRIMARY KEY CHECK (id = 1), idx INTEGER NOT NULL)"
            )
            conn.execute("INSERT OR IGNORE INTO applied (id, idx) VALUES (1, 0)")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError(f"{self._path}: state machine is closed")
        return self._conn

    def applied_index(self) -> int:
        return int(self._db().execute(_SQL_GET_APPLIED).fetchone()[0])

    def apply(self, entries: Sequence[Entry]) -> list[object]:
        """Apply, in one transaction, every entry above the applied index; see the module doc.

        Raises ValueError (applying nothing) if the new entries do not continue the applied
        index contiguously: skipping an index would silently lose a committed command.
        """
        conn = self._db()
        applied = self.applied_index()
        expected = applied + 1
        for e in entries:
            if e.index <= applied:
                continue
            if e.index != expected:
                raise ValueError(f"entry {e.index} does not follow applied index {expected - 1}")
            expected += 1
        if expected == applied + 1:
            return [None] * len(entries)

        results: list[object] = []
        conn.execute("BEGIN IMMEDIATE")
        try:
            for e in entries:
                if e.index <= applied or e.type != EntryType.NORMAL or not e.data:
                    # Conf changes are the Raft layer's business; they only advance the index.
                    results.append(None)
                else:
                    results.append(self._execute(conn, e.data))
            conn.execute(_SQL_SET_APPLIED, (expected - 1,))
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return results

    @staticmethod
    def _execute(conn: sqlite3.Connection, data: bytes) -> object:
        try:
            cmd: Any = msgpack.unpackb(data, raw=False)
        except Exception as exc:  # msgpack raises many types for garbage input
            return InvalidCommand(f"undecodable command: {type(exc).__name__}: {exc}")
        if not isinstance(cmd, list) or not cmd or not isinstance(cmd[0], str):
            return InvalidCommand("command is not an array starting with an operation name")
        op, args = cmd[0], cmd[1:]
        if op == _OP_PUT:
            if len(args) != 2 or not isinstance(args[0], str) or not isinstance(args[1], bytes):
                return InvalidCommand("put takes [key: str, value: bytes]")
            conn.execute(_SQL_PUT, (args[0], args[1]))
            return True
        if op == _OP_DELETE:
            if len(args) != 1 or not isinstance(args[0], str):
                return InvalidCommand("del takes [key: str]")
            return conn.execute(_SQL_DELETE, (args[0],)).rowcount > 0
        if op == _OP_CAS:
            if (
                len(args) != 3
                or not isinstance(args[0], str)
                or not (args[1] is None or isinstance(args[1], bytes))
                or not isinstance(args[2], bytes)
            ):
                return InvalidCommand("cas takes [key: str, expected: bytes | nil, new: bytes]")
            key, want, new = args
            row = conn.execute(_SQL_GET, (key,)).fetchone()
            current = None if row is None else bytes(row[0])
            if current != want:
                return False
            conn.execute(_SQL_PUT, (key, new))
            return True
        if op == _OP_NOOP:
            if args:
                return InvalidCommand("noop takes no arguments")
            return None
        return InvalidCommand(f"unknown operation {op!r}")

    def get(self, key: str) -> bytes | None:
        """Read the local, possibly stale, value; linearizability is the caller's business."""
        row = self._db().execute(_SQL_GET, (key,)).fetchone()
        return None if row is None else bytes(row[0])

    def snapshot(self) -> tuple[int, bytes]:
        conn = self._db()
        # One read transaction so the rows and the index describe the same moment.
        conn.execute("BEGIN")
        try:
            index = int(conn.execute(_SQL_GET_APPLIED).fetchone()[0])
            rows = conn.execute("SELECT key, value FROM kv ORDER BY key").fetchall()
        finally:
            conn.execute("COMMIT")
        return index, _pack([[k, bytes(v)] for k, v in rows])

    def restore(self, index: int, data: bytes) -> None:
        """Replace every row with the snapshot's and set the applied index, atomically.

        Raises ValueError (changing nothing) if `data` is not a snapshot this class produced.
        """
        try:
            decoded: Any = msgpack.unpackb(data, raw=False)
        except Exception as exc:
            raise ValueError(f"undecodable snapshot: {exc}") from exc
        if not isinstance(decoded, list) or not all(
            isinstance(r, list)
            and len(r) == 2
            and isinstance(r[0], str)
            and isinstance(r[1], bytes)
            for r in decoded
        ):
            raise ValueError("snapshot is not a list of [key: str, value: bytes] pairs")
        if len({r[0] for r in decoded}) != len(decoded):
            raise ValueError("snapshot repeats a key")
        conn = self._db()
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("DELETE FROM kv")
            conn.executemany("INSERT INTO kv (key, value) VALUES (?, ?)", decoded)
            conn.execute(_SQL_SET_APPLIED, (index,))
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def close(self) -> None:
        """Close the connection; idempotent. Every applied entry is already durable."""
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.close()


if TYPE_CHECKING:
    # Static proof that the class satisfies the protocol the driver programs against.
    _check: type[StateMachine] = KVStateMachine
