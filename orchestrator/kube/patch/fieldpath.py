"""Field paths and field sets for server-side apply (structured-merge-diff's `fieldpath`).

Theory of operation. A *path* names one node of an object as a tuple of path elements, each a
string in the FieldsV1 spelling:

* `f:<name>`  a map field or map entry;
* `k:<json>`  the item of an associative list (list-type `map`, or a list with a patch merge
  key) whose key fields have these values, JSON with sorted keys: `k:{"name":"nginx"}`;
* `v:<json>`  the item of a set list with this value: `v:"example.com/finalizer"`;
* `i:<n>`     an item by index (only for list items that have no key).

A *field set* is a frozenset of paths: the nodes some manager owns. `fieldset_of(obj, schema)`
gives the nodes an object configures, following the walk structured-merge-diff does: scalars,
atomic lists and atomic maps are leaves; a granular map contributes its fields (an entry that is
not a declared property, or whose value is null or `{}`, is also a member itself); an
associative or set list contributes each item, and an associative item its fields as well.

`encode_fields_v1` / `decode_fields_v1` convert to and from the tree stored in
`metadata.managedFields[].fieldsV1`, where `".": {}` marks a node that is a member and also has
members below it. `path_string` renders a path the way conflict messages print it:
`.spec.template.spec.containers[name="nginx"].image`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, NamedTuple

from orchestrator.kube.errors import bad_request
from orchestrator.kube.jsonvalue import SCALAR_TYPES
from orchestrator.kube.patch._util import (
    Schema,
    canonical,
    child_schema,
    is_atomic_map,
    is_declared_field,
    item_schema,
    list_map_keys,
    list_type,
    patch_merge_key,
    patch_strategies,
    short,
)

__all__ = [
    "FieldSet",
    "Member",
    "Path",
    "decode_fields_v1",
    "encode_fields_v1",
    "fieldset_of",
    "is_set_list",
    "item_element",
    "list_keys",
    "member_of_field",
    "members_of",
    "path_string",
]

Path = tuple[str, ...]
FieldSet = frozenset[Path]


class Member(NamedTuple):
    """One node an object configures: `leaf` nodes compare by `value`, containers by presence.
    (A named tuple: one is made per node of every written object; a frozen dataclass costs
    several times more to build.)"""

    leaf: bool
    value: Any


# --- the FieldsV1 tree ---------------------------------------------------------------------


def encode_fields_v1(fields: FieldSet) -> dict[str, Any]:
    """The FieldsV1 JSON tree of a field set (keys sorted, `"."` for members with children).

    One pass over the paths in sorted order: a parent sorts before its descendants and
    siblings in key order, so every node's keys arrive sorted, and a member still empty when
    a descendant arrives gets its `"."` first (it sorts before every path element)."""
    tree: dict[str, Any] = {}
    for path in sorted(fields):
        node = tree
        for element in path[:-1]:
            child = node.get(element)
            if child is None:
                child = node[element] = {}
            elif not child:
                child["."] = {}  # a member with members under it
            node = child
        node.setdefault(path[-1], {})
    return tree


def _canonical_element(element: str) -> str:
    kind, sep, rest = element.partition(":")
    if not sep or kind not in ("f", "k", "v", "i"):
        raise bad_request(f"managedFields: invalid path element {short(element)}")
    if kind == "f":
        return element
    if kind == "i":
        if not rest.isascii() or not rest.isdigit():
            raise bad_request(f"managedFields: invalid index {short(element)}")
        return f"i:{int(rest)}"
    try:
        value = json.loads(rest)
    except ValueError:
        raise bad_request(f"managedFields: invalid JSON in path element {short(element)}") from None
    if kind == "k" and not isinstance(value, dict):
        raise bad_request(f"managedFields: key element must be an object: {short(element)}")
    return f"{kind}:{canonical(value)}"


def _same(element: str) -> str:
    return element


def _walk_fields(
    node: dict[str, Any], prefix: Path, out: set[Path], element: Callable[[str], str]
) -> None:
    """`decode_fields_v1`'s walk: the paths under `prefix` into `out`. (A module function, not
    a recursive closure: that is a reference cycle per call, left to the cyclic collector.)"""
    for key, child in node.items():
        if not isinstance(child, dict):
            raise bad_request(f"managedFields: {short(key)} must map to an object")
        if key == ".":
            if prefix:
                out.add(prefix)
            continue
        path = (*prefix, element(key))
        if child:
            _walk_fields(child, path, out, element)
        else:
            out.add(path)


def decode_fields_v1(tree: Any, *, canonical: bool = False) -> FieldSet:
    """Parse a FieldsV1 tree; a malformed one is a 400 BadRequest. `canonical`: the tree is
    known to come from `encode_fields_v1` (a stored object's), so its path elements are taken
    as they are instead of being checked and re-spelled canonically."""
    if not isinstance(tree, dict):
        raise bad_request("managedFields: fieldsV1 must be an object")
    out: set[Path] = set()
    try:
        _walk_fields(tree, (), out, _same if canonical else _canonical_element)
    except RecursionError:
        raise bad_request("managedFields: fieldsV1 is nested too deeply") from None
    return frozenset(out)


def path_string(path: Path) -> str:
    """`.spec.containers[name="nginx"].image`, `.metadata.finalizers[="x"]`, `.spec.args[0]`."""
    parts = []
    for element in path:
        kind, _, rest = element.partition(":")
        if kind == "f":
            parts.append("." + rest)
        elif kind == "k":
            keys = json.loads(rest)
            inner = ",".join(f"{k}={canonical(v)}" for k, v in sorted(keys.items()))
            parts.append(f"[{inner}]")
        elif kind == "v":
            parts.append(f"[={rest}]")
        else:
            parts.append(f"[{rest}]")
    return "".join(parts)


# --- what an object configures -------------------------------------------------------------


def list_keys(schema: Schema) -> list[str]:
    """Key fields of an associative list: list-map keys, else the patch merge key, else []."""
    if list_type(schema) == "map":
        keys = list_map_keys(schema)
        if keys:
            return keys
    merge_key = patch_merge_key(schema)
    return [merge_key] if merge_key else []


def item_element(item: Any, index: int, keys: list[str], schema: Schema) -> str:
    """The path element naming `item` (at `index`) in an associative list with `keys`."""
    if not isinstance(item, dict):
        return f"i:{index}"
    items = item_schema(schema)
    found: dict[str, Any] = {}
    for key in keys:
        if key in item and item[key] is not None:
            found[key] = item[key]
        else:
            field = child_schema(items, key)
            if field is not None and "default" in field:
                found[key] = field["default"]
    if not found:
        return f"i:{index}"
    if len(found) == 1:
        ((key, value),) = found.items()
        if type(value) is str:  # the usual one: a condition's type, a container's name
            element = _ELEMENTS.get((key, value))
            if element is None:
                if len(_ELEMENTS) >= _ELEMENTS_MAX:
                    _ELEMENTS.clear()
                element = _ELEMENTS[(key, value)] = f"k:{canonical(found)}"
            return element
    return f"k:{canonical(found)}"


# Path elements of list items with one string key, by (key, value): canonical JSON is a good
# part of the cost of computing an update's field set, and the same few keys recur.
_ELEMENTS: dict[tuple[str, str], str] = {}
_ELEMENTS_MAX = 4096


def is_set_list(schema: Schema) -> bool:
    """A list of values owned one by one: list-type `set`, or a merge list without a key."""
    if list_type(schema) == "set":
        return True
    return "merge" in patch_strategies(schema) and patch_merge_key(schema) is None


_CONTAINER = Member(False, None)


def _leaf(value: Any) -> Member:
    # `Member(True, value)` without the named tuple's Python-level `__new__` (one per member of
    # every written object).
    return _NEW_MEMBER(Member, (True, value))


_NEW_MEMBER = tuple.__new__


def _walk(value: Any, schema: Schema, path: Path, out: dict[Path, Member]) -> None:
    if isinstance(value, dict):
        if path and is_atomic_map(schema):
            out[path] = _leaf(value)
            return
        for key, child in value.items():
            if type(child) in SCALAR_TYPES:  # what `_walk_field` makes of it, without the schema
                out[(*path, f"f:{key}")] = _leaf(child)
            else:
                _walk_field(child, key, schema, (*path, f"f:{key}"), out)
        return
    if isinstance(value, list) and path:
        keys = list_keys(schema)
        if keys:
            items = item_schema(schema)
            for index, item in enumerate(value):
                element = item_element(item, index, keys, schema)
                sub = (*path, element)
                if element.startswith("k:"):
                    _walk(item, items, sub, out)
                    out[sub] = _CONTAINER
                else:
                    out[sub] = _leaf(item)
            return
        if is_set_list(schema):
            for item in value:
                out[(*path, f"v:{canonical(item)}")] = _leaf(item)
            return
    if path:
        out[path] = _leaf(value)


def _walk_field(child: Any, key: str, schema: Schema, sub: Path, out: dict[Path, Member]) -> None:
    """The members of field `key` (value `child`, path `sub`) of a granular map with `schema`."""
    child_s = child_schema(schema, key)
    _walk(child, child_s, sub, out)
    if sub in out:
        return
    if child is None or child == {} or not is_declared_field(schema, key):
        out[sub] = Member(not _is_container(child, child_s), child)


def member_of_field(value: Any, key: str, schema: Schema, sub: Path) -> dict[Path, Member]:
    """The members field `key` with `value` contributes to a granular map with `schema` whose
    path is `sub[:-1]` (`sub` ends with `f:key`): the part of `members_of` under `sub`."""
    out: dict[Path, Member] = {}
    _walk_field(value, key, schema, sub, out)
    return out


def _is_container(value: Any, schema: Schema) -> bool:
    if isinstance(value, dict):
        return not is_atomic_map(schema)
    if isinstance(value, list):
        return bool(list_keys(schema)) or is_set_list(schema)
    return False


def members_of(obj: Any, schema: Schema) -> dict[Path, Member]:
    """Every node `obj` configures, with whether it is a leaf and its value."""
    out: dict[Path, Member] = {}
    try:
        _walk(obj, schema, (), out)
    except RecursionError:
        raise bad_request("object is nested too deeply") from None
    return out


def fieldset_of(obj: Any, schema: Schema) -> FieldSet:
    """The field set `obj` configures under `schema` (see the module docstring)."""
    return frozenset(members_of(obj, schema))
