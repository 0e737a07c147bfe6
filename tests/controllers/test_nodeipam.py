"""The node IPAM controller on a real server: every Node gets a /24 of the cluster CIDR, kept
for life, released on delete and reused; Nodes that come with a podCIDR keep it (or get an
event when it is not ours); a full range is an event, not a crash; the Node kind refuses a
changed podCIDR."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
import trio
from ctlharness import Env, controller_server, eventually

from orchestrator.client.resource import EVENTS, NODES
from orchestrator.controllers.nodeipam import NodeIpamController, node_ipam_controller
from orchestrator.controllers.runtime.events import EventRecorder
from orchestrator.controllers.runtime.informer import InformerFactory
from orchestrator.controllers.runtime.manager import Component, ControllerContext
from orchestrator.kube.errors import ApiError
from orchestrator.metrics import Registry
from orchestrator.network.settings import NetworkSettings

Obj = dict[str, Any]


def node(name: str, pod_cidr: str = "") -> Obj:
    spec: Obj = {"podCIDR": pod_cidr, "podCIDRs": [pod_cidr]} if pod_cidr else {}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": spec}


async def cidr_of(env: Env, name: str) -> str:
    got = await env.get_or_none(NODES, name)
    return str(((got or {}).get("spec") or {}).get("podCIDR") or "")


async def wait_cidr(env: Env, name: str) -> str:
    async def assigned() -> bool:
        return bool(await cidr_of(env, name))

    await eventually(assigned)
    return await cidr_of(env, name)


def small(ctx: ControllerContext) -> list[Component]:
    settings = NetworkSettings.create(cluster_cidr="10.42.0.0/22")  # four /24s
    return [
        NodeIpamController(ctx.client, ctx.informers, ctx.events, settings).controller(
            metrics=ctx.metrics
        )
    ]


async def test_many_nodes_get_distinct_blocks_kept_released_and_reused() -> None:
    async with controller_server(lambda ctx: [node_ipam_controller(ctx)]) as env:
        with trio.fail_after(60):
            names = [f"n{i}" for i in range(12)]
            for n in names:
                await env.client.create(NODES, node(n))
            cidrs = {n: await wait_cidr(env, n) for n in names}
            assert len(set(cidrs.values())) == 12
            for c in cidrs.values():
                net = ipaddress.ip_network(c)
                assert net.prefixlen == 24
                assert net.subnet_of(ipaddress.ip_network("10.42.0.0/16"))
            got = await env.client.get(NODES, "n3")
            assert got["spec"]["podCIDRs"] == [cidrs["n3"]]
            # deleted: its block goes to the next Node (the lowest free one)
            await env.client.delete(NODES, "n3")
            await env.client.create(NODES, node("late"))
            assert await wait_cidr(env, "late") == cidrs["n3"]
            # the Node kind keeps a podCIDR for life
            got = await env.client.get(NODES, "n0")
            got["spec"]["podCIDR"] = "10.42.200.0/24"
            got["spec"]["podCIDRs"] = ["10.42.200.0/24"]
            with pytest.raises(ApiError) as err:
                await env.client.update(NODES, got)
            assert err.value.code == 422


async def test_nodes_that_come_with_a_pod_cidr() -> None:
    async with controller_server(lambda ctx: [node_ipam_controller(ctx)]) as env:
        with trio.fail_after(60):
            # as restored after a restart: the blocks Nodes hold are never handed out again
            await env.client.create(NODES, node("old", "10.42.0.0/24"))
            await env.client.create(NODES, node("outside", "192.168.7.0/24"))
            await env.client.create(NODES, node("twin", "10.42.0.0/24"))
            await env.client.create(NODES, node("new"))
            assert await wait_cidr(env, "new") == "10.42.1.0/24"
            assert await cidr_of(env, "old") == "10.42.0.0/24"
            assert await cidr_of(env, "outside") == "192.168.7.0/24"  # left alone

            async def warned() -> bool:
                events = await env.client.list(EVENTS, "")
                items = events.get("items") or []
                names = {
                    e["involvedObject"]["name"]
                    for e in items
                    if e.get("reason") == "CIDRNotAvailable"
                }
                return {"outside", "twin"} <= names

            await eventually(warned)


async def test_full_range_is_an_event_and_a_release_serves_the_waiting_node() -> None:
    async with controller_server(small) as env:
        with trio.fail_after(60):
            for i in range(4):
                await env.client.create(NODES, node(f"n{i}"))
            for i in range(4):
                await wait_cidr(env, f"n{i}")
            await env.client.create(NODES, node("waiting"))

            async def full_event() -> bool:
                events = await env.client.list(EVENTS, "")
                return any(
                    e.get("reason") == "CIDRNotAvailable"
                    and e["involvedObject"]["name"] == "waiting"
                    for e in events.get("items") or []
                )

            await eventually(full_event)
            freed = await cidr_of(env, "n2")
            await env.client.delete(NODES, "n2")
            with trio.fail_after(10):  # woken by the release, not by its backoff
                assert await wait_cidr(env, "waiting") == freed


class Idle:
    """A component that does nothing (the harness waits for the manager to run one)."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await trio.sleep_forever()


async def test_a_restarted_controller_restores_the_blocks_from_the_nodes() -> None:
    """A new leader's controller (fresh memory) hands out only blocks no Node holds."""
    async with controller_server(lambda ctx: [Idle()]) as env:

        async def run_one(*, task_status: trio.TaskStatus[trio.CancelScope]) -> None:
            with trio.CancelScope() as scope:
                informers = InformerFactory(env.client, metrics=Registry())
                events = EventRecorder(env.client, "nodeipam-test", metrics=Registry())
                settings = NetworkSettings.create()
                ctl = NodeIpamController(env.client, informers, events, settings)
                controller = ctl.controller(metrics=Registry())
                async with trio.open_nursery() as nursery:
                    informers.start(nursery)
                    await nursery.start(events.run)
                    await nursery.start(controller.run)
                    task_status.started(scope)

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                first = await nursery.start(run_one)
                for n in ("a", "b", "c"):
                    await env.client.create(NODES, node(n))
                held = [await wait_cidr(env, n) for n in ("a", "b", "c")]
                assert held == ["10.42.0.0/24", "10.42.1.0/24", "10.42.2.0/24"]
                first.cancel()
                # Created while no controller runs, and listed (so queued) before the Nodes
                # that hold blocks: only a controller that restored them first skips those.
                await env.client.create(NODES, node("0d"))
                await nursery.start(run_one)  # a new term: nothing in memory
                assert await wait_cidr(env, "0d") == "10.42.3.0/24"
                await env.client.delete(NODES, "b")
                await env.client.create(NODES, node("e"))
                assert await wait_cidr(env, "e") == "10.42.1.0/24"  # b's, released and reused
                assert [await cidr_of(env, n) for n in ("a", "c")] == [held[0], held[2]]
                nursery.cancel_scope.cancel()
