"""Endpoints controller: `desired_subsets` (pure: readiness, named and numeric targetPorts,
what is left out) and, on a real server, Endpoints that follow pod readiness, labels and
deletion, and go with their Service."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from functools import partial
from typing import Any

import pytest
import trio
from ctlharness import Env, controller_server, eventually

from orchestrator.client.resource import ENDPOINTS, PODS, SERVICES
from orchestrator.controllers.endpoints import desired_subsets, endpoints_controller
from orchestrator.controllers.runtime.manager import Component, ControllerContext

Obj = dict[str, Any]
NS = "default"


def pod(name: str, ip: str | None, ready: bool, *, labels: Obj | None = None, **meta: Any) -> Obj:
    status: Obj = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    if ip:
        status["podIP"] = ip
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"u-{name}",
            "labels": labels if labels is not None else {"app": "web"},
            **meta,
        },
        "spec": {
            "nodeName": "n1",
            "containers": [
                {
                    "name": "c",
                    "image": "busybox",
                    "ports": [{"name": "http", "containerPort": 8080}],
                }
            ],
        },
        "status": status,
    }


SERVICE: Obj = {
    "metadata": {"name": "web", "namespace": NS},
    "spec": {
        "selector": {"app": "web"},
        "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}],
    },
}


def test_desired_subsets() -> None:
    pods = [
        pod("b", "10.0.0.2", True),
        pod("a", "10.0.0.1", True),
        pod("c", "10.0.0.3", False),
        pod("no-ip", None, True),
        pod("gone", "10.0.0.4", True, deletionTimestamp="2024-01-01T00:00:00Z"),
        pod("other", "10.0.0.5", True, labels={"app": "db"}),
    ]
    (subset,) = desired_subsets(SERVICE, pods)
    assert [a["ip"] for a in subset["addresses"]] == ["10.0.0.1", "10.0.0.2"]
    assert subset["addresses"][0] == {
        "ip": "10.0.0.1",
        "nodeName": "n1",
        "targetRef": {"kind": "Pod", "namespace": NS, "name": "a", "uid": "u-a"},
    }
    assert [a["ip"] for a in subset["notReadyAddresses"]] == ["10.0.0.3"]
    assert subset["ports"] == [{"name": "http", "port": 8080, "protocol": "TCP"}]
    # a numeric targetPort is taken as is; a pod without the named port is left out
    svc = {
        "spec": {
            "selector": {"app": "web"},
            "ports": [
                {"name": "http", "port": 80, "targetPort": "http"},
                {"name": "m", "port": 9, "targetPort": 9090},
            ],
        }
    }
    bare = pod("bare", "10.0.0.9", True)
    bare["spec"]["containers"][0]["ports"] = []
    subsets = desired_subsets(svc, [pod("a", "10.0.0.1", True), bare])
    assert [(s["addresses"][0]["ip"], [p["port"] for p in s["ports"]]) for s in subsets] == [
        ("10.0.0.1", [8080, 9090]),
        ("10.0.0.9", [9090]),
    ]
    publish = {"spec": {**SERVICE["spec"], "publishNotReadyAddresses": True}}
    (subset,) = desired_subsets(publish, [pod("c", "10.0.0.3", False)])
    assert "notReadyAddresses" not in subset
    assert desired_subsets(SERVICE, []) == []


# ------------------------------------------------------------------------------ on a server
def endpoints_only(ctx: ControllerContext) -> Sequence[Component]:
    return [endpoints_controller(ctx, workers=2)]


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    async with controller_server(endpoints_only) as e:
        yield e


async def run_pod(env: Env, name: str, ip: str, ready: bool) -> None:
    spec = pod(name, ip, ready)
    created = await env.client.create(
        PODS,
        {
            "metadata": {"name": name, "namespace": NS, "labels": {"app": "web"}},
            "spec": spec["spec"],
        },
    )
    await set_status(env, created, ip, ready)


async def set_status(env: Env, p: Obj, ip: str, ready: bool) -> None:
    live = await env.client.get(PODS, p["metadata"]["name"], NS)
    live["status"] = {
        **live.get("status", {}),
        "phase": "Running",
        "podIP": ip,
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    await env.client.update(PODS, live, subresource="status")


async def endpoints_are(env: Env, ready: list[str], not_ready: list[str]) -> bool:
    ep = await env.get_or_none(ENDPOINTS, "web", NS)
    if ep is None:
        return False
    subsets = ep.get("subsets") or []
    got_ready = [a["ip"] for s in subsets for a in s.get("addresses") or []]
    got_not = [a["ip"] for s in subsets for a in s.get("notReadyAddresses") or []]
    return got_ready == ready and got_not == not_ready


async def test_endpoints_follow_pod_readiness(env: Env) -> None:
    with trio.fail_after(30):
        await env.client.create(SERVICES, SERVICE)
        await run_pod(env, "a", "10.1.0.1", True)
        await run_pod(env, "b", "10.1.0.2", False)
        await eventually(partial(endpoints_are, env, ["10.1.0.1"], ["10.1.0.2"]))
        ep = await env.client.get(ENDPOINTS, "web", NS)
        assert ep["subsets"][0]["ports"] == [{"name": "http", "port": 8080, "protocol": "TCP"}]
        assert ep["subsets"][0]["addresses"][0]["targetRef"]["name"] == "a"

        await set_status(env, await env.client.get(PODS, "b", NS), "10.1.0.2", True)
        await eventually(partial(endpoints_are, env, ["10.1.0.1", "10.1.0.2"], []))
        await set_status(env, await env.client.get(PODS, "a", NS), "10.1.0.1", False)
        await eventually(partial(endpoints_are, env, ["10.1.0.2"], ["10.1.0.1"]))

        # a pod whose labels no longer match leaves; a deleted pod leaves
        await env.client.patch(PODS, "b", {"metadata": {"labels": {"app": "other"}}}, NS)
        await eventually(partial(endpoints_are, env, [], ["10.1.0.1"]))
        await env.client.delete(PODS, "a", NS, grace_period_seconds=0)
        await eventually(partial(endpoints_are, env, [], []))

        # a hand-deleted Endpoints is put back; it goes with its Service
        await env.client.delete(ENDPOINTS, "web", NS)
        await eventually(partial(endpoints_are, env, [], []))
        await env.client.delete(SERVICES, "web", NS)

        async def gone() -> bool:
            return await env.get_or_none(ENDPOINTS, "web", NS) is None

        await eventually(gone)


async def test_selectorless_service_endpoints_are_left_alone(env: Env) -> None:
    with trio.fail_after(30):
        await env.client.create(
            SERVICES,
            {"metadata": {"name": "ext", "namespace": NS}, "spec": {"ports": [{"port": 5432}]}},
        )
        manual = {
            "metadata": {"name": "ext", "namespace": NS},
            "subsets": [{"addresses": [{"ip": "192.0.2.10"}], "ports": [{"port": 5432}]}],
        }
        await env.client.create(ENDPOINTS, manual)
        await run_pod(env, "a", "10.1.0.1", True)  # the other Service's pods change meanwhile
        await env.client.create(SERVICES, SERVICE)
        await eventually(partial(endpoints_are, env, ["10.1.0.1"], []))
        ep = await env.client.get(ENDPOINTS, "ext", NS)
        assert ep["subsets"][0]["addresses"] == [{"ip": "192.0.2.10"}]
