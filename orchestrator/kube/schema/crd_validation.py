"""CustomResourceDefinition validation: `validate_crd(crd)` checks an apiextensions.k8s.io/v1 CRD
the way the API server does (names, group, scope, versions, structural schemas, scale paths,
printer columns) and returns `Cause`s worded like Kubernetes (`spec.versions[0].schema.
openAPIV3Schema.properties[spec].type: Required value: must not be empty for specified object
fields`).

Invariants: pure; never mutates its input; never raises on malformed input (every problem is a
Cause). `crd.kinds_from_crd` relies on nothing a CRD that passes here does not guarantee.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from orchestrator.kube.errors import Cause
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema import jsonpath
from orchestrator.kube.schema.names import (
    is_dns1035_label,
    is_dns1123_label,
    is_dns1123_subdomain,
    quote,
)
from orchestrator.kube.schema.validation import validate

SCOPES = ("Cluster", "Namespaced")
TYPES = ("array", "boolean", "integer", "number", "object", "string")
COLUMN_TYPES = ("boolean", "date", "integer", "number", "string")
LIST_TYPES = ("atomic", "map", "set")
MAP_TYPES = ("atomic", "granular")
_FORBIDDEN_KEYS = (
    "$ref",
    "$schema",
    "id",
    "definitions",
    "dependencies",
    "patternProperties",
    "additionalItems",
)


def _invalid(path: str, value: Any, msg: str) -> Cause:
    return Cause(path, f"Invalid value: {quote(value)}: {msg}")


def _required(path: str, msg: str = "") -> Cause:
    return Cause(path, f"Required value: {msg}" if msg else "Required value", "FieldValueRequired")


def _forbidden(path: str, msg: str) -> Cause:
    return Cause(path, f"Forbidden: {msg}", "FieldValueForbidden")


def _unsupported(path: str, value: Any, supported: tuple[str, ...]) -> Cause:
    listed = ", ".join(quote(s) for s in supported)
    return Cause(
        path,
        f"Unsupported value: {quote(value)}: supported values: {listed}",
        "FieldValueNotSupported",
    )


def _dict(v: Any) -> Obj:
    return v if isinstance(v, dict) else {}


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


# -- validation -----------------------------------------------------------------------------------


def validate_crd(crd: Any) -> list[Cause]:
    """Everything wrong with a CRD, in the order Kubernetes reports it (empty = valid)."""
    if not isinstance(crd, dict):
        return [_invalid("", crd, "must be an object")]
    causes: list[Cause] = []
    spec = _dict(crd.get("spec"))
    names = _dict(spec.get("names"))
    group = spec.get("group")
    plural = names.get("plural")
    name = _dict(crd.get("metadata")).get("name")
    if isinstance(plural, str) and isinstance(group, str) and name != f"{plural}.{group}":
        causes.append(_invalid("metadata.name", name, 'must be spec.names.plural+"."+spec.group'))

    if not isinstance(group, str) or not group:
        causes.append(_required("spec.group"))
    else:
        causes.extend(_invalid("spec.group", group, m) for m in is_dns1123_subdomain(group))
        if "." not in group:
            causes.append(_invalid("spec.group", group, "should be a domain with at least one dot"))

    causes.extend(_validate_names(names))

    scope = spec.get("scope")
    if scope in (None, ""):
        causes.append(_required("spec.scope"))
    elif scope not in SCOPES:
        causes.append(_unsupported("spec.scope", scope, SCOPES))

    versions = spec.get("versions")
    if not isinstance(versions, list) or not versions:
        causes.append(_required("spec.versions", "must have exactly one version marked as storage"))
        return causes
    seen: set[str] = set()
    storage = 0
    served = 0
    for i, v in enumerate(versions):
        path = f"spec.versions[{i}]"
        if not isinstance(v, dict):
            causes.append(_invalid(path, v, "must be an object"))
            continue
        vname = v.get("name")
        if not isinstance(vname, str) or not vname:
            causes.append(_required(f"{path}.name"))
        else:
            causes.extend(_invalid(f"{path}.name", vname, m) for m in is_dns1035_label(vname))
            if vname in seen:
                causes.append(
                    Cause(f"{path}.name", f"Duplicate value: {quote(vname)}", "FieldValueDuplicate")
                )
            seen.add(vname)
        for flag in ("served", "storage"):
            if not isinstance(v.get(flag), bool):
                causes.append(_required(f"{path}.{flag}"))
        storage += v.get("storage") is True
        served += v.get("served") is True
        causes.extend(_validate_version(v, path))
    if storage != 1:
        causes.append(
            _invalid(
                "spec.versions",
                [v.get("name") for v in versions if isinstance(v, dict)],
                "must have exactly one version marked as storage version",
            )
        )
    if served == 0:
        causes.append(
            _invalid(
                "spec.versions",
                [v.get("name") for v in versions if isinstance(v, dict)],
                "must have at least one version marked as served",
            )
        )
    return causes


def _validate_names(names: Obj) -> list[Cause]:
    causes: list[Cause] = []
    for key in ("plural", "singular"):
        value = names.get(key)
        path = f"spec.names.{key}"
        if value in (None, ""):
            if key == "plural":
                causes.append(_required(path))
            continue
        if not isinstance(value, str):
            causes.append(_invalid(path, value, "must be a string"))
            continue
        causes.extend(_invalid(path, value, m) for m in is_dns1123_label(value))
    kind = names.get("kind")
    for key in ("kind", "listKind"):
        value = names.get(key)
        path = f"spec.names.{key}"
        if value in (None, ""):
            if key == "kind":
                causes.append(_required(path))
            continue
        if not isinstance(value, str):
            causes.append(_invalid(path, value, "must be a string"))
            continue
        causes.extend(_invalid(path, value, m) for m in is_dns1035_label(value.lower()))
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", value):
            causes.append(
                _invalid(path, value, "must be a CamelCase name of letters and digits, e.g. Widget")
            )
    if names.get("listKind") and names.get("listKind") == kind:
        causes.append(_invalid("spec.names.listKind", kind, "kind and listKind cannot be the same"))
    for key in ("shortNames", "categories"):
        values = names.get(key)
        if values is None:
            continue
        if not isinstance(values, list):
            causes.append(_invalid(f"spec.names.{key}", values, "must be a list of strings"))
            continue
        for i, value in enumerate(values):
            path = f"spec.names.{key}[{i}]"
            if not isinstance(value, str):
                causes.append(_invalid(path, value, "must be a string"))
                continue
            causes.extend(_invalid(path, value, m) for m in is_dns1123_label(value))
    return causes


def _validate_version(v: Obj, path: str) -> list[Cause]:
    causes: list[Cause] = []
    schema = _dict(v.get("schema")).get("openAPIV3Schema")
    spath = f"{path}.schema.openAPIV3Schema"
    if schema is None:
        causes.append(_required(spath, "schemas are required"))
    elif not isinstance(schema, dict):
        causes.append(_invalid(spath, schema, "must be an object"))
    else:
        causes.extend(_validate_root(schema, spath))

    sub = _dict(v.get("subresources"))
    scale = sub.get("scale")
    if scale is not None:
        scale = _dict(scale)
        sc = f"{path}.subresources.scale"
        for key, under in (
            ("specReplicasPath", (".spec.",)),
            ("statusReplicasPath", (".status.",)),
            ("labelSelectorPath", (".spec.", ".status.")),
        ):
            value = scale.get(key)
            if value in (None, ""):
                if key != "labelSelectorPath":
                    causes.append(_required(f"{sc}.{key}"))
                continue
            where = " or ".join(u[:-1] for u in under)
            if not isinstance(value, str) or not value.startswith(under):
                causes.append(
                    _invalid(f"{sc}.{key}", value, f"should be a json path under {where}")
                )
                continue
            try:
                jsonpath.compile(value)
            except jsonpath.JSONPathError as e:
                causes.append(_invalid(f"{sc}.{key}", value, str(e)))

    for i, col in enumerate(_list(v.get("additionalPrinterColumns"))):
        cp = f"{path}.additionalPrinterColumns[{i}]"
        if not isinstance(col, dict):
            causes.append(_invalid(cp, col, "must be an object"))
            continue
        if not col.get("name"):
            causes.append(_required(f"{cp}.name"))
        ctype = col.get("type")
        if ctype in (None, ""):
            causes.append(_required(f"{cp}.type"))
        elif ctype not in COLUMN_TYPES:
            causes.append(_unsupported(f"{cp}.type", ctype, COLUMN_TYPES))
        priority = col.get("priority", 0)
        if isinstance(priority, bool) or not isinstance(priority, int) or priority < 0:
            causes.append(
                _invalid(f"{cp}.priority", priority, "must be greater than or equal to 0")
            )
        jp = col.get("jsonPath")
        if jp in (None, ""):
            causes.append(_required(f"{cp}.jsonPath"))
            continue
        if not isinstance(jp, str):
            causes.append(_invalid(f"{cp}.jsonPath", jp, "must be a string"))
            continue
        try:
            jsonpath.compile(jp)
        except jsonpath.JSONPathError as e:
            causes.append(_invalid(f"{cp}.jsonPath", jp, f"must be a simple json path: {e}"))
    return causes


def _validate_root(schema: Obj, path: str) -> list[Cause]:
    causes: list[Cause] = []
    t = schema.get("type")
    if t in (None, ""):
        if schema.get("x-kubernetes-preserve-unknown-fields") is not True:
            causes.append(_required(f"{path}.type", "must not be empty at the root"))
    elif t != "object":
        causes.append(_invalid(f"{path}.type", t, "must be object at the root"))
    props = _dict(schema.get("properties"))
    meta = props.get("metadata")
    if isinstance(meta, dict):
        allowed = {"name", "generateName"}
        extra = set(meta) - {"type", "properties", "description"}
        mprops = _dict(meta.get("properties"))
        if extra or set(mprops) - allowed or meta.get("type") not in (None, "object"):
            causes.append(
                _forbidden(
                    f"{path}.properties[metadata]",
                    "must not specify anything other than name and generateName, "
                    "but metadata is implicitly specified",
                )
            )
    for key in ("apiVersion", "kind"):
        node = props.get(key)
        if isinstance(node, dict) and node.get("type") not in (None, "string"):
            causes.append(
                _invalid(f"{path}.properties[{key}].type", node.get("type"), "must be string")
            )
    causes.extend(_structural(schema, path, "at the root", depth=0))
    return causes


def _structural(s: Any, path: str, where: str, *, depth: int) -> list[Cause]:
    """The structural-schema rules, recursively (apiextensions' validateStructural)."""
    if not isinstance(s, dict):
        return [_invalid(path, s, "must be a schema object")]
    if depth > 64:
        return [_forbidden(path, "schema is nested too deeply")]
    causes: list[Cause] = []
    for key in _FORBIDDEN_KEYS:
        if key in s:
            causes.append(_forbidden(f"{path}.{key}", f"{key} is not supported"))
    t = s.get("type")
    int_or_string = s.get("x-kubernetes-int-or-string") is True
    preserve = s.get("x-kubernetes-preserve-unknown-fields")
    if preserve is not None and preserve is not True:
        causes.append(
            _invalid(
                f"{path}.x-kubernetes-preserve-unknown-fields",
                preserve,
                "must be true or undefined",
            )
        )
    if int_or_string:
        if t not in (None, ""):
            causes.append(
                _invalid(f"{path}.type", t, "must be empty if x-kubernetes-int-or-string is true")
            )
    elif t in (None, ""):
        if preserve is not True and where != "at the root":
            causes.append(_required(f"{path}.type", f"must not be empty for {where}"))
    elif t not in TYPES:
        causes.append(_unsupported(f"{path}.type", t, TYPES))

    props = s.get("properties")
    addl = s.get("additionalProperties")
    if props is not None and not isinstance(props, dict):
        causes.append(_invalid(f"{path}.properties", props, "must be a map of schemas"))
        props = None
    if props and addl is not None and addl is not False:
        causes.append(
            _forbidden(
                f"{path}.additionalProperties",
                "additionalProperties and properties are mutual exclusive",
            )
        )
    typed_elsewhere = where == "at the root"  # the root's type has its own message
    if (
        (props or addl not in (None, False))
        and t not in (None, "", "object")
        and not typed_elsewhere
    ):
        causes.append(_invalid(f"{path}.type", t, "must be object if properties are specified"))
    for name, sub in sorted((props or {}).items()):
        causes.extend(
            _structural(
                sub,
                f"{path}.properties[{name}]",
                "specified object fields",
                depth=depth + 1,
            )
        )
    if isinstance(addl, dict):
        causes.extend(
            _structural(
                addl,
                f"{path}.additionalProperties",
                "specified additionalProperties",
                depth=depth + 1,
            )
        )
    elif addl is True and preserve is not True:
        causes.append(
            _forbidden(
                f"{path}.additionalProperties",
                "must not be true; use x-kubernetes-preserve-unknown-fields instead",
            )
        )

    items = s.get("items")
    if t == "array" and items is None:
        causes.append(_required(f"{path}.items", "must be specified"))
    if isinstance(items, list):
        causes.append(_forbidden(f"{path}.items", "items must be a schema object and not an array"))
    elif items is not None:
        if t not in (None, "", "array"):
            causes.append(_invalid(f"{path}.type", t, "must be array if items are specified"))
        causes.extend(_structural(items, f"{path}.items", "specified array items", depth=depth + 1))

    if s.get("x-kubernetes-embedded-resource") is True:
        if t != "object":
            causes.append(
                _invalid(
                    f"{path}.type", t, "must be object if x-kubernetes-embedded-resource is true"
                )
            )
        if not props and preserve is not True:
            causes.append(
                _required(
                    f"{path}.properties",
                    "must not be empty if x-kubernetes-embedded-resource is true without "
                    "x-kubernetes-preserve-unknown-fields",
                )
            )

    list_type = s.get("x-kubernetes-list-type")
    keys = s.get("x-kubernetes-list-map-keys")
    if list_type is not None:
        if t != "array":
            causes.append(
                _invalid(
                    f"{path}.x-kubernetes-list-type", list_type, "must only be used on type array"
                )
            )
        elif list_type not in LIST_TYPES:
            causes.append(_unsupported(f"{path}.x-kubernetes-list-type", list_type, LIST_TYPES))
        elif list_type == "map":
            item_props = _dict(_dict(items).get("properties"))
            if not isinstance(keys, list) or not keys:
                causes.append(
                    _required(
                        f"{path}.x-kubernetes-list-map-keys",
                        "must not be empty if x-kubernetes-list-type is map",
                    )
                )
            else:
                for i, k in enumerate(keys):
                    if not isinstance(k, str) or k not in item_props:
                        causes.append(
                            _invalid(
                                f"{path}.x-kubernetes-list-map-keys[{i}]",
                                k,
                                "must be the name of a property of the items",
                            )
                        )
        elif list_type == "set":
            item_type = _dict(items).get("type")
            if item_type in ("object", "array"):
                causes.append(
                    _invalid(
                        f"{path}.items.type",
                        item_type,
                        "must be a scalar type if x-kubernetes-list-type is set",
                    )
                )
    if keys is not None and list_type != "map":
        causes.append(
            _forbidden(
                f"{path}.x-kubernetes-list-map-keys",
                "must be empty if x-kubernetes-list-type is not map",
            )
        )
    map_type = s.get("x-kubernetes-map-type")
    if map_type is not None and map_type not in MAP_TYPES:
        causes.append(_unsupported(f"{path}.x-kubernetes-map-type", map_type, MAP_TYPES))

    if "default" in s and not causes:
        checked = validate(s, copy.deepcopy(s["default"]), strict=True)
        for c in checked.causes:
            causes.append(Cause(f"{path}.default", c.message, c.reason))
        for u in checked.unknown:
            causes.append(_invalid(f"{path}.default", u, "unknown field in default"))
    return causes
