"""DaemonSet controller: one pod of the template on every eligible node.

Theory of operation
-------------------
`reconcile(namespace/name)` is level-based: it reads the DaemonSet, the nodes and the pods the
DaemonSet controls (the pod cache's owner index) from the shared informers, asks the pure
planner `plan_daemonset(...)` what should change, makes those writes and patches the status.
Nothing depends on which event caused the reconcile. Sources: DaemonSet events (its key), pod
events (the controlling DaemonSet's key) and node events (every DaemonSet's key, on a node added
or deleted, or whose labels, taints or cordon changed: heartbeats are ignored).

Eligibility (upstream's `NodeShouldRunDaemonPod`), per node, reusing the scheduler's compiled
`PodInfo`/`NodeInfo` so both agree on selectors and tolerations:

* *should run* — the template's `nodeName` (if any), `nodeSelector` and required node affinity
  match, and every NoSchedule/NoExecute taint is tolerated;
* *should continue running* — the same, except that untolerated NoSchedule taints are ignored
  (a taint added under a running pod does not evict it; an untolerated NoExecute one does).

Tolerations are the template's plus upstream's automatic DaemonSet ones: `not-ready` and
`unreachable` NoExecute without tolerationSeconds (never evicted by the node lifecycle), and
`disk-pressure`, `memory-pressure`, `pid-pressure`, `unschedulable` NoSchedule
(`network-unavailable` too for hostNetwork pods). Node readiness is not checked, as upstream.

Placement, as upstream since 1.12 (ScheduleDaemonSetPods): each pod gets the required node
affinity term `matchFields metadata.name In [node]` (replacing the template's matchFields in
every term) and the scheduler (`orchestrator.scheduler.scheduler.Scheduler`, run by the same
manager) binds it, so resources, host ports and readiness are checked in one place. The
planner finds a pod's node from `spec.nodeName` or, while unbound, from that affinity term.
`use_scheduler=False` sets `spec.nodeName` at creation instead (for a manager without a
scheduler). A pod left unbound for a node that is gone is deleted like any pod of a vanished
node.

Per node the planner then (manage):

* creates a pod where one should run and none exists — not while an old one is still
  terminating, so a node never runs two copies (host ports, devices) outside a surge;
* deletes pods where none should continue running, failed pods, and extra copies (keeping the
  oldest; during a surge the oldest updated and the oldest old one);
* deletes, with no grace period, pods bound to nodes that no longer exist (no kubelet will ever
  finish a graceful delete there).

Rolling update (`updateStrategy.type` RollingUpdate; OnDelete replaces nothing, pods just get
the new template when re-created). A pod is *updated* when its `controller-revision-hash` label
is the template's hash. maxUnavailable (default 1) and maxSurge (default 0) are ints or
percentages of the desired node count, rounded up; both 0 means maxUnavailable 1.

* maxSurge 0: a node counts unavailable when it has no pod, a pod that is not available
  (Ready for minReadySeconds), or both an old and a new pod. Old pods that are not available are
  replaced at once; available old pods are deleted, node by node in name order, only while
  the unavailable count stays within maxUnavailable. The new pod is created by the next
  reconcile once the old one is gone.
* maxSurge > 0: a new pod is created next to an old one (at once if the old one is not
  available, else while fewer than maxSurge nodes have an unavailable new pod next to an old
  one); the old pod is deleted once the new one is available.

Invariants: the controller acts only when the pod cache shows its own previous writes
(`Expectations`), so maxUnavailable holds against a lagging cache; at most `BURST` creates per
reconcile, in slow-start batches 1, 2, 4, ...; status is computed from the cache (before this
reconcile's writes, as upstream) and patched only when it changed. A DaemonSet being deleted is
left to the garbage collector. Orphan pods matching the selector are not adopted, and no
ControllerRevision objects are kept (the hash label identifies a template).

Events: SuccessfulCreate / SuccessfulDelete (Normal), FailedCreate / FailedDelete (Warning).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import trio

from orchestrator.client.resource import DAEMONSETS, NODES, PODS
from orchestrator.controllers._workload import (
    REVISION_LABEL,
    available_in,
    is_terminating,
    phase,
    scaled_value,
    slow_start,
    spec,
)
from orchestrator.controllers.podutil import (
    Expectations,
    controller_ref,
    creation_time,
    is_pod_available,
    is_pod_ready,
    meta,
    pod_template_hash,
)
from orchestrator.controllers.runtime.client import Client
from orchestrator.controllers.runtime.controller import Controller, Result, enqueue_owner
from orchestrator.controllers.runtime.events import EventRecorder
from orchestrator.controllers.runtime.informer import (
    OWNER_INDEX,
    DeletedFinalStateUnknown,
    SharedInformer,
)
from orchestrator.controllers.runtime.manager import ControllerContext
from orchestrator.controllers.writes import finish_sync
from orchestrator.kube.errors import ApiError
from orchestrator.kube.objects import Obj
from orchestrator.kube.taints import tolerates
from orchestrator.metrics import REGISTRY, Registry
from orchestrator.scheduler import NodeInfo, PodInfo

__all__ = [
    "BURST",
    "DAEMON_TOLERATIONS",
    "DaemonSetController",
    "DaemonSetPlan",
    "daemon_pod",
    "daemonset_controller",
    "node_should_run",
    "plan_daemonset",
]

log = logging.getLogger(__name__)


BURST: Final = 250  # upstream's DaemonSet BurstReplicas
WORKERS: Final = 2  # upstream's --concurrent-daemonset-syncs

DAEMON_TOLERATIONS: Final[tuple[Obj, ...]] = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)
_HOST_NETWORK_TOLERATION: Final[Obj] = {
    "key": "node.kubernetes.io/network-unavailable",
    "operator": "Exists",
    "effect": "NoSchedule",
}


# ------------------------------------------------------------------------------ pure core
def daemon_tolerations(pod_spec: Obj) -> list[Obj]:
    """The template's tolerations plus the automatic DaemonSet ones it lacks."""
    have: list[Obj] = [dict(t) for t in pod_spec.get("tolerations") or [] if isinstance(t, dict)]
    extra = list(DAEMON_TOLERATIONS)
    if pod_spec.get("hostNetwork"):
        extra.append(_HOST_NETWORK_TOLERATION)
    for t in extra:
        if not any(_same_toleration(t, h) for h in have):
            have.append(dict(t))
    return have


def _same_toleration(a: Obj, b: Obj) -> bool:
    return all((a.get(k) or "") == (b.get(k) or "") for k in ("key", "operator", "value", "effect"))


def node_should_run(pod: PodInfo, node: NodeInfo) -> tuple[bool, bool]:
    """(should run, should continue running) for a daemon pod on `node`; `pod` is the template
    parsed with the automatic tolerations (see the module doc)."""
    if pod.node_name and pod.node_name != node.name:
        return False, False
    if pod.required is not None and not pod.required(node):
        return False, False
    should_run = should_continue = True
    for key, value, effect in node.hard_taints:
        if not any(tolerates(t, key, value, effect) for t in pod.tolerations):
            should_run = False
            if effect == "NoExecute":
                should_continue = False
    return should_run, should_continue


def _node_affinity(affinity: Any, node: str) -> Obj:
    """Upstream's ReplaceDaemonSetPodNodeNameNodeAffinity: every required term's matchFields
    become `metadata.name In [node]` (one such term when there were none)."""
    out: Obj = copy.deepcopy(affinity) if isinstance(affinity, dict) else {}
    na = out.setdefault("nodeAffinity", {})
    required = na.get("requiredDuringSchedulingIgnoredDuringExecution")
    fields = [{"key": "metadata.name", "operator": "In", "values": [node]}]
    terms = (required or {}).get("nodeSelectorTerms") or []
    if not terms:
        terms = [{}]
    na["requiredDuringSchedulingIgnoredDuringExecution"] = {
        "nodeSelectorTerms": [{**t, "matchFields": fields} for t in terms]
    }
    return out


def intended_node(pod: Obj) -> str:
    """The node a daemon pod is for: `spec.nodeName`, or while unbound the node named by its
    required `metadata.name In [node]` term."""
    s = spec(pod)
    if s.get("nodeName"):
        return str(s["nodeName"])
    required = (
        ((s.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms") or []
    for term in required:
        for req in term.get("matchFields") or []:
            values = req.get("values") or []
            if req.get("key") == "metadata.name" and req.get("operator") == "In" and values:
                return str(values[0])
    return ""


def daemon_pod(ds: Obj, node: str, revision: str, *, bind: bool) -> Obj:
    """The pod to create for `ds` on `node` (see the module doc for affinity and binding)."""
    template = copy.deepcopy(ds["spec"]["template"])
    t_meta = template.get("metadata") or {}
    ds_meta = meta(ds)
    pod_meta: Obj = {
        "generateName": f"{ds_meta['name']}-",
        "namespace": ds_meta.get("namespace", ""),
        "labels": {**(t_meta.get("labels") or {}), REVISION_LABEL: revision},
        "ownerReferences": [controller_ref(ds, "apps/v1", "DaemonSet")],
    }
    if t_meta.get("annotations"):
        pod_meta["annotations"] = dict(t_meta["annotations"])
    pod_spec: Obj = template.get("spec") or {}
    pod_spec["tolerations"] = daemon_tolerations(pod_spec)
    pod_spec["affinity"] = _node_affinity(pod_spec.get("affinity"), node)
    if bind:
        pod_spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": pod_spec}


@dataclass
class DaemonSetPlan:
    """What one reconcile should do: create pods on `create_on` nodes, delete `delete`
    (graceful) and `delete_now` (grace 0) pods, patch `status`, requeue after `requeue_after`
    seconds (0: no)."""

    revision: str
    create_on: list[str] = field(default_factory=list)
    delete: list[Obj] = field(default_factory=list)
    delete_now: list[Obj] = field(default_factory=list)
    status: Obj = field(default_factory=dict)
    requeue_after: float = 0.0


def _oldest_first(pods: Iterable[Obj]) -> list[Obj]:
    return sorted(pods, key=lambda p: (creation_time(p), meta(p).get("name", "")))


def plan_daemonset(
    ds: Obj,
    nodes: Iterable[NodeInfo],
    pods: Iterable[Obj],
    now: float,
) -> DaemonSetPlan:
    """Pure: the writes that move `ds`'s `pods` towards one updated, available pod per
    eligible node of `nodes`, and the status the cache shows (module doc)."""
    ds_spec = spec(ds)
    template = ds_spec.get("template") or {}
    revision = pod_template_hash(template, int((ds.get("status") or {}).get("collisionCount") or 0))
    plan = DaemonSetPlan(revision)
    t_spec = dict(template.get("spec") or {})
    t_spec["tolerations"] = daemon_tolerations(t_spec)
    info = PodInfo.from_pod(
        {"metadata": template.get("metadata") or {}, "spec": t_spec}, strict=False
    )
    min_ready = int(ds_spec.get("minReadySeconds") or 0)
    strategy = ds_spec.get("updateStrategy") or {}
    rolling = strategy.get("type", "RollingUpdate") == "RollingUpdate"
    ru = strategy.get("rollingUpdate") or {}

    by_node: dict[str, list[Obj]] = {}
    for pod in pods:
        by_node.setdefault(intended_node(pod), []).append(pod)

    eligible: dict[str, tuple[bool, bool]] = {}
    for node in nodes:
        eligible[node.name] = node_should_run(info, node)
    desired = sum(1 for run, _ in eligible.values() if run)
    max_surge = scaled_value(ru.get("maxSurge", 0), desired, round_up=True) if rolling else 0
    max_unavailable = scaled_value(ru.get("maxUnavailable", 1), desired, round_up=True)
    if rolling and max_surge == 0 and max_unavailable == 0:
        max_unavailable = 1

    # Pods bound to nodes that no longer exist; unbound pods with no intended node.
    for name, node_pods in by_node.items():
        if name not in eligible:
            plan.delete_now.extend(p for p in node_pods if not is_terminating(p))

    current = ready = available = updated = misscheduled = 0
    wait = 0.0
    # node -> (new pod, old pod) after manage, for the rolling update
    kept: dict[str, tuple[Obj | None, Obj | None]] = {}
    for name in sorted(eligible):
        should_run, should_continue = eligible[name]
        node_pods = by_node.get(name, [])
        live = _oldest_first(p for p in node_pods if not is_terminating(p))
        failed = [p for p in live if phase(p) == "Failed"]
        live = [p for p in live if phase(p) != "Failed"]
        terminating = any(is_terminating(p) for p in node_pods)
        plan.delete.extend(failed)

        if live:
            if should_run:
                current += 1
                first = live[0]
                if is_pod_ready(first):
                    ready += 1
                    left = available_in(first, min_ready, now)
                    if left == 0.0:
                        available += 1
                    elif left is not None:
                        wait = min(wait, left) if wait else left
                if meta(first).get("labels", {}).get(REVISION_LABEL) == revision:
                    updated += 1
            else:
                misscheduled += 1

        if not should_run and not should_continue:
            plan.delete.extend(live)
            continue
        if not should_run:
            continue  # NoSchedule taint under a running pod: leave it
        if not live:
            if not terminating and not failed:
                plan.create_on.append(name)
            kept[name] = (None, None)
            continue
        new = [p for p in live if meta(p).get("labels", {}).get(REVISION_LABEL) == revision]
        old = [p for p in live if p not in new]
        if max_surge > 0:
            keep_new, keep_old = new[:1], old[:1]
            plan.delete.extend(new[1:] + old[1:])
        else:
            keep = live[:1]
            plan.delete.extend(live[1:])
            keep_new = [p for p in keep if p in new]
            keep_old = [p for p in keep if p in old]
        kept[name] = (keep_new[0] if keep_new else None, keep_old[0] if keep_old else None)

    if rolling:
        if max_surge > 0:
            _surge(plan, kept, max_surge, min_ready, now)
        else:
            _replace(plan, kept, max_unavailable, min_ready, now)

    plan.status = {
        "desiredNumberScheduled": desired,
        "currentNumberScheduled": current,
        "numberMisscheduled": misscheduled,
        "numberReady": ready,
        "numberAvailable": available,
        "numberUnavailable": max(0, desired - available),
        "updatedNumberScheduled": updated,
        "observedGeneration": int(meta(ds).get("generation") or 0),
    }
    plan.requeue_after = wait + 1.0 if wait else 0.0
    return plan


def _replace(
    plan: DaemonSetPlan,
    kept: dict[str, tuple[Obj | None, Obj | None]],
    max_unavailable: int,
    min_ready: int,
    now: float,
) -> None:
    """maxSurge 0: delete old pods node by node within maxUnavailable (upstream's
    rollingUpdate); a node with no pod, or one about to be created, counts as unavailable."""
    unavailable = 0
    allowed: list[Obj] = []
    candidates: list[Obj] = []
    for name in sorted(kept):
        new, old = kept[name]
        if (new is None) == (old is None):  # no pod, or old and new: manage's turn
            unavailable += 1
        elif new is not None:
            if not is_pod_available(new, min_ready, now):
                unavailable += 1
        elif old is not None:
            if not is_pod_available(old, min_ready, now):
                allowed.append(old)
            elif unavailable < max_unavailable:
                candidates.append(old)
    room = max(0, min(max_unavailable - unavailable, len(candidates)))
    plan.delete.extend(allowed + candidates[:room])


def _surge(
    plan: DaemonSetPlan,
    kept: dict[str, tuple[Obj | None, Obj | None]],
    max_surge: int,
    min_ready: int,
    now: float,
) -> None:
    """maxSurge > 0: a new pod next to the old one first, the old one deleted once the new one
    is available (upstream's surge path)."""
    surging = 0
    allowed: list[str] = []
    candidates: list[str] = []
    for name in sorted(kept):
        new, old = kept[name]
        if old is None:
            continue
        if new is None:
            if not is_pod_available(old, min_ready, now):
                allowed.append(name)
            elif surging < max_surge:
                candidates.append(name)
        elif not is_pod_available(new, min_ready, now):
            surging += 1
        else:
            plan.delete.append(old)
    room = max(0, min(max_surge - surging, len(candidates)))
    plan.create_on.extend(allowed + candidates[:room])


# ------------------------------------------------------------------------------ reconciler
def _node_facts(node: Obj) -> tuple[object, ...]:
    s = spec(node)
    return (meta(node).get("labels"), s.get("taints"), s.get("unschedulable"))


class DaemonSetController:
    """The reconciler (see the module doc); `controller()` wires it to its informers."""

    def __init__(
        self,
        client: Client,
        daemonsets: SharedInformer,
        pods: SharedInformer,
        nodes: SharedInformer,
        events: EventRecorder,
        *,
        use_scheduler: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.daemonsets = daemonsets
        self.pods = pods
        self.nodes = nodes
        self.events = events
        self.use_scheduler = use_scheduler
        self.clock = clock
        self.expectations = Expectations()
        self._node_infos: dict[str, tuple[str, NodeInfo]] = {}  # name -> (resourceVersion, info)

    def controller(self, metrics: Registry = REGISTRY) -> Controller:
        c = Controller("daemonset", self, workers=WORKERS, metrics=metrics)
        c.watches(self.daemonsets)
        c.watches(self.pods, enqueue_owner("DaemonSet", "apps/v1"))
        c.watches(self.nodes, lambda _node: None)  # only for the cache sync; fan-out below

        def every_daemonset() -> None:
            for key in self.daemonsets.keys():  # noqa: SIM118  (an informer, not a dict)
                c.enqueue(key)

        def updated(old: Obj, new: Obj) -> None:
            if _node_facts(old) != _node_facts(new):
                every_daemonset()

        def gone(obj: Obj | DeletedFinalStateUnknown) -> None:
            every_daemonset()

        self.nodes.add_event_handler(
            on_add=lambda _n: every_daemonset(), on_update=updated, on_delete=gone
        )
        return c

    def _node_info(self, node: Obj) -> NodeInfo:
        m = meta(node)
        name, rv = str(m.get("name", "")), str(m.get("resourceVersion", ""))
        hit = self._node_infos.get(name)
        if hit is not None and hit[0] == rv:
            return hit[1]
        info = NodeInfo(name)
        info.set_node(node)
        self._node_infos[name] = (rv, info)
        return info

    async def reconcile(self, key: str) -> Result:
        ds = self.daemonsets.get(key)
        if ds is None:
            self.expectations.forget(key)
            return Result()
        if is_terminating(ds):
            return Result()
        nodes = self.nodes.list()
        names = {str(meta(n).get("name", "")) for n in nodes}
        for gone in [n for n in self._node_infos if n not in names]:
            del self._node_infos[gone]
        infos = [self._node_info(n) for n in nodes]
        uid = str(meta(ds).get("uid", ""))
        pods = self.pods.by_index(OWNER_INDEX, uid)
        plan = plan_daemonset(ds, infos, pods, self.clock())

        errors: list[BaseException] = []
        if self.expectations.satisfied(key, self.pods, self.clock()):
            errors = await self._act(key, ds, plan)
        return await finish_sync(
            self.client, DAEMONSETS, key, ds, plan.status, errors, plan.requeue_after, absent=0
        )

    async def _act(self, key: str, ds: Obj, plan: DaemonSetPlan) -> list[BaseException]:
        errors: list[BaseException] = []

        async def create(node: str) -> None:
            body = daemon_pod(ds, node, plan.revision, bind=not self.use_scheduler)
            try:
                pod = await self.client.create(PODS, body)
            except ApiError as exc:
                self.events.record(
                    ds, "Warning", "FailedCreate", f"Error creating: {exc.message} (node {node})"
                )
                raise
            self.expectations.created(key, str(meta(pod).get("resourceVersion", "")), self.clock())
            self.events.record(
                ds, "Normal", "SuccessfulCreate", f"Created pod: {meta(pod)['name']}"
            )

        async def delete(pod: Obj, grace: int | None) -> None:
            m = meta(pod)
            try:
                await self.client.delete(
                    PODS,
                    str(m["name"]),
                    str(m.get("namespace", "")),
                    preconditions={"uid": m.get("uid")},
                    grace_period_seconds=grace,
                )
            except ApiError as exc:
                if exc.code in (404, 409):
                    return
                self.events.record(ds, "Warning", "FailedDelete", f"Error deleting: {exc.message}")
                errors.append(exc)
                return
            self.expectations.deleted(
                key, f"{m.get('namespace', '')}/{m['name']}", str(m.get("uid", "")), self.clock()
            )
            self.events.record(ds, "Normal", "SuccessfulDelete", f"Deleted pod: {m['name']}")

        deletes: dict[str, tuple[Obj, int | None]] = {}
        for pod in plan.delete:
            deletes.setdefault(str(meta(pod).get("uid", "")), (pod, None))
        for pod in plan.delete_now:
            deletes[str(meta(pod).get("uid", ""))] = (pod, 0)
        _, create_errors = await slow_start(plan.create_on, create, burst=BURST)
        errors.extend(create_errors)
        async with trio.open_nursery() as nursery:  # deletes run in parallel, as upstream's
            for pod, grace in list(deletes.values())[:BURST]:
                nursery.start_soon(delete, pod, grace)
        return errors


def daemonset_controller(ctx: ControllerContext, *, use_scheduler: bool = True) -> Controller:
    """The DaemonSet controller for one term of leadership (registry entry)."""
    reconciler = DaemonSetController(
        ctx.client,
        ctx.informers.informer(DAEMONSETS),
        ctx.informers.informer(PODS),
        ctx.informers.informer(NODES),
        ctx.events,
        use_scheduler=use_scheduler,
    )
    return reconciler.controller(ctx.metrics)
