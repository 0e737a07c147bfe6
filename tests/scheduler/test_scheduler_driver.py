"""The scheduler driver on the in-process server with simulated nodes: resources, taints and
tolerations, node selectors, FailedScheduling/Scheduled events, pods moving back when nodes
appear or room is freed, and no overcommit under a burst of concurrent binds.

The server runs its own default scheduler (registry), so these tests give their pods their own
`schedulerName` and run a second `Scheduler` for it; the last test checks the server's."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from api.apiharness import Harness
from sim.simharness import ADMIN, api_of, sim_api_server, until, until_async

from orchestrator.controllers.runtime.client import EVENTS, PODS
from orchestrator.controllers.runtime.inprocess import InProcessClient
from orchestrator.metrics import Registry
from orchestrator.scheduler.quantity import parse_cpu_milli
from orchestrator.scheduler.scheduler import Scheduler
from orchestrator.security.authn import User
from orchestrator.testing.nodes import SimulatedCluster, SimulatedNode

Obj = dict[str, Any]
NAME = "test-scheduler"
SCHEDULER_USER = User("system:kube-scheduler", ("system:authenticated",))


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    async with sim_api_server() as harness:
        yield harness


def pod(
    name: str,
    cpu: str = "100m",
    *,
    scheduler: str = NAME,
    node_selector: dict[str, str] | None = None,
    tolerations: list[Obj] | None = None,
) -> Obj:
    spec: Obj = {
        "schedulerName": scheduler,
        "containers": [
            {"name": "c", "image": "app:1", "resources": {"requests": {"cpu": cpu}}},
        ],
    }
    if node_selector:
        spec["nodeSelector"] = node_selector
    if tolerations:
        spec["tolerations"] = tolerations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


@asynccontextmanager
async def scheduling(h: Harness, **options: Any) -> AsyncIterator[Scheduler]:
    client = InProcessClient(api_of(h), SCHEDULER_USER)
    sched = Scheduler(client, scheduler_name=NAME, metrics=Registry(), **options)
    async with trio.open_nursery() as nursery:
        await nursery.start(sched.run)
        yield sched
        nursery.cancel_scope.cancel()


async def node_of(admin: InProcessClient, name: str) -> str | None:
    got = await admin.get(PODS, name, "default")
    return (got.get("spec") or {}).get("nodeName")


async def events_for(admin: InProcessClient, name: str) -> list[Obj]:
    listed = await admin.list(EVENTS, "default")
    return [e for e in listed["items"] if e["involvedObject"].get("name") == name]


def bound(admin: InProcessClient, name: str) -> Callable[[], Any]:
    async def check() -> bool:
        return await node_of(admin, name) is not None

    return check


async def test_binds_respecting_resources_with_events(h: Harness) -> None:
    api = api_of(h)
    admin = InProcessClient(api, ADMIN)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(SimulatedCluster(api, 2, prefix="r-", cpu="2").run)
            async with scheduling(h) as sched:
                for i in range(4):
                    await admin.create(PODS, pod(f"p{i}", "1"), "default")
                await admin.create(PODS, pod("huge", "8"), "default")
                for i in range(4):
                    await until_async(bound(admin, f"p{i}"))
                placed = [await node_of(admin, f"p{i}") for i in range(4)]
                assert sorted(placed) == ["r-0", "r-0", "r-1", "r-1"]

                async def failed() -> list[Obj]:
                    return [
                        e
                        for e in await events_for(admin, "huge")
                        if e["reason"] == "FailedScheduling"
                    ]

                await until_async(failed)
                event = (await failed())[0]
                assert event["type"] == "Warning"
                assert "Insufficient cpu" in event["message"]
                assert event["message"].startswith("0/")
                huge = await admin.get(PODS, "huge", "default")
                assert huge["spec"].get("nodeName") is None
                cond = next(c for c in huge["status"]["conditions"] if c["type"] == "PodScheduled")
                assert cond["status"] == "False"
                assert cond["reason"] == "Unschedulable"

                async def scheduled_event() -> list[Obj]:
                    return [e for e in await events_for(admin, "p0") if e["reason"] == "Scheduled"]

                await until_async(scheduled_event)
                msg = (await scheduled_event())[0]["message"]
                assert msg == f"Successfully assigned default/p0 to {placed[0]}"

                # Pods reach Running on the simulated nodes.
                async def running() -> bool:
                    got = await admin.get(PODS, "p0", "default")
                    return bool(got.get("status", {}).get("phase") == "Running")

                await until_async(running)
                stats = sched.statistics()
                assert stats.scheduled == 4
                assert stats.unschedulable >= 1
                assert stats.bind_errors == 0

                # Deleting a bound pod frees room; but "huge" still fits nowhere, and a node
                # that appears with room takes it.
                await admin.delete(PODS, "p0", "default")
                await nursery.start(SimulatedNode(api, "big", cpu="16").run)
                await until_async(bound(admin, "huge"))
                assert await node_of(admin, "huge") == "big"
            nursery.cancel_scope.cancel()


async def test_taints_tolerations_and_node_selector(h: Harness) -> None:
    api = api_of(h)
    admin = InProcessClient(api, ADMIN)
    taint = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(
                SimulatedNode(api, "tainted", labels={"kind": "gpu"}, taints=[taint]).run
            )
            await nursery.start(SimulatedNode(api, "plain", labels={"disk": "ssd"}).run)
            async with scheduling(h):
                toleration = {"key": "dedicated", "operator": "Equal", "value": "gpu"}
                for i in range(6):
                    await admin.create(PODS, pod(f"any{i}"), "default")
                await admin.create(PODS, pod("ssd", node_selector={"disk": "ssd"}), "default")
                await admin.create(
                    PODS,
                    pod("gpu", node_selector={"kind": "gpu"}, tolerations=[toleration]),
                    "default",
                )
                await admin.create(PODS, pod("nogpu", node_selector={"kind": "gpu"}), "default")
                for name in ["ssd", "gpu", *(f"any{i}" for i in range(6))]:
                    await until_async(bound(admin, name))
                assert await node_of(admin, "ssd") == "plain"
                assert await node_of(admin, "gpu") == "tainted"
                for i in range(6):  # untolerated taint: never on "tainted"
                    assert await node_of(admin, f"any{i}") == "plain"

                async def failed() -> list[Obj]:
                    return [
                        e
                        for e in await events_for(admin, "nogpu")
                        if e["reason"] == "FailedScheduling"
                    ]

                await until_async(failed)
                message = (await failed())[0]["message"]
                assert "untolerated taint {dedicated: gpu}" in message
                assert "didn't match Pod's node affinity/selector" in message
                assert await node_of(admin, "nogpu") is None
            nursery.cancel_scope.cancel()


async def test_burst_never_overcommits(h: Harness) -> None:
    api = api_of(h)
    admin = InProcessClient(api, ADMIN)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(
                SimulatedCluster(api, 3, prefix="small-", cpu="2", memory="4Gi", pods=110).run
            )
            async with scheduling(h, parallel_binds=16) as sched:

                async def create(i: int) -> None:
                    await admin.create(PODS, pod(f"b{i}", "300m"), "default")

                async with trio.open_nursery() as burst:
                    for i in range(200):
                        burst.start_soon(create, i)
                # 2000m / 300m = 6 pods per node, 18 in all.
                await until(lambda: sched.statistics().scheduled == 18)
                await until(lambda: sched.statistics().pending_unschedulable == 200 - 18)
                await trio.sleep(0.3)  # any extra bind would land now
                listed = await admin.list(PODS, "default")
                per_node: dict[str, int] = {}
                for p in listed["items"]:
                    node = p["spec"].get("nodeName")
                    if node:
                        cpu = parse_cpu_milli(
                            p["spec"]["containers"][0]["resources"]["requests"]["cpu"]
                        )
                        per_node[node] = per_node.get(node, 0) + cpu
                assert sum(v // 300 for v in per_node.values()) == 18
                assert all(v <= 2000 for v in per_node.values()), per_node
                assert sched.statistics().bind_errors == 0
            nursery.cancel_scope.cancel()


async def test_server_runs_the_default_scheduler(h: Harness) -> None:
    api = api_of(h)
    admin = InProcessClient(api, ADMIN)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(SimulatedNode(api, "solo").run)
            body = pod("plain-pod", scheduler="default-scheduler")
            await admin.create(PODS, body, "default")
            await until_async(bound(admin, "plain-pod"))
            assert await node_of(admin, "plain-pod") == "solo"
            nursery.cancel_scope.cancel()
