"""Per-schema-node plans and JSON value checks for the structural-schema walk (`validation`).

`plan_of(schema_node)` returns the node's `Plan`: the facts `validation`'s walker reads from
it (type, nullable, properties, defaults, required, list type and keys, whether any string or
numeric check can fire, and the `leaves`: properties whose value is proved valid by one exact
type test and at most one cheap predicate). Plans are cached by the node's id(); a plan holds
its node, so the id cannot be reused while cached; the cache is cleared whole when it grows
past `_MAX_PLANS` nodes (custom resources' schemas come and go with their CRDs).

The value helpers answer the questions a check asks of one JSON value: its Kubernetes type
name (`json_type`), a canonical comparable form (`canon`, `unique_key` for uniqueness
checks), numbers that are not bools (`as_number`, `as_int`), bounds as Kubernetes prints them
(`fmt_bound`), and the formats (`valid_date_time`, `valid_date`, `valid_byte`, `QUANTITY`).

Pure: no I/O; never raises on any JSON value or malformed schema part; the only globals are
caches of pure results (compiled patterns, parsed timestamps, plans).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import functools
import json
import re
from collections.abc import Callable
from typing import Any

__all__ = [
    "ABSENT",
    "EMBEDDED_META",
    "INT32",
    "INT64",
    "QUANTITY",
    "Plan",
    "Schema",
    "as_int",
    "as_number",
    "canon",
    "compiled_pattern",
    "fmt_bound",
    "json_type",
    "plan_of",
    "unique_key",
    "valid_byte",
    "valid_date",
    "valid_date_time",
]

Schema = dict[str, Any]

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
EMBEDDED_META = ("apiVersion", "kind", "metadata")
_DATE_TIME = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})"
)
# apimachinery's quantity grammar (resource.ParseQuantity), as its error message states it.
QUANTITY = re.compile(
    r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?"
)
_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})")


# -- values ---------------------------------------------------------------------------------------


def json_type(v: Any) -> str:
    """The JSON type name Kubernetes prints for a value ("integer" for whole ints only)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list | tuple):
        return "array"
    return "object"


def canon(v: Any) -> str:
    """A comparable form of a JSON value (True and 1 differ, key order does not matter)."""
    try:
        return json.dumps(v, sort_keys=True, separators=(",", ":"), default=repr)
    except (TypeError, ValueError):
        return repr(v)


def unique_key(v: Any) -> Any:
    """`canon(v)` for uniqueness checks, cheaper for the usual strings and integers: a str or
    a (non-bool) int is equal in canonical JSON exactly to the same str or int, so it is keyed by
    its type and value; anything else by `canon` (a str key never meets a tuple key)."""
    t = type(v)
    if t is str or t is int:
        return (t is str, v)
    return canon(v)


ABSENT = ("absent",)  # the single-key `seen` entry of an item without the key


def as_number(x: Any) -> float | int | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return x


def as_int(x: Any) -> int | None:
    if isinstance(x, bool) or not isinstance(x, int):
        return None
    return x


def fmt_bound(x: float | int) -> str:
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        return str(int(x))
    return str(x)


@functools.lru_cache(maxsize=512)
def compiled_pattern(p: str) -> re.Pattern[str] | None:
    try:
        return re.compile(p)
    except (re.error, RecursionError, OverflowError):
        return None


@functools.lru_cache(maxsize=4096)  # pure; timestamps repeat (one per second, many objects)
def valid_date_time(s: str) -> bool:
    m = _DATE_TIME.fullmatch(s)
    if m is None:
        return False
    try:
        dt.datetime(int(m[1]), int(m[2]), int(m[3]), int(m[4]), int(m[5]), min(int(m[6]), 59))
    except ValueError:
        return False
    return int(m[6]) <= 60


def valid_date(s: str) -> bool:
    m = _DATE.fullmatch(s)
    if m is None:
        return False
    try:
        dt.date(int(m[1]), int(m[2]), int(m[3]))
    except ValueError:
        return False
    return True


def valid_byte(s: str) -> bool:
    try:
        base64.b64decode(s.encode("ascii"), validate=True)
    except (binascii.Error, ValueError, UnicodeEncodeError):
        return False
    return True


# -- per-schema-node facts ------------------------------------------------------------------------


class Plan:
    """What `walk` reads from one schema node, looked up once per node instead of once per
    value: most nodes have no bounds, pattern, format or enum, and most properties no
    default, so the checks that cannot fire are skipped without a dictionary lookup each."""

    __slots__ = (
        "addl",
        "defaults",
        "embedded",
        "enum",
        "int_or_string",
        "items",
        "leaves",
        "map_keys",
        "max_items",
        "min_items",
        "nullable",
        "numeric_checks",
        "preserve",
        "props",
        "required",
        "schema",
        "string_checks",
        "type",
        "unique",
    )  # fmt: skip

    def __init__(self, s: Schema) -> None:
        self.schema = s  # held, so the id() keying the cache is not reused while cached
        self.type = s.get("type")
        self.nullable = s.get("nullable") is True
        self.preserve = s.get("x-kubernetes-preserve-unknown-fields") is True
        self.int_or_string = s.get("x-kubernetes-int-or-string") is True
        self.string_checks = any(k in s for k in ("maxLength", "minLength", "pattern", "format"))
        self.numeric_checks = any(
            k in s
            for k in (
                "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
                "format",
            )
        )  # fmt: skip
        enum = s.get("enum")
        self.enum = isinstance(enum, list) and bool(enum)
        props = s.get("properties")
        self.props: dict[str, Any] = props if isinstance(props, dict) else {}
        self.addl = s.get("additionalProperties")
        self.embedded = s.get("x-kubernetes-embedded-resource") is True
        self.defaults = [
            (k, ps) for k, ps in self.props.items() if isinstance(ps, dict) and "default" in ps
        ]
        required = s.get("required")
        self.required = (
            [r for r in required if isinstance(r, str)] if isinstance(required, list) else []
        )
        # An array's: its items' schema, bounds, and whether items are unique (a set) or keyed
        # (a map: its keys).
        self.items = s.get("items")
        self.min_items, self.max_items = as_int(s.get("minItems")), as_int(s.get("maxItems"))
        list_type = s.get("x-kubernetes-list-type")
        self.unique = list_type == "set" or s.get("uniqueItems") is True
        keys = s.get("x-kubernetes-list-map-keys")
        self.map_keys: list[Any] | None = (
            keys if list_type == "map" and isinstance(keys, list) and keys else None
        )
        # Properties whose value is valid as it is when of this exact type (and, for some, passes
        # one cheap test): a string, boolean or integer with no other check that could fire, or
        # a string whose only check is an enum or the date-time format. Most of an object's
        # leaves; kept without a walk. A value that fails goes the long way, for the error.
        self.leaves: dict[str, tuple[type, Callable[[Any], bool] | None]] = {}
        for k, ps in self.props.items():
            t = ps.get("type") if isinstance(ps, dict) else None
            if isinstance(t, str) and t in _LEAF_TYPES and not ps.get("nullable"):
                leaf = _leaf_test(ps)
                if leaf is not None:
                    self.leaves[k] = leaf


_LEAF_TYPES: dict[str, type] = {"string": str, "boolean": bool, "integer": int}


def _leaf_test(s: Schema) -> tuple[type, Callable[[Any], bool] | None] | None:
    """(exact type, test or None) that proves a value of the leaf schema `s` valid, if any."""
    p = Plan(s)
    if p.int_or_string or p.preserve or (p.numeric_checks and p.type != "string"):
        return None
    if p.string_checks:
        if p.enum or set(s) & {"maxLength", "minLength", "pattern"} or s["format"] != "date-time":
            return None
        return str, valid_date_time
    if p.enum:
        enum = s["enum"]
        if p.type != "string" or not all(type(e) is str for e in enum):
            return None
        return str, frozenset(enum).__contains__
    return _LEAF_TYPES[s["type"]], None


_PLANS: dict[int, Plan] = {}
_MAX_PLANS = 50_000  # schema nodes; custom resources' schemas come and go with their CRDs


def plan_of(s: Schema) -> Plan:
    p = _PLANS.get(id(s))
    if p is None or p.schema is not s:
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        p = _PLANS[id(s)] = Plan(s)
    return p
