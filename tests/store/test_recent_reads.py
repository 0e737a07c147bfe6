"""Local reads of recently written keys (`RaftStore.recent`, a `store.recent.RecentValues`):
served from the apply events, always the key's latest applied state, bounded, dropped when a
snapshot replaces the state; a database read is added only when no write was applied after it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from storekit import lone_store

from orchestrator.store.recent import RecentValues
from orchestrator.store.types import Event, EventType, KeyValue


def _put(key: str, value: bytes, rev: int) -> Event:
    return Event(EventType.PUT, KeyValue(key, value, rev, rev, 1))


def _delete(key: str, rev: int) -> Event:
    return Event(EventType.DELETE, KeyValue(key, b"", 0, rev, 0))


def test_latest_write_wins_deletes_are_remembered_and_size_is_bounded() -> None:
    s = RecentValues(max_bytes=10, max_keys=3)
    s.remember([_put("a", b"1", 2), _put("b", b"22", 3), _put("a", b"333", 4)])
    assert s.values["a"] == KeyValue("a", b"333", 4, 4, 1)
    assert list(s.values) == ["b", "a"]  # oldest write first
    assert s.bytes == 5
    s.remember([_delete("b", 5)])
    assert s.values["b"] is None
    assert s.bytes == 3
    s.remember([_put("c", b"4444", 6), _put("d", b"5", 7)])  # 4 keys: the oldest goes
    assert list(s.values) == ["b", "c", "d"]  # the delete was b's latest write
    s.remember([_put("e", b"666666", 8)])  # 3 + 4 + 1 + 6 bytes > 10: oldest go
    assert list(s.values) == ["d", "e"]
    assert s.bytes == 7


async def test_local_gets_see_every_applied_write(tmp_path: Path) -> None:
    async with lone_store(tmp_path) as store:
        first = await store.create("/k", b"v1")
        assert "/k" in store.recent.values
        assert await store.get("/k", linearizable=False) == first
        second = await store.update("/k", b"v2", expected_mod_revision=first.mod_revision)
        kv = await store.get("/k", linearizable=False)
        assert kv == second
        assert kv is not None
        assert kv.value == b"v2"
        assert kv == await store.get("/k")  # the same as the linearizable database read
        await store.delete("/k")
        assert await store.get("/k", linearizable=False) is None
        assert await store.get("/k") is None
        # A key not written since start-up is read from the database, once: no write was
        # applied after that read, so what it found (nothing) is the key's live state.
        assert "/other" not in store.recent.values
        assert await store.get("/other", linearizable=False) is None
        assert "/other" in store.recent.values
        assert store.recent.values["/other"] is None
        made = await store.create("/other", b"x")
        assert await store.get("/other", linearizable=False) == made
        store._on_snapshot()
        assert store.recent.values == {}
        # After a snapshot, nothing read is added until an applied write names the revision.
        assert await store.get("/other", linearizable=False) == made
        assert store.recent.values == {}


def test_a_database_read_is_added_only_if_no_write_was_applied_after_it() -> None:
    s = RecentValues()
    found = KeyValue("n", b"ns", 2, 2, 1)
    s.remember_read("n", found, 2)  # nothing remembered yet: the revision is not known
    assert "n" not in s.values
    s.remember([_put("a", b"1", 3)])
    s.remember_read("n", found, 2)  # read before revision 3 was applied: maybe stale
    assert "n" not in s.values
    s.remember_read("n", found, 3)
    assert s.values["n"] is found
    assert s.bytes == 3
    s.remember([_put("n", b"new", 4)])
    s.remember_read("n", found, 4)  # the key is known: an apply event is never overwritten
    assert s.values["n"] == KeyValue("n", b"new", 4, 4, 1)
    s.remember_read("gone", None, 4)  # absence is a value too
    assert s.values["gone"] is None
    s.clear()
    s.remember_read("n", found, 4)
    assert s.values == {}


async def test_namespace_like_keys_are_read_from_the_database_once(tmp_path: Path) -> None:
    async with lone_store(tmp_path) as store:
        ns = await store.create("/ns/default", b"namespace")
        store.recent.max_keys = 4
        for i in range(6):  # the namespace's write is pushed out of the recent values
            await store.create(f"/pods/p{i}", b"pod")
        assert "/ns/default" not in store.recent.values
        reads = 0
        real = store._read

        async def counting(*args: Any) -> Any:
            nonlocal reads
            reads += 1
            return await real(*args)

        store._read = counting  # type: ignore[method-assign]
        for i in range(3):
            assert await store.get("/ns/default", linearizable=False) == ns
            await store.create(f"/pods/q{i}", b"pod")  # writes to other keys meanwhile
        assert reads == 1


def test_a_previous_value_it_holds_is_shared_with_the_event() -> None:
    s = RecentValues()
    s.remember([_put("a", b"v1", 2)])
    held = s.get("a")
    assert isinstance(held, KeyValue)
    copy = KeyValue("a", bytes(bytearray(b"v1")), 2, 2, 1)  # the store's read of it
    events = [
        Event(EventType.PUT, KeyValue("a", b"v2", 2, 3, 2), copy),
        Event(EventType.PUT, KeyValue("b", b"w", 4, 4, 1), KeyValue("b", b"old", 1, 1, 1)),
    ]
    out = s.share_prev(events)
    assert out[0].prev_kv is held  # the same revision: one value object
    assert out[0].kv is events[0].kv
    assert out[1] is events[1]  # "b" at revision 1 is not known here
    s.remember(out)
    stale = [Event(EventType.PUT, KeyValue("a", b"v4", 2, 5, 4), copy)]  # not the held revision
    assert s.share_prev(stale) is stale
