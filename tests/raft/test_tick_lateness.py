"""The Raft loop's tick lateness (`raft_tick_lateness_seconds`): a 3-server site at idle keeps
every tick within 50 ms of its due time while another task hogs the event loop in short bursts,
over a minute of mocked time; and the measure does see a loop that is held up.

The site is three in-process `RaftStore`s (real SQLite, loopback TCP) on trio's MockClock with
autojump: the hog stands for CPU-bound work on the same event loop (an API request, a list
encoding) by advancing the clock without yielding, then yielding, as such work would. The clock
jumps once every task has been blocked for 2 ms of real time rather than at once: a database
call runs on a thread, which trio cannot see, and jumping while one runs would make the disk
look seconds slow (the start-up's fsyncs would then cost whole election timeouts)."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing
from cluster import free_ports

from orchestrator import observability as metrics
from orchestrator.raft.node import NodeConfig
from orchestrator.server import open_store
from orchestrator.store.raftstore import RaftStore
from orchestrator.store.types import NoQuorum, Unavailable

TICK = 0.1  # the servers' default tick: heartbeats every 2, elections after 10-20


@asynccontextmanager
async def idle_site(root: Path) -> AsyncIterator[dict[int, RaftStore]]:
    """Three founding servers with the default timing, started and with a leader."""
    founders = {i + 1: f"127.0.0.1:{p}" for i, p in enumerate(free_ports(3))}
    stores = {
        nid: RaftStore(
            NodeConfig(
                node_id=nid,
                data_dir=root / str(nid),
                peer_listen=addr,
                founders=founders,
                tick_interval=TICK,
                seed=nid,
            ),
            lambda d: open_store(d, quota_bytes=2**30),
        )
        for nid, addr in founders.items()
    }
    async with trio.open_nursery() as nursery:
        for s in stores.values():
            await nursery.start(s.run)
        with trio.fail_after(120):
            await settle(stores)
        yield stores
        nursery.cancel_scope.cancel()


async def settle(stores: dict[int, RaftStore]) -> None:
    """Until a leader has written once and every server applied all there is, then a second
    more: the ticks and the disk work of the start (and their lateness) are over."""
    for attempt in itertools.count():
        leader = await stores[1].node.wait_leader()
        try:
            await stores[leader].create(f"/settle/{attempt}", b"x")
            break
        except (NoQuorum, Unavailable):
            await trio.sleep(1)  # an election under way
    commit = stores[leader].node.commit_index()
    while any(s.node.applied_index() < commit for s in stores.values()):  # noqa: ASYNC110  (three nodes' state, polled)
        await trio.sleep(TICK)
    await trio.sleep(1)


async def hog(clock: trio.testing.MockClock, burst: float, every: float) -> None:
    """Hold the event loop for `burst` seconds (mocked) every `every` seconds, forever."""
    while True:
        await trio.sleep(every)
        clock.jump(burst)  # no other task runs meanwhile: nothing yields


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0.002)


def lateness(stores: dict[int, RaftStore]) -> dict[int, float]:
    return {nid: s.node.tick_lateness_max for nid, s in stores.items()}


def restart_measure(stores: dict[int, RaftStore]) -> dict[int, int]:
    for s in stores.values():
        s.node.tick_lateness_max = 0.0
    return {nid: s.node.ticks for nid, s in stores.items()}


async def test_idle_site_ticks_on_time_under_a_cpu_hog(
    tmp_path: Path, clock: trio.testing.MockClock
) -> None:
    async with idle_site(tmp_path) as stores:
        leader = stores[1].node.leader_id
        changes = {nid: s.node.leader_changes for nid, s in stores.items()}
        ticks_before = restart_measure(stores)
        observed_before = metrics.RAFT_TICK_LATENESS.count
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hog, clock, 0.02, 0.05)
            await trio.sleep(60)
            nursery.cancel_scope.cancel()
        worst = lateness(stores)
        assert max(worst.values()) <= 0.05, f"ticks this late (s), by node: {worst}"
        for nid, s in stores.items():
            # Every tick of the minute ran (coalesced ones would show as fewer).
            assert s.node.ticks - ticks_before[nid] >= 0.9 * 60 / TICK, nid
            assert s.node.leader_changes == changes[nid], f"node {nid} saw an election"
            assert s.node.leader_id == leader
        assert metrics.RAFT_TICK_LATENESS.count - observed_before >= 3 * 0.9 * 60 / TICK


async def test_a_held_loop_shows_as_late_ticks(
    tmp_path: Path, clock: trio.testing.MockClock
) -> None:
    async with idle_site(tmp_path) as stores:
        restart_measure(stores)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hog, clock, 0.3, 0.5)  # 300 ms held, below an election
            await trio.sleep(5)
            nursery.cancel_scope.cancel()
        worst = lateness(stores)
        assert all(0.2 <= w <= 0.35 for w in worst.values()), worst
