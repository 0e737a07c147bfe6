"""The pods/binding subresource: the scheduler's write that assigns a pod to a node.

A bind sets `spec.nodeName` of a pod that has none and is not being deleted, by
compare-and-swap; refusals (already bound, being deleted) and dry runs are decided on a
linearizable read, as in `update.guaranteed_update`. The pod is read from the shared decoded
cache (usually the object the scheduler's informer was handed) and the bound pod is handed to
the read-only watches as it is, so a bind decodes nothing.
"""

from __future__ import annotations

from typing import Any

from orchestrator.apiserver.handler import MAX_UPDATE_ATTEMPTS, PODS, Call, Handler, revision_of
from orchestrator.kube import errors
from orchestrator.kube.errors import ApiError, Cause
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.kind import Kind


async def bind(h: Handler, call: Call, kind: Kind, ns: str, name: str, body: Any) -> Obj:
    if (kind.group, kind.plural) != PODS:
        raise errors.route_not_found()
    h.authorize(call, "create", kind, ns, name, "binding")
    if not isinstance(body, dict) or not isinstance(body.get("target"), dict):
        raise errors.bad_request("a Binding needs a target")
    node = body["target"].get("name")
    if not node or not isinstance(node, str):
        raise errors.invalid(
            "Binding", "", name, [Cause("target.name", "Required value", "FieldValueRequired")]
        )
    fresh = False  # as in `guaranteed_update`: a local read first, refusals on the latest
    for _ in range(MAX_UPDATE_ATTEMPTS):
        try:
            # Shared (not modified below, nor returned): usually the object the scheduler's
            # informer was handed, so a bind does not decode the pod again.
            live = await h.objects.get_shared(kind, ns, name, stale_ok=not fresh)
        except ApiError:
            if fresh:
                raise
            fresh = True
            continue
        refusal = None
        if live["metadata"].get("deletionTimestamp"):
            refusal = "pod is being deleted, cannot be assigned to a host"
        elif current := (live.get("spec") or {}).get("nodeName"):
            refusal = f'pod {name} is already assigned to node "{current}"'
        if refusal is not None or call.opts.dry_run:
            if not fresh:
                fresh = True
                continue
            if refusal is not None:
                raise errors.conflict(kind.plural, "", name, refusal)
            break
        bound = {**live, "spec": {**(live.get("spec") or {}), "nodeName": node}}
        try:
            # `bound` goes nowhere else: the watches may be handed it as it is.
            await h.objects.update(kind, bound, revision_of(live), share=True)
        except ApiError as exc:
            if exc.code == 409 and exc.reason == "Conflict":
                fresh = True
                continue
            raise
        break
    else:
        raise errors.conflict(kind.plural, "", name, "too many concurrent writers")
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "code": 201,
    }
