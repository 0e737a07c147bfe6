"""EndpointSlice controller on a real server: slices follow pod readiness, labels and deletion,
are owned by their Service, are put back when deleted by hand, write nothing when nothing
changed, go with their Service; selector-less Services get mirrored slices of their Endpoints
(`default/kubernetes` among them, published by the server itself)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from functools import partial
from typing import Any

import pytest
import trio
from ctlharness import Env, controller_server, eventually
from test_endpoints import NS, SERVICE, run_pod, set_status

from orchestrator.client.resource import ENDPOINT_SLICES, ENDPOINTS, PODS, SERVICES
from orchestrator.controllers.endpointslice import endpointslice_controller
from orchestrator.controllers.runtime.manager import Component, ControllerContext
from orchestrator.controllers.slicecore import CONTROLLER_NAME, MIRROR_NAME

Obj = dict[str, Any]


def slices_only(ctx: ControllerContext) -> Sequence[Component]:
    return [endpointslice_controller(ctx, workers=2)]


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    async with controller_server(slices_only) as e:
        yield e


async def slices_of(env: Env, service: str, ns: str = NS) -> list[Obj]:
    got = await env.client.list(
        ENDPOINT_SLICES, ns, label_selector=f"kubernetes.io/service-name={service}"
    )
    return list(got.get("items") or [])


async def endpoints_are(env: Env, ready: list[str], not_ready: list[str]) -> bool:
    slices = await slices_of(env, "web")
    eps = [e for s in slices for e in s.get("endpoints") or []]
    got_ready = sorted(e["addresses"][0] for e in eps if e["conditions"]["ready"])
    got_not = sorted(e["addresses"][0] for e in eps if not e["conditions"]["ready"])
    return len(slices) == 1 and got_ready == ready and got_not == not_ready


async def test_slices_follow_pods(env: Env) -> None:
    with trio.fail_after(30):
        svc = await env.client.create(SERVICES, SERVICE)
        await eventually(partial(endpoints_are, env, [], []))  # the placeholder
        await run_pod(env, "a", "10.1.0.1", True)
        await run_pod(env, "b", "10.1.0.2", False)
        await eventually(partial(endpoints_are, env, ["10.1.0.1"], ["10.1.0.2"]))
        (s,) = await slices_of(env, "web")
        assert s["metadata"]["name"].startswith("web-")
        assert s["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"] == (
            CONTROLLER_NAME
        )
        (owner,) = s["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"], owner["controller"]) == (
            "Service",
            svc["metadata"]["uid"],
            True,
        )
        assert s["ports"] == [{"name": "http", "port": 8080, "protocol": "TCP"}]
        assert s["addressType"] == "IPv4"

        await set_status(env, await env.client.get(PODS, "b", NS), "10.1.0.2", True)
        await eventually(partial(endpoints_are, env, ["10.1.0.1", "10.1.0.2"], []))
        await env.client.patch(PODS, "b", {"metadata": {"labels": {"app": "other"}}}, NS)
        await eventually(partial(endpoints_are, env, ["10.1.0.1"], []))

        # a hand-deleted slice is put back
        await env.client.delete(ENDPOINT_SLICES, s["metadata"]["name"], NS)
        await eventually(partial(endpoints_are, env, ["10.1.0.1"], []))

        await env.client.delete(SERVICES, "web", NS)

        async def gone() -> bool:
            return await slices_of(env, "web") == []

        await eventually(gone)


async def test_mirroring_of_selectorless_services(env: Env) -> None:
    with trio.fail_after(30):
        await env.client.create(
            SERVICES,
            {"metadata": {"name": "ext", "namespace": NS}, "spec": {"ports": [{"port": 5432}]}},
        )
        await env.client.create(
            ENDPOINTS,
            {
                "metadata": {"name": "ext", "namespace": NS},
                "subsets": [
                    {
                        "addresses": [{"ip": "192.0.2.10"}],
                        "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}],
                    }
                ],
            },
        )

        async def mirrored(ips: list[str]) -> bool:
            slices = await slices_of(env, "ext")
            got = sorted(e["addresses"][0] for s in slices for e in s.get("endpoints") or [])
            return got == ips and all(
                s["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"] == MIRROR_NAME
                for s in slices
            )

        await eventually(partial(mirrored, ["192.0.2.10"]))
        ep = await env.client.get(ENDPOINTS, "ext", NS)
        ep["subsets"][0]["addresses"].append({"ip": "192.0.2.11"})
        await env.client.update(ENDPOINTS, ep)
        await eventually(partial(mirrored, ["192.0.2.10", "192.0.2.11"]))
        # skip-mirror: the mirrored slices go
        await env.client.patch(
            ENDPOINTS,
            "ext",
            {"metadata": {"labels": {"endpointslice.kubernetes.io/skip-mirror": "true"}}},
            NS,
        )
        await eventually(partial(mirrored, []))

        # the server publishes default/kubernetes on a single server: mirrored too
        async def api_slice() -> bool:
            slices = await slices_of(env, "kubernetes", "default")
            eps = [e for s in slices for e in s.get("endpoints") or []]
            ports = [p for s in slices for p in s.get("ports") or []]
            return len(eps) == 1 and [p["name"] for p in ports] == ["http"]

        await eventually(api_slice)
