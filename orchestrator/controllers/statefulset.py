"""StatefulSet controller: pods with stable names, created, deleted and updated in order.

Theory of operation
-------------------
`reconcile(namespace/name)` is level-based: it reads the StatefulSet and the pods it controls
(the pod cache's owner index), asks the pure planner `plan_statefulset(...)` for the next
steps, performs them and patches the status. Sources: StatefulSet events and pod events (the
controlling StatefulSet's key).

Identity. The set owns ordinals `start .. start+replicas-1` (`spec.ordinals.start`, default 0);
pod `<set>-<ordinal>` carries the labels `statefulset.kubernetes.io/pod-name`,
`apps.kubernetes.io/pod-index` and `controller-revision-hash`, and gets `spec.hostname` = its
name and `spec.subdomain` = `spec.serviceName`. A pod whose ordinal is outside the range is
*condemned*. The planner follows upstream's `updateStatefulSet`, in three passes that stop at
the first step which must wait:

1. Replicas, lowest ordinal first: a missing pod is created; a failed or succeeded one is
   deleted (re-created on a later pass, once its name is free); identity labels are repaired.
   With `podManagementPolicy: OrderedReady` (default) the pass stops after one create or delete,
   and at any pod that is terminating or not Running and Ready — so `<set>-k` is created only
   once `<set>-0..k-1` are Running and Ready. `Parallel` does all of it at once.
2. Condemned pods, highest ordinal first: deleted one at a time (OrderedReady: each only after
   the previous one is gone, and only while the remaining replicas are healthy), or all at once
   (Parallel).
3. Rolling update (`updateStrategy.type` RollingUpdate): from the highest ordinal down to
   `rollingUpdate.partition`, the first pod not at the update revision is deleted (it is
   re-created at the update revision by pass 1); the pass stops at it, or at any pod that is
   not healthy. Pods below the partition keep their revision. `OnDelete` updates nothing: a
   pod gets the new template when it is deleted and re-created.

Revisions. The update revision is `<set>-<hash of the template>` (the `controller-revision-hash`
label). `status.currentRevision` stays the revision the pods had before a rollout and becomes
the update revision once every replica is updated and ready (RollingUpdate). A pod below the
partition that must be re-created gets the *current* revision, as upstream, when the
controller still knows that revision's template: it remembers the templates it has seen since
it started leading (no ControllerRevision objects are written); otherwise it gets the update
revision.

Status: replicas (pods that exist), readyReplicas, availableReplicas (ready for
minReadySeconds), currentReplicas / updatedReplicas (live pods at each revision),
currentRevision, updateRevision, observedGeneration; computed from the cache before this
reconcile's writes and patched only when it changed.

Not implemented: volumeClaimTemplates (no PersistentVolumeClaims are created or deleted;
`persistentVolumeClaimRetentionPolicy` is ignored), `rollingUpdate.maxUnavailable` (updates go
one pod at a time), adoption of orphan pods, ControllerRevision history.

Events: SuccessfulCreate / SuccessfulDelete (Normal), FailedCreate / FailedDelete (Warning),
with upstream's wording ("create Pod web-0 in StatefulSet web successful").
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

import trio

from orchestrator.client.resource import PODS, STATEFULSETS
from orchestrator.controllers._workload import (
    REVISION_LABEL,
    available_in,
    is_running_and_ready,
    is_terminating,
    phase,
    spec,
)
from orchestrator.controllers.podutil import controller_ref, meta, pod_template_hash
from orchestrator.controllers.runtime.client import Client
from orchestrator.controllers.runtime.controller import Controller, Result, enqueue_owner
from orchestrator.controllers.runtime.events import EventRecorder
from orchestrator.controllers.runtime.informer import OWNER_INDEX, SharedInformer
from orchestrator.controllers.runtime.manager import ControllerContext
from orchestrator.controllers.writes import finish_sync
from orchestrator.kube.errors import ApiError
from orchestrator.kube.objects import Obj
from orchestrator.metrics import REGISTRY, Registry

__all__ = [
    "POD_INDEX_LABEL",
    "POD_NAME_LABEL",
    "StatefulSetController",
    "StatefulSetPlan",
    "plan_statefulset",
    "stateful_pod",
    "statefulset_controller",
]

log = logging.getLogger(__name__)


POD_NAME_LABEL: Final = "statefulset.kubernetes.io/pod-name"
POD_INDEX_LABEL: Final = "apps.kubernetes.io/pod-index"
MAX_REMEMBERED_REVISIONS: Final = 10


# ------------------------------------------------------------------------------ pure core
def revision_of(pod: Obj) -> str:
    return str((meta(pod).get("labels") or {}).get(REVISION_LABEL) or "")


def _ordinal(set_name: str, pod: Obj) -> int | None:
    name = str(meta(pod).get("name") or "")
    prefix = f"{set_name}-"
    if not name.startswith(prefix):
        return None
    tail = name[len(prefix) :]
    if not tail.isdigit() or (len(tail) > 1 and tail.startswith("0")):
        return None
    return int(tail)


def _healthy(pod: Obj) -> bool:
    return is_running_and_ready(pod) and not is_terminating(pod)


def _identity(set_name: str, ordinal: int) -> dict[str, str]:
    name = f"{set_name}-{ordinal}"
    return {POD_NAME_LABEL: name, POD_INDEX_LABEL: str(ordinal)}


def stateful_pod(sts: Obj, template: Obj, ordinal: int, revision: str) -> Obj:
    """Pod `<set>-<ordinal>` of `template` at `revision` (see the module doc)."""
    template = copy.deepcopy(template)
    t_meta = template.get("metadata") or {}
    s_meta = meta(sts)
    set_name = str(s_meta["name"])
    name = f"{set_name}-{ordinal}"
    labels = {**(t_meta.get("labels") or {}), **_identity(set_name, ordinal)}
    labels[REVISION_LABEL] = revision
    pod_meta: Obj = {
        "name": name,
        "namespace": s_meta.get("namespace", ""),
        "labels": labels,
        "ownerReferences": [controller_ref(sts, "apps/v1", "StatefulSet")],
    }
    if t_meta.get("annotations"):
        pod_meta["annotations"] = dict(t_meta["annotations"])
    pod_spec: Obj = template.get("spec") or {}
    pod_spec["hostname"] = name
    service = spec(sts).get("serviceName")
    if service:
        pod_spec["subdomain"] = service
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": pod_spec}


@dataclass
class StatefulSetPlan:
    """What one reconcile should do, in order: `create` (ordinal, revision) pods, `delete`
    pods, `relabel` (pod, labels) identity repairs; then patch `status`; requeue after
    `requeue_after` seconds (0: no)."""

    update_revision: str
    current_revision: str
    create: list[tuple[int, str]] = field(default_factory=list)
    delete: list[Obj] = field(default_factory=list)
    relabel: list[tuple[Obj, dict[str, str]]] = field(default_factory=list)
    status: Obj = field(default_factory=dict)
    requeue_after: float = 0.0


def plan_statefulset(
    sts: Obj, pods: Iterable[Obj], now: float, known_revisions: Iterable[str] = ()
) -> StatefulSetPlan:
    """Pure: the next steps for `sts` given its `pods` (module doc). `known_revisions`: the
    revisions whose templates the caller can build pods from (besides the update revision)."""
    s = spec(sts)
    s_meta = meta(sts)
    set_name = str(s_meta.get("name") or "")
    have = sts.get("status") or {}
    collisions = int(have.get("collisionCount") or 0)
    update_rev = f"{set_name}-{pod_template_hash(s.get('template') or {}, collisions)}"
    current_rev = str(have.get("currentRevision") or "") or update_rev
    plan = StatefulSetPlan(update_rev, current_rev)
    known = set(known_revisions) | {update_rev}

    replicas = int(s.get("replicas", 1) or 0)
    start = int((s.get("ordinals") or {}).get("start") or 0)
    monotonic = s.get("podManagementPolicy", "OrderedReady") != "Parallel"
    strategy = s.get("updateStrategy") or {}
    rolling = strategy.get("type", "RollingUpdate") == "RollingUpdate"
    partition = int((strategy.get("rollingUpdate") or {}).get("partition") or 0)
    min_ready = int(s.get("minReadySeconds") or 0)

    slots: list[Obj | None] = [None] * replicas
    condemned: list[tuple[int, Obj]] = []
    all_pods = list(pods)
    for pod in all_pods:
        ordinal = _ordinal(set_name, pod)
        if ordinal is not None and start <= ordinal < start + replicas:
            slots[ordinal - start] = pod
        else:
            condemned.append((ordinal if ordinal is not None else -1, pod))
    condemned.sort(key=lambda item: -item[0])

    # ---- status, from the cache as it is
    ready = available = current = updated = 0
    wait = 0.0
    for pod in all_pods:
        if is_running_and_ready(pod):
            ready += 1
            left = available_in(pod, min_ready, now)
            if left == 0.0:
                available += 1
            elif left is not None:
                wait = min(wait, left) if wait else left
        if not is_terminating(pod):
            rev = revision_of(pod)
            current += rev == current_rev
            updated += rev == update_rev
    status_rev = current_rev
    if rolling and updated == replicas and ready == replicas and len(all_pods) == replicas:
        status_rev, current = update_rev, updated  # the rollout is complete
    plan.current_revision = status_rev
    plan.status = {
        "replicas": len(all_pods),
        "readyReplicas": ready,
        "availableReplicas": available,
        "currentReplicas": current,
        "updatedReplicas": updated,
        "currentRevision": status_rev,
        "updateRevision": update_rev,
        "observedGeneration": int(s_meta.get("generation") or 0),
    }
    plan.requeue_after = wait + 1.0 if wait else 0.0

    # ---- pass 1: replicas, lowest ordinal first
    for idx, slot in enumerate(slots):
        ordinal = start + idx
        if slot is None:
            rev = update_rev
            if rolling and idx < partition and current_rev in known:
                rev = current_rev
            plan.create.append((ordinal, rev))
            if monotonic:
                return plan
            continue
        pod = slot
        if phase(pod) in ("Failed", "Succeeded") and not is_terminating(pod):
            plan.delete.append(pod)
            if monotonic:
                return plan
            continue
        if is_terminating(pod) or not is_running_and_ready(pod):
            if monotonic:
                return plan
            continue
        labels = meta(pod).get("labels") or {}
        want = _identity(set_name, ordinal)
        if any(labels.get(k) != v for k, v in want.items()):
            plan.relabel.append((pod, want))

    # ---- pass 2: condemned pods, highest ordinal first
    unhealthy = [p for _, p in condemned if not _healthy(p)]
    for _, pod in condemned:
        if is_terminating(pod):
            if monotonic:
                return plan
            continue
        if monotonic and not _healthy(pod) and pod is not unhealthy[0]:
            return plan
        plan.delete.append(pod)
        if monotonic:
            return plan
    if not monotonic and (plan.create or plan.delete or any(p is None for p in slots)):
        return plan  # Parallel: update only once the replica set is whole

    # ---- pass 3: rolling update, highest ordinal down to the partition
    if not rolling:
        return plan
    for idx in range(replicas - 1, partition - 1, -1):
        target = slots[idx]
        if target is None:
            return plan
        if revision_of(target) != update_rev and not is_terminating(target):
            plan.delete.append(target)
            return plan
        if not _healthy(target):
            return plan
    return plan


# ------------------------------------------------------------------------------ reconciler
class StatefulSetController:
    """The reconciler (see the module doc); `controller()` wires it to its informers."""

    def __init__(
        self,
        client: Client,
        statefulsets: SharedInformer,
        pods: SharedInformer,
        events: EventRecorder,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.statefulsets = statefulsets
        self.pods = pods
        self.events = events
        self.clock = clock
        # set key -> revision -> template, newest last (the revisions seen while leading)
        self._templates: dict[str, dict[str, Obj]] = {}

    def controller(self, metrics: Registry = REGISTRY) -> Controller:
        c = Controller("statefulset", self, metrics=metrics)
        c.watches(self.statefulsets)
        c.watches(self.pods, enqueue_owner("StatefulSet", "apps/v1"))
        return c

    def _remember(self, key: str, sts: Obj, plan: StatefulSetPlan) -> Mapping[str, Obj]:
        seen = self._templates.setdefault(key, {})
        seen.pop(plan.update_revision, None)
        seen[plan.update_revision] = spec(sts).get("template") or {}
        while len(seen) > MAX_REMEMBERED_REVISIONS:
            seen.pop(next(iter(seen)))
        return seen

    async def reconcile(self, key: str) -> Result:
        sts = self.statefulsets.get(key)
        if sts is None:
            self._templates.pop(key, None)
            return Result()
        if is_terminating(sts):
            return Result()
        uid = str(meta(sts).get("uid", ""))
        pods = self.pods.by_index(OWNER_INDEX, uid)
        known = self._templates.get(key, {})
        plan = plan_statefulset(sts, pods, self.clock(), known)
        templates = self._remember(key, sts, plan)

        errors = await self._act(sts, plan, templates)
        return await finish_sync(
            self.client, STATEFULSETS, key, sts, plan.status, errors, plan.requeue_after
        )

    async def _act(
        self, sts: Obj, plan: StatefulSetPlan, templates: Mapping[str, Obj]
    ) -> list[BaseException]:
        errors: list[BaseException] = []
        set_name = str(meta(sts).get("name", ""))
        ns = str(meta(sts).get("namespace", ""))

        async def create(ordinal: int, revision: str) -> None:
            template = templates.get(revision) or spec(sts).get("template") or {}
            if revision not in templates:
                revision = plan.update_revision
            body = stateful_pod(sts, template, ordinal, revision)
            name = body["metadata"]["name"]
            try:
                await self.client.create(PODS, body)
            except ApiError as exc:
                if exc.code == 409:
                    return  # our cache is behind: it exists (perhaps still terminating)
                self.events.record(
                    sts,
                    "Warning",
                    "FailedCreate",
                    f"create Pod {name} in StatefulSet {set_name} failed error: {exc.message}",
                )
                errors.append(exc)
                return
            self.events.record(
                sts,
                "Normal",
                "SuccessfulCreate",
                f"create Pod {name} in StatefulSet {set_name} successful",
            )

        async def delete(pod: Obj) -> None:
            m = meta(pod)
            name = str(m.get("name", ""))
            try:
                await self.client.delete(PODS, name, ns, preconditions={"uid": m.get("uid")})
            except ApiError as exc:
                if exc.code in (404, 409):
                    return
                self.events.record(
                    sts,
                    "Warning",
                    "FailedDelete",
                    f"delete Pod {name} in StatefulSet {set_name} failed error: {exc.message}",
                )
                errors.append(exc)
                return
            self.events.record(
                sts,
                "Normal",
                "SuccessfulDelete",
                f"delete Pod {name} in StatefulSet {set_name} successful",
            )

        async def relabel(pod: Obj, labels: dict[str, str]) -> None:
            try:
                await self.client.patch(
                    PODS, str(meta(pod).get("name", "")), {"metadata": {"labels": labels}}, ns
                )
            except ApiError as exc:
                if exc.code != 404:
                    errors.append(exc)

        async with trio.open_nursery() as nursery:
            for ordinal, revision in plan.create:
                nursery.start_soon(create, ordinal, revision)
            for pod in plan.delete:
                nursery.start_soon(delete, pod)
            for pod, labels in plan.relabel:
                nursery.start_soon(relabel, pod, labels)
        return errors


def statefulset_controller(ctx: ControllerContext) -> Controller:
    """The StatefulSet controller for one term of leadership (registry entry)."""
    reconciler = StatefulSetController(
        ctx.client,
        ctx.informers.informer(STATEFULSETS),
        ctx.informers.informer(PODS),
        ctx.events,
    )
    return reconciler.controller(ctx.metrics)
