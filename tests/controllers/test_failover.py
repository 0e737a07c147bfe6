"""Leader failover on a 3-server cluster of real processes: the controllers move to the new
leader and nothing is done twice — every pod the Deployment needs is created exactly once,
across a kill -9 of the leader in the middle of the work."""

from __future__ import annotations

import json
import ssl
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from api.apiharness import read_kubeconfig
from cluster import Cluster

pytestmark = pytest.mark.slow

DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"
PODS = "/api/v1/namespaces/default/pods"


def deployment(replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c", "image": "nginx:1.26"}]},
            },
        },
    }


async def master_status(client: httpx.AsyncClient, url: str) -> float | None:
    try:
        text = (await client.get(url + "/metrics")).text
    except httpx.TransportError:
        return None
    for line in text.splitlines():
        if line.startswith("leader_election_master_status"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_controllers_follow_the_leader_and_create_each_pod_once(tmp_path: Path) -> None:
    with trio.fail_after(120), Cluster(tmp_path, 3, tick_ms=50) as cluster:
        cluster.start()
        leader = await cluster.wait_leader()
        for i in range(3):
            await cluster.wait_api(i)
        _, token, ca = read_kubeconfig(cluster.servers[0].kubeconfig)
        urls = [f"https://127.0.0.1:{s.api_port}" for s in cluster.servers]
        watcher_at = (leader + 1) % 3  # a server that stays up
        verify = ssl.create_default_context(cadata=ca.decode())
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(verify=verify, headers=headers, timeout=10) as client:

            async def poll(fn: Any, what: str, within: float = 60.0) -> Any:
                with trio.fail_after(within):
                    while True:
                        try:
                            value = await fn()
                        except httpx.TransportError:
                            value = None
                        if value:
                            return value
                        await trio.sleep(0.05)

            async def ready() -> bool:
                r = await client.get(urls[watcher_at] + "/api/v1/namespaces/default")
                return r.status_code == 200

            await poll(ready, "the default namespace")
            start = (await client.get(urls[watcher_at] + PODS)).json()["metadata"][
                "resourceVersion"
            ]
            added: dict[str, int] = {}

            async def count_pods(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
                """Every pod ADDED from the start, through a server that is never killed."""
                params = {"watch": "true", "resourceVersion": start, "labelSelector": "app=web"}
                async with client.stream(
                    "GET", urls[watcher_at] + PODS, params=params, timeout=None
                ) as stream:
                    task_status.started()
                    async for line in stream.aiter_lines():
                        event = json.loads(line)
                        if event["type"] == "ADDED":
                            uid = event["object"]["metadata"]["uid"]
                            added[uid] = added.get(uid, 0) + 1

            async with trio.open_nursery() as nursery:
                await nursery.start(count_pods)
                assert await poll(lambda: master_status(client, urls[leader]), "metrics") == 1.0
                r = await client.post(urls[watcher_at] + DEPLOYMENTS, json=deployment(6))
                assert r.status_code == 201, r.text

                async def pods_are(n: int) -> bool:
                    items = (await client.get(urls[watcher_at] + PODS)).json()["items"]
                    return len(items) == n and len(added) == n

                await poll(lambda: pods_are(6), "6 pods")
                # Scale up and kill the leader while its controllers are at work.
                r = await client.patch(
                    urls[watcher_at] + DEPLOYMENTS + "/web",
                    json={"spec": {"replicas": 20}},
                    headers={"Content-Type": "application/merge-patch+json"},
                )
                assert r.status_code == 200, r.text
                cluster.kill(leader)
                new = await cluster.wait_leader(exclude=[leader], within=30)
                assert await poll(lambda: master_status(client, urls[new]), "new master") == 1.0
                await poll(lambda: pods_are(20), "20 pods")

                async def settled() -> bool:
                    dep = (await client.get(urls[watcher_at] + DEPLOYMENTS + "/web")).json()
                    st = dep.get("status") or {}
                    return (
                        st.get("observedGeneration") == dep["metadata"]["generation"]
                        and st.get("replicas") == 20
                    )

                await poll(settled, "deployment status")
                # The old leader comes back as a follower: it runs no controllers.
                cluster.restart(leader)
                await cluster.wait_ready(leader)
                await cluster.wait_api(leader)

                async def old_status() -> tuple[float] | None:
                    value = await master_status(client, urls[leader])
                    return None if value is None else (value,)

                assert await poll(old_status, "the old leader's metrics") == (0.0,)
                rs = (
                    await client.get(
                        urls[watcher_at] + "/apis/apps/v1/namespaces/default/replicasets"
                    )
                ).json()["items"]
                assert len(rs) == 1
                assert await pods_are(20)
                # Exactly 20 pods were ever created: none twice, none created and deleted.
                assert len(added) == 20
                assert set(added.values()) == {1}
                nursery.cancel_scope.cancel()
