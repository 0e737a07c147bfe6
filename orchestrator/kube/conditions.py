"""Status conditions: find, build, set and remove entries of an object's `status.conditions`.

Pure helpers over JSON objects (no I/O; `now` is an argument), used by every controller, the
scheduler and the API's table printers, so that "the Ready condition of a pod" is read one way.

A condition is a dict with `type`, `status` ("True", "False", "Unknown"), `reason`,
`message` and timestamps. Kubernetes keys the list by `type` (listType=map), so a type
appears at most once; where a malformed object repeats a type, the first entry counts (as
upstream's `GetPodCondition` / `GetDeploymentCondition`). Reading is robust against bad
input: entries that are not dicts, and a `conditions` that is not a list, are skipped.

`set_condition` has the semantics of upstream's `SetDeploymentCondition` (also used for
ReplicaSets): a condition with the same status and reason as the current one changes nothing;
with the same status but another reason it replaces the current one but keeps its
`lastTransitionTime`; otherwise it replaces it outright. Replaced entries move to the end.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.columns import now_rfc3339

__all__ = [
    "condition_true",
    "get_condition",
    "new_condition",
    "remove_condition",
    "set_condition",
]


def get_condition(status: Mapping[str, Any] | None, ctype: str) -> Obj | None:
    """The condition of type `ctype` in a `status` (an object's `.status`; None reads as
    empty), or None."""
    conds = status.get("conditions") if isinstance(status, Mapping) else None
    if not isinstance(conds, list):
        return None
    for cond in conds:
        if isinstance(cond, dict) and cond.get("type") == ctype:
            return cond
    return None


def condition_true(status: Mapping[str, Any] | None, ctype: str) -> bool:
    """The condition `ctype` of `status` exists and its status is "True"."""
    cond = get_condition(status, ctype)
    return cond is not None and cond.get("status") == "True"


def new_condition(ctype: str, status: str, reason: str, message: str, now: float) -> Obj:
    """A condition stamped `now` as both its lastUpdateTime and lastTransitionTime (the
    Deployment shape; upstream `NewDeploymentCondition`)."""
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
    """Put `cond` into `status` (see the module doc: same status and reason -> unchanged; same
    status -> the transition time is kept)."""
    current = get_condition(status, cond["type"])
    if current is not None and current.get("status") == cond["status"]:
        if current.get("reason") == cond["reason"]:
            return
        cond = {**cond, "lastTransitionTime": current.get("lastTransitionTime")}
    remove_condition(status, cond["type"])
    status.setdefault("conditions", []).append(cond)


def remove_condition(status: Obj, ctype: str) -> None:
    """Drop the conditions of type `ctype`; drop `conditions` when none is left."""
    conds = [c for c in status.get("conditions") or [] if c.get("type") != ctype]
    if conds:
        status["conditions"] = conds
    else:
        status.pop("conditions", None)
