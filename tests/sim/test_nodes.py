"""Simulated nodes on the in-process server: registration, Leases, pods marked Running and
Ready, start delays, finishing deletions, partitions, and a cluster sharing one pod watch."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
from api.apiharness import Harness
from sim.simharness import ADMIN, api_of, sim_api_server, until, until_async

from orchestrator.controllers.runtime.client import NODES, PODS
from orchestrator.controllers.runtime.inprocess import InProcessClient
from orchestrator.kube.errors import ApiError
from orchestrator.testing.nodes import (
    KUBELET_VERSION,
    LEASES,
    NODE_LEASE_NAMESPACE,
    RUNTIME_VERSION,
    SimulatedCluster,
    SimulatedNode,
    node_client,
)

Obj = dict[str, Any]


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    async with sim_api_server() as harness:
        yield harness


def pod(name: str, node: str | None = None, *, containers: int = 1) -> Obj:
    spec: Obj = {
        "containers": [
            {"name": f"c{i}", "image": f"registry.example/app:{i}"} for i in range(containers)
        ],
    }
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


async def phase(admin: InProcessClient, name: str) -> str | None:
    try:
        got = await admin.get(PODS, name, "default")
    except ApiError as exc:
        if exc.code == 404:
            return None
        raise
    return str((got.get("status") or {}).get("phase") or "")


async def test_node_registers_heartbeats_and_runs_pods(h: Harness) -> None:
    api = api_of(h)
    admin = InProcessClient(api, ADMIN)
    node = SimulatedNode(
        api, "sim-a", cpu="2", memory="4Gi", pods=50, labels={"zone": "z1"}, renew_interval=0.1
    )
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run)
            got = await admin.get(NODES, "sim-a")
            status = got["status"]
            assert status["capacity"] == {"cpu": "2", "memory": "4Gi", "pods": "50"}
            assert status["allocatable"] == status["capacity"]
            ready = next(c for c in status["conditions"] if c["type"] == "Ready")
            assert ready["status"] == "True"
            assert ready["lastHeartbeatTime"]
            assert status["addresses"][0]["type"] == "InternalIP"
            assert status["addresses"][0]["address"].startswith("10.")
            assert status["nodeInfo"]["kubeletVersion"] == KUBELET_VERSION
            assert status["nodeInfo"]["containerRuntimeVersion"] == RUNTIME_VERSION
            assert got["metadata"]["labels"]["zone"] == "z1"
            assert got["metadata"]["labels"]["kubernetes.io/hostname"] == "sim-a"

            lease = await admin.get(LEASES, "sim-a", NODE_LEASE_NAMESPACE)
            assert lease["spec"]["holderIdentity"] == "sim-a"
            assert lease["spec"]["leaseDurationSeconds"] == 40
            first = lease["spec"]["renewTime"]
            assert first.endswith("Z")
            assert "." in first

            async def renewed() -> bool:
                again = await admin.get(LEASES, "sim-a", NODE_LEASE_NAMESPACE)
                return bool(again["spec"]["renewTime"] != first)

            await until_async(renewed)

            await admin.create(PODS, pod("p1", "sim-a", containers=2), "default")
            await admin.create(PODS, pod("other", "elsewhere"), "default")
            await until_async(lambda: _is(admin, "p1", "Running"))
            p1 = await admin.get(PODS, "p1", "default")
            st = p1["status"]
            assert st["podIP"].startswith("10.")
            assert st["podIPs"] == [{"ip": st["podIP"]}]
            assert st["hostIP"] == status["addresses"][0]["address"]
            assert st["startTime"]
            assert {c["type"]: c["status"] for c in st["conditions"]} == {
                "PodScheduled": "True",
                "Initialized": "True",
                "ContainersReady": "True",
                "Ready": "True",
            }
            assert [c["name"] for c in st["containerStatuses"]] == ["c0", "c1"]
            for cs in st["containerStatuses"]:
                assert cs["ready"]
                assert cs["started"]
                assert cs["restartCount"] == 0
                assert cs["state"]["running"]["startedAt"]
                assert cs["image"].startswith("registry.example/app:")
                assert "@sha256:" in cs["imageID"]
                assert cs["containerID"].startswith("simulated://")
            # Written as the node itself, through the status subresource.
            managers = {m["manager"] for m in p1["metadata"].get("managedFields") or []}
            assert "simulated-kubelet" in managers
            assert await phase(admin, "other") in ("", "Pending")  # not ours
            nursery.cancel_scope.cancel()


async def _is(admin: InProcessClient, name: str, wanted: str | None) -> bool:
    return await phase(admin, name) == wanted


async def test_node_identity_is_restricted(h: Harness) -> None:
    api = api_of(h)
    admin = InProcessClient(api, ADMIN)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(SimulatedNode(api, "sim-b").run)
            await admin.create(PODS, pod("x", "somewhere-else"), "default")
            intruder = node_client(api, "sim-b")
            with pytest.raises(ApiError) as err:
                await intruder.patch(
                    PODS, "x", {"status": {"phase": "Running"}}, "default", subresource="status"
                )
            assert err.value.code == 403
            nursery.cancel_scope.cancel()


async def test_start_delay_and_deletion(h: Harness) -> None:
    api = api_of(h)
    admin = InProcessClient(api, ADMIN)
    node = SimulatedNode(api, "sim-c", start_delay=0.5)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run)
            t0 = trio.current_time()
            await admin.create(PODS, pod("slow", "sim-c"), "default")
            await until_async(lambda: _is(admin, "slow", "Running"))
            assert trio.current_time() - t0 >= 0.5
            # A graceful delete (30 s by default) sets deletionTimestamp; the node finishes it.
            reply = await admin.delete(PODS, "slow", "default")
            assert reply["metadata"].get("deletionTimestamp")
            await until_async(lambda: _is(admin, "slow", None))
            assert node.client is not None
            nursery.cancel_scope.cancel()


async def test_deletion_honours_pod_grace_when_asked(h: Harness) -> None:
    api = api_of(h)
    admin = InProcessClient(api, ADMIN)
    node = SimulatedNode(api, "sim-g", grace_period=None)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run)
            await admin.create(PODS, pod("g", "sim-g"), "default")
            await until_async(lambda: _is(admin, "g", "Running"))
            t0 = trio.current_time()
            await admin.delete(PODS, "g", "default", grace_period_seconds=1)
            assert await phase(admin, "g") == "Running"  # still terminating
            await until_async(lambda: _is(admin, "g", None))
            assert trio.current_time() - t0 >= 0.9
            nursery.cancel_scope.cancel()


async def test_partitioned_node_stops_heartbeats_and_comes_back(h: Harness) -> None:
    api = api_of(h)
    admin = InProcessClient(api, ADMIN)
    node = SimulatedNode(api, "sim-d", renew_interval=0.05)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run)
            await admin.create(PODS, pod("before", "sim-d"), "default")
            await until_async(lambda: _is(admin, "before", "Running"))

            node.stop_heartbeats()
            await trio.sleep(0.1)  # let a renewal in flight land
            frozen = (await admin.get(LEASES, "sim-d", NODE_LEASE_NAMESPACE))["spec"]
            await admin.create(PODS, pod("during", "sim-d"), "default")
            await trio.sleep(0.4)  # several renew intervals: nothing may be written
            lease = (await admin.get(LEASES, "sim-d", NODE_LEASE_NAMESPACE))["spec"]
            assert lease["renewTime"] == frozen["renewTime"]
            assert await phase(admin, "during") in ("", "Pending")
            assert await phase(admin, "before") == "Running"  # keeps running its pods

            node.resume_heartbeats()
            await until_async(lambda: _is(admin, "during", "Running"))
            lease = (await admin.get(LEASES, "sim-d", NODE_LEASE_NAMESPACE))["spec"]
            assert lease["renewTime"] != frozen["renewTime"]
            nursery.cancel_scope.cancel()


async def test_restarted_node_reposts_status(h: Harness) -> None:
    api = api_of(h)
    admin = InProcessClient(api, ADMIN)
    with trio.fail_after(30):
        for _ in range(2):  # the second run finds its Node and Lease already there
            async with trio.open_nursery() as nursery:
                await nursery.start(SimulatedNode(api, "sim-e").run)
                nursery.cancel_scope.cancel()
        got = await admin.get(NODES, "sim-e")
        assert got["status"]["nodeInfo"]["kubeletVersion"] == KUBELET_VERSION


async def test_cluster_runs_many_nodes_on_one_watch(h: Harness) -> None:
    api = api_of(h)
    admin = InProcessClient(api, ADMIN)
    running: list[str] = []
    cluster = SimulatedCluster(
        api,
        4,
        prefix="w-",
        workers=8,
        on_pod_running=lambda p, t: running.append(p["metadata"]["name"]),
    )
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(cluster.run)
            nodes = await admin.list(NODES)
            names = sorted(n["metadata"]["name"] for n in nodes["items"])
            assert [n for n in names if n.startswith("w-")] == ["w-0", "w-1", "w-2", "w-3"]
            leases = await admin.list(LEASES, NODE_LEASE_NAMESPACE)
            assert {item["metadata"]["name"] for item in leases["items"]} >= set(names)
            addresses = {
                n["metadata"]["name"]: n["status"]["addresses"][0]["address"]
                for n in nodes["items"]
            }
            assert len(set(addresses.values())) == len(addresses)

            cluster["w-3"].stop_heartbeats()
            for i in range(40):
                await admin.create(PODS, pod(f"p{i}", f"w-{i % 4}"), "default")
            await until(lambda: len(running) == 30)
            await trio.sleep(0.2)
            assert len(running) == 30  # w-3 is partitioned
            assert cluster.statistics().parked == 10
            cluster["w-3"].resume_heartbeats()
            await until(lambda: len(running) == 40)

            listed = await admin.list(PODS, "default")
            ips = set()
            for p in listed["items"]:
                assert p["status"]["phase"] == "Running"
                assert p["status"]["hostIP"] == addresses[p["spec"]["nodeName"]]
                ips.add(p["status"]["podIP"])
            assert len(ips) == 40
            stats = cluster.statistics()
            assert stats.started == 40
            assert stats.pods == 40
            assert stats.errors == 0
            assert stats.nodes == 4

            for i in range(40):
                await admin.delete(PODS, f"p{i}", "default")
            await until(lambda: cluster.statistics().pods == 0)
            assert cluster.statistics().deleted == 40
            nursery.cancel_scope.cancel()
