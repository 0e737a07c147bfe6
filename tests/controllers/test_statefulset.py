"""StatefulSet controller: against the in-process server (which runs `default_controllers`,
the scheduler included) with simulated nodes; plus the pure planner."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import trio
from api.apiharness import Harness, api_server
from workloadkit import Nodes, PodWatch, admin, is_ready, terminating, until

from orchestrator.client.resource import PODS, STATEFULSETS
from orchestrator.controllers.runtime.inprocess import InProcessClient
from orchestrator.controllers.statefulset import (
    POD_INDEX_LABEL,
    POD_NAME_LABEL,
    plan_statefulset,
    stateful_pod,
)

Obj = dict[str, Any]
NS = "default"
HASH = "controller-revision-hash"


def statefulset(name: str = "web", replicas: int = 3, **spec: Any) -> Obj:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "web", "image": "web:1"}]},
            },
            **spec,
        },
    }


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    async with api_server() as harness:
        yield harness


async def live_pods(c: InProcessClient, name: str = "web") -> dict[str, Obj]:
    listed = await c.list(PODS, NS, label_selector=f"app={name}")
    return {p["metadata"]["name"]: p for p in listed.get("items") or [] if not terminating(p)}


async def settled(c: InProcessClient, n: int, name: str = "web") -> bool:
    """Pods <name>-0..n-1, all ready, at the update revision, and a status that says so."""
    pods = await live_pods(c, name)
    if set(pods) != {f"{name}-{i}" for i in range(n)} or not all(map(is_ready, pods.values())):
        return False
    sts = await c.get(STATEFULSETS, name, NS)
    st = sts.get("status") or {}
    return (
        st.get("observedGeneration") == sts["metadata"]["generation"]
        and st.get("replicas") == n
        and st.get("readyReplicas") == n
        and st.get("availableReplicas") == n
        and st.get("updatedReplicas") == n
        and st.get("currentReplicas") == n
        and st.get("currentRevision") == st.get("updateRevision")
        and {p["metadata"]["labels"][HASH] for p in pods.values()} <= {st.get("updateRevision")}
    )


def ordered_creation(name: str = "web") -> Callable[[dict[str, Obj]], None]:
    """A PodWatch check: `<name>-k` appears only once `<name>-0..k-1` are Running and Ready."""
    seen: set[str] = set()

    def check(pods: dict[str, Obj]) -> None:
        for pod_name in set(pods) - seen:
            seen.add(pod_name)
            k = int(pod_name.rsplit("-", 1)[1])
            for i in range(k):
                before = pods.get(f"{name}-{i}")
                assert before is not None, f"{pod_name} created before {name}-{i} exists"
                assert is_ready(before), f"{pod_name} created before {name}-{i} was ready"

    return check


# ------------------------------------------------------------------------------ end to end
async def test_ordered_creation_stable_identity_and_reverse_scale_down(h: Harness) -> None:
    c = admin(h)
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            nodes = Nodes(h, nursery)
            await nodes.join("edge-a", start_delay=0.2)  # pods become Ready 0.2 s after binding
            watch = PodWatch(c, NS, ordered_creation())
            await nursery.start(watch.run)
            await c.create(STATEFULSETS, statefulset(replicas=3))
            await until(lambda: settled(c, 3))

            pods = await live_pods(c)
            for i in range(3):
                labels = pods[f"web-{i}"]["metadata"]["labels"]
                assert labels[POD_NAME_LABEL] == f"web-{i}"
                assert labels[POD_INDEX_LABEL] == str(i)
                assert pods[f"web-{i}"]["spec"]["hostname"] == f"web-{i}"
                assert pods[f"web-{i}"]["spec"]["subdomain"] == "web"
            added = [n for t, n in watch.history if t == "ADDED"]
            assert added == ["web-0", "web-1", "web-2"]

            # Scale down: web-2 goes before web-1, each only after the previous one is gone.
            start = len(watch.history)
            await c.patch(STATEFULSETS, "web", {"spec": {"replicas": 1}}, NS)
            await until(lambda: settled(c, 1))
            deleted = [n for t, n in watch.history[start:] if t == "DELETED"]
            assert deleted == ["web-2", "web-1"]
            nursery.cancel_scope.cancel()


async def test_deleted_pod_is_recreated_with_the_same_name(h: Harness) -> None:
    c = admin(h)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nodes = Nodes(h, nursery)
            await nodes.join("edge-a")
            await c.create(STATEFULSETS, statefulset(replicas=2))
            await until(lambda: settled(c, 2))
            old_uid = (await live_pods(c))["web-1"]["metadata"]["uid"]
            await c.delete(PODS, "web-1", NS)

            async def replaced() -> bool:
                pod = (await live_pods(c)).get("web-1")
                return pod is not None and pod["metadata"]["uid"] != old_uid

            await until(replaced)
            await until(lambda: settled(c, 2))
            nursery.cancel_scope.cancel()


async def test_rolling_update_highest_ordinal_first_with_partition(h: Harness) -> None:
    c = admin(h)
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            nodes = Nodes(h, nursery)
            await nodes.join("edge-a")
            await nodes.join("edge-b")
            ru = {"type": "RollingUpdate", "rollingUpdate": {"partition": 1}}
            await c.create(STATEFULSETS, statefulset(replicas=3, updateStrategy=ru))
            await until(lambda: settled(c, 3))
            old_rev = (await c.get(STATEFULSETS, "web", NS))["status"]["currentRevision"]

            def one_down_at_a_time(pods: dict[str, Obj]) -> None:
                down = [n for n, p in pods.items() if not is_ready(p) or terminating(p)]
                down += [f"web-{i}" for i in range(3) if f"web-{i}" not in pods]
                assert len(set(down)) <= 1, f"more than one pod down: {down}"

            watch = PodWatch(c, NS, one_down_at_a_time)
            await nursery.start(watch.run)
            v2 = [{"name": "web", "image": "web:2"}]
            await c.patch(
                STATEFULSETS, "web", {"spec": {"template": {"spec": {"containers": v2}}}}, NS
            )

            async def partially_updated() -> bool:
                sts = await c.get(STATEFULSETS, "web", NS)
                st = sts.get("status") or {}
                pods = await live_pods(c)
                images = {n: p["spec"]["containers"][0]["image"] for n, p in pods.items()}
                return (
                    images == {"web-0": "web:1", "web-1": "web:2", "web-2": "web:2"}
                    and all(map(is_ready, pods.values()))
                    and st.get("updatedReplicas") == 2
                    and st.get("currentReplicas") == 1
                    and st.get("currentRevision") == old_rev
                    and st.get("updateRevision") != old_rev
                )

            await until(partially_updated)
            deleted = [n for t, n in watch.history if t == "DELETED"]
            assert deleted == ["web-2", "web-1"]  # highest ordinal first, web-0 kept

            # Dropping the partition finishes the rollout; currentRevision catches up.
            patch = {"spec": {"updateStrategy": {"rollingUpdate": {"partition": 0}}}}
            await c.patch(STATEFULSETS, "web", patch, NS)
            await until(lambda: settled(c, 3))
            assert [n for t, n in watch.history if t == "DELETED"] == ["web-2", "web-1", "web-0"]
            st = (await c.get(STATEFULSETS, "web", NS))["status"]
            assert st["currentRevision"] != old_rev
            nursery.cancel_scope.cancel()


async def test_on_delete_and_parallel_policy(h: Harness) -> None:
    c = admin(h)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nodes = Nodes(h, nursery)
            await nodes.join("edge-a", start_delay=0.5)
            first_ready_saw: list[set[str]] = []

            def record(pods: dict[str, Obj]) -> None:
                if not first_ready_saw and any(map(is_ready, pods.values())):
                    first_ready_saw.append(set(pods))

            watch = PodWatch(c, NS, record)
            await nursery.start(watch.run)
            sts = statefulset(
                replicas=3, podManagementPolicy="Parallel", updateStrategy={"type": "OnDelete"}
            )
            await c.create(STATEFULSETS, sts)
            await until(lambda: settled(c, 3))
            # Parallel: all three existed before the first one was ready.
            assert first_ready_saw == [{"web-0", "web-1", "web-2"}]

            v2 = [{"name": "web", "image": "web:2"}]
            await c.patch(
                STATEFULSETS, "web", {"spec": {"template": {"spec": {"containers": v2}}}}, NS
            )

            async def observed() -> bool:
                sts = await c.get(STATEFULSETS, "web", NS)
                st = sts.get("status") or {}
                return bool(st.get("observedGeneration") == sts["metadata"]["generation"])

            await until(observed)
            pods = await live_pods(c)
            assert {p["spec"]["containers"][0]["image"] for p in pods.values()} == {"web:1"}
            await c.delete(PODS, "web-1", NS)

            async def web1_updated() -> bool:
                pod = (await live_pods(c)).get("web-1")
                return pod is not None and pod["spec"]["containers"][0]["image"] == "web:2"

            await until(web1_updated)
            pods = await live_pods(c)
            assert pods["web-0"]["spec"]["containers"][0]["image"] == "web:1"
            assert pods["web-2"]["spec"]["containers"][0]["image"] == "web:1"
            nursery.cancel_scope.cancel()


# ------------------------------------------------------------------------------ pure core
def sts_obj(**spec: Any) -> Obj:
    sts = statefulset(**spec)
    sts["metadata"].update(uid="u1", generation=2)
    return sts


def pod(sts: Obj, ordinal: int, revision: str, *, ready: bool = True) -> Obj:
    p = stateful_pod(sts, sts["spec"]["template"], ordinal, revision)
    p["metadata"]["uid"] = f"uid-{ordinal}"
    cond = {"type": "Ready", "status": "True" if ready else "False"}
    p["status"] = {"phase": "Running", "conditions": [cond]}
    return p


def test_plan_ordered_ready_creates_one_at_a_time() -> None:
    sts = sts_obj(replicas=3)
    rev = plan_statefulset(sts, [], 0).update_revision
    assert plan_statefulset(sts, [], 0).create == [(0, rev)]
    assert plan_statefulset(sts, [pod(sts, 0, rev, ready=False)], 0).create == []
    assert plan_statefulset(sts, [pod(sts, 0, rev)], 0).create == [(1, rev)]
    parallel = sts_obj(replicas=3, podManagementPolicy="Parallel")
    assert [o for o, _ in plan_statefulset(parallel, [], 0).create] == [0, 1, 2]


def test_plan_scale_down_and_update_order() -> None:
    sts = sts_obj(replicas=1)
    rev = plan_statefulset(sts, [], 0).update_revision
    pods = [pod(sts, i, rev) for i in range(3)]
    assert [p["metadata"]["name"] for p in plan_statefulset(sts, pods, 0).delete] == ["web-2"]
    ru = {"type": "RollingUpdate", "rollingUpdate": {"partition": 1}}
    sts = sts_obj(replicas=3, updateStrategy=ru)
    old = [pod(sts, i, "web-old") for i in range(3)]
    plan = plan_statefulset(sts, old, 0)
    assert [p["metadata"]["name"] for p in plan.delete] == ["web-2"]
    rev = plan.update_revision
    done = [pod(sts, 0, "web-old"), pod(sts, 1, rev), pod(sts, 2, rev)]
    plan = plan_statefulset(sts, done, 0)
    assert plan.delete == []
    assert plan.create == []
    assert plan.status["updatedReplicas"] == 2
    # A pod below the partition is re-created at the current revision when it is known.
    sts["status"] = {"currentRevision": "web-old"}
    assert plan_statefulset(sts, done[1:], 0, ["web-old"]).create == [(0, "web-old")]
    assert plan_statefulset(sts, done[1:], 0).create == [(0, rev)]
