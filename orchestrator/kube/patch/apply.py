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

Ignored fields never enter a set: `apiVersion`, `kind`, the server-owned metadata fields and
`status` for the main resource; everything but `status` for the status subresource; plus the
caller's `ignored` path prefixes (tuples of FieldsV1 elements, e.g. `("f:spec", "f:nodeName")`).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable
from typing import Any

import msgpack

from orchestrator.kube.errors import ApiError, bad_request
from orchestrator.kube.objects import Obj
from orchestrator.kube.patch._util import (
    Schema,
    canonical,
    child_schema,
    copy_json,
    is_atomic_map,
    is_declared_field,
    item_schema,
    json_equal,
)
from orchestrator.kube.patch.fieldpath import (
    FieldSet,
    Member,
    Path,
    decode_fields_v1,
    encode_fields_v1,
    is_set_list,
    item_element,
    list_keys,
    member_of_field,
    members_of,
    path_string,
)

__all__ = ["BEFORE_FIRST_APPLY", "decode_managed_fields", "server_side_apply", "track_update"]


BEFORE_FIRST_APPLY = "before-first-apply"

_META_IGNORED = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
)


class _Entry:
    """One managedFields entry. A stored entry's field set is decoded from its FieldsV1 `tree`
    only when something needs the set itself: an update that leaves the entry alone (a status
    write and the spec owner's entry) asks only `isdisjoint` and writes the tree back as it is.
    `tree`, when set, is the encoding of `fields` (never of another set); `owned`: it may go
    into the result without a copy (the caller gave up the object it came from)."""

    __slots__ = (
        "_fields",
        "api_version",
        "manager",
        "operation",
        "owned",
        "subresource",
        "time",
        "tree",
    )

    def __init__(
        self,
        manager: str,
        operation: str,  # "Apply" | "Update"
        api_version: str,
        time: str,
        subresource: str,
        fields: FieldSet | None,
        tree: dict[str, Any] | None = None,
        *,
        owned: bool = False,
    ) -> None:
        assert fields is not None or tree is not None
        self.manager = manager
        self.operation = operation
        self.api_version = api_version
        self.time = time
        self.subresource = subresource
        self._fields = fields
        self.tree: dict[str, Any] | None = tree
        self.owned = owned

    @property
    def fields(self) -> FieldSet:
        fields = self._fields
        if fields is None:
            assert self.tree is not None
            try:
                fields = decode_fields_v1(self.tree, canonical=True)
            except ApiError:
                fields = frozenset()  # unreadable, as `_managed_of` treats the whole list
            self._fields = fields
        return fields

    def isdisjoint(self, paths: Collection[Path], tops: Collection[str] = ()) -> bool:
        """Whether no path of `paths` is in the set; `tops`, if given, holds their first
        elements (a status write's are all "f:status", a top field most trees lack)."""
        tree = self.tree
        if self._fields is None and tree is not None:
            if tops and tree.keys().isdisjoint(tops):
                return True
            return not any(_tree_has(tree, p) for p in paths)
        return self.fields.isdisjoint(paths)

    def nonempty(self) -> bool:
        if self._fields is None and self.tree is not None:
            return bool(self.tree)
        return bool(self.fields)

    def with_fields(self, fields: FieldSet, time: str | None = None) -> _Entry:
        return _Entry(
            self.manager,
            self.operation,
            self.api_version,
            self.time if time is None else time,
            self.subresource,
            fields,
        )

    def identity(self) -> tuple[str, str, str, str]:
        version = "" if self.operation == "Apply" else self.api_version
        return (self.manager, self.operation, version, self.subresource)

    def printed(self) -> str:
        if self.operation == "Update":
            return f'"{self.manager}" using {self.api_version}'
        return f'"{self.manager}"'

    def encode(self) -> Obj:
        out: Obj = {"manager": self.manager, "operation": self.operation}
        if self.api_version:
            out["apiVersion"] = self.api_version
        if self.time:
            out["time"] = self.time
        out["fieldsType"] = "FieldsV1"
        if self.tree is not None:
            out["fieldsV1"] = self.tree if self.owned else copy_json(self.tree)
        else:
            out["fieldsV1"] = encode_fields_v1(self.fields)
        if self.subresource:
            out["subresource"] = self.subresource
        return out


def _tree_has(tree: dict[str, Any], path: Path) -> bool:
    """Whether `path` is in the set the canonical FieldsV1 `tree` encodes (see
    `decode_fields_v1`: a member is an empty leaf or a node holding `"."`)."""
    node: Any = tree
    for element in path:
        node = node.get(element)
        if type(node) is not dict:
            return False
    return not node or "." in node


def _text(entry: dict[str, Any], key: str) -> str:
    value = entry.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise bad_request(f"managedFields: {key} must be a string")
    return value


def decode_managed_fields(value: Any, *, stored: bool = False, owned: bool = False) -> list[_Entry]:
    """Parse `metadata.managedFields`; malformed entries are a 400 BadRequest. `stored`: they
    come from a stored object, so each fieldsV1 tree is `encode_fields_v1` of its set (this
    module wrote it), decoded only when needed and written back as it is while the set stays
    the same; `owned`: without a copy (the caller gives the stored object up)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise bad_request("metadata.managedFields must be a list")
    entries = []
    for raw in value:
        if not isinstance(raw, dict):
            raise bad_request("metadata.managedFields entries must be objects")
        operation = _text(raw, "operation")
        if operation not in ("Apply", "Update"):
            raise bad_request('managedFields: operation must be "Apply" or "Update"')
        fields_type = raw.get("fieldsType", "FieldsV1")
        if fields_type != "FieldsV1":
            raise bad_request('managedFields: fieldsType must be "FieldsV1"')
        tree = raw.get("fieldsV1", {})
        manager, api_version = _text(raw, "manager"), _text(raw, "apiVersion")
        time, subresource = _text(raw, "time"), _text(raw, "subresource")
        if stored and isinstance(tree, dict):  # decoded when needed (see `_Entry`)
            entry = _Entry(
                manager, operation, api_version, time, subresource, None, tree, owned=owned
            )
        else:
            fields = decode_fields_v1(tree)
            entry = _Entry(manager, operation, api_version, time, subresource, fields)
        entries.append(entry)
    return entries


def _sorted_entries(entries: Iterable[_Entry]) -> list[Obj]:
    kept = [e for e in entries if e.nonempty()]
    kept.sort(key=lambda e: (e.operation, e.time, e.manager, e.subresource, e.api_version))
    return [e.encode() for e in kept]


def _managed_of(obj: Obj | None, *, owned: bool = False) -> list[_Entry]:
    """The managedFields of a stored object; unreadable ones are dropped, as Kubernetes does.
    `owned`: the caller gives `obj` up, so its trees may go into the result uncopied."""
    if obj is None:
        return []
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict):
        return []
    try:
        return decode_managed_fields(metadata.get("managedFields"), stored=True, owned=owned)
    except ApiError:
        return []


# --- ignored fields ------------------------------------------------------------------------


def _is_ignored(path: Path, subresource: str, ignored: Collection[Path]) -> bool:
    if subresource == "status":
        if path[0] != "f:status":
            return True
    elif path[0] in ("f:apiVersion", "f:kind", "f:status"):
        return True
    if path[0] == "f:metadata" and len(path) > 1 and path[1][2:] in _META_IGNORED:
        return True
    return bool(ignored) and any(path[: len(prefix)] == prefix for prefix in ignored)


def _members(
    obj: Obj | None, schema: Schema, subresource: str, ignored: Collection[Path]
) -> dict[Path, Member]:
    if obj is None:
        return {}
    return {
        p: m for p, m in members_of(obj, schema).items() if not _is_ignored(p, subresource, ignored)
    }


def _changed(before: Member | None, after: Member | None) -> bool:
    if before is None or after is None:
        return before is not after
    if before.leaf != after.leaf:
        return True
    return before.leaf and not json_equal(before.value, after.value)


def _diff_members(
    old: Obj,
    new: Obj,
    schema: Schema,
    path: Path,
    subresource: str,
    ignored: Collection[Path],
    changed: set[Path],
    removed: set[Path],
) -> None:
    """Add to `changed`/`removed` what comparing `_members` of two whole objects would give,
    for the granular maps `old` and `new` at `path` — without walking equal subtrees.

    Why it is the same: the members under field `f:key` of a granular map depend only on that
    field's value (and schema), so a field whose value is JSON-equal on both sides has equal
    members and contributes nothing; ignored paths are closed downwards (`_is_ignored` looks
    at a prefix), so an ignored field's subtree is skipped whole. Two granular maps are
    compared field by field; anything else is walked as `_walk` would and compared member by
    member. A granular map's own member (present when it is `{}` or not a declared property,
    never a leaf) counts only by its presence."""
    for key, nv in new.items():
        sub = (*path, f"f:{key}")
        if _is_ignored(sub, subresource, ignored):
            continue
        if key in old:
            ov = old[key]
            if json_equal(ov, nv):
                continue
            child_s = child_schema(schema, key)
            if isinstance(ov, dict) and isinstance(nv, dict) and not is_atomic_map(child_s):
                _diff_members(ov, nv, child_s, sub, subresource, ignored, changed, removed)
                undeclared = not is_declared_field(schema, key)
                had, has = undeclared or not ov, undeclared or not nv
                if has and not had:
                    changed.add(sub)
                elif had and not has:
                    removed.add(sub)
                continue
            before = _field_members(ov, key, schema, sub, subresource, ignored)
        else:
            before = {}
        after = _field_members(nv, key, schema, sub, subresource, ignored)
        if before:
            changed.update(p for p, m in after.items() if _changed(before.get(p), m))
            removed.update(p for p in before if p not in after)
        else:  # a new field: all its members are (`_changed(None, m)`)
            changed.update(after)
    for key, ov in old.items():
        if key not in new:
            sub = (*path, f"f:{key}")
            if not _is_ignored(sub, subresource, ignored):
                removed.update(_field_members(ov, key, schema, sub, subresource, ignored))


CREATED_CACHE_SIZE = 256
_created: dict[tuple[int, str, str, bytes], tuple[Schema, FieldSet, dict[str, Any]]] = {}


def _created_fields(
    new: Obj, schema: Schema, subresource: str, ignored: Collection[Path]
) -> tuple[FieldSet, dict[str, Any]]:
    """Every (not ignored) member of `new` — what a create owns — and its FieldsV1 tree.

    Memoized by the msgpack encoding of what the members depend on: the object less its
    ignored parts (apiVersion, kind, status, server-owned metadata, with whether metadata was
    empty, which decides its own membership), with the schema, subresource and ignored
    prefixes. msgpack keeps JSON's types apart (bools, ints, floats), so equal bytes mean equal
    values; it is several times cheaper than canonical JSON, and the one thing it adds, key
    order, only costs a miss. Objects a controller creates from one template differ only in
    ignored metadata (name, uid, creationTimestamp), so they are walked and encoded once."""
    try:
        text: bytes | None = msgpack.packb(_created_key(new, subresource))
    except (TypeError, ValueError, OverflowError, RecursionError):
        text = None
    ident = (id(schema), subresource, repr(tuple(ignored)), text or b"")
    hit = _created.get(ident) if text is not None else None
    if hit is not None and hit[0] is schema:
        return hit[1], hit[2]
    changed: set[Path] = set()
    _diff_members({}, new, schema, (), subresource, ignored, changed, set())
    fields = frozenset(changed)
    tree = encode_fields_v1(fields)
    if text is not None:
        _created[ident] = (schema, fields, tree)  # keeps `schema` alive: its id stays its own
        if len(_created) > CREATED_CACHE_SIZE:
            del _created[next(iter(_created))]
    return fields, tree


def _created_key(new: Obj, subresource: str) -> Any:
    if subresource == "status":
        return ["status", "status" in new, new.get("status")]
    rest = {k: v for k, v in new.items() if k not in ("apiVersion", "kind", "status", "metadata")}
    meta = new.get("metadata")
    if isinstance(meta, dict):
        kept = {k: v for k, v in meta.items() if k not in _META_IGNORED}
        return ["", rest, "metadata" in new, kept, not meta]
    return ["", rest, "metadata" in new, meta]


def _field_members(
    value: Any, key: str, schema: Schema, sub: Path, subresource: str, ignored: Collection[Path]
) -> dict[Path, Member]:
    """The (not ignored) members a granular map's field `key` with `value` contributes."""
    found = member_of_field(value, key, schema, sub)
    if not ignored and sub[0] != "f:metadata":
        # `_is_ignored` reads only a path's first element (and the second under metadata) and
        # the `ignored` prefixes, so under a kept field outside metadata nothing is ignored
        # (and callers pass a kept field: `_diff_members` skips ignored ones).
        return found
    return {p: m for p, m in found.items() if not _is_ignored(p, subresource, ignored)}


def _without_meta(obj: Obj) -> Obj:
    out = dict(obj)
    metadata = out.get("metadata")
    if isinstance(metadata, dict):
        out["metadata"] = {k: v for k, v in metadata.items() if k != "managedFields"}
    return out


def _with_managed(obj: Obj, entries: Iterable[_Entry]) -> Obj:
    encoded = _sorted_entries(entries)
    metadata = obj.get("metadata")
    metadata = dict(metadata) if isinstance(metadata, dict) else {}
    if encoded:
        metadata["managedFields"] = encoded
    else:
        metadata.pop("managedFields", None)
    if metadata or "metadata" in obj:
        obj = {**obj, "metadata": metadata}
    return obj


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


def _conflict_error(conflicts: list[tuple[Path, _Entry]]) -> ApiError:
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
    base = _copy_obj(_without_meta(live)) if live is not None else {}
    entries = _managed_of(live)
    live_members = _members(base, schema, subresource, ignored) if live is not None else {}
    if live is not None and not entries and live_members:
        entries = [
            _Entry(BEFORE_FIRST_APPLY, "Update", api_version, now, "", frozenset(live_members))
        ]

    config_members = _members(config, schema, subresource, ignored)
    config_set = frozenset(config_members)
    merged: Obj = _merge(base, config, schema)
    merged_members = _members(merged, schema, subresource, ignored)

    me = (manager, "Apply", "", subresource)
    previous = next((e for e in entries if e.identity() == me), None)
    others = [e for e in entries if e.identity() != me]

    changed = {p for p in config_set if _changed(live_members.get(p), merged_members.get(p))}
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
    mine = _Entry(manager, "Apply", api_version, now, subresource, config_set)
    if (
        previous is not None
        and previous.fields == config_set
        and previous.api_version == api_version
        and not object_changed
    ):
        mine = previous
    new_entries = [*others, mine]
    if live is not None and not object_changed:
        old_managed = _sorted_entries(_managed_of(live))
        if _sorted_entries(new_entries) == old_managed:
            return _copy_obj(live)
    return _with_managed(result, new_entries)


def _base_entries(old: Obj | None, new: Obj, owned: bool) -> list[_Entry] | None:
    """Where an update's bookkeeping starts; None means "the client cleared managedFields"."""
    metadata = new.get("metadata")
    sent = metadata.get("managedFields") if isinstance(metadata, dict) else None
    if isinstance(sent, list) and sent == [{}]:
        return None
    if isinstance(sent, list) and sent:
        old_meta = old.get("metadata") if isinstance(old, dict) else None
        if isinstance(old_meta, dict) and sent == old_meta.get("managedFields"):
            # The stored list, carried along by a patch: read as stored.
            return _managed_of(old, owned=owned)
        try:
            return decode_managed_fields(sent)
        except ApiError:
            pass
    return _managed_of(old, owned=owned)


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
    stripped = _copy_obj(_without_meta(new)) if copy else _without_meta(new)
    if base is None:
        return _with_managed(stripped, [])
    changed: set[Path] = set()
    removed: set[Path] = set()
    tree: dict[str, Any] | None = None
    try:
        if old is None:
            created, tree = _created_fields(stripped, schema, subresource, ignored)
            changed = set(created)
        else:
            _diff_members(old, stripped, schema, (), subresource, ignored, changed, removed)
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
        mine = _Entry(
            manager, "Update", api_version, now, subresource, frozenset(changed), tree, owned=share
        )
    else:
        fields = (previous.fields | changed) - removed
        mine = previous.with_fields(fields, time=now if changed else previous.time)
    return _with_managed(stripped, [*entries, mine])
