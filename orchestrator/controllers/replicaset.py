"""The ReplicaSet controller: keeps `spec.replicas` active pods matching a ReplicaSet's selector.

Theory of operation
-------------------
`reconcile("ns/name")` is level-based and reads only the informer caches (pods, ReplicaSets):

1. The ReplicaSet is gone: forget its expectations; done (its pods are the garbage
   collector's business).
2. Claim the namespace's pods (`podutil.claim`): pods controlled by this ReplicaSet that stopped
   matching the selector are released (their controller reference removed); pods without a
   controller that match are adopted, after an uncached GET confirms the ReplicaSet is not being
   deleted (upstream's recheck). Both are merge patches conditional on the pod's
   resourceVersion, so a stale cache fails with 409 and the key is retried.
3. `active` = owned pods neither finished nor being deleted.
4. If the expectations for the key are satisfied (the cache has seen all our earlier creates and
   deletes; see `podutil.Expectations`), act on `diff = len(active) - replicas`:
   * too few: create `min(-diff, burst)` pods from the template (generateName `<rs>-`, the
     template's labels/annotations/finalizers, a controller ownerReference with
     blockOwnerDeletion) in slow-start batches of 1, 2, 4, ... run concurrently; after a batch
     with a failure the rest is skipped (one failing create must not become 500);
   * too many: delete `min(diff, burst)` pods, the best candidates first (`deletion_rank`:
     unscheduled, Pending < Unknown < Running, not ready, lower pod-deletion-cost, more
     siblings on the same node, more recently ready, more restarts, newer), concurrently.
   Each successful write is recorded in the expectations before the reconcile returns (the
   work queue never hands one key to two workers, so no other sync can slip in between).
5. Status (`replicas`, `fullyLabeledReplicas`, `readyReplicas`, `availableReplicas`,
   `observedGeneration`, and a `ReplicaFailure` condition while creates/deletes fail) is
   written through `/status` whenever it differs from the cached one, conditional on the
   cached resourceVersion (a 409 just requeues: a newer ReplicaSet is on its way).
6. The outcome: a create/delete error propagates (rate-limited retry); with
   `minReadySeconds` and pods ready but not yet available, requeue when the first of them
   becomes available; with unsatisfied expectations, requeue when they expire.

Invariants: the controller never creates or deletes for a key whose expectations are
unsatisfied; it never touches pods controlled by another object; pods being deleted never
count as replicas; one sync creates or deletes at most `burst` (500) pods.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import trio

from orchestrator.controllers.adoption import claim_dependents, watch_orphans
from orchestrator.controllers.podutil import (
    Cache,
    Expectations,
    controller_ref,
    creation_time,
    ensure_orphan_index,
    int_value,
    is_pod_active,
    is_pod_available,
    is_pod_ready,
    labels_of,
    meta,
    pod_ready_since,
)
from orchestrator.controllers.runtime.client import PODS, REPLICASETS, Client
from orchestrator.controllers.runtime.controller import Controller, Result, enqueue_owner
from orchestrator.controllers.runtime.events import EventRecorder
from orchestrator.controllers.runtime.informer import (
    object_key,
)
from orchestrator.controllers.runtime.manager import ControllerContext
from orchestrator.kube.conditions import get_condition
from orchestrator.kube.errors import ApiError
from orchestrator.kube.jsonvalue import copy_json
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.columns import now_rfc3339
from orchestrator.kube.selectors import from_label_selector_object

__all__ = [
    "BURST_REPLICAS",
    "DEFAULT_WORKERS",
    "ReplicaSetReconciler",
    "deletion_rank",
    "replicaset_controller",
    "slow_start_batches",
]

log = logging.getLogger(__name__)

BURST_REPLICAS = 500  # creates or deletes per sync (upstream BurstReplicas)
DEFAULT_WORKERS = 5  # --concurrent-replicaset-syncs
DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
RS_API_VERSION = "apps/v1"
RS_KIND = "ReplicaSet"

_PHASE_RANK = {"Pending": 0, "Unknown": 1, "Running": 2}


def slow_start_batches(count: int, initial: int = 1) -> list[int]:
    """Batch sizes 1, 2, 4, ... adding up to `count` (the last one cut short)."""
    out: list[int] = []
    size = initial
    while count > 0:
        batch = min(size, count)
        out.append(batch)
        count -= batch
        size *= 2
    return out


def _deletion_cost(pod: Obj) -> int:
    raw = (meta(pod).get("annotations") or {}).get(DELETION_COST_ANNOTATION)
    return int_value(raw, 0) if raw is not None else 0


def _restarts(pod: Obj) -> int:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return sum(int_value(s.get("restartCount")) for s in statuses if isinstance(s, dict))


def deletion_rank(pods: list[Obj]) -> list[Obj]:
    """`pods` sorted best-to-delete first (upstream `ActivePodsWithRanks` ordering, see the
    module doc); ties broken by name so the order is deterministic."""
    on_node = Counter(str((p.get("spec") or {}).get("nodeName") or "") for p in pods)

    def key(pod: Obj) -> tuple[Any, ...]:
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        phase = (pod.get("status") or {}).get("phase") or "Pending"
        ready = is_pod_ready(pod)
        since = pod_ready_since(pod) if ready else None
        return (
            1 if node else 0,
            _PHASE_RANK.get(phase, 0),
            1 if ready else 0,
            _deletion_cost(pod),
            -on_node[node] if node else 0,
            -(since or 0.0),
            -_restarts(pod),
            -creation_time(pod),
            str(meta(pod).get("name") or ""),
        )

    return sorted(pods, key=key)


def pod_from_template(rs: Obj) -> Obj:
    """A new pod for `rs`: its template, generateName `<rs>-`, a controller reference."""
    template = (rs.get("spec") or {}).get("template") or {}
    tmeta = template.get("metadata") or {}
    pod_meta: Obj = {
        "generateName": f"{meta(rs).get('name')}-",
        "namespace": meta(rs).get("namespace"),
        "labels": dict(tmeta.get("labels") or {}),
        "ownerReferences": [controller_ref(rs, RS_API_VERSION, RS_KIND)],
    }
    if tmeta.get("annotations"):
        pod_meta["annotations"] = dict(tmeta["annotations"])
    if tmeta.get("finalizers"):
        pod_meta["finalizers"] = list(tmeta["finalizers"])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": pod_meta,
        "spec": copy_json(template.get("spec") or {}),
    }


def _without_nones(status: Obj) -> Obj:
    return {k: v for k, v in status.items() if v not in (None, [], 0) or k == "replicas"}


class ReplicaSetReconciler:
    """Level-based ReplicaSet sync (see the module doc)."""

    def __init__(
        self,
        client: Client,
        replicasets: Cache,
        pods: Cache,
        events: EventRecorder | None = None,
        *,
        burst: int = BURST_REPLICAS,
        clock: Callable[[], float] = time.time,
        expectations: Expectations | None = None,
    ) -> None:
        self.client = client
        self.replicasets = replicasets
        self.pods = pods
        self.events = events
        self.burst = burst
        self.clock = clock
        self.expectations = expectations or Expectations()

    def _event(self, obj: Obj, etype: str, reason: str, message: str) -> None:
        if self.events is not None:
            self.events.record(obj, etype, reason, message)

    async def reconcile(self, key: str) -> Result:
        rs = self.replicasets.get(key)
        if rs is None:
            self.expectations.forget(key)
            return Result()
        spec = rs.get("spec") or {}
        try:
            selector = from_label_selector_object(spec.get("selector"))
        except ApiError as exc:
            log.warning("replicaset %s: invalid selector: %s", key, exc)
            return Result()
        owned = await claim_dependents(self.client, rs, REPLICASETS, selector, self.pods, PODS)
        active = [p for p in owned if is_pod_active(p)]

        now = self.clock()
        manage_error: ApiError | None = None
        failure_reason = ""
        acted = False
        if not meta(rs).get("deletionTimestamp") and self.expectations.satisfied(
            key, self.pods, now
        ):
            diff = len(active) - int_value(spec.get("replicas"), 1)
            if diff != 0:
                acted = True
                if diff < 0:
                    failure_reason = "FailedCreate"
                    manage_error = await self._create(rs, key, min(-diff, self.burst))
                else:
                    failure_reason = "FailedDelete"
                    manage_error = await self._delete(rs, key, active, min(diff, self.burst))

        status_result = await self._update_status(rs, active, manage_error, failure_reason)
        if manage_error is not None:
            raise manage_error
        if status_result is not None:
            return status_result
        return self._requeue(key, rs, active, now, acted)

    # ------------------------------------------------------------------ manage
    async def _create(self, rs: Obj, key: str, count: int) -> ApiError | None:
        template = pod_from_template(rs)
        ns = str(meta(rs).get("namespace") or "")
        errors: list[ApiError] = []
        created = 0

        async def one() -> None:
            nonlocal created
            try:
                pod = await self.client.create(PODS, template, ns, read_only=True)  # rv only
            except ApiError as exc:
                errors.append(exc)
                return
            created += 1
            self.expectations.created(
                key, str(meta(pod).get("resourceVersion") or ""), self.clock()
            )

        for batch in slow_start_batches(count):
            async with trio.open_nursery() as nursery:
                for _ in range(batch):
                    nursery.start_soon(one)
            if errors:
                break
        if errors:
            self._event(rs, "Warning", "FailedCreate", f"Error creating: {errors[0].message}")
            return errors[0]
        if created:
            log.debug("replicaset %s: created %d pods", key, created)
        return None

    async def _delete(self, rs: Obj, key: str, active: list[Obj], count: int) -> ApiError | None:
        victims = active if count >= len(active) else deletion_rank(active)[:count]
        errors: list[ApiError] = []

        async def one(pod: Obj) -> None:
            m = meta(pod)
            try:
                await self.client.delete(
                    PODS,
                    str(m.get("name")),
                    str(m.get("namespace")),
                    preconditions={"uid": m.get("uid")},
                )
            except ApiError as exc:
                if exc.code not in (404, 409):
                    errors.append(exc)
                    return
            self.expectations.deleted(key, object_key(pod), str(m.get("uid")), self.clock())
            self._event(rs, "Normal", "SuccessfulDelete", f"Deleted pod: {m.get('name')}")

        async with trio.open_nursery() as nursery:
            for pod in victims:
                nursery.start_soon(one, pod)
        if errors:
            self._event(rs, "Warning", "FailedDelete", f"Error deleting: {errors[0].message}")
            return errors[0]
        return None

    # ------------------------------------------------------------------ status
    def calculate_status(
        self, rs: Obj, active: list[Obj], error: ApiError | None, reason: str, now: float
    ) -> Obj:
        spec = rs.get("spec") or {}
        old = rs.get("status") or {}
        template_labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
        min_ready = int_value(spec.get("minReadySeconds"))
        fully = sum(
            1
            for pod in active
            if all(labels_of(pod).get(k) == v for k, v in template_labels.items())
        )
        ready = sum(1 for p in active if is_pod_ready(p))
        available = sum(1 for p in active if is_pod_available(p, min_ready, now))
        conditions = [c for c in old.get("conditions") or [] if c.get("type") != "ReplicaFailure"]
        failure = get_condition(old, "ReplicaFailure")
        replicas = int_value(spec.get("replicas"), 1)
        if error is not None and (
            (reason == "FailedCreate" and len(active) < replicas)
            or (reason == "FailedDelete" and len(active) > replicas)
        ):
            stamp = now_rfc3339(now)
            cond = {
                "type": "ReplicaFailure",
                "status": "True",
                "reason": reason,
                "message": error.message,
                "lastTransitionTime": stamp,
            }
            if failure is not None and failure.get("status") == "True":
                cond["lastTransitionTime"] = failure.get("lastTransitionTime") or stamp
            conditions.append(cond)
        elif failure is not None and error is not None:
            conditions.append(failure)
        return _without_nones(
            {
                "replicas": len(active),
                "fullyLabeledReplicas": fully,
                "readyReplicas": ready,
                "availableReplicas": available,
                "observedGeneration": meta(rs).get("generation"),
                "conditions": conditions,
            }
        )

    async def _update_status(
        self, rs: Obj, active: list[Obj], error: ApiError | None, reason: str
    ) -> Result | None:
        status = self.calculate_status(rs, active, error, reason, self.clock())
        if _without_nones(rs.get("status") or {}) == status:
            return None
        body = {**rs, "status": status}
        try:
            await self.client.update(REPLICASETS, body, subresource="status")
        except ApiError as exc:
            if exc.code == 409:
                return Result(requeue=True)  # a newer ReplicaSet is on its way to the cache
            if exc.code != 404:  # 404: deleted; the cache will say so and the key is forgotten
                raise
        return None

    def _requeue(self, key: str, rs: Obj, active: list[Obj], now: float, acted: bool) -> Result:
        delays: list[float] = []
        min_ready = int_value((rs.get("spec") or {}).get("minReadySeconds"))
        if min_ready > 0:
            for pod in active:
                since = pod_ready_since(pod)
                if since is not None and since + min_ready > now:
                    delays.append(since + min_ready - now + 1.0)
        if not acted:
            expires = self.expectations.expires_in(key, now)
            if expires is not None:
                delays.append(expires)
        if delays:
            return Result(requeue_after=max(0.001, math.ceil(min(delays) * 1000) / 1000))
        return Result()


def replicaset_controller(
    ctx: ControllerContext, *, workers: int = DEFAULT_WORKERS, burst: int = BURST_REPLICAS
) -> Controller:
    """The ReplicaSet controller for one term of leadership (see the module doc)."""
    rs_informer = ctx.informers.informer(REPLICASETS)
    pod_informer = ctx.informers.informer(PODS)
    ensure_orphan_index(pod_informer)
    reconciler = ReplicaSetReconciler(
        ctx.client, rs_informer, pod_informer, ctx.events, burst=burst
    )
    controller = Controller("replicaset", reconciler, workers, metrics=ctx.metrics)
    controller.watches(rs_informer)
    controller.watches(pod_informer, enqueue_owner(RS_KIND, RS_API_VERSION))
    watch_orphans(controller, rs_informer, pod_informer)
    return controller
