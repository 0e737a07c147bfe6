"""Value types of the MVCC store: keys with revisions, events, commands, results and errors.

The model is etcd's (see ../shared/reference/store-notes.md §1):
- one global `revision` counter, incremented once per successful write command (a transaction
  with several operations gets ONE revision);
- per key: `create_revision` (revision of the write that created the current incarnation),
  `mod_revision` (revision of its last write), `version` (writes since creation, 1 on create);
  a delete ends the incarnation (a later put re-creates it with version 1);
- compare-and-swap on `mod_revision` (0 means "must not exist" for create-style guards).

Commands are what is replicated through Raft: msgpack arrays built by the `encode_*` helpers
here, and decoded (validated) by the state machine. Results are plain dataclasses.

Limits (etcd defaults): a value at most MAX_VALUE_BYTES, a transaction at most MAX_TXN_OPS
operations. The quota (database size) is configured per store.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import msgpack

MAX_VALUE_BYTES = 1_572_864  # 1.5 MiB, etcd's --max-request-bytes
MAX_TXN_OPS = 128  # etcd's --max-txn-ops
MAX_KEY_BYTES = 4096


class EventType(IntEnum):
    PUT = 0
    DELETE = 1


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int


@dataclass(frozen=True, slots=True)
class Event:
    """One change. For DELETE, `kv` has the key, an empty value, version 0 and
    mod_revision = the deleting revision; `prev_kv` is the value before the change (if any)."""

    type: EventType
    kv: KeyValue
    prev_kv: KeyValue | None = None


# ---------------------------------------------------------------------------- errors
class StoreError(Exception):
    """Base of the store's errors. `code` is stable and machine-readable."""

    code = "error"


class KeyExists(StoreError):
    code = "exists"


class KeyNotFound(StoreError):
    code = "not_found"


class Conflict(StoreError):
    """A compare-and-swap failed: `current` is the key's current value (None = absent)."""

    code = "conflict"

    def __init__(self, message: str, current: KeyValue | None = None) -> None:
        super().__init__(message)
        self.current = current


class Compacted(StoreError):
    """The requested revision was compacted away; re-list at `compact_revision` or later."""

    code = "compacted"

    def __init__(self, message: str, compact_revision: int) -> None:
        super().__init__(message)
        self.compact_revision = compact_revision


class FutureRevision(StoreError):
    code = "future_revision"


class TooLarge(StoreError):
    code = "too_large"


class InvalidRequest(StoreError):
    code = "invalid"


class QuotaExceeded(StoreError):
    """The database is over its quota: only deletes and compaction are accepted."""

    code = "no_space"


class NoQuorum(StoreError):
    code = "no_quorum"


class Unavailable(StoreError):
    code = "unavailable"


# ---------------------------------------------------------------------------- commands
class Op:
    CREATE = "create"  # [op, key, value]
    PUT = "put"  # [op, key, value, expected_mod_revision | None]   (None = unconditional)
    DELETE = "delete"  # [op, key, expected_mod_revision | None]
    TXN = "txn"  # [op, [compare...], [success op...], [failure op...]]
    COMPACT = "compact"  # [op, revision]
    NOOP = "noop"  # [op]


class CompareTarget:
    MOD = "mod"  # mod_revision (0 if absent)
    CREATE = "create"  # create_revision (0 if absent)
    VERSION = "version"  # version (0 if absent)
    VALUE = "value"  # value (None if absent)


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]


def encode_create(key: str, value: bytes) -> bytes:
    return _pack([Op.CREATE, key, value])


def encode_put(key: str, value: bytes, expected_mod_revision: int | None = None) -> bytes:
    return _pack([Op.PUT, key, value, expected_mod_revision])


def encode_delete(key: str, expected_mod_revision: int | None = None) -> bytes:
    return _pack([Op.DELETE, key, expected_mod_revision])


@dataclass(frozen=True, slots=True)
class Compare:
    key: str
    target: str  # a CompareTarget
    op: str  # "=", "!=", "<", ">"
    operand: int | bytes | None


@dataclass(frozen=True, slots=True)
class TxnOp:
    """put (value set) or delete (value None) of one key, or a get (get=True)."""

    key: str
    value: bytes | None = None
    get: bool = False


def encode_txn(compares: list[Compare], success: list[TxnOp], failure: list[TxnOp]) -> bytes:
    def ops(xs: list[TxnOp]) -> list[Any]:
        return [
            ["get", o.key]
            if o.get
            else ["put", o.key, o.value]
            if o.value is not None
            else ["delete", o.key]
            for o in xs
        ]

    return _pack(
        [Op.TXN, [[c.key, c.target, c.op, c.operand] for c in compares], ops(success), ops(failure)]
    )


def encode_compact(revision: int) -> bytes:
    return _pack([Op.COMPACT, revision])


def encode_noop() -> bytes:
    return _pack([Op.NOOP])


# ---------------------------------------------------------------------------- results
@dataclass(frozen=True, slots=True)
class WriteResult:
    """Result of create/put/delete: the revision of the write and the key after (None after a
    delete) and before it. A failed command never raises inside the state machine: it returns
    a result with `error` set (a StoreError instance), so every replica stays identical."""

    revision: int
    kv: KeyValue | None = None
    prev_kv: KeyValue | None = None
    error: StoreError | None = None


@dataclass(frozen=True, slots=True)
class TxnResult:
    succeeded: bool
    revision: int  # the store revision after the transaction (unchanged if it wrote nothing)
    responses: list[KeyValue | None] = field(default_factory=list)  # one per get op, in order
    error: StoreError | None = None


@dataclass(frozen=True, slots=True)
class RangeResult:
    kvs: list[KeyValue]
    revision: int  # the revision the range was read at
    more: bool  # there are more keys after the last one returned
    count: int = 0


@dataclass(frozen=True, slots=True)
class StoreStatus:
    revision: int
    compact_revision: int
    applied_index: int
    db_bytes: int
    wal_bytes: int
    keys: int
    quota_bytes: int
