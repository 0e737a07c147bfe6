"""`storage.Decoded`: decoded objects shared by the readers of one write, within its bounds."""

from __future__ import annotations

from orchestrator.apiserver.storage import Decoded, encode
from orchestrator.kube.objects import Obj
from orchestrator.store.types import KeyValue


def _kv(name: str, rev: int, data: str = "x") -> KeyValue:
    obj: Obj = {"metadata": {"name": name}, "data": {"k": data}}
    return KeyValue(f"/{name}", encode(obj), 1, rev, 1)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_readers_of_one_revision_share_one_object() -> None:
    decoded = Decoded()
    kv = _kv("a", 2)
    first = decoded.get(kv)
    assert decoded.get(kv) is first
    assert first["metadata"]["resourceVersion"] == "2"
    assert decoded.get(_kv("a", 3)) is not first


def test_the_oldest_entries_go_beyond_the_byte_budget() -> None:
    one = len(_kv("a", 1).value)
    decoded = Decoded(max_bytes=3 * one)
    kvs = [_kv(n, i + 1) for i, n in enumerate("abcde")]
    objs = [decoded.get(kv) for kv in kvs]
    assert len(decoded) == 3
    assert decoded.bytes == 3 * one
    assert decoded.get(kvs[4]) is objs[4]  # kept
    assert decoded.get(kvs[0]) is not objs[0]  # dropped, decoded again
    assert decoded.get(kvs[0]) == objs[0]


def test_the_oldest_entries_go_beyond_the_entry_count() -> None:
    decoded = Decoded(size=2)
    kvs = [_kv(n, i + 1) for i, n in enumerate("abc")]
    objs = [decoded.get(kv) for kv in kvs]
    assert len(decoded) == 2
    assert decoded.get(kvs[2]) is objs[2]
    assert decoded.get(kvs[0]) is not objs[0]


def test_entries_older_than_max_age_go_at_the_next_access() -> None:
    clock = _Clock()
    decoded = Decoded(max_age=10.0, clock=clock)
    old = decoded.get(_kv("a", 1))
    clock.now = 5.0
    recent = decoded.get(_kv("b", 2))
    clock.now = 12.0
    decoded.get(_kv("c", 3))  # a miss: the entries older than 10 s go
    assert len(decoded) == 2
    assert decoded.bytes == sum(len(_kv(n, 1).value) for n in "bc")
    assert decoded.get(_kv("b", 2)) is recent
    assert decoded.get(_kv("a", 1)) is not old


def test_expectations_are_bounded_too() -> None:
    clock = _Clock()
    decoded = Decoded(size=2, max_age=10.0, clock=clock)
    mine: Obj = {"metadata": {"name": "a"}, "data": {"k": "x"}}
    decoded.expect("/a", encode(mine), mine)
    for n in "bc":  # two more: the first expectation goes
        decoded.expect(f"/{n}", encode(mine), mine)
    assert decoded.get(_kv("a", 4))["data"] is not mine["data"]
    decoded.expect("/d", encode(mine), mine)
    clock.now = 11.0
    decoded.expect("/e", encode(mine), mine)  # "/d" is now too old to be used
    assert decoded.get(KeyValue("/d", encode(mine), 1, 5, 1))["data"] is not mine["data"]
    assert decoded.get(KeyValue("/e", encode(mine), 1, 6, 1))["data"] is mine["data"]
