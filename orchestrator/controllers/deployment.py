"""The Deployment controller: rolls a Deployment's pod template out through ReplicaSets.

Theory of operation
-------------------
A Deployment owns ReplicaSets (controller ownerReferences, claimed by selector like the
ReplicaSet controller claims pods). The **new** ReplicaSet is the one whose pod template equals
the Deployment's, ignoring the `pod-template-hash` label; all others are **old**. A new one is
named `<deployment>-<pod-template-hash>` (`podutil.pod_template_hash` of the template and
`status.collisionCount`), carries the hash as a label, in its selector and in its template, and
the annotations `deployment.kubernetes.io/revision` (1 + the highest old revision),
`desired-replicas` and `max-replicas` (replicas + maxSurge, used by proportional scaling).
Rolling back (`kubectl rollout undo` writes an old template back) or restarting (a template
annotation) is just a template change: an old ReplicaSet with an equal template becomes the
new one again and gets the next revision.

`reconcile("ns/name")` is level-based, reads the caches, acts, and returns; like upstream's
`syncDeployment` each sync does one step and the ReplicaSets' status changes bring it back:

* being deleted: only status;
* `spec.paused`, or a **scaling event** (an active ReplicaSet's desired-replicas annotation
  differs from `spec.replicas`): scale proportionally (`scale_plan`: a single active
  ReplicaSet takes the new size; otherwise the difference to `replicas + maxSurge` is spread in
  proportion to each ReplicaSet's share of its max-replicas, rounding leftovers onto the
  largest), no new ReplicaSet while paused, history cleanup, status;
* **RollingUpdate**: create/find the new ReplicaSet; scale it up so the total stays within
  `replicas + maxSurge`; otherwise scale old ones down so at least
  `replicas - maxUnavailable` stay available (their unhealthy pods first); when complete,
  delete old ReplicaSets with 0 replicas beyond `revisionHistoryLimit`;
* **Recreate**: scale every old ReplicaSet to 0, wait until none of their pods exist, then
  create/scale the new one.

Every ReplicaSet write is a PUT conditional on the cached resourceVersion, so a stale cache
fails with 409 and the sync is retried instead of acting twice on old numbers.

maxSurge/maxUnavailable (int or percent of replicas; 25 % by default): surge rounds up,
unavailable rounds down, and if both come to 0 unavailable is 1 (`resolve_fenceposts`).

Status (`calculate_status`): observedGeneration, replicas (pods of all ReplicaSets),
updatedReplicas (of the new one), ready, available, unavailable, collisionCount, and the
conditions `kubectl rollout status` reads (`rollout_conditions`):

    Available    True  MinimumReplicasAvailable   available >= replicas - maxUnavailable
                 False MinimumReplicasUnavailable
    Progressing  True  NewReplicaSetCreated       a new ReplicaSet was just created
                 True  FoundNewReplicaSet         the new ReplicaSet existed, no condition yet
                 True  ReplicaSetUpdated          progress (more updated/ready/available pods,
                                                  fewer old): lastUpdateTime refreshed
                 True  NewReplicaSetAvailable     complete: every replica updated and available
                 False ProgressDeadlineExceeded   no progress for progressDeadlineSeconds
                 Unknown DeploymentPaused / DeploymentResumed
    ReplicaFailure  copied from a ReplicaSet's ReplicaFailure condition

A progressing deployment is requeued for when its deadline would pass. The revision
annotation is mirrored onto the Deployment (kubectl rollout history/undo read it).

Invariants: only the controller owner's ReplicaSets are scaled or deleted; no new ReplicaSet is
created while paused; a ReplicaSet still holding replicas is never deleted by history cleanup.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.controllers.adoption import claim_dependents
from orchestrator.controllers.podutil import (
    POD_TEMPLATE_HASH_LABEL,
    Cache,
    controller_ref,
    creation_time,
    ensure_orphan_index,
    int_value,
    labels_of,
    meta,
    pod_template_hash,
)
from orchestrator.controllers.runtime.client import DEPLOYMENTS, PODS, REPLICASETS, Client
from orchestrator.controllers.runtime.controller import Controller, Result, enqueue_owner
from orchestrator.controllers.runtime.events import EventRecorder
from orchestrator.controllers.runtime.informer import (
    NAMESPACE_INDEX,
    OWNER_INDEX,
    SharedInformer,
    controller_of,
    deleted_object,
    object_key,
)
from orchestrator.controllers.runtime.manager import ControllerContext
from orchestrator.kube.errors import ApiError
from orchestrator.kube.jsonvalue import copy_json
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.columns import now_rfc3339, parse_rfc3339
from orchestrator.kube.selectors import LabelSelector, from_label_selector_object

__all__ = [
    "DEFAULT_WORKERS",
    "DESIRED_REPLICAS_ANNOTATION",
    "MAX_REPLICAS_ANNOTATION",
    "REVISION_ANNOTATION",
    "DeploymentReconciler",
    "calculate_status",
    "deployment_controller",
    "history_to_delete",
    "max_surge",
    "max_unavailable",
    "new_rs_new_replicas",
    "resolve_fenceposts",
    "rollout_conditions",
    "scale_plan",
    "scaled_value",
]

log = logging.getLogger(__name__)

DEFAULT_WORKERS = 5  # --concurrent-deployment-syncs
API_VERSION = "apps/v1"
KIND = "Deployment"
REVISION_ANNOTATION = "deployment.kubernetes.io/revision"
REVISION_HISTORY_ANNOTATION = "deployment.kubernetes.io/revision-history"
DESIRED_REPLICAS_ANNOTATION = "deployment.kubernetes.io/desired-replicas"
MAX_REPLICAS_ANNOTATION = "deployment.kubernetes.io/max-replicas"
ROLLBACK_ANNOTATION = "deprecated.deployment.rollback.to"
LAST_APPLIED_ANNOTATION = "kubectl.kubernetes.io/last-applied-configuration"
_SKIP_COPY = {
    LAST_APPLIED_ANNOTATION,
    REVISION_ANNOTATION,
    REVISION_HISTORY_ANNOTATION,
    DESIRED_REPLICAS_ANNOTATION,
    MAX_REPLICAS_ANNOTATION,
    ROLLBACK_ANNOTATION,
}

AVAILABLE = "Available"
PROGRESSING = "Progressing"
REPLICA_FAILURE = "ReplicaFailure"
NEW_RS_REASON = "NewReplicaSetCreated"
FOUND_NEW_RS_REASON = "FoundNewReplicaSet"
RS_UPDATED_REASON = "ReplicaSetUpdated"
NEW_RS_AVAILABLE_REASON = "NewReplicaSetAvailable"
TIMED_OUT_REASON = "ProgressDeadlineExceeded"
PAUSED_REASON = "DeploymentPaused"
RESUMED_REASON = "DeploymentResumed"
MIN_AVAILABLE_REASON = "MinimumReplicasAvailable"
MIN_UNAVAILABLE_REASON = "MinimumReplicasUnavailable"


# ================================================================================== pure core
def spec_of(obj: Obj) -> Obj:
    s = obj.get("spec")
    return s if isinstance(s, dict) else {}


def status_of(obj: Obj) -> Obj:
    s = obj.get("status")
    return s if isinstance(s, dict) else {}


def replicas_of(obj: Obj) -> int:
    """`spec.replicas` (1 when unset, as the API defaults it)."""
    return int_value(spec_of(obj).get("replicas"), 1)


def scaled_value(value: Any, total: int, *, round_up: bool) -> int:
    """intstr's `GetScaledValueFromIntOrPercent`: an int as is, "N%" of `total` rounded."""
    if value is None:
        return 0
    if isinstance(value, str):
        text = value.strip()
        if text.endswith("%"):
            scaled = int_value(text[:-1]) * total / 100
            return math.ceil(scaled) if round_up else math.floor(scaled)
        return int_value(text)
    return int_value(value)


def _rolling(d: Obj) -> Obj | None:
    strategy = spec_of(d).get("strategy") or {}
    if (strategy.get("type") or "RollingUpdate") != "RollingUpdate":
        return None
    rolling = strategy.get("rollingUpdate")
    return rolling if isinstance(rolling, dict) else {}


def resolve_fenceposts(surge: Any, unavailable: Any, desired: int) -> tuple[int, int]:
    """(maxSurge, maxUnavailable) as numbers: surge rounds up, unavailable down; both 0 ->
    unavailable 1 (a rollout must be able to move)."""
    s = scaled_value("25%" if surge is None else surge, desired, round_up=True)
    u = scaled_value("25%" if unavailable is None else unavailable, desired, round_up=False)
    if s == 0 and u == 0:
        u = 1
    return s, u


def max_surge(d: Obj) -> int:
    rolling = _rolling(d)
    if rolling is None:
        return 0
    return resolve_fenceposts(
        rolling.get("maxSurge"), rolling.get("maxUnavailable"), replicas_of(d)
    )[0]


def max_unavailable(d: Obj) -> int:
    rolling = _rolling(d)
    replicas = replicas_of(d)
    if rolling is None or replicas == 0:
        return 0
    u = resolve_fenceposts(rolling.get("maxSurge"), rolling.get("maxUnavailable"), replicas)[1]
    return min(u, replicas)


def revision(rs: Obj) -> int:
    return int_value((meta(rs).get("annotations") or {}).get(REVISION_ANNOTATION), 0)


def _without_hash(template: Any) -> Obj:
    t = dict(template) if isinstance(template, dict) else {}  # only metadata changes
    tmeta = t.get("metadata")
    if isinstance(tmeta, dict):
        tmeta = t["metadata"] = dict(tmeta)
        labels = dict(tmeta.get("labels") or {})
        labels.pop(POD_TEMPLATE_HASH_LABEL, None)
        if labels:
            tmeta["labels"] = labels
        else:
            tmeta.pop("labels", None)
        if not tmeta:
            t.pop("metadata", None)
    return t


def equal_ignore_hash(a: Any, b: Any) -> bool:
    """Pod templates equal but for the `pod-template-hash` label."""
    return _without_hash(a) == _without_hash(b)


def find_new_and_old(d: Obj, rss: list[Obj]) -> tuple[Obj | None, list[Obj]]:
    """The ReplicaSet whose template is the Deployment's (the oldest if several), and the rest."""
    template = spec_of(d).get("template")
    new: Obj | None = None
    for rs in sorted(rss, key=lambda r: (creation_time(r), meta(r).get("name") or "")):
        if equal_ignore_hash(spec_of(rs).get("template"), template):
            new = rs
            break
    return new, [rs for rs in rss if rs is not new]


def _sum(rss: list[Obj], fn: Callable[[Obj], int]) -> int:
    return sum(fn(rs) for rs in rss)


def _available(rs: Obj) -> int:
    return int_value(status_of(rs).get("availableReplicas"))


def new_rs_new_replicas(d: Obj, all_rss: list[Obj], new_rs: Obj) -> int:
    """How big the new ReplicaSet may be now (upstream `NewRSNewReplicas`)."""
    replicas = replicas_of(d)
    if _rolling(d) is None:
        return replicas
    current = _sum(all_rss, replicas_of)
    max_total = replicas + max_surge(d)
    if current >= max_total:
        return replicas_of(new_rs)
    up = min(max_total - current, max(0, replicas - replicas_of(new_rs)))
    return replicas_of(new_rs) + up


def _by_age(rss: list[Obj]) -> list[Obj]:
    return sorted(rss, key=lambda r: (creation_time(r), meta(r).get("name") or ""))


def cleanup_unhealthy(old_rss: list[Obj], max_cleanup: int) -> list[tuple[Obj, int]]:
    """Old ReplicaSets scaled down by their unavailable replicas, oldest first, at most
    `max_cleanup` in total: [(rs, new size)]."""
    out: list[tuple[Obj, int]] = []
    total = 0
    for rs in _by_age(old_rss):
        if total >= max_cleanup:
            break
        size = replicas_of(rs)
        # Status may still count more available replicas than the spec now asks for (it lags
        # a scale-down): then there is nothing unhealthy to clean up, and `size - available`
        # would be negative, i.e. a scale-up (upstream refuses that case with an error).
        if size == 0 or size <= _available(rs):
            continue
        down = min(max_cleanup - total, size - _available(rs))
        out.append((rs, size - down))
        total += down
    return out


def scale_down_old_for_rolling(
    d: Obj, all_rss: list[Obj], old_rss: list[Obj]
) -> list[tuple[Obj, int]]:
    """Old ReplicaSets scaled down while at least replicas - maxUnavailable stay available."""
    min_available = replicas_of(d) - max_unavailable(d)
    available = _sum(all_rss, _available)
    if available <= min_available:
        return []
    budget = available - min_available
    out: list[tuple[Obj, int]] = []
    total = 0
    for rs in _by_age(old_rss):
        if total >= budget:
            break
        size = replicas_of(rs)
        if size == 0:
            continue
        down = min(size, budget - total)
        out.append((rs, size - down))
        total += down
    return out


def _active(rss: list[Obj | None]) -> list[Obj]:
    return [rs for rs in rss if rs is not None and replicas_of(rs) > 0]


def _annotation_int(rs: Obj, name: str) -> int | None:
    raw = (meta(rs).get("annotations") or {}).get(name)
    if raw is None:
        return None
    try:
        return int(str(raw))
    except ValueError:
        return None


def is_scaling_event(d: Obj, new_rs: Obj | None, old_rss: list[Obj]) -> bool:
    for rs in _active([*old_rss, new_rs]):
        desired = _annotation_int(rs, DESIRED_REPLICAS_ANNOTATION)
        if desired is not None and desired != replicas_of(d):
            return True
    return False


def _go_round(x: float) -> int:
    """Go's math.Round: half away from zero."""
    return math.floor(abs(x) + 0.5) * (1 if x >= 0 else -1)


def _proportion(d: Obj, rs: Obj, to_add: int, added: int) -> int:
    if replicas_of(rs) == 0 or to_add == 0 or to_add == added:
        return 0
    if replicas_of(d) == 0:
        fraction = -replicas_of(rs)
    else:
        annotated = _annotation_int(rs, MAX_REPLICAS_ANNOTATION)
        if not annotated:
            annotated = int_value(status_of(d).get("replicas"))
        if not annotated:
            return 0
        target = replicas_of(rs) * (replicas_of(d) + max_surge(d)) / annotated
        fraction = _go_round(target) - replicas_of(rs)
    allowed = to_add - added
    return min(fraction, allowed) if to_add > 0 else max(fraction, allowed)


def scale_plan(d: Obj, new_rs: Obj | None, old_rss: list[Obj]) -> list[tuple[Obj, int]]:
    """The sizes a scaling event gives the ReplicaSets (upstream `scale`): [(rs, size)]."""
    replicas = replicas_of(d)
    newest_first = sorted(
        old_rss, key=lambda r: (creation_time(r), meta(r).get("name") or ""), reverse=True
    )
    active = _active([*newest_first, new_rs])
    if not active and (new_rs is not None or newest_first):
        latest = new_rs if new_rs is not None else newest_first[0]
        return [] if replicas_of(latest) == replicas else [(latest, replicas)]
    if len(active) == 1:
        return [] if replicas_of(active[0]) == replicas else [(active[0], replicas)]
    if (
        new_rs is not None
        and _annotation_int(new_rs, DESIRED_REPLICAS_ANNOTATION) == replicas
        and replicas_of(new_rs) == replicas
        and _available(new_rs) == replicas
    ):
        return [(rs, 0) for rs in _active(list(old_rss))]
    if _rolling(d) is None:
        return []
    allowed = replicas + max_surge(d) if replicas > 0 else 0
    to_add = allowed - _sum(active, replicas_of)

    def newer(rs: Obj) -> float:
        return creation_time(rs)

    if to_add > 0:  # biggest first, newer first among equals
        ordered = sorted(active, key=lambda r: (-replicas_of(r), -newer(r)))
    else:  # biggest first, older first among equals
        ordered = sorted(active, key=lambda r: (-replicas_of(r), newer(r)))
    sizes: dict[str, int] = {}
    added = 0
    for rs in ordered:
        name = str(meta(rs).get("name"))
        if to_add != 0:
            p = _proportion(d, rs, to_add, added)
            sizes[name] = replicas_of(rs) + p
            added += p
        else:
            sizes[name] = replicas_of(rs)
    if to_add != 0 and ordered:
        first = str(meta(ordered[0]).get("name"))
        sizes[first] = max(0, sizes[first] + to_add - added)
    return [(rs, sizes[str(meta(rs).get("name"))]) for rs in ordered]


def history_to_delete(d: Obj, old_rss: list[Obj]) -> list[Obj]:
    """Old ReplicaSets beyond `revisionHistoryLimit`, oldest revisions first, that hold no
    pods and whose status is current."""
    limit = spec_of(d).get("revisionHistoryLimit")
    if limit is None:
        return []
    alive = [rs for rs in old_rss if not meta(rs).get("deletionTimestamp")]
    diff = len(alive) - int_value(limit)
    if diff <= 0:
        return []
    alive.sort(key=lambda r: (revision(r), creation_time(r), meta(r).get("name") or ""))
    out = []
    for rs in alive[:diff]:
        if (
            int_value(status_of(rs).get("replicas")) != 0
            or replicas_of(rs) != 0
            or int_value(meta(rs).get("generation"))
            > int_value(status_of(rs).get("observedGeneration"))
        ):
            continue
        out.append(rs)
    return out


# ---------------------------------------------------------------------------- conditions
def get_condition(status: Obj, ctype: str) -> Obj | None:
    for cond in status.get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == ctype:
            return cond
    return None


def new_condition(ctype: str, status: str, reason: str, message: str, now: float) -> Obj:
    stamp = now_rfc3339(now)
    return {
        "type": ctype,
        "status": status,
        "lastUpdateTime": stamp,
        "lastTransitionTime": stamp,
        "reason": reason,
        "message": message,
    }


def set_condition(status: Obj, cond: Obj) -> None:
    """Upstream `SetDeploymentCondition`: same status and reason -> unchanged; same status ->
    the transition time is kept."""
    current = get_condition(status, cond["type"])
    if current is not None and current.get("status") == cond["status"]:
        if current.get("reason") == cond["reason"]:
            return
        cond = {**cond, "lastTransitionTime": current.get("lastTransitionTime")}
    remove_condition(status, cond["type"])
    status.setdefault("conditions", []).append(cond)


def remove_condition(status: Obj, ctype: str) -> None:
    conds = [c for c in status.get("conditions") or [] if c.get("type") != ctype]
    if conds:
        status["conditions"] = conds
    else:
        status.pop("conditions", None)


def has_progress_deadline(d: Obj) -> bool:
    deadline = spec_of(d).get("progressDeadlineSeconds")
    return deadline is not None and int_value(deadline) != 2**31 - 1


def calculate_status(
    d: Obj, all_rss: list[Obj], new_rs: Obj | None, conditions: list[Obj], now: float
) -> Obj:
    """Counts from the ReplicaSets plus the Available condition (upstream `calculateStatus`)."""
    available = _sum(all_rss, _available)
    total = _sum(all_rss, replicas_of)
    status: Obj = {
        "observedGeneration": meta(d).get("generation"),
        "replicas": _sum(all_rss, lambda r: int_value(status_of(r).get("replicas"))),
        "updatedReplicas": int_value(status_of(new_rs).get("replicas")) if new_rs else 0,
        "readyReplicas": _sum(all_rss, lambda r: int_value(status_of(r).get("readyReplicas"))),
        "availableReplicas": available,
        "unavailableReplicas": max(0, total - available),
        "conditions": copy_json(conditions),
    }
    if status_of(d).get("collisionCount") is not None:
        status["collisionCount"] = status_of(d)["collisionCount"]
    if available >= replicas_of(d) - max_unavailable(d):
        cond = new_condition(
            AVAILABLE, "True", MIN_AVAILABLE_REASON, "Deployment has minimum availability.", now
        )
    else:
        cond = new_condition(
            AVAILABLE,
            "False",
            MIN_UNAVAILABLE_REASON,
            "Deployment does not have minimum availability.",
            now,
        )
    set_condition(status, cond)
    return status


def deployment_complete(d: Obj, status: Obj) -> bool:
    replicas = replicas_of(d)
    return (
        int_value(status.get("updatedReplicas")) == replicas
        and int_value(status.get("replicas")) == replicas
        and int_value(status.get("availableReplicas")) == replicas
        and int_value(status.get("observedGeneration")) >= int_value(meta(d).get("generation"))
    )


def deployment_progressing(d: Obj, new: Obj) -> bool:
    old = status_of(d)
    old_old = int_value(old.get("replicas")) - int_value(old.get("updatedReplicas"))
    new_old = int_value(new.get("replicas")) - int_value(new.get("updatedReplicas"))
    return (
        int_value(new.get("updatedReplicas")) > int_value(old.get("updatedReplicas"))
        or new_old < old_old
        or int_value(new.get("readyReplicas")) > int_value(old.get("readyReplicas"))
        or int_value(new.get("availableReplicas")) > int_value(old.get("availableReplicas"))
    )


def deployment_timed_out(d: Obj, status: Obj, now: float) -> bool:
    if not has_progress_deadline(d):
        return False
    cond = get_condition(status, PROGRESSING)
    if cond is None or cond.get("reason") == NEW_RS_AVAILABLE_REASON:
        return False
    if cond.get("reason") == TIMED_OUT_REASON:
        return True
    since = parse_rfc3339(str(cond.get("lastUpdateTime") or ""))
    if since is None:
        return False
    return since + int_value(spec_of(d).get("progressDeadlineSeconds")) < now


def rollout_conditions(
    d: Obj, all_rss: list[Obj], new_rs: Obj | None, conditions: list[Obj], now: float
) -> Obj:
    """The status of a rollout step (upstream `syncRolloutStatus`)."""
    status = calculate_status(d, all_rss, new_rs, conditions, now)
    if not has_progress_deadline(d):
        remove_condition(status, PROGRESSING)
    current = get_condition(status, PROGRESSING)
    complete = (
        status["replicas"] == status["updatedReplicas"]
        and current is not None
        and current.get("reason") == NEW_RS_AVAILABLE_REASON
    )
    name = meta(new_rs).get("name") if new_rs is not None else None
    what = f'ReplicaSet "{name}"' if name else f'Deployment "{meta(d).get("name")}"'
    if has_progress_deadline(d) and not complete:
        if deployment_complete(d, status):
            set_condition(
                status,
                new_condition(
                    PROGRESSING,
                    "True",
                    NEW_RS_AVAILABLE_REASON,
                    f"{what} has successfully progressed.",
                    now,
                ),
            )
        elif deployment_progressing(d, status):
            cond = new_condition(
                PROGRESSING, "True", RS_UPDATED_REASON, f"{what} is progressing.", now
            )
            if current is not None:
                if current.get("status") == "True":
                    cond["lastTransitionTime"] = current.get("lastTransitionTime")
                remove_condition(status, PROGRESSING)
            set_condition(status, cond)
        elif deployment_timed_out(d, status, now):
            set_condition(
                status,
                new_condition(
                    PROGRESSING,
                    "False",
                    TIMED_OUT_REASON,
                    f"{what} has timed out progressing.",
                    now,
                ),
            )
    failures = [
        c
        for rs in all_rss
        for c in status_of(rs).get("conditions") or []
        if c.get("type") == REPLICA_FAILURE and c.get("status") == "True"
    ]
    if failures:
        f = failures[0]
        set_condition(
            status,
            new_condition(
                REPLICA_FAILURE,
                "True",
                str(f.get("reason") or ""),
                str(f.get("message") or ""),
                now,
            ),
        )
    else:
        remove_condition(status, REPLICA_FAILURE)
    return status


def requeue_stuck(d: Obj, status: Obj, now: float) -> float | None:
    """Seconds until a progressing rollout's deadline passes (None: nothing to wait for)."""
    cond = get_condition(status, PROGRESSING)
    if not has_progress_deadline(d) or cond is None or deployment_complete(d, status):
        return None
    if cond.get("reason") in (TIMED_OUT_REASON, NEW_RS_AVAILABLE_REASON):
        return None
    since = parse_rfc3339(str(cond.get("lastUpdateTime") or ""))
    if since is None:
        return None
    return max(0.05, since + int_value(spec_of(d).get("progressDeadlineSeconds")) - now + 0.05)


def _same_status(a: Obj, b: Obj) -> bool:
    def norm(s: Obj) -> Obj:
        return {k: v for k, v in s.items() if v not in (None, 0, [])}

    return norm(a) == norm(b)


# ================================================================================== reconciler
@dataclass
class _Sync:
    """One sync's working state: the Deployment (latest we wrote) and its status conditions."""

    d: Obj
    conditions: list[Obj]
    revision: str | None = None  # the revision annotation the Deployment should carry
    collision_bump: bool = False


class DeploymentReconciler:
    """Level-based Deployment sync (see the module doc)."""

    def __init__(
        self,
        client: Client,
        deployments: Cache,
        replicasets: Cache,
        pods: Cache,
        events: EventRecorder | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.deployments = deployments
        self.replicasets = replicasets
        self.pods = pods
        self.events = events
        self.clock = clock

    def _event(self, obj: Obj, etype: str, reason: str, message: str) -> None:
        if self.events is not None:
            self.events.record(obj, etype, reason, message)

    async def reconcile(self, key: str) -> Result:
        try:
            return await self._reconcile(key)
        except ApiError as exc:
            if exc.code == 409:  # a write based on a stale cache: retry on fresher data
                log.debug("deployment %s: %s; retrying", key, exc)
                return Result(requeue=True)
            raise

    async def _reconcile(self, key: str) -> Result:
        cached = self.deployments.get(key)
        if cached is None:
            return Result()
        d = copy_json(cached)
        try:
            selector = from_label_selector_object(spec_of(d).get("selector"))
        except ApiError as exc:
            log.warning("deployment %s: invalid selector: %s", key, exc)
            return Result()
        if selector.empty():
            self._event(
                d,
                "Warning",
                "SelectingAll",
                "This deployment is selecting all pods. A non-empty selector is required.",
            )
            return Result()
        rss = await claim_dependents(
            self.client, d, DEPLOYMENTS, selector, self.replicasets, REPLICASETS
        )
        sync = _Sync(d, copy_json(status_of(d).get("conditions") or []))
        now = self.clock()
        if meta(d).get("deletionTimestamp"):
            new_rs, old_rss = find_new_and_old(d, rss)
            return await self._finish(
                sync, [*old_rss, *([new_rs] if new_rs else [])], new_rs, rollout=False
            )
        self._paused_conditions(sync, now)
        if spec_of(d).get("paused"):
            return await self._scale_sync(sync, rss)
        new_rs, old_rss = find_new_and_old(d, rss)
        if is_scaling_event(d, new_rs, old_rss):
            return await self._scale_sync(sync, rss)
        strategy = (spec_of(d).get("strategy") or {}).get("type") or "RollingUpdate"
        if strategy == "Recreate":
            return await self._recreate(sync, rss)
        return await self._rolling(sync, rss)

    # ------------------------------------------------------------------ the new ReplicaSet
    async def _new_and_old(
        self, sync: _Sync, rss: list[Obj], create: bool
    ) -> tuple[Obj | None, list[Obj]]:
        """upstream `getAllReplicaSetsAndSyncRevision`."""
        d = sync.d
        new_rs, old_rss = find_new_and_old(d, rss)
        next_revision = str(max((revision(r) for r in old_rss), default=0) + 1)
        now = self.clock()
        if new_rs is not None:
            new_rs = await self._sync_new_rs_annotations(d, new_rs, next_revision)
            sync.revision = str(
                (meta(new_rs).get("annotations") or {}).get(REVISION_ANNOTATION) or ""
            )
            if (
                has_progress_deadline(d)
                and get_condition({"conditions": sync.conditions}, PROGRESSING) is None
            ):
                holder: Obj = {"conditions": sync.conditions}
                set_condition(
                    holder,
                    new_condition(
                        PROGRESSING,
                        "True",
                        FOUND_NEW_RS_REASON,
                        f'Found new replica set "{meta(new_rs).get("name")}"',
                        now,
                    ),
                )
                sync.conditions = holder.get("conditions") or []
            return new_rs, old_rss
        if not create:
            return None, old_rss
        created = await self._create_new_rs(sync, old_rss, next_revision)
        return created, old_rss

    async def _sync_new_rs_annotations(self, d: Obj, rs: Obj, next_revision: str) -> Obj:
        annotations = dict(meta(rs).get("annotations") or {})
        changed = False
        for k, v in (meta(d).get("annotations") or {}).items():
            if k not in _SKIP_COPY and annotations.get(k) != v:
                annotations[k] = v
                changed = True
        old_revision = annotations.get(REVISION_ANNOTATION)
        if int_value(old_revision, 0) < int(next_revision):
            annotations[REVISION_ANNOTATION] = next_revision
            if old_revision:
                history = [
                    h
                    for h in str(annotations.get(REVISION_HISTORY_ANNOTATION) or "").split(",")
                    if h
                ]
                annotations[REVISION_HISTORY_ANNOTATION] = ",".join([*history, str(old_revision)])
            changed = True
        min_ready = spec_of(d).get("minReadySeconds")
        if int_value(spec_of(rs).get("minReadySeconds")) != int_value(min_ready):
            changed = True
        if not changed:
            return rs
        body = copy_json(rs)
        body["metadata"]["annotations"] = annotations
        body["spec"]["minReadySeconds"] = int_value(min_ready)
        updated: Obj = await self.client.update(REPLICASETS, body)
        return updated

    async def _create_new_rs(
        self, sync: _Sync, old_rss: list[Obj], next_revision: str
    ) -> Obj | None:
        d = sync.d
        ns = str(meta(d).get("namespace") or "")
        collision = status_of(d).get("collisionCount")
        template = copy_json(spec_of(d).get("template") or {})
        h = pod_template_hash(template, int_value(collision) if collision is not None else None)
        tmeta = template.setdefault("metadata", {})
        tmeta["labels"] = {**(tmeta.get("labels") or {}), POD_TEMPLATE_HASH_LABEL: h}
        selector = copy_json(spec_of(d).get("selector") or {})
        selector["matchLabels"] = {
            **(selector.get("matchLabels") or {}),
            POD_TEMPLATE_HASH_LABEL: h,
        }
        annotations = {
            k: v for k, v in (meta(d).get("annotations") or {}).items() if k not in _SKIP_COPY
        }
        replicas = replicas_of(d)
        surge = max_surge(d)
        annotations.update(
            {
                REVISION_ANNOTATION: next_revision,
                DESIRED_REPLICAS_ANNOTATION: str(replicas),
                MAX_REPLICAS_ANNOTATION: str(replicas + surge),
            }
        )
        name = f"{meta(d).get('name')}-{h}"
        body: Obj = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": name,
                "namespace": ns,
                "labels": dict(tmeta["labels"]),
                "annotations": annotations,
                "ownerReferences": [controller_ref(d, API_VERSION, KIND)],
            },
            "spec": {
                "replicas": 0,
                "minReadySeconds": int_value(spec_of(d).get("minReadySeconds")),
                "selector": selector,
                "template": template,
            },
        }
        body["spec"]["replicas"] = new_rs_new_replicas(d, [*old_rss, body], body)
        now = self.clock()
        try:
            created: Obj = await self.client.create(REPLICASETS, body, ns)
        except ApiError as exc:
            if exc.code != 409:
                raise
            existing = await self.client.get(REPLICASETS, name, ns)
            ref = controller_of(existing)
            if (
                ref is not None
                and ref.get("uid") == meta(d).get("uid")
                and equal_ignore_hash(spec_of(existing).get("template"), spec_of(d).get("template"))
            ):
                sync.revision = str(
                    (meta(existing).get("annotations") or {}).get(REVISION_ANNOTATION)
                    or next_revision
                )
                return existing  # our cache had not seen it yet
            # A hash collision: another template owns the name. Bump collisionCount and retry.
            sync.collision_bump = True
            log.info("deployment %s/%s: hash collision on %s", ns, meta(d).get("name"), name)
            return None
        sync.revision = next_revision
        if has_progress_deadline(d):
            holder: Obj = {"conditions": sync.conditions}
            set_condition(
                holder,
                new_condition(
                    PROGRESSING, "True", NEW_RS_REASON, f'Created new replica set "{name}"', now
                ),
            )
            sync.conditions = holder.get("conditions") or []
        size = replicas_of(created)
        if size > 0:
            self._event(d, "Normal", "ScalingReplicaSet", f"Scaled up replica set {name} to {size}")
        return created

    # ------------------------------------------------------------------ scaling
    async def _scale(self, d: Obj, rs: Obj, size: int) -> tuple[bool, Obj]:
        """Set `rs` to `size` replicas (and the replicas annotations); (size changed, rs)."""
        replicas = replicas_of(d)
        surge = max_surge(d)
        annotations = dict(meta(rs).get("annotations") or {})
        want = {
            DESIRED_REPLICAS_ANNOTATION: str(replicas),
            MAX_REPLICAS_ANNOTATION: str(replicas + surge),
        }
        old_size = replicas_of(rs)
        size_changed = old_size != size
        if not size_changed and all(annotations.get(k) == v for k, v in want.items()):
            return False, rs
        body = copy_json(rs)
        body["spec"]["replicas"] = size
        body["metadata"]["annotations"] = {**annotations, **want}
        updated: Obj = await self.client.update(REPLICASETS, body)
        if size_changed:
            direction = "up" if size > old_size else "down"
            self._event(
                d,
                "Normal",
                "ScalingReplicaSet",
                f"Scaled {direction} replica set {meta(rs).get('name')} to {size}",
            )
        return size_changed, updated

    async def _apply_plan(
        self, d: Obj, plan: list[tuple[Obj, int]], rss: list[Obj]
    ) -> tuple[bool, list[Obj]]:
        """Scale per `plan`; returns (anything resized, `rss` with the updated objects)."""
        by_name = {meta(r).get("name"): r for r in rss}
        scaled = False
        for rs, size in plan:
            changed, updated = await self._scale(d, rs, size)
            scaled = scaled or changed
            by_name[meta(rs).get("name")] = updated
        return scaled, [by_name[meta(r).get("name")] for r in rss]

    # ------------------------------------------------------------------ strategies
    async def _scale_sync(self, sync: _Sync, rss: list[Obj]) -> Result:
        """Paused or a scaling event (upstream `sync`)."""
        d = sync.d
        new_rs, old_rss = await self._new_and_old(sync, rss, create=False)
        all_rss = [*old_rss, *([new_rs] if new_rs else [])]
        _, all_rss = await self._apply_plan(d, scale_plan(d, new_rs, old_rss), all_rss)
        new_rs, old_rss = self._split(all_rss, new_rs)
        if spec_of(d).get("paused"):
            await self._cleanup(d, old_rss)
        return await self._finish(sync, all_rss, new_rs, rollout=False)

    async def _rolling(self, sync: _Sync, rss: list[Obj]) -> Result:
        d = sync.d
        new_rs, old_rss = await self._new_and_old(sync, rss, create=True)
        if new_rs is None:
            return await self._finish(sync, old_rss, None, rollout=True)
        all_rss = [*old_rss, new_rs]
        replicas = replicas_of(d)
        # scale the new ReplicaSet up (or down to the target)
        if replicas_of(new_rs) != replicas:
            target = (
                replicas
                if replicas_of(new_rs) > replicas
                else new_rs_new_replicas(d, all_rss, new_rs)
            )
            scaled, new_rs = await self._scale(d, new_rs, target)
            all_rss = [*old_rss, new_rs]
            if scaled:
                return await self._finish(sync, all_rss, new_rs, rollout=True)
        # scale old ReplicaSets down within maxUnavailable
        if _sum(old_rss, replicas_of) > 0:
            all_pods = _sum(all_rss, replicas_of)
            min_available = replicas - max_unavailable(d)
            new_unavailable = replicas_of(new_rs) - _available(new_rs)
            max_down = all_pods - min_available - new_unavailable
            if max_down > 0:
                cleaned, old_rss = await self._apply_plan(
                    d, cleanup_unhealthy(old_rss, max_down), old_rss
                )
                all_rss = [*old_rss, new_rs]
                down, old_rss = await self._apply_plan(
                    d, scale_down_old_for_rolling(d, all_rss, old_rss), old_rss
                )
                all_rss = [*old_rss, new_rs]
                if cleaned or down:
                    return await self._finish(sync, all_rss, new_rs, rollout=True)
        if deployment_complete(d, status_of(d)):
            await self._cleanup(d, old_rss)
        return await self._finish(sync, all_rss, new_rs, rollout=True)

    async def _recreate(self, sync: _Sync, rss: list[Obj]) -> Result:
        d = sync.d
        new_rs, old_rss = await self._new_and_old(sync, rss, create=False)
        all_rss = [*old_rss, *([new_rs] if new_rs else [])]
        down, old_rss = await self._apply_plan(
            d, [(rs, 0) for rs in _active(list(old_rss))], old_rss
        )
        all_rss = [*old_rss, *([new_rs] if new_rs else [])]
        if down or self._old_pods_running(new_rs, old_rss):
            return await self._finish(sync, all_rss, new_rs, rollout=True)
        if new_rs is None:
            new_rs, old_rss = await self._new_and_old(sync, rss, create=True)
            if new_rs is None:
                return await self._finish(sync, old_rss, None, rollout=True)
        _, new_rs = await self._scale(d, new_rs, replicas_of(d))
        all_rss = [*old_rss, new_rs]
        if deployment_complete(d, status_of(d)):
            await self._cleanup(d, old_rss)
        return await self._finish(sync, all_rss, new_rs, rollout=True)

    def _old_pods_running(self, new_rs: Obj | None, old_rss: list[Obj]) -> bool:
        if _sum(old_rss, lambda r: int_value(status_of(r).get("replicas"))) > 0:
            return True
        for rs in old_rss:
            for pod in self.pods.by_index(OWNER_INDEX, str(meta(rs).get("uid") or "")):
                if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                    return True
        return False

    @staticmethod
    def _split(all_rss: list[Obj], new_rs: Obj | None) -> tuple[Obj | None, list[Obj]]:
        if new_rs is None:
            return None, all_rss
        name = meta(new_rs).get("name")
        new = next((r for r in all_rss if meta(r).get("name") == name), new_rs)
        return new, [r for r in all_rss if meta(r).get("name") != name]

    async def _cleanup(self, d: Obj, old_rss: list[Obj]) -> None:
        for rs in history_to_delete(d, old_rss):
            m = meta(rs)
            try:
                await self.client.delete(
                    REPLICASETS,
                    str(m.get("name")),
                    str(m.get("namespace")),
                    preconditions={"uid": m.get("uid")},
                )
            except ApiError as exc:
                if exc.code not in (404, 409):
                    raise

    def _paused_conditions(self, sync: _Sync, now: float) -> None:
        """upstream `checkPausedConditions`."""
        d = sync.d
        if not has_progress_deadline(d):
            return
        holder: Obj = {"conditions": sync.conditions}
        cond = get_condition(holder, PROGRESSING)
        if cond is not None and cond.get("reason") == TIMED_OUT_REASON:
            return
        paused_cond = cond is not None and cond.get("reason") == PAUSED_REASON
        if spec_of(d).get("paused") and not paused_cond:
            set_condition(
                holder,
                new_condition(PROGRESSING, "Unknown", PAUSED_REASON, "Deployment is paused", now),
            )
        elif not spec_of(d).get("paused") and paused_cond:
            set_condition(
                holder,
                new_condition(PROGRESSING, "Unknown", RESUMED_REASON, "Deployment is resumed", now),
            )
        sync.conditions = holder.get("conditions") or []

    # ------------------------------------------------------------------ writing the result
    async def _finish(
        self, sync: _Sync, all_rss: list[Obj], new_rs: Obj | None, *, rollout: bool
    ) -> Result:
        d = sync.d
        now = self.clock()
        if rollout:
            status = rollout_conditions(d, all_rss, new_rs, sync.conditions, now)
        else:
            status = calculate_status(d, all_rss, new_rs, sync.conditions, now)
        if sync.collision_bump:
            status["collisionCount"] = int_value(status_of(d).get("collisionCount")) + 1
        latest = d
        name, ns = str(meta(d).get("name")), str(meta(d).get("namespace"))
        if (
            sync.revision
            and (meta(d).get("annotations") or {}).get(REVISION_ANNOTATION) != sync.revision
        ):
            patch = {
                "metadata": {
                    "annotations": {REVISION_ANNOTATION: sync.revision},
                    "resourceVersion": meta(d).get("resourceVersion"),
                }
            }
            try:
                latest = await self.client.patch(DEPLOYMENTS, name, patch, ns)
            except ApiError as exc:
                if exc.code in (404, 409):
                    return Result(requeue=exc.code == 409)
                raise
        if not _same_status(status_of(d), status):
            try:
                await self.client.update(
                    DEPLOYMENTS, {**latest, "status": status}, subresource="status"
                )
            except ApiError as exc:
                if exc.code in (404, 409):
                    return Result(requeue=exc.code == 409)
                raise
        if sync.collision_bump:
            return Result(requeue=True)
        if rollout:
            after = requeue_stuck(d, status, now)
            if after is not None:
                return Result(requeue_after=after)
        return Result()


# ================================================================================== wiring
def _selector(obj: Obj) -> LabelSelector | None:
    try:
        sel = from_label_selector_object(spec_of(obj).get("selector"))
    except ApiError:
        return None
    return None if sel.empty() else sel


def deployment_controller(ctx: ControllerContext, *, workers: int = DEFAULT_WORKERS) -> Controller:
    """The Deployment controller for one term of leadership (see the module doc)."""
    deployments = ctx.informers.informer(DEPLOYMENTS)
    replicasets = ctx.informers.informer(REPLICASETS)
    ensure_orphan_index(replicasets)
    pods = ctx.informers.informer(PODS)
    reconciler = DeploymentReconciler(ctx.client, deployments, replicasets, pods, ctx.events)
    controller = Controller("deployment", reconciler, workers, metrics=ctx.metrics)
    controller.watches(deployments)
    controller.watches(replicasets, enqueue_owner(KIND, API_VERSION))
    _watch_orphan_replicasets(controller, deployments, replicasets)
    _watch_pod_deletions(controller, replicasets, pods)
    return controller


def _watch_orphan_replicasets(
    controller: Controller, deployments: SharedInformer, replicasets: SharedInformer
) -> None:
    """ReplicaSets without a controller enqueue the Deployments of their namespace that select
    them (adoption; release when labels change)."""

    def enqueue_matching(rs: Obj) -> None:
        if controller_of(rs) is not None:
            return
        labels = labels_of(rs)
        for d in deployments.by_index(NAMESPACE_INDEX, str(meta(rs).get("namespace") or "")):
            sel = _selector(d)
            if sel is not None and sel.matches(labels):
                controller.enqueue(object_key(d))

    def updated(old: Obj, new: Obj) -> None:
        enqueue_matching(new)
        if labels_of(old) != labels_of(new):
            enqueue_matching(old)

    replicasets.add_event_handler(
        on_add=enqueue_matching,
        on_update=updated,
        on_delete=lambda obj: enqueue_matching(deleted_object(obj)),
    )


def _watch_pod_deletions(
    controller: Controller, replicasets: SharedInformer, pods: SharedInformer
) -> None:
    """A deleted pod enqueues its ReplicaSet's Deployment (Recreate waits for old pods)."""

    def deleted(obj: Any) -> None:
        pod = deleted_object(obj)
        ref = controller_of(pod)
        if ref is None or ref.get("kind") != "ReplicaSet":
            return
        ns = str(meta(pod).get("namespace") or "")
        rs = replicasets.get(f"{ns}/{ref.get('name')}")
        owner = controller_of(rs) if rs is not None else None
        if owner is not None and owner.get("kind") == KIND:
            controller.enqueue(f"{ns}/{owner.get('name')}")

    pods.add_event_handler(on_delete=deleted)
