"""The scale subresource (autoscaling/v1 Scale): read and write a kind's replica count
through the paths its `Kind.scale` names (spec replicas, status replicas, label selector).

A write (PUT of a Scale, or a JSON or merge patch of it) goes through
`update.guaranteed_update` on the parent object, so only the spec replicas change and the
usual admission applies. A Scale's resourceVersion, when set, is a precondition.
"""

from __future__ import annotations

from typing import Any

from orchestrator.apiserver.handler import Call, Handler
from orchestrator.apiserver.patch import PATCH_TYPES
from orchestrator.apiserver.update import guaranteed_update
from orchestrator.kube import errors
from orchestrator.kube.errors import Cause
from orchestrator.kube.jsonvalue import copy_json
from orchestrator.kube.objects import Obj, get_path, set_path
from orchestrator.kube.patch.jsonpatch import apply_json_patch
from orchestrator.kube.patch.mergepatch import apply_merge_patch
from orchestrator.kube.schema.kind import Kind
from orchestrator.kube.selectors import selector_to_string


def scale_of(kind: Kind, obj: Obj) -> Obj:
    """The autoscaling/v1 Scale of `obj` (a kind with a scale subresource)."""
    assert kind.scale is not None
    meta = obj["metadata"]
    selector = get_path(obj, kind.scale.label_selector)
    if isinstance(selector, dict):
        selector = selector_to_string(selector)
    status: Obj = {"replicas": int(get_path(obj, kind.scale.status_replicas) or 0)}
    if selector:
        status["selector"] = selector
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            k: meta[k]
            for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
            if k in meta
        },
        "spec": {"replicas": int(get_path(obj, kind.scale.spec_replicas) or 0)},
        "status": status,
    }


async def get_scale(h: Handler, call: Call, kind: Kind, ns: str, name: str) -> Obj:
    if kind.scale is None:
        raise errors.route_not_found()
    h.authorize(call, "get", kind, ns, name, "scale")
    return scale_of(kind, await h.objects.get(kind, ns, name))


async def write_scale(
    h: Handler,
    call: Call,
    kind: Kind,
    ns: str,
    name: str,
    body: Any,
    content_type: str | None,
) -> Obj:
    """PUT (content_type None) or PATCH of the scale subresource."""
    if kind.scale is None:
        raise errors.route_not_found()
    scale_spec = kind.scale
    h.authorize(call, "patch" if content_type else "update", kind, ns, name, "scale")
    ptype = PATCH_TYPES.get(content_type or "", "") if content_type else "put"
    if not ptype or ptype == "apply":
        raise errors.unsupported_media_type(content_type or "")
    if ptype == "put":
        _check_scale(body, name)  # before any read: a wrong body never reaches the loop
    elif ptype == "json" and not isinstance(body, list):
        raise errors.bad_request("a JSON patch must be a list of operations")
    elif ptype == "merge" and not isinstance(body, dict):
        raise errors.bad_request("the patch must be a JSON object")

    def mutate(live: Obj) -> Obj:
        current = scale_of(kind, live)
        if ptype == "put":
            wanted = body
        elif ptype == "json":
            wanted = apply_json_patch(current, body)
        else:
            wanted = apply_merge_patch(current, body)
        _check_scale(wanted, name)
        replicas = get_path(wanted, "spec.replicas")
        if replicas is None:
            replicas = 0
        if type(replicas) is not int or replicas < 0:
            raise errors.invalid(
                "Scale",
                "autoscaling",
                name,
                [Cause("spec.replicas", f"Invalid value: {replicas!r}: must be >= 0")],
            )
        rv = (wanted.get("metadata") or {}).get("resourceVersion")
        if rv not in (None, "") and str(rv) != live["metadata"]["resourceVersion"]:
            raise errors.conflict(kind.plural, kind.group, name)
        out: Obj = copy_json(live)
        set_path(out, scale_spec.spec_replicas, replicas)
        return out

    obj = await guaranteed_update(h, call, kind, ns, name, "", mutate, None)
    return scale_of(kind, obj)


def _check_scale(scale: Any, name: str) -> None:
    """A Scale body (PUT, or the result of a patch): an autoscaling/v1 Scale of this object
    (an empty apiVersion and kind mean that one, as the apiserver's decoder defaults them)."""
    if not isinstance(scale, dict):
        raise errors.bad_request("the scale must be a JSON object")
    api_version, kind_name = scale.get("apiVersion"), scale.get("kind")
    if (api_version or kind_name) and (api_version, kind_name) != ("autoscaling/v1", "Scale"):
        raise errors.bad_request(
            f"the API version in the data ({api_version}) and kind ({kind_name}) do not match "
            "the expected autoscaling/v1 Scale"
        )
    meta = scale.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise errors.bad_request("metadata must be an object")
    if meta and meta.get("name") not in (None, "", name):
        raise errors.bad_request(
            f"the name of the object ({meta.get('name')}) does not match the name on the "
            f"URL ({name})"
        )
    spec = scale.get("spec")
    if spec is not None and not isinstance(spec, dict):
        raise errors.bad_request("spec must be an object")
