"""The OpenAPI v3 paths of one kind: collection, item, all-namespaces list and subresources,
with the operations, parameters and responses kubectl looks for (see `openapi` for what it
reads: the GVK-tagged PATCH with `fieldValidation`, the strategic-merge-patch media type).

Pure functions of a Kind; no I/O.
"""

from __future__ import annotations

from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.kind import Kind
from orchestrator.kube.schema.openapi_names import (
    APPLY_PATCH,
    BINDING_NAME,
    DELETE_OPTIONS_NAME,
    GVK,
    JSON_PATCH,
    MEDIA,
    MERGE_PATCH,
    PATCH_NAME,
    REF,
    SCALE_NAME,
    STATUS_NAME,
    STRATEGIC_PATCH,
    camel_gv,
    gv_path,
    gvk_of,
    strategic_merge_supported,
)


def _param(name: str, where: str, desc: str, type_: str = "string") -> Obj:
    out: Obj = {"name": name, "in": where, "description": desc, "schema": {"type": type_}}
    if where == "path":
        out["required"] = True
    else:
        out["uniqueItems"] = True
    return out


_DRY_RUN = _param("dryRun", "query", "When present, modifications are not persisted (All).")
_FIELD_MANAGER = _param("fieldManager", "query", "Name of the actor making the change.")
_FIELD_VALIDATION = _param(
    "fieldValidation",
    "query",
    "How to treat unknown or duplicate fields: Ignore, Warn (default) or Strict.",
)
_FORCE = _param("force", "query", "Force apply requests to take conflicting fields.", "boolean")
_WRITE_PARAMS = [_DRY_RUN, _FIELD_MANAGER, _FIELD_VALIDATION]
_LIST_PARAMS = [
    _param("allowWatchBookmarks", "query", "Request BOOKMARK watch events.", "boolean"),
    _param("continue", "query", "Continue token from a previous list."),
    _param("fieldSelector", "query", "Restrict the list by fields."),
    _param("labelSelector", "query", "Restrict the list by labels."),
    _param("limit", "query", "Maximum number of items to return.", "integer"),
    _param("resourceVersion", "query", "Resource version constraint for the request."),
    _param("resourceVersionMatch", "query", "How resourceVersion applies to a list."),
    _param("sendInitialEvents", "query", "Send synthetic events for current state.", "boolean"),
    _param("timeoutSeconds", "query", "Timeout for the list/watch call.", "integer"),
    _param("watch", "query", "Watch for changes and stream them.", "boolean"),
]
_DELETE_PARAMS = [
    _DRY_RUN,
    _param("gracePeriodSeconds", "query", "Seconds before deletion.", "integer"),
    _param("orphanDependents", "query", "Deprecated: use propagationPolicy.", "boolean"),
    _param("propagationPolicy", "query", "Orphan, Background or Foreground."),
]
_LOG_PARAMS = [
    _param("container", "query", "The container for which to stream logs."),
    _param("follow", "query", "Follow the log stream.", "boolean"),
    _param("limitBytes", "query", "Bytes to read before stopping.", "integer"),
    _param("previous", "query", "Logs of the previously terminated container.", "boolean"),
    _param("sinceSeconds", "query", "Only logs newer than this many seconds.", "integer"),
    _param("sinceTime", "query", "Only logs after this RFC 3339 time."),
    _param("tailLines", "query", "Number of lines from the end to show.", "integer"),
    _param("timestamps", "query", "Prefix each line with its timestamp.", "boolean"),
]


def _content(schema_name: str, media: tuple[str, ...] = MEDIA) -> Obj:
    return {m: {"schema": {"$ref": REF + schema_name}} for m in media}


def _responses(schema_name: str, *codes: str) -> Obj:
    text = {"200": "OK", "201": "Created", "202": "Accepted"}
    out: Obj = {c: {"description": text[c], "content": _content(schema_name)} for c in codes}
    out["401"] = {"description": "Unauthorized"}
    return out


def _op(
    action: str,
    op_id: str,
    desc: str,
    gvk: Obj,
    tag: str,
    responses: Obj,
    params: list[Obj] | None = None,
    body: Obj | None = None,
) -> Obj:
    out: Obj = {
        "tags": [tag],
        "description": desc,
        "operationId": op_id,
        "responses": responses,
        "x-kubernetes-action": action,
        GVK: gvk,
    }
    if params:
        out["parameters"] = params
    if body is not None:
        out["requestBody"] = body
    return out


def _patch_body(smp: bool) -> Obj:
    types = [JSON_PATCH, MERGE_PATCH, APPLY_PATCH] + ([STRATEGIC_PATCH] if smp else [])
    return {"content": {t: {"schema": {"$ref": REF + PATCH_NAME}} for t in types}, "required": True}


def _write_body(schema_name: str) -> Obj:
    return {"content": {"*/*": {"schema": {"$ref": REF + schema_name}}}, "required": True}


def kind_paths(kind: Kind, name: str) -> dict[str, Obj]:
    """Every path of one kind: collection, item, all-namespaces list, subresources."""
    base = "/" + gv_path(kind.group, kind.version)
    gv = camel_gv(kind.group, kind.version)
    tag = f"{kind.group.replace('.', '_') or 'core'}_{kind.version}"
    gvk = gvk_of(kind.group, kind.version, kind.kind)
    scope = "Namespaced" if kind.namespaced else ""
    ns_param = [_param("namespace", "path", "Object name and auth scope (the namespace).")]
    path_params = ns_param if kind.namespaced else []
    name_param = [_param("name", "path", f"Name of the {kind.kind}.")]
    pretty = [_param("pretty", "query", "If 'true', the output is pretty printed.")]
    collection = (
        f"{base}/namespaces/{{namespace}}/{kind.plural}"
        if kind.namespaced
        else (f"{base}/{kind.plural}")
    )
    item = f"{collection}/{{name}}"
    verbs = set(kind.verbs)
    smp = strategic_merge_supported(kind)
    list_name = f"{name}List"
    k = kind.kind
    paths: dict[str, Obj] = {}

    coll: Obj = {}
    if "list" in verbs:
        coll["get"] = _op(
            "list",
            f"list{gv}{scope}{k}",
            f"list or watch objects of kind {k}",
            gvk,
            tag,
            _responses(list_name, "200"),
            _LIST_PARAMS,
        )
    if "create" in verbs:
        coll["post"] = _op(
            "post",
            f"create{gv}{scope}{k}",
            f"create a {k}",
            gvk,
            tag,
            _responses(name, "200", "201", "202"),
            _WRITE_PARAMS,
            _write_body(name),
        )
    if "deletecollection" in verbs:
        coll["delete"] = _op(
            "deletecollection",
            f"delete{gv}Collection{scope}{k}",
            f"delete collection of {k}",
            gvk,
            tag,
            _responses(STATUS_NAME, "200"),
            _DELETE_PARAMS + _LIST_PARAMS,
            _write_body(DELETE_OPTIONS_NAME),
        )
    if coll:
        paths[collection] = {**coll, "parameters": path_params + pretty}

    one: Obj = {}
    if "get" in verbs:
        one["get"] = _op(
            "get",
            f"read{gv}{scope}{k}",
            f"read the specified {k}",
            gvk,
            tag,
            _responses(name, "200"),
        )
    if "update" in verbs:
        one["put"] = _op(
            "put",
            f"replace{gv}{scope}{k}",
            f"replace the specified {k}",
            gvk,
            tag,
            _responses(name, "200", "201"),
            _WRITE_PARAMS,
            _write_body(name),
        )
    if "patch" in verbs:
        one["patch"] = _op(
            "patch",
            f"patch{gv}{scope}{k}",
            f"partially update the specified {k}",
            gvk,
            tag,
            _responses(name, "200", "201"),
            [*_WRITE_PARAMS, _FORCE],
            _patch_body(smp),
        )
    if "delete" in verbs:
        one["delete"] = _op(
            "delete",
            f"delete{gv}{scope}{k}",
            f"delete a {k}",
            gvk,
            tag,
            _responses(STATUS_NAME, "200", "202"),
            _DELETE_PARAMS,
            _write_body(DELETE_OPTIONS_NAME),
        )
    if one:
        paths[item] = {**one, "parameters": name_param + path_params + pretty}

    if kind.namespaced and "list" in verbs:
        paths[f"{base}/{kind.plural}"] = {
            "get": _op(
                "list",
                f"list{gv}{k}ForAllNamespaces",
                f"list or watch objects of kind {k} in all namespaces",
                gvk,
                tag,
                _responses(list_name, "200"),
                _LIST_PARAMS,
            ),
            "parameters": pretty,
        }

    item_params = name_param + path_params + pretty
    if "status" in kind.subresources:
        paths[f"{item}/status"] = {
            "get": _op(
                "get",
                f"read{gv}{scope}{k}Status",
                f"read status of the specified {k}",
                gvk,
                tag,
                _responses(name, "200"),
            ),
            "put": _op(
                "put",
                f"replace{gv}{scope}{k}Status",
                f"replace status of the specified {k}",
                gvk,
                tag,
                _responses(name, "200", "201"),
                _WRITE_PARAMS,
                _write_body(name),
            ),
            "patch": _op(
                "patch",
                f"patch{gv}{scope}{k}Status",
                f"partially update status of the specified {k}",
                gvk,
                tag,
                _responses(name, "200", "201"),
                [*_WRITE_PARAMS, _FORCE],
                _patch_body(smp),
            ),
            "parameters": item_params,
        }
    if "scale" in kind.subresources:
        scale_gvk = gvk_of("autoscaling", "v1", "Scale")
        paths[f"{item}/scale"] = {
            "get": _op(
                "get",
                f"read{gv}{scope}{k}Scale",
                f"read scale of the specified {k}",
                scale_gvk,
                tag,
                _responses(SCALE_NAME, "200"),
            ),
            "put": _op(
                "put",
                f"replace{gv}{scope}{k}Scale",
                f"replace scale of the specified {k}",
                scale_gvk,
                tag,
                _responses(SCALE_NAME, "200", "201"),
                _WRITE_PARAMS,
                _write_body(SCALE_NAME),
            ),
            "patch": _op(
                "patch",
                f"patch{gv}{scope}{k}Scale",
                f"partially update scale of the specified {k}",
                scale_gvk,
                tag,
                _responses(SCALE_NAME, "200", "201"),
                [*_WRITE_PARAMS, _FORCE],
                _patch_body(not kind.custom),
            ),
            "parameters": item_params,
        }
    if "binding" in kind.subresources:
        paths[f"{item}/binding"] = {
            "post": _op(
                "post",
                f"create{gv}{scope}{k}Binding",
                f"create binding of a {k}",
                gvk_of("", "v1", "Binding"),
                tag,
                _responses(BINDING_NAME, "200", "201", "202"),
                _WRITE_PARAMS,
                _write_body(BINDING_NAME),
            ),
            "parameters": item_params,
        }
    if "log" in kind.subresources:
        paths[f"{item}/log"] = {
            "get": _op(
                "get",
                f"read{gv}{scope}{k}Log",
                f"read log of the specified {k}",
                gvk,
                tag,
                {
                    "200": {
                        "description": "OK",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                    "401": {"description": "Unauthorized"},
                },
                _LOG_PARAMS,
            ),
            "parameters": item_params,
        }
    return paths
