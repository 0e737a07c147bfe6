"""Namespace controller: deleting a namespace deletes everything in it (built-in and custom
kinds), waits for what is held by finalizers (with the NamespaceContentRemaining condition),
then removes the "kubernetes" finalizer and the namespace goes; other namespaces are left
alone."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
import trio
from ctlharness import Env, controller_server, eventually

from orchestrator.client import NAMESPACES, ResourceInfo
from orchestrator.client.resource import LEASES, SERVICES
from orchestrator.controllers.namespace import namespace_controller
from orchestrator.controllers.runtime.client import CONFIGMAPS, EVENTS, PODS
from orchestrator.controllers.runtime.manager import Component, ControllerContext
from orchestrator.kube.errors import ApiError

Obj = dict[str, Any]
CRDS = ResourceInfo(
    "apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False
)
GADGETS = ResourceInfo("example.com", "v1", "gadgets", "Gadget", True)


def factory(ctx: ControllerContext) -> Sequence[Component]:
    return [namespace_controller(ctx, recheck=0.1)]


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    async with controller_server(factory) as e:
        yield e


async def fill(env: Env, ns: str) -> None:
    await env.client.create(NAMESPACES, {"metadata": {"name": ns}})
    meta = {"namespace": ns}
    await env.client.create(CONFIGMAPS, {"metadata": {"name": "cm", **meta}})
    for i in range(2):
        await env.client.create(
            PODS,
            {
                "metadata": {"name": f"p{i}", **meta},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            },
        )
    await env.client.create(
        SERVICES, {"metadata": {"name": "svc", **meta}, "spec": {"ports": [{"port": 80}]}}
    )
    await env.client.create(LEASES, {"metadata": {"name": "l", **meta}, "spec": {}})
    await env.client.create(
        EVENTS,
        {
            "metadata": {"name": "e", **meta},
            "involvedObject": {"kind": "ConfigMap", "name": "cm", "namespace": ns},
            "reason": "Test",
            "message": "m",
        },
    )
    await env.client.create(
        GADGETS,
        {"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "g", **meta}},
    )


async def create_crd(env: Env) -> None:
    await env.client.create(
        CRDS,
        {
            "metadata": {"name": "gadgets.example.com"},
            "spec": {
                "group": "example.com",
                "scope": "Namespaced",
                "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
                "versions": [
                    {
                        "name": "v1",
                        "served": True,
                        "storage": True,
                        "schema": {
                            "openAPIV3Schema": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            }
                        },
                    }
                ],
            },
        },
    )


async def empty(env: Env, ns: str) -> bool:
    for res in (CONFIGMAPS, PODS, SERVICES, LEASES, EVENTS, GADGETS):
        if (await env.client.list(res, ns))["items"]:
            return False
    return True


async def ns_gone(env: Env, ns: str) -> bool:
    return await env.get_or_none(NAMESPACES, ns) is None


async def test_deleting_a_namespace_deletes_its_content_then_itself(env: Env) -> None:
    with trio.fail_after(30):
        await create_crd(env)
        await fill(env, "doomed")
        await fill(env, "kept")
        await env.client.delete(NAMESPACES, "doomed")
        terminating = await env.client.get(NAMESPACES, "doomed")
        assert terminating["status"]["phase"] == "Terminating"
        with pytest.raises(ApiError) as err:  # no new content in a terminating namespace
            await env.client.create(
                CONFIGMAPS, {"metadata": {"name": "late", "namespace": "doomed"}}
            )
        assert err.value.code == 403
        await eventually(lambda: ns_gone(env, "doomed"))
        assert await empty(env, "doomed")
        assert not await empty(env, "kept")
        assert await env.get_or_none(CONFIGMAPS, "cm", "kept") is not None


async def test_namespace_waits_for_content_held_by_finalizers(env: Env) -> None:
    with trio.fail_after(30):
        await env.client.create(NAMESPACES, {"metadata": {"name": "held"}})
        await env.client.create(
            CONFIGMAPS,
            {"metadata": {"name": "cm", "namespace": "held", "finalizers": ["test/hold"]}},
        )
        await env.client.create(CONFIGMAPS, {"metadata": {"name": "free", "namespace": "held"}})
        await env.client.delete(NAMESPACES, "held")
        await eventually(lambda: _gone(env, CONFIGMAPS, "free", "held"))

        async def remaining_condition() -> bool:
            ns = await env.client.get(NAMESPACES, "held")
            conds = {c["type"]: c for c in ns["status"].get("conditions") or []}
            c = conds.get("NamespaceContentRemaining")
            return c is not None and c["status"] == "True" and "configmaps" in c["message"]

        await eventually(remaining_condition)
        ns = await env.client.get(NAMESPACES, "held")
        assert ns["spec"]["finalizers"] == ["kubernetes"]
        cm = await env.client.get(CONFIGMAPS, "cm", "held")
        assert cm["metadata"]["deletionTimestamp"]
        cm["metadata"]["finalizers"] = []
        await env.client.update(CONFIGMAPS, cm)
        await eventually(lambda: ns_gone(env, "held"))


async def _gone(env: Env, res: ResourceInfo, name: str, ns: str) -> bool:
    return await env.get_or_none(res, name, ns) is None
