"""Deployment controller: the pure core (fenceposts, new RS sizes, proportional scaling,
history, conditions) against upstream's numbers, and end to end on the in-process server with
the scheduler and simulated nodes: creation with `kubectl rollout status` conditions and
annotations, scale up/down, rolling updates that keep availability and surge within bounds at
every observed moment, rollback reusing the old ReplicaSet, restart, pause/resume, progress
deadline, proportional scaling during a rollout, Recreate and revision history."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
from api.apiharness import Harness, api_server
from workloads import NOWHERE, admin_client, patch, start_nodes, until_async

from orchestrator.controllers.deployment import (
    DESIRED_REPLICAS_ANNOTATION,
    MAX_REPLICAS_ANNOTATION,
    REVISION_ANNOTATION,
    cleanup_unhealthy,
    history_to_delete,
    max_surge,
    max_unavailable,
    new_rs_new_replicas,
    resolve_fenceposts,
    rollout_conditions,
    scale_plan,
)
from orchestrator.controllers.podutil import POD_TEMPLATE_HASH_LABEL
from orchestrator.controllers.runtime.client import DEPLOYMENTS, EVENTS, PODS, REPLICASETS
from orchestrator.controllers.runtime.informer import SharedInformer
from orchestrator.controllers.runtime.inprocess import InProcessClient
from orchestrator.metrics import Registry

Obj = dict[str, Any]
NS = "default"


# ---------------------------------------------------------------------------------- pure core
@pytest.mark.parametrize(
    ("surge", "unavailable", "replicas", "want"),
    [
        ("25%", "25%", 4, (1, 1)),
        ("25%", "25%", 10, (3, 2)),  # surge rounds up, unavailable rounds down
        ("25%", "25%", 1, (1, 0)),
        ("0%", "0%", 3, (0, 1)),  # both zero: unavailable 1
        (0, 0, 5, (0, 1)),
        (2, "50%", 5, (2, 2)),
        ("10%", 0, 5, (1, 0)),
        (None, None, 8, (2, 2)),  # 25% defaults
    ],
)
def test_fenceposts(surge: Any, unavailable: Any, replicas: int, want: tuple[int, int]) -> None:
    assert resolve_fenceposts(surge, unavailable, replicas) == want


def dep(replicas: int, surge: Any = "25%", unavailable: Any = "25%", **extra: Any) -> Obj:
    d: Obj = {
        "metadata": {"name": "d", "namespace": NS, "generation": 1, "uid": "d-uid"},
        "spec": {
            "replicas": replicas,
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable},
            },
            "progressDeadlineSeconds": 600,
            **extra,
        },
        "status": {},
    }
    return d


_ANNOTATIONS = {
    "max_replicas": MAX_REPLICAS_ANNOTATION,
    "desired_replicas": DESIRED_REPLICAS_ANNOTATION,
    "revision": REVISION_ANNOTATION,
}


def rs(
    name: str, replicas: int, *, available: int | None = None, created: int = 0, **ann: str
) -> Obj:
    return {
        "metadata": {
            "name": name,
            "creationTimestamp": f"2025-01-01T00:00:{created:02d}Z",
            "annotations": {_ANNOTATIONS[k]: v for k, v in ann.items()},
            "generation": 1,
        },
        "spec": {"replicas": replicas},
        "status": {
            "replicas": replicas,
            "availableReplicas": replicas if available is None else available,
            "readyReplicas": replicas if available is None else available,
            "observedGeneration": 1,
        },
    }


def test_max_surge_and_unavailable_follow_the_strategy() -> None:
    assert (max_surge(dep(10)), max_unavailable(dep(10))) == (3, 2)
    assert max_unavailable(dep(2, 0, 5)) == 2  # capped at replicas
    recreate = dep(4)
    recreate["spec"]["strategy"] = {"type": "Recreate"}
    assert (max_surge(recreate), max_unavailable(recreate)) == (0, 0)


def test_new_rs_new_replicas_stays_within_surge() -> None:
    d = dep(10)  # surge 3
    old, new = rs("old", 10), rs("new", 0)
    assert new_rs_new_replicas(d, [old, new], new) == 3
    old, new = rs("old", 8), rs("new", 3)
    assert new_rs_new_replicas(d, [old, new], new) == 5
    old, new = rs("old", 0), rs("new", 9)
    assert new_rs_new_replicas(d, [old, new], new) == 10  # never beyond replicas


def test_cleanup_of_unhealthy_old_replicas_never_scales_up() -> None:
    # Status may lag a scale-down: 3 available of 2 wanted is nothing to clean up (it used
    # to be a "scale down" to 3).
    lagging = rs("lagging", 2, available=3, created=1)
    unhealthy = rs("unhealthy", 4, available=1, created=2)
    assert cleanup_unhealthy([lagging, unhealthy], 5) == [(unhealthy, 1)]
    assert cleanup_unhealthy([lagging], 5) == []
    assert cleanup_unhealthy([unhealthy], 2) == [(unhealthy, 2)]


def test_proportional_scaling_like_upstream() -> None:
    # Upstream's "proportional scaling: 5 -> 10" style case: a rollout of 10 (+3 surge) stuck
    # at old 8 / new 5, scaled to 20 (+5 surge): 25 to spread over what had 13.
    d = dep(20)
    old = rs("old", 8, created=1, max_replicas="13", desired_replicas="10")
    new = rs("new", 5, created=2, max_replicas="13", desired_replicas="10")
    plan = {r["metadata"]["name"]: size for r, size in scale_plan(d, new, [old])}
    assert plan == {"old": 15, "new": 10}
    assert sum(plan.values()) == 20 + max_surge(d)

    down = dep(5)  # scaling down: 5 + 2 = 7 in total
    plan = {r["metadata"]["name"]: size for r, size in scale_plan(down, new, [old])}
    assert sum(plan.values()) == 7
    assert plan == {"old": 4, "new": 3}


def test_scale_plan_single_active_and_saturated() -> None:
    d = dep(6)
    only = rs("only", 3, desired_replicas="3")
    assert [(r["metadata"]["name"], n) for r, n in scale_plan(d, only, [rs("old", 0)])] == [
        ("only", 6)
    ]
    saturated = rs("new", 6, desired_replicas="6")
    old = rs("old", 2)
    assert [(r["metadata"]["name"], n) for r, n in scale_plan(d, saturated, [old])] == [("old", 0)]


def test_history_keeps_the_limit_and_never_deletes_pods() -> None:
    d = dep(3, revisionHistoryLimit=1)
    olds = [rs("r1", 0, revision="1"), rs("r2", 0, revision="2"), rs("r3", 1, revision="3")]
    assert [r["metadata"]["name"] for r in history_to_delete(d, olds)] == ["r1", "r2"]
    olds[1]["spec"]["replicas"] = 2  # still holds pods: kept
    assert [r["metadata"]["name"] for r in history_to_delete(d, olds)] == ["r1"]


def _reason(status: Obj, ctype: str) -> tuple[str, str]:
    (cond,) = [c for c in status["conditions"] if c["type"] == ctype]
    return cond["status"], cond["reason"]


def test_rollout_conditions() -> None:
    t0 = 1735689600.0
    d = dep(3)
    new = rs("d-abc", 3)
    st = rollout_conditions(d, [new], new, [], t0)
    assert _reason(st, "Progressing") == ("True", "NewReplicaSetAvailable")
    assert _reason(st, "Available") == ("True", "MinimumReplicasAvailable")
    assert st["updatedReplicas"] == st["replicas"] == st["availableReplicas"] == 3

    d["spec"]["progressDeadlineSeconds"] = 10
    stuck = rs("d-new", 1, available=0)
    old = rs("d-old", 2)
    d["status"] = {"replicas": 3, "updatedReplicas": 1, "availableReplicas": 2, "readyReplicas": 2}
    cond = {
        "type": "Progressing",
        "status": "True",
        "reason": "ReplicaSetUpdated",
        "lastUpdateTime": "2025-01-01T00:00:00Z",
        "lastTransitionTime": "2025-01-01T00:00:00Z",
    }
    st = rollout_conditions(d, [old, stuck], stuck, [cond], t0 + 5)
    assert _reason(st, "Progressing") == ("True", "ReplicaSetUpdated")
    st = rollout_conditions(d, [old, stuck], stuck, [cond], t0 + 11)
    assert _reason(st, "Progressing") == ("False", "ProgressDeadlineExceeded")
    assert _reason(st, "Available") == ("False", "MinimumReplicasUnavailable")
    d["status"]["availableReplicas"] = 1  # one more became available: progress
    st = rollout_conditions(d, [old, stuck], stuck, [cond], t0 + 11)
    assert _reason(st, "Progressing") == ("True", "ReplicaSetUpdated")


# ---------------------------------------------------------------------------------- end to end
@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    async with api_server() as harness:
        yield harness


def deployment(name: str, replicas: int, *, image: str = "nginx:1", **spec: Any) -> Obj:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": image}]},
            },
            **spec,
        },
    }


def condition(d: Obj, ctype: str) -> Obj | None:
    for c in (d.get("status") or {}).get("conditions") or []:
        if c["type"] == ctype:
            return dict(c)
    return None


def rollout_done(d: Obj) -> bool:
    """`kubectl rollout status`'s success test."""
    st = d.get("status") or {}
    replicas = d["spec"]["replicas"]
    cond = condition(d, "Progressing")
    return (
        d["metadata"]["generation"] <= st.get("observedGeneration", 0)
        and st.get("updatedReplicas", 0) == replicas
        and st.get("replicas", 0) == replicas
        and st.get("availableReplicas", 0) == replicas
        and cond is not None
        and cond["reason"] == "NewReplicaSetAvailable"
    )


async def wait_rollout(client: InProcessClient, name: str) -> Obj:
    async def check() -> Obj | None:
        d = await client.get(DEPLOYMENTS, name, NS)
        return d if rollout_done(d) else None

    result: Obj = await until_async(check)
    return result


async def replicasets_of(client: InProcessClient, d: Obj) -> list[Obj]:
    items = (await client.list(REPLICASETS, NS))["items"]
    return [
        r
        for r in items
        if any(
            ref.get("uid") == d["metadata"]["uid"] and ref.get("controller")
            for ref in r["metadata"].get("ownerReferences") or []
        )
    ]


async def test_create_scale_and_rollout_status_conditions(h: Harness) -> None:
    client = admin_client(h)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await start_nodes(nursery, h)
            created = await client.create(DEPLOYMENTS, deployment("web", 3))
            d = await wait_rollout(client, "web")
            (only,) = await replicasets_of(client, d)
            h_label = only["metadata"]["labels"][POD_TEMPLATE_HASH_LABEL]
            assert only["metadata"]["name"] == f"web-{h_label}"
            assert only["spec"]["selector"]["matchLabels"] == {
                "app": "web",
                POD_TEMPLATE_HASH_LABEL: h_label,
            }
            assert (
                only["spec"]["template"]["metadata"]["labels"][POD_TEMPLATE_HASH_LABEL] == h_label
            )
            ann = only["metadata"]["annotations"]
            assert ann[REVISION_ANNOTATION] == "1"
            assert ann[DESIRED_REPLICAS_ANNOTATION] == "3"
            assert ann[MAX_REPLICAS_ANNOTATION] == "4"  # 3 + ceil(25% of 3)
            (ref,) = only["metadata"]["ownerReferences"]
            assert ref["uid"] == created["metadata"]["uid"]
            assert ref["controller"] is True
            assert ref["blockOwnerDeletion"] is True
            assert d["metadata"]["annotations"][REVISION_ANNOTATION] == "1"
            st = d["status"]
            assert st["observedGeneration"] == d["metadata"]["generation"]
            assert (st["replicas"], st["updatedReplicas"], st["readyReplicas"]) == (3, 3, 3)
            assert st["availableReplicas"] == 3
            assert not st.get("unavailableReplicas")
            avail, prog = condition(d, "Available"), condition(d, "Progressing")
            assert avail is not None
            assert prog is not None
            assert (avail["status"], avail["reason"]) == ("True", "MinimumReplicasAvailable")
            assert avail["message"] == "Deployment has minimum availability."
            assert (prog["status"], prog["reason"]) == ("True", "NewReplicaSetAvailable")
            assert (
                prog["message"]
                == f'ReplicaSet "{only["metadata"]["name"]}" has successfully progressed.'
            )

            await patch(client, DEPLOYMENTS, "web", {"spec": {"replicas": 5}}, NS)
            d = await wait_rollout(client, "web")
            (only,) = await replicasets_of(client, d)
            assert only["spec"]["replicas"] == 5
            assert only["metadata"]["annotations"][DESIRED_REPLICAS_ANNOTATION] == "5"
            await patch(client, DEPLOYMENTS, "web", {"spec": {"replicas": 1}}, NS)
            d = await wait_rollout(client, "web")
            (only,) = await replicasets_of(client, d)
            assert only["spec"]["replicas"] == 1

            async def scaling_events() -> list[str] | None:
                items = (await client.list(EVENTS, NS))["items"]
                msgs = [
                    e["message"]
                    for e in items
                    if e["reason"] == "ScalingReplicaSet" and e["involvedObject"]["name"] == "web"
                ]
                return msgs if len(msgs) >= 3 else None

            msgs = await until_async(scaling_events)
            name = only["metadata"]["name"]
            assert f"Scaled up replica set {name} to 3" in msgs
            assert f"Scaled up replica set {name} to 5" in msgs
            assert f"Scaled down replica set {name} to 1" in msgs
            nursery.cancel_scope.cancel()


class Watcher:
    """Checks the rolling-update bounds at every pod and ReplicaSet event it sees."""

    def __init__(
        self, client: InProcessClient, app: str, replicas: int, surge: int, unavailable: int
    ) -> None:
        self.pods = SharedInformer(client, PODS, NS, f"app={app}", metrics=Registry())
        self.rss = SharedInformer(client, REPLICASETS, NS, f"app={app}", metrics=Registry())
        self.replicas, self.surge, self.unavailable = replicas, surge, unavailable
        self.armed = False
        self.violations: list[str] = []
        self.min_available = replicas
        self.max_pods = 0
        self.max_spec = 0
        self.events = 0

    def check(self, *_: Any) -> None:
        if not self.armed:
            return
        self.events += 1
        live = [p for p in self.pods.list() if not p["metadata"].get("deletionTimestamp")]
        available = sum(
            1
            for p in live
            if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in (p.get("status") or {}).get("conditions") or []
            )
        )
        spec_total = sum(r["spec"]["replicas"] for r in self.rss.list())
        self.min_available = min(self.min_available, available)
        self.max_pods = max(self.max_pods, len(live))
        self.max_spec = max(self.max_spec, spec_total)
        if available < self.replicas - self.unavailable:
            self.violations.append(f"only {available} available pods")
        if spec_total > self.replicas + self.surge:
            self.violations.append(f"{spec_total} replicas in ReplicaSets")

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        for inf in (self.pods, self.rss):
            inf.add_event_handler(on_add=self.check, on_update=self.check, on_delete=self.check)
        async with trio.open_nursery() as nursery:
            await nursery.start(self.pods.run)
            await nursery.start(self.rss.run)
            task_status.started()


async def test_rolling_update_stays_within_bounds_and_rolls_back(h: Harness) -> None:
    client = admin_client(h)
    strategy = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 1}}
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            await start_nodes(nursery, h)
            await client.create(DEPLOYMENTS, deployment("roll", 4, strategy=strategy))
            d = await wait_rollout(client, "roll")
            watcher = Watcher(client, "roll", 4, 1, 1)
            await nursery.start(watcher.run)
            watcher.armed = True

            template_v2 = {
                "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "nginx:2"}]}}}
            }
            await patch(client, DEPLOYMENTS, "roll", template_v2, NS)
            d = await wait_rollout(client, "roll")
            assert d["metadata"]["annotations"][REVISION_ANNOTATION] == "2"
            rss = await replicasets_of(client, d)
            by_rev = {r["metadata"]["annotations"][REVISION_ANNOTATION]: r for r in rss}
            assert set(by_rev) == {"1", "2"}
            assert by_rev["1"]["spec"]["replicas"] == 0
            assert by_rev["2"]["spec"]["replicas"] == 4

            # kubectl rollout undo: the revision-1 template (minus the hash label) written back.
            old = by_rev["1"]
            template = copy.deepcopy(old["spec"]["template"])
            del template["metadata"]["labels"][POD_TEMPLATE_HASH_LABEL]
            await patch(
                client,
                DEPLOYMENTS,
                "roll",
                [{"op": "replace", "path": "/spec/template", "value": template}],
                NS,
                content_type="application/json-patch+json",
            )
            d = await wait_rollout(client, "roll")
            rss = await replicasets_of(client, d)
            assert len(rss) == 2  # the old ReplicaSet was reused, not recreated
            (active,) = [r for r in rss if r["spec"]["replicas"] > 0]
            assert active["metadata"]["uid"] == old["metadata"]["uid"]
            assert active["metadata"]["annotations"][REVISION_ANNOTATION] == "3"
            assert d["metadata"]["annotations"][REVISION_ANNOTATION] == "3"

            watcher.armed = False
            assert watcher.events > 0
            assert watcher.violations == []
            assert watcher.min_available >= 3
            assert watcher.max_spec <= 5
            nursery.cancel_scope.cancel()


def image_patch(image: str, **pod_spec: Any) -> Obj:
    return {
        "spec": {"template": {"spec": {"containers": [{"name": "c", "image": image}], **pod_spec}}}
    }


async def test_restart_and_revision_history(h: Harness) -> None:
    client = admin_client(h)
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            await start_nodes(nursery, h)
            await client.create(DEPLOYMENTS, deployment("hist", 2, revisionHistoryLimit=1))
            await wait_rollout(client, "hist")
            # kubectl rollout restart
            restart = {"kubectl.kubernetes.io/restartedAt": "2025-01-01T00:00:00Z"}
            restart_patch = {"spec": {"template": {"metadata": {"annotations": restart}}}}
            await patch(client, DEPLOYMENTS, "hist", restart_patch, NS)
            d = await wait_rollout(client, "hist")
            assert d["metadata"]["annotations"][REVISION_ANNOTATION] == "2"
            assert len(await replicasets_of(client, d)) == 2
            for image in ("nginx:2", "nginx:3"):
                await patch(client, DEPLOYMENTS, "hist", image_patch(image), NS)
                d = await wait_rollout(client, "hist")

            async def pruned() -> list[Obj] | None:
                rss = await replicasets_of(client, d)
                return rss if len(rss) == 2 else None  # the new one + revisionHistoryLimit 1

            rss = await until_async(pruned)
            revisions = sorted(int(r["metadata"]["annotations"][REVISION_ANNOTATION]) for r in rss)
            assert revisions == [3, 4]
            nursery.cancel_scope.cancel()


async def test_pause_and_resume(h: Harness) -> None:
    client = admin_client(h)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await start_nodes(nursery, h)
            await client.create(DEPLOYMENTS, deployment("paused", 2))
            await wait_rollout(client, "paused")
            await patch(client, DEPLOYMENTS, "paused", {"spec": {"paused": True}}, NS)
            await patch(client, DEPLOYMENTS, "paused", image_patch("nginx:2"), NS)

            async def observed_paused() -> Obj | None:
                d = await client.get(DEPLOYMENTS, "paused", NS)
                cond = condition(d, "Progressing")
                seen = d["status"].get("observedGeneration") == d["metadata"]["generation"]
                return d if seen and cond and cond["reason"] == "DeploymentPaused" else None

            d = await until_async(observed_paused)
            cond = condition(d, "Progressing")
            assert cond is not None
            assert (cond["status"], cond["message"]) == ("Unknown", "Deployment is paused")
            assert len(await replicasets_of(client, d)) == 1  # no rollout while paused
            # Scaling still works while paused.
            await patch(client, DEPLOYMENTS, "paused", {"spec": {"replicas": 3}}, NS)

            async def scaled() -> bool:
                (only,) = await replicasets_of(client, d)
                return bool(only["spec"]["replicas"] == 3)

            await until_async(scaled)
            assert len(await replicasets_of(client, d)) == 1

            await patch(client, DEPLOYMENTS, "paused", {"spec": {"paused": False}}, NS)
            d = await wait_rollout(client, "paused")
            rss = await replicasets_of(client, d)
            assert len(rss) == 2
            assert d["status"]["updatedReplicas"] == 3
            nursery.cancel_scope.cancel()


async def test_progress_deadline_and_scaling_a_stuck_rollout(h: Harness) -> None:
    client = admin_client(h)
    strategy = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 1}}
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            await start_nodes(nursery, h)
            spec = {"strategy": strategy, "progressDeadlineSeconds": 2}
            await client.create(DEPLOYMENTS, deployment("stuck", 4, **spec))
            await wait_rollout(client, "stuck")
            # A template whose pods can never be scheduled: the rollout stalls at old 3 / new 2.
            await patch(
                client, DEPLOYMENTS, "stuck", image_patch("nginx:2", nodeSelector=NOWHERE), NS
            )

            async def timed_out() -> Obj | None:
                d = await client.get(DEPLOYMENTS, "stuck", NS)
                cond = condition(d, "Progressing")
                return d if cond and cond["reason"] == "ProgressDeadlineExceeded" else None

            d = await until_async(timed_out)
            cond = condition(d, "Progressing")
            assert cond is not None
            assert cond["status"] == "False"
            assert cond["message"].endswith("has timed out progressing.")
            avail = condition(d, "Available")
            assert avail is not None
            assert (avail["status"], avail["reason"]) == ("True", "MinimumReplicasAvailable")
            sizes = sorted(r["spec"]["replicas"] for r in await replicasets_of(client, d))
            assert sizes == [2, 3]

            # Scaling mid-rollout is proportional: 5 -> 9 (8 + maxSurge 1) as 5 old / 4 new
            # (3 * 9/5 = 5.4 -> 5, 2 * 9/5 = 3.6 -> 4).
            await patch(client, DEPLOYMENTS, "stuck", {"spec": {"replicas": 8}}, NS)

            async def proportional() -> list[Obj] | None:
                rss = await replicasets_of(client, d)
                return rss if sum(r["spec"]["replicas"] for r in rss) == 9 else None

            rss = await until_async(proportional)
            by_revision = {r["metadata"]["annotations"][REVISION_ANNOTATION]: r for r in rss}
            assert by_revision["1"]["spec"]["replicas"] == 5
            assert by_revision["2"]["spec"]["replicas"] == 4
            assert all(
                r["metadata"]["annotations"][DESIRED_REPLICAS_ANNOTATION] == "8" for r in rss
            )
            assert all(r["metadata"]["annotations"][MAX_REPLICAS_ANNOTATION] == "9" for r in rss)

            # A fixed template completes the rollout at the new size.
            fixed = image_patch("nginx:3", nodeSelector=None)  # a merge patch: None removes it
            await patch(client, DEPLOYMENTS, "stuck", fixed, NS)
            d = await wait_rollout(client, "stuck")
            assert d["status"]["availableReplicas"] == 8
            nursery.cancel_scope.cancel()


async def test_recreate_never_runs_old_and_new_together(h: Harness) -> None:
    client = admin_client(h)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await start_nodes(nursery, h)
            spec = {"strategy": {"type": "Recreate"}}
            await client.create(DEPLOYMENTS, deployment("recreate", 3, **spec))
            await wait_rollout(client, "recreate")
            pods = SharedInformer(client, PODS, NS, "app=recreate", metrics=Registry())
            mixed: list[set[str]] = []

            def check(*_: Any) -> None:
                hashes = {p["metadata"]["labels"][POD_TEMPLATE_HASH_LABEL] for p in pods.list()}
                if len(hashes) > 1:
                    mixed.append(hashes)

            pods.add_event_handler(on_add=check, on_update=check, on_delete=check)
            await nursery.start(pods.run)
            await patch(client, DEPLOYMENTS, "recreate", image_patch("nginx:2"), NS)
            d = await wait_rollout(client, "recreate")
            assert mixed == []
            assert len(pods.list()) == 3
            rss = await replicasets_of(client, d)
            assert sorted(r["spec"]["replicas"] for r in rss) == [0, 3]
            nursery.cancel_scope.cancel()
