"""Linearizable reads on every server of a real 3-process cluster at once.

Pins down a bug found by benches/api_bench.py (now fixed): each node numbered its ReadIndex
contexts 1, 2, 3, ... and the leader keeps pending reads keyed by context, so a follower's
forwarded read and the leader's own (or another follower's) with the same number overwrote
each other; the overwritten read was never answered and failed after the 5 s quorum timeout
("read: no quorum answered within 5s", a 503 from the Kubernetes API).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from cluster import Cluster, admin_tls

from orchestrator.store.client import StoreClient

pytestmark = pytest.mark.slow


def test_concurrent_linearizable_reads_on_every_server(tmp_path: Path) -> None:
    async def main() -> None:
        with Cluster(tmp_path, size=3, tick_ms=100, log_level="warning", api=False) as cluster:
            cluster.start()
            await cluster.wait_leader(within=30)
            async with StoreClient(cluster.endpoints, tls=admin_tls()) as kv:
                with trio.fail_after(30):
                    await kv.put("/k", b"v")
                    for i in range(3):
                        await cluster.wait_caught_up(i)
                # Well under the 5 s quorum timeout: a lost read shows as a timeout here.
                with trio.fail_after(4):
                    got: list[bytes | None] = []

                    async def read(ep: str) -> None:
                        raw = await kv.call_once(ep, "get", "/k", True)
                        got.append(None if raw is None else bytes(raw))

                    async with trio.open_nursery() as nursery:
                        for _ in range(20):
                            for ep in cluster.endpoints:
                                nursery.start_soon(read, ep)
            assert got == [b"v"] * 60

    trio.run(main)
