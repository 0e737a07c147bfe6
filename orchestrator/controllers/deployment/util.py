"""Deployment utilities (upstream deployment/util): the annotation and condition names, the
fields of Deployments and ReplicaSets read as numbers, maxSurge/maxUnavailable fenceposts,
telling the new ReplicaSet from the old ones (templates equal but for `pod-template-hash`), and
how big the new ReplicaSet may be. Pure functions; see the package doc for the rules."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from orchestrator.controllers.podutil import POD_TEMPLATE_HASH_LABEL, creation_time, int_value, meta
from orchestrator.kube.objects import Obj

API_VERSION = "apps/v1"
KIND = "Deployment"
REVISION_ANNOTATION = "deployment.kubernetes.io/revision"
REVISION_HISTORY_ANNOTATION = "deployment.kubernetes.io/revision-history"
DESIRED_REPLICAS_ANNOTATION = "deployment.kubernetes.io/desired-replicas"
MAX_REPLICAS_ANNOTATION = "deployment.kubernetes.io/max-replicas"
ROLLBACK_ANNOTATION = "deprecated.deployment.rollback.to"
LAST_APPLIED_ANNOTATION = "kubectl.kubernetes.io/last-applied-configuration"

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


def rolling_params(d: Obj) -> Obj | None:
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
    rolling = rolling_params(d)
    if rolling is None:
        return 0
    return resolve_fenceposts(
        rolling.get("maxSurge"), rolling.get("maxUnavailable"), replicas_of(d)
    )[0]


def max_unavailable(d: Obj) -> int:
    rolling = rolling_params(d)
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


def sum_of(rss: list[Obj], fn: Callable[[Obj], int]) -> int:
    return sum(fn(rs) for rs in rss)


def available_of(rs: Obj) -> int:
    return int_value(status_of(rs).get("availableReplicas"))


def new_rs_new_replicas(d: Obj, all_rss: list[Obj], new_rs: Obj) -> int:
    """How big the new ReplicaSet may be now (upstream `NewRSNewReplicas`)."""
    replicas = replicas_of(d)
    if rolling_params(d) is None:
        return replicas
    current = sum_of(all_rss, replicas_of)
    max_total = replicas + max_surge(d)
    if current >= max_total:
        return replicas_of(new_rs)
    up = min(max_total - current, max(0, replicas - replicas_of(new_rs)))
    return replicas_of(new_rs) + up


def by_age(rss: list[Obj]) -> list[Obj]:
    return sorted(rss, key=lambda r: (creation_time(r), meta(r).get("name") or ""))


def active_of(rss: list[Obj | None]) -> list[Obj]:
    return [rs for rs in rss if rs is not None and replicas_of(rs) > 0]


def annotation_int(rs: Obj, name: str) -> int | None:
    raw = (meta(rs).get("annotations") or {}).get(name)
    if raw is None:
        return None
    try:
        return int(str(raw))
    except ValueError:
        return None


def has_progress_deadline(d: Obj) -> bool:
    deadline = spec_of(d).get("progressDeadlineSeconds")
    return deadline is not None and int_value(deadline) != 2**31 - 1


def deployment_complete(d: Obj, status: Obj) -> bool:
    replicas = replicas_of(d)
    return (
        int_value(status.get("updatedReplicas")) == replicas
        and int_value(status.get("replicas")) == replicas
        and int_value(status.get("availableReplicas")) == replicas
        and int_value(status.get("observedGeneration")) >= int_value(meta(d).get("generation"))
    )
