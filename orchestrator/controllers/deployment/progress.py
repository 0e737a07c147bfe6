"""A Deployment's status and rollout conditions (upstream progress.go and `calculateStatus`):
counts from the ReplicaSets, Available, Progressing (with the progress deadline) and
ReplicaFailure, and when to look again at a rollout that may miss its deadline. Pure functions
(`now` is an argument); the condition table is in the package doc."""

from __future__ import annotations

from orchestrator.controllers.deployment.util import (
    AVAILABLE,
    MIN_AVAILABLE_REASON,
    MIN_UNAVAILABLE_REASON,
    NEW_RS_AVAILABLE_REASON,
    PROGRESSING,
    REPLICA_FAILURE,
    RS_UPDATED_REASON,
    TIMED_OUT_REASON,
    available_of,
    deployment_complete,
    has_progress_deadline,
    max_unavailable,
    replicas_of,
    spec_of,
    status_of,
    sum_of,
)
from orchestrator.controllers.podutil import int_value, meta
from orchestrator.kube.conditions import (
    get_condition,
    new_condition,
    remove_condition,
    set_condition,
)
from orchestrator.kube.jsonvalue import copy_json
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.columns import parse_rfc3339


def calculate_status(
    d: Obj, all_rss: list[Obj], new_rs: Obj | None, conditions: list[Obj], now: float
) -> Obj:
    """Counts from the ReplicaSets plus the Available condition (upstream `calculateStatus`)."""
    available = sum_of(all_rss, available_of)
    total = sum_of(all_rss, replicas_of)
    status: Obj = {
        "observedGeneration": meta(d).get("generation"),
        "replicas": sum_of(all_rss, lambda r: int_value(status_of(r).get("replicas"))),
        "updatedReplicas": int_value(status_of(new_rs).get("replicas")) if new_rs else 0,
        "readyReplicas": sum_of(all_rss, lambda r: int_value(status_of(r).get("readyReplicas"))),
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
