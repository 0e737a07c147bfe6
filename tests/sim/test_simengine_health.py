"""The simulated nodes' Lease health and 5xx accounting (what `bench reconcile` reports), on a
fake client and trio's MockClock: failed renewals, late renewals, a Lease that lapsed, and
`client_for` giving each node its own client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from orchestrator.client import ResourceInfo
from orchestrator.kube.errors import ApiError
from orchestrator.testing.nodes import SimulatedCluster
from orchestrator.testing.simengine import LEASE_LATE

Obj = dict[str, Any]


class FakeClient:
    """Answers the engine's writes; `fail` answers the next Lease patches with a 503 and
    `delay` makes the next Lease patch take that long (trio time)."""

    def __init__(self, name: str = "") -> None:
        self.name = name
        self.fail = 0
        self.delay = 0.0
        self.writes: list[tuple[str, str, str]] = []

    async def create(self, res: ResourceInfo, body: Obj, namespace: str = "", **_: Any) -> Obj:
        self.writes.append(("create", res.plural, body["metadata"]["name"]))
        return {"metadata": {**body["metadata"], "uid": "u-" + body["metadata"]["name"]}}

    async def patch(self, res: ResourceInfo, name: str, body: Obj, *a: Any, **k: Any) -> Obj:
        self.writes.append(("patch", res.plural, name))
        if res.plural == "leases":
            if self.fail:
                self.fail -= 1
                raise ApiError(503, "ServiceUnavailable", "no quorum answered")
            if self.delay:
                delay, self.delay = self.delay, 0.0
                await trio.sleep(delay)
        return {"metadata": {"name": name}}

    @asynccontextmanager
    async def watch(self, *a: Any, **k: Any) -> AsyncIterator[AsyncIterator[tuple[str, Obj]]]:
        async def events() -> AsyncIterator[tuple[str, Obj]]:
            await trio.sleep_forever()
            yield ("BOOKMARK", {})  # pragma: no cover

        yield events()


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


async def test_lease_failures_lateness_and_lapses_are_counted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clients = {name: FakeClient(name) for name in ("n-0", "n-1")}
    cluster = SimulatedCluster(
        None, 2, prefix="n-", renew_interval=10.0, lease_duration=40, client_for=clients.__getitem__
    )
    with trio.fail_after(1000):
        async with trio.open_nursery() as nursery:
            await nursery.start(cluster.run)
            # each node wrote as itself: its Node and Lease through its own client
            for name, client in clients.items():
                assert ("create", "nodes", name) in client.writes
                assert ("create", "leases", name) in client.writes
            await trio.sleep(32)  # n-0 renews at 10, 20, 30; n-1 (phase 1/2) at 15, 25
            stats = cluster.statistics()
            assert stats.lease_renewals == 5
            assert (stats.lease_failures, stats.lease_late, stats.lease_lost) == (0, 0, 0)

            clients["n-0"].fail = 1  # the renewal at 40 fails with a 503
            await trio.sleep(10)
            stats = cluster.statistics()
            assert stats.lease_failures == 1
            assert stats.server_errors == 1
            assert stats.lease_renewals == 6  # n-1's at 35

            clients["n-1"].delay = LEASE_LATE + 1  # the renewal at 45 takes 3 s: late
            await trio.sleep(10)
            stats = cluster.statistics()
            assert stats.lease_late == 1
            assert stats.lease_max_delay >= LEASE_LATE + 1
            assert stats.lease_lost == 0

            cluster["n-0"].stop_heartbeats()  # partitioned past its lease duration
            await trio.sleep(60)
            cluster["n-0"].resume_heartbeats()
            await trio.sleep(1)
            stats = cluster.statistics()
            assert stats.lease_lost == 1
            nursery.cancel_scope.cancel()


def test_a_cluster_needs_a_client() -> None:
    with pytest.raises(ValueError, match="needs a client"):
        SimulatedCluster(None, 1)


async def test_a_slow_renewal_holds_up_no_other_node_and_is_not_doubled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Heartbeats have writers of their own: a node whose renewal hangs for 25 s (2.5
    intervals) delays no other node's, and gets no second renewal queued behind the first."""
    clients = {name: FakeClient(name) for name in ("n-0", "n-1")}
    cluster = SimulatedCluster(
        None, 2, prefix="n-", renew_interval=10.0, lease_duration=40, client_for=clients.__getitem__
    )
    with trio.fail_after(1000):
        async with trio.open_nursery() as nursery:
            await nursery.start(cluster.run)
            clients["n-0"].delay = 25.0  # its renewal at 10 returns at 35
            await trio.sleep(42)  # n-1 renews at 15, 25, 35; n-0 at 10 (late) and 40
            stats = cluster.statistics()
            assert stats.lease_late == 1  # n-0's at 10, and n-1's all on time
            n0 = [w for w in clients["n-0"].writes if w == ("patch", "leases", "n-0")]
            assert len(n0) == 2  # the ones due at 20 and 30 were skipped, not queued
            assert stats.lease_renewals == 5
            nursery.cancel_scope.cancel()
