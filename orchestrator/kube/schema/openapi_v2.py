"""The Swagger 2.0 (OpenAPI v2) document of every group-version, served at `/openapi/v2`.

kubectl before 1.29 downloads it (as gnostic protobuf, see `openapi_v2_proto`) on every `apply`
and `explain`, even when it then uses OpenAPI v3: an error fetching or parsing it fails the
command. kube-openapi's parser (`k8s.io/kube-openapi/pkg/util/proto`) is strict, so the document
keeps to what it accepts:
* a schema with `$ref` has no `type` and no `properties` (its description, default and
  `x-kubernetes-*` metadata stay beside it, where strategic merge patch reads them);
* every `array` has exactly one `items` schema; types are the five JSON primitives, `object`
  and `array`; `anyOf`/`oneOf`/`not`/`nullable` (not Swagger 2.0) are dropped;
* definitions carry `x-kubernetes-group-version-kind` as a LIST (how `kubectl explain` and
  apply's patch metadata find a kind's model); operations carry it as one dict, beside
  `x-kubernetes-action` (how the fieldValidation probe finds a kind's PATCH operation).

Theory of operation: the v3 document of each group-version (`openapi.openapi_document`) is the
source; its component schemas become `definitions` (first one per name wins, except that a schema
tagged with a GVK replaces an untagged one) and its paths are rewritten in Swagger 2.0 form:
`requestBody` becomes a `body` parameter plus `consumes`, parameter schemas become `type`,
response `content` becomes `schema` plus `produces`, `allOf: [{$ref}]` becomes a sibling `$ref`.

Invariants: a pure function of the Registry; output is JSON-serialisable, key-sorted and
deterministic. `SwaggerCache` recomputes only when the registry's kinds change.
"""

from __future__ import annotations

import json
from typing import Any

from orchestrator.kube.objects import Obj
from orchestrator.kube.openapi_v2_proto import encode_document
from orchestrator.kube.schema.kind import Kind, Registry
from orchestrator.kube.schema.openapi import openapi_document
from orchestrator.kube.schema.openapi_names import GVK, REF

DEFINITIONS = "#/definitions/"
PROTOBUF_MIME = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"

# Swagger 2.0 Schema Object keywords kept as they are (beside `x-*`, which are all kept).
_SCHEMA_KEYS = frozenset(
    {
        "description",
        "type",
        "format",
        "title",
        "default",
        "enum",
        "required",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minLength",
        "maxLength",
        "pattern",
        "minItems",
        "maxItems",
        "uniqueItems",
        "minProperties",
        "maxProperties",
        "readOnly",
        "example",
    }
)
# What may stay beside a `$ref` (kube-openapi rejects a type or properties there).
_REF_SIBLINGS = frozenset({"description", "default"})
_PARAM_KEYS = ("name", "in", "description", "required", "uniqueItems")


def _ref(ref: str) -> str:
    return DEFINITIONS + ref.removeprefix(REF) if ref.startswith(REF) else ref


def _schema(node: Obj) -> Obj:
    """One v3 schema as a Swagger 2.0 schema."""
    out: Obj = {}
    ref = node.get("$ref")
    all_of = node.get("allOf")
    if ref is None and isinstance(all_of, list) and len(all_of) == 1:
        only = all_of[0]
        if isinstance(only, dict) and set(only) == {"$ref"}:
            ref = only["$ref"]
    if isinstance(ref, str):
        out["$ref"] = _ref(ref)
        for key, value in node.items():
            if key in _REF_SIBLINGS or key.startswith("x-"):
                out[key] = value
        return out
    for key, value in node.items():
        if key == "properties" and isinstance(value, dict):
            out[key] = {p: _schema(s) for p, s in value.items() if isinstance(s, dict)}
        elif key == "items" and isinstance(value, dict):
            out[key] = _schema(value)
        elif key == "additionalProperties" and isinstance(value, dict | bool):
            out[key] = _schema(value) if isinstance(value, dict) else value
        elif key in _SCHEMA_KEYS or key.startswith("x-"):
            out[key] = value
    if out.get("type") == "array" and "items" not in out:
        out["items"] = {}  # kube-openapi wants exactly one item schema
    return out


def _parameter(param: Obj) -> Obj:
    out: Obj = {k: param[k] for k in _PARAM_KEYS if k in param}
    schema = param.get("schema")
    if isinstance(schema, dict):
        for key in ("type", "format"):
            if key in schema:
                out[key] = schema[key]
    out.setdefault("type", "string")
    return out


def _media_schema(content: Obj) -> tuple[list[str], Obj | None]:
    """The media types of a v3 `content` map and the (shared) schema they carry."""
    media = sorted(content)
    schema = None
    for m in media:
        found = content[m].get("schema") if isinstance(content[m], dict) else None
        if isinstance(found, dict):
            schema = _schema(found)
            break
    return media, schema


def _operation(op: Obj) -> Obj:
    out: Obj = {}
    for key in ("tags", "summary", "description", "operationId"):
        if key in op:
            out[key] = op[key]
    params: list[Obj] = []
    body = op.get("requestBody")
    if isinstance(body, dict):
        consumes, schema = _media_schema(body.get("content") or {})
        out["consumes"] = consumes
        params.append(
            {"name": "body", "in": "body", "required": True, "schema": schema or {"type": "object"}}
        )
    params += [_parameter(p) for p in op.get("parameters") or [] if isinstance(p, dict)]
    if params:
        out["parameters"] = params
    responses: Obj = {}
    produces: set[str] = set()
    for code, resp in (op.get("responses") or {}).items():
        r: Obj = {"description": resp.get("description", "")}
        media, schema = _media_schema(resp.get("content") or {})
        produces.update(media)
        if schema is not None:
            r["schema"] = schema
        responses[code] = r
    if produces:
        out["produces"] = sorted(produces)
    out["responses"] = responses
    out["schemes"] = ["https"]
    for key, value in op.items():
        if key.startswith("x-"):
            out[key] = value
    return out


def _path_item(item: Obj) -> Obj:
    out: Obj = {}
    for key, value in item.items():
        if key in ("get", "put", "post", "delete", "patch", "head", "options"):
            out[key] = _operation(value)
        elif key == "parameters":
            out[key] = [_parameter(p) for p in value if isinstance(p, dict)]
        elif key.startswith("x-"):
            out[key] = value
    return out


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def swagger_document(registry: Registry) -> Obj:
    """`/openapi/v2`: one Swagger 2.0 document of every kind the registry serves."""
    schemas: dict[str, Obj] = {}
    paths: dict[str, Obj] = {}
    for group, versions in sorted(registry.group_versions().items()):
        for version in sorted(versions):
            doc = openapi_document(registry, group, version)
            if doc is None:
                continue
            for name, schema in doc["components"]["schemas"].items():
                held = schemas.get(name)
                if held is None or (GVK in schema and GVK not in held):
                    schemas[name] = schema
            for path, item in doc["paths"].items():
                paths.setdefault(path, _path_item(item))
    doc = {
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": paths,
        "definitions": {name: _schema(s) for name, s in schemas.items()},
    }
    out: Obj = _sorted(doc)
    return out


class SwaggerCache:
    """The v2 document as JSON and as protobuf, recomputed when the registry's kinds change.

    Kinds are immutable and replaced (never edited) when a CRD changes, so the identities of
    the registry's kinds are the cache key; the cache holds them, so an id is never reused.
    """

    def __init__(self) -> None:
        self._kinds: list[Kind] = []
        self._doc: Obj | None = None
        self._json: bytes | None = None
        self._proto: bytes | None = None

    def document(self, registry: Registry) -> Obj:
        kinds = list(registry)
        same = len(kinds) == len(self._kinds) and all(
            a is b for a, b in zip(kinds, self._kinds, strict=True)
        )
        if self._doc is None or not same:
            self._kinds = kinds
            self._doc = swagger_document(registry)
            self._json = self._proto = None
        return self._doc

    def json(self, registry: Registry) -> bytes:
        doc = self.document(registry)
        if self._json is None:
            self._json = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
        return self._json

    def protobuf(self, registry: Registry) -> bytes:
        doc = self.document(registry)
        if self._proto is None:
            self._proto = encode_document(doc)
        return self._proto


def wants_protobuf(accept: str) -> bool:
    """Whether an Accept header asks for the gnostic protobuf encoding."""
    return any(
        part.split(";")[0].strip().lower() == PROTOBUF_MIME.lower() for part in accept.split(",")
    )
