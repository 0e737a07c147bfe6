"""Garbage collector: the graph core (pure) and, on a real server, background, foreground
(blockOwnerDeletion, chains), orphan propagation, owners recreated under another uid,
partial owner loss, custom resources from a CRD created after start, and a ReplicaSet's pods
collected together with the ReplicaSet controller."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from functools import partial
from typing import Any

import pytest
import trio
import trio.lowlevel
from ctlharness import Env, controller_server, eventually

from orchestrator.client import ResourceInfo
from orchestrator.controllers.deployment import deployment_controller
from orchestrator.controllers.gc import (
    FOREGROUND,
    GarbageCollector,
    Graph,
    garbage_collector,
)
from orchestrator.controllers.gc.graph import graph_facts
from orchestrator.controllers.replicaset import replicaset_controller
from orchestrator.controllers.runtime.client import CONFIGMAPS, DEPLOYMENTS, PODS, REPLICASETS
from orchestrator.controllers.runtime.informer import DeletedFinalStateUnknown
from orchestrator.controllers.runtime.manager import Component, ControllerContext

Obj = dict[str, Any]
NS = "default"


# ------------------------------------------------------------------------------ graph (pure)
def obj(uid: str, *owners: tuple[str, bool], kind: str = "ConfigMap", **meta: Any) -> Obj:
    refs = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": f"n-{o}",
            "uid": o,
            "blockOwnerDeletion": block,
        }
        for o, block in owners
    ]
    m: Obj = {"name": f"n-{uid}", "namespace": NS, "uid": uid, **meta}
    if refs:
        m["ownerReferences"] = refs
    return {"apiVersion": "v1", "kind": kind, "metadata": m}


def links_hold(g: Graph) -> None:
    """b in nodes[a].dependents iff a is one of b's owners (for b in the graph)."""
    for uid, node in g.nodes.items():
        for ref in node.owners:
            if ref.uid in g.nodes:
                assert uid in g.nodes[ref.uid].dependents
        for dep in node.dependents:
            if dep in g.nodes:
                assert any(r.uid == uid for r in g.nodes[dep].owners)
        if node.virtual:
            assert node.dependents


def test_graph_virtual_owner_then_observed_then_deleted() -> None:
    g = Graph(lambda _av, _k: True)
    work = g.observe(obj("d", ("o", False)))
    assert g.nodes["o"].virtual
    assert g.nodes["o"].namespace == NS
    assert work.delete == {"o"}  # verify the virtual owner
    links_hold(g)
    g.observe(obj("o"))
    assert not g.nodes["o"].virtual
    work = g.forget(DeletedFinalStateUnknown(f"{NS}/n-o", obj("o")))
    assert work.delete == {"d"}
    assert "o" not in g.nodes
    assert g.is_absent("o")
    links_hold(g)
    # a new dependent of an owner known to be absent is looked at at once, no virtual node
    work = g.observe(obj("d2", ("o", False)))
    assert work.delete == {"d2"}
    assert "o" not in g.nodes


def test_graph_transitions_enqueue_foreground_and_orphan() -> None:
    g = Graph(lambda _av, _k: True)
    g.observe(obj("o"))
    g.observe(obj("a", ("o", True)))
    g.observe(obj("b", ("o", False)))
    work = g.observe(obj("o", deletionTimestamp="t", finalizers=[FOREGROUND]))
    assert work.delete == {"o", "a", "b"}
    assert not work.orphan
    assert [d.uid for d in g.nodes["o"].blocking_dependents(g)] == ["a"]
    # the blocking dependent goes: the owner is looked at again
    assert g.forget(obj("a", ("o", True))).delete == {"o"}
    assert g.nodes["o"].blocking_dependents(g) == []
    work = g.observe(obj("p", deletionTimestamp="t", finalizers=["orphan"]))
    assert work.orphan == {"p"}
    # dropping an owner reference unlinks it, and a virtual owner without dependents goes
    g.observe(obj("c", ("v", False)))
    assert g.nodes["v"].virtual
    g.observe(obj("c"))
    assert "v" not in g.nodes
    links_hold(g)
    # a virtual owner verified absent: its dependents are looked at
    g.observe(obj("e", ("w", False)))
    assert g.remove_virtual("w").delete == {"e"}
    links_hold(g)


# ------------------------------------------------------------------------------ on a server
def gc_only(ctx: ControllerContext) -> Sequence[Component]:
    return [garbage_collector(ctx, workers=4, kinds_period=0.2)]


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    async with controller_server(gc_only) as e:
        yield e


def ref(owner: Obj, *, block: bool = False, controller: bool = True) -> Obj:
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": controller,
        "blockOwnerDeletion": block,
    }


async def cm(env: Env, name: str, *owners: Obj, **meta: Any) -> Obj:
    body = {"metadata": {"name": name, "namespace": NS, **meta}}
    if owners:
        body["metadata"]["ownerReferences"] = list(owners)
    return await env.client.create(CONFIGMAPS, body)


async def pod(env: Env, name: str, *owners: Obj, **meta: Any) -> Obj:
    body: Obj = {
        "metadata": {"name": name, "namespace": NS, **meta},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    if owners:
        body["metadata"]["ownerReferences"] = list(owners)
    return await env.client.create(PODS, body)


async def replicaset(env: Env, name: str, *owners: Obj, replicas: int = 0) -> Obj:
    labels = {"app": name}
    body: Obj = {
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            },
        },
    }
    if owners:
        body["metadata"]["ownerReferences"] = list(owners)
    return await env.client.create(REPLICASETS, body)


async def gone(env: Env, res: ResourceInfo, name: str) -> bool:
    return await env.get_or_none(res, name, NS) is None


async def test_background_deletes_dependents_after_owner(env: Env) -> None:
    with trio.fail_after(30):
        owner = await replicaset(env, "web")
        for i in range(3):
            await pod(env, f"web-{i}", ref(owner))
        await cm(env, "web-config", ref(owner, controller=False))
        keep = await cm(env, "unrelated")
        await env.client.delete(REPLICASETS, "web", NS)  # Background is the default
        for i in range(3):
            await eventually(partial(gone, env, PODS, f"web-{i}"))
        await eventually(lambda: gone(env, CONFIGMAPS, "web-config"))
        still = await env.get_or_none(CONFIGMAPS, "unrelated", NS)
        assert still is not None
        assert still["metadata"]["uid"] == keep["metadata"]["uid"]


async def test_owner_recreated_under_another_uid_does_not_count(env: Env) -> None:
    with trio.fail_after(30):
        first = await cm(env, "owner")
        await env.client.delete(CONFIGMAPS, "owner", NS)
        again = await cm(env, "owner")  # same name, new uid
        assert again["metadata"]["uid"] != first["metadata"]["uid"]
        dep = await cm(env, "dep", ref(first))  # points at the old one
        assert dep["metadata"]["ownerReferences"][0]["uid"] == first["metadata"]["uid"]
        await eventually(lambda: gone(env, CONFIGMAPS, "dep"))
        assert await env.get_or_none(CONFIGMAPS, "owner", NS) is not None


async def test_one_owner_gone_strips_its_reference(env: Env) -> None:
    with trio.fail_after(30):
        a = await cm(env, "a")
        b = await cm(env, "b")
        await cm(env, "dep", ref(a), ref(b, controller=False))
        await env.client.delete(CONFIGMAPS, "a", NS)

        async def stripped() -> bool:
            d = await env.get_or_none(CONFIGMAPS, "dep", NS)
            assert d is not None, "a dependent with a live owner must stay"
            refs = d["metadata"].get("ownerReferences") or []
            return [r["uid"] for r in refs] == [b["metadata"]["uid"]]

        await eventually(stripped)


async def test_foreground_waits_for_blocking_dependents(env: Env) -> None:
    with trio.fail_after(30):
        owner = await replicaset(env, "fg")
        await pod(env, "fg-0", ref(owner, block=True))
        # a blocking dependent that cannot go until its own finalizer is removed
        await pod(env, "fg-held", ref(owner, block=True), finalizers=["test/hold"])
        await pod(env, "fg-free", ref(owner, block=False))
        await env.client.delete(REPLICASETS, "fg", NS, propagation_policy="Foreground")

        async def held_terminating() -> bool:
            p = await env.get_or_none(PODS, "fg-held", NS)
            return p is not None and bool(p["metadata"].get("deletionTimestamp"))

        await eventually(held_terminating)
        await eventually(lambda: gone(env, PODS, "fg-0"))
        await eventually(lambda: gone(env, PODS, "fg-free"))
        rs = await env.get_or_none(REPLICASETS, "fg", NS)
        assert rs is not None, "the owner must wait for its blocking dependent"
        assert rs["metadata"]["deletionTimestamp"]
        assert FOREGROUND in rs["metadata"]["finalizers"]
        held = await env.client.get(PODS, "fg-held", NS)
        held["metadata"]["finalizers"] = []
        await env.client.update(PODS, held)
        await eventually(lambda: gone(env, PODS, "fg-held"))
        await eventually(lambda: gone(env, REPLICASETS, "fg"))


async def test_foreground_chain_deletes_bottom_up(env: Env) -> None:
    """Deployment-like chain: top -> RS (blocking, with dependents) -> pods (blocking)."""
    with trio.fail_after(30):
        top = await cm(env, "top")
        rs = await replicaset(env, "mid", ref(top, block=True))
        await pod(env, "leaf-0", ref(rs, block=True))
        await pod(env, "leaf-1", ref(rs, block=True), finalizers=["test/hold"])
        await env.client.delete(CONFIGMAPS, "top", NS, propagation_policy="Foreground")

        async def mid_foreground() -> bool:
            r = await env.get_or_none(REPLICASETS, "mid", NS)
            return r is not None and FOREGROUND in (r["metadata"].get("finalizers") or [])

        await eventually(mid_foreground)  # the RS has dependents: deleted in the foreground
        await eventually(lambda: gone(env, PODS, "leaf-0"))
        assert await env.get_or_none(CONFIGMAPS, "top", NS) is not None
        held = await env.client.get(PODS, "leaf-1", NS)
        held["metadata"]["finalizers"] = []
        await env.client.update(PODS, held)
        await eventually(lambda: gone(env, REPLICASETS, "mid"))
        await eventually(lambda: gone(env, CONFIGMAPS, "top"))


async def test_orphan_keeps_dependents_without_the_reference(env: Env) -> None:
    with trio.fail_after(30):
        owner = await replicaset(env, "orph")
        other = await cm(env, "other-owner")
        await pod(env, "orph-0", ref(owner))
        await pod(env, "orph-1", ref(owner), ref(other, controller=False))
        await env.client.delete(REPLICASETS, "orph", NS, propagation_policy="Orphan")
        await eventually(lambda: gone(env, REPLICASETS, "orph"))
        p0 = await env.client.get(PODS, "orph-0", NS)
        assert not p0["metadata"].get("ownerReferences")
        p1 = await env.client.get(PODS, "orph-1", NS)
        assert [r["uid"] for r in p1["metadata"]["ownerReferences"]] == [other["metadata"]["uid"]]


async def test_custom_resources_of_a_crd_created_after_start(env: Env) -> None:
    crd_res = ResourceInfo(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        False,
    )
    widgets = ResourceInfo("example.com", "v1", "widgets", "Widget", True)
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
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
    }
    with trio.fail_after(30):
        await env.client.create(crd_res, crd)
        owner = await cm(env, "widget-owner")
        w = {
            "apiVersion": "example.com/v1",
            "kind": "Widget",
            "metadata": {"name": "w1", "namespace": NS, "ownerReferences": [ref(owner)]},
        }
        await env.client.create(widgets, w)
        # and a ConfigMap owned by a Widget: custom kinds are owners too
        widget = await env.client.get(widgets, "w1", NS)
        await cm(env, "widget-dep", ref(widget))
        gc = env.manager.controllers[0]
        assert isinstance(gc, GarbageCollector)
        await eventually(lambda: _synced(gc, widgets))
        await env.client.delete(CONFIGMAPS, "widget-owner", NS)
        await eventually(lambda: gone(env, widgets, "w1"))
        await eventually(lambda: gone(env, CONFIGMAPS, "widget-dep"))


async def _synced(gc: GarbageCollector, res: ResourceInfo) -> bool:
    await trio.lowlevel.checkpoint()
    return gc.watching(res)


async def test_replicaset_and_its_pods_are_collected_together() -> None:
    def factory(ctx: ControllerContext) -> Sequence[Component]:
        return [garbage_collector(ctx, workers=4), replicaset_controller(ctx)]

    async with controller_server(factory) as env:
        with trio.fail_after(30):
            await replicaset(env, "rs", replicas=3)

            async def pods_owned() -> bool:
                listed = await env.client.list(PODS, NS, label_selector="app=rs")
                return len(listed["items"]) == 3

            await eventually(pods_owned)
            await env.client.delete(REPLICASETS, "rs", NS)

            async def no_pods() -> bool:
                listed = await env.client.list(PODS, NS, label_selector="app=rs")
                return not listed["items"]

            await eventually(no_pods)
            assert await env.get_or_none(REPLICASETS, "rs", NS) is None


async def test_deployment_deleted_with_each_policy() -> None:
    """Deployment -> ReplicaSet -> pods, made by the real controllers (pods stay Pending: no
    scheduler), deleted with Background, Foreground and Orphan."""

    def factory(ctx: ControllerContext) -> Sequence[Component]:
        return [
            garbage_collector(ctx, workers=4),
            deployment_controller(ctx),
            replicaset_controller(ctx),
        ]

    async def family(env: Env, app: str) -> tuple[list[Obj], list[Obj]]:
        rss = (await env.client.list(REPLICASETS, NS, label_selector=f"app={app}"))["items"]
        pods = (await env.client.list(PODS, NS, label_selector=f"app={app}"))["items"]
        return rss, pods

    async def deploy(env: Env, app: str) -> None:
        labels = {"app": app}
        await env.client.create(
            DEPLOYMENTS,
            {
                "metadata": {"name": app, "namespace": NS},
                "spec": {
                    "replicas": 2,
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
                    },
                },
            },
        )

        async def up() -> bool:
            rss, pods = await family(env, app)
            return len(rss) == 1 and len(pods) == 2

        await eventually(up)

    async with controller_server(factory) as env:
        with trio.fail_after(60):
            for app in ("bg", "fg", "orphan"):
                await deploy(env, app)
            await env.client.delete(DEPLOYMENTS, "bg", NS)
            await env.client.delete(DEPLOYMENTS, "fg", NS, propagation_policy="Foreground")
            await env.client.delete(DEPLOYMENTS, "orphan", NS, propagation_policy="Orphan")

            async def all_gone(app: str) -> bool:
                rss, pods = await family(env, app)
                d = await env.get_or_none(DEPLOYMENTS, app, NS)
                return d is None and not rss and not pods

            await eventually(partial(all_gone, "bg"))
            await eventually(partial(all_gone, "fg"))
            await eventually(partial(gone, env, DEPLOYMENTS, "orphan"))
            rss, pods = await family(env, "orphan")
            assert len(rss) == 1
            assert not rss[0]["metadata"].get("ownerReferences")
            assert len(pods) == 2  # still owned by their (orphaned) ReplicaSet
            assert all(
                p["metadata"]["ownerReferences"][0]["uid"] == rss[0]["metadata"]["uid"]
                for p in pods
            )


def test_updates_that_change_nothing_the_graph_holds_are_skipped() -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "d", "uid": "u1", "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "r1"}]},
        "status": {"phase": "Pending"},
    }  # fmt: skip
    running = {**pod, "status": {"phase": "Running"}}
    assert graph_facts(running) == graph_facts(pod)
    orphaned = {**pod, "metadata": {**pod["metadata"], "ownerReferences": []}}
    finalizing = {**pod, "metadata": {**pod["metadata"], "finalizers": ["foregroundDeletion"]}}
    deleting = {**pod, "metadata": {**pod["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}}
    for changed in (orphaned, finalizing, deleting):
        assert graph_facts(changed) != graph_facts(pod)
