"""Server-side apply and managedFields bookkeeping (structured-merge-diff's `merge.Updater`).

Theory of operation. `metadata.managedFields` records, per manager and operation, the field set
(see `fieldpath`) that manager owns. Two writes change it:

`server_side_apply(live, config, ...)`:
1. the config's field set is what the applier will own from now on (its `Apply` entry is
   replaced, not extended);
2. the config is merged into the live object per field: granular maps key by key, associative
   lists item by item (by their keys), sets by value; scalars, atomic lists and atomic maps take
   the config's value;
3. a *conflict* is a field in the config whose value the merge changes and that another manager
   owns; conflicts fail the apply with 409 unless `force`, which takes the fields away from
   their owners. A field set to the value it already has is shared, not conflicting;
4. fields the applier owned before, no longer in its config, and owned by nobody else are
   removed from the object (an item stays while anyone owns something inside it);
5. the applier's entry gets `time = now` only when its fields or the object changed, so applying
   the same config twice yields the same object and the server can skip the write.

`track_update(old, new, ...)` (create, update, patch): every field whose value changed (all
fields on create) moves to the writer's `Update` entry, removed fields leave every set, and
entries left empty disappear. If the write itself carries a different managedFields list the
client's list is the starting point (how kubectl migrates client-side-apply ownership); a list
holding one empty entry `[{}]` clears managedFields.

The entries themselves, the diff of what a write touches and the fields never tracked (see
"Ignored fields" there) live in `managedfields`; this module merges and decides ownership.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from orchestrator.kube.errors import ApiError, bad_request
from orchestrator.kube.objects import Obj
from orchestrator.kube.patch._util import (
    Schema,
    canonical,
    child_schema,
    copy_json,
    is_atomic_map,
    item_schema,
    json_equal,
)
from orchestrator.kube.patch.fieldpath import (
    Path,
    is_set_list,
    item_element,
    list_keys,
    path_string,
)
from orchestrator.kube.patch.managedfields import (
    Entry,
    created_fields,
    decode_managed_fields,
    diff_members,
    managed_of,
    member_changed,
    sorted_entries,
    tracked_members,
    with_managed,
    without_meta,
)

__all__ = ["BEFORE_FIRST_APPLY", "server_side_apply", "track_update"]


BEFORE_FIRST_APPLY = "before-first-apply"

# --- merging the config into the live object -----------------------------------------------


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def _merge(live: Any, config: Any, schema: Schema) -> Any:
    if isinstance(live, dict) and isinstance(config, dict) and not is_atomic_map(schema):
        out = dict(live)
        for key, value in config.items():
            sub = child_schema(schema, key)
            out[key] = _merge(live[key], value, sub) if key in live else copy_json(value)
        return out
    if isinstance(live, list) and isinstance(config, list):
        keys = list_keys(schema)
        if keys:
            return _merge_keyed(live, config, keys, schema)
        if is_set_list(schema):
            seen = {canonical(v) for v in live}
            return [*live, *(copy_json(v) for v in config if canonical(v) not in seen)]
    return copy_json(config)


def _merge_keyed(live: list[Any], config: list[Any], keys: list[str], schema: Schema) -> list[Any]:
    items = item_schema(schema)
    live_elements = [item_element(v, i, keys, schema) for i, v in enumerate(live)]
    if not all(e.startswith("k:") for e in live_elements):
        return [copy_json(v) for v in config]
    out = list(live)
    position = {e: i for i, e in reversed(list(enumerate(live_elements)))}
    for index, value in enumerate(config):
        element = item_element(value, index, keys, schema)
        if element in position:
            found = position[element]
            out[found] = _merge(out[found], value, items)
        else:
            position[element] = len(out)
            out.append(copy_json(value))
    return out


def _check_config_keys(config: Any, schema: Schema, path: str) -> None:
    """Associative list items in an applied config need their keys, each key once."""
    if isinstance(config, dict):
        if is_atomic_map(schema):
            return
        for key, value in config.items():
            _check_config_keys(value, child_schema(schema, key), f"{path}.{key}")
    elif isinstance(config, list):
        keys = list_keys(schema)
        if not keys:
            return
        seen: set[str] = set()
        for index, value in enumerate(config):
            element = item_element(value, index, keys, schema)
            if not element.startswith("k:"):
                raise ApiError(
                    422,
                    "Invalid",
                    f"{path.lstrip('.')}[{index}]: associative list item must set its key "
                    f"field{'s' if len(keys) > 1 else ''} {', '.join(keys)}",
                )
            if element in seen:
                raise ApiError(
                    422,
                    "Invalid",
                    f"{path.lstrip('.')}[{index}]: duplicate entries for key {element[2:]}",
                )
            seen.add(element)
            _check_config_keys(value, item_schema(schema), f"{path}[{index}]")


def _remove(obj: Any, path: Path, schema: Schema) -> None:
    """Delete the node at `path` from `obj` (in place); a missing node is fine."""
    node = obj
    node_schema = schema
    for depth, element in enumerate(path):
        last = depth == len(path) - 1
        kind, _, rest = element.partition(":")
        if kind == "f":
            if not isinstance(node, dict) or rest not in node:
                return
            if last:
                del node[rest]
                return
            node, node_schema = node[rest], child_schema(node_schema, rest)
            continue
        if not isinstance(node, list):
            return
        keys = list_keys(node_schema)
        found = next(
            (i for i, item in enumerate(node) if _names(element, item, i, keys, node_schema)),
            None,
        )
        if found is None:
            return
        if last:
            del node[found]
            return
        node, node_schema = node[found], item_schema(node_schema)


def _names(element: str, item: Any, index: int, keys: list[str], schema: Schema) -> bool:
    """Whether list path `element` names `item` (at `index`)."""
    kind, _, rest = element.partition(":")
    if kind == "k":
        return item_element(item, index, keys, schema) == element
    if kind == "v":
        return canonical(item) == rest
    return kind == "i" and str(index) == rest


def _copy_obj(obj: Obj) -> Obj:
    out: Obj = copy_json(obj)
    return out


def _prune(out: Obj, remove: set[Path], protected: set[Path], schema: Schema) -> Obj:
    """Remove the paths in `remove` from `out` (owned by the caller, changed in place)."""
    for path in sorted(remove, key=len):
        if any(len(p) > len(path) and p[: len(path)] == path for p in protected):
            continue  # someone still owns something inside it
        if _is_key_field(path):
            continue  # an item's key fields live as long as the item
        _remove(out, path, schema)
    return out


def _is_key_field(path: Path) -> bool:
    if len(path) < 2 or not path[-2].startswith("k:") or not path[-1].startswith("f:"):
        return False
    try:
        keys = json.loads(path[-2][2:])
    except ValueError:
        return False
    return isinstance(keys, dict) and path[-1][2:] in keys


# --- the two operations --------------------------------------------------------------------


def _conflict_error(conflicts: list[tuple[Path, Entry]]) -> ApiError:
    conflicts = sorted(conflicts, key=lambda c: (c[1].printed(), path_string(c[0])))
    causes = [
        {
            "reason": "FieldManagerConflict",
            "message": f"conflict with {entry.printed()}",
            "field": path_string(path),
        }
        for path, entry in conflicts
    ]
    count = len(conflicts)
    if count == 1:
        path, entry = conflicts[0]
        body = f"conflict with {entry.printed()}: {path_string(path)}"
    else:
        lines = []
        current = None
        for path, entry in conflicts:
            if entry.printed() != current:
                current = entry.printed()
                lines.append(f"conflicts with {current}:")
            lines.append(f"- {path_string(path)}")
        body = "\n".join(lines)
    plural = "" if count == 1 else "s"
    return ApiError(
        409, "Conflict", f"Apply failed with {count} conflict{plural}: {body}", {"causes": causes}
    )


def server_side_apply(
    live: Obj | None,
    config: Obj,
    *,
    manager: str,
    schema: Schema,
    force: bool,
    api_version: str,
    now: str,
    subresource: str = "",
    ignored: Collection[Path] = (),
) -> Obj:
    """Apply `config` as `manager` onto `live` (None: create); returns the new object."""
    if not isinstance(config, dict):
        raise bad_request("apply configuration must be a JSON object")
    if not manager:
        raise bad_request("fieldManager is required for apply requests")
    metadata = config.get("metadata")
    if isinstance(metadata, dict) and metadata.get("managedFields"):
        raise bad_request("metadata.managedFields must be nil")
    try:
        return _apply(live, config, manager, schema, force, api_version, now, subresource, ignored)
    except RecursionError:
        raise bad_request("apply configuration is nested too deeply") from None


def _apply(
    live: Obj | None,
    config: Obj,
    manager: str,
    schema: Schema,
    force: bool,
    api_version: str,
    now: str,
    subresource: str,
    ignored: Collection[Path],
) -> Obj:
    config = _drop_nulls(config)
    if subresource == "status":
        config = {"status": config["status"]} if "status" in config else {}
    else:
        config = {k: v for k, v in config.items() if k != "status"}
    _check_config_keys(config, schema, "")
    base = _copy_obj(without_meta(live)) if live is not None else {}
    entries = managed_of(live)
    live_members = tracked_members(base, schema, subresource, ignored) if live is not None else {}
    if live is not None and not entries and live_members:
        entries = [
            Entry(BEFORE_FIRST_APPLY, "Update", api_version, now, "", frozenset(live_members))
        ]

    config_members = tracked_members(config, schema, subresource, ignored)
    config_set = frozenset(config_members)
    merged: Obj = _merge(base, config, schema)
    merged_members = tracked_members(merged, schema, subresource, ignored)

    me = (manager, "Apply", "", subresource)
    previous = next((e for e in entries if e.identity() == me), None)
    others = [e for e in entries if e.identity() != me]

    changed = {p for p in config_set if member_changed(live_members.get(p), merged_members.get(p))}
    conflicts = [(p, e) for e in others for p in sorted(e.fields & changed)]
    if conflicts and not force:
        raise _conflict_error(conflicts)
    if conflicts:
        taken = {p for p, _ in conflicts}
        others = [e.with_fields(e.fields - taken) for e in others]

    owned_by_others: set[Path] = set().union(*(e.fields for e in others))
    last_set = previous.fields if previous is not None else frozenset()
    protected = set(config_set) | owned_by_others
    result = _prune(merged, set(last_set) - protected, protected, schema)

    object_changed = not json_equal(result, base)
    mine = Entry(manager, "Apply", api_version, now, subresource, config_set)
    if (
        previous is not None
        and previous.fields == config_set
        and previous.api_version == api_version
        and not object_changed
    ):
        mine = previous
    new_entries = [*others, mine]
    if live is not None and not object_changed:
        old_managed = sorted_entries(managed_of(live))
        if sorted_entries(new_entries) == old_managed:
            return _copy_obj(live)
    return with_managed(result, new_entries)


def _base_entries(old: Obj | None, new: Obj, owned: bool) -> list[Entry] | None:
    """Where an update's bookkeeping starts; None means "the client cleared managedFields"."""
    metadata = new.get("metadata")
    sent = metadata.get("managedFields") if isinstance(metadata, dict) else None
    if isinstance(sent, list) and sent == [{}]:
        return None
    if isinstance(sent, list) and sent:
        old_meta = old.get("metadata") if isinstance(old, dict) else None
        if isinstance(old_meta, dict) and sent == old_meta.get("managedFields"):
            # The stored list, carried along by a patch: read as stored.
            return managed_of(old, owned=owned)
        try:
            return decode_managed_fields(sent)
        except ApiError:
            pass
    return managed_of(old, owned=owned)


def track_update(
    old: Obj | None,
    new: Obj,
    *,
    manager: str,
    schema: Schema,
    api_version: str,
    now: str,
    subresource: str = "",
    ignored: Collection[Path] = (),
    copy: bool = True,
    share: bool = False,
) -> Obj:
    """Record a create/update/patch by `manager`; returns `new` with updated managedFields.
    `copy=False`: the caller gives up `new` and `old`, so the result may share their values
    (the result's top level and metadata are always new dicts; neither `new` nor `old` is
    modified). `share`: nobody will modify the result, so it may also share a memoized
    FieldsV1 tree (the one every create from one template gets) instead of a copy of it."""
    if not isinstance(new, dict):
        raise bad_request("object must be a JSON object")
    base = _base_entries(old, new, owned=not copy)
    stripped = _copy_obj(without_meta(new)) if copy else without_meta(new)
    if base is None:
        return with_managed(stripped, [])
    changed: set[Path] = set()
    removed: set[Path] = set()
    tree: dict[str, Any] | None = None
    try:
        if old is None:
            created, tree = created_fields(stripped, schema, subresource, ignored)
            changed = set(created)
        else:
            diff_members(old, stripped, schema, (), subresource, ignored, changed, removed)
    except RecursionError:
        raise bad_request("object is nested too deeply") from None
    me = (manager, "Update", api_version, subresource)
    previous = next((e for e in base if e.identity() == me), None)
    gone = changed | removed
    tops = {p[0] for p in gone}
    entries = [
        e.with_fields(e.fields - gone) if not e.isdisjoint(gone, tops) else e
        for e in base
        if e.identity() != me
    ]
    if previous is None:
        # The create's tree, if any, is the encoding of its set: no re-encoding.
        mine = Entry(
            manager, "Update", api_version, now, subresource, frozenset(changed), tree, owned=share
        )
    else:
        fields = (previous.fields | changed) - removed
        mine = previous.with_fields(fields, time=now if changed else previous.time)
    return with_managed(stripped, [*entries, mine])
