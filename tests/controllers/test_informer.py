"""SharedInformer on the in-process API harness: list + watch, relist after a compaction (410),
synthetic deletes, resync, indexers, handler semantics, and the factory's sharing."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from api.apiharness import Harness, api_server

from orchestrator.client import ResourceInfo
from orchestrator.controllers.runtime.client import CONFIGMAPS, NODES, PODS, WatchEvent
from orchestrator.controllers.runtime.informer import (
    LABEL_INDEX,
    NAMESPACE_INDEX,
    NODE_NAME_INDEX,
    OWNER_INDEX,
    DeletedFinalStateUnknown,
    InformerFactory,
    SharedInformer,
    deleted_object,
    strip_managed_fields,
)
from orchestrator.controllers.runtime.inprocess import InProcessClient
from orchestrator.metrics import Registry
from orchestrator.security.authn import User

CONTROLLER = User("system:kube-controller-manager", ("system:authenticated",))
Obj = dict[str, Any]


class GatedClient(InProcessClient):
    """The in-process client, with watches the test can cut and hold back."""

    def __init__(self, h: Harness) -> None:
        assert h.server.api is not None
        super().__init__(h.server.api.api, CONTROLLER)
        self.gate = trio.Event()
        self.gate.set()
        self.scope: trio.CancelScope | None = None
        self.watches: list[str] = []  # the resourceVersion each watch started from

    def cut(self) -> None:
        """End the current watch (cleanly) and hold the next one until `release`."""
        self.gate = trio.Event()
        assert self.scope is not None
        self.scope.cancel()

    def release(self) -> None:
        self.gate.set()

    @asynccontextmanager
    async def watch(  # type: ignore[override]  # same signature, narrower decorator type
        self, res: ResourceInfo, namespace: str = "", **kw: Any
    ) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        await self.gate.wait()
        self.watches.append(kw.get("resource_version", ""))
        async with super().watch(res, namespace, **kw) as events:
            yield self._cuttable(events)

    async def _cuttable(self, events: AsyncIterator[WatchEvent]) -> AsyncIterator[WatchEvent]:
        it = events.__aiter__()
        while True:
            with trio.CancelScope() as scope:
                self.scope = scope
                try:
                    ev = await it.__anext__()
                except StopAsyncIteration:
                    return
            if scope.cancelled_caught:
                return
            yield ev


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.final_unknown: list[str] = []

    def attach(self, inf: SharedInformer) -> None:
        inf.add_event_handler(
            on_add=lambda o: self.events.append(("add", o["metadata"]["name"])),
            on_update=lambda old, new: self.events.append(("update", new["metadata"]["name"])),
            on_delete=self._deleted,
        )

    def _deleted(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        if isinstance(obj, DeletedFinalStateUnknown):
            self.final_unknown.append(obj.key)
        self.events.append(("delete", deleted_object(obj)["metadata"]["name"]))


async def until(predicate: Callable[[], bool]) -> None:
    """Poll a condition on the cache (callers hold the deadline with `trio.fail_after`)."""
    while not predicate():  # noqa: ASYNC110  (the condition is data, not an event to wait on)
        await trio.sleep(0.01)


def cm(name: str, **labels: str) -> Obj:
    return {"metadata": {"name": name, "namespace": "default", "labels": labels}, "data": {}}


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    async with api_server() as harness:
        yield harness


async def test_list_then_watch_and_handlers(h: Harness) -> None:
    client = GatedClient(h)
    with trio.fail_after(30):
        await client.create(CONFIGMAPS, cm("a", app="x"))
        inf = SharedInformer(client, CONFIGMAPS, "default", metrics=Registry())
        rec = Recorder()
        rec.attach(inf)
        assert not inf.has_synced
        async with trio.open_nursery() as nursery:
            await nursery.start(inf.run)
            assert inf.has_synced
            await inf.wait_for_cache_sync()
            assert rec.events == [("add", "a")]
            assert inf.get("default/a") is not None
            assert client.watches == [inf.resource_version]

            await client.create(CONFIGMAPS, cm("b"))
            await client.patch(CONFIGMAPS, "a", {"data": {"k": "v"}}, "default")
            await client.delete(CONFIGMAPS, "b", "default")
            await until(lambda: len(rec.events) == 4)
            assert rec.events[1:] == [("add", "b"), ("update", "a"), ("delete", "b")]
            a = inf.get("default/a")
            assert a is not None
            assert a["data"] == {"k": "v"}
            assert inf.get("default/b") is None
            assert [o["metadata"]["name"] for o in inf.list()] == ["a"]

            late = Recorder()  # a handler added late gets the cache as adds
            late.attach(inf)
            assert late.events == [("add", "a")]
            nursery.cancel_scope.cancel()


async def test_relist_after_compaction_emits_synthetic_deletes(h: Harness) -> None:
    client = GatedClient(h)
    metrics = Registry()
    with trio.fail_after(30):
        for name in ("keep", "gone", "changed"):
            await client.create(CONFIGMAPS, cm(name))
        inf = SharedInformer(client, CONFIGMAPS, "default", metrics=metrics)
        rec = Recorder()
        rec.attach(inf)
        async with trio.open_nursery() as nursery:
            await nursery.start(inf.run)
            await until(lambda: client.scope is not None)
            synced_rv = inf.resource_version
            rec.events.clear()

            client.cut()  # the watch ends; the informer waits to re-watch from synced_rv
            await client.delete(CONFIGMAPS, "gone", "default")
            await client.create(CONFIGMAPS, cm("new"))
            await client.patch(CONFIGMAPS, "changed", {"data": {"x": "1"}}, "default")
            latest = (await client.list(CONFIGMAPS, "default"))["metadata"]["resourceVersion"]
            await h.server.store.compact(int(latest))
            client.release()

            await until(lambda: len(rec.events) == 3)
            assert sorted(rec.events) == [("add", "new"), ("delete", "gone"), ("update", "changed")]
            assert rec.final_unknown == ["default/gone"]  # seen by the relist, not a watch event
            assert client.watches[:2] == [synced_rv, synced_rv]  # re-watched, got a 410
            assert sorted(inf.keys()) == ["default/changed", "default/keep", "default/new"]
            rendered = metrics.render()
            assert 'informer_relists_total{resource="configmaps"} 1' in rendered
            await until(lambda: len(client.watches) == 3)  # watching again after the relist
            assert client.watches[2] == inf.resource_version
            nursery.cancel_scope.cancel()


async def test_resync_replays_the_cache_as_updates(h: Harness) -> None:
    client = GatedClient(h)
    with trio.fail_after(30):
        await client.create(CONFIGMAPS, cm("r"))
        inf = SharedInformer(client, CONFIGMAPS, "default", resync=0.05, metrics=Registry())
        updates: list[tuple[Obj, Obj]] = []
        inf.add_event_handler(on_update=lambda old, new: updates.append((old, new)))
        async with trio.open_nursery() as nursery:
            await nursery.start(inf.run)
            await until(lambda: len(updates) >= 2)
            old, new = updates[0]
            assert old is new  # same state, same resourceVersion: only a resync delivers it
            nursery.cancel_scope.cancel()


async def test_indexers(h: Harness) -> None:
    client = GatedClient(h)
    with trio.fail_after(30):
        await client.create(NODES, {"metadata": {"name": "n1"}})
        owner = await client.create(CONFIGMAPS, cm("owner"))
        ref = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": "owner",
            "uid": owner["metadata"]["uid"],
            "controller": True,
        }
        for name in ("p1", "p2"):
            await client.create(
                PODS,
                {
                    "metadata": {
                        "name": name,
                        "namespace": "default",
                        "labels": {"app": name},
                        "ownerReferences": [ref] if name == "p1" else [],
                    },
                    "spec": {"containers": [{"name": "c", "image": "i"}]},
                },
            )
        inf = SharedInformer(client, PODS, metrics=Registry())
        inf.add_indexer("image", lambda o: [c["image"] for c in o["spec"]["containers"]])
        with pytest.raises(ValueError, match="already exists"):
            inf.add_indexer("image", lambda o: [])
        async with trio.open_nursery() as nursery:
            await nursery.start(inf.run)

            def names(index: str, value: str) -> list[str]:
                return [o["metadata"]["name"] for o in inf.by_index(index, value)]

            assert names(NAMESPACE_INDEX, "default") == ["p1", "p2"]
            assert names(OWNER_INDEX, owner["metadata"]["uid"]) == ["p1"]
            assert names(LABEL_INDEX, "app=p2") == ["p2"]
            assert names("image", "i") == ["p1", "p2"]
            assert names(NODE_NAME_INDEX, "n1") == []

            p2 = inf.get("default/p2")
            assert p2 is not None
            await client.bind(p2, "n1")
            await client.patch(PODS, "p2", {"metadata": {"labels": {"app": "moved"}}}, "default")
            await until(lambda: names(LABEL_INDEX, "app=moved") == ["p2"])
            assert names(NODE_NAME_INDEX, "n1") == ["p2"]
            assert names(LABEL_INDEX, "app=p2") == []
            await client.delete(PODS, "p1", "default", grace_period_seconds=0)
            await until(lambda: names(OWNER_INDEX, owner["metadata"]["uid"]) == [])
            nursery.cancel_scope.cancel()


async def test_factory_shares_one_informer_per_resource(h: Harness) -> None:
    client = GatedClient(h)
    factory = InformerFactory(client, metrics=Registry())
    one = factory.informer(CONFIGMAPS, "default")
    assert factory.informer(CONFIGMAPS, "default") is one
    assert factory.informer(CONFIGMAPS, "default", "app=x") is not one
    assert factory.informer(CONFIGMAPS) is not one
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            factory.start(nursery)
            factory.start(nursery)  # idempotent
            await factory.wait_for_cache_sync()
            assert one.has_synced
            nursery.cancel_scope.cancel()


def test_strip_managed_fields_copies_only_what_it_changes() -> None:
    obj = {"metadata": {"name": "a", "managedFields": [{"manager": "m"}]}, "spec": {"x": 1}}
    stripped = strip_managed_fields(obj)
    assert stripped == {"metadata": {"name": "a"}, "spec": {"x": 1}}
    assert stripped["spec"] is obj["spec"]  # shared, not copied
    assert obj["metadata"]["managedFields"] == [{"manager": "m"}]  # the original is untouched
    bare = {"metadata": {"name": "b"}}
    assert strip_managed_fields(bare) is bare


async def test_transform_applies_to_the_cache_and_the_handlers(h: Harness) -> None:
    client = GatedClient(h)
    with trio.fail_after(30):
        await client.create(CONFIGMAPS, cm("a"))
        inf = SharedInformer(
            client, CONFIGMAPS, "default", metrics=Registry(), transform=strip_managed_fields
        )
        seen: list[Obj] = []
        inf.add_event_handler(
            on_add=seen.append,
            on_update=lambda _old, new: seen.append(new),
            on_delete=lambda o: seen.append(deleted_object(o)),
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(inf.run)
            await client.create(CONFIGMAPS, cm("b"))
            await client.patch(CONFIGMAPS, "a", {"data": {"k": "v"}}, "default")
            await client.delete(CONFIGMAPS, "b", "default")
            await until(lambda: len(seen) == 4)
            assert all("managedFields" not in o["metadata"] for o in seen)
            a = inf.get("default/a")
            assert a is not None
            assert "managedFields" not in a["metadata"]
            assert a["data"] == {"k": "v"}
            stored = await client.get(CONFIGMAPS, "a", "default")
            assert stored["metadata"]["managedFields"]  # the server still has them
            nursery.cancel_scope.cancel()
