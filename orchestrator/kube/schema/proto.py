"""The protobuf view of the kinds' schemas: field numbers written beside the fields, and the
message tables the protobuf codec (`orchestrator.kube.protobuf`) decodes with, derived from them.

A struct node that has a protobuf form carries `x-orchestrator-proto` (written with the `proto=`
argument of `obj`, `preserve_unknown` and `object_schema`): `{"fields": {json name: field}}`,
plus `"name"` ("v1.PodSpec", as errors name the message) when the node has no
`x-orchestrator-name` to derive it from. The numbers are upstream's (`k8s.io/api` core/v1 and
apps/v1 `generated.proto`, apimachinery meta/v1). A field is written as:

* `3`: field 3; its wire kind follows from the property's schema node (string, `byte` string,
  `date-time` string, int32/int64 integer, boolean, IntOrString, Quantity, FieldsV1, a struct
  that carries its own numbers, a map of scalars, or a list of any of these);
* `ptr(3)`: the same, but a Go pointer: its zero value is kept (any other scalar at its zero
  value is dropped, as Go's `omitempty` JSON would);
* `wire(3, kind, ...)`: a field the schema does not model (e.g. ObjectMeta's selfLink, the
  projected volume sources kept as `preserve_unknown`): decoded as upstream sends it and left to
  validation and pruning downstream, exactly as the same field in a JSON body;
* `inline(2, message("v1.VolumeSource", {...}))`: a Go embedded struct whose fields are the
  holder's own properties in JSON (Volume's VolumeSource, Probe's ProbeHandler, the
  LocalObjectReference of key selectors).

A property without a number has no protobuf form: the codec refuses it (415) rather than guess.

Invariants: annotations are plain JSON-shaped data in the node (never stripped from the schema,
always stripped from OpenAPI output like every `x-orchestrator-*` key); `roots()` is a pure
function of the kinds, and raises `ProtoTableError` on an annotation that names a missing
property, a number twice, or a property whose schema has no wire kind.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from orchestrator.kube.schema.builders import NAME_KEY, PROTO_KEY, QUANTITY_NAME, Schema
from orchestrator.kube.schema.kind import Kind

# Wire kinds. A trailing "*" on a table's kind keeps the zero value (the Go field is a pointer).
STRING, BYTES, BOOL, INT32, INT64 = "string", "bytes", "bool", "int32", "int64"
MESSAGE, INLINE, MAP = "message", "inline", "map"
INTSTR, QUANTITY, TIME, MICROTIME, FIELDSV1 = "intstr", "quantity", "time", "microtime", "fieldsv1"

FIELDS_V1_NAME: Final = "io.k8s.apimachinery.pkg.apis.meta.v1.FieldsV1"

ProtoField = int | dict[str, Any]  # as written in a schema module
Field = tuple[str, str, "Msg | str | None", bool]  # (json name, kind, sub, repeated)


@dataclass(frozen=True)
class Msg:
    """One message table: `{field number: (json name, kind, sub, repeated)}`. `sub` is the
    message of a MESSAGE or INLINE field, the value kind of a MAP, else None."""

    name: str  # as in error messages: "v1.PodSpec"
    fields: dict[int, Field]


class ProtoTableError(Exception):
    """An `x-orchestrator-proto` annotation that does not describe its schema: a bug in a
    schema module, raised when the tables are derived (the tests derive them all)."""


# ----------------------------------------------------------------------- writing annotations
def ptr(number: int) -> dict[str, Any]:
    """Field `number`, a Go pointer: its zero value is kept."""
    return {"number": number, "keep": True}


def wire(
    number: int,
    kind: str,
    *,
    keep: bool = False,
    repeated: bool = False,
    msg: Mapping[str, Any] | None = None,
    value: str | None = None,
) -> dict[str, Any]:
    """Field `number` that the schema does not model: its wire `kind`, the `msg` (a `message`)
    of a MESSAGE, the `value` kind of a MAP."""
    out: dict[str, Any] = {"number": number, "kind": kind}
    if keep:
        out["keep"] = True
    if repeated:
        out["repeated"] = True
    if msg is not None:
        out["message"] = dict(msg)
    if value is not None:
        out["value"] = value
    return out


def inline(number: int, msg: Mapping[str, Any]) -> dict[str, Any]:
    """Field `number`, an embedded message whose fields are the holder's own properties."""
    return {"number": number, "kind": INLINE, "message": dict(msg)}


def message(name: str, fields: Mapping[str, ProtoField]) -> dict[str, Any]:
    """A named message: for `inline`, `wire(..., msg=...)` and nodes without a component name."""
    return {"name": name, "fields": dict(fields)}


# ----------------------------------------------------------------------- deriving tables
def roots(kinds: Iterable[Kind]) -> dict[tuple[str, str], Msg]:
    """(apiVersion, kind) -> the message of every kind whose schema has a protobuf form."""
    derive = _Deriver()
    return {(k.api_version, k.kind): derive.node(k.schema) for k in kinds if PROTO_KEY in k.schema}


def short_name(component: str) -> str:
    """`io.k8s.api.core.v1.PodSpec` -> `v1.PodSpec`, as protobuf errors name messages."""
    return ".".join(component.split(".")[-2:])


class _Deriver:
    def __init__(self) -> None:
        self._memo: dict[int, Msg] = {}  # id(node) -> Msg; nodes outlive one derivation

    def node(self, node: Schema) -> Msg:
        found = self._memo.get(id(node))
        if found is None:
            ann = node[PROTO_KEY]
            name = ann.get("name") or short_name(node[NAME_KEY])
            found = self._memo[id(node)] = self.message(name, ann["fields"], node)
        return found

    def message(self, name: str, fields: Mapping[str, ProtoField], node: Schema) -> Msg:
        props: Mapping[str, Schema] = node.get("properties", {})
        table: dict[int, Field] = {}
        for json_name, written in fields.items():
            spec = {"number": written} if isinstance(written, int) else written
            number = spec["number"]
            if number in table:
                raise ProtoTableError(f"{name}: field number {number} is used twice")
            table[number] = self.field(name, json_name, spec, props.get(json_name), node)
        return Msg(name, dict(sorted(table.items())))

    def field(
        self, name: str, json_name: str, spec: Mapping[str, Any], prop: Schema | None, node: Schema
    ) -> Field:
        keep = "*" if spec.get("keep") else ""
        kind = spec.get("kind")
        if kind is not None:
            sub: Msg | str | None = spec.get("value")
            if kind == INLINE:
                sub = self.message(spec["message"]["name"], spec["message"]["fields"], node)
            elif kind == MESSAGE:
                sub = self.message(spec["message"]["name"], spec["message"]["fields"], {})
            return (json_name, kind + keep, sub, bool(spec.get("repeated")))
        if prop is None:
            raise ProtoTableError(f"{name}: {json_name} is not a property; give its wire kind")
        repeated = prop.get("type") == "array"
        item = prop["items"] if repeated else prop
        kind, sub = self.kind_of(item, f"{name}.{json_name}")
        return (json_name, kind + keep, sub, repeated)

    def kind_of(self, node: Schema, where: str) -> tuple[str, Msg | str | None]:
        if node.get(NAME_KEY) == FIELDS_V1_NAME:
            return FIELDSV1, None
        if node.get("x-kubernetes-int-or-string"):
            return (QUANTITY if node.get(NAME_KEY) == QUANTITY_NAME else INTSTR), None
        kind = node.get("type")
        if kind == "object" and PROTO_KEY in node:
            return MESSAGE, self.node(node)
        if kind == "object" and isinstance(node.get("additionalProperties"), dict):
            value, sub = self.kind_of(node["additionalProperties"], where)
            if sub is None and value not in (MESSAGE, MAP):
                return MAP, value
        elif kind == "string":
            return {"byte": BYTES, "date-time": TIME}.get(node.get("format", ""), STRING), None
        elif kind == "integer":
            return (INT64 if node.get("format") == "int64" else INT32), None
        elif kind == "boolean":
            return BOOL, None
        raise ProtoTableError(f"{where}: its schema has no protobuf wire kind")
