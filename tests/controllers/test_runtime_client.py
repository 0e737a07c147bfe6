"""orchestrator.controllers.runtime.client: the same test body against both transports
(`InProcessClient` calling `Api`, `HttpClient` over HTTPS) on the in-process API harness.

(Named test_runtime_client.py: tests/ has no __init__.py files, so a second test_client.py
would clash with tests/client/test_client.py.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import trio
from api.apiharness import Harness, api_server

from orchestrator.api.auth.authn import User
from orchestrator.api.errors import ApiError
from orchestrator.client import JSON_PATCH, STRATEGIC_MERGE_PATCH, RestClient, load_kubeconfig
from orchestrator.controllers.runtime.client import (
    CONFIGMAPS,
    NODES,
    PODS,
    Client,
    HttpClient,
    InProcessClient,
)

# httpx's response streams are async generators (encode/httpx#3686): a watch left early is closed
# by the client, but trio still reports the generator objects as unexhausted at GC.
LEFT_EARLY = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
CONTROLLER = User("system:kube-controller-manager", ("system:authenticated",))


@dataclass
class Env:
    h: Harness
    client: Client


@pytest.fixture(params=["in-process", "https"])
async def env(request: pytest.FixtureRequest) -> AsyncIterator[Env]:
    # No controllers: the scheduler would write to these tests' pods under their feet.
    async with api_server(controllers=False) as h:
        if request.param == "in-process":
            assert h.server.api is not None
            yield Env(h, InProcessClient(h.server.api.api, CONTROLLER))
        else:
            async with RestClient(load_kubeconfig(h.kubeconfig)) as rest:
                yield Env(h, HttpClient(rest))


def cm(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "data": {"k": "v"},
    }


async def test_crud_and_errors(env: Env) -> None:
    c = env.client
    with trio.fail_after(30):
        made = await c.create(CONFIGMAPS, cm("a", app="x"))
        assert made["metadata"]["resourceVersion"]
        await c.create(CONFIGMAPS, cm("b", app="y"))
        with pytest.raises(ApiError) as exc:
            await c.create(CONFIGMAPS, cm("a"))
        assert exc.value.code == 409
        assert exc.value.reason == "AlreadyExists"
        with pytest.raises(ApiError) as exc:
            await c.get(CONFIGMAPS, "missing", "default")
        assert exc.value.code == 404

        got = await c.get(CONFIGMAPS, "a", "default")
        assert got["data"] == {"k": "v"}
        listed = await c.list(CONFIGMAPS, "default", label_selector="app=x")
        assert [o["metadata"]["name"] for o in listed["items"]] == ["a"]
        assert listed["kind"] == "ConfigMapList"
        list_rv = int(listed["metadata"]["resourceVersion"])
        assert list_rv >= int(made["metadata"]["resourceVersion"])
        everywhere = await c.list(CONFIGMAPS)  # "" = all namespaces
        assert {"a", "b"} <= {o["metadata"]["name"] for o in everywhere["items"]}

        page = await c.list(CONFIGMAPS, "default", limit=1)
        assert len(page["items"]) == 1
        rest = await c.list(
            CONFIGMAPS, "default", limit=1, continue_token=page["metadata"]["continue"]
        )
        assert page["items"][0]["metadata"]["name"] != rest["items"][0]["metadata"]["name"]

        got["data"]["k"] = "v2"
        updated = await c.update(CONFIGMAPS, got)
        assert updated["data"]["k"] == "v2"
        with pytest.raises(ApiError) as exc:  # stale resourceVersion
            await c.update(CONFIGMAPS, got)
        assert exc.value.code == 409

        merged = await c.patch(CONFIGMAPS, "a", {"data": {"m": "1"}}, "default")
        assert merged["data"] == {"k": "v2", "m": "1"}
        smp = await c.patch(
            CONFIGMAPS, "a", {"data": {"s": "2"}}, "default", content_type=STRATEGIC_MERGE_PATCH
        )
        assert smp["data"]["s"] == "2"
        jp = await c.patch(
            CONFIGMAPS,
            "a",
            [{"op": "remove", "path": "/data/m"}],
            "default",
            content_type=JSON_PATCH,
        )
        assert "m" not in jp["data"]

        applied = await c.apply(CONFIGMAPS, cm("applied"))
        assert applied["data"] == {"k": "v"}
        managers = {f["manager"] for f in applied["metadata"]["managedFields"]}
        assert len(managers) == 1
        again = await c.apply(CONFIGMAPS, {**cm("applied"), "data": {"k": "new"}})
        assert again["data"] == {"k": "new"}

        with pytest.raises(ApiError) as exc:
            await c.delete(CONFIGMAPS, "a", "default", preconditions={"uid": "not-the-uid"})
        assert exc.value.code == 409
        await c.delete(
            CONFIGMAPS,
            "a",
            "default",
            propagation_policy="Background",
            preconditions={"uid": made["metadata"]["uid"]},
        )
        with pytest.raises(ApiError) as exc:
            await c.get(CONFIGMAPS, "a", "default")
        assert exc.value.code == 404


async def test_bind_and_status(env: Env) -> None:
    c = env.client
    with trio.fail_after(30):
        await c.create(NODES, {"metadata": {"name": "edge-1"}})
        pod = await c.create(
            PODS,
            {
                "metadata": {"name": "p", "namespace": "default"},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            },
        )
        await c.bind(pod, "edge-1")
        bound = await c.get(PODS, "p", "default")
        assert bound["spec"]["nodeName"] == "edge-1"
        with pytest.raises(ApiError) as exc:
            await c.bind(pod, "edge-2")
        assert exc.value.code == 409
        bound["status"] = {"phase": "Running"}
        written = await c.update(PODS, bound, subresource="status")
        assert written["status"]["phase"] == "Running"


@LEFT_EARLY
async def test_watch(env: Env) -> None:
    c = env.client
    with trio.fail_after(30):
        start = (await c.list(CONFIGMAPS, "default"))["metadata"]["resourceVersion"]
        async with c.watch(CONFIGMAPS, "default", resource_version=start) as events:
            await c.create(CONFIGMAPS, cm("w1"))
            await c.patch(CONFIGMAPS, "w1", {"data": {"x": "1"}}, "default")
            await c.delete(CONFIGMAPS, "w1", "default")
            seen = []
            async for etype, obj in events:
                seen.append((etype, obj["metadata"]["name"]))
                if etype == "DELETED":
                    break
        assert seen == [("ADDED", "w1"), ("MODIFIED", "w1"), ("DELETED", "w1")]

        # "" starts with synthetic ADDED events; a timeout ends the stream cleanly.
        await c.create(CONFIGMAPS, cm("w2"))
        async with c.watch(CONFIGMAPS, "default", timeout_seconds=1) as events:
            names = [obj["metadata"]["name"] async for _t, obj in events]
        assert "w2" in names


@LEFT_EARLY
@pytest.mark.parametrize("read_only", [False, True])
async def test_watch_selectors_and_read_only(env: Env, read_only: bool) -> None:
    """Selected watches see objects start and stop matching (ADDED/DELETED), plain ones every
    change; resourceVersions are the events' revisions, whether objects are shared or not."""
    c = env.client
    with trio.fail_after(30):
        start = (await c.list(CONFIGMAPS, "default"))["metadata"]["resourceVersion"]
        seen: dict[str, list[tuple[str, str, str]]] = {"all": [], "sel": []}
        async with (
            c.watch(CONFIGMAPS, "default", resource_version=start, read_only=read_only) as every,
            c.watch(
                CONFIGMAPS,
                "default",
                resource_version=start,
                label_selector="tier=front",
                read_only=read_only,
            ) as selected,
        ):
            rvs = [(await c.create(CONFIGMAPS, cm("s1", tier="back")))["metadata"]]
            rvs.append((await c.patch(CONFIGMAPS, "s1", {"metadata": {"labels": {"tier": "front"}}},
                                      "default"))["metadata"])  # fmt: skip
            rvs.append(
                (await c.patch(CONFIGMAPS, "s1", {"data": {"x": "1"}}, "default"))["metadata"]
            )
            rvs.append((await c.patch(CONFIGMAPS, "s1", {"metadata": {"labels": {"tier": "db"}}},
                                      "default"))["metadata"])  # fmt: skip
            await c.patch(CONFIGMAPS, "s1", {"metadata": {"labels": {"tier": "front"}}}, "default")
            deleted = await c.delete(CONFIGMAPS, "s1", "default")
            for name, events, count in (("all", every, 6), ("sel", selected, 4)):
                async for etype, obj in events:
                    meta = obj["metadata"]
                    seen[name].append((etype, meta["resourceVersion"], meta["labels"]["tier"]))
                    if len(seen[name]) == count:
                        break
        rv = [m["resourceVersion"] for m in rvs]
        assert [(t, tier) for t, _, tier in seen["all"]] == [
            ("ADDED", "back"), ("MODIFIED", "front"), ("MODIFIED", "front"), ("MODIFIED", "db"),
            ("MODIFIED", "front"), ("DELETED", "front"),
        ]  # fmt: skip
        assert [r for _, r, _ in seen["all"][:4]] == rv
        assert int(seen["all"][5][1]) > int(seen["all"][4][1])  # DELETED: the deleting revision
        assert deleted["metadata"]["name"] == "s1"
        assert seen["sel"] == [
            ("ADDED", rv[1], "front"), ("MODIFIED", rv[2], "front"), ("DELETED", rv[3], "db"),
            ("ADDED", seen["all"][4][1], "front"),
        ]  # fmt: skip


async def test_read_only_watchers_share_objects_and_others_get_their_own() -> None:
    async with api_server(controllers=False) as h:
        assert h.server.api is not None
        c = InProcessClient(h.server.api.api, CONTROLLER)
        with trio.fail_after(30):
            start = (await c.list(CONFIGMAPS, "default"))["metadata"]["resourceVersion"]
            got: list[dict[str, Any]] = []
            async with (
                c.watch(CONFIGMAPS, "default", resource_version=start, read_only=True) as a,
                c.watch(CONFIGMAPS, "default", resource_version=start, read_only=True) as b,
                c.watch(CONFIGMAPS, "default", resource_version=start) as own,
            ):
                await c.create(CONFIGMAPS, cm("shared"))
                for events in (a, b, own):
                    async for _etype, obj in events:
                        got.append(obj)
                        break
        assert got[0] is got[1]
        assert got[2] is not got[0]
        assert got[2] == got[0]


async def test_binding_leaves_the_shared_watch_object_alone() -> None:
    """Binding reads the pod from the decoded values the read-only watches share: it must write
    a copy, never the object a watcher holds."""
    async with api_server(controllers=False) as h:
        assert h.server.api is not None
        c = InProcessClient(h.server.api.api, CONTROLLER)
        with trio.fail_after(30):
            await c.create(NODES, {"metadata": {"name": "edge-1"}})
            start = (await c.list(PODS, "default"))["metadata"]["resourceVersion"]
            body = {
                "metadata": {"name": "p", "namespace": "default"},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            }
            got: list[dict[str, Any]] = []
            async with c.watch(PODS, "default", resource_version=start, read_only=True) as events:
                pod = await c.create(PODS, body)
                async for _etype, obj in events:
                    got.append(obj)
                    if len(got) == 1:
                        await c.bind(pod, "edge-1")
                    else:
                        break
        seen, after = got
        assert "nodeName" not in seen["spec"]
        assert seen["metadata"]["resourceVersion"] == pod["metadata"]["resourceVersion"]
        assert after["spec"]["nodeName"] == "edge-1"


@LEFT_EARLY
async def test_watch_from_a_compacted_revision_is_410(env: Env) -> None:
    c = env.client
    with trio.fail_after(30):
        old = (await c.create(CONFIGMAPS, cm("old")))["metadata"]["resourceVersion"]
        for i in range(3):
            await c.patch(CONFIGMAPS, "old", {"data": {"i": str(i)}}, "default")
        latest = (await c.get(CONFIGMAPS, "old", "default"))["metadata"]["resourceVersion"]
        await env.h.server.store.compact(int(latest))
        with pytest.raises(ApiError) as exc:  # noqa: PT012  (the error comes from the stream)
            async with c.watch(CONFIGMAPS, "default", resource_version=old) as events:
                async for _ in events:
                    pass
        assert exc.value.code == 410
