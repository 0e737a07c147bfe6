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
from orchestrator.kube.schema.meta import LIST_META, object_meta
from orchestrator.kube.schema.openapi_names import (
    BINDING_NAME,
    DELETE_OPTIONS_NAME,
    FIELD_META,
    GVK,
    PATCH_NAME,
    REF,
    SCALE_NAME,
    STATUS_NAME,
    gv_path,
    gvk_of,
    schema_name,
)
from orchestrator.kube.schema.openapi_paths import kind_paths

_ORCHESTRATOR = "x-orchestrator-"


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
        for key in ("description", "default", "nullable", *FIELD_META):
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
        comps.top(name, kind.schema, [gvk_of(kind.group, kind.version, kind.kind)])
        comps.top(
            f"{name}List",
            _list_schema(kind, name),
            [gvk_of(kind.group, kind.version, f"{kind.kind}List")],
        )
        paths.update(kind_paths(kind, name))
    for shared, gvk in (
        (STATUS, gvk_of("", "v1", "Status")),
        (DELETE_OPTIONS, None),
        (PATCH, None),
    ):
        if gvk is None:
            comps.named(shared)
        else:
            comps.top(str(shared[NAME_KEY]), shared, [gvk])
    if any("scale" in k.subresources for k in kinds):
        comps.top(SCALE_NAME, SCALE, [gvk_of("autoscaling", "v1", "Scale")])
    if any("binding" in k.subresources for k in kinds):
        comps.top(BINDING_NAME, BINDING, [gvk_of("", "v1", "Binding")])
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
