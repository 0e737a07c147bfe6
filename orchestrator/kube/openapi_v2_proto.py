"""A Swagger 2.0 document encoded as gnostic's `openapi.v2.Document` protobuf.

This is what kubectl before 1.29 downloads from `/openapi/v2` (Accept:
`application/com.github.proto-openapi.spec.v2@v1.0+protobuf`) and unmarshals with
`github.com/google/gnostic-models/openapiv2`. The message layout and field numbers follow
`openapiv2/OpenAPIv2.proto`; only the messages a Kubernetes document uses are written.

Theory of operation: a tiny protobuf writer (varints, length-delimited fields, fixed64 doubles)
and one function per message, each emitting its fields in field-number order. Proto3 scalars
equal to their default are left out, except inside a `oneof` (an `additionalProperties: false`
is still written). Sub-messages are written whenever the JSON has the key, even empty: an empty
`properties` must still decode as a present `Properties` (kube-openapi then treats the schema
as a struct, not a map). Values of type `Any` (defaults, enums, examples, vendor extensions)
carry their value as YAML text, as gnostic does and as kube-openapi's parser reads them.

Invariants: deterministic (the same document gives the same bytes); JSON key order is kept,
and the caller's documents are key-sorted.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import yaml

from orchestrator.kube.objects import Obj

_VARINT = 0
_FIXED64 = 1
_LEN = 2


def varint(n: int) -> bytes:
    """Base-128 varint; negative numbers as 64-bit two's complement (10 bytes), like Go."""
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


class Writer:
    """Accumulates the fields of one message."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def _key(self, field: int, wire: int) -> None:
        self._parts.append(varint(field << 3 | wire))

    def message(self, field: int, data: bytes) -> None:
        self._key(field, _LEN)
        self._parts.append(varint(len(data)))
        self._parts.append(data)

    def string(self, field: int, value: Any) -> None:
        if isinstance(value, str) and value:
            self.message(field, value.encode())

    def strings(self, field: int, values: Any) -> None:
        for v in values if isinstance(values, list) else []:
            if isinstance(v, str):
                self.message(field, v.encode())

    def boolean(self, field: int, value: Any, *, always: bool = False) -> None:
        if value is True or (always and value is False):
            self._key(field, _VARINT)
            self._parts.append(b"\x01" if value else b"\x00")

    def int64(self, field: int, value: Any) -> None:
        if isinstance(value, int) and not isinstance(value, bool) and value:
            self._key(field, _VARINT)
            self._parts.append(varint(value))

    def double(self, field: int, value: Any) -> None:
        if isinstance(value, int | float) and not isinstance(value, bool) and value:
            self._key(field, _FIXED64)
            self._parts.append(struct.pack("<d", float(value)))

    def bytes(self) -> bytes:
        return b"".join(self._parts)


# -- Any, NamedAny ------------------------------------------------------------------------------


def yaml_text(value: Any) -> str:
    """A JSON value as YAML text: block style for collections, JSON (a YAML subset) for scalars."""
    if isinstance(value, dict | list):
        text: str = yaml.safe_dump(value, default_flow_style=False, sort_keys=False, width=1 << 30)
        return text
    return json.dumps(value)


def _any(value: Any) -> bytes:
    w = Writer()
    w.message(2, yaml_text(value).encode())  # Any.yaml
    return w.bytes()


def _vendor_extensions(w: Writer, field: int, obj: Obj) -> None:
    for key, value in obj.items():
        if key.startswith("x-"):
            named = Writer()
            named.string(1, key)
            named.message(2, _any(value))
            w.message(field, named.bytes())


# -- Schema -------------------------------------------------------------------------------------


def _named_schemas(schemas: Obj) -> bytes:
    """Definitions / Properties: `repeated NamedSchema additional_properties = 1`."""
    w = Writer()
    for name, schema in schemas.items():
        if isinstance(schema, dict):
            named = Writer()
            named.string(1, name)
            named.message(2, schema_message(schema))
            w.message(1, named.bytes())
    return w.bytes()


def schema_message(s: Obj) -> bytes:
    """openapi.v2.Schema."""
    w = Writer()
    w.string(1, s.get("$ref"))
    w.string(2, s.get("format"))
    w.string(3, s.get("title"))
    w.string(4, s.get("description"))
    if "default" in s:
        w.message(5, _any(s["default"]))
    w.double(6, s.get("multipleOf"))
    w.double(7, s.get("maximum"))
    w.boolean(8, s.get("exclusiveMaximum"))
    w.double(9, s.get("minimum"))
    w.boolean(10, s.get("exclusiveMinimum"))
    w.int64(11, s.get("maxLength"))
    w.int64(12, s.get("minLength"))
    w.string(13, s.get("pattern"))
    w.int64(14, s.get("maxItems"))
    w.int64(15, s.get("minItems"))
    w.boolean(16, s.get("uniqueItems"))
    w.int64(17, s.get("maxProperties"))
    w.int64(18, s.get("minProperties"))
    w.strings(19, s.get("required"))
    for value in s.get("enum") or []:
        w.message(20, _any(value))
    additional = s.get("additionalProperties")
    if isinstance(additional, dict | bool):
        item = Writer()  # AdditionalPropertiesItem: oneof {Schema schema = 1; bool boolean = 2}
        if isinstance(additional, bool):
            item.boolean(2, additional, always=True)
        else:
            item.message(1, schema_message(additional))
        w.message(21, item.bytes())
    if "type" in s:
        types = s["type"] if isinstance(s["type"], list) else [s["type"]]
        type_item = Writer()  # TypeItem{repeated string value = 1}
        type_item.strings(1, types)
        w.message(22, type_item.bytes())
    items = s.get("items")
    if isinstance(items, dict | list):
        items_item = Writer()  # ItemsItem{repeated Schema schema = 1}
        for one in items if isinstance(items, list) else [items]:
            if isinstance(one, dict):
                items_item.message(1, schema_message(one))
        w.message(23, items_item.bytes())
    for one in s.get("allOf") or []:
        if isinstance(one, dict):
            w.message(24, schema_message(one))
    if isinstance(s.get("properties"), dict):
        w.message(25, _named_schemas(s["properties"]))
    w.boolean(27, s.get("readOnly"))
    if "example" in s:
        w.message(30, _any(s["example"]))
    _vendor_extensions(w, 31, s)
    return w.bytes()


# -- paths --------------------------------------------------------------------------------------


def _non_body_parameter(p: Obj) -> bytes:
    """NonBodyParameter: oneof {header = 1, form_data = 2, query = 3, path = 4}."""
    sub = Writer()
    where = p.get("in")
    if where == "path":  # PathParameterSubSchema
        sub.boolean(1, p.get("required"))
        sub.string(2, where)
        sub.string(3, p.get("description"))
        sub.string(4, p.get("name"))
        sub.string(5, p.get("type"))
        sub.string(6, p.get("format"))
        sub.boolean(19, p.get("uniqueItems"))
        _vendor_extensions(sub, 22, p)
        field = 4
    elif where == "header":  # HeaderParameterSubSchema
        sub.boolean(1, p.get("required"))
        sub.string(2, where)
        sub.string(3, p.get("description"))
        sub.string(4, p.get("name"))
        sub.string(5, p.get("type"))
        sub.string(6, p.get("format"))
        sub.boolean(19, p.get("uniqueItems"))
        _vendor_extensions(sub, 22, p)
        field = 1
    else:  # query (and anything else) as QueryParameterSubSchema
        sub.boolean(1, p.get("required"))
        sub.string(2, where)
        sub.string(3, p.get("description"))
        sub.string(4, p.get("name"))
        sub.string(6, p.get("type"))
        sub.string(7, p.get("format"))
        sub.boolean(20, p.get("uniqueItems"))
        _vendor_extensions(sub, 23, p)
        field = 3
    w = Writer()
    w.message(field, sub.bytes())
    return w.bytes()


def _parameters_item(p: Obj) -> bytes:
    """ParametersItem{Parameter parameter = 1} -> Parameter{body = 1 | non_body = 2}."""
    param = Writer()
    if p.get("in") == "body":
        body = Writer()  # BodyParameter
        body.string(1, p.get("description"))
        body.string(2, p.get("name"))
        body.string(3, "body")
        body.boolean(4, p.get("required"))
        if isinstance(p.get("schema"), dict):
            body.message(5, schema_message(p["schema"]))
        _vendor_extensions(body, 6, p)
        param.message(1, body.bytes())
    else:
        param.message(2, _non_body_parameter(p))
    w = Writer()
    w.message(1, param.bytes())
    return w.bytes()


def _responses(responses: Obj) -> bytes:
    """Responses{repeated NamedResponseValue response_code = 1}."""
    w = Writer()
    for code, resp in responses.items():
        r = Writer()  # Response
        r.string(1, resp.get("description"))
        if isinstance(resp.get("schema"), dict):
            item = Writer()  # SchemaItem{Schema schema = 1}
            item.message(1, schema_message(resp["schema"]))
            r.message(2, item.bytes())
        _vendor_extensions(r, 5, resp)
        value = Writer()  # ResponseValue{Response response = 1}
        value.message(1, r.bytes())
        named = Writer()
        named.string(1, code)
        named.message(2, value.bytes())
        w.message(1, named.bytes())
    return w.bytes()


def _operation(op: Obj) -> bytes:
    w = Writer()
    w.strings(1, op.get("tags"))
    w.string(2, op.get("summary"))
    w.string(3, op.get("description"))
    w.string(5, op.get("operationId"))
    w.strings(6, op.get("produces"))
    w.strings(7, op.get("consumes"))
    for p in op.get("parameters") or []:
        w.message(8, _parameters_item(p))
    if isinstance(op.get("responses"), dict):
        w.message(9, _responses(op["responses"]))
    w.strings(10, op.get("schemes"))
    w.boolean(11, op.get("deprecated"))
    _vendor_extensions(w, 13, op)
    return w.bytes()


_OPERATIONS = {"get": 2, "put": 3, "post": 4, "delete": 5, "options": 6, "head": 7, "patch": 8}


def _path_item(item: Obj) -> bytes:
    w = Writer()
    w.string(1, item.get("$ref"))
    for verb, field in _OPERATIONS.items():
        if isinstance(item.get(verb), dict):
            w.message(field, _operation(item[verb]))
    for p in item.get("parameters") or []:
        w.message(9, _parameters_item(p))
    _vendor_extensions(w, 10, item)
    return w.bytes()


def _paths(paths: Obj) -> bytes:
    """Paths{repeated NamedAny vendor_extension = 1; repeated NamedPathItem path = 2}."""
    w = Writer()
    _vendor_extensions(w, 1, paths)
    for name, item in paths.items():
        if not name.startswith("x-") and isinstance(item, dict):
            named = Writer()
            named.string(1, name)
            named.message(2, _path_item(item))
            w.message(2, named.bytes())
    return w.bytes()


# -- Document -----------------------------------------------------------------------------------


def encode_document(doc: Obj) -> bytes:
    """A Swagger 2.0 document (JSON form) as `openapi.v2.Document` protobuf bytes."""
    w = Writer()
    w.string(1, doc.get("swagger"))
    info = doc.get("info")
    if isinstance(info, dict):
        i = Writer()
        i.string(1, info.get("title"))
        i.string(2, info.get("version"))
        i.string(3, info.get("description"))
        _vendor_extensions(i, 7, info)
        w.message(2, i.bytes())
    w.string(3, doc.get("host"))
    w.string(4, doc.get("basePath"))
    w.strings(5, doc.get("schemes"))
    w.strings(6, doc.get("consumes"))
    w.strings(7, doc.get("produces"))
    if isinstance(doc.get("paths"), dict):
        w.message(8, _paths(doc["paths"]))
    if isinstance(doc.get("definitions"), dict):
        w.message(9, _named_schemas(doc["definitions"]))
    _vendor_extensions(w, 16, doc)
    return w.bytes()
