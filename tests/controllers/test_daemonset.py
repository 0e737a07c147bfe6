"""DaemonSet controller: against the in-process server (which runs `default_controllers`) with
simulated nodes; plus the pure planner and eligibility rules."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
from api.apiharness import Harness, api_server
from workloadkit import Nodes, PodWatch, admin, is_ready, terminating, until

from orchestrator.client.resource import DAEMONSETS, NODES, PODS
from orchestrator.controllers.daemonset import (
    daemon_pod,
    intended_node,
    node_should_run,
    plan_daemonset,
)
from orchestrator.controllers.runtime.inprocess import InProcessClient
from orchestrator.scheduler import NodeInfo, PodInfo

Obj = dict[str, Any]
NS = "default"
HASH = "controller-revision-hash"


def daemonset(name: str = "agent", **spec: Any) -> Obj:
    template_spec: Obj = {"containers": [{"name": "agent", "image": "agent:1"}]}
    template_spec.update(spec.pop("pod", {}))
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": template_spec},
            **spec,
        },
    }


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    async with api_server() as harness:
        yield harness


async def pods_of(client: InProcessClient, name: str) -> list[Obj]:
    listed = await client.list(PODS, NS, label_selector=f"app={name}")
    return list(listed.get("items") or [])


async def nodes_with_ready_pod(client: InProcessClient, name: str) -> dict[str, Obj]:
    """node -> its one live, Ready pod (nodes with several live pods are left out)."""
    by_node: dict[str, list[Obj]] = {}
    for p in await pods_of(client, name):
        if not terminating(p):
            by_node.setdefault(p["spec"].get("nodeName", ""), []).append(p)
    return {n: ps[0] for n, ps in by_node.items() if len(ps) == 1 and is_ready(ps[0])}


async def status(client: InProcessClient, name: str) -> Obj:
    ds = await client.get(DAEMONSETS, name, NS)
    return dict(ds.get("status") or {})


async def settled(client: InProcessClient, name: str, nodes: set[str]) -> bool:
    """Exactly one Ready pod on each of `nodes`, none elsewhere, and the status says so."""
    live = [p for p in await pods_of(client, name) if not terminating(p)]
    ready = await nodes_with_ready_pod(client, name)
    if set(ready) != nodes or len(live) != len(nodes):
        return False
    st = await status(client, name)
    n = len(nodes)
    return (
        st.get("desiredNumberScheduled") == n
        and st.get("currentNumberScheduled") == n
        and st.get("numberReady") == n
        and st.get("numberAvailable") == n
        and st.get("updatedNumberScheduled") == n
        and st.get("numberMisscheduled") == 0
    )


async def rolled_out(c: InProcessClient, name: str, nodes: set[str], image: str) -> bool:
    images = {p["spec"]["containers"][0]["image"] for p in await pods_of(c, name)}
    return images == {image} and await settled(c, name, nodes)


# ------------------------------------------------------------------------------ end to end
async def test_follows_nodes_joining_and_leaving(h: Harness) -> None:
    c = admin(h)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nodes = Nodes(h, nursery)
            await nodes.join("edge-a")
            await nodes.join("edge-b")
            await c.create(DAEMONSETS, daemonset())
            await until(lambda: settled(c, "agent", {"edge-a", "edge-b"}))

            pod = (await nodes_with_ready_pod(c, "agent"))["edge-a"]
            assert pod["metadata"]["ownerReferences"][0]["kind"] == "DaemonSet"
            assert pod["metadata"]["labels"][HASH]
            assert intended_node(pod) == "edge-a"  # the upstream affinity term is there too
            tolerated = {t["key"] for t in pod["spec"]["tolerations"]}
            assert "node.kubernetes.io/unreachable" in tolerated

            await nodes.join("edge-c")
            await until(lambda: settled(c, "agent", {"edge-a", "edge-b", "edge-c"}))

            await nodes.leave("edge-b")
            await until(lambda: settled(c, "agent", {"edge-a", "edge-c"}))
            st = await status(c, "agent")
            ds = await c.get(DAEMONSETS, "agent", NS)
            assert st["observedGeneration"] == ds["metadata"]["generation"]
            nursery.cancel_scope.cancel()


async def test_node_selector_and_taints(h: Harness) -> None:
    c = admin(h)
    dedicated = {"key": "dedicated", "value": "infra", "effect": "NoSchedule"}
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nodes = Nodes(h, nursery)
            await nodes.join("edge-a", labels={"role": "edge"})
            await nodes.join("edge-b", labels={"role": "edge"}, taints=[dedicated])
            await nodes.join("core-c")
            await c.create(DAEMONSETS, daemonset(pod={"nodeSelector": {"role": "edge"}}))
            # edge-b has an untolerated NoSchedule taint, core-c the wrong labels.
            await until(lambda: settled(c, "agent", {"edge-a"}))

            # Tolerating the taint brings edge-b in.
            toleration = {"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}
            patch = {"spec": {"template": {"spec": {"tolerations": [toleration]}}}}
            await c.patch(DAEMONSETS, "agent", patch, NS)
            await until(lambda: settled(c, "agent", {"edge-a", "edge-b"}))

            # Labelling core-c brings it in; an untolerated NoExecute taint evicts from edge-a.
            await c.patch(NODES, "core-c", {"metadata": {"labels": {"role": "edge"}}})
            await until(lambda: settled(c, "agent", {"edge-a", "edge-b", "core-c"}))
            evict = {"key": "maintenance", "value": "now", "effect": "NoExecute"}
            await c.patch(NODES, "edge-a", {"spec": {"taints": [evict]}})
            await until(lambda: settled(c, "agent", {"edge-b", "core-c"}))
            nursery.cancel_scope.cancel()


async def test_rolling_update_node_by_node_within_max_unavailable(h: Harness) -> None:
    c = admin(h)
    names = {f"edge-{i}" for i in range(4)}
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            nodes = Nodes(h, nursery)
            for n in sorted(names):
                await nodes.join(n)
            await c.create(DAEMONSETS, daemonset())
            await until(lambda: settled(c, "agent", names))

            worst = 0

            def at_most_one_node_down(pods: dict[str, Obj]) -> None:
                nonlocal worst
                up = {
                    p["spec"].get("nodeName")
                    for p in pods.values()
                    if is_ready(p) and not terminating(p)
                }
                worst = max(worst, len(names - up))
                assert len(names - up) <= 1, f"nodes without a ready pod: {names - up}"

            watch = PodWatch(c, NS, at_most_one_node_down)
            await nursery.start(watch.run)
            before = {p["metadata"]["labels"][HASH] for p in await pods_of(c, "agent")}
            patch = {
                "spec": {
                    "template": {"spec": {"containers": [{"name": "agent", "image": "agent:2"}]}}
                }
            }
            await c.patch(DAEMONSETS, "agent", patch, NS)
            await until(lambda: rolled_out(c, "agent", names, "agent:2"))
            after = {p["metadata"]["labels"][HASH] for p in await pods_of(c, "agent")}
            assert len(after) == 1
            assert after.isdisjoint(before)
            images = {p["spec"]["containers"][0]["image"] for p in await pods_of(c, "agent")}
            assert images == {"agent:2"}
            assert worst == 1  # it did go node by node
            deleted = [name for etype, name in watch.history if etype == "DELETED"]
            assert len(deleted) == len(names)
            nursery.cancel_scope.cancel()


async def test_on_delete_replaces_only_deleted_pods(h: Harness) -> None:
    c = admin(h)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nodes = Nodes(h, nursery)
            await nodes.join("edge-a")
            await nodes.join("edge-b")
            await c.create(DAEMONSETS, daemonset(updateStrategy={"type": "OnDelete"}))
            await until(lambda: settled(c, "agent", {"edge-a", "edge-b"}))
            old = await nodes_with_ready_pod(c, "agent")

            patch = {"spec": {"template": {"metadata": {"annotations": {"rev": "2"}}}}}
            await c.patch(DAEMONSETS, "agent", patch, NS)
            await until(lambda: _updated_count(c, "agent", 0))
            assert await nodes_with_ready_pod(c, "agent") == old  # nothing replaced

            victim = old["edge-a"]["metadata"]["name"]
            await c.delete(PODS, victim, NS)
            await until(lambda: _updated_count(c, "agent", 1))
            now = await nodes_with_ready_pod(c, "agent")
            assert now["edge-b"]["metadata"]["name"] == old["edge-b"]["metadata"]["name"]
            assert now["edge-a"]["metadata"]["name"] != victim
            assert now["edge-a"]["metadata"]["annotations"] == {"rev": "2"}
            nursery.cancel_scope.cancel()


async def _updated_count(c: InProcessClient, name: str, n: int) -> bool:
    ds = await c.get(DAEMONSETS, name, NS)
    st = ds.get("status") or {}
    return (
        st.get("observedGeneration") == ds["metadata"]["generation"]
        and st.get("updatedNumberScheduled") == n
        and st.get("numberReady") == 2
    )


# ------------------------------------------------------------------------------ pure core
def node(name: str, labels: Obj | None = None, taints: list[Obj] | None = None) -> NodeInfo:
    info = NodeInfo(name)
    info.set_node(
        {"metadata": {"name": name, "labels": labels or {}}, "spec": {"taints": taints or []}}
    )
    return info


def ds_obj(**spec: Any) -> Obj:
    ds = daemonset(**spec)
    ds["metadata"].update(uid="u1", generation=3)
    return ds


def pod_on(node_name: str, revision: str, *, ready: bool = True, name: str = "") -> Obj:
    ds = ds_obj()
    p = daemon_pod(ds, node_name, revision, bind=True)
    p["metadata"].update(name=name or f"agent-{node_name}", uid=f"uid-{name or node_name}")
    p["metadata"]["creationTimestamp"] = "2024-01-01T00:00:00Z"
    cond = {"type": "Ready", "status": "True" if ready else "False"}
    p["status"] = {"phase": "Running", "conditions": [cond]}
    return p


def test_automatic_tolerations_and_taint_effects() -> None:
    t_spec = daemon_pod(ds_obj(), "x", "h", bind=True)["spec"]
    t_spec.pop("affinity")
    t_spec.pop("nodeName")
    info = PodInfo.from_pod({"spec": t_spec})
    assert node_should_run(info, node("a")) == (True, True)
    unreachable = {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}
    cordoned = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
    assert node_should_run(info, node("a", taints=[unreachable, cordoned])) == (True, True)
    assert node_should_run(info, node("a", taints=[{"key": "x", "effect": "NoSchedule"}])) == (
        False,
        True,
    )
    assert node_should_run(info, node("a", taints=[{"key": "x", "effect": "NoExecute"}])) == (
        False,
        False,
    )
    assert node_should_run(
        info, node("a", taints=[{"key": "x", "effect": "PreferNoSchedule"}])
    ) == (
        True,
        True,
    )


def test_plan_replaces_within_max_unavailable_and_counts_missing_nodes() -> None:
    ds = ds_obj(updateStrategy={"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 2}})
    nodes = [node(f"n{i}") for i in range(4)]
    rev = plan_daemonset(ds, nodes, [], 0).revision
    old = [pod_on(f"n{i}", "old") for i in range(3)]  # n3 has no pod yet: unavailable
    plan = plan_daemonset(ds, nodes, old, 0)
    assert plan.create_on == ["n3"]
    assert [p["spec"]["nodeName"] for p in plan.delete] == ["n0"]  # 2 - 1 missing node
    assert plan.status["desiredNumberScheduled"] == 4
    assert plan.status["numberAvailable"] == 3
    assert plan.status["updatedNumberScheduled"] == 0
    # An old pod that is not available is replaced regardless of the budget.
    sick = [pod_on("n0", "old", ready=False), *(pod_on(f"n{i}", rev) for i in (1, 2, 3))]
    sick[1]["status"]["conditions"][0]["status"] = "False"
    plan = plan_daemonset(ds, nodes, sick, 0)
    assert [p["spec"]["nodeName"] for p in plan.delete] == ["n0"]


def test_plan_surge_creates_before_deleting() -> None:
    ru = {"maxUnavailable": 0, "maxSurge": 1}
    ds = ds_obj(updateStrategy={"type": "RollingUpdate", "rollingUpdate": ru})
    nodes = [node("n0"), node("n1")]
    rev = plan_daemonset(ds, nodes, [], 0).revision
    old = [pod_on("n0", "old"), pod_on("n1", "old")]
    plan = plan_daemonset(ds, nodes, old, 0)
    assert plan.create_on == ["n0"]
    assert plan.delete == []
    surged = [*old, pod_on("n0", rev, ready=False, name="agent-new")]
    plan = plan_daemonset(ds, nodes, surged, 0)
    assert plan.create_on == []
    assert plan.delete == []
    surged[-1]["status"]["conditions"][0]["status"] = "True"
    plan = plan_daemonset(ds, nodes, surged, 0)
    assert [p["metadata"]["name"] for p in plan.delete] == ["agent-n0"]
    assert plan.create_on == ["n1"]


def test_plan_deletes_pods_of_vanished_nodes_at_once_and_keeps_one_per_node() -> None:
    ds = ds_obj()
    rev = plan_daemonset(ds, [node("n0")], [], 0).revision
    twin = pod_on("n0", rev, name="agent-twin")
    twin["metadata"]["creationTimestamp"] = "2024-01-02T00:00:00Z"
    plan = plan_daemonset(ds, [node("n0")], [pod_on("n0", rev), twin, pod_on("gone", rev)], 0)
    assert [p["metadata"]["name"] for p in plan.delete] == ["agent-twin"]
    assert [p["metadata"]["name"] for p in plan.delete_now] == ["agent-gone"]
