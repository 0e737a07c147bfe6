"""The driver does not save a Ready that only moves the commit index (the commit index is
volatile in Raft): after a restart the stored commit index may be below what the state machine
applied. The servers must come back with every acknowledged write, apply nothing twice, and
keep serving writes."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio
from cluster import free_ports

from orchestrator.raft.node import NodeConfig
from orchestrator.server import open_store
from orchestrator.store.raftstore import RaftStore


@asynccontextmanager
async def site(root: Path, founders: dict[int, str]) -> AsyncIterator[dict[int, RaftStore]]:
    stores = {
        nid: RaftStore(
            NodeConfig(
                node_id=nid,
                data_dir=root / str(nid),
                peer_listen=addr,
                founders=founders,
                tick_interval=0.02,
                seed=nid,
            ),
            lambda d: open_store(d, quota_bytes=2**30),
            quorum_timeout=5.0,
        )
        for nid, addr in founders.items()
    }
    async with trio.open_nursery() as nursery:
        for s in stores.values():
            await nursery.start(s.run)
        yield stores
        nursery.cancel_scope.cancel()


def stored_commit(data_dir: Path) -> int:
    with sqlite3.connect(data_dir / "raft.db") as conn:
        return int(conn.execute("SELECT commit_idx FROM hard_state").fetchone()[0])


async def test_a_restart_with_the_commit_index_behind_the_applied_one(tmp_path: Path) -> None:
    founders = {i + 1: f"127.0.0.1:{p}" for i, p in enumerate(free_ports(3))}
    with trio.fail_after(60):
        async with site(tmp_path, founders) as stores:
            leader = await stores[1].node.wait_leader()
            for i in range(20):
                await stores[leader].create(f"/k/{i}", b"%d" % i)
            applied = stores[leader].node.applied_index()
            revision = stores[leader].mvcc.revision()
        # The leader's last commit (a Ready with no entries) was not saved.
        assert stored_commit(tmp_path / str(leader)) < applied
        async with site(tmp_path, founders) as stores:
            leader = await stores[1].node.wait_leader()
            for i in range(20):
                kv = await stores[leader].get(f"/k/{i}")
                assert kv is not None
                assert kv.value == b"%d" % i
            assert stores[leader].mvcc.revision() == revision  # nothing applied twice
            await stores[leader].create("/after", b"x")
            assert stores[leader].mvcc.revision() == revision + 1
