"""Tests for the MVCC store (real SQLite files in tmp_path), ending with a Hypothesis stateful
test against a small in-memory model of the etcd semantics."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from orchestrator.raft.statemachine import StateMachine
from orchestrator.raft.types import ConfChange, ConfChangeType, Entry, EntryType
from orchestrator.store import mvcc
from orchestrator.store.mvcc import MVCCStore
from orchestrator.store.types import (
    MAX_KEY_BYTES,
    MAX_TXN_OPS,
    MAX_VALUE_BYTES,
    Compacted,
    Compare,
    Conflict,
    Event,
    EventType,
    FutureRevision,
    InvalidRequest,
    KeyExists,
    KeyNotFound,
    KeyValue,
    QuotaExceeded,
    RangeResult,
    StoreError,
    TooLarge,
    TxnOp,
    TxnResult,
    WriteResult,
    encode_compact,
    encode_create,
    encode_delete,
    encode_noop,
    encode_put,
    encode_txn,
)

KiB = 1024
MiB = 1024 * KiB


class RecordingStore(MVCCStore):
    """The store as these tests drive it: `apply` gives the results, and the events it returned
    (`Applied.events`, which the Raft driver hands to the watch layer) are kept in order for
    `take_events()`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._events: list[Event] = []

    def apply(self, entries: Any) -> Any:
        applied = super().apply(entries)
        self._events.extend(applied.events)
        return applied.results

    def take_events(self) -> list[Event]:
        events, self._events = self._events, []
        return events


class Node:
    """A store plus the next log index: `apply(*commands)` wraps them in consecutive entries."""

    def __init__(self, path: Path, **kwargs: Any) -> None:
        self.path = path
        # Every apply commits (unless a test says otherwise), so that `dump`, which reads the
        # file through a second connection, sees each apply's effect at once.
        kwargs.setdefault("commit_interval", 0.0)
        self.kwargs = kwargs
        self.store = RecordingStore(path, **kwargs)
        self.index = self.store.applied_index()

    def apply(self, *commands: bytes) -> list[Any]:
        entries = []
        for data in commands:
            self.index += 1
            entries.append(Entry(1, self.index, EntryType.NORMAL, data))
        return self.store.apply(entries)

    def one(self, command: bytes) -> Any:
        return self.apply(command)[0]

    def reopen(self) -> None:
        self.store.close()
        self.store = RecordingStore(self.path, **self.kwargs)
        assert self.store.applied_index() == self.index

    def close(self) -> None:
        self.store.close()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path / "store.db")
    yield n
    n.close()


def dump(path: Path) -> dict[str, list[Any]]:
    """Every row of the store's tables, read through a second connection (meta without the
    applied index, which every entry advances)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        out = {
            t: conn.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall() for t in ("kv", "history")
        }
        out["meta"] = conn.execute(
            "SELECT revision, compact_revision, logical_bytes FROM meta"
        ).fetchall()
        return out
    finally:
        conn.close()


def kv(key: str, value: bytes, create: int, mod: int, version: int) -> KeyValue:
    return KeyValue(key, value, create, mod, version)


# ------------------------------------------------------------------ basics
def test_satisfies_state_machine_protocol_and_starts_at_revision_1(node: Node) -> None:
    sm: StateMachine = node.store
    assert sm.applied_index() == 0
    assert node.store.revision() == 1
    assert node.store.compact_revision() == 0
    assert node.store.range("") == RangeResult([], 1, False, 0)
    assert node.store.events_since(0, "", 0) == []


def test_create_put_delete_revisions_versions_and_recreate(node: Node) -> None:
    s = node.store
    r = node.one(encode_create("a", b"1"))
    assert r == WriteResult(2, kv("a", b"1", 2, 2, 1), None)
    r = node.one(encode_put("a", b"2"))
    assert r == WriteResult(3, kv("a", b"2", 2, 3, 2), kv("a", b"1", 2, 2, 1))
    r = node.one(encode_put("b", b"x"))
    assert r == WriteResult(4, kv("b", b"x", 4, 4, 1))
    r = node.one(encode_delete("a"))
    assert r == WriteResult(5, None, kv("a", b"2", 2, 3, 2))
    assert s.get("a") is None
    r = node.one(encode_put("a", b"3"))  # a new incarnation: create_revision and version restart
    assert r == WriteResult(6, kv("a", b"3", 6, 6, 1), None)
    assert s.revision() == 6
    assert [s.get("a", rev) for rev in range(1, 7)] == [
        None,
        kv("a", b"1", 2, 2, 1),
        kv("a", b"2", 2, 3, 2),
        kv("a", b"2", 2, 3, 2),
        None,
        kv("a", b"3", 6, 6, 1),
    ]
    assert s.take_events() == [
        Event(EventType.PUT, kv("a", b"1", 2, 2, 1)),
        Event(EventType.PUT, kv("a", b"2", 2, 3, 2), kv("a", b"1", 2, 2, 1)),
        Event(EventType.PUT, kv("b", b"x", 4, 4, 1)),
        Event(EventType.DELETE, kv("a", b"", 0, 5, 0), kv("a", b"2", 2, 3, 2)),
        Event(EventType.PUT, kv("a", b"3", 6, 6, 1)),
    ]
    assert s.take_events() == []


def test_apply_returns_the_events_of_its_writes(tmp_path: Path) -> None:
    store = MVCCStore(tmp_path / "store.db")
    try:
        applied = store.apply(
            [
                Entry(1, 1, EntryType.NORMAL, encode_put("a", b"1")),
                Entry(1, 2, EntryType.NORMAL, encode_delete("missing")),
                Entry(1, 3, EntryType.NORMAL, encode_delete("a")),
            ]
        )
        assert applied.results[0] == WriteResult(2, kv("a", b"1", 2, 2, 1))
        assert list(applied.events) == [
            Event(EventType.PUT, kv("a", b"1", 2, 2, 1)),
            Event(EventType.DELETE, kv("a", b"", 0, 3, 0), kv("a", b"1", 2, 2, 1)),
        ]
        replayed = store.apply([Entry(1, 3, EntryType.NORMAL, encode_delete("a"))])
        assert replayed.results == [None]
        assert not replayed.events  # a skipped entry reports nothing twice
    finally:
        store.close()


def test_cas_and_missing_key_errors(node: Node) -> None:
    s = node.store
    node.one(encode_put("k", b"v1"))  # rev 2
    cur = kv("k", b"v1", 2, 2, 1)

    r = node.one(encode_create("k", b"again"))
    assert isinstance(r.error, KeyExists)
    assert r.revision == 2
    assert r.kv is None
    r = node.one(encode_put("k", b"v2", 7))
    assert isinstance(r.error, Conflict)
    assert r.error.current == cur
    assert r.revision == 2
    r = node.one(encode_put("k", b"v2", 0))  # 0 = "must not exist"
    assert isinstance(r.error, Conflict)
    assert r.error.current == cur
    r = node.one(encode_put("new", b"n", 5))  # expected a revision, key absent
    assert isinstance(r.error, Conflict)
    assert r.error.current is None
    r = node.one(encode_delete("k", 3))
    assert isinstance(r.error, Conflict)
    assert r.error.current == cur
    for cmd in (encode_delete("missing"), encode_delete("missing", 2)):
        r = node.one(cmd)
        assert isinstance(r.error, KeyNotFound)
        assert r.revision == 2
    assert s.revision() == 2
    assert s.take_events() == [Event(EventType.PUT, cur)]

    assert node.one(encode_put("k", b"v2", 2)).kv == kv("k", b"v2", 2, 3, 2)
    assert node.one(encode_put("n", b"n", 0)).kv == kv("n", b"n", 4, 4, 1)
    assert node.one(encode_delete("k", 3)) == WriteResult(5, None, kv("k", b"v2", 2, 3, 2))
    assert s.revision() == 5


def test_noop_compact_conf_change_and_empty_entries(node: Node) -> None:
    cc = ConfChange(ConfChangeType.ADD_VOTER, 2, b"10.0.0.2:7000").encode()
    results = node.store.apply(
        [
            Entry(1, 1, EntryType.NORMAL, b""),
            Entry(1, 2, EntryType.CONF_CHANGE, cc),
            Entry(1, 3, EntryType.NORMAL, encode_noop()),
            Entry(1, 4, EntryType.NORMAL, encode_put("a", b"")),
            Entry(1, 5, EntryType.NORMAL, encode_compact(2)),
        ]
    )
    assert results[:4] == [None, None, WriteResult(1), WriteResult(2, kv("a", b"", 2, 2, 1))]
    assert results[4] == WriteResult(2)
    assert node.store.applied_index() == 5
    assert node.store.compact_revision() == 2


# ------------------------------------------------------------------ txn
def test_txn_compares_each_target(node: Node) -> None:
    node.apply(encode_put("k", b"m"), encode_put("k", b"m2"))  # create 2, mod 3, version 2

    def check(c: Compare) -> bool:
        r = node.one(encode_txn([c], [TxnOp("k", get=True)], []))
        assert isinstance(r, TxnResult)
        assert r.error is None
        assert r.revision == 3  # reads only: no new revision either way
        return r.succeeded

    for target, actual, absent in (("mod", 3, 0), ("create", 2, 0), ("version", 2, 0)):
        assert check(Compare("k", target, "=", actual))
        assert not check(Compare("k", target, "=", actual + 1))
        assert check(Compare("k", target, "!=", actual + 1))
        assert check(Compare("k", target, "<", actual + 1))
        assert not check(Compare("k", target, "<", actual))
        assert check(Compare("k", target, ">", actual - 1))
        assert check(Compare("nope", target, "=", absent))  # an absent key compares as 0
    assert check(Compare("k", "value", "=", b"m2"))
    assert check(Compare("k", "value", "!=", b"m"))
    assert check(Compare("k", "value", ">", b"m"))
    assert check(Compare("k", "value", "<", b"n"))
    assert not check(Compare("k", "value", "=", None))
    assert check(Compare("nope", "value", "=", None))
    assert not check(Compare("nope", "value", "<", b"z"))  # nothing orders against absence


def test_txn_branches_one_revision_and_get_responses(node: Node) -> None:
    s = node.store
    node.apply(encode_put("a", b"1"), encode_put("b", b"2"))  # revs 2, 3
    s.take_events()
    txn = encode_txn(
        [Compare("a", "mod", "=", 2), Compare("b", "value", "=", b"2")],
        [
            TxnOp("c", get=True),
            TxnOp("c", b"3"),
            TxnOp("c", get=True),
            TxnOp("b"),
            TxnOp("b", get=True),
            TxnOp("a", b"1b"),
            TxnOp("zz"),
        ],  # zz: delete of nothing
        [TxnOp("a", get=True)],
    )
    r = node.one(txn)
    assert r == TxnResult(True, 4, [None, kv("c", b"3", 4, 4, 1), None])
    assert s.revision() == 4
    # One revision, events in key order, each with sub-revision order in the history too.
    expected = [
        Event(EventType.PUT, kv("a", b"1b", 2, 4, 2), kv("a", b"1", 2, 2, 1)),
        Event(EventType.DELETE, kv("b", b"", 0, 4, 0), kv("b", b"2", 3, 3, 1)),
        Event(EventType.PUT, kv("c", b"3", 4, 4, 1)),
    ]
    assert s.take_events() == expected
    assert s.events_since(4, "", 0) == expected
    node.reopen()
    assert node.store.events_since(4, "", 0) == expected  # from SQLite, not the ring

    r = node.one(txn)  # compares now fail: the failure branch runs, reads only
    assert r == TxnResult(False, 4, [kv("a", b"1b", 2, 4, 2)])
    assert node.store.revision() == 4
    # A failure branch with writes gets a revision too.
    r = node.one(encode_txn([Compare("a", "version", ">", 5)], [], [TxnOp("d", b"d")]))
    assert r == TxnResult(False, 5, [])
    assert node.store.get("d") == kv("d", b"d", 5, 5, 1)
    # A txn whose only write deletes a missing key changes nothing.
    assert node.one(encode_txn([], [TxnOp("ghost")], [])) == TxnResult(True, 5, [])
    assert node.store.take_events() == [Event(EventType.PUT, kv("d", b"d", 5, 5, 1))]


def test_txn_op_limits_and_duplicates(node: Node) -> None:
    ops = [TxnOp(f"k{i:03d}", b"v") for i in range(MAX_TXN_OPS)]
    r = node.one(encode_txn([], ops, []))
    assert r.error is None
    assert r.revision == 2
    assert len(node.store.take_events()) == MAX_TXN_OPS
    assert node.store.range("k").count == MAX_TXN_OPS
    before = dump(node.path)
    too_many = [*ops, TxnOp("k999", b"v")]
    bad = [
        encode_txn([], too_many, []),
        encode_txn([], [], too_many),
        encode_txn([Compare("a", "mod", "=", 0)] * (MAX_TXN_OPS + 1), [], []),
        encode_txn([], [TxnOp("a", b"1"), TxnOp("a")], []),
        encode_txn([], [], [TxnOp("a", b"1"), TxnOp("a", b"2")]),
    ]
    results = node.apply(*bad)
    assert [type(r.error) for r in results] == [TooLarge] * 3 + [InvalidRequest] * 2
    assert all(isinstance(r, TxnResult) and not r.succeeded for r in results)
    assert dump(node.path) == before


# ------------------------------------------------------------------ errors change nothing
BAD_COMMANDS = [
    pytest.param(encode_put("big", b"x" * (MAX_VALUE_BYTES + 1)), TooLarge, id="value-too-big"),
    pytest.param(encode_create("big", b"x" * (MAX_VALUE_BYTES + 1)), TooLarge, id="create-big"),
    pytest.param(encode_put("k" * (MAX_KEY_BYTES + 1), b""), TooLarge, id="key-too-long"),
    pytest.param(encode_put("é" * (MAX_KEY_BYTES // 2 + 1), b""), TooLarge, id="key-utf8-long"),
    pytest.param(encode_put("", b"v"), InvalidRequest, id="empty-key"),
    pytest.param(encode_put("a\x00b", b"v"), InvalidRequest, id="nul-in-key"),
    pytest.param(
        b"\x94\xa3put\xa3\xed\xa0\x80\xc4\x01v\xc0", InvalidRequest, id="surrogate-key"
    ),  # a UTF-8-encoded surrogate: not valid UTF-8
    pytest.param(encode_delete(""), InvalidRequest, id="delete-empty-key"),
    pytest.param(b"\xc1\xff\x00", InvalidRequest, id="not-msgpack"),
    pytest.param(msgpack.packb({"op": "put"}), InvalidRequest, id="not-an-array"),
    pytest.param(msgpack.packb(["frobnicate", "k"]), InvalidRequest, id="unknown-op"),
    pytest.param(msgpack.packb(["put", "k", b"v"]), InvalidRequest, id="put-arity"),
    pytest.param(msgpack.packb(["put", "k", "str-not-bytes", None]), InvalidRequest, id="put-str"),
    pytest.param(msgpack.packb(["put", 5, b"v", None]), InvalidRequest, id="int-key"),
    pytest.param(msgpack.packb(["put", "a", b"v", True]), InvalidRequest, id="bool-expected"),
    pytest.param(msgpack.packb(["put", "a", b"v", -1]), InvalidRequest, id="negative-expected"),
    pytest.param(msgpack.packb(["delete", "a"]), InvalidRequest, id="delete-arity"),
    pytest.param(msgpack.packb(["noop", 1]), InvalidRequest, id="noop-arity"),
    pytest.param(msgpack.packb(["compact"]), InvalidRequest, id="compact-arity"),
    pytest.param(msgpack.packb(["compact", None]), InvalidRequest, id="compact-nil"),
    pytest.param(encode_compact(1), Compacted, id="compact-not-above-compacted"),
    pytest.param(encode_compact(99), FutureRevision, id="compact-future"),
    pytest.param(msgpack.packb(["txn", [], []]), InvalidRequest, id="txn-arity"),
    pytest.param(
        msgpack.packb(["txn", [["a", "mod", "=="]], [], []]), InvalidRequest, id="txn-compare-arity"
    ),
    pytest.param(
        encode_txn([Compare("a", "mod", "~", 1)], [], []), InvalidRequest, id="txn-compare-op"
    ),
    pytest.param(
        encode_txn([Compare("a", "lease", "=", 1)], [], []), InvalidRequest, id="txn-compare-target"
    ),
    pytest.param(
        encode_txn([Compare("a", "mod", "=", b"1")], [], []),
        InvalidRequest,
        id="txn-compare-operand",
    ),
    pytest.param(
        encode_txn([Compare("a", "value", "=", 1)], [], []), InvalidRequest, id="txn-value-operand"
    ),
    pytest.param(msgpack.packb(["txn", [], [["put", "a"]], []]), InvalidRequest, id="txn-op-arity"),
    pytest.param(
        msgpack.packb(["txn", [], [["rename", "a", "b"]], []]), InvalidRequest, id="txn-op-kind"
    ),
    pytest.param(
        encode_txn([], [TxnOp("ok", b"1"), TxnOp("big", b"x" * (MAX_VALUE_BYTES + 1))], []),
        TooLarge,
        id="txn-value-too-big",
    ),
    pytest.param(encode_txn([], [], [TxnOp("")]), InvalidRequest, id="txn-empty-key"),
    pytest.param(encode_create("a", b"again"), KeyExists, id="create-existing"),
    pytest.param(encode_put("a", b"v", 1), Conflict, id="cas-conflict"),
    pytest.param(encode_delete("a", 1), Conflict, id="delete-conflict"),
    pytest.param(encode_delete("nothing"), KeyNotFound, id="delete-missing"),
    pytest.param(encode_put("q", b"x" * 5000), QuotaExceeded, id="quota"),
    pytest.param(encode_txn([], [TxnOp("q", b"x" * 5000)], []), QuotaExceeded, id="txn-quota"),
]


@pytest.mark.parametrize(("command", "error"), BAD_COMMANDS)
def test_failed_command_changes_nothing(
    tmp_path: Path, command: bytes, error: type[StoreError]
) -> None:
    n = Node(tmp_path / "s.db", quota_bytes=4000)
    try:
        n.apply(
            encode_put("a", b"1"), encode_put("a", b"2"), encode_put("b", b"3"), encode_compact(2)
        )
        n.store.take_events()
        before = dump(n.path)
        result = n.one(command)
        assert isinstance(result.error, error), result
        assert result.revision == n.store.revision() == 4
        assert n.store.applied_index() == n.index  # the entry is consumed all the same
        assert n.store.take_events() == []
        assert dump(n.path) == before
    finally:
        n.close()


def test_non_contiguous_batch_raises_and_applies_nothing(node: Node) -> None:
    node.apply(encode_put("a", b"1"))
    before = dump(node.path)
    with pytest.raises(ValueError, match="does not follow"):
        node.store.apply(
            [Entry(1, 2, data=encode_put("b", b"")), Entry(1, 4, data=encode_put("c", b""))]
        )
    assert dump(node.path) == before
    assert node.store.applied_index() == 1


def test_exactly_once_apply_across_reopen(node: Node) -> None:
    entries = [Entry(1, i + 1, data=encode_put("counter", str(i).encode())) for i in range(5)]
    entries.append(Entry(1, 6, data=encode_txn([], [TxnOp("x", b"x")], [])))
    node.store.apply(entries[:3])
    node.store.apply(entries[:4])  # overlapping batch: only entry 4 is new
    assert node.store.revision() == 5
    node.index = 4
    node.reopen()
    before = dump(node.path)
    assert node.store.apply(entries[:4]) == [None] * 4
    assert dump(node.path) == before
    results: list[Any] = node.store.apply(entries)  # 5 and 6 are new
    assert results[:4] == [None] * 4
    assert results[4].revision == 6
    assert results[5].revision == 7
    node.index = 6
    node.reopen()
    before = dump(node.path)
    node.store.apply(entries)
    assert dump(node.path) == before
    assert node.store.get("counter") == kv("counter", b"4", 2, 6, 5)
    assert node.store.take_events() == []


# ------------------------------------------------------------------ reads
def test_range_prefix_limit_count_and_unicode_bounds(node: Node) -> None:
    keys = ["a", "a/1", "a/2", "a/é", "a\U0010ffff", "a\U0010ffff/x", "ab", "b", "\U0010ffff"]
    node.apply(*(encode_put(k, k.encode()) for k in keys))
    s = node.store

    def names(r: RangeResult) -> list[str]:
        return [x.key for x in r.kvs]

    assert names(s.range("")) == sorted(keys)
    assert names(s.range("a/")) == ["a/1", "a/2", "a/é"]
    assert names(s.range("a\U0010ffff")) == ["a\U0010ffff", "a\U0010ffff/x"]
    assert names(s.range("\U0010ffff")) == ["\U0010ffff"]
    assert names(s.range("a", start_after="a/2")) == ["a/é", "ab", "a\U0010ffff", "a\U0010ffff/x"]
    assert names(s.range("a/", start_after="")) == ["a/1", "a/2", "a/é"]
    assert names(s.range("a/", start_after="0")) == ["a/1", "a/2", "a/é"]  # below the prefix
    assert s.range("a/", start_after="zzz").kvs == []
    r = s.range("a", limit=2)
    assert names(r) == ["a", "a/1"]
    assert r.more
    assert r.count == 7
    r = s.range("a", limit=7)
    assert not r.more
    assert r.count == 7
    r = s.range("a", start_after="a/1", count_only=True)
    assert r == RangeResult([], s.revision(), False, 5)
    with pytest.raises(InvalidRequest):
        s.range("", limit=-1)


def test_paginated_range_is_a_consistent_snapshot_while_writes_continue(node: Node) -> None:
    node.apply(*(encode_put(f"/pods/p{i:03d}", b"v0") for i in range(0, 100, 2)))
    s = node.store
    rev = s.revision()
    full = s.range("/pods/")
    pages: list[KeyValue] = []
    after = ""
    i = 0
    while True:
        page = s.range("/pods/", start_after=after, limit=7, revision=rev)
        assert page.revision == rev
        pages.extend(page.kvs)
        # Concurrent churn between pages: new keys inside the range, overwrites, deletes.
        node.apply(
            encode_put(f"/pods/p{i * 2 + 1:03d}", b"new"),
            encode_put(f"/pods/p{(i * 14) % 100:03d}", b"v1"),
            encode_delete(f"/pods/p{(i * 6 + 50) % 100 // 2 * 2:03d}"),
        )
        i += 1
        if not page.more:
            break
        after = page.kvs[-1].key
    assert pages == full.kvs
    assert s.range("/pods/", revision=rev) == full
    assert s.revision() > rev


def test_reads_at_past_revisions_and_after_compaction(node: Node) -> None:
    s = node.store
    node.apply(
        encode_put("a", b"1"),
        encode_put("b", b"1"),
        encode_put("a", b"2"),  # 2 3 4
        encode_delete("b"),
        encode_put("c", b"1"),
        encode_put("a", b"3"),
    )  # 5 6 7
    snapshots = {rev: s.range("", revision=rev).kvs for rev in range(1, 8)}
    assert [x.key for x in snapshots[3]] == ["a", "b"]
    assert [x.key for x in snapshots[5]] == ["a"]
    with pytest.raises(FutureRevision):
        s.get("a", 8)
    with pytest.raises(FutureRevision):
        s.range("", revision=8)
    node.one(encode_compact(5))
    for rev in (1, 4):
        with pytest.raises(Compacted) as info:
            s.get("a", rev)
        assert info.value.compact_revision == 5
        with pytest.raises(Compacted):
            s.range("", revision=rev)
    for rev in (5, 6, 7):
        assert s.range("", revision=rev).kvs == snapshots[rev]
        assert s.get("a", rev) == next(x for x in snapshots[rev] if x.key == "a")
    assert s.get("b", 5) is None
    assert s.range("", revision=5, count_only=True).count == 1
    node.reopen()
    assert node.store.range("", revision=5).kvs == snapshots[5]


def test_events_since_across_compaction_boundary(node: Node) -> None:
    s = node.store
    node.apply(
        encode_put("a", b"1"),
        encode_put("b", b"1"),
        encode_put("a", b"2"),  # 2 3 4
        encode_delete("b"),
        encode_put("c", b"1"),
        encode_put("a", b"3"),
    )  # 5 6 7
    every = s.take_events()
    assert s.events_since(0, "", 0) == every == s.events_since(1, "", 0)
    node.one(encode_compact(5))
    for ring in (True, False):
        if not ring:
            node.reopen()  # an empty ring: everything below comes from SQLite
            s = node.store
        for rev in (0, 1, 4, 5):
            with pytest.raises(Compacted) as info:
                s.events_since(rev, "", 0)
            assert info.value.compact_revision == 5
        # The first event after the compaction keeps its prev_kv (the kept base row).
        assert s.events_since(6, "", 0) == every[4:]
        assert s.events_since(7, "a", 0) == [
            Event(EventType.PUT, kv("a", b"3", 2, 7, 3), kv("a", b"2", 2, 4, 2))
        ]
        assert s.events_since(7, "b", 0) == []
        assert s.events_since(8, "", 0) == []
        assert s.events_since(100, "", 0) == []


def test_events_since_limit_never_splits_a_revision(tmp_path: Path) -> None:
    n = Node(tmp_path / "r.db")
    n.apply(
        encode_put("a", b""),
        encode_txn([], [TxnOp(k, b"") for k in "edcb"], []),
        encode_put("f", b""),
        encode_put("g", b""),
    )
    # revisions: 2 -> a, 3 -> b c d e, 4 -> f, 5 -> g

    def revs(evs: list[Event]) -> list[tuple[int, str]]:
        return [(e.kv.mod_revision, e.kv.key) for e in evs]

    s = n.store
    assert revs(s.events_since(2, "", 2)) == [(2, "a")]
    assert revs(s.events_since(3, "", 2)) == [(3, "b"), (3, "c"), (3, "d"), (3, "e")]
    assert revs(s.events_since(3, "", 5)) == [(3, "b"), (3, "c"), (3, "d"), (3, "e"), (4, "f")]
    assert len(s.events_since(2, "", 5)) == 5
    assert len(s.events_since(2, "", 6)) == 6
    assert revs(s.events_since(3, "d", 1)) == [(3, "d")]
    n.close()


def test_reads_reject_bad_arguments(node: Node) -> None:
    s = node.store
    for call_ in (
        lambda: s.get("\ud800"),
        lambda: s.range("\ud800"),
        lambda: s.range("", start_after="\udfff"),
        lambda: s.get("a", -1),
        lambda: s.range("", revision=-2),
        lambda: s.events_since(2, "", -1),
    ):
        with pytest.raises(InvalidRequest):
            call_()


# ------------------------------------------------------------------ compaction, quota, WAL
def history_rows(path: Path) -> int:
    return len(dump(path)["history"])


def test_compaction_keeps_reads_at_compact_revision_and_shrinks_history(node: Node) -> None:
    s = node.store
    for round_ in range(10):
        node.apply(*(encode_put(f"k{i}", bytes([round_]) * 100) for i in range(10)))
    node.apply(encode_delete("k0"), encode_delete("k1"))
    assert history_rows(node.path) == 102
    at = s.revision()
    state = s.range("", revision=at)
    bytes_before = s.logical_bytes()
    r = node.one(encode_compact(at))
    assert r == WriteResult(at)
    assert s.compact_revision() == at
    assert history_rows(node.path) == 8  # one live row per remaining key; tombstones gone
    assert s.range("", revision=at) == state
    assert s.logical_bytes() == 8 * (2 + 100) + 8 * 2  # history rows + kv keys
    assert s.logical_bytes() < bytes_before
    assert s.status().wal_bytes == 0  # TRUNCATE checkpoint after the compacting batch
    # Compaction is incremental: a second one only touches keys written since.
    node.apply(encode_put("k2", b"new"), encode_put("k2", b"newer"))
    node.one(encode_compact(s.revision() - 1))
    assert history_rows(node.path) == 9
    assert s.get("k2", s.revision() - 1) == kv("k2", b"new", 4, at + 1, 11)
    assert s.get("k3", s.revision() - 1) == kv("k3", bytes([9]) * 100, 5, 95, 10)


def test_quota_refuses_writes_allows_deletes_and_recovers(tmp_path: Path) -> None:
    n = Node(tmp_path / "q.db", quota_bytes=10_000)
    s = n.store
    try:
        accepted = 0
        while True:
            r = n.one(encode_put(f"k{accepted % 5}", b"x" * 1000))
            if r.error is not None:
                break
            accepted += 1
        assert isinstance(r.error, QuotaExceeded)
        assert accepted == 9
        assert s.logical_bytes() <= 10_000
        r = n.one(encode_txn([], [TxnOp("k0", b"y" * 1000)], []))
        assert isinstance(r.error, QuotaExceeded)
        assert not r.succeeded
        # Deletes are always accepted (alone or in a txn); creates are still refused.
        assert n.one(encode_delete("k0")).error is None
        assert n.one(encode_txn([], [TxnOp("k1")], [])).error is None
        assert isinstance(n.one(encode_create("k0", b"x" * 1000)).error, QuotaExceeded)
        # Compaction frees the superseded versions and the tombstones: writes work again.
        assert n.one(encode_compact(s.revision())).error is None
        assert s.logical_bytes() == 3 * (2 + 1000) + 3 * 2
        assert n.one(encode_put("k0", b"x" * 1000)).error is None
        n.reopen()
        assert n.store.logical_bytes() == 4 * (2 + 1000) + 4 * 2
    finally:
        n.close()


def test_wal_stays_bounded_under_churn(tmp_path: Path) -> None:
    n = Node(tmp_path / "churn.db")
    s = n.store
    try:
        value = os.urandom(KiB)
        max_wal = 0
        for batch in range(500):  # 5,000 overwrites of 20 keys, 10 per apply
            n.apply(
                *(encode_put(f"/leases/node-{(batch * 10 + i) % 20}", value) for i in range(10))
            )
            if batch % 50 == 49:
                n.one(encode_compact(s.revision() - 100))
            max_wal = max(max_wal, s.status().wal_bytes)
        status = s.status()
        assert max_wal < 10 * MiB, max_wal
        assert status.db_bytes < 4 * MiB, status  # freed pages are reused
        assert status.keys == 20
        assert status.revision == 5001
        assert s.maybe_checkpoint(max_wal_bytes=0) == (status.wal_bytes > 0)
        assert s.status().wal_bytes == 0
        assert not s.maybe_checkpoint()
    finally:
        n.close()


# ------------------------------------------------------------------ applies sharing a transaction
NEVER = 3600.0  # a commit interval no test reaches: only explicit commits end the transaction


def crash(n: Node) -> None:
    """Drop the store as a killed process would: its open transaction is lost (closing an
    sqlite3 connection rolls it back), nothing is committed on the way out."""
    conn = n.store._conn
    assert conn is not None
    n.store._conn = None
    conn.close()


@pytest.mark.parametrize("ender", ["commit", "sync", "snapshot", "maybe_checkpoint", "close"])
def test_applies_share_a_transaction_until_something_commits_it(tmp_path: Path, ender: str) -> None:
    n = Node(tmp_path / "store.db", commit_interval=NEVER)
    try:
        n.one(encode_put("a", b"1"))
        n.one(encode_put("b", b"2"))
        assert [kv.key for kv in n.store.range("").kvs] == ["a", "b"]  # seen by the store
        assert dump(n.path)["kv"] == []  # not yet in the file for anyone else
        getattr(n.store, ender)()
        assert [row[0] for row in dump(n.path)["kv"]] == ["a", "b"]
    finally:
        n.close()


def test_an_apply_commits_once_the_transaction_is_old_enough(tmp_path: Path) -> None:
    n = Node(tmp_path / "store.db", commit_interval=NEVER)
    try:
        n.one(encode_put("a", b"1"))
        n.store._txn_since -= NEVER  # as if the transaction had been open that long
        n.one(encode_put("b", b"2"))
        assert [row[0] for row in dump(n.path)["kv"]] == ["a", "b"]
        n.one(encode_put("c", b"3"))  # a new transaction
        assert [row[0] for row in dump(n.path)["kv"]] == ["a", "b"]
    finally:
        n.close()


def test_by_default_applies_share_a_transaction_for_100_ms(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """etcd's batch interval: applies within 100 ms of the first share its transaction (each
    hot index page is written once per 100 ms, not once per apply); the first one after it
    commits."""
    now = [1000.0]
    monkeypatch.setattr(mvcc, "time", SimpleNamespace(monotonic=lambda: now[0]))
    store = MVCCStore(tmp_path / "store.db")  # the default interval
    try:

        def put(index: int, key: str) -> None:
            store.apply([Entry(1, index, EntryType.NORMAL, encode_put(key, b"v"))])

        put(1, "a")
        now[0] += 0.099
        put(2, "b")
        assert dump(tmp_path / "store.db")["kv"] == []  # still one open transaction
        now[0] += 0.001
        put(3, "c")
        assert [row[0] for row in dump(tmp_path / "store.db")["kv"]] == ["a", "b", "c"]
    finally:
        store.close()


def test_a_crash_loses_the_open_transaction_and_the_replay_applies_it_once(
    tmp_path: Path,
) -> None:
    """Entries 1-2 committed, 3-4 applied in the open transaction: after a crash the store is
    at applied index 2, and the driver's replay of 1-4 skips 1-2 and applies 3-4 once, with
    the results and state of a store that never crashed."""
    commands = [
        encode_put("a", b"1"),
        encode_create("b", b"2"),
        encode_put("a", b"3"),
        encode_delete("b"),
    ]
    entries = [Entry(1, i + 1, EntryType.NORMAL, c) for i, c in enumerate(commands)]
    ref = Node(tmp_path / "ref.db")
    n = Node(tmp_path / "store.db", commit_interval=NEVER)
    try:
        expected = ref.store.apply(entries)
        assert n.store.apply(entries[:2]) == expected[:2]
        n.store.commit()
        assert n.store.apply(entries[2:]) == expected[2:]
        crash(n)
        n.store = RecordingStore(n.path, commit_interval=NEVER)
        assert n.store.applied_index() == 2
        assert n.store.revision() == 3
        assert n.store.apply(entries) == [None, None, *expected[2:]]
        assert n.store.apply(entries) == [None] * 4  # and never again
        n.store.commit()
        assert dump(n.path) == dump(ref.path)
        assert n.store.events_since(2) == ref.store.events_since(2)
    finally:
        n.close()
        ref.close()


def test_a_failing_apply_rolls_back_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch that raises (an SQLite failure, say) after some of its writes leaves nothing of
    itself, and takes nothing of the earlier batches in the same open transaction with it."""
    n = Node(tmp_path / "store.db", commit_interval=NEVER)
    try:
        n.one(encode_put("a", b"1"))
        real = MVCCStore._execute

        def fail_on_y(store: MVCCStore, data: bytes, events: list[Any]) -> Any:
            result = real(store, data, events)
            if msgpack.unpackb(data)[1] == "y":
                raise sqlite3.OperationalError("disk I/O error")
            return result

        monkeypatch.setattr(MVCCStore, "_execute", fail_on_y)
        with pytest.raises(sqlite3.OperationalError):
            n.apply(encode_put("x", b"2"), encode_put("y", b"3"))
        monkeypatch.undo()
        assert n.store.applied_index() == 1
        assert n.store.revision() == 2
        assert [kv.key for kv in n.store.range("").kvs] == ["a"]
        n.index = 1
        n.apply(encode_put("x", b"2"), encode_put("y", b"3"))  # the driver hands them again
        n.store.commit()
        assert [row[0] for row in dump(n.path)["kv"]] == ["a", "x", "y"]
        assert n.store.revision() == 4
    finally:
        n.close()


# ------------------------------------------------------------------ snapshots
def build_history(n: Node) -> None:
    n.apply(*(encode_put(f"/a/{i}", bytes([i]) * 50) for i in range(20)))
    n.apply(encode_txn([], [TxnOp("/a/3"), TxnOp("/b/x", b"x"), TxnOp("/a/4", b"4")], []))
    n.apply(encode_compact(10), encode_delete("/a/5"), encode_put("/a/6", b"six"))


def observe(s: MVCCStore) -> list[Any]:
    out: list[Any] = [s.revision(), s.compact_revision(), s.applied_index(), s.logical_bytes()]
    for rev in range(s.compact_revision(), s.revision() + 1):
        out.append(s.range("", revision=rev))
        out.append(s.range("/a/", revision=rev, limit=3, start_after="/a/12"))
    for rev in range(s.compact_revision() + 1, s.revision() + 2):
        out.append(s.events_since(rev, "", 0))
        out.append(s.events_since(rev, "/b/", 0))
    return out


def test_snapshot_restore_round_trip_into_fresh_file(tmp_path: Path) -> None:
    src = Node(tmp_path / "src.db")
    dst = Node(tmp_path / "dst.db")
    try:
        build_history(src)
        index, data = src.store.snapshot()
        assert index == src.index
        dst.apply(encode_put("stale", b"gone"))  # restore replaces whatever was there
        dst.store.take_events()
        dst.store.restore(index, data)
        dst.index = index
        assert observe(dst.store) == observe(src.store)
        assert dst.store.get("stale") is None
        assert dst.store.take_events() == []  # a restore makes no events
        # Both continue identically, also after a reopen of the restored file (still WAL).
        dst.reopen()
        assert dst.store.status().keys == src.store.status().keys
        cmds = [encode_put("/a/7", b"7"), encode_compact(20), encode_delete("/a/8")]
        assert src.apply(*cmds) == dst.apply(*cmds)
        assert observe(dst.store) == observe(src.store)
        conn = sqlite3.connect(tmp_path / "dst.db")
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        conn.close()
    finally:
        src.close()
        dst.close()


@pytest.mark.parametrize("damage", ["index", "garbage", "truncated", "not-a-store"])
def test_restore_rejects_bad_snapshots_and_changes_nothing(tmp_path: Path, damage: str) -> None:
    src = Node(tmp_path / "src.db")
    dst = Node(tmp_path / "dst.db")
    try:
        build_history(src)
        index, data = src.store.snapshot()
        dst.apply(encode_put("mine", b"1"))
        if damage == "index":
            index += 1
        elif damage == "garbage":
            data = b"SQLite format 3\x00" + os.urandom(4000)
        elif damage == "truncated":
            data = data[: len(data) // 2]
        else:
            other = sqlite3.connect(":memory:")
            other.execute("CREATE TABLE t (x)")
            data = other.serialize()
            other.close()
        before = dump(dst.path)
        with pytest.raises(ValueError, match="snapshot"):
            dst.store.restore(index, data)
        assert dump(dst.path) == before
        assert dst.store.get("mine") is not None
        assert dst.store.applied_index() == 1
    finally:
        src.close()
        dst.close()


def test_status_reports_files_and_counts(node: Node) -> None:
    node.apply(encode_put("a", b"1"), encode_put("b", b"2"), encode_delete("a"))
    st_ = node.store.status()
    assert (st_.revision, st_.compact_revision, st_.applied_index, st_.keys) == (4, 0, 3, 1)
    assert st_.db_bytes == os.path.getsize(node.path)
    assert st_.db_bytes > 0
    assert st_.quota_bytes == 2 * 1024**3


def test_closed_store_refuses_calls(node: Node) -> None:
    node.close()
    node.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        node.store.get("a")


# ------------------------------------------------------------------ model-based test
KEYS = ["a", "a/1", "a/2", "ab", "b", "b/é", "\U0010ffff", "a\U0010ffff"]
PREFIXES = ["", "a", "a/", "b", "\U0010ffff", "c"]


def _model_compare(cur: KeyValue | None, target: str, op: str, operand: Any) -> bool:
    if target == "value":
        actual: Any = None if cur is None else cur.value
        if actual is None or operand is None:
            return bool({"=": actual == operand, "!=": actual != operand}.get(op, False))
    else:
        actual = (
            0
            if cur is None
            else {"mod": cur.mod_revision, "create": cur.create_revision, "version": cur.version}[
                target
            ]
        )
    return bool(
        {
            "=": actual == operand,
            "!=": actual != operand,
            "<": actual < operand,
            ">": actual > operand,
        }[op]
    )


class Model:
    """etcd's semantics, the dumb way: a full copy of the key space per revision, the list of
    every event, and the list of history rows (only for the quota's byte count)."""

    def __init__(self, quota: int) -> None:
        self.quota = quota
        self.rev = 1
        self.compact = 0
        self.states: dict[int, dict[str, KeyValue]] = {1: {}}
        self.events: list[Event] = []
        self.rows: list[tuple[int, str, int, bytes]] = []  # (revision, key, type, value)

    @property
    def kv(self) -> dict[str, KeyValue]:
        return self.states[self.rev]

    def logical(self, rows: list[tuple[int, str, int, bytes]], keys: Any) -> int:
        return sum(len(k.encode()) + len(v) for _, k, _, v in rows) + sum(
            len(k.encode()) for k in keys
        )

    def _commit(self, writes: dict[str, bytes | None]) -> tuple[int, list[Event]] | StoreError:
        """Apply effective writes (key -> value, None = delete) as one revision."""
        rev = self.rev + 1
        new = dict(self.kv)
        rows = list(self.rows)
        events = []
        for key in sorted(writes):
            prev, value = self.kv.get(key), writes[key]
            if value is None:
                del new[key]
                rows.append((rev, key, 1, b""))
                events.append(Event(EventType.DELETE, KeyValue(key, b"", 0, rev, 0), prev))
            else:
                cur = KeyValue(
                    key,
                    value,
                    prev.create_revision if prev else rev,
                    rev,
                    prev.version + 1 if prev else 1,
                )
                new[key] = cur
                rows.append((rev, key, 0, value))
                events.append(Event(EventType.PUT, cur, prev))
        before, after = self.logical(self.rows, self.kv), self.logical(rows, new)
        if after > before and after > self.quota:
            return QuotaExceeded("model")
        self.rev, self.rows = rev, rows
        self.states[rev] = new
        self.events.extend(events)
        return rev, events

    def write(self, op: str, key: str, value: bytes | None, expected: int | None) -> WriteResult:
        cur = self.kv.get(key)
        if op == "create" and cur is not None:
            return WriteResult(self.rev, error=KeyExists("model"))
        if op == "delete" and cur is None:
            return WriteResult(self.rev, error=KeyNotFound("model"))
        if expected is not None and (cur.mod_revision if cur else 0) != expected:
            return WriteResult(self.rev, error=Conflict("model", cur))
        out = self._commit({key: value})
        if isinstance(out, StoreError):
            return WriteResult(self.rev, error=out)
        return WriteResult(out[0], self.kv.get(key), cur)

    def txn(self, compares: list[Compare], success: list[TxnOp], failure: list[TxnOp]) -> TxnResult:
        for ops in (success, failure):
            written = [o.key for o in ops if not o.get]
            if len(written) != len(set(written)):
                return TxnResult(False, self.rev, error=InvalidRequest("model"))
        ok = all(_model_compare(self.kv.get(c.key), c.target, c.op, c.operand) for c in compares)
        ops = success if ok else failure
        writes = {
            o.key: o.value for o in ops if not o.get and (o.value is not None or o.key in self.kv)
        }
        old = self.kv
        if writes:
            out = self._commit(writes)
            if isinstance(out, StoreError):
                return TxnResult(False, self.rev, error=out)
        responses: list[KeyValue | None] = []
        seen: set[str] = set()
        for o in ops:  # reads see the txn's earlier writes, not its later ones
            if o.get:
                responses.append(self.kv.get(o.key) if o.key in seen else old.get(o.key))
            else:
                seen.add(o.key)
        return TxnResult(ok, self.rev, responses)

    def compact_to(self, rev: int) -> WriteResult:
        if rev <= self.compact:
            return WriteResult(self.rev, error=Compacted("model", self.compact))
        if rev > self.rev:
            return WriteResult(self.rev, error=FutureRevision("model"))
        newest: dict[str, tuple[int, int]] = {}
        for r, key, kind, _ in self.rows:
            if r <= rev:
                newest[key] = (r, kind)
        self.rows = [row for row in self.rows if row[0] > rev or (newest[row[1]] == (row[0], 0))]
        self.compact = rev
        return WriteResult(self.rev)

    def read_rev(self, rev: int) -> int:
        if rev == 0:
            return self.rev
        if rev > self.rev:
            raise FutureRevision("model")
        if rev < self.compact:
            raise Compacted("model", self.compact)
        return rev

    def range(
        self, prefix: str, start_after: str, limit: int, rev: int, count_only: bool
    ) -> RangeResult:
        r = self.read_rev(rev)
        keys = sorted(k for k in self.states[r] if k.startswith(prefix) and k > start_after)
        if count_only:
            return RangeResult([], r, False, len(keys))
        chosen = keys[:limit] if limit else keys
        return RangeResult(
            [self.states[r][k] for k in chosen], r, len(chosen) < len(keys), len(keys)
        )

    def events_since(self, rev: int, prefix: str, limit: int) -> list[Event]:
        if self.compact and rev <= self.compact:
            raise Compacted("model", self.compact)
        by_rev: dict[int, list[Event]] = {}
        for e in self.events:
            if e.kv.mod_revision >= rev and e.kv.key.startswith(prefix):
                by_rev.setdefault(e.kv.mod_revision, []).append(e)
        out: list[Event] = []
        for group in by_rev.values():
            if limit and out and len(out) + len(group) > limit:
                break
            out.extend(group)
        return out


def normalize(result: Any) -> Any:
    """Results compare by value; errors by type (and Conflict's current value)."""
    if result is None or result.error is None:
        return result
    err = result.error
    return (
        dataclasses.replace(result, error=None),
        type(err).__name__,
        getattr(err, "current", None),
        getattr(err, "compact_revision", None),
    )


def call(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except StoreError as exc:
        return (type(exc).__name__, getattr(exc, "compact_revision", None))


keys_st = st.sampled_from(KEYS)
values_st = st.binary(max_size=6)
txn_op_st = st.one_of(
    st.builds(TxnOp, keys_st, values_st),
    st.builds(TxnOp, keys_st),
    st.builds(TxnOp, keys_st, get=st.just(True)),
)


@st.composite
def focused_ops_st(draw: st.DrawFn, pool: list[str]) -> list[TxnOp]:
    """Ops on a few keys, each written at most once, reads interleaved: reads of a key the
    same txn writes before or after, which random ops over all keys rarely produce."""
    writes = draw(
        st.lists(
            st.one_of(
                st.builds(TxnOp, st.sampled_from(pool), values_st),
                st.builds(TxnOp, st.sampled_from(pool)),
            ),
            max_size=3,
            unique_by=lambda o: o.key,
        )
    )
    gets = draw(st.lists(st.builds(TxnOp, st.sampled_from(pool), get=st.just(True)), max_size=3))
    return list(draw(st.permutations(writes + gets)))


compare_st = st.one_of(
    st.builds(
        Compare,
        keys_st,
        st.sampled_from(["mod", "create", "version"]),
        st.sampled_from(["=", "!=", "<", ">"]),
        st.integers(0, 12),
    ),
    st.builds(
        Compare,
        keys_st,
        st.just("value"),
        st.sampled_from(["=", "!=", "<", ">"]),
        st.one_of(st.none(), values_st),
    ),
)


class MVCCAgainstModel(RuleBasedStateMachine):
    """Random command sequences (single entries and batches, reopen, snapshot/restore into a
    new file) against the model; every read answer is checked."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="mvcc-model-")
        self.files = 0
        self.node: Node | None = None
        self.model = Model(10**9)
        self.drained = 0  # model events already returned by take_events()

    @initialize(quota=st.sampled_from([10**9, 120]))
    def start(self, quota: int) -> None:
        self.model = Model(quota)
        self.node = self.new_node(quota_bytes=quota)

    def new_node(self, **kwargs: Any) -> Node:
        self.files += 1
        return Node(Path(self.dir) / f"s{self.files}.db", **kwargs)

    def teardown(self) -> None:
        if self.node is not None:
            self.node.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- command generation: (encoded command, model thunk)
    def gen_command(self, data: st.DataObject) -> tuple[bytes, Any]:
        m = self.model
        kind = data.draw(
            st.sampled_from(
                ["put", "put", "create", "delete", "cas", "txn", "txn", "compact", "noop", "junk"]
            )
        )
        key = data.draw(keys_st)
        cur_mod = m.kv[key].mod_revision if key in m.kv else 0
        if kind in ("put", "cas"):
            value = data.draw(values_st)
            expected = (
                None if kind == "put" else data.draw(st.sampled_from([0, cur_mod, cur_mod + 1]))
            )
            return encode_put(key, value, expected), lambda: m.write("put", key, value, expected)
        if kind == "create":
            value = data.draw(values_st)
            return encode_create(key, value), lambda: m.write("create", key, value, None)
        if kind == "delete":
            expected = data.draw(st.sampled_from([None, cur_mod, cur_mod + 1]))
            return encode_delete(key, expected), lambda: m.write("delete", key, None, expected)
        if kind == "txn":
            compares = data.draw(st.lists(compare_st, max_size=3))
            if data.draw(st.booleans()):
                pool = data.draw(st.lists(keys_st, min_size=1, max_size=3, unique=True))
                success = data.draw(focused_ops_st(pool))
                failure = data.draw(focused_ops_st(pool))
            else:
                success = data.draw(st.lists(txn_op_st, max_size=4))
                failure = data.draw(st.lists(txn_op_st, max_size=3))
            return (
                encode_txn(compares, success, failure),
                lambda: m.txn(compares, success, failure),
            )
        if kind == "compact":
            rev = data.draw(st.integers(max(0, m.compact - 1), m.rev + 1))
            return encode_compact(rev), lambda: m.compact_to(rev)
        if kind == "noop":
            return encode_noop(), lambda: WriteResult(m.rev)
        return b"\x92\xa3put", lambda: WriteResult(m.rev, error=InvalidRequest("model"))

    @rule(data=st.data())
    def apply_one(self, data: st.DataObject) -> None:
        assert self.node is not None
        command, expect = self.gen_command(data)
        got = self.node.one(command)
        assert normalize(got) == normalize(expect())

    @rule(data=st.data(), n=st.integers(2, 6))
    def apply_batch(self, data: st.DataObject, n: int) -> None:
        # Commands are generated against the model as it will be when each one runs.
        assert self.node is not None
        expected: list[Any] = []
        commands: list[bytes] = []
        for _ in range(n):
            command, thunk = self.gen_command(data)
            commands.append(command)
            expected.append(normalize(thunk()))
        # Also a conf change in the middle: it only advances the index.
        got = self.node.store.apply(
            [Entry(1, self.node.index + 1 + i, EntryType.NORMAL, c) for i, c in enumerate(commands)]
            + [Entry(1, self.node.index + n + 1, EntryType.CONF_CHANGE, b"cc")]
        )
        self.node.index += n + 1
        assert [normalize(r) for r in got] == [*expected, None]

    @rule()
    def reopen(self) -> None:
        assert self.node is not None
        self.node.reopen()

    @rule()
    def snapshot_restore_elsewhere(self) -> None:
        assert self.node is not None
        index, data = self.node.store.snapshot()
        fresh = self.new_node(**self.node.kwargs)
        fresh.store.restore(index, data)
        fresh.index = index
        self.node.close()
        self.node = fresh

    @rule(data=st.data())
    def check_reads(self, data: st.DataObject) -> None:
        assert self.node is not None
        s, m = self.node.store, self.model
        rev = data.draw(st.integers(0, m.rev + 1))
        key = data.draw(keys_st)
        assert call(s.get, key, rev) == call(lambda: m.states[m.read_rev(rev)].get(key))
        prefix = data.draw(st.sampled_from(PREFIXES))
        after = data.draw(st.sampled_from(["", *KEYS]))
        limit = data.draw(st.integers(0, 4))
        count_only = data.draw(st.booleans())
        assert call(
            lambda: s.range(
                prefix, start_after=after, limit=limit, revision=rev, count_only=count_only
            )
        ) == call(m.range, prefix, after, limit, rev, count_only)
        since = data.draw(st.integers(0, m.rev + 2))
        ev_limit = data.draw(st.integers(0, 5))
        assert call(s.events_since, since, prefix, ev_limit) == call(
            m.events_since, since, prefix, ev_limit
        )

    @invariant()
    def counters_agree(self) -> None:
        if self.node is None:
            return
        s, m = self.node.store, self.model
        assert (s.revision(), s.compact_revision()) == (m.rev, m.compact)
        assert s.logical_bytes() == m.logical(m.rows, m.kv)
        assert s.range("") == m.range("", "", 0, 0, False)
        assert s.take_events() == m.events[self.drained :]
        self.drained = len(m.events)


TestMVCCAgainstModel = MVCCAgainstModel.TestCase
TestMVCCAgainstModel.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
