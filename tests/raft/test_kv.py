"""Tests for the SQLite key-value state machine (real files in tmp_path)."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

from orchestrator.raft.kv import (
    InvalidCommand,
    KVStateMachine,
    encode_cas,
    encode_delete,
    encode_noop,
    encode_put,
)
from orchestrator.raft.statemachine import StateMachine
from orchestrator.raft.types import ConfChange, ConfChangeType, Entry, EntryType


@pytest.fixture
def kv_path(tmp_path: Path) -> Path:
    return tmp_path / "kv.db"


def normal(index: int, data: bytes, term: int = 1) -> Entry:
    return Entry(term, index, EntryType.NORMAL, data)


def test_satisfies_state_machine_protocol(kv_path: Path) -> None:
    sm: StateMachine = KVStateMachine(kv_path)
    assert sm.applied_index() == 0
    sm.close()


def test_put_get_delete(kv_path: Path) -> None:
    kv = KVStateMachine(kv_path)
    results = kv.apply(
        [
            normal(1, encode_put("a", b"1")),
            normal(2, encode_put("b", b"2")),
            normal(3, encode_delete("a")),
            normal(4, encode_delete("a")),
            normal(5, encode_put("b", b"")),  # an empty value is still a value
        ]
    )
    assert results == [True, True, True, False, True]
    assert kv.get("a") is None
    assert kv.get("b") == b""
    assert kv.applied_index() == 5
    kv.close()


def test_cas_semantics(kv_path: Path) -> None:
    kv = KVStateMachine(kv_path)
    results = kv.apply(
        [
            normal(1, encode_cas("k", None, b"v1")),  # absent -> create
            normal(2, encode_cas("k", None, b"v2")),  # present, expected absent -> no
            normal(3, encode_cas("k", b"nope", b"v2")),  # wrong expected value -> no
            normal(4, encode_cas("k", b"v1", b"v2")),  # match -> swap
            normal(5, encode_delete("k")),
            normal(6, encode_cas("k", b"v2", b"v3")),  # absent, expected a value -> no
        ]
    )
    assert results == [True, False, False, True, True, False]
    assert kv.get("k") is None
    kv.apply([normal(7, encode_cas("k", None, b"again"))])
    assert kv.get("k") == b"again"
    kv.close()


def test_conf_change_noop_and_empty_entries_only_advance_index(kv_path: Path) -> None:
    kv = KVStateMachine(kv_path)
    cc = ConfChange(ConfChangeType.ADD_VOTER, 2, b"10.0.0.2:7000").encode()
    results = kv.apply(
        [
            Entry(1, 1, EntryType.NORMAL, b""),  # a new leader's empty entry
            Entry(1, 2, EntryType.CONF_CHANGE, cc),
            normal(3, encode_noop()),
        ]
    )
    assert results == [None, None, None]
    assert kv.applied_index() == 3
    assert kv.snapshot() == (3, msgpack.packb([]))
    kv.close()


def test_apply_is_exactly_once_across_restarts(kv_path: Path) -> None:
    e1 = normal(1, encode_put("k", b"first"))
    e2 = normal(2, encode_put("k", b"second"))
    e3 = normal(3, encode_cas("k", b"second", b"third"))
    kv = KVStateMachine(kv_path)
    assert kv.apply([e1, e2]) == [True, True]
    kv.close()

    kv = KVStateMachine(kv_path)
    assert kv.applied_index() == 2
    # Re-delivering e1 alone would roll "k" back to "first" if it were applied twice.
    assert kv.apply([e1]) == [None]
    assert kv.get("k") == b"second"
    assert kv.apply([e1, e2, e3]) == [None, None, True]
    assert kv.apply([e1, e2, e3]) == [None, None, None]
    assert kv.get("k") == b"third"
    assert kv.applied_index() == 3
    kv.close()


def test_apply_refuses_to_skip_an_index(kv_path: Path) -> None:
    kv = KVStateMachine(kv_path)
    kv.apply([normal(1, encode_put("a", b"1"))])
    with pytest.raises(ValueError, match="does not follow"):
        kv.apply([normal(2, encode_put("a", b"2")), normal(4, encode_put("a", b"4"))])
    assert kv.applied_index() == 1
    assert kv.get("a") == b"1"
    kv.close()


@pytest.mark.parametrize(
    "data",
    [
        b"\xc1",  # a byte msgpack never uses
        b"\x93\x01",  # truncated array
        msgpack.packb(["put", "k", b"v"]) + b"\x00",  # trailing garbage
        msgpack.packb({"op": "put"}),
        msgpack.packb([]),
        msgpack.packb([7, "k"]),
        msgpack.packb(["frobnicate", "k"]),
        msgpack.packb(["put", "k"]),
        msgpack.packb(["put", 5, b"v"]),
        msgpack.packb(["put", "k", "not bytes"]),
        msgpack.packb(["del"]),
        msgpack.packb(["cas", "k", 3, b"v"]),
        msgpack.packb(["cas", "k", None]),
        msgpack.packb(["noop", 1]),
        b"\xa2\xff\xfe",  # invalid UTF-8 in a str
    ],
)
def test_malformed_command_is_a_result_not_an_exception(kv_path: Path, data: bytes) -> None:
    kv = KVStateMachine(kv_path)
    results = kv.apply([normal(1, data), normal(2, encode_put("after", b"ok"))])
    assert isinstance(results[0], InvalidCommand)
    assert results[0].message
    assert results[1] is True
    assert kv.applied_index() == 2
    assert kv.get("after") == b"ok"
    kv.close()


def test_snapshot_restore_round_trip(tmp_path: Path) -> None:
    src = KVStateMachine(tmp_path / "src.db")
    src.apply(
        [
            normal(1, encode_put("x", b"1")),
            normal(2, encode_put("y", b"\x00\xff")),
            normal(3, encode_put("z", b"3")),
            normal(4, encode_delete("z")),
        ]
    )
    index, data = src.snapshot()
    assert index == 4

    dst = KVStateMachine(tmp_path / "dst.db")
    dst.apply([normal(1, encode_put("stale", b"gone")), normal(2, encode_put("x", b"old"))])
    dst.restore(index, data)
    assert dst.applied_index() == 4
    assert dst.get("stale") is None
    assert dst.get("x") == b"1"
    assert dst.get("y") == b"\x00\xff"
    assert dst.snapshot() == (index, data)
    dst.close()

    dst = KVStateMachine(tmp_path / "dst.db")  # restored state is durable
    assert dst.snapshot() == (index, data)
    # Entries the snapshot covers are skipped; the next one applies.
    assert dst.apply([normal(4, encode_put("x", b"no")), normal(5, encode_put("x", b"5"))]) == [
        None,
        True,
    ]
    assert dst.get("x") == b"5"
    dst.close()
    src.close()


@pytest.mark.parametrize(
    "data",
    [
        b"\xc1",
        msgpack.packb({"x": b"1"}),
        msgpack.packb([["x"]]),
        msgpack.packb([["x", "str value"]]),
        msgpack.packb([["x", b"1"], ["x", b"2"]]),
    ],
)
def test_restore_rejects_garbage_and_keeps_state(kv_path: Path, data: bytes) -> None:
    kv = KVStateMachine(kv_path)
    kv.apply([normal(1, encode_put("keep", b"me"))])
    with pytest.raises(ValueError, match="snapshot"):
        kv.restore(9, data)
    assert kv.applied_index() == 1
    assert kv.get("keep") == b"me"
    kv.close()


def test_closed_machine_raises(kv_path: Path) -> None:
    kv = KVStateMachine(kv_path)
    kv.close()
    kv.close()
    with pytest.raises(RuntimeError, match="closed"):
        kv.get("a")
