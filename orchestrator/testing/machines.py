"""State machines the Raft simulation can run, behind one small interface.

`MemoryKV` is a dictionary (fast; checks Raft alone). `MVCCMachine` runs the real MVCC store
(`store.mvcc.MVCCStore`) on a SQLite file, so the simulation checks the store too: its results,
its revisions and its watch events, across crashes, snapshots and leader changes. It accepts
batch entries (several commands in one entry), so the driver makes some; the dictionary does not.

Both model a process crash the same way the real server experiences one: what was committed to
the state machine's database survives (`open` after `close`), nothing else does.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Protocol

import msgpack

from orchestrator.raft.statemachine import Applied
from orchestrator.raft.types import Entry, EntryType
from orchestrator.store import types as st
from orchestrator.store.mvcc import MVCCStore


class SimStateMachine(Protocol):
    # Whether an entry may hold several commands (`raft.statemachine.pack_batch`); the driver
    # then makes batch entries, as RaftNode does.
    accepts_batches: bool

    def open(self) -> None:
        """(Re)start from the durable state."""

    def close(self) -> None:
        """Crash: forget everything not durable."""

    def applied_index(self) -> int: ...
    def apply(self, entries: list[Entry]) -> Applied[st.Event]:
        """As `raft.statemachine.StateMachine.apply`: results and the writes' events."""

    def snapshot(self) -> tuple[int, bytes]: ...
    def restore(self, index: int, data: bytes) -> None: ...
    def read(self, key: str) -> bytes | None: ...
    def digest(self) -> Any: ...

    def command(self, kind: str, key: str, value: bytes | None, expected: bytes | None) -> bytes:
        """Encode a client operation (put, delete, cas) as a log entry payload."""

    def output(self, kind: str, result: object) -> object:
        """The client-visible output of an applied command, as the checker models it."""

    def events_since(self, revision: int) -> list[st.Event]: ...

    def revision(self) -> int:
        """The store revision (0 for a machine without revisions: no watches then)."""

    def dispose(self) -> None:
        """Remove every trace (end of the simulation)."""

    def sync(self) -> None: ...


class MemoryKV:
    """A dictionary; no revisions, no events, no batch entries."""

    accepts_batches = False

    def __init__(self) -> None:
        self._durable: tuple[dict[str, bytes], int] = ({}, 0)
        self.data: dict[str, bytes] = {}
        self.applied = 0

    def open(self) -> None:
        self.data, self.applied = dict(self._durable[0]), self._durable[1]

    def close(self) -> None:
        self.data, self.applied = {}, 0

    def applied_index(self) -> int:
        return self.applied

    def apply(self, entries: list[Entry]) -> Applied[st.Event]:
        out: list[object] = []
        for e in entries:
            if e.index <= self.applied:
                out.append(None)
                continue
            if e.index != self.applied + 1:
                raise AssertionError(f"state machine applied {e.index} after {self.applied}")
            self.applied = e.index
            out.append(self._exec(e.data) if e.type is EntryType.NORMAL and e.data else None)
        # Like SQLite: the applied index commits with the change.
        self._durable = (dict(self.data), self.applied)
        return Applied(out)

    def _exec(self, data: bytes) -> object:
        op, key, a, b = msgpack.unpackb(data)
        if op == "put":
            self.data[key] = a
            return True
        if op == "delete":
            return self.data.pop(key, None) is not None
        if self.data.get(key) == a:  # cas
            self.data[key] = b
            return True
        return False

    def snapshot(self) -> tuple[int, bytes]:
        return self.applied, msgpack.packb(self.data)

    def restore(self, index: int, data: bytes) -> None:
        self.data = dict(msgpack.unpackb(data))
        self.applied = index
        self._durable = (dict(self.data), self.applied)

    def read(self, key: str) -> bytes | None:
        return self.data.get(key)

    def digest(self) -> Any:
        return sorted(self.data.items())

    def command(self, kind: str, key: str, value: bytes | None, expected: bytes | None) -> bytes:
        a, b = (expected, value) if kind == "cas" else (value, None)
        return msgpack.packb([kind, key, a, b])  # type: ignore[no-any-return]

    def output(self, kind: str, result: object) -> object:
        return result

    def events_since(self, revision: int) -> list[st.Event]:
        return []

    def revision(self) -> int:
        return 0

    def dispose(self) -> None:
        self.close()

    def sync(self) -> None:
        pass  # every apply is already durable here


class MVCCMachine:
    """The real MVCC store on a SQLite file in a private temporary directory."""

    accepts_batches = MVCCStore.accepts_batches

    def __init__(self) -> None:
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None  # RAM: fast and disposable
        self._dir = tempfile.TemporaryDirectory(prefix="orch-sim-", dir=base)
        self.path = os.path.join(self._dir.name, "store.db")
        self.store: MVCCStore | None = None

    def _s(self) -> MVCCStore:
        assert self.store is not None, "state machine is closed"
        return self.store

    def open(self) -> None:
        self.store = MVCCStore(self.path)

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None

    def applied_index(self) -> int:
        return self._s().applied_index()

    def apply(self, entries: list[Entry]) -> Applied[st.Event]:
        return self._s().apply(entries)

    def snapshot(self) -> tuple[int, bytes]:
        return self._s().snapshot()

    def restore(self, index: int, data: bytes) -> None:
        self._s().restore(index, data)

    def read(self, key: str) -> bytes | None:
        kv = self._s().get(key)
        return None if kv is None else kv.value

    def digest(self) -> Any:
        s = self._s()
        return s.revision(), [
            (kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version)
            for kv in s.range("").kvs
        ]

    def command(self, kind: str, key: str, value: bytes | None, expected: bytes | None) -> bytes:
        if kind == "put":
            assert value is not None
            return st.encode_put(key, value)
        if kind == "delete":
            return st.encode_delete(key)
        assert value is not None
        if expected is None:
            compare = st.Compare(key, st.CompareTarget.CREATE, "=", 0)
        else:
            compare = st.Compare(key, st.CompareTarget.VALUE, "=", expected)
        return st.encode_txn([compare], [st.TxnOp(key, value)], [])

    def output(self, kind: str, result: object) -> object:
        if kind == "put":
            if not isinstance(result, st.WriteResult) or result.error is not None:
                raise AssertionError(f"put failed: {result!r}")
            return True
        if kind == "delete":
            assert isinstance(result, st.WriteResult)
            if result.error is not None and not isinstance(result.error, st.KeyNotFound):
                raise AssertionError(f"delete failed: {result.error!r}")
            return result.error is None
        if not isinstance(result, st.TxnResult) or result.error is not None:
            raise AssertionError(f"cas failed: {result!r}")
        return result.succeeded

    def events_since(self, revision: int) -> list[st.Event]:
        return self._s().events_since(revision)

    def revision(self) -> int:
        return self._s().revision()

    def dispose(self) -> None:
        self.close()
        self._dir.cleanup()

    def sync(self) -> None:
        self._s().sync()
