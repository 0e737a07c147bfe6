"""Growing a cluster with `server --join URL --token TOKEN`, as separate processes.

A joining server is added as a learner and promoted by the leader once caught up; a wrong
token is refused with a clear error and the server exits; the grown cluster survives losing
the server it was founded on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from cluster import Cluster, admin_tls

from orchestrator.store.client import StoreClient

pytestmark = pytest.mark.slow


class JoinCluster(Cluster):  # type: ignore[misc]  # tests/ is untyped for mypy
    """Servers added with `join_via` join through that URL with that token."""

    join_via: dict[int, tuple[str, str]]

    def argv(self, i: int) -> list[str]:
        argv: list[str] = super().argv(i)
        via = getattr(self, "join_via", {}).get(i)
        if via is not None:
            at = argv.index("--join") + 1
            argv[at:at] = [via[0], "--token", via[1]]
        return argv


async def _exited(proc: Any) -> bool | None:
    return proc.poll() is not None or None


async def voters(cluster: Cluster, i: int) -> list[int]:
    st: dict[str, Any] | None = await cluster.status(i)
    return [] if st is None else list(st["voters"])


async def test_servers_join_with_the_token_and_are_promoted(tmp_path: Path) -> None:
    with trio.fail_after(90), JoinCluster(tmp_path, 1, tick_ms=50) as cluster:
        cluster.join_via = {}
        cluster.start()
        await cluster.wait_leader()
        token = (cluster.servers[0].data_dir / "token").read_text().strip()
        assert token.startswith("orch-")

        async with StoreClient(cluster.endpoints, tls=admin_tls()) as client:
            await client.put("before", b"1")

        joined = []
        for _ in range(2):
            i = cluster.add_server(start=False)
            cluster.join_via[i] = (cluster.endpoint(0), token)
            cluster.start_server(i)
            joined.append(i)
            nid = cluster.node_id(i)

            async def promoted(nid: int = nid) -> bool | None:
                return nid in await voters(cluster, 0) or None

            await cluster.wait_until(promoted, within=30, what=f"node {nid} promoted")
        assert sorted(await voters(cluster, 0)) == sorted(cluster.node_id(i) for i in (0, *joined))

        # A server with the wrong token derives another CA: the client port's handshake refuses
        # it, and it exits with one line saying how to join instead.
        bad = cluster.add_server(start=False)
        cluster.join_via[bad] = (cluster.endpoint(0), "orch-wrong")
        cluster.start_server(bad)
        proc = cluster.servers[bad].proc
        assert proc is not None
        cluster.servers[bad].expected_exit = True
        await cluster.wait_until(
            lambda: _exited(proc), within=30, what="the refused server to exit"
        )
        assert proc.returncode == 1
        assert "join with --server URL" in cluster.log_text(bad)
        assert cluster.node_id(bad) not in await voters(cluster, 0)

        # The grown cluster no longer needs its founder.
        cluster.kill(0)
        await cluster.wait_leader(exclude=[0])
        async with StoreClient([cluster.endpoint(i) for i in joined], tls=admin_tls()) as client:
            await client.put("after", b"2")
            assert await client.get("before") == b"1"
            assert await client.get("after") == b"2"
