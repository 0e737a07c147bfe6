"""The compare-and-swap loop reads locally first (`update.guaranteed_update`): a stale copy may
cost a retry but never makes a wrong write or a wrong answer. A store wrapper serves every local
read from a snapshot taken before the latest write, as a lagging follower would."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from apiharness import api_server

from orchestrator.apiserver.storage import ObjectStore
from orchestrator.client import JSON_PATCH
from orchestrator.client.resource import PODS, ResourceInfo
from orchestrator.controllers.runtime.inprocess import InProcessClient
from orchestrator.kube.errors import ApiError
from orchestrator.security.authn import User

CONFIGMAPS = ResourceInfo(
    "", "v1", "configmaps", "ConfigMap", True, "configmap", ("cm",), ("get", "patch", "update")
)
ADMIN = User("admin", ("system:masters", "system:authenticated"))

pytestmark = pytest.mark.trio


class LaggingReads(ObjectStore):
    """Local (stale_ok) reads answer with what the object was before its latest write."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner.store)
        self.previous: dict[str, Any] = {}
        self.reads = {"stale": 0, "fresh": 0}

    async def get(self, kind: Any, namespace: str, name: str, *, stale_ok: bool = False) -> Any:
        self.reads["stale" if stale_ok else "fresh"] += 1
        current = await super().get(kind, namespace, name, stale_ok=False)
        if stale_ok and name in self.previous:
            return self.previous[name]
        return current

    async def get_shared(
        self, kind: Any, namespace: str, name: str, *, stale_ok: bool = False
    ) -> Any:
        return await self.get(kind, namespace, name, stale_ok=stale_ok)

    async def update(
        self, kind: Any, obj: Any, expected_rv: int, *, share: bool = False, old: Any = None
    ) -> Any:
        name = obj["metadata"]["name"]
        self.previous[name] = await super().get(kind, obj["metadata"]["namespace"], name)
        return await super().update(kind, obj, expected_rv, share=share, old=old)


@asynccontextmanager
async def lagging_api() -> AsyncIterator[tuple[InProcessClient, LaggingReads]]:
    """An in-process API server whose local reads lag one write, and a client of it."""
    async with api_server(tls=False, controllers=False) as h:
        assert h.server.api is not None
        api = h.server.api.api
        lagging = LaggingReads(api.objects)
        api.objects = lagging
        yield InProcessClient(api, ADMIN, field_manager="test"), lagging


async def test_stale_local_reads_never_decide_an_update() -> None:
    async with lagging_api() as (client, lagging):
        cm = {"metadata": {"name": "c", "namespace": "default"}, "data": {"k": "1"}}
        await client.create(CONFIGMAPS, cm, "default")
        await client.patch(CONFIGMAPS, "c", {"data": {"k": "2"}}, namespace="default")
        # The local read now says k=1: a patch back to "1" looks like a no-op there, but the
        # object says 2, so it must be written.
        out = await client.patch(CONFIGMAPS, "c", {"data": {"k": "1"}}, namespace="default")
        assert out["data"] == {"k": "1"}
        assert (await client.get(CONFIGMAPS, "c", "default"))["data"] == {"k": "1"}
        # A patch computed on the stale copy fails its compare-and-swap and is recomputed.
        out = await client.patch(CONFIGMAPS, "c", {"data": {"x": "y"}}, namespace="default")
        assert out["data"] == {"k": "1", "x": "y"}
        # A JSON patch whose test holds only on the latest state succeeds.
        fresh_before = lagging.reads["fresh"]
        out = await client.patch(
            CONFIGMAPS,
            "c",
            [{"op": "test", "path": "/data/x", "value": "y"}, {"op": "add", "path": "/data/z",
                                                                "value": "1"}],
            namespace="default",
            content_type=JSON_PATCH,
        )  # fmt: skip
        assert out["data"]["z"] == "1"
        assert lagging.reads["fresh"] > fresh_before
        # ... and one that fails on the latest state too is refused.
        with pytest.raises(ApiError) as err:
            await client.patch(
                CONFIGMAPS,
                "c",
                [{"op": "test", "path": "/data/x", "value": "nope"}],
                namespace="default",
                content_type=JSON_PATCH,
            )
        assert err.value.code == 422
        # A resourceVersion precondition is checked against the latest state.
        live = await client.get(CONFIGMAPS, "c", "default")
        live["data"]["w"] = "1"
        out = await client.update(CONFIGMAPS, live)
        assert out["data"]["w"] == "1"
        with pytest.raises(ApiError) as err:
            await client.update(CONFIGMAPS, live)  # its resourceVersion is now old
        assert err.value.code == 409
        assert lagging.reads["stale"] > 0


async def test_stale_local_reads_never_decide_a_binding() -> None:
    async with lagging_api() as (client, lagging):
        pod = {
            "metadata": {"name": "q", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
        }
        await client.create(PODS, pod, "default")
        await client.patch(PODS, "q", {"metadata": {"labels": {"a": "b"}}}, namespace="default")
        # The local read misses the label: binding that copy fails its compare-and-swap, and
        # the binding made on the latest state keeps the label.
        await client.bind(pod, "n1")
        live = await client.get(PODS, "q", "default")
        assert live["spec"]["nodeName"] == "n1"
        assert live["metadata"]["labels"] == {"a": "b"}
        # The local read now says unassigned; the latest state refuses a second binding.
        with pytest.raises(ApiError) as err:
            await client.bind(pod, "n2")
        assert err.value.code == 409
        assert "already assigned" in str(err.value)
        assert (await client.get(PODS, "q", "default"))["spec"]["nodeName"] == "n1"
        assert lagging.reads["stale"] > 0
