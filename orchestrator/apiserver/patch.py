"""The patch verb (kube-apiserver's patch.go): JSON patch, merge patch, strategic merge patch
(built-in kinds only) and server-side apply, each applied to the live object inside
`update.guaranteed_update`, so a patch is recomputed on the latest state after a conflict.

A patched object must keep its name and namespace (a 400 otherwise, whatever the subresource).
Server-side apply merges the configuration into the live object by field ownership
(`kube.patch.apply`), managedFields included; applying to a missing object creates it (not
through a subresource).
"""

from __future__ import annotations

from typing import Any

from orchestrator.apiserver.handler import CRD, Call, Handler, client_rv
from orchestrator.apiserver.strategy import prepare_create
from orchestrator.apiserver.update import guaranteed_update
from orchestrator.kube import errors
from orchestrator.kube.errors import ApiError
from orchestrator.kube.objects import Obj
from orchestrator.kube.patch.apply import server_side_apply
from orchestrator.kube.patch.jsonpatch import apply_json_patch
from orchestrator.kube.patch.mergepatch import apply_merge_patch
from orchestrator.kube.patch.strategic import apply_strategic_merge_patch
from orchestrator.kube.schema import crd as crds
from orchestrator.kube.schema.kind import Kind

PATCH_TYPES = {
    "application/json-patch+json": "json",
    "application/merge-patch+json": "merge",
    "application/strategic-merge-patch+json": "strategic",
    "application/apply-patch+yaml": "apply",
}


async def patch_object(
    h: Handler,
    call: Call,
    kind: Kind,
    ns: str,
    name: str,
    content_type: str,
    patch: Any,
    sub: str = "",
) -> tuple[Obj, bool]:
    h.check_namespace_arg(kind, ns)
    h.authorize(call, "patch", kind, ns, name, sub)
    ptype = PATCH_TYPES.get(content_type)
    if ptype is None or (ptype == "strategic" and kind.custom):
        raise errors.unsupported_media_type(content_type)
    if ptype == "json" and not isinstance(patch, list):
        raise errors.bad_request("a JSON patch must be a list of operations")
    if ptype != "json" and not isinstance(patch, dict):
        raise errors.bad_request("the patch must be a JSON object")
    if ptype == "apply":
        return await _apply(h, call, kind, ns, name, patch, sub)

    def mutate(live: Obj) -> Obj:
        if ptype == "json":
            out: Obj = apply_json_patch(live, patch)
        elif ptype == "merge":  # only read until admission copies it: share `live`
            out = apply_merge_patch(live, patch, share=True)
        else:
            out = apply_strategic_merge_patch(live, patch, kind.schema)
        if not isinstance(out, dict):
            raise errors.bad_request("the patched object is not a JSON object")
        meta = h.check_body_kind(kind, out)["metadata"]
        # As for an update (and whatever the subresource: a status write would otherwise
        # drop the change silently and answer 200).
        if meta.get("name") != name:
            raise errors.bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on "
                f"the URL ({name})"
            )
        if kind.namespaced and meta.get("namespace") != ns:
            raise errors.bad_request(
                "the namespace of the provided object does not match the namespace sent "
                "on the request"
            )
        return out

    obj = await guaranteed_update(h, call, kind, ns, name, sub, mutate, None)
    return obj, False


async def _apply(
    h: Handler, call: Call, kind: Kind, ns: str, name: str, config: Obj, sub: str
) -> tuple[Obj, bool]:
    config = h.check_body_kind(kind, config, what=" (server-side apply)")
    if not config.get("apiVersion") or not config.get("kind"):
        raise errors.bad_request("apiVersion and kind must be set for server-side apply")
    if config["metadata"].get("name") not in (None, name):
        raise errors.bad_request(
            f"the name of the object ({config['metadata'].get('name')}) does not match the "
            f"name on the URL ({name})"
        )
    if "managedFields" in config["metadata"]:
        raise errors.bad_request("metadata.managedFields must be nil for server-side apply")
    config = {**config, "metadata": {**config["metadata"], "name": name}}
    if kind.namespaced:
        config["metadata"]["namespace"] = ns

    def apply(live: Obj | None) -> Obj:
        out: Obj = server_side_apply(
            live,
            config,
            manager=call.opts.field_manager,
            schema=kind.schema,
            force=call.opts.force,
            api_version=kind.api_version,
            now=h.now(),
        )
        return out

    try:
        obj = await guaranteed_update(
            h, call, kind, ns, name, sub, apply, client_rv(config), managed=True
        )
    except ApiError as exc:
        if exc.code != 404 or sub:
            raise
    else:
        return obj, False
    # Apply to a missing object creates it.
    h.authorize(call, "create", kind, ns, name)
    created = apply(None)
    if kind.namespaced:
        await h.require_namespace(ns)
    obj = prepare_create(kind, created, now=h.now(), name=name)
    obj["metadata"]["managedFields"] = created["metadata"].get("managedFields", [])
    obj = h.admit(call, "create", kind, obj, None, "")
    if (kind.group, kind.plural) == CRD:
        obj["status"] = crds.crd_status(obj, h.now())
    if h.allocates(kind):  # a Service: its ClusterIP and node ports, claimed with it
        stored = await h.services.create(
            h.objects, kind, obj, share=False, dry_run=call.opts.dry_run
        )
        if call.opts.dry_run:
            return stored, True
    elif call.opts.dry_run:
        return obj, True
    else:
        stored = await h.objects.create(kind, obj)
    h.after_write(kind, stored)
    return h.present(kind, stored), True
