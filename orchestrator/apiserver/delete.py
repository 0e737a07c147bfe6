"""The delete and deletecollection verbs (kube-apiserver's delete.go, and the generic
registry's graceful deletion).

An object without finalizers, and not a pod that must terminate gracefully, goes at once
(conditionally on the revision it was read at). Otherwise it is marked: a deletionTimestamp
(now, or now + the grace period for a bound, unfinished pod), the propagation policy's
finalizer (`foregroundDeletion`, `orphan`), and for a Namespace with `spec.finalizers` the
Terminating phase; whoever removes the last finalizer completes the deletion
(`update.guaranteed_update`). Deleting a CRD deletes its custom objects. Preconditions (uid,
resourceVersion) are checked on every attempt; a conflict re-reads.
"""

from __future__ import annotations

from typing import Any

from orchestrator.apiserver.get import select
from orchestrator.apiserver.handler import (
    CRD,
    MAX_UPDATE_ATTEMPTS,
    NAMESPACES,
    PODS,
    Call,
    Handler,
    revision_of,
)
from orchestrator.apiserver.options import ListOptions, WriteOptions
from orchestrator.apiserver.strategy import same_object
from orchestrator.kube import errors
from orchestrator.kube.errors import ApiError
from orchestrator.kube.jsonvalue import copy_json
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.columns import now_rfc3339
from orchestrator.kube.schema.kind import Kind
from orchestrator.security.authz import admit_node


async def delete_object(
    h: Handler, call: Call, kind: Kind, ns: str, name: str, options: Any
) -> tuple[Obj, int]:
    """Delete (or start deleting) one object; returns the reply and its HTTP code."""
    h.check_namespace_arg(kind, ns)
    h.authorize(call, "delete", kind, ns, name)
    opts = _delete_options(options, call)
    for _ in range(MAX_UPDATE_ATTEMPTS):
        live = await h.objects.get(kind, ns, name)
        admit_node(call.user, "delete", kind.kind, "", live, live)
        meta = live["metadata"]
        pre = opts.get("preconditions") or {}
        if pre.get("uid") not in (None, meta.get("uid")):
            raise errors.conflict(
                kind.plural,
                kind.group,
                name,
                f"Precondition failed: UID in precondition: {pre['uid']}, UID in object meta: "
                f"{meta.get('uid')}",
            )
        if pre.get("resourceVersion") not in (None, meta.get("resourceVersion")):
            raise errors.conflict(
                kind.plural,
                kind.group,
                name,
                f"Precondition failed: ResourceVersion in precondition: "
                f"{pre['resourceVersion']}, ResourceVersion in object meta: "
                f"{meta.get('resourceVersion')}",
            )
        updated = _deleting(h, kind, live, opts)
        try:
            if updated is None:
                if not call.opts.dry_run:
                    await h.objects.delete(kind, ns, name, revision_of(live), old=live)
                    if h.allocates(kind):
                        h.services.written(live, None)
                    h.after_write(kind, live, deleted=True)
                    if (kind.group, kind.plural) == CRD:
                        await _delete_custom_objects(h, live)
                return h.present(kind, live), 200
            if same_object(updated, live) or call.opts.dry_run:
                return h.present(kind, updated), 202 if updated is not live else 200
            stored = await h.objects.update(kind, updated, revision_of(live), old=live)
        except ApiError as exc:
            if exc.code == 409 and exc.reason == "Conflict":
                continue
            raise
        return h.present(kind, stored), 202
    raise errors.conflict(kind.plural, kind.group, name, "too many concurrent writers")


def _deleting(h: Handler, kind: Kind, live: Obj, opts: Obj) -> Obj | None:
    """The object marked for deletion, or None when it can go right away."""
    obj: Obj = copy_json(live)
    meta = obj["metadata"]
    finalizers = list(meta.get("finalizers") or [])
    policy = opts.get("propagationPolicy")
    if policy == "Foreground" and "foregroundDeletion" not in finalizers:
        finalizers.append("foregroundDeletion")
    elif policy == "Orphan" and "orphan" not in finalizers:
        finalizers.append("orphan")
    grace = opts.get("gracePeriodSeconds")
    graceful = False
    if (kind.group, kind.plural) == PODS and (obj.get("spec") or {}).get("nodeName"):
        if grace is None:
            grace = (obj.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
        graceful = grace > 0 and not _finished(obj)
    if (kind.group, kind.plural) == NAMESPACES and (obj.get("spec") or {}).get("finalizers"):
        obj.setdefault("status", {})["phase"] = "Terminating"
        finalizers = finalizers or []
        graceful = True
    if not finalizers and not graceful:
        return None
    if finalizers:
        meta["finalizers"] = finalizers
    if not meta.get("deletionTimestamp"):
        meta["deletionTimestamp"] = now_rfc3339(h.clock() + ((grace or 0) if graceful else 0))
        meta["deletionGracePeriodSeconds"] = int(grace or 0) if graceful else 0
    elif graceful and grace is not None and grace < meta.get("deletionGracePeriodSeconds", 0):
        meta["deletionGracePeriodSeconds"] = int(grace)
    if not graceful and not finalizers:
        return None
    return obj


async def _delete_custom_objects(h: Handler, crd: Obj) -> None:
    """A deleted CRD takes its objects with it (the apiserver's customresourcecleanup)."""
    group = (crd.get("spec") or {}).get("group", "")
    plural = ((crd.get("spec") or {}).get("names") or {}).get("plural", "")
    for k in list(h.registry):
        if k.custom and k.group == group and k.plural == plural:
            objs, _ = await h.objects.list(k, "")
            for o in objs:
                meta = o["metadata"]
                try:
                    await h.objects.delete(
                        k, meta.get("namespace", ""), meta["name"], revision_of(o)
                    )
                except ApiError as exc:
                    if exc.code not in (404, 409):
                        raise
            break


async def delete_collection(
    h: Handler, call: Call, kind: Kind, ns: str, opts: ListOptions, options: Any
) -> Obj:
    h.authorize(call, "deletecollection", kind, ns)
    objs, revision, _ = await select(h, kind, ns, opts)
    deleted = []
    for o in objs:
        meta = o["metadata"]
        try:
            reply, _code = await delete_object(
                h, call, kind, meta.get("namespace", ""), meta["name"], options
            )
        except ApiError as exc:
            if exc.code == 404:
                continue
            raise
        deleted.append(reply)
    return {
        "kind": f"{kind.kind}List",
        "apiVersion": kind.api_version,
        "metadata": {"resourceVersion": str(revision)},
        "items": deleted,
    }


def _finished(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _delete_options(raw: Any, call: Call) -> Obj:
    """The checked DeleteOptions body (a dict; {} when none); its dryRun sets `call.opts`."""
    if raw in (None, b"", ""):
        return {}
    if not isinstance(raw, dict):
        raise errors.bad_request("DeleteOptions must be a JSON object")
    options: Obj = raw
    policy = options.get("propagationPolicy")
    if policy not in (None, "Background", "Foreground", "Orphan"):
        raise errors.bad_request(
            f'Unsupported value: "{policy}": supported values: "Foreground", "Background", "Orphan"'
        )
    if options.get("orphanDependents") is True and policy is None:
        options = {**options, "propagationPolicy": "Orphan"}
    grace = options.get("gracePeriodSeconds")
    if grace is not None and (type(grace) is not int or grace < 0):
        raise errors.bad_request("gracePeriodSeconds must be a non-negative integer")
    pre = options.get("preconditions")
    if pre is not None and not isinstance(pre, dict):
        raise errors.bad_request("preconditions must be an object")
    dry = options.get("dryRun")
    if dry:
        if dry != ["All"]:
            raise errors.bad_request(f"unsupported dryRun value {dry!r}: only 'All' is supported")
        call.opts = WriteOptions(True, call.opts.field_manager, call.opts.field_validation)
    return options
