"""ServiceLB: `desired_ingress` (pure: Ready nodes' ExternalIP else InternalIP, sorted, classes,
exclusion) and, on a real server, a LoadBalancer Service whose ingress follows nodes coming,
going and turning unready, is cleared when the Service stops being a LoadBalancer, and is left
alone under another load balancer class."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from functools import partial
from typing import Any

import pytest
import trio
from ctlharness import Env, controller_server, eventually

from orchestrator.client.resource import ENDPOINT_SLICES, NODES, SERVICES
from orchestrator.controllers.runtime.manager import Component, ControllerContext
from orchestrator.controllers.servicelb import (
    CLASS,
    EXCLUDE_LABEL,
    desired_ingress,
    servicelb_controller,
)

Obj = dict[str, Any]
NS = "default"


def node(name: str, internal: str, external: str = "", *, ready: bool = True, **labels: str) -> Obj:
    addresses = [{"type": "Hostname", "address": name}, {"type": "InternalIP", "address": internal}]
    if external:
        addresses.append({"type": "ExternalIP", "address": external})
    return {
        "metadata": {"name": name, "labels": labels},
        "status": {
            "addresses": addresses,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def lb_service(name: str = "web", **spec: Any) -> Obj:
    return {
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "type": "LoadBalancer",
            "selector": {"app": name},
            "ports": [{"port": 80, "targetPort": 8080, "protocol": "TCP"}],
            **spec,
        },
    }


def test_desired_ingress() -> None:
    nodes = [
        node("b", "192.0.2.10"),
        node("a", "192.0.2.9", "198.51.100.1"),
        node("c", "192.0.2.2"),
        node("down", "192.0.2.3", ready=False),
        node("out", "192.0.2.4", **{EXCLUDE_LABEL: ""}),
        node("v6", "2001:db8::1"),
        node("twin", "192.0.2.10"),  # the same address twice: listed once
    ]
    assert desired_ingress(lb_service(), nodes) == [
        {"ip": "192.0.2.2"},
        {"ip": "192.0.2.10"},  # sorted as addresses, not as text
        {"ip": "198.51.100.1"},  # the ExternalIP wins over the InternalIP
        {"ip": "2001:db8::1"},
    ]
    assert desired_ingress(lb_service(loadBalancerClass=CLASS), nodes[:1]) == [{"ip": "192.0.2.10"}]
    assert desired_ingress(lb_service(loadBalancerClass="example.com/metal"), nodes) is None
    assert desired_ingress(lb_service(type="ClusterIP"), nodes) == []
    assert desired_ingress(lb_service(), []) == []
    deleting = node("gone", "192.0.2.5")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert desired_ingress(lb_service(), [deleting]) == []


def test_local_traffic_policy_lists_only_nodes_with_ready_endpoints() -> None:
    nodes = [node("a", "192.0.2.1"), node("b", "192.0.2.2"), node("c", "192.0.2.3")]
    slices = [
        {"endpoints": [{"addresses": ["10.42.0.2"], "nodeName": "b"}]},
        {
            "endpoints": [
                {"addresses": ["10.42.2.2"], "nodeName": "c", "conditions": {"ready": False}},
                {"addresses": ["10.42.9.2"], "nodeName": "gone"},
            ]
        },
    ]
    local = lb_service(externalTrafficPolicy="Local")
    assert desired_ingress(local, nodes, slices) == [{"ip": "192.0.2.2"}]
    assert desired_ingress(local, nodes, []) == []
    assert len(desired_ingress(lb_service(), nodes, slices) or []) == 3


# ------------------------------------------------------------------------------ on a server
def servicelb_only(ctx: ControllerContext) -> Sequence[Component]:
    return [servicelb_controller(ctx)]


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    async with controller_server(servicelb_only) as e:
        yield e


async def put_node(env: Env, body: Obj) -> None:
    name = body["metadata"]["name"]
    live = await env.get_or_none(NODES, name)
    if live is None:
        live = await env.client.create(NODES, {"metadata": body["metadata"]})
    live["status"] = body["status"]
    await env.client.update(NODES, live, subresource="status")


async def ingress_is(env: Env, name: str, ips: list[str]) -> bool:
    svc = await env.client.get(SERVICES, name, NS)
    got = ((svc.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
    return [i["ip"] for i in got] == ips


async def test_ingress_follows_nodes(env: Env) -> None:
    with trio.fail_after(30):
        await put_node(env, node("n1", "192.0.2.11"))
        await env.client.create(SERVICES, lb_service())
        other = lb_service("metal", loadBalancerClass="example.com/metal")
        await env.client.create(SERVICES, other)
        theirs = {"status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.5"}]}}}
        await env.client.patch(SERVICES, "metal", theirs, NS, subresource="status")
        await eventually(partial(ingress_is, env, "web", ["192.0.2.11"]))

        await put_node(env, node("n2", "192.0.2.12", "198.51.100.2"))
        await eventually(partial(ingress_is, env, "web", ["192.0.2.11", "198.51.100.2"]))
        await put_node(env, node("n1", "192.0.2.11", ready=False))
        await eventually(partial(ingress_is, env, "web", ["198.51.100.2"]))
        await put_node(env, node("n1", "192.0.2.11"))
        await env.client.delete(NODES, "n2")
        await eventually(partial(ingress_is, env, "web", ["192.0.2.11"]))

        # externalTrafficPolicy Local: only the nodes with a ready endpoint
        await env.client.patch(SERVICES, "web", {"spec": {"externalTrafficPolicy": "Local"}}, NS)
        await eventually(partial(ingress_is, env, "web", []))
        await put_node(env, node("n3", "192.0.2.13"))
        await env.client.create(
            ENDPOINT_SLICES,
            {
                "metadata": {
                    "name": "web-abcde",
                    "namespace": NS,
                    "labels": {"kubernetes.io/service-name": "web"},
                },
                "addressType": "IPv4",
                "endpoints": [{"addresses": ["10.42.3.2"], "nodeName": "n3"}],
            },
        )
        await eventually(partial(ingress_is, env, "web", ["192.0.2.13"]))

        # no longer a LoadBalancer: the ingress is cleared
        await env.client.patch(SERVICES, "web", {"spec": {"type": "ClusterIP"}}, NS)
        await eventually(partial(ingress_is, env, "web", []))
        # another class's Service was never touched
        assert await ingress_is(env, "metal", ["203.0.113.5"])
