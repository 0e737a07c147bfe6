"""An edge site of separate processes on loopback: 3 servers (no embedded agents) and 2
`orchestrator agent` processes on the simulated runtime, joined with a K10 token.

Power cuts (SIGKILL) one at a time: a follower, then the leader — the API (through a server that
stays up) and the controllers keep working; then an agent — after the servers'
`--node-monitor-grace-period` (3 s here) plus the pods' `tolerationSeconds` (2 s) its pods are
deleted and recreated on the other agent and the Deployment is available again. Bringing
everything back converges: the nodes are Ready, exactly the Deployment's pods exist, and a watch
from the start (through the server that is never killed) saw no pod created twice and none
created beyond the replacements of the evicted ones.

The server the agents joined through is powered off (`test_agents_fail_over_...`): the agents
learnt every server from `default/kubernetes`, so their Leases go on through another one — the
nodes stay Ready and their pods Running past the grace period — and an agent restarted with
only the dead server as `--server` starts from the servers it persisted.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import trio
from agentproc import AgentProc
from api.apiharness import read_kubeconfig
from cluster import Cluster

from orchestrator.client.endpoints import urls_from_endpoints

pytestmark = pytest.mark.slow

T = TypeVar("T")

GRACE = "3s"  # --node-monitor-grace-period of the servers
TOLERATION_SECONDS = 2  # the pods' tolerationSeconds for the unreachable taint
DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"
PODS = "/api/v1/namespaces/default/pods"
NODES = "/api/v1/nodes"
AGENTS = ("edge-1", "edge-2")


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
                "spec": {
                    "containers": [{"name": "c", "image": "nginx:1.26"}],
                    "tolerations": [
                        {
                            "key": "node.kubernetes.io/unreachable",
                            "operator": "Exists",
                            "effect": "NoExecute",
                            "tolerationSeconds": TOLERATION_SECONDS,
                        }
                    ],
                },
            },
        },
    }


def running(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return (
        status.get("phase") == "Running" and ready and not pod["metadata"].get("deletionTimestamp")
    )


def node_ready(node: dict[str, Any]) -> str:
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return str(c.get("status"))
    return "None"


async def test_site_survives_power_cuts_and_converges(tmp_path: Path) -> None:
    cluster = Cluster(
        tmp_path / "servers",
        3,
        tick_ms=50,
        api=True,
        agent=False,
        extra_args=["--node-monitor-grace-period", GRACE],
    )
    with trio.fail_after(120), cluster, contextlib.ExitStack() as stack:
        cluster.start()
        leader = await cluster.wait_leader()
        for i in range(3):
            await cluster.wait_api(i)
        home = (leader + 1) % 3  # never killed: the agents, the watch and our writes use it
        other = (leader + 2) % 3  # the follower powered off first
        _, token, ca = read_kubeconfig(cluster.servers[home].kubeconfig)
        urls = [f"https://127.0.0.1:{s.api_port}" for s in cluster.servers]
        api = urls[home]
        verify = ssl.create_default_context(cadata=ca.decode())
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(verify=verify, headers=headers, timeout=10) as client:

            async def poll(fn: Callable[[], Awaitable[T | None]], what: str, within: float) -> T:
                with trio.move_on_after(within):
                    while True:
                        cluster.check_alive()
                        for a in agents:
                            assert a.running or a in dead, f"agent died\n{a.log_tail()}"
                        try:
                            value = await fn()
                        except httpx.TransportError:
                            value = None
                        if value:
                            return value
                        await trio.sleep(0.1)
                raise AssertionError(f"timed out after {within} s waiting for {what}")

            async def get(path: str, url: str = api) -> Any:
                r = await client.get(url + path)
                r.raise_for_status()
                return r.json()

            async def pods() -> list[dict[str, Any]]:
                items: list[dict[str, Any]] = (await get(PODS + "?labelSelector=app%3Dweb"))[
                    "items"
                ]
                return items

            async def nodes_ready(names: tuple[str, ...]) -> dict[str, str] | None:
                state = {n["metadata"]["name"]: node_ready(n) for n in (await get(NODES))["items"]}
                return state if all(state.get(n) == "True" for n in names) else None

            async def available(n: int, url: str = api) -> dict[str, Any] | None:
                dep = await get(DEPLOYMENTS + "/web", url)
                st = dep.get("status") or {}
                ok = (
                    st.get("observedGeneration") == dep["metadata"]["generation"]
                    and st.get("replicas") == n
                    and st.get("availableReplicas") == n
                    and st.get("updatedReplicas") == n
                )
                return st if ok else None

            async def running_pods(n: int) -> list[dict[str, Any]] | None:
                items = await pods()
                live = [p for p in items if running(p)]
                return live if len(items) == n and len(live) == n else None

            # ---- two agents join with a K10 token from the admin API
            agents: list[AgentProc] = []
            dead: list[AgentProc] = []

            async def api_up() -> bool:
                return (await client.get(api + "/api/v1/namespaces/default")).status_code == 200

            await poll(api_up, "the API", 30)
            r = await client.post(
                api + "/orchestrator/v1/tokens", json={"ttlSeconds": 600, "description": "site"}
            )
            assert r.status_code in (200, 201), r.text
            join_token = r.json()["token"]
            assert join_token.startswith("K10")
            for k, name in enumerate(AGENTS):
                agent = AgentProc(tmp_path / f"agent-{k + 1}", name, api, join_token)
                agents.append(stack.enter_context(agent))
                agent.start()
            await poll(lambda: nodes_ready(AGENTS), "both agents' nodes Ready", 30)
            nodes = {n["metadata"]["name"]: n for n in (await get(NODES))["items"]}
            assert set(nodes) == set(AGENTS)  # the servers run no agents of their own
            for n in nodes.values():
                assert n["metadata"]["labels"]["orchestrator.dev/runtime"] == "simulated"

            # ---- every pod ever created, from here on, through the server never killed
            start = (await get(PODS))["metadata"]["resourceVersion"]
            added: dict[str, int] = {}

            async def count_pods(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
                params = {"watch": "true", "resourceVersion": start, "labelSelector": "app=web"}
                async with client.stream("GET", api + PODS, params=params, timeout=None) as s:
                    task_status.started()
                    async for line in s.aiter_lines():
                        event = json.loads(line)
                        if event["type"] == "ADDED":
                            uid = event["object"]["metadata"]["uid"]
                            added[uid] = added.get(uid, 0) + 1

            async with trio.open_nursery() as nursery:
                await nursery.start(count_pods)
                r = await client.post(api + DEPLOYMENTS, json=deployment(3))
                assert r.status_code == 201, r.text
                live = await poll(lambda: running_pods(3), "3 Running pods", 30)
                assert {p["spec"]["nodeName"] for p in live} == set(AGENTS)  # spread over both

                # ---- power off a follower: writes and controllers go on (scale 3 -> 4)
                cluster.kill(other)
                r = await client.patch(
                    api + DEPLOYMENTS + "/web",
                    json={"spec": {"replicas": 4}},
                    headers={"Content-Type": "application/merge-patch+json"},
                )
                assert r.status_code == 200, r.text
                await poll(lambda: running_pods(4), "4 Running pods without a follower", 30)
                await poll(lambda: available(4), "Deployment 4/4 without a follower", 30)
                cluster.restart(other)
                await cluster.wait_ready(other)
                await cluster.wait_caught_up(other)

                # ---- power off the leader: a new one is elected, its controllers take over
                cluster.kill(leader)
                new_leader = await cluster.wait_leader(exclude=[leader], within=20)
                assert new_leader in (home, other)
                r = await client.post(
                    api + "/api/v1/namespaces/default/configmaps",
                    json={"metadata": {"name": "after-failover"}, "data": {"k": "v"}},
                )
                assert r.status_code == 201, r.text

                # ---- power off an agent: its pods move to the other one after grace + tolerance
                by_node: dict[str, list[str]] = {name: [] for name in AGENTS}
                for p in await pods():
                    by_node[p["spec"]["nodeName"]].append(p["metadata"]["uid"])
                victim = max(AGENTS, key=lambda n: len(by_node[n]))
                survivor = next(n for n in AGENTS if n != victim)
                evicted = set(by_node[victim])
                assert evicted
                gone = agents[AGENTS.index(victim)]
                dead.append(gone)
                gone.kill()
                t0 = trio.current_time()

                async def moved() -> list[dict[str, Any]] | None:
                    live = await running_pods(4)
                    if live is None or {p["spec"]["nodeName"] for p in live} != {survivor}:
                        return None
                    return live

                live = await poll(moved, f"the pods of {victim} recreated on {survivor}", 40)
                moved_after = trio.current_time() - t0
                assert not evicted & {p["metadata"]["uid"] for p in live}
                await poll(lambda: available(4), "Deployment 4/4 after the agent died", 20)
                node = await get(f"{NODES}/{victim}")
                assert node_ready(node) == "Unknown"
                taints = {t["key"] for t in node["spec"].get("taints") or []}
                assert "node.kubernetes.io/unreachable" in taints
                # not before grace + tolerationSeconds, less the lease renewal interval (the
                # silence began at the last renewal before the kill) and the 1 s resolution of
                # the taint's timeAdded
                assert moved_after >= 3 + TOLERATION_SECONDS - 1 - 1, moved_after

                # ---- bring everything back: converges, nothing created twice
                cluster.restart(leader)
                dead.remove(gone)
                gone.start()
                await cluster.wait_ready(leader)
                await poll(lambda: nodes_ready(AGENTS), "both nodes Ready again", 30)
                for i in range(3):
                    await cluster.wait_caught_up(i)
                await poll(lambda: available(4), "Deployment 4/4 after the restarts", 20)
                await trio.sleep(2.0)  # time for any wrongly duplicated pod to show up
                final = await poll(lambda: running_pods(4), "4 Running pods at the end", 20)
                uids = {p["metadata"]["uid"] for p in final}
                assert len(uids) == 4
                # every pod was ADDED once: the 4 the Deployment asked for plus one replacement
                # per evicted pod, no more
                assert set(added.values()) == {1}, added
                assert len(added) == 4 + len(evicted), (len(added), len(evicted))
                assert uids <= set(added)
                # the restarted agent's node is schedulable again: its taints are gone
                node = await get(f"{NODES}/{victim}")
                assert not [
                    t
                    for t in node["spec"].get("taints") or []
                    if t["key"].startswith("node.kubernetes.io/")
                ]
                # every server serves the same state (the API works through each of them)
                for url in urls:
                    await poll(lambda u=url: available(4, u), f"Deployment 4/4 via {url}", 20)
                nursery.cancel_scope.cancel()


def renewed_at(lease: dict[str, Any]) -> float:
    """A Lease's renewTime as a Unix time."""
    text = lease["spec"]["renewTime"]
    stamp = dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC)
    return stamp.timestamp()


async def test_agents_fail_over_when_the_server_they_joined_through_dies(tmp_path: Path) -> None:
    cluster = Cluster(
        tmp_path / "servers",
        3,
        tick_ms=50,
        api=True,
        agent=False,
        extra_args=["--node-monitor-grace-period", GRACE],
    )
    with trio.fail_after(150), cluster, contextlib.ExitStack() as stack:
        cluster.start()
        leader = await cluster.wait_leader()
        for i in range(3):
            await cluster.wait_api(i)
        entry = (leader + 1) % 3  # the agents join through it; powered off later
        home = leader  # our own requests (never killed)
        _, token, ca = read_kubeconfig(cluster.servers[home].kubeconfig)
        urls = [f"https://127.0.0.1:{s.api_port}" for s in cluster.servers]
        api = urls[home]
        verify = ssl.create_default_context(cadata=ca.decode())
        headers = {"Authorization": f"Bearer {token}"}
        agents: list[AgentProc] = []
        async with httpx.AsyncClient(verify=verify, headers=headers, timeout=10) as client:

            async def poll(fn: Callable[[], Awaitable[T | None]], what: str, within: float) -> T:
                with trio.move_on_after(within):
                    while True:
                        cluster.check_alive()
                        for a in agents:
                            assert a.running, f"agent died\n{a.log_tail()}"
                        try:
                            value = await fn()
                        except httpx.TransportError:
                            value = None
                        if value:
                            return value
                        await trio.sleep(0.1)
                raise AssertionError(f"timed out after {within} s waiting for {what}")

            async def get(path: str) -> Any:
                r = await client.get(api + path)
                r.raise_for_status()
                return r.json()

            async def api_up() -> bool:
                return (await client.get(api + "/api/v1/namespaces/default")).status_code == 200

            await poll(api_up, "the API", 30)

            # ---- every server publishes its API address in default/kubernetes
            async def published() -> list[str] | None:
                r = await client.get(api + "/api/v1/namespaces/default/endpoints/kubernetes")
                if r.status_code != 200:
                    return None
                found = urls_from_endpoints(r.json())
                return found if sorted(found) == sorted(urls) else None

            await poll(published, "the 3 servers in default/kubernetes", 30)

            # ---- two agents join through `entry` (one also names `home`: --server twice)
            r = await client.post(
                api + "/orchestrator/v1/tokens", json={"ttlSeconds": 600, "description": "site"}
            )
            assert r.status_code in (200, 201), r.text
            join_token = r.json()["token"]
            for k, name in enumerate(AGENTS):
                extra = ["--server", urls[home]] if k == 1 else []
                agent = AgentProc(
                    tmp_path / f"agent-{k + 1}", name, urls[entry], join_token, extra_args=extra
                )
                agents.append(stack.enter_context(agent))
                agent.start()

            async def nodes_ready() -> dict[str, str] | None:
                state = {n["metadata"]["name"]: node_ready(n) for n in (await get(NODES))["items"]}
                return state if all(state.get(n) == "True" for n in AGENTS) else None

            await poll(nodes_ready, "both agents' nodes Ready", 30)

            async def learnt(agent: AgentProc) -> list[str] | None:
                path = agent.data_dir / "apiservers.json"
                try:
                    servers = json.loads(path.read_text())["servers"]
                except (OSError, ValueError, KeyError):
                    return None
                return servers if sorted(servers) == sorted(urls) else None

            for a in agents:
                await poll(lambda a=a: learnt(a), f"{a.node_name} to persist 3 servers", 40)

            # ---- pods on both agents (the default 300 s tolerations: nothing moves on its own)
            body = deployment(4)
            del body["spec"]["template"]["spec"]["tolerations"]
            r = await client.post(api + DEPLOYMENTS, json=body)
            assert r.status_code == 201, r.text

            async def running_pods() -> list[dict[str, Any]] | None:
                items = (await get(PODS + "?labelSelector=app%3Dweb"))["items"]
                live = [p for p in items if running(p)]
                return live if len(items) == 4 and len(live) == 4 else None

            live = await poll(running_pods, "4 Running pods", 30)
            assert {p["spec"]["nodeName"] for p in live} == set(AGENTS)
            uids = {p["metadata"]["uid"] for p in live}

            async def leases() -> dict[str, float]:
                return {
                    name: renewed_at(
                        await get(
                            f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
                        )
                    )
                    for name in AGENTS
                }

            # ---- power off the server both agents joined through
            cluster.kill(entry)
            killed_at = time.time()
            # Past grace (3 s) plus a margin: without failover the nodes would be Unknown.
            with trio.move_on_after(3 + 5):
                while True:
                    cluster.check_alive()
                    state = {
                        n["metadata"]["name"]: node_ready(n) for n in (await get(NODES))["items"]
                    }
                    assert all(state[n] == "True" for n in AGENTS), state
                    await trio.sleep(0.2)
            renewed = await leases()
            assert all(t > killed_at + 3 for t in renewed.values()), (killed_at, renewed)
            live = await poll(running_pods, "the 4 pods still Running", 10)
            assert {p["metadata"]["uid"] for p in live} == uids
            for name in AGENTS:
                node = await get(f"{NODES}/{name}")
                assert not [
                    t for t in node["spec"].get("taints") or [] if "unreachable" in t["key"]
                ]

            # ---- restart an agent whose only --server is the dead one: it uses its list
            first = agents[0]
            assert first.argv().count("--server") == 1
            first.kill()
            first.start()
            restarted_at = time.time()

            async def back() -> bool:
                renewed = await leases()
                return renewed[first.node_name] > restarted_at + 1 and bool(await nodes_ready())

            await poll(back, f"{first.node_name} renewing its Lease after the restart", 30)
            assert "API servers learnt earlier" in first.log_path.read_text()
            live = await poll(running_pods, "the 4 pods Running after the restart", 20)
            assert {p["metadata"]["uid"] for p in live} == uids
