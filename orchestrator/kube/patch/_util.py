"""Helpers every patch module shares: strict JSON equality, canonical encodings, deep copies and
reading the `x-kubernetes-*` extensions of a structural schema.

JSON values here are what `json.loads` produces: dict, list, str, int, float, bool, None.
Equality is JSON equality, not Python's: `True != 1`, `1 != 1.0`, `{"a": 1} == {"a": 1}`
whatever the key order.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, TypeGuard

from orchestrator.kube.jsonvalue import copy_json

__all__ = ["copy_json"]

Schema = Mapping[str, Any] | None


def json_equal(a: Any, b: Any) -> bool:
    """JSON equality: bools are not numbers, ints are not floats, dict order does not matter."""
    if a is b:  # a subtree shared with the stored object (and a NaN is the same NaN)
        return True
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, dict):
        if not isinstance(b, dict) or len(a) != len(b):
            return False
        return all(k in b and json_equal(v, b[k]) for k, v in a.items())
    if isinstance(a, list):
        if not isinstance(b, list) or len(a) != len(b):
            return False
        return all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is not type(b):
        return False
    return bool(a == b)


# One encoder for every call: `json.dumps` with options builds a new one each time, which costs
# as much as encoding the small values (list keys, set items) this mostly sees.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical(value: Any) -> str:
    """Compact JSON with sorted keys: a hashable identity for a JSON value."""
    return _CANONICAL.encode(value)


def short(value: Any, limit: int = 120) -> str:
    """A JSON rendering of `value` short enough for an error message."""
    try:
        text = canonical(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- schema navigation ---------------------------------------------------------------------


def _is_mapping(value: Any) -> TypeGuard[Mapping[str, Any]]:
    # Schemas are plain dicts almost always: skip the (slow) ABC check for them.
    return type(value) is dict or isinstance(value, Mapping)


def _as_schema(value: Any) -> Schema:
    return value if _is_mapping(value) else None


def child_schema(schema: Schema, key: str) -> Schema:
    """The schema of map entry `key`: a declared property, else the map's value schema."""
    if schema is None:
        return None
    props = schema.get("properties")
    if _is_mapping(props) and key in props:
        return _as_schema(props[key])
    return _as_schema(schema.get("additionalProperties"))


def is_declared_field(schema: Schema, key: str) -> bool:
    """Whether `key` is a declared property (a struct field) rather than a map entry."""
    if schema is None:
        return False
    props = schema.get("properties")
    return _is_mapping(props) and key in props


def item_schema(schema: Schema) -> Schema:
    return None if schema is None else _as_schema(schema.get("items"))


def patch_strategies(schema: Schema) -> frozenset[str]:
    """The comma-separated `x-kubernetes-patch-strategy` as a set ("merge", "retainKeys", ...)."""
    if schema is None:
        return frozenset()
    raw = schema.get("x-kubernetes-patch-strategy")
    if not isinstance(raw, str):
        return frozenset()
    return frozenset(part.strip() for part in raw.split(",") if part.strip())


def patch_merge_key(schema: Schema) -> str | None:
    if schema is None:
        return None
    key = schema.get("x-kubernetes-patch-merge-key")
    return key if isinstance(key, str) and key else None


def list_type(schema: Schema) -> str:
    """`atomic`, `set` or `map` (the default, and unknown values, are `atomic`)."""
    if schema is None:
        return "atomic"
    kind = schema.get("x-kubernetes-list-type")
    return kind if kind in ("set", "map") else "atomic"


def list_map_keys(schema: Schema) -> list[str]:
    if schema is None:
        return []
    keys = schema.get("x-kubernetes-list-map-keys")
    if isinstance(keys, list) and keys and all(isinstance(k, str) for k in keys):
        return list(keys)
    return []


def is_atomic_map(schema: Schema) -> bool:
    return schema is not None and schema.get("x-kubernetes-map-type") == "atomic"
