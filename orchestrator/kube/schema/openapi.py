"""OpenAPI v3 documents generated from the Registry's schemas: the index and one per group-version.

kubectl reads these for three things (reference: kubectl-compat.md §3):
* `apply`/`create` field validation: it looks for a PATCH operation tagged with the object's
  `x-kubernetes-group-version-kind` (a dict) that has a `fieldValidation` query parameter; found,
  it sends `?fieldValidation=Strict` and leaves checking to the server. kubectl stops at the FIRST
  PATCH op with the GVK it meets (Go map order), so every PATCH op (status and scale too) has it.
* client-side apply's strategic merge patch: `application/strategic-merge-patch+json` in a PATCH
  requestBody tells kubectl the schemas carry `x-kubernetes-patch-strategy`/`-merge-key`; it is
  advertised only for built-in kinds whose schema has that metadata (never for custom kinds).
* `kubectl explain`: the component schema whose `x-kubernetes-group-version-kind` LIST holds the
  GVK, walked through `properties`, `allOf: [{$ref}]` (named structs held by a field), `items` and
  `additionalProperties` (`$ref`).

Theory of operation: a Kind's schema is emitted with every node that carries `x-orchestrator-name`
moved once into `components.schemas` under that name and referenced from its holders. The field
that holds a named struct keeps its own description and the patch/list metadata beside the
`allOf` (that is where kubectl's SMP code reads it). `x-orchestrator-*` keys never reach output.

Invariants: pure functions of the Registry; output is JSON-serialisable, key-sorted and
deterministic, so `hash=` changes exactly when a document changes. Caching is the caller's.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.builders import NAME_KEY
from orchestrator.kube.schema.kind import Kind, Registry
from orchestrator.kube.schema.meta import LIST_META, META, object_meta

REF = "#/components/schemas/"
_ORCHESTRATOR = "x-orchestrator-"
GVK = "x-kubernetes-group-version-kind"
_FIELD_META = (
    "x-kubernetes-patch-strategy",
    "x-kubernetes-patch-merge-key",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
)
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
_MEDIA = ("application/json", "application/yaml")

STATUS_NAME = f"{META}.Status"
DELETE_OPTIONS_NAME = f"{META}.DeleteOptions"
PATCH_NAME = f"{META}.Patch"
SCALE_NAME = "io.k8s.api.autoscaling.v1.Scale"
BINDING_NAME = "io.k8s.api.core.v1.Binding"


def _string(desc: str) -> Obj:
    return {"type": "string", "description": desc}


def _api_fields() -> Obj:
    return {
        "apiVersion": _string("The versioned schema of this object."),
        "kind": _string("The REST resource this object represents."),
    }


STATUS: Obj = {
    "type": "object",
    "description": "Status is a return value for calls that don't return other objects.",
    "properties": {
        **_api_fields(),
        "metadata": {**LIST_META, "description": "Standard list metadata."},
        "status": _string('"Success" or "Failure".'),
        "message": _string("A human-readable description of the status of this operation."),
        "reason": _string("A machine-readable description of why the operation failed."),
        "code": {"type": "integer", "format": "int32", "description": "HTTP status code."},
        "details": {
            "type": "object",
            "description": "Extended data associated with the reason.",
            "x-kubernetes-preserve-unknown-fields": True,
        },
    },
    NAME_KEY: STATUS_NAME,
}

DELETE_OPTIONS: Obj = {
    "type": "object",
    "description": "DeleteOptions may be provided when deleting an API object.",
    "properties": {
        **_api_fields(),
        "dryRun": {"type": "array", "items": {"type": "string"}, "description": "All or empty."},
        "gracePeriodSeconds": {
            "type": "integer",
            "format": "int64",
            "description": "Seconds before the object should be deleted.",
        },
        "orphanDependents": {
            "type": "boolean",
            "description": "Deprecated: use propagationPolicy.",
        },
        "preconditions": {
            "type": "object",
            "description": "Must be fulfilled before a deletion is carried out.",
            "properties": {
                "resourceVersion": _string("The target resourceVersion."),
                "uid": _string("The target UID."),
            },
        },
        "propagationPolicy": _string("Orphan, Background or Foreground."),
    },
    NAME_KEY: DELETE_OPTIONS_NAME,
}

PATCH: Obj = {
    "type": "object",
    "description": "Patch is provided to give a concrete name and type to the PATCH request body.",
    NAME_KEY: PATCH_NAME,
}

SCALE: Obj = {
    "type": "object",
    "description": "Scale represents a scaling request for a resource.",
    "properties": {
        **_api_fields(),
        "metadata": object_meta(),
        "spec": {
            "type": "object",
            "description": "The desired state of the scale.",
            "properties": {
                "replicas": {
                    "type": "integer",
                    "format": "int32",
                    "description": "Desired number of instances for the scaled object.",
                }
            },
            NAME_KEY: "io.k8s.api.autoscaling.v1.ScaleSpec",
        },
        "status": {
            "type": "object",
            "description": "The current status of the scale.",
            "properties": {
                "replicas": {
                    "type": "integer",
                    "format": "int32",
                    "description": "Actual number of observed instances of the scaled object.",
                },
                "selector": _string("Label query over pods, in the string form of a selector."),
            },
            "required": ["replicas"],
            NAME_KEY: "io.k8s.api.autoscaling.v1.ScaleStatus",
        },
    },
    NAME_KEY: SCALE_NAME,
}

BINDING: Obj = {
    "type": "object",
    "description": "Binding ties one object to another; for example, a pod is bound to a node.",
    "properties": {
        **_api_fields(),
        "metadata": object_meta(),
        "target": {
            "type": "object",
            "description": "The target object to bind to.",
            "properties": {
                **_api_fields(),
                "name": _string("Name of the referent."),
                "namespace": _string("Namespace of the referent."),
                "uid": _string("UID of the referent."),
            },
        },
    },
    "required": ["target"],
    NAME_KEY: BINDING_NAME,
}


# -- names ----------------------------------------------------------------------------------------


def gv_path(group: str, version: str) -> str:
    """`api/v1`, `apis/apps/v1`: the key of a group-version in the index and in URLs."""
    return f"apis/{group}/{version}" if group else f"api/{version}"


def schema_name(kind: Kind) -> str:
    """The component name of a kind's schema: its own name, or the Kubernetes convention."""
    name = kind.schema.get(NAME_KEY)
    if isinstance(name, str) and name:
        return name
    if kind.custom:
        return f"{'.'.join(reversed(kind.group.split('.')))}.{kind.version}.{kind.kind}"
    package = "core" if not kind.group else kind.group.removesuffix(".k8s.io").split(".")[0]
    return f"io.k8s.api.{package}.{kind.version}.{kind.kind}"


def _camel_gv(group: str, version: str) -> str:
    parts = group.removesuffix(".k8s.io").replace("-", ".").split(".") if group else ["core"]
    return "".join(p[:1].upper() + p[1:] for p in parts if p) + version[:1].upper() + version[1:]


def _gvk(group: str, version: str, kind: str) -> Obj:
    return {"group": group, "version": version, "kind": kind}


# -- schemas --------------------------------------------------------------------------------------


class _Components:
    """Emits schemas into `components.schemas`, each named struct once."""

    def __init__(self) -> None:
        self.schemas: dict[str, Obj] = {}

    def top(self, name: str, node: Obj, gvks: list[Obj]) -> None:
        if name in self.schemas and GVK in self.schemas[name]:
            return
        self.schemas[name] = {}
        body = self.convert(node)
        body[GVK] = gvks
        self.schemas[name] = body

    def named(self, node: Obj) -> str:
        name = str(node[NAME_KEY])
        if name not in self.schemas:
            self.schemas[name] = {}  # placeholder: a recursive reference stops here
            body = self.convert(node)
            # The description is the holding field's (kept beside the reference); on the
            # struct too, `kubectl explain` would print it twice.
            body.pop("description", None)
            self.schemas[name] = body
        return name

    def convert(self, node: Obj) -> Obj:
        out: Obj = {}
        for key, value in node.items():
            if key.startswith(_ORCHESTRATOR):
                continue
            if key == "properties" and isinstance(value, dict):
                out[key] = {p: self.field(s) for p, s in value.items() if isinstance(s, dict)}
            elif key in ("items", "additionalProperties") and isinstance(value, dict):
                out[key] = self.child(value)
            else:
                out[key] = _clean(value)
        return out

    def field(self, node: Obj) -> Obj:
        """A property: named structs as `allOf: [{$ref}]` with the field's own description."""
        if not isinstance(node.get(NAME_KEY), str):
            return self.convert(node)
        out: Obj = {"allOf": [{"$ref": REF + self.named(node)}]}
        for key in ("description", "default", "nullable", *_FIELD_META):
            if key in node:
                out[key] = _clean(node[key])
        return out

    def child(self, node: Obj) -> Obj:
        if isinstance(node.get(NAME_KEY), str):
            return {"$ref": REF + self.named(node)}
        return self.convert(node)


def _clean(value: Any) -> Any:
    """A deep copy without `x-orchestrator-*` keys (inside defaults, enums, ...)."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if not str(k).startswith(_ORCHESTRATOR)}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return copy.deepcopy(value)


def _has_patch_metadata(schema: Any) -> bool:
    if isinstance(schema, dict):
        if "x-kubernetes-patch-strategy" in schema or "x-kubernetes-patch-merge-key" in schema:
            return True
        return any(_has_patch_metadata(v) for v in schema.values())
    if isinstance(schema, list):
        return any(_has_patch_metadata(v) for v in schema)
    return False


def strategic_merge_supported(kind: Kind) -> bool:
    """SMP is advertised for built-in kinds whose schema carries patch metadata."""
    props = kind.schema.get("properties")
    return (
        not kind.custom
        and isinstance(props, dict)
        and "metadata" in props
        and _has_patch_metadata(kind.schema)
    )


def _list_schema(kind: Kind, item: str) -> Obj:
    return {
        "type": "object",
        "description": f"{kind.kind}List is a list of {kind.kind}.",
        "properties": {
            **_api_fields(),
            "items": {
                "type": "array",
                "description": f"List of {kind.plural}.",
                "items": {"$ref": REF + item},
            },
            "metadata": {**LIST_META, "description": "Standard list metadata."},
        },
        "required": ["items"],
    }


# -- operations -----------------------------------------------------------------------------------


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


def _content(schema_name: str, media: tuple[str, ...] = _MEDIA) -> Obj:
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


def _paths(kind: Kind, name: str) -> dict[str, Obj]:
    """Every path of one kind: collection, item, all-namespaces list, subresources."""
    base = "/" + gv_path(kind.group, kind.version)
    gv = _camel_gv(kind.group, kind.version)
    tag = f"{kind.group.replace('.', '_') or 'core'}_{kind.version}"
    gvk = _gvk(kind.group, kind.version, kind.kind)
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
        scale_gvk = _gvk("autoscaling", "v1", "Scale")
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
                _gvk("", "v1", "Binding"),
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


# -- documents ------------------------------------------------------------------------------------


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def _kinds(registry: Registry, group: str, version: str) -> list[Kind]:
    return sorted(
        (k for k in registry if k.group == group and k.version == version),
        key=lambda k: (k.plural, k.kind),
    )


def openapi_document(registry: Registry, group: str, version: str) -> Obj | None:
    """The OpenAPI 3.0 document of a group-version (`/openapi/v3/apis/apps/v1`); None if unknown."""
    kinds = _kinds(registry, group, version)
    if not kinds:
        return None
    comps = _Components()
    paths: dict[str, Obj] = {}
    for kind in kinds:
        name = schema_name(kind)
        comps.top(name, kind.schema, [_gvk(kind.group, kind.version, kind.kind)])
        comps.top(
            f"{name}List",
            _list_schema(kind, name),
            [_gvk(kind.group, kind.version, f"{kind.kind}List")],
        )
        paths.update(_paths(kind, name))
    for shared, gvk in (
        (STATUS, _gvk("", "v1", "Status")),
        (DELETE_OPTIONS, None),
        (PATCH, None),
    ):
        if gvk is None:
            comps.named(shared)
        else:
            comps.top(str(shared[NAME_KEY]), shared, [gvk])
    if any("scale" in k.subresources for k in kinds):
        comps.top(SCALE_NAME, SCALE, [_gvk("autoscaling", "v1", "Scale")])
    if any("binding" in k.subresources for k in kinds):
        comps.top(BINDING_NAME, BINDING, [_gvk("", "v1", "Binding")])
    doc: Obj = {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": paths,
        "components": {"schemas": comps.schemas},
    }
    out: Obj = _sorted(doc)
    return out


def document_hash(doc: Obj) -> str:
    """A stable digest of a document (what `?hash=` carries): upper-case hex SHA-512."""
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return hashlib.sha512(text.encode()).hexdigest().upper()


def openapi_index(registry: Registry) -> Obj:
    """`/openapi/v3`: every group-version with the URL of its document and that document's hash."""
    paths: dict[str, Obj] = {}
    for group, versions in registry.group_versions().items():
        for version in versions:
            doc = openapi_document(registry, group, version)
            if doc is None:
                continue
            key = gv_path(group, version)
            paths[key] = {"serverRelativeURL": f"/openapi/v3/{key}?hash={document_hash(doc)}"}
    return {"paths": {k: paths[k] for k in sorted(paths)}}
