"""Structural-schema validation, pruning and defaulting: one engine for built-in and custom kinds.

Theory of operation. `validate(schema, obj)` walks the object and its schema together, once,
building a NEW object (the input is never touched):

* prune: a field that its object's schema does not know is left out of the copy and its dotted
  path (`spec.template.spec.containers[0].imagePullPolicyy`) recorded in `unknown`, unless the
  node says `x-kubernetes-preserve-unknown-fields` (or has a schema for `additionalProperties`),
  or it is `apiVersion`/`kind`/`metadata` of an `x-kubernetes-embedded-resource`. The caller
  decides what unknown fields mean: `strict_error(unknown)` for `fieldValidation=Strict`,
  `unknown_warnings(unknown)` otherwise.
* null: a `null` for a field that is not `nullable` counts as absent (apiextensions prunes such
  nulls before defaulting), so it can then be defaulted or be reported `Required value`.
* default: after pruning an object, every absent property whose schema has `default` gets a copy
  of it, walked like sent data (so defaults nest, and apply inside array items and map values).
* validate: type, required (checked after defaulting), enum, bounds, lengths, pattern, the formats
  int32/int64/date-time/date/byte, list sizes, `uniqueItems` and `x-kubernetes-list-type` set
  duplicates and map-key duplicates. Messages are worded as the Kubernetes API server words them,
  as `Cause(field, message)` pairs for `errors.invalid`.

The copy shares one part with its input: the root's `metadata.managedFields` when it is the
stored object's list (`old`'s, by identity: an update that left it alone). Every write replaces
that list with one it computes (`track_update`, server-side apply) and nothing modifies it, so
copying it, the biggest part of most objects' metadata, would be wasted work. Likewise the
top-level fields the caller names in `keep` (a status write: the stored spec).

Speed: each schema node's facts are read once (`nodeplan.Plan`); a property whose schema is a plain
leaf (a string, boolean or integer with no check, or only an enum of strings or the date-time
format) is kept after one type test instead of a walk, and only a value that fails it takes
the walk, which words the error; the spec walk of a new object is remembered by its msgpack
bytes (`_Walker._spec`).

Invariants: never raises on any JSON value (malformed schema parts are ignored, not trusted);
deterministic (causes and unknown paths in document order); pure (no I/O; the only globals are
caches of pure results: compiled patterns, schema plans, remembered spec walks).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import msgpack

from orchestrator.kube.errors import ApiError, Cause, bad_request
from orchestrator.kube.jsonvalue import copy_json
from orchestrator.kube.schema.builders import NAME_KEY, QUANTITY_NAME
from orchestrator.kube.schema.names import quote
from orchestrator.kube.schema.nodeplan import (
    ABSENT,
    EMBEDDED_META,
    INT32,
    INT64,
    QUANTITY,
    Plan,
    Schema,
    as_int,
    as_number,
    canon,
    compiled_pattern,
    fmt_bound,
    json_type,
    plan_of,
    unique_key,
    valid_byte,
    valid_date,
    valid_date_time,
)


@dataclass(slots=True)
class Validated:
    """The outcome of `validate`: the pruned+defaulted copy, field errors, unknown field paths."""

    obj: Any
    causes: list[Cause] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.causes


def validate(
    schema: Schema, obj: Any, *, strict: bool, old: Any = None, keep: Collection[str] = ()
) -> Validated:
    """Prune, default and validate `obj` against `schema`; see the module docstring.

    `strict` only records the caller's intent (fieldValidation=Strict): both modes prune unknown
    fields from `obj` and list them in `unknown`; strict callers answer `strict_error(unknown)`.

    `old`: the stored object an update replaces, itself an earlier output of `validate` with
    this same schema. A part of `obj` that IS (identity, not equality: `True == 1`) the same
    part of `old` is already pruned, defaulted and valid, so it is copied without a walk —
    a status update shares the whole spec with the stored object. Callers pass `old` only
    when the schema cannot have changed since `old` was stored (built-in kinds).

    `keep`: top-level fields that, when they are `old`'s, go into the result as they are
    instead of copied: the caller will not modify them (nor let anyone) — as a status write
    keeps the stored spec.
    """
    walker = _Walker(keep)
    try:
        out = walker.walk(schema, obj, "", old)
    except RecursionError:
        return Validated(obj, [Cause("", 'Invalid value: "object": nested too deeply')], [])
    return Validated(out, walker.causes, walker.unknown)


def strict_error(unknown: list[str]) -> ApiError:
    """400 `strict decoding error: unknown field "spec.foo", unknown field "spec.bar"`."""
    listed = ", ".join(f'unknown field "{p}"' for p in unknown)
    return bad_request(f"strict decoding error: {listed}")


def unknown_warnings(unknown: list[str]) -> list[str]:
    """Warning texts (`Warning: 299 - "..."`) for fieldValidation=Warn (kubectl's default)."""
    return [f'unknown field "{p}"' for p in unknown]


# -- paths ----------------------------------------------------------------------------------------


def _child(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _index(path: str, i: int) -> str:
    return f"{path}[{i}]"


def _key(path: str, key: str) -> str:
    return f"{path}[{key}]"


# -- the walk -------------------------------------------------------------------------------------

SPEC_MEMO_SIZE = 256  # specs of new objects whose walk is remembered (`_Walker._spec`)
_SPECS: dict[tuple[int, bytes], tuple[Any, Any, list[Cause], list[str]]] = {}


class _Walker:
    def __init__(self, keep: Collection[str] = ()) -> None:
        self.causes: list[Cause] = []
        self.unknown: list[str] = []
        self.keep = keep

    def _invalid(self, path: str, value: Any, msg: str) -> None:
        self.causes.append(Cause(path, f"Invalid value: {quote(value)}: {msg}"))

    def _type_error(self, path: str, value: Any, expected: str) -> None:
        actual = json_type(value)
        where = f"{path} in body" if path else "body"
        self.causes.append(
            Cause(
                path,
                f'Invalid value: "{actual}": {where} must be of type {expected}: "{actual}"',
                "FieldValueTypeInvalid",
            )
        )

    def walk(self, s: Any, v: Any, path: str, o: Any = None) -> Any:
        if not isinstance(s, dict) or (o is v and o is not None):
            return copy_json(v)
        p = plan_of(s)
        if v is None and p.nullable:
            return None
        if p.int_or_string:
            return self._int_or_string(s, v, path)
        t = p.type
        if t == "object" or (t is None and isinstance(v, dict) and _is_object_schema(s)):
            if not isinstance(v, dict):
                self._type_error(path, v, "object")
                return copy_json(v)
            out: Any = self._object(p, v, path, o if type(o) is dict else None)
        elif t == "array" or (t is None and isinstance(v, list) and "items" in s):
            if not isinstance(v, list):
                self._type_error(path, v, "array")
                return copy_json(v)
            out = self._array(p, v, path, o if type(o) is list else None)
        elif t == "string":
            if not isinstance(v, str):
                self._type_error(path, v, "string")
                return copy_json(v)
            if p.string_checks:
                self._string(s, v, path)
            if p.enum:
                self._enum(s, v, path)
            return v
        elif t == "integer":
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            if as_int(v) is None:
                self._type_error(path, v, "integer")
                return copy_json(v)
            if p.numeric_checks:
                self._numeric(s, v, path)
            out = v
        elif t == "number":
            if as_number(v) is None:
                self._type_error(path, v, "number")
                return copy_json(v)
            if p.numeric_checks or v != v:  # NaN is refused whatever the bounds
                self._numeric(s, v, path)
            out = v
        elif t == "boolean":
            if not isinstance(v, bool):
                self._type_error(path, v, "boolean")
                return copy_json(v)
            out = v
        else:
            # No (known) type: anything goes (preserve-unknown-fields or a lenient schema).
            out = copy_json(v)
        if p.enum:
            self._enum(s, out, path)
        return out

    def _spec(self, s: Any, v: dict[str, Any]) -> Any:
        """`walk(s, v, "spec")` of a new object's spec, memoized: the objects a controller
        creates from one template have equal specs. The walk depends only on the schema and the
        value; equal msgpack bytes (`strict_types`: exact JSON types, no tuples or subclasses)
        mean an equal value. The caller gets a copy of its own (admission defaults it)."""
        try:
            text = msgpack.packb(v, strict_types=True)
        except (TypeError, ValueError, OverflowError, RecursionError):
            return self.walk(s, v, "spec")
        ident = (id(s), text)
        hit = _SPECS.get(ident)
        if hit is not None and hit[0] is s:
            self.causes.extend(hit[2])
            self.unknown.extend(hit[3])
            return copy_json(hit[1])
        causes, unknown = len(self.causes), len(self.unknown)
        out = self.walk(s, v, "spec")
        if len(_SPECS) >= SPEC_MEMO_SIZE:
            del _SPECS[next(iter(_SPECS))]
        # Keeps `s` alive, so its id stays its own while the entry exists.
        _SPECS[ident] = (s, copy_json(out), self.causes[causes:], self.unknown[unknown:])
        return out

    def _int_or_string(self, s: Schema, v: Any, path: str) -> Any:
        if s.get(NAME_KEY) == QUANTITY_NAME:
            return self._quantity(v, path)
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, str):
            self._string(s, v, path)
        elif as_int(v) is not None:
            self._numeric(s, v, path)
        else:
            self._type_error(path, v, "integer,string")
            return copy_json(v)
        self._enum(s, v, path)
        return v

    def _quantity(self, v: Any, path: str) -> Any:
        """A resource quantity ("500m", "128Mi", "1e3", 2, 0.5), stored as a string like the
        apiserver's canonical form; numbers are accepted as manifests write them."""
        if isinstance(v, bool) or not isinstance(v, int | float | str):
            self._type_error(path, v, "string")
            return copy_json(v)
        if isinstance(v, float):
            if not math.isfinite(v):
                self._type_error(path, v, "string")
                return v
            v = str(int(v)) if v.is_integer() else f"{round(v * 1000)}m"
        elif isinstance(v, int):
            v = str(v)
        if len(v) > 64 or not QUANTITY.fullmatch(v):
            self.causes.append(
                Cause(
                    path,
                    f'Invalid value: "{v}": quantities must match the regular expression '
                    "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
                )
            )
        return v

    def _object(
        self, p: Plan, v: dict[str, Any], path: str, o: dict[str, Any] | None
    ) -> dict[str, Any]:
        props, addl, embedded, preserve, leaves = p.props, p.addl, p.embedded, p.preserve, p.leaves
        out: dict[str, Any] = {}
        for k, val in v.items():
            if not isinstance(k, str):
                continue
            ps = props.get(k)
            if ps is not None:
                leaf = leaves.get(k)
                if leaf is not None and type(val) is leaf[0] and (leaf[1] is None or leaf[1](val)):
                    out[k] = val
                    continue
                if val is None and not (isinstance(ps, dict) and ps.get("nullable") is True):
                    continue  # a null is an absent field
                ov = o.get(k) if o else None
                if (
                    ov is val
                    and ov is not None
                    and (
                        (k == "managedFields" and path == "metadata")
                        or (not path and k in self.keep)
                    )
                ):
                    out[k] = val  # the stored value, shared (see the module doc)
                    continue
                if k == "spec" and not path and ov is None and type(val) is dict:
                    out[k] = self._spec(ps, val)
                    continue
                out[k] = self.walk(ps, val, _child(path, k), ov)
            elif isinstance(addl, dict):
                if val is None and addl.get("nullable") is not True:
                    continue
                out[k] = self.walk(addl, val, _key(path, k), o.get(k) if o else None)
            elif addl is True or preserve:
                out[k] = copy_json(val)
            elif (embedded or path == "") and k in EMBEDDED_META:
                # The root's apiVersion/kind/metadata are the caller's (meta checks), an embedded
                # resource's are kept as sent.
                out[k] = copy_json(val)
            else:
                self.unknown.append(_child(path, k))
        for k, ps in p.defaults:
            if k not in out:
                default = ps["default"]
                if default is None and ps.get("nullable") is not True:
                    continue
                out[k] = self.walk(ps, copy_json(default), _child(path, k))
        for r in p.required:
            if r not in out:
                self.causes.append(Cause(_child(path, r), "Required value", "FieldValueRequired"))
        return out

    def _array(self, p: Plan, v: list[Any], path: str, o: list[Any] | None) -> list[Any]:
        items = p.items
        stored = o or []
        n = len(stored)
        ip = plan_of(items) if isinstance(items, dict) else None
        if ip is not None and ip.type == "object" and not ip.int_or_string and not ip.enum:
            # Items of an object schema (conditions, containers...): what `walk` does for a
            # dict item that is not the stored one, without its dispatch per item.
            out = []
            for i, x in enumerate(v):
                ox = stored[i] if i < n else None
                if type(x) is dict and ox is not x:
                    out.append(
                        self._object(ip, x, f"{path}[{i}]", ox if type(ox) is dict else None)
                    )
                else:
                    out.append(self.walk(items, x, _index(path, i), ox))
        else:
            out = [
                self.walk(items, x, _index(path, i), stored[i] if i < n else None)
                for i, x in enumerate(v)
            ]
        lo, hi = p.min_items, p.max_items
        if lo is not None and len(out) < lo:
            where = f"{path} in body" if path else "body"
            self._invalid(path, len(out), f"{where} should have at least {lo} items")
        if hi is not None and len(out) > hi:
            self.causes.append(
                Cause(
                    path, f"Too many: {len(out)}: must have at most {hi} items", "FieldValueTooMany"
                )
            )
        if p.unique:
            seen: set[Any] = set()
            for i, x in enumerate(out):
                c = unique_key(x)
                if c in seen:
                    self.causes.append(
                        Cause(
                            _index(path, i), f"Duplicate value: {quote(x)}", "FieldValueDuplicate"
                        )
                    )
                seen.add(c)
        elif p.map_keys is not None:
            keys = p.map_keys
            seen = set()
            one = keys[0] if len(keys) == 1 and isinstance(keys[0], str) else None
            for i, x in enumerate(out):
                if not isinstance(x, dict):
                    continue
                if one is not None:  # the usual single key: no dict, sort or tuple
                    c = unique_key(x[one]) if one in x else ABSENT
                else:
                    c = tuple(
                        sorted((k, unique_key(x[k])) for k in keys if isinstance(k, str) and k in x)
                    )
                if c in seen:
                    key_map = {k: x[k] for k in keys if isinstance(k, str) and k in x}
                    self.causes.append(
                        Cause(
                            _index(path, i),
                            f"Duplicate value: {quote(key_map)}",
                            "FieldValueDuplicate",
                        )
                    )
                seen.add(c)
        return out

    def _string(self, s: Schema, v: str, path: str) -> None:
        where = f"{path} in body" if path else "body"
        hi, lo = as_int(s.get("maxLength")), as_int(s.get("minLength"))
        if hi is not None and len(v) > hi:
            unit = "byte" if hi == 1 else "bytes"
            self.causes.append(
                Cause(path, f"Too long: may not be more than {hi} {unit}", "FieldValueTooLong")
            )
        if lo is not None and len(v) < lo:
            self._invalid(path, v, f"{where} should be at least {lo} chars long")
        pattern = s.get("pattern")
        if isinstance(pattern, str):
            rx = compiled_pattern(pattern)
            if rx is not None and rx.search(v) is None:
                self._invalid(path, v, f"{where} should match '{pattern}'")
        fmt = s.get("format")
        bad = (
            (fmt == "date-time" and not valid_date_time(v))
            or (fmt == "date" and not valid_date(v))
            or (fmt == "byte" and not valid_byte(v))
        )
        if bad:
            self._invalid(path, v, f"{where} must be of type {fmt}: {quote(v)}")

    def _numeric(self, s: Schema, v: int | float, path: str) -> None:
        if isinstance(v, float) and math.isnan(v):  # math.isnan(int) overflows past 1e308
            self._invalid(path, v, "must be a number")
            return
        lo, hi = as_number(s.get("minimum")), as_number(s.get("maximum"))
        ex_lo, ex_hi = s.get("exclusiveMinimum"), s.get("exclusiveMaximum")
        if as_number(ex_lo) is not None:  # OpenAPI 3.1 style: the bound itself
            lo, ex_lo = ex_lo, True
        if as_number(ex_hi) is not None:
            hi, ex_hi = ex_hi, True
        if lo is not None:
            if ex_lo is True and not v > lo:
                self._invalid(path, v, f"must be greater than {fmt_bound(lo)}")
            elif ex_lo is not True and not v >= lo:
                self._invalid(path, v, f"must be greater than or equal to {fmt_bound(lo)}")
        if hi is not None:
            if ex_hi is True and not v < hi:
                self._invalid(path, v, f"must be less than {fmt_bound(hi)}")
            elif ex_hi is not True and not v <= hi:
                self._invalid(path, v, f"must be less than or equal to {fmt_bound(hi)}")
        multiple = as_number(s.get("multipleOf"))
        if multiple and isinstance(v, int) and isinstance(multiple, int) and v % multiple:
            self._invalid(path, v, f"must be a multiple of {multiple}")
        fmt = s.get("format")
        if isinstance(v, int) and fmt in ("int32", "int64"):
            bounds = INT32 if fmt == "int32" else INT64
            if not bounds[0] <= v <= bounds[1]:
                where = f"{path} in body" if path else "body"
                self._invalid(path, v, f'{where} must be of type {fmt}: "{v}"')

    def _enum(self, s: Schema, v: Any, path: str) -> None:
        enum = s.get("enum")
        if not isinstance(enum, list) or not enum:
            return
        if type(v) is str:  # a string equals (canonically) exactly the same string
            if v in enum:
                return
        else:
            c = canon(v)
            if any(canon(e) == c for e in enum):
                return
        supported = ", ".join(quote(e) for e in enum)
        self.causes.append(
            Cause(
                path,
                f"Unsupported value: {quote(v)}: supported values: {supported}",
                "FieldValueNotSupported",
            )
        )


def _is_object_schema(s: Schema) -> bool:
    return "properties" in s or "additionalProperties" in s
