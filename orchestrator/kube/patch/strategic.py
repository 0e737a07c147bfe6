"""Strategic merge patch (`application/strategic-merge-patch+json`), driven by the kind's schema.

Theory of operation. Applying walks the patch and the (deep-copied) original together, looking up
each field's schema as it descends:

* maps merge key by key; `null` deletes a key; `{"$patch": "replace"}` makes the map exactly the
  rest of the patch, `{"$patch": "delete"}` removes it, `{"$patch": "merge"}` is the default;
  `$retainKeys: [...]` first clears every field not listed (union types, `retainKeys` strategy);
* lists whose schema says `x-kubernetes-patch-strategy: merge` merge: lists of objects by
  `x-kubernetes-patch-merge-key` (matches merge recursively, new keys are appended,
  `{"<key>": v, "$patch": "delete"}` removes every element with that key, an element
  `{"$patch": "replace"}` makes the list exactly the other patch elements), lists of scalars as a
  set union with `$deleteFromPrimitiveList/<field>` removing values;
* every other list, and every value whose type differs, is replaced wholesale;
* order: `$setElementOrder/<field>` puts elements absent from the directive first (their relative
  order kept), then the directive's order; without it, elements the patch does not mention come
  first, then the patch's elements in patch order.

Fields the schema does not describe behave like JSON merge patch (maps merge, lists replace).

Creating a patch (`create_two_way_merge_patch`, `create_three_way_merge_patch`) is the reverse:
one diff walk over (last applied, modified, current) emitting the directives above, so that
applying the patch to `current` yields `modified` on every field the manifest sets while fields
only present in `current` survive. The two-way patch is the three-way patch with
`last applied == current`.

Errors are always `ApiError` 400 with the path of the offending field; inputs are never mutated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestrator.kube.errors import bad_request
from orchestrator.kube.objects import Obj
from orchestrator.kube.patch._util import (
    Schema,
    canonical,
    child_schema,
    copy_json,
    item_schema,
    json_equal,
    patch_merge_key,
    patch_strategies,
    short,
)

__all__ = [
    "apply_strategic_merge_patch",
    "create_three_way_merge_patch",
    "create_two_way_merge_patch",
]


_PATCH = "$patch"
_RETAIN = "$retainKeys"
_ORDER = "$setElementOrder/"
_DELETE_FROM = "$deleteFromPrimitiveList/"


class _Deleted:
    """Marker: the patch asked to delete the map it was applied to."""


_DELETED = _Deleted()


def _where(path: str) -> str:
    return path.lstrip(".") or "<root>"


def _join(path: str, key: str) -> str:
    return f"{path}.{key}"


def _is_directive(key: str) -> bool:
    return key in (_PATCH, _RETAIN) or key.startswith((_ORDER, _DELETE_FROM))


def _is_merge_list(schema: Schema) -> bool:
    return "merge" in patch_strategies(schema)


def _is_replace(schema: Schema) -> bool:
    return "replace" in patch_strategies(schema)


# --- apply ---------------------------------------------------------------------------------


def apply_strategic_merge_patch(original: Obj, patch: Any, schema: Schema) -> Obj:
    """Apply a strategic merge patch to `original` (never mutated) and return the new object."""
    if not isinstance(patch, dict):
        raise bad_request("strategic merge patch must be a JSON object")
    work = copy_json(original) if isinstance(original, dict) else {}
    try:
        result = _merge_map(work, patch, schema, "")
    except RecursionError:
        raise bad_request("strategic merge patch is nested too deeply") from None
    return {} if isinstance(result, _Deleted) else result


def _merge_map(target: Obj, patch: Obj, schema: Schema, path: str) -> Obj | _Deleted:
    """Merge `patch` into `target`, which this call owns and may change in place."""
    if _PATCH in patch:
        directive = patch[_PATCH]
        if directive == "delete":
            return _DELETED
        if directive == "replace":
            rest = {k: v for k, v in patch.items() if k != _PATCH}
            return _merge_map({}, rest, schema, path)
        if directive != "merge":
            raise bad_request(f"{_where(path)}: unknown $patch directive {short(directive)}")
    if _RETAIN in patch:
        _retain_keys(target, patch, path)
    for key, value in patch.items():
        if key.startswith(_DELETE_FROM):
            _delete_from_primitive_list(target, key[len(_DELETE_FROM) :], value, path)
    for key, value in patch.items():
        if _is_directive(key):
            continue
        sub = child_schema(schema, key)
        where = _join(path, key)
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict):
            current = target.get(key)
            base = current if isinstance(current, dict) and not _is_replace(sub) else {}
            merged = _merge_map(base, value, sub, where)
            if isinstance(merged, _Deleted):
                target.pop(key, None)
            else:
                target[key] = merged
        elif isinstance(value, list) and _is_merge_list(sub):
            current = target.get(key)
            target[key] = _merge_list(
                current if isinstance(current, list) else [],
                value,
                sub,
                where,
                patch.get(_ORDER + key),
                has_order=(_ORDER + key) in patch,
            )
        else:
            target[key] = copy_json(value)
    for key, order in patch.items():
        if not key.startswith(_ORDER):
            continue
        field = key[len(_ORDER) :]
        if field in patch:
            continue
        sub = child_schema(schema, field)
        current = target.get(field)
        if isinstance(current, list) and _is_merge_list(sub):
            target[field] = _merge_list(current, [], sub, _join(path, field), order, has_order=True)
    return target


def _retain_keys(target: Obj, patch: Obj, path: str) -> None:
    keep = patch[_RETAIN]
    if not isinstance(keep, list) or not all(isinstance(k, str) for k in keep):
        raise bad_request(f"{_where(path)}: $retainKeys must be a list of field names")
    allowed = set(keep)
    for key, value in patch.items():
        if value is None or _is_directive(key):
            continue
        if key not in allowed:
            raise bad_request(
                f'{_where(path)}: field "{key}" is set by the patch but not listed in $retainKeys'
            )
    for key in list(target):
        if key not in allowed:
            del target[key]


def _delete_from_primitive_list(target: Obj, field: str, values: Any, path: str) -> None:
    if not isinstance(values, list):
        raise bad_request(f"{_where(path)}: {_DELETE_FROM}{field} must be a list")
    current = target.get(field)
    if isinstance(current, list):
        gone = {canonical(v) for v in values}
        target[field] = [v for v in current if canonical(v) not in gone]


def _fresh(element: Any, schema: Schema, path: str) -> Any:
    """A patch element placed as is: objects still get their directives processed."""
    if isinstance(element, dict):
        merged = _merge_map({}, element, schema, path)
        return {} if isinstance(merged, _Deleted) else merged
    return copy_json(element)


def _merge_list(
    current: list[Any],
    patch: list[Any],
    schema: Schema,
    path: str,
    order: Any,
    *,
    has_order: bool,
) -> list[Any]:
    items = item_schema(schema)
    if any(isinstance(e, dict) and e.get(_PATCH) == "replace" for e in patch):
        rest = [e for e in patch if not (isinstance(e, dict) and e.get(_PATCH) == "replace")]
        return [_fresh(e, items, f"{path}[{i}]") for i, e in enumerate(rest)]
    if any(isinstance(e, dict) for e in patch):
        if not all(isinstance(e, dict) for e in patch):
            raise bad_request(f"{_where(path)}: list mixes objects and other values")
        return _merge_object_list(current, patch, schema, path, order, has_order=has_order)
    if not patch:
        if not has_order:
            return current
        if any(isinstance(e, dict) for e in current):
            return _merge_object_list(current, patch, schema, path, order, has_order=has_order)
    return _merge_primitive_list(current, patch, path, order, has_order=has_order)


def _merge_primitive_list(
    current: list[Any], patch: list[Any], path: str, order: Any, *, has_order: bool
) -> list[Any]:
    seen: set[str] = set()
    merged: list[Any] = []
    for value in [*current, *patch]:
        key = canonical(value)
        if key not in seen:
            seen.add(key)
            merged.append(copy_json(value))
    patch_keys = _unique([canonical(v) for v in patch])
    return _order(merged, canonical, patch_keys, path, order, has_order, canonical)


def _unique(keys: list[str]) -> list[str]:
    seen: set[str] = set()
    out = []
    for key in keys:
        if key not in seen:
            seen.add(key)
            out.append(key)
    return out


def _merge_object_list(
    current: list[Any], patch: list[Any], schema: Schema, path: str, order: Any, *, has_order: bool
) -> list[Any]:
    merge_key = patch_merge_key(schema)
    items = item_schema(schema)
    if merge_key is None:
        raise bad_request(f"{_where(path)}: cannot merge a list of objects without a merge key")

    def key_of(element: Any) -> str | None:
        if isinstance(element, dict) and merge_key in element:
            return canonical(element[merge_key])
        return None

    result = list(current)
    patch_keys: list[str] = []
    for index, element in enumerate(patch):
        where = f"{path}[{index}]"
        directive = element.get(_PATCH)
        if merge_key not in element:
            raise bad_request(
                f"{_where(where)}: {short(element)} does not contain "
                f"declared merge key: {merge_key}"
            )
        key = canonical(element[merge_key])
        if _PATCH in element:
            if directive == "delete":
                result = [e for e in result if key_of(e) != key]
                continue
            if directive != "merge":
                raise bad_request(f"{_where(where)}: unknown $patch directive {short(directive)}")
        patch_keys.append(key)
        found = next((i for i, e in enumerate(result) if key_of(e) == key), None)
        if found is None:
            result.append(_fresh(element, items, where))
        else:
            merged = _merge_map(result[found], element, items, where)
            result[found] = {} if isinstance(merged, _Deleted) else merged

    def order_key(value: Any) -> str:
        if not isinstance(value, dict) or merge_key not in value:
            raise bad_request(
                f"{_where(path)}: $setElementOrder entry {short(value)} has no {merge_key}"
            )
        return canonical(value[merge_key])

    return _order(result, key_of, _unique(patch_keys), path, order, has_order, order_key)


def _order(
    merged: list[Any],
    key_of: Callable[[Any], str | None],
    patch_keys: list[str],
    path: str,
    order: Any,
    has_order: bool,
    order_key: Callable[[Any], str],
) -> list[Any]:
    """Reorder `merged`: unmentioned elements first, then the directive's (or patch's) order."""
    if has_order:
        if not isinstance(order, list):
            raise bad_request(f"{_where(path)}: $setElementOrder must be a list")
        wanted = _unique([order_key(v) for v in order])
        position = {k: i for i, k in enumerate(wanted)}
        last = -1
        for key in patch_keys:
            if key not in position:
                raise bad_request(
                    f"{_where(path)}: the patch has an element ({key}) that is not in "
                    "$setElementOrder"
                )
            if position[key] < last:
                raise bad_request(
                    f"{_where(path)}: the order of the patch list contradicts $setElementOrder"
                )
            last = position[key]
    else:
        wanted = patch_keys
    wanted_set = set(wanted)
    first = [e for e in merged if key_of(e) not in wanted_set]
    by_key: dict[str, list[Any]] = {}
    for element in merged:
        element_key = key_of(element)
        if element_key is not None and element_key in wanted_set:
            by_key.setdefault(element_key, []).append(element)
    rest = [e for key in wanted for e in by_key.get(key, [])]
    return first + rest


# --- create --------------------------------------------------------------------------------


def create_two_way_merge_patch(original: Obj, modified: Obj, schema: Schema) -> Obj:
    """A patch turning `original` into `modified` (`{}` when equal), as `kubectl edit` makes it."""
    return create_three_way_merge_patch(original, modified, original, schema)


def create_three_way_merge_patch(
    original: Obj | None, modified: Obj, current: Obj, schema: Schema
) -> Obj:
    """kubectl's client-side apply patch.

    `original` is the last-applied configuration (or None), `modified` the new manifest and
    `current` the live object. Fields in `modified` are set as there; fields in `original` but no
    longer in `modified` are deleted; fields only `current` has are left alone.
    """
    try:
        return _diff_map(original or {}, modified, current, schema)
    except RecursionError:
        raise bad_request("object is nested too deeply to diff") from None


def _diff_map(original: Obj, modified: Obj, current: Obj, schema: Schema) -> Obj:
    patch: Obj = {}
    for key, new in modified.items():
        sub = child_schema(schema, key)
        if key not in current:
            patch[key] = copy_json(new)
            continue
        live = current[key]
        old = original.get(key)
        if isinstance(new, dict) and isinstance(live, dict) and not _is_replace(sub):
            diff = _diff_map(old if isinstance(old, dict) else {}, new, live, sub)
            if diff:
                if "retainKeys" in patch_strategies(sub):
                    diff[_RETAIN] = sorted(new)
                patch[key] = diff
        elif isinstance(new, list) and isinstance(live, list) and _is_merge_list(sub):
            _diff_list(patch, key, old if isinstance(old, list) else [], new, live, sub)
        elif not json_equal(new, live):
            patch[key] = copy_json(new)
    for key in original:
        if key not in modified and key in current:
            patch[key] = None
    return patch


def _diff_list(
    patch: Obj,
    field: str,
    original: list[Any],
    modified: list[Any],
    current: list[Any],
    sub: Schema,
) -> None:
    merge_key = patch_merge_key(sub)
    scalars = not any(isinstance(e, dict | list) for e in [*modified, *current])
    if scalars and _distinct(modified) and _distinct(current):
        _diff_primitive_list(patch, field, original, modified, current)
        return
    keyed = merge_key is not None and _keyed(modified, merge_key) and _keyed(current, merge_key)
    if scalars or merge_key is None or not keyed:
        if not json_equal(modified, current):
            patch[field] = [{_PATCH: "replace"}, *copy_json(modified)]
        return
    items = item_schema(sub)
    retain = "retainKeys" in patch_strategies(sub)
    live = {canonical(e[merge_key]): e for e in current}
    old = {canonical(e[merge_key]): e for e in original if isinstance(e, dict) and merge_key in e}
    wanted = [canonical(e[merge_key]) for e in modified]
    elements: list[Any] = []
    for key, element in zip(wanted, modified, strict=True):
        if key not in live:
            elements.append(copy_json(element))
            continue
        before = old.get(key)
        diff = _diff_map(before if isinstance(before, dict) else {}, element, live[key], items)
        if diff:
            diff[merge_key] = copy_json(element[merge_key])
            if retain:
                diff[_RETAIN] = sorted(element)
            elements.append(diff)
    wanted_set = set(wanted)
    for key, element in old.items():
        if key not in wanted_set and key in live:
            elements.append({merge_key: copy_json(element[merge_key]), _PATCH: "delete"})
    common_live = [k for k in live if k in wanted_set]
    common_new = [k for k in wanted if k in live]
    if elements or common_live != common_new:
        patch[_ORDER + field] = [{merge_key: copy_json(e[merge_key])} for e in modified]
    if elements:
        patch[field] = elements


def _distinct(values: list[Any]) -> bool:
    return len({canonical(v) for v in values}) == len(values)


def _keyed(elements: list[Any], merge_key: str) -> bool:
    """Every element is an object with a distinct merge key."""
    keys = set()
    for element in elements:
        if not isinstance(element, dict) or merge_key not in element:
            return False
        key = canonical(element[merge_key])
        if key in keys:
            return False
        keys.add(key)
    return True


def _diff_primitive_list(
    patch: Obj, field: str, original: list[Any], modified: list[Any], current: list[Any]
) -> None:
    live = {canonical(v) for v in current}
    new = {canonical(v) for v in modified}
    added = [copy_json(v) for v in modified if canonical(v) not in live]
    removed = [copy_json(v) for v in original if canonical(v) not in new and canonical(v) in live]
    common_live = _unique([canonical(v) for v in current if canonical(v) in new])
    common_new = _unique([canonical(v) for v in modified if canonical(v) in live])
    if added or removed or common_live != common_new:
        patch[_ORDER + field] = copy_json(modified)
    if added:
        patch[field] = _dedupe(added)
    if removed:
        patch[_DELETE_FROM + field] = _dedupe(removed)


def _dedupe(values: list[Any]) -> list[Any]:
    seen: set[str] = set()
    out = []
    for value in values:
        key = canonical(value)
        if key not in seen:
            seen.add(key)
            out.append(value)
    return out
