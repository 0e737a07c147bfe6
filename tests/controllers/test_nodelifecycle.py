"""Node lifecycle: toleration matching and eviction delays (pure), the health tracker, and on a
real server with simulated nodes: a node whose Lease stops becomes Ready=Unknown with the
unreachable taints, its pods go after their tolerationSeconds (force-deleted: the node cannot
confirm), others stay, the taints go when the node is back; and a ReplicaSet's pods evicted
from a dead node are recreated on a healthy one. Small periods (grace 1 s, monitor 0.2 s)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from functools import partial
from typing import Any

import pytest
import trio
from ctlharness import Env, controller_server, eventually

from orchestrator.client.resource import NODES, PODS, REPLICASETS
from orchestrator.controllers.gc import garbage_collector
from orchestrator.controllers.nodelifecycle import (
    NOT_READY_TAINT,
    UNREACHABLE_TAINT,
    HealthTracker,
    NodeLifecycleOptions,
    eviction_delay,
    node_lifecycle_controllers,
    tolerates,
    wanted_taint,
)
from orchestrator.controllers.replicaset import replicaset_controller
from orchestrator.controllers.runtime.manager import Component, ControllerContext
from orchestrator.kube.schema.columns import parse_rfc3339
from orchestrator.scheduler.scheduler import Scheduler
from orchestrator.testing.nodes import SimulatedCluster

Obj = dict[str, Any]
NS = "default"
OPTIONS = NodeLifecycleOptions(grace_period=1.0, monitor_period=0.2)
UNREACHABLE = {"key": UNREACHABLE_TAINT, "effect": "NoExecute"}
NOT_READY = {"key": NOT_READY_TAINT, "effect": "NoExecute"}


# ------------------------------------------------------------------------------ pure
def test_toleration_matching() -> None:
    assert tolerates({"operator": "Exists"}, UNREACHABLE)  # empty key + Exists: everything
    assert tolerates({"key": UNREACHABLE_TAINT, "operator": "Exists"}, UNREACHABLE)
    assert not tolerates(
        {"key": UNREACHABLE_TAINT, "operator": "Exists", "effect": "NoSchedule"}, UNREACHABLE
    )
    assert not tolerates({"key": NOT_READY_TAINT, "operator": "Exists"}, UNREACHABLE)
    taint = {"key": "k", "value": "v", "effect": "NoExecute"}
    assert tolerates({"key": "k", "operator": "Equal", "value": "v"}, taint)
    assert tolerates({"key": "k", "value": "v"}, taint)  # Equal is the default operator
    assert not tolerates({"key": "k", "operator": "Equal", "value": "w"}, taint)


def test_eviction_delay() -> None:
    def tol(key: str, seconds: int | None = None) -> Obj:
        t: Obj = {"key": key, "operator": "Exists", "effect": "NoExecute"}
        if seconds is not None:
            t["tolerationSeconds"] = seconds
        return t

    assert eviction_delay([], [UNREACHABLE]) == 0.0
    assert eviction_delay([tol(UNREACHABLE_TAINT, 300)], [UNREACHABLE]) == 300.0
    assert eviction_delay([tol(UNREACHABLE_TAINT)], [UNREACHABLE]) is None
    both = [UNREACHABLE, NOT_READY]
    assert eviction_delay([tol(UNREACHABLE_TAINT, 300), tol(NOT_READY_TAINT, 30)], both) == 30.0
    assert eviction_delay([tol(UNREACHABLE_TAINT, 300)], both) == 0.0  # one not tolerated
    assert eviction_delay([tol(UNREACHABLE_TAINT, -5)], [UNREACHABLE]) == 0.0


def test_health_tracker_and_wanted_taint() -> None:
    t = HealthTracker()
    assert t.observe("n", ("r1", "h1"), 10.0) == 10.0
    assert t.observe("n", ("r1", "h1"), 50.0) == 10.0  # nothing new: probe time stays
    assert t.observe("n", ("r2", "h1"), 60.0) == 60.0  # the lease was renewed
    t.forget("n")
    assert t.observe("n", ("r2", "h1"), 70.0) == 70.0  # seen anew: a fresh grace period

    def node(status: str | None) -> Obj:
        conds = [{"type": "Ready", "status": status}] if status else []
        return {"status": {"conditions": conds}}

    assert wanted_taint(node("True")) is None
    assert wanted_taint(node("False")) == NOT_READY_TAINT
    assert wanted_taint(node("Unknown")) == UNREACHABLE_TAINT
    assert wanted_taint(node(None)) == UNREACHABLE_TAINT


# ------------------------------------------------------------------------------ on a server
def lifecycle_only(ctx: ControllerContext) -> Sequence[Component]:
    return node_lifecycle_controllers(ctx, OPTIONS)


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    async with controller_server(lifecycle_only) as e:
        yield e


def toleration(seconds: int | None) -> Obj:
    t: Obj = {"key": UNREACHABLE_TAINT, "operator": "Exists", "effect": "NoExecute"}
    if seconds is not None:
        t["tolerationSeconds"] = seconds
    return t


async def bound_pod(env: Env, name: str, node: str, tolerations: list[Obj] | None = None) -> Obj:
    spec: Obj = {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}
    if tolerations is not None:
        spec["tolerations"] = tolerations
    return await env.client.create(
        PODS, {"metadata": {"name": name, "namespace": NS}, "spec": spec}
    )


def ready(node: Obj) -> Obj:
    return next(c for c in node["status"]["conditions"] if c["type"] == "Ready")


def lifecycle_taints(node: Obj) -> set[tuple[str, str]]:
    return {
        (t["key"], t["effect"])
        for t in node["spec"].get("taints") or []
        if t["key"] in (UNREACHABLE_TAINT, NOT_READY_TAINT)
    }


async def start_cluster(nursery: trio.Nursery, env: Env) -> SimulatedCluster:
    assert env.server.api is not None
    cluster = SimulatedCluster(env.server.api.api, 2, renew_interval=0.2, workers=4)
    await nursery.start(cluster.run)
    return cluster


async def test_lease_expiry_taints_node_and_evicts_after_toleration(env: Env) -> None:
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            cluster = await start_cluster(nursery, env)
            short = await bound_pod(env, "short", "node-0", [toleration(2)])
            forever = await bound_pod(env, "forever", "node-0", [toleration(None)])
            default = await bound_pod(env, "default", "node-0")  # admission: 300 s
            assert toleration(300) in default["spec"]["tolerations"]
            other = await bound_pod(env, "other", "node-1", [toleration(0)])

            async def running(pod: Obj) -> bool:
                p = await env.client.get(PODS, pod["metadata"]["name"], NS)
                return bool(p["status"].get("phase") == "Running")

            for p in (short, forever, default, other):
                await eventually(partial(running, p))
            cluster["node-0"].stop_heartbeats()

            async def unreachable() -> bool:
                n = await env.client.get(NODES, "node-0")
                return ready(n)["status"] == "Unknown" and lifecycle_taints(n) == {
                    (UNREACHABLE_TAINT, "NoExecute"),
                    (UNREACHABLE_TAINT, "NoSchedule"),
                }

            await eventually(unreachable)
            node = await env.client.get(NODES, "node-0")
            assert ready(node)["reason"] == "NodeStatusUnknown"
            assert ready(node)["message"] == "Kubelet stopped posting node status."
            added = next(
                t["timeAdded"] for t in node["spec"]["taints"] if t["effect"] == "NoExecute"
            )
            # The partitioned node cannot finish a graceful deletion: the pod must go entirely.
            await eventually(partial(_gone, env, "short"))
            taint_time = parse_rfc3339(added)
            assert taint_time is not None
            assert time.time() >= taint_time + 1.0  # not before its toleration (1 s rounding)
            for name in ("forever", "default"):
                p = await env.client.get(PODS, name, NS)
                assert not p["metadata"].get("deletionTimestamp"), name
            healthy = await env.client.get(NODES, "node-1")
            assert ready(healthy)["status"] == "True"
            assert lifecycle_taints(healthy) == set()
            assert await env.get_or_none(PODS, "other", NS) is not None

            cluster["node-0"].resume_heartbeats()  # the kubelet posts Ready=True again

            async def recovered() -> bool:
                n = await env.client.get(NODES, "node-0")
                return ready(n)["status"] == "True" and lifecycle_taints(n) == set()

            await eventually(recovered)
            nursery.cancel_scope.cancel()


async def _gone(env: Env, name: str) -> bool:
    return await env.get_or_none(PODS, name, NS) is None


async def test_custom_no_execute_taint_evicts_untolerating_pods(env: Env) -> None:
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await start_cluster(nursery, env)
            await bound_pod(env, "victim", "node-1")
            tolerant = {"key": "example.com/drain", "operator": "Exists", "effect": "NoExecute"}
            await bound_pod(env, "tolerant", "node-1", [tolerant])
            await env.client.patch(
                NODES,
                "node-1",
                {"spec": {"taints": [{"key": "example.com/drain", "effect": "NoExecute"}]}},
            )
            # A reachable node: a graceful delete, which the simulated kubelet finishes.
            await eventually(partial(_gone, env, "victim"))
            assert await env.get_or_none(PODS, "tolerant", NS) is not None
            nursery.cancel_scope.cancel()


async def test_a_pod_arriving_on_an_already_tainted_node_is_evicted(env: Env) -> None:
    """Pod events are queued only for pods on NoExecute-tainted nodes: one bound to a node
    that is tainted already must still be seen (and one on an untainted node left alone)."""
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await start_cluster(nursery, env)
            await env.client.patch(
                NODES,
                "node-1",
                {"spec": {"taints": [{"key": "example.com/drain", "effect": "NoExecute"}]}},
            )
            await bound_pod(env, "calm", "node-0")
            await bound_pod(env, "late", "node-1")
            await eventually(partial(_gone, env, "late"))
            assert await env.get_or_none(PODS, "calm", NS) is not None
            nursery.cancel_scope.cancel()


async def test_replicaset_pods_are_recreated_on_a_healthy_node() -> None:
    def factory(ctx: ControllerContext) -> Sequence[Component]:
        return [
            *node_lifecycle_controllers(ctx, OPTIONS),
            replicaset_controller(ctx),
            Scheduler(ctx),
            garbage_collector(ctx, workers=2),
        ]

    async with controller_server(factory) as env:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                cluster = await start_cluster(nursery, env)
                # only node-0 takes pods at first
                await env.client.patch(NODES, "node-1", {"spec": {"unschedulable": True}})
                labels = {"app": "web"}
                await env.client.create(
                    REPLICASETS,
                    {
                        "metadata": {"name": "web", "namespace": NS},
                        "spec": {
                            "replicas": 2,
                            "selector": {"matchLabels": labels},
                            "template": {
                                "metadata": {"labels": labels},
                                "spec": {
                                    "containers": [{"name": "c", "image": "busybox"}],
                                    "tolerations": [toleration(1)],
                                },
                            },
                        },
                    },
                )

                async def placed(node: str) -> bool:
                    pods = (await env.client.list(PODS, NS, label_selector="app=web"))["items"]
                    return len(pods) == 2 and all(
                        p["spec"].get("nodeName") == node
                        and p["status"].get("phase") == "Running"
                        and not p["metadata"].get("deletionTimestamp")
                        for p in pods
                    )

                await eventually(partial(placed, "node-0"))
                await env.client.patch(NODES, "node-1", {"spec": {"unschedulable": False}})
                cluster["node-0"].stop_heartbeats()
                await eventually(partial(placed, "node-1"))
                nursery.cancel_scope.cancel()
