"""The Raft log is bounded in bytes as well as in entries: batch entries can hold 256 KiB, so a
snapshot is also taken after `snapshot_every_bytes` of applied data, and the tail kept for slow
followers holds at most `keep_tail_bytes`."""

from __future__ import annotations

from pathlib import Path

import trio

from orchestrator.raft.node import NodeConfig
from orchestrator.server import open_store
from orchestrator.store.raftstore import RaftStore


async def test_snapshot_after_enough_bytes_and_a_tail_bounded_in_bytes(tmp_path: Path) -> None:
    cfg = NodeConfig(
        node_id=1,
        data_dir=tmp_path,
        peer_listen="127.0.0.1:0",
        founders={1: "127.0.0.1:0"},
        snapshot_every=1_000_000,  # never by count here
        keep_tail=1_000_000,
        snapshot_every_bytes=64 * 1024,
        keep_tail_bytes=16 * 1024,
    )
    store = RaftStore(cfg, lambda d: open_store(d, quota_bytes=2**30))
    value = b"x" * 4096
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        with trio.fail_after(20):
            await store.node.wait_leader()
            for i in range(20):  # 80 KiB, one entry each: more than 64 KiB
                await store.create(f"/k{i}", value)
        node = store.node
        snap = node._snapshot.meta.index
        assert snap > 0, "no snapshot after 80 KiB"
        log = node.core.log
        kept = [e for e in log.entries if e.index <= snap]
        assert sum(len(e.data) for e in kept) <= 16 * 1024
        assert 1 <= len(kept) <= 4  # 4 KiB entries: at most 4 fit in 16 KiB
        # Nothing acknowledged was lost to the compaction.
        for i in range(20):
            kv = await store.get(f"/k{i}")
            assert kv is not None
            assert kv.value == value
        nursery.cancel_scope.cancel()
