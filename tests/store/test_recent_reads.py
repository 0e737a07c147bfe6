"""Local reads of recently written keys (`RaftStore._recent`): served from the apply events,
always the key's latest applied state, bounded, dropped when a snapshot replaces the state."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import trio

from orchestrator.raft.node import NodeConfig, RaftNode
from orchestrator.server import open_store
from orchestrator.store import raftstore
from orchestrator.store.raftstore import RaftStore
from orchestrator.store.types import Event, EventType, KeyValue


def _put(key: str, value: bytes, rev: int) -> Event:
    return Event(EventType.PUT, KeyValue(key, value, rev, rev, 1))


def _delete(key: str, rev: int) -> Event:
    return Event(EventType.DELETE, KeyValue(key, b"", 0, rev, 0))


def _bare_store() -> RaftStore:
    return RaftStore(SimpleNamespace())  # type: ignore[arg-type]  # only _remember is used


def test_latest_write_wins_deletes_are_remembered_and_size_is_bounded(monkeypatch: Any) -> None:
    monkeypatch.setattr(raftstore, "RECENT_BYTES", 10)
    monkeypatch.setattr(raftstore, "RECENT_KEYS", 3)
    s = _bare_store()
    s._remember([_put("a", b"1", 2), _put("b", b"22", 3), _put("a", b"333", 4)])
    assert s._recent["a"] == KeyValue("a", b"333", 4, 4, 1)
    assert list(s._recent) == ["b", "a"]  # oldest write first
    assert s._recent_bytes == 5
    s._remember([_delete("b", 5)])
    assert s._recent["b"] is None
    assert s._recent_bytes == 3
    s._remember([_put("c", b"4444", 6), _put("d", b"5", 7)])  # 4 keys: the oldest goes
    assert list(s._recent) == ["b", "c", "d"]  # the delete was b's latest write
    s._remember([_put("e", b"666666", 8)])  # 3 + 4 + 1 + 6 bytes > 10: oldest go
    assert list(s._recent) == ["d", "e"]
    assert s._recent_bytes == 7


async def test_local_gets_see_every_applied_write(tmp_path: Path) -> None:
    cfg = NodeConfig(
        node_id=1, data_dir=tmp_path, peer_listen="127.0.0.1:0", founders={1: "127.0.0.1:0"}
    )
    store = RaftStore(RaftNode(cfg, lambda d: open_store(d, quota_bytes=2**30)))
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        with trio.fail_after(10):
            await store.node.wait_leader()
            first = await store.create("/k", b"v1")
            assert "/k" in store._recent
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
            # A key not written since start-up is read from the database.
            assert await store.get("/other", linearizable=False) is None
            assert "/other" not in store._recent
            store._on_snapshot()
            assert store._recent == {}
        nursery.cancel_scope.cancel()
