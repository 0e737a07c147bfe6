"""Batch entries in the MVCC store (raft/statemachine.py `pack_batch`, `MVCCStore.apply`).

A batch entry holds several commands that arrived together; the store applies them in order as
if they were consecutive entries (one revision per successful write) and returns the list of
their results as the entry's result. These tests check that contract directly on the store
(real SQLite files in tmp_path, synchronous): the encoding's round trip and rejects, revisions
and results, equivalence with the same commands applied unbatched (results, events, every table
row), failures that stay inside one command, the undecodable batch, exactly-once replay after a
reopen, and batch and plain entries mixed in one `apply` call.
"""

from __future__ import annotations

import dataclasses
import itertools
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_mvcc import Node, dump  # its dump leaves out the applied index, as batching needs

from orchestrator.raft.statemachine import BATCH_TAG, pack_batch, unpack_batch
from orchestrator.raft.types import ConfChange, ConfChangeType, Entry, EntryType
from orchestrator.store.types import (
    Compare,
    CompareTarget,
    Conflict,
    Event,
    EventType,
    InvalidRequest,
    KeyExists,
    KeyNotFound,
    KeyValue,
    QuotaExceeded,
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


class Log(Node):
    """`Node` (test_mvcc's store plus next log index) with batches: `entry(data)` makes the next
    entry, `batch(*commands)` applies one batch entry, `plain` the commands unbatched."""

    def entry(self, data: bytes, etype: EntryType = EntryType.NORMAL) -> Entry:
        self.index += 1
        return Entry(1, self.index, etype, data)

    def batch(self, *commands: bytes) -> Any:
        """Apply one batch entry holding `commands`; its result."""
        return self.store.apply([self.entry(pack_batch(commands))])[0]

    plain = Node.apply  # the commands as consecutive unbatched entries; their results


@pytest.fixture
def log(tmp_path: Path) -> Iterator[Log]:
    lg = Log(tmp_path / "a.db")
    yield lg
    lg.close()


@pytest.fixture
def twin(tmp_path: Path) -> Iterator[Log]:
    lg = Log(tmp_path / "b.db")
    yield lg
    lg.close()


def norm(result: Any) -> Any:
    """A result made comparable: errors (exceptions compare by identity) become their type and
    message; a batch's list of results is normalized item by item."""
    if isinstance(result, list):
        return [norm(r) for r in result]
    if isinstance(result, WriteResult | TxnResult) and result.error is not None:
        err = result.error
        extra = err.current if isinstance(err, Conflict) else None
        return dataclasses.replace(result, error=None), type(err), str(err), extra
    return result


def put_event(key: str, value: bytes, create: int, mod: int, version: int) -> Event:
    return Event(EventType.PUT, KeyValue(key, value, create, mod, version))


# ---------------------------------------------------------------------------- the encoding
@pytest.mark.parametrize(
    "commands",
    [
        [],
        [b""],
        [encode_put("a", b"1")],
        [encode_put("a", b"1"), encode_create("b", b"\xc1" * 300), encode_delete("a")],
        [b"\x00" * 70_000, b"x"],  # bin 32 length header
    ],
)
def test_pack_unpack_round_trip(commands: list[bytes]) -> None:
    data = pack_batch(commands)
    assert data[:1] == BATCH_TAG
    assert unpack_batch(data) == commands


def test_no_command_starts_with_the_batch_tag() -> None:
    # 0xC1 is the one byte msgpack never emits: a plain command is never mistaken for a batch.
    for cmd in (encode_put("k", b"v"), encode_noop(), encode_compact(3), encode_delete("k")):
        assert cmd[:1] != BATCH_TAG
        with pytest.raises(ValueError, match="not a batch"):
            unpack_batch(cmd)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param(b"", "not a batch", id="empty"),
        pytest.param(msgpack.packb([b"a"]), "not a batch", id="no-tag"),
        pytest.param(BATCH_TAG, "undecodable", id="tag-only"),
        pytest.param(BATCH_TAG + b"\xc1\xc1\xc1", "undecodable", id="garbage"),
        pytest.param(BATCH_TAG + b"\x92\xc4\x01a", "undecodable", id="truncated"),
        pytest.param(pack_batch([b"a"]) + b"\x00", "undecodable", id="trailing-bytes"),
        pytest.param(BATCH_TAG + msgpack.packb({"a": b"b"}), "array", id="map"),
        pytest.param(BATCH_TAG + msgpack.packb(b"a"), "array", id="bytes"),
        pytest.param(BATCH_TAG + msgpack.packb(["put"]), "array", id="str-item"),
        pytest.param(BATCH_TAG + msgpack.packb([b"a", 1]), "array", id="int-item"),
        pytest.param(BATCH_TAG + msgpack.packb([[b"a"]]), "array", id="nested-array"),
        pytest.param(BATCH_TAG + msgpack.packb([None]), "array", id="nil-item"),
    ],
)
def test_unpack_rejects(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        unpack_batch(data)


# ---------------------------------------------------------------------------- applying
def test_batch_gets_one_revision_per_command_in_order(log: Log) -> None:
    log.plain(encode_put("old", b"0"))  # revision 2
    res = log.batch(
        encode_put("a", b"1"),
        encode_create("b", b"2"),
        encode_put("a", b"3", 3),  # CAS on the revision the first command got
        encode_delete("old"),
        encode_txn([Compare("a", CompareTarget.VALUE, "=", b"3")], [TxnOp("c", b"4")], []),
        encode_noop(),  # no revision
        encode_put("b", b"5"),
    )
    assert isinstance(res, list)
    assert len(res) == 7
    assert all(getattr(r, "error", None) is None for r in res)
    assert [r.revision for r in res] == [3, 4, 5, 6, 7, 7, 8]
    a1, b2, a3, d, txn, noop, b5 = res
    assert a1.kv == KeyValue("a", b"1", 3, 3, 1)
    assert a1.prev_kv is None
    assert b2.kv == KeyValue("b", b"2", 4, 4, 1)
    assert a3.kv == KeyValue("a", b"3", 3, 5, 2)
    assert a3.prev_kv == a1.kv
    assert d.prev_kv == KeyValue("old", b"0", 2, 2, 1)
    assert txn == TxnResult(True, 7, [])
    assert noop == WriteResult(7)
    assert b5.kv == KeyValue("b", b"5", 4, 8, 2)
    s = log.store
    assert s.revision() == 8
    assert s.applied_index() == 2
    assert [(e.type, e.kv.key, e.kv.mod_revision) for e in s.take_events()] == [
        (EventType.PUT, "old", 2),
        (EventType.PUT, "a", 3),
        (EventType.PUT, "b", 4),
        (EventType.PUT, "a", 5),
        (EventType.DELETE, "old", 6),
        (EventType.PUT, "c", 7),
        (EventType.PUT, "b", 8),
    ]
    assert s.get("a") == KeyValue("a", b"3", 3, 5, 2)
    assert s.get("old") is None
    assert s.get("a", revision=3) == a1.kv  # history at a batch-internal revision


def test_txn_in_a_batch_sees_earlier_commands_of_the_batch(log: Log) -> None:
    res = log.batch(
        encode_put("k", b"1"),
        encode_txn(
            [Compare("k", CompareTarget.MOD, "=", 2)],
            [TxnOp("k", get=True), TxnOp("k", b"2")],
            [TxnOp("k", get=True)],
        ),
    )
    assert res[1] == TxnResult(True, 3, [KeyValue("k", b"1", 2, 2, 1)])


COMMANDS = [
    encode_put("a", b"1"),
    encode_create("b", b"1"),
    encode_put("a", b"2", 2),
    encode_delete("b"),
    encode_txn(
        [Compare("a", CompareTarget.VERSION, "=", 2)],
        [TxnOp("a", b"3"), TxnOp("c", b"3"), TxnOp("a", get=True)],
        [TxnOp("a", None)],
    ),
    encode_create("b", b"again"),
    encode_put("c", b"4", 99),  # Conflict
    encode_delete("missing"),  # KeyNotFound
    encode_compact(3),
    encode_put("d", b"5"),
    encode_txn([], [TxnOp("a", None), TxnOp("missing", None)], []),
]


@pytest.mark.parametrize("split", [[len(COMMANDS)], [1, 4, 6], [3, 3, 3, 2], [2, 9]])
def test_batches_equal_consecutive_entries(log: Log, twin: Log, split: list[int]) -> None:
    """The same commands, unbatched on one store and in batches of `split` sizes on another:
    the same results, revisions, events (with prev_kv) and table rows."""
    plain = log.plain(*COMMANDS)
    batched: list[Any] = []
    i = 0
    for n in split:
        res = twin.batch(*COMMANDS[i : i + n])
        assert isinstance(res, list)
        assert len(res) == n
        batched.extend(res)
        i += n
    assert i == len(COMMANDS)
    assert norm(batched) == norm(plain)
    assert twin.store.take_events() == log.store.take_events()
    assert dump(twin.path) == dump(log.path)
    assert twin.store.revision() == log.store.revision() == 9
    for rev in range(4, 11):  # replay from the ring and (after a reopen) from SQLite
        assert twin.store.events_since(rev) == log.store.events_since(rev)
    twin.reopen()
    log.reopen()
    for rev in range(4, 11):
        assert twin.store.events_since(rev) == log.store.events_since(rev)


def test_a_failing_command_fails_alone(tmp_path: Path) -> None:
    lg = Log(tmp_path / "q.db", quota_bytes=2000)
    try:
        lg.plain(encode_put("x", b"0"), encode_put("y", b"0"))  # revisions 2, 3
        res = lg.batch(
            encode_put("a", b"1"),  # 4
            encode_create("x", b"dup"),  # KeyExists
            encode_put("y", b"cas", 2),  # Conflict: y is at 3
            encode_put("big", b"z" * 5000),  # QuotaExceeded
            encode_txn([], [TxnOp("big2", b"z" * 5000)], []),  # QuotaExceeded
            b"\x93garbage",  # an undecodable command: InvalidRequest
            pack_batch([encode_put("nested", b"1")]),  # no nesting: InvalidRequest
            encode_delete("nope"),  # KeyNotFound
            encode_put("y", b"cas", 3),  # 5
        )
        errors = [type(r.error) if r.error is not None else None for r in res]
        assert errors == [
            None,
            KeyExists,
            Conflict,
            QuotaExceeded,
            QuotaExceeded,
            InvalidRequest,
            InvalidRequest,
            KeyNotFound,
            None,
        ]
        assert res[2].error.current == KeyValue("y", b"0", 3, 3, 1)
        assert [r.revision for r in res] == [4, 4, 4, 4, 4, 4, 4, 4, 5]
        assert res[4].succeeded is False
        s = lg.store
        assert s.revision() == 5
        assert [(e.kv.key, e.kv.mod_revision) for e in s.take_events()] == [
            ("x", 2),
            ("y", 3),
            ("a", 4),
            ("y", 5),
        ]
        assert s.get("x") == KeyValue("x", b"0", 2, 2, 1)
        assert s.get("big") is None
        assert s.get("nested") is None
    finally:
        lg.close()


def test_two_creates_of_one_key_in_a_batch(log: Log) -> None:
    first, second = log.batch(encode_create("k", b"first"), encode_create("k", b"second"))
    assert first.error is None
    assert first.kv == KeyValue("k", b"first", 2, 2, 1)
    assert isinstance(second.error, KeyExists)
    assert second.revision == 2
    assert log.store.get("k") == first.kv
    assert len(log.store.take_events()) == 1


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(BATCH_TAG + b"\xc1garbage", id="garbage"),
        pytest.param(BATCH_TAG, id="tag-only"),
        pytest.param(BATCH_TAG + msgpack.packb(["put", "k", b"v", None]), id="str-items"),
        pytest.param(BATCH_TAG + msgpack.packb({"k": b"v"}), id="map"),
    ],
)
def test_undecodable_batch_is_one_failed_result(log: Log, data: bytes) -> None:
    log.plain(encode_put("k", b"1"))
    log.store.take_events()
    before = dump(log.path)
    [res] = log.store.apply([log.entry(data)])
    assert isinstance(res, WriteResult)
    assert isinstance(res.error, InvalidRequest)
    assert res.revision == 2
    assert res.kv is None
    assert log.store.applied_index() == 2
    assert log.store.revision() == 2
    assert log.store.take_events() == []
    assert dump(log.path) == before
    log.reopen()  # the applied index moved durably
    assert log.plain(encode_put("k", b"2"))[0].revision == 3


def test_an_empty_command_in_a_batch_is_as_an_empty_entry(log: Log, twin: Log) -> None:
    # An empty entry is "no command" (result None, like a new leader's entry); so is an empty
    # command inside a batch, or `RaftNode.propose(b"")` would resolve differently alone and
    # with other proposals in its loop turn.
    plain = twin.plain(encode_put("a", b"1"), b"", encode_put("a", b"2"))
    assert plain[1] is None
    batched = log.batch(encode_put("a", b"1"), b"", encode_put("a", b"2"))
    assert norm(batched) == norm(plain)


def test_empty_batch_advances_only_the_applied_index(log: Log) -> None:
    assert log.batch() == []
    assert log.store.applied_index() == 1
    assert log.store.revision() == 1
    assert log.store.take_events() == []


def test_replaying_a_batch_after_reopen_has_no_second_effect(log: Log) -> None:
    batch = log.entry(pack_batch([encode_put("a", b"1"), encode_create("b", b"2")]))
    first: list[Any] = log.store.apply([batch])
    assert [r.revision for r in first[0]] == [2, 3]
    log.store.take_events()
    state = dump(log.path)
    log.reopen()
    assert dump(log.path) == state
    after = log.entry(pack_batch([encode_put("a", b"3"), encode_delete("b")]))
    # The driver replays from its log: the applied batch is skipped as a whole (result None),
    # the next one applies once.
    res: list[Any] = log.store.apply([batch, after])
    assert res[0] is None
    assert [r.revision for r in res[1]] == [4, 5]
    assert [(e.kv.key, e.kv.mod_revision) for e in log.store.take_events()] == [
        ("a", 4),
        ("b", 5),
    ]
    state = dump(log.path)
    log.reopen()
    assert log.store.apply([batch, after]) == [None, None]
    assert log.store.take_events() == []
    assert dump(log.path) == state
    assert log.store.revision() == 5


def test_mixed_batch_and_plain_entries_in_one_apply(log: Log, twin: Log) -> None:
    cc = ConfChange(ConfChangeType.ADD_LEARNER, 4).encode()
    entries = [
        log.entry(encode_put("a", b"1")),
        log.entry(pack_batch([encode_put("a", b"2"), encode_create("b", b"1")])),
        log.entry(cc, EntryType.CONF_CHANGE),
        log.entry(b""),  # an empty entry (a new leader's): no command
        log.entry(BATCH_TAG + b"junk"),
        log.entry(encode_delete("a")),
        log.entry(pack_batch([encode_create("a", b"3"), encode_create("a", b"4")])),
    ]
    res: list[Any] = log.store.apply(entries)
    assert len(res) == 7
    assert res[0].revision == 2
    assert [r.revision for r in res[1]] == [3, 4]
    assert res[2] is None
    assert res[3] is None
    assert isinstance(res[4].error, InvalidRequest)
    assert res[5].revision == 5
    assert res[6][0].revision == 6
    assert isinstance(res[6][1].error, KeyExists)
    assert log.store.applied_index() == 7
    # The same commands one entry each on a second store: identical state and events.
    cmds = [
        encode_put("a", b"1"),
        encode_put("a", b"2"),
        encode_create("b", b"1"),
        encode_delete("a"),
        encode_create("a", b"3"),
        encode_create("a", b"4"),
    ]
    twin.plain(*cmds)
    assert twin.store.take_events() == log.store.take_events()
    assert dump(twin.path) == dump(log.path)


def test_a_batch_is_all_or_nothing_with_its_apply_call(log: Log) -> None:
    # A broken log (a gap) fails the whole apply call, batch entries included: nothing lands.
    good = log.entry(pack_batch([encode_put("a", b"1")]))
    log.index += 1  # skip an index
    gap = log.entry(pack_batch([encode_put("b", b"1")]))
    with pytest.raises(ValueError, match="does not follow"):
        log.store.apply([good, gap])
    assert log.store.applied_index() == 0
    assert log.store.revision() == 1
    assert log.store.get("a") is None


# ---------------------------------------------------------------------------- property
_KEYS = ["a", "b", "c"]
_command = st.one_of(
    st.builds(encode_put, st.sampled_from(_KEYS), st.binary(max_size=8)),
    st.builds(
        encode_put, st.sampled_from(_KEYS), st.binary(max_size=8), st.integers(0, 12) | st.none()
    ),
    st.builds(encode_create, st.sampled_from(_KEYS), st.binary(max_size=8)),
    st.builds(encode_delete, st.sampled_from(_KEYS), st.integers(0, 12) | st.none()),
    st.builds(
        lambda k, v, w: encode_txn(
            [Compare(k, CompareTarget.VALUE, "=", v)], [TxnOp(k, w)], [TxnOp(k, get=True)]
        ),
        st.sampled_from(_KEYS),
        st.binary(max_size=2) | st.none(),
        st.binary(max_size=8) | st.none(),
    ),
    st.builds(encode_compact, st.integers(1, 12)),
    st.just(encode_noop()),
    # Mostly garbage, or empty; never starting with the batch tag, which makes a plain entry a
    # batch (no real command starts with it: msgpack never writes 0xC1).
    st.binary(max_size=4).filter(lambda b: not b.startswith(BATCH_TAG)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    commands=st.lists(_command, max_size=25),
    cuts=st.lists(st.integers(0, 25), max_size=6),
    quota=st.sampled_from([2**30, 120]),
)
def test_any_batching_equals_consecutive_entries(
    commands: list[bytes], cuts: list[int], quota: int
) -> None:
    """Whatever commands and however they are cut into batches (a batch of one included),
    results, events and tables equal the unbatched application's."""
    bounds = sorted({0, len(commands), *(c for c in cuts if c <= len(commands))})
    with tempfile.TemporaryDirectory() as tmp:
        plain = Log(Path(tmp) / "plain.db", quota_bytes=quota)
        batched = Log(Path(tmp) / "batched.db", quota_bytes=quota)
        try:
            expected = plain.plain(*commands)
            entries = [
                batched.entry(pack_batch(commands[lo:hi])) for lo, hi in itertools.pairwise(bounds)
            ]
            got: list[Any] = []
            for res in batched.store.apply(entries):
                assert isinstance(res, list)
                got.extend(res)
            assert norm(got) == norm(expected)
            assert batched.store.take_events() == plain.store.take_events()
            assert dump(batched.path) == dump(plain.path)
        finally:
            plain.close()
            batched.close()
