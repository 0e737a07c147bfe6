"""The Swagger 2.0 document (`/openapi/v2`) and its gnostic protobuf encoding.

Checked the way kubectl < 1.29 reads them: kube-openapi's strict model parser (every `$ref`
resolves, no type or properties beside a `$ref`, arrays with one item schema), the GVK lists on
definitions (`explain`, apply's patch metadata), the PATCH operations' `fieldValidation`
parameter (apply's validation probe). The protobuf is decoded by a small wire-format reader in
this file whose field numbers are written out independently of the encoder (from gnostic's
`openapiv2/OpenAPIv2.proto`), and compared with the JSON document.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, cast

import trio
import yaml

from orchestrator.apiserver.app import ApiApp
from orchestrator.kube.openapi_v2_proto import encode_document, varint, yaml_text
from orchestrator.kube.schema.builtin import builtin_registry
from orchestrator.kube.schema.crd import kinds_from_crd
from orchestrator.kube.schema.kind import Registry
from orchestrator.kube.schema.openapi_v2 import (
    PROTOBUF_MIME,
    SwaggerCache,
    swagger_document,
    wants_protobuf,
)

Obj = dict[str, Any]
DEFS = "#/definitions/"
GVK = "x-kubernetes-group-version-kind"
PRIMITIVES = {"string", "integer", "number", "boolean", "object", "array"}

CRD: Obj = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.example.com"},
    "spec": {
        "group": "example.com",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "description": "The widget spec.",
                                "properties": {
                                    "size": {"type": "integer", "minimum": 1},
                                    "color": {"type": "string", "enum": ["red", "blue"]},
                                    "tags": {"type": "array", "items": {"type": "string"}},
                                    "extra": {
                                        "x-kubernetes-int-or-string": True,
                                        "anyOf": [{"type": "integer"}, {"type": "string"}],
                                    },
                                    "note": {"type": "string", "nullable": True},
                                    "labels": {
                                        "type": "object",
                                        "additionalProperties": {"type": "string"},
                                    },
                                },
                            }
                        },
                    }
                },
            }
        ],
    },
}


def registry(*, crd: bool = False) -> Registry:
    reg = builtin_registry()
    if crd:
        for kind in kinds_from_crd(CRD):
            reg.add(kind)
    return reg


def schemas(doc: Obj) -> Iterator[Obj]:
    """Every schema node of the definitions and of the operations (bodies and responses)."""

    def walk(node: Obj) -> Iterator[Obj]:
        yield node
        for sub in (node.get("properties") or {}).values():
            yield from walk(sub)
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                yield from walk(node[key])

    for schema in doc["definitions"].values():
        yield from walk(schema)
    for op in operations(doc):
        for p in op.get("parameters", []):
            if "schema" in p:
                yield from walk(p["schema"])
        for r in op["responses"].values():
            if "schema" in r:
                yield from walk(r["schema"])


def operations(doc: Obj) -> Iterator[Obj]:
    for item in doc["paths"].values():
        for verb in ("get", "put", "post", "delete", "patch"):
            if verb in item:
                yield item[verb]


# -- the JSON document --------------------------------------------------------------------------


def test_document_is_strict_swagger_2_that_kube_openapi_parses() -> None:
    doc = swagger_document(registry(crd=True))
    assert doc["swagger"] == "2.0"
    assert doc["info"]["title"] == "Kubernetes"
    nodes = list(schemas(doc))
    assert len(nodes) > 500
    for node in nodes:
        assert not {"allOf", "anyOf", "oneOf", "not", "nullable"} & set(node), node
        assert not any(k.startswith("x-orchestrator-") for k in node)
        if "$ref" in node:
            assert node["$ref"].startswith(DEFS)
            assert node["$ref"].removeprefix(DEFS) in doc["definitions"], node["$ref"]
            assert not {"type", "properties"} & set(node), node
        if "type" in node:
            assert node["type"] in PRIMITIVES, node
        if node.get("type") == "array":
            assert isinstance(node.get("items"), dict), node


def test_definitions_carry_gvk_lists_and_patch_metadata() -> None:
    doc = swagger_document(registry())
    defs = doc["definitions"]
    deployment = defs["io.k8s.api.apps.v1.Deployment"]
    assert deployment[GVK] == [{"group": "apps", "version": "v1", "kind": "Deployment"}]
    assert defs["io.k8s.api.core.v1.ConfigMap"][GVK] == [
        {"group": "", "version": "v1", "kind": "ConfigMap"}
    ]
    assert defs["io.k8s.api.apps.v1.DeploymentList"][GVK][0]["kind"] == "DeploymentList"
    # `kubectl explain deployment.spec.strategy`: properties -> $ref -> properties.
    spec = deployment["properties"]["spec"]
    assert spec["$ref"] == DEFS + "io.k8s.api.apps.v1.DeploymentSpec"
    assert spec["description"]
    strategy = defs["io.k8s.api.apps.v1.DeploymentSpec"]["properties"]["strategy"]
    assert strategy["$ref"] == DEFS + "io.k8s.api.apps.v1.DeploymentStrategy"
    assert strategy["x-kubernetes-patch-strategy"] == "retainKeys"
    target = defs[strategy["$ref"].removeprefix(DEFS)]
    assert {"rollingUpdate", "type"} <= set(target["properties"])
    containers = defs["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"]
    assert containers["type"] == "array"
    assert containers["items"] == {"$ref": DEFS + "io.k8s.api.core.v1.Container"}
    assert containers["x-kubernetes-patch-strategy"] == "merge"
    assert containers["x-kubernetes-patch-merge-key"] == "name"
    # Every kind of every group-version is in the one document.
    for kind in registry():
        assert any(
            {"group": kind.group, "version": kind.version, "kind": kind.kind} in d.get(GVK, [])
            for d in defs.values()
        ), kind.kind


def test_every_patch_operation_advertises_field_validation() -> None:
    doc = swagger_document(registry(crd=True))
    patches = [op for op in operations(doc) if op["x-kubernetes-action"] == "patch"]
    assert len(patches) > 10
    for op in patches:
        assert set(op[GVK]) == {"group", "version", "kind"}
        query = {p["name"]: p for p in op["parameters"] if p["in"] == "query"}
        assert query["fieldValidation"]["type"] == "string"
        assert query["fieldManager"]["type"] == "string"
        body = [p for p in op["parameters"] if p["in"] == "body"]
        assert body == [
            {
                "in": "body",
                "name": "body",
                "required": True,
                "schema": {"$ref": DEFS + "io.k8s.apimachinery.pkg.apis.meta.v1.Patch"},
            }
        ]
        assert {
            "application/json-patch+json",
            "application/merge-patch+json",
            "application/apply-patch+yaml",
        } <= set(op["consumes"])
    item = doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]
    assert "application/strategic-merge-patch+json" in item["patch"]["consumes"]
    assert item["patch"][GVK] == {"group": "apps", "version": "v1", "kind": "Deployment"}
    assert item["get"]["responses"]["200"]["schema"] == {
        "$ref": DEFS + "io.k8s.api.apps.v1.Deployment"
    }
    assert item["put"]["x-kubernetes-action"] == "put"
    assert item["delete"]["x-kubernetes-action"] == "delete"
    path_params = {p["name"]: p for p in item["parameters"]}
    assert path_params["name"] == {
        "name": "name",
        "in": "path",
        "description": "Name of the Deployment.",
        "required": True,
        "type": "string",
    }
    coll = doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments"]
    assert coll["post"]["x-kubernetes-action"] == "post"
    assert coll["post"]["consumes"] == ["*/*"]
    assert coll["get"]["x-kubernetes-action"] == "list"
    widget = doc["paths"]["/apis/example.com/v1/namespaces/{namespace}/widgets/{name}"]
    assert "application/strategic-merge-patch+json" not in widget["patch"]["consumes"]


def test_custom_kinds_are_included_and_come_and_go() -> None:
    reg = registry(crd=True)
    doc = swagger_document(reg)
    widget = doc["definitions"]["com.example.v1.Widget"]
    assert widget[GVK] == [{"group": "example.com", "version": "v1", "kind": "Widget"}]
    spec = widget["properties"]["spec"]
    assert spec["description"] == "The widget spec."
    props = spec["properties"]
    assert props["extra"] == {"x-kubernetes-int-or-string": True}
    assert props["note"] == {"type": "string"}
    assert props["color"]["enum"] == ["red", "blue"]
    assert props["labels"]["additionalProperties"] == {"type": "string"}
    assert "/apis/example.com/v1/namespaces/{namespace}/widgets/{name}/status" in doc["paths"]
    reg.remove("example.com", "v1", "widgets")
    gone = swagger_document(reg)
    assert "com.example.v1.Widget" not in gone["definitions"]
    assert not any("example.com" in p for p in gone["paths"])


def test_deterministic_and_key_sorted() -> None:
    a = swagger_document(registry(crd=True))
    b = swagger_document(registry(crd=True))
    assert json.dumps(a) == json.dumps(b)
    assert json.dumps(a) == json.dumps(a, sort_keys=True)
    assert encode_document(a) == encode_document(b)


def test_cache_recomputes_only_when_kinds_change() -> None:
    reg = registry()
    cache = SwaggerCache()
    pb = cache.protobuf(reg)
    js = cache.json(reg)
    assert cache.protobuf(reg) is pb
    assert cache.json(reg) is js
    assert json.loads(js) == swagger_document(reg)
    kinds = kinds_from_crd(CRD)
    for kind in kinds:
        reg.add(kind)
    with_crd = cache.protobuf(reg)
    assert with_crd != pb
    assert b"com.example.v1.Widget" in with_crd
    assert b"com.example.v1.Widget" in cache.json(reg)
    for kind in kinds:
        reg.remove(kind.group, kind.version, kind.plural)
    assert cache.protobuf(reg) == pb


# -- protobuf -----------------------------------------------------------------------------------


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        n |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return n, pos


Fields = dict[int, list[Any]]


def fields(buf: bytes) -> Fields:
    """A message's fields: number -> values (int for varints, float for fixed64, bytes)."""
    out: Fields = {}
    pos = 0
    while pos < len(buf):
        key, pos = read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, pos = read_varint(buf, pos)
        elif wire == 1:
            (value,) = struct.unpack("<d", buf[pos : pos + 8])
            pos += 8
        elif wire == 2:
            size, pos = read_varint(buf, pos)
            value = buf[pos : pos + size]
            pos += size
        else:
            raise AssertionError(f"unexpected wire type {wire}")
        out.setdefault(number, []).append(value)
    assert pos == len(buf)
    return out


def string(f: Fields, n: int) -> str | None:
    return f[n][-1].decode() if n in f else None


def strings(f: Fields, n: int) -> list[str]:
    return [v.decode() for v in f.get(n, [])]


def any_value(buf: bytes) -> Any:
    """openapi.v2.Any{yaml = 2}."""
    return yaml.safe_load(string(fields(buf), 2) or "")


def named(buf: bytes) -> tuple[str, bytes]:
    f = fields(buf)
    return string(f, 1) or "", f[2][0]


def extensions(f: Fields, n: int) -> Obj:
    return {name: any_value(value) for name, value in map(named, f.get(n, []))}


def decode_schema(buf: bytes) -> Obj:
    """openapi.v2.Schema back to JSON (the fields this server writes)."""
    f = fields(buf)
    out: Obj = {}
    for n, key in ((1, "$ref"), (2, "format"), (3, "title"), (4, "description")):
        if n in f:
            out[key] = string(f, n)
    if 5 in f:
        out["default"] = any_value(f[5][0])
    for n, key in ((7, "maximum"), (9, "minimum")):
        if n in f:
            out[key] = int(f[n][0]) if f[n][0] == int(f[n][0]) else f[n][0]
    for n, key in ((11, "maxLength"), (12, "minLength"), (14, "maxItems"), (15, "minItems")):
        if n in f:
            out[key] = f[n][0]
    if 13 in f:
        out["pattern"] = string(f, 13)
    if 19 in f:
        out["required"] = strings(f, 19)
    if 20 in f:
        out["enum"] = [any_value(v) for v in f[20]]
    if 21 in f:
        item = fields(f[21][0])
        out["additionalProperties"] = decode_schema(item[1][0]) if 1 in item else bool(item[2][0])
    if 22 in f:
        types = strings(fields(f[22][0]), 1)
        out["type"] = types[0] if len(types) == 1 else types
    if 23 in f:
        (only,) = fields(f[23][0])[1]
        out["items"] = decode_schema(only)
    if 25 in f:
        props = fields(f[25][0]).get(1, [])
        out["properties"] = {k: decode_schema(v) for k, v in map(named, props)}
    out.update(extensions(f, 31))
    return out


def decode_parameter(buf: bytes) -> Obj:
    """ParametersItem{parameter = 1} -> Parameter{body = 1 | non_body = 2}."""
    param = fields(fields(buf)[1][0])
    if 1 in param:
        body = fields(param[1][0])
        return {
            "in": string(body, 3),
            "name": string(body, 2),
            "required": bool(body.get(4, [0])[0]),
            "schema": decode_schema(body[5][0]),
        }
    non_body = fields(param[2][0])
    if 3 in non_body:  # QueryParameterSubSchema: type 6, unique_items 20
        sub, type_n, unique_n = fields(non_body[3][0]), 6, 20
    else:  # PathParameterSubSchema: type 5, unique_items 19
        sub, type_n, unique_n = fields(non_body[4][0]), 5, 19
    out: Obj = {"in": string(sub, 2), "name": string(sub, 4), "type": string(sub, type_n)}
    if 3 in sub:
        out["description"] = string(sub, 3)
    if 1 in sub:
        out["required"] = bool(sub[1][0])
    if unique_n in sub:
        out["uniqueItems"] = bool(sub[unique_n][0])
    return out


def decode_operation(buf: bytes) -> Obj:
    f = fields(buf)
    out: Obj = {"tags": strings(f, 1), "description": string(f, 3), "operationId": string(f, 5)}
    if 6 in f:
        out["produces"] = strings(f, 6)
    if 7 in f:
        out["consumes"] = strings(f, 7)
    if 8 in f:
        out["parameters"] = [decode_parameter(p) for p in f[8]]
    responses: Obj = {}
    for code, value in map(named, fields(f[9][0]).get(1, [])):
        resp = fields(fields(value)[1][0])
        r: Obj = {"description": string(resp, 1)}
        if 2 in resp:
            r["schema"] = decode_schema(fields(resp[2][0])[1][0])
        responses[code] = r
    out["responses"] = responses
    out["schemes"] = strings(f, 10)
    out.update(extensions(f, 13))
    return out


def decode_document(buf: bytes) -> Obj:
    f = fields(buf)
    info = fields(f[2][0])
    paths: Obj = {}
    for name, value in map(named, fields(f[8][0]).get(2, [])):
        item = fields(value)
        out: Obj = {}
        for n, verb in ((2, "get"), (3, "put"), (4, "post"), (5, "delete"), (8, "patch")):
            if n in item:
                out[verb] = decode_operation(item[n][0])
        if 9 in item:
            out["parameters"] = [decode_parameter(p) for p in item[9]]
        paths[name] = out
    definitions = {k: decode_schema(v) for k, v in map(named, fields(f[9][0]).get(1, []))}
    return {
        "swagger": string(f, 1),
        "info": {"title": string(info, 1), "version": string(info, 2)},
        "paths": paths,
        "definitions": definitions,
    }


_PROTO3_SCALARS = {"minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems"}


def without_proto3_defaults(node: Any) -> Any:
    """What survives proto3: scalars equal to their default (`minimum: 0`) are not written
    (gnostic has no presence for them either, so kube-apiserver's protobuf loses them too)."""
    if isinstance(node, dict):
        return {
            k: without_proto3_defaults(v)
            for k, v in node.items()
            if not (k in _PROTO3_SCALARS and v == 0)
        }
    if isinstance(node, list):
        return [without_proto3_defaults(v) for v in node]
    return node


def test_protobuf_round_trips_to_the_json_document() -> None:
    doc = without_proto3_defaults(swagger_document(registry(crd=True)))
    decoded = decode_document(encode_document(doc))
    assert decoded["swagger"] == "2.0"
    assert decoded["info"] == doc["info"]
    assert list(decoded["definitions"]) == list(doc["definitions"])
    for name, schema in doc["definitions"].items():
        assert decoded["definitions"][name] == schema, name
    assert list(decoded["paths"]) == list(doc["paths"])
    for path, item in doc["paths"].items():
        assert decoded["paths"][path] == item, path


def test_empty_and_false_values_are_still_present() -> None:
    schema = encode_document(
        {
            "definitions": {
                "A": {"type": "object", "properties": {}},
                "B": {"type": "object", "additionalProperties": False},
            }
        }
    )
    (defs,) = fields(schema)[9]
    a, b = (fields(named(v)[1]) for v in fields(defs)[1])
    assert a[25] == [b""]  # present but empty Properties: a struct, not a map
    assert fields(b[21][0]) == {2: [0]}  # AdditionalPropertiesItem{boolean: false}


def test_varints_and_yaml_values() -> None:
    assert varint(0) == b"\x00"
    assert varint(127) == b"\x7f"
    assert varint(128) == b"\x80\x01"
    assert varint(300) == b"\xac\x02"
    assert varint(-1) == b"\xff" * 9 + b"\x01"
    assert read_varint(varint(2**40 + 5), 0) == (2**40 + 5, 6)
    gvks = [{"group": "", "kind": "ConfigMap", "version": "v1"}]
    assert yaml_text(gvks) == "- group: ''\n  kind: ConfigMap\n  version: v1\n"
    for value in (gvks, "merge", True, 3, 1.5, None, {"a": ["b"]}, "on", ""):
        assert yaml.safe_load(yaml_text(value)) == value


# -- served -------------------------------------------------------------------------------------


def test_wants_protobuf() -> None:
    assert wants_protobuf(PROTOBUF_MIME)
    assert wants_protobuf(f"{PROTOBUF_MIME}, application/json;q=0.9")
    assert not wants_protobuf("application/json")
    assert not wants_protobuf("")


def get(app: ApiApp, path: str, accept: str | None) -> tuple[int, dict[str, str], bytes]:
    headers = [(b"accept", accept.encode())] if accept else []
    scope = {"type": "http", "method": "GET", "path": path, "query_string": b"", "headers": headers}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    trio.run(app, scope, receive, send)
    start = sent[0]
    hdrs = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], hdrs, b"".join(m.get("body", b"") for m in sent[1:])


def test_served_as_protobuf_or_json() -> None:
    reg = registry()
    app = ApiApp(cast(Any, SimpleNamespace(registry=reg)), None)
    status, hdrs, body = get(app, "/openapi/v2", PROTOBUF_MIME)
    assert status == 200
    # Go's mime parser rejects the `@` of the protobuf type; kube-apiserver sends octet-stream.
    assert hdrs["content-type"] == "application/octet-stream"
    assert decode_document(body) == without_proto3_defaults(swagger_document(reg))
    status, hdrs, legacy = get(app, "/swagger-2.0.0.pb-v1", None)
    assert (status, legacy) == (200, body)
    status, hdrs, text = get(app, "/openapi/v2", "application/json")
    assert (status, hdrs["content-type"]) == (200, "application/json")
    assert json.loads(text) == swagger_document(reg)
    assert get(app, "/openapi/v2", None)[2] == text
