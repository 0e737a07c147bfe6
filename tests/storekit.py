"""In-process Raft servers for tests: `RaftNode`s running the MVCC store, each under a
`RaftStore`, talking TCP over loopback in one trio run (`cluster.py` runs real processes)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio
from cluster import free_ports

from orchestrator.raft.node import NodeConfig
from orchestrator.server import open_store
from orchestrator.store.raftstore import RaftStore


@asynccontextmanager
async def raft_stores(root: Path, size: int) -> AsyncIterator[dict[int, RaftStore]]:
    """`size` founding servers (node ids 1..size, data under `root/<id>`), started; cancelled
    on exit."""
    founders = {i + 1: f"127.0.0.1:{p}" for i, p in enumerate(free_ports(size))}
    stores: dict[int, RaftStore] = {}
    for nid, addr in founders.items():
        cfg = NodeConfig(
            node_id=nid,
            data_dir=root / str(nid),
            peer_listen=addr,
            founders=founders,
            tick_interval=0.02,
            seed=nid,
        )
        stores[nid] = RaftStore(cfg, lambda d: open_store(d, quota_bytes=2**30), quorum_timeout=3.0)
    async with trio.open_nursery() as nursery:
        for s in stores.values():
            await nursery.start(s.run)
        yield stores
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def lone_store(root: Path) -> AsyncIterator[RaftStore]:
    """A one-server store (data under `root`) that leads; cancelled on exit."""
    cfg = NodeConfig(
        node_id=1, data_dir=root, peer_listen="127.0.0.1:0", founders={1: "127.0.0.1:0"}
    )
    store = RaftStore(cfg, lambda d: open_store(d, quota_bytes=2**30))
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        with trio.fail_after(10):
            await store.node.wait_leader()
        yield store
        nursery.cancel_scope.cancel()
