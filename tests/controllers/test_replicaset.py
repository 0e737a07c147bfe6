"""ReplicaSet controller: pure parts (slow start, deletion ranking, expectations, claims), and
end to end on the in-process server (registered in `default_controllers`): scale up/down,
replacing a deleted pod, status, expectations under a burst of syncs and a frozen cache,
adopting orphans and releasing pods that stop matching, ReplicaFailure on failed creates."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
import trio.lowlevel
from api.apiharness import Harness, api_server
from ctlharness import controller_server
from workloads import admin_client, patch, start_nodes, until_async

from orchestrator.controllers.podutil import (
    ORPHAN_INDEX,
    Expectations,
    claim,
    is_pod_available,
    orphan_namespace,
    pod_template_hash,
    safe_encode,
)
from orchestrator.controllers.replicaset import (
    ReplicaSetReconciler,
    deletion_rank,
    slow_start_batches,
)
from orchestrator.controllers.runtime.client import PODS, REPLICASETS
from orchestrator.controllers.runtime.controller import Controller
from orchestrator.controllers.runtime.informer import NAMESPACE_INDEX, OWNER_INDEX, object_key
from orchestrator.controllers.runtime.inprocess import InProcessClient
from orchestrator.kube.errors import ApiError
from orchestrator.kube.selectors import parse_label_selector

Obj = dict[str, Any]
NS = "default"


# ---------------------------------------------------------------------------------- pure parts
def test_slow_start_batches() -> None:
    assert slow_start_batches(0) == []
    assert slow_start_batches(1) == [1]
    assert slow_start_batches(10) == [1, 2, 4, 3]
    assert slow_start_batches(500) == [1, 2, 4, 8, 16, 32, 64, 128, 245]


def _pod(name: str, **kw: Any) -> Obj:
    status: Obj = {"phase": kw.get("phase", "Running")}
    if kw.get("ready"):
        status["conditions"] = [
            {
                "type": "Ready",
                "status": "True",
                "lastTransitionTime": kw.get("ready_at", "2025-01-01T00:00:00Z"),
            }
        ]
    if kw.get("restarts"):
        status["containerStatuses"] = [{"name": "c", "restartCount": kw["restarts"]}]
    meta: Obj = {
        "name": name,
        "namespace": NS,
        "uid": f"uid-{name}",
        "creationTimestamp": kw.get("created", "2025-01-01T00:00:00Z"),
        "labels": kw.get("labels", {"app": "x"}),
    }
    if "cost" in kw:
        meta["annotations"] = {"controller.kubernetes.io/pod-deletion-cost": str(kw["cost"])}
    if "owner" in kw:
        meta["ownerReferences"] = [{"uid": kw["owner"], "controller": True, "kind": "ReplicaSet"}]
    spec: Obj = {"nodeName": kw["node"]} if kw.get("node") else {}
    return {"metadata": meta, "spec": spec, "status": status}


def test_deletion_rank_follows_upstream_order() -> None:
    pods = [
        _pod("ready-old", node="n1", ready=True, ready_at="2025-01-01T00:00:00Z"),
        _pod("ready-new", node="n2", ready=True, ready_at="2025-01-01T00:05:00Z"),
        _pod("unscheduled", phase="Pending"),
        _pod("pending", node="n3", phase="Pending"),
        _pod("running-unready", node="n4"),
        _pod("cheap", node="n5", ready=True, cost=-10),
    ]
    order = [p["metadata"]["name"] for p in deletion_rank(pods)]
    assert order == ["unscheduled", "pending", "running-unready", "cheap", "ready-new", "ready-old"]


def test_deletion_rank_ties() -> None:
    crowded = [_pod(f"c{i}", node="busy", ready=True) for i in range(2)]
    alone = _pod("alone", node="quiet", ready=True)
    restarts = _pod("restarty", node="r", ready=True, restarts=3)
    newer = _pod("newer", node="s", ready=True, created="2025-01-02T00:00:00Z")
    order = [p["metadata"]["name"] for p in deletion_rank([alone, *crowded, restarts, newer])]
    assert order[:2] == ["c0", "c1"]  # more siblings on the same node first
    assert order[2:] == ["restarty", "newer", "alone"]


def test_availability_needs_min_ready_seconds() -> None:
    pod = _pod("p", ready=True, ready_at="2025-01-01T00:00:00Z")
    t0 = 1735689600.0  # 2025-01-01T00:00:00Z
    assert is_pod_available(pod, 0, t0)
    assert not is_pod_available(pod, 10, t0 + 9)
    assert is_pod_available(pod, 10, t0 + 10)
    assert not is_pod_available(_pod("q"), 0, t0)


def test_template_hash_is_stable_and_safe() -> None:
    template = {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [{"name": "c"}]}}
    same = {"spec": {"containers": [{"name": "c"}]}, "metadata": {"labels": {"app": "x"}}}
    h = pod_template_hash(template)
    assert h == pod_template_hash(same)
    assert h != pod_template_hash(template, 1)
    # A decimal uint32 spelled in the safe alphabet: the characters of upstream's "7c5ddbdf54".
    assert set(h) <= set("456789bcdf")
    assert 1 <= len(h) <= 10
    assert safe_encode("0123456789") == "456789bcdf"


class FakeCache:
    """A cache a test controls: frozen unless the test changes it (a lagging watch)."""

    def __init__(self, objs: list[Obj] | None = None, rv: str = "0") -> None:
        self.objs = {object_key(o): o for o in objs or []}
        self.resource_version = rv

    def get(self, key: str) -> Obj | None:
        return self.objs.get(key)

    def by_index(self, name: str, value: str) -> list[Obj]:
        out = []
        for o in self.objs.values():
            m = o["metadata"]
            if name == NAMESPACE_INDEX and m.get("namespace") == value:
                out.append(o)
            if name == ORPHAN_INDEX and orphan_namespace(o) == [value]:
                out.append(o)
            if name == OWNER_INDEX and any(
                r.get("controller") and r.get("uid") == value
                for r in m.get("ownerReferences") or []
            ):
                out.append(o)
        return out


def test_expectations_are_checked_against_the_cache() -> None:
    exp = Expectations(timeout=300)
    cache = FakeCache(rv="10")
    assert exp.satisfied("ns/rs", cache, 0)
    exp.created("ns/rs", "12", 0)
    assert not exp.satisfied("ns/rs", cache, 1)
    cache.resource_version = "12"
    assert exp.satisfied("ns/rs", cache, 1)
    assert not exp.pending("ns/rs")

    victim = _pod("v")
    cache.objs[object_key(victim)] = victim
    exp.deleted("ns/rs", object_key(victim), "uid-v", 2)
    assert not exp.satisfied("ns/rs", cache, 3)
    victim["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"  # terminating counts
    assert exp.satisfied("ns/rs", cache, 3)

    exp.created("ns/rs", "99", 10)
    assert not exp.satisfied("ns/rs", cache, 309)
    assert exp.satisfied("ns/rs", cache, 310)  # expired after 5 minutes


def test_claim_adopts_releases_and_leaves_others() -> None:
    owner = {"metadata": {"uid": "me", "name": "rs"}}
    sel = parse_label_selector("app=x")
    mine = _pod("mine", owner="me")
    stray = _pod("stray", owner="me", labels={"app": "y"})
    orphan = _pod("orphan")
    other = _pod("other", owner="someone")
    deleting = _pod("deleting")
    deleting["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    c = claim(owner, sel, [mine, stray, orphan, other, deleting])
    assert [p["metadata"]["name"] for p in c.owned] == ["mine", "orphan"]
    assert [p["metadata"]["name"] for p in c.adopt] == ["orphan"]
    assert [p["metadata"]["name"] for p in c.release] == ["stray"]


# ---------------------------------------------------------------------------------- end to end
@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    async with api_server() as harness:
        yield harness


def replicaset(name: str, replicas: int, *, app: str = "web", **spec: Any) -> Obj:
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": app}},
            "template": {
                "metadata": {"labels": {"app": app}},
                "spec": {"containers": [{"name": "c", "image": "nginx:1"}]},
            },
            **spec,
        },
    }


async def owned_pods(client: InProcessClient, rs: Obj, *, active_only: bool = True) -> list[Obj]:
    uid = rs["metadata"]["uid"]
    items = (await client.list(PODS, NS))["items"]
    out = []
    for p in items:
        refs = p["metadata"].get("ownerReferences") or []
        if any(r.get("uid") == uid and r.get("controller") for r in refs) and (
            not active_only or not p["metadata"].get("deletionTimestamp")
        ):
            out.append(p)
    return out


async def wait_status(client: InProcessClient, name: str, **want: int) -> Obj:
    async def check() -> Obj | None:
        rs = await client.get(REPLICASETS, name, NS)
        st = rs.get("status") or {}
        if st.get("observedGeneration") != rs["metadata"]["generation"]:
            return None
        ok = all(int(st.get(k) or 0) == v for k, v in want.items())
        return rs if ok else None

    result: Obj = await until_async(check)
    return result


async def test_scale_up_down_and_replace(h: Harness) -> None:
    client = admin_client(h)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await start_nodes(nursery, h)
            rs = await client.create(REPLICASETS, replicaset("web", 3))
            rs = await wait_status(
                client, "web", replicas=3, readyReplicas=3, availableReplicas=3,
                fullyLabeledReplicas=3,
            )  # fmt: skip
            pods = await owned_pods(client, rs)
            assert len(pods) == 3
            for p in pods:
                assert p["metadata"]["name"].startswith("web-")
                assert len(p["metadata"]["name"]) == len("web-") + 5
                (ref,) = p["metadata"]["ownerReferences"]
                assert ref == {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "web",
                    "uid": rs["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
                assert p["metadata"]["labels"] == {"app": "web"}

            victim = pods[0]["metadata"]["name"]
            await client.delete(PODS, victim, NS)

            async def replaced() -> set[str] | None:
                names = {p["metadata"]["name"] for p in await owned_pods(client, rs)}
                return names if victim not in names and len(names) == 3 else None

            await until_async(replaced)
            await wait_status(client, "web", replicas=3, readyReplicas=3)

            await patch(client, REPLICASETS, "web", {"spec": {"replicas": 5}}, NS)
            await wait_status(client, "web", replicas=5, availableReplicas=5)
            await patch(client, REPLICASETS, "web", {"spec": {"replicas": 1}}, NS)
            await wait_status(client, "web", replicas=1, availableReplicas=1)
            assert len(await owned_pods(client, rs)) == 1
            await patch(client, REPLICASETS, "web", {"spec": {"replicas": 0}}, NS)
            await wait_status(client, "web", replicas=0)
            assert await owned_pods(client, rs) == []
            nursery.cancel_scope.cancel()


# ---------------------------------------------------------------------------------- expectations
class FakeClient:
    """Records writes; creates succeed `ok` times, then fail (a quota, say)."""

    def __init__(self, ok: int) -> None:
        self.ok = ok
        self.creates = 0
        self.rv = 100
        self.statuses: list[Obj] = []

    async def create(
        self, res: Any, body: Obj, namespace: str = "", *, read_only: bool = False
    ) -> Obj:
        await trio.lowlevel.checkpoint()
        self.creates += 1
        if self.creates > self.ok:
            raise ApiError(403, "Forbidden", 'pods "x" is forbidden: exceeded quota')
        self.rv += 1
        meta = {**body["metadata"], "name": f"p{self.rv}", "resourceVersion": str(self.rv)}
        return {**body, "metadata": meta}

    async def update(self, res: Any, body: Obj, *, subresource: str = "") -> Obj:
        await trio.lowlevel.checkpoint()
        self.statuses.append(body["status"])
        return body


def ghost(replicas: int, uid: str = "ghost-uid") -> Obj:
    """A ReplicaSet only a test's fake cache knows about (the server's controller never sees it)."""
    rs = replicaset("ghost", replicas, app="ghost")
    rs["metadata"].update(uid=uid, generation=1, resourceVersion="1")
    return rs


async def test_slow_start_stops_at_the_first_failing_batch() -> None:
    rs = ghost(10)
    client = FakeClient(ok=3)
    pods = FakeCache()
    rec = ReplicaSetReconciler(client, FakeCache([rs]), pods)  # type: ignore[arg-type]
    with pytest.raises(ApiError, match="exceeded quota"):
        await rec.reconcile("default/ghost")
    assert client.creates == 1 + 2 + 4  # the batch of 4 failed: the last batch never ran
    (status,) = client.statuses
    (cond,) = status["conditions"]
    assert cond["type"] == "ReplicaFailure"
    assert cond["status"] == "True"
    assert cond["reason"] == "FailedCreate"
    assert "exceeded quota" in cond["message"]
    # The 3 pods that were created are expected: a sync on the lagging cache creates nothing.
    await rec.reconcile("default/ghost")
    assert client.creates == 7


async def test_lagging_cache_never_double_creates() -> None:
    # A server running no controllers (no GC to collect pods of this cache-only ReplicaSet).
    async with controller_server(lambda ctx: [Idle()]) as env:
        await _lagging_cache(env.client)


class Idle:
    """A component that does nothing (the harness waits for at least one)."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await trio.sleep_forever()


async def _lagging_cache(client: InProcessClient) -> None:
    rs = ghost(3, uid="lagging-uid")
    pods = FakeCache(rv="0")  # a watch that has seen nothing yet
    rec = ReplicaSetReconciler(client, FakeCache([rs]), pods)
    with trio.fail_after(30):
        await rec.reconcile("default/ghost")
        for _ in range(5):  # a burst of syncs while the watch lags
            result = await rec.reconcile("default/ghost")
            assert result.requeue_after > 0  # back when the expectations expire, at the latest
        created = await owned_pods(client, rs)
        assert len(created) == 3

        listed = await client.list(PODS, NS)
        pods.objs = {object_key(p): p for p in created}
        pods.resource_version = listed["metadata"]["resourceVersion"]  # the watch caught up
        await rec.reconcile("default/ghost")
        assert len(await owned_pods(client, rs)) == 3

        rs["spec"]["replicas"] = 1
        for _ in range(3):  # deletes, then syncs on a cache that still shows the victims
            await rec.reconcile("default/ghost")
        assert len(await owned_pods(client, rs)) == 1


async def test_burst_of_syncs_creates_exactly(h: Harness) -> None:
    client = admin_client(h)
    manager = h.server.controllers
    assert manager is not None
    with trio.fail_after(60):
        await until_async(_async_true(lambda: bool(manager.controllers)))
        (controller,) = [
            c for c in manager.controllers if isinstance(c, Controller) and c.name == "replicaset"
        ]
        rs = await client.create(REPLICASETS, replicaset("burst", 20, app="burst"))
        for _ in range(50):
            controller.enqueue("default/burst")
            await trio.lowlevel.checkpoint()
        await wait_status(client, "burst", replicas=20)
        for _ in range(20):
            controller.enqueue("default/burst")
            await trio.sleep(0.005)
        assert len(await owned_pods(client, rs)) == 20


def _async_true(predicate: Any) -> Any:
    async def check() -> bool:
        await trio.lowlevel.checkpoint()
        return bool(predicate())

    return check


async def test_adopts_orphans_and_releases_pods_that_stop_matching(h: Harness) -> None:
    client = admin_client(h)
    rng = random.Random(7)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await start_nodes(nursery, h)
            orphans = []
            for i in range(2):
                pod = {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": f"orphan-{i}-{rng.randrange(1000)}", "namespace": NS,
                                 "labels": {"app": "adopt"}},
                    "spec": {"containers": [{"name": "c", "image": "nginx:1"}]},
                }  # fmt: skip
                orphans.append((await client.create(PODS, pod))["metadata"]["name"])
            rs = await client.create(REPLICASETS, replicaset("adopter", 3, app="adopt"))
            await wait_status(client, "adopter", replicas=3, readyReplicas=3)
            names = {p["metadata"]["name"] for p in await owned_pods(client, rs)}
            assert len(names) == 3
            assert set(orphans) <= names  # adopted, so only one pod was created

            released = orphans[0]
            await patch(client, PODS, released, {"metadata": {"labels": {"app": "gone"}}}, NS)

            async def released_and_replaced() -> bool:
                pod = await client.get(PODS, released, NS)
                owned = {p["metadata"]["name"] for p in await owned_pods(client, rs)}
                return not pod["metadata"].get("ownerReferences") and len(owned) == 3

            await until_async(released_and_replaced)
            await wait_status(client, "adopter", replicas=3, readyReplicas=3)
            assert released not in {p["metadata"]["name"] for p in await owned_pods(client, rs)}
            nursery.cancel_scope.cancel()
