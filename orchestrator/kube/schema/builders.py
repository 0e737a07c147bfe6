"""Constructors for structural OpenAPI v3 schema nodes (the dialect of a CRD's openAPIV3Schema).

Every built-in kind's schema is written with these functions, so the node shapes stay uniform for
the code that walks them: the validation/defaulting/pruning engine, the OpenAPI generator, the
strategic merge patch (which reads `x-kubernetes-patch-strategy` / `x-kubernetes-patch-merge-key`)
and server-side apply (which reads `x-kubernetes-list-type` / `x-kubernetes-list-map-keys` /
`x-kubernetes-map-type`).

Invariants:
* A node only ever holds the keys in `NODE_KEYS`; `None` arguments add nothing.
* Named structs carry `x-orchestrator-name` (the OpenAPI component name). Two nodes with the same
  name are identical except for their own top-level `description`, which describes the field that
  holds the struct (the generator emits it beside the `$ref`). `with_description` makes such a copy.
* Schemas are trees, never recursive; open-ended parts are `preserve_unknown` objects.
* Nodes are plain dicts shared between kinds: nothing may mutate them after construction.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Schema = dict[str, Any]

NAME_KEY = "x-orchestrator-name"
PROTO_KEY = "x-orchestrator-proto"  # protobuf field numbers: see `schema.proto`
QUANTITY_NAME = "io.k8s.apimachinery.pkg.api.resource.Quantity"

NODE_KEYS = frozenset(
    {
        "type",
        "properties",
        "required",
        "items",
        "additionalProperties",
        "description",
        "default",
        "enum",
        "format",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "pattern",
        "minItems",
        "maxItems",
        "nullable",
        "x-kubernetes-int-or-string",
        "x-kubernetes-preserve-unknown-fields",
        "x-kubernetes-embedded-resource",
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
        "x-kubernetes-map-type",
        "x-kubernetes-patch-strategy",
        "x-kubernetes-patch-merge-key",
        NAME_KEY,
        PROTO_KEY,
    }
)
TYPES = frozenset({"object", "array", "string", "integer", "number", "boolean"})
PATCH_STRATEGIES = frozenset({"merge", "retainKeys", "merge,retainKeys"})
LIST_TYPES = frozenset({"atomic", "set", "map"})
MAP_TYPES = frozenset({"atomic", "granular"})


def _put(node: Schema, **fields: Any) -> Schema:
    """Add the fields that are not None, translating python names to schema keys."""
    keys = {
        "min_length": "minLength",
        "max_length": "maxLength",
        "min_items": "minItems",
        "max_items": "maxItems",
        "fmt": "format",
        "patch_strategy": "x-kubernetes-patch-strategy",
        "merge_key": "x-kubernetes-patch-merge-key",
        "list_type": "x-kubernetes-list-type",
        "map_keys": "x-kubernetes-list-map-keys",
        "map_type": "x-kubernetes-map-type",
        "name": NAME_KEY,
    }
    for key, value in fields.items():
        if value is None:
            continue
        if isinstance(value, tuple):
            value = list(value)
        node[keys.get(key, key)] = value
    return node


def obj(
    description: str,
    props: Mapping[str, Schema],
    required: Sequence[str] = (),
    name: str | None = None,
    *,
    patch_strategy: str | None = None,
    map_type: str | None = None,
    proto: Mapping[str, Any] | None = None,
) -> Schema:
    """A struct: an object with known `properties` (unknown fields are rejected or pruned).
    `proto` gives its protobuf field numbers by property name (see `schema.proto`)."""
    node: Schema = {"type": "object", "description": description, "properties": dict(props)}
    if required:
        node["required"] = list(required)
    if proto is not None:
        node[PROTO_KEY] = {"fields": dict(proto)}
    return _put(node, name=name, patch_strategy=patch_strategy, map_type=map_type)


def string(
    desc: str,
    enum: Sequence[str] | None = None,
    pattern: str | None = None,
    default: str | None = None,
    fmt: str | None = None,
    *,
    min_length: int | None = None,
    max_length: int | None = None,
) -> Schema:
    return _put(
        {"type": "string", "description": desc},
        enum=enum,
        pattern=pattern,
        default=default,
        fmt=fmt,
        min_length=min_length,
        max_length=max_length,
    )


def integer(
    desc: str,
    fmt: str = "int32",
    minimum: int | None = None,
    default: int | None = None,
    *,
    maximum: int | None = None,
) -> Schema:
    return _put(
        {"type": "integer", "format": fmt, "description": desc},
        minimum=minimum,
        maximum=maximum,
        default=default,
    )


def number(desc: str, fmt: str = "double", minimum: float | None = None) -> Schema:
    return _put({"type": "number", "format": fmt, "description": desc}, minimum=minimum)


def boolean(desc: str, default: bool | None = None) -> Schema:
    return _put({"type": "boolean", "description": desc}, default=default)


def array(
    items: Schema,
    desc: str,
    patch_strategy: str | None = None,
    merge_key: str | None = None,
    list_type: str | None = None,
    map_keys: Sequence[str] | None = None,
    *,
    min_items: int | None = None,
    max_items: int | None = None,
) -> Schema:
    """A list. Strategic merge reads patch_strategy/merge_key; server-side apply list_type/keys."""
    return _put(
        {"type": "array", "description": desc, "items": items},
        patch_strategy=patch_strategy,
        merge_key=merge_key,
        list_type=list_type,
        map_keys=map_keys,
        min_items=min_items,
        max_items=max_items,
    )


def strings(desc: str, *, list_type: str | None = "atomic") -> Schema:
    """A list of plain strings, replaced wholesale by patches (`command`, `args`)."""
    return array({"type": "string"}, desc, list_type=list_type)


def string_map(desc: str, *, map_type: str | None = None) -> Schema:
    return _put(
        {"type": "object", "description": desc, "additionalProperties": {"type": "string"}},
        map_type=map_type,
    )


def map_of(values: Schema, desc: str) -> Schema:
    return {"type": "object", "description": desc, "additionalProperties": values}


def int_or_string(desc: str) -> Schema:
    """IntOrString: `8080` or `"http"`, `1` or `"25%"` (no `type`: structural schemas forbid it)."""
    return {"x-kubernetes-int-or-string": True, "description": desc}


_QUANTITY_DESC = (
    "A resource amount: a number with an optional SI or binary suffix, e.g. `1`, `250m`, `128Mi`."
)


def quantity(desc: str = _QUANTITY_DESC) -> Schema:
    return {"x-kubernetes-int-or-string": True, NAME_KEY: QUANTITY_NAME, "description": desc}


def quantity_map(desc: str) -> Schema:
    return map_of(quantity(), desc)


def timestamp(desc: str) -> Schema:
    """An RFC 3339 time in seconds ("2025-01-01T00:00:00Z")."""
    return {"type": "string", "format": "date-time", "description": desc}


def micro_timestamp(desc: str) -> Schema:
    """An RFC 3339 time with microseconds ("2025-01-01T00:00:00.000000Z")."""
    return {"type": "string", "format": "date-time", "description": desc}


def preserve_unknown(
    desc: str, name: str | None = None, *, proto: Mapping[str, Any] | None = None
) -> Schema:
    """An object whose contents are kept as written, neither validated nor pruned. `proto` is
    its protobuf message (`schema.proto.message`), for the codec only."""
    node = _put(
        {"type": "object", "description": desc, "x-kubernetes-preserve-unknown-fields": True},
        name=name,
    )
    if proto is not None:
        node[PROTO_KEY] = dict(proto)
    return node


def embedded_resource(desc: str) -> Schema:
    """A whole object (apiVersion, kind, metadata, ...) kept as written."""
    return {
        "type": "object",
        "description": desc,
        "x-kubernetes-embedded-resource": True,
        "x-kubernetes-preserve-unknown-fields": True,
    }


def with_description(node: Schema, desc: str) -> Schema:
    """The same node, described for the field that holds it (a shallow copy)."""
    return {**node, "description": desc}


def props(**fields: Schema) -> dict[str, Schema]:
    """`obj(..., props(name=string("..."), ...))`: property maps with python keyword syntax."""
    return dict(fields)


def walk(node: Schema, path: str = "") -> Iterable[tuple[str, Schema]]:
    """Every node of a schema with its dotted path (`[]` for list items, `{}` for map values)."""
    yield path, node
    for key, child in node.get("properties", {}).items():
        yield from walk(child, f"{path}.{key}" if path else key)
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{}}")
