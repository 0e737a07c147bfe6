"""orchestrator.controllers.runtime.client: the same test body against both transports
(`InProcessClient` calling `Api`, `HttpClient` over HTTPS) on the in-process API harness.

(Named test_runtime_client.py: tests/ has no __init__.py files, so a second test_client.py
would clash with tests/client/test_client.py.)
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import trio
from api.apiharness import Harness, api_server

from orchestrator.client import (
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    RestClient,
    load_kubeconfig,
)
from orchestrator.controllers.runtime.client import CONFIGMAPS, NODES, PODS, Client, HttpClient
from orchestrator.controllers.runtime.inprocess import InProcessClient
from orchestrator.kube.errors import ApiError
from orchestrator.security.authn import User

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


@asynccontextmanager
async def node_and_client() -> AsyncIterator[tuple[InProcessClient, str]]:
    """An in-process server (no controllers) with Node edge-1, a client of it, and the pods'
    resourceVersion to watch from."""
    async with api_server(controllers=False) as h:
        assert h.server.api is not None
        c = InProcessClient(h.server.api.api, CONTROLLER)
        with trio.fail_after(30):
            await c.create(NODES, {"metadata": {"name": "edge-1"}})
            yield c, (await c.list(PODS, "default"))["metadata"]["resourceVersion"]


async def test_binding_leaves_the_shared_watch_object_alone() -> None:
    """Binding reads the pod from the decoded values the read-only watches share: it must write
    a copy, never the object a watcher holds."""
    async with node_and_client() as (c, start):
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


async def test_read_only_writes_hand_their_object_to_the_read_only_watches() -> None:
    """A write made with `read_only=True` (and a binding) gives the read-only watchers the
    object it stored instead of a decode of it: the same parts, equal to a fresh decode."""
    async with node_and_client() as (c, start):
        body = {
            "metadata": {"name": "p", "namespace": "default", "labels": {"app": "a"}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        }
        got: list[dict[str, Any]] = []
        replies: list[dict[str, Any]] = []
        async with c.watch(PODS, "default", resource_version=start, read_only=True) as events:
            replies.append(await c.create(PODS, body, read_only=True))
            async for _etype, obj in events:
                got.append(obj)
                if len(got) == 1:
                    await c.bind(replies[0], "edge-1")
                elif len(got) == 2:
                    status = {"status": {"phase": "Running", "podIP": "10.0.0.7"}}
                    replies.append(
                        await c.patch(
                            PODS, "p", status, "default", subresource="status", read_only=True
                        )
                    )
                else:
                    break
        fresh = await c.get(PODS, "p", "default")
        created, bound, running = got
        assert created["spec"] is replies[0]["spec"]  # the stored object, not a decode
        assert running["status"] is replies[1]["status"]
        assert running["spec"] is bound["spec"]  # a status write keeps the stored spec, shared
        assert created["metadata"]["resourceVersion"] == replies[0]["metadata"]["resourceVersion"]
        assert bound["spec"]["nodeName"] == "edge-1"
        assert running == fresh  # what a decode of the stored value gives, exactly
        assert running["metadata"]["resourceVersion"] == replies[1]["metadata"]["resourceVersion"]


async def test_read_only_writes_never_modify_what_the_watches_were_handed() -> None:
    """A `read_only` write reads the object it replaces from the decoded values the read-only
    watches share: every patch type, the no-op and the status subresource must leave them as
    they were handed out."""
    async with api_server(controllers=False) as h:
        assert h.server.api is not None
        c = InProcessClient(h.server.api.api, CONTROLLER)
        with trio.fail_after(30):
            start = (await c.list(PODS, "default"))["metadata"]["resourceVersion"]
            body = {
                "metadata": {"name": "p", "namespace": "default", "labels": {"app": "a"}},
                "spec": {
                    "containers": [{"name": "c", "image": "busybox", "env": [{"name": "A"}]}],
                    "tolerations": [{"key": "k", "operator": "Exists"}],
                },
            }
            ready = {"type": "Ready", "status": "True"}
            patches: list[tuple[Any, str, str]] = [
                ({"metadata": {"labels": {"app": "b", "x": "y"}}}, MERGE_PATCH, ""),
                ({"metadata": {"labels": {"app": "b", "x": "y"}}}, MERGE_PATCH, ""),  # no-op
                (
                    {"spec": {"containers": [{"name": "c", "image": "busybox:2"}]}},
                    STRATEGIC_MERGE_PATCH,
                    "",
                ),
                (
                    [{"op": "add", "path": "/metadata/annotations", "value": {"a": "1"}}],
                    JSON_PATCH,
                    "",
                ),
                ({"status": {"phase": "Running", "conditions": [ready]}}, MERGE_PATCH, "status"),
                (
                    {"status": {"conditions": [{"type": "Ready", "status": "False"}]}},
                    STRATEGIC_MERGE_PATCH,
                    "status",
                ),
            ]
            handed: list[tuple[dict[str, Any], dict[str, Any]]] = []

            async def receive(events: Any) -> None:
                async for _etype, obj in events:
                    handed.append((obj, copy.deepcopy(obj)))
                    break

            async with c.watch(PODS, "default", resource_version=start, read_only=True) as events:
                await c.create(PODS, body, read_only=True)
                await receive(events)
                for i, (patch, content_type, sub) in enumerate(patches):
                    await c.patch(
                        PODS, "p", patch, "default", content_type=content_type,
                        subresource=sub, read_only=True,
                    )  # fmt: skip
                    if i != 1:  # the no-op writes nothing: no event
                        await receive(events)
        assert len(handed) == len(patches)  # the no-op wrote nothing
        for obj, at_receipt in handed:
            assert obj == at_receipt
        final = handed[-1][0]
        assert final["status"]["conditions"] == [{"type": "Ready", "status": "False"}]
        assert final["metadata"]["annotations"] == {"a": "1"}


async def test_a_create_neither_modifies_nor_keeps_its_body() -> None:
    """The in-process create (and merge patch) hands its body over without a copy: the server
    must only read it, and keep none of it."""
    async with api_server(controllers=False) as h:
        assert h.server.api is not None
        c = InProcessClient(h.server.api.api, CONTROLLER)
        body = {
            "metadata": {"generateName": "p-", "labels": {"app": "a"}},
            "spec": {"containers": [{"name": "c", "image": "busybox", "env": [{"name": "A"}]}]},
        }
        before = copy.deepcopy(body)
        with trio.fail_after(30):
            made = await c.create(PODS, body, "default", read_only=True)
            assert body == before
            body["spec"]["containers"][0]["env"].append({"name": "B"})
            body["metadata"]["labels"]["app"] = "changed"
            stored = await c.get(PODS, made["metadata"]["name"], "default")
        assert stored["spec"]["containers"][0]["env"] == [{"name": "A"}]
        assert stored["metadata"]["labels"] == {"app": "a"}
        assert made["spec"] == stored["spec"]
        # A merge patch is handed over without a copy too.
        patch = {"metadata": {"labels": {"extra": "1"}}, "status": {"phase": "Running"}}
        before = copy.deepcopy(patch)
        name = made["metadata"]["name"]
        with trio.fail_after(30):
            await c.patch(PODS, name, patch, "default", read_only=True)
            await c.patch(PODS, name, patch, "default", subresource="status", read_only=True)
            assert patch == before
            patch["metadata"]["labels"]["extra"] = "changed"
            patch["status"]["phase"] = "Failed"
            stored = await c.get(PODS, name, "default")
        assert stored["metadata"]["labels"] == {"app": "a", "extra": "1"}
        assert stored["status"]["phase"] == "Running"


async def test_read_only_creates_share_the_memoized_field_set_and_others_copy_it() -> None:
    async with api_server(controllers=False) as h:
        assert h.server.api is not None
        c = InProcessClient(h.server.api.api, CONTROLLER)
        body = {
            "metadata": {"generateName": "p-", "labels": {"app": "a"}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        }
        with trio.fail_after(30):
            shared = [await c.create(PODS, body, "default", read_only=True) for _ in range(2)]
            own = [await c.create(PODS, body, "default") for _ in range(2)]

        def tree(pod: dict[str, Any]) -> Any:
            (entry,) = pod["metadata"]["managedFields"]
            return entry["fieldsV1"]

        assert tree(shared[0]) is tree(shared[1])
        assert tree(own[0]) is not tree(own[1])
        assert tree(own[0]) == tree(shared[0])


def test_an_expectation_is_used_only_for_the_same_bytes() -> None:
    from orchestrator.apiserver.storage import Decoded, encode
    from orchestrator.store.types import KeyValue

    decoded = Decoded()
    mine = {"metadata": {"name": "a"}, "data": {"k": "1"}}
    decoded.expect("/a", encode(mine), mine)
    other = {"metadata": {"name": "a"}, "data": {"k": "2"}}  # someone else's write won
    seen = decoded.get(KeyValue("/a", encode(other), 2, 3, 1))
    assert seen == {"metadata": {"name": "a", "resourceVersion": "3"}, "data": {"k": "2"}}
    decoded.expect("/a", encode(mine), mine)
    seen = decoded.get(KeyValue("/a", encode(mine), 2, 4, 2))
    assert seen["data"] is mine["data"]
    assert seen["metadata"] == {"name": "a", "resourceVersion": "4"}
    assert mine["metadata"] == {"name": "a"}  # the writer's object is left as it was


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
