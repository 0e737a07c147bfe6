"""managedFields entries and what a write touches: the bookkeeping half of server-side apply.

`Entry` is one `metadata.managedFields` entry (manager, operation, apiVersion, time,
subresource, and the field set it owns, see `fieldpath`). A stored entry keeps its FieldsV1
tree and decodes the set only when asked for it (`Entry.fields`); `isdisjoint` answers from
the tree, so a write that leaves an entry alone never decodes nor re-encodes it.
`decode_managed_fields` parses a client's list (400 on malformed entries), `managed_of` a
stored object's (unreadable lists count as empty, as Kubernetes does), `with_managed` writes
a list back in its canonical order, dropping empty entries.

Which fields a write touches: `tracked_members` lists an object's members,
`diff_members` the members that changed or went away between two objects without walking
equal subtrees, `created_fields` what a create owns (memoized per template, see there).

Ignored fields never enter a set: `apiVersion`, `kind`, the server-owned metadata fields
(`META_IGNORED`) and `status` for the main resource; everything but `status` for the status
subresource; plus the caller's `ignored` path prefixes (tuples of FieldsV1 elements, e.g.
`("f:spec", "f:nodeName")`).

Pure and synchronous; the only global is the `created_fields` cache of pure results.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

import msgpack

from orchestrator.kube.errors import ApiError, bad_request
from orchestrator.kube.objects import Obj
from orchestrator.kube.patch._util import (
    Schema,
    child_schema,
    copy_json,
    is_atomic_map,
    is_declared_field,
    json_equal,
)
from orchestrator.kube.patch.fieldpath import (
    FieldSet,
    Member,
    Path,
    decode_fields_v1,
    encode_fields_v1,
    member_of_field,
    members_of,
)

__all__ = [
    "CREATED_CACHE_SIZE",
    "META_IGNORED",
    "Entry",
    "created_fields",
    "decode_managed_fields",
    "diff_members",
    "is_ignored",
    "managed_of",
    "member_changed",
    "sorted_entries",
    "tracked_members",
    "with_managed",
    "without_meta",
]

META_IGNORED = (
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


class Entry:
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
                fields = frozenset()  # unreadable, as `managed_of` treats the whole list
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

    def with_fields(self, fields: FieldSet, time: str | None = None) -> Entry:
        return Entry(
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


def decode_managed_fields(value: Any, *, stored: bool = False, owned: bool = False) -> list[Entry]:
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
        if stored and isinstance(tree, dict):  # decoded when needed (see `Entry`)
            entry = Entry(
                manager, operation, api_version, time, subresource, None, tree, owned=owned
            )
        else:
            fields = decode_fields_v1(tree)
            entry = Entry(manager, operation, api_version, time, subresource, fields)
        entries.append(entry)
    return entries


def sorted_entries(entries: Iterable[Entry]) -> list[Obj]:
    kept = [e for e in entries if e.nonempty()]
    kept.sort(key=lambda e: (e.operation, e.time, e.manager, e.subresource, e.api_version))
    return [e.encode() for e in kept]


def managed_of(obj: Obj | None, *, owned: bool = False) -> list[Entry]:
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


def is_ignored(path: Path, subresource: str, ignored: Collection[Path]) -> bool:
    if subresource == "status":
        if path[0] != "f:status":
            return True
    elif path[0] in ("f:apiVersion", "f:kind", "f:status"):
        return True
    if path[0] == "f:metadata" and len(path) > 1 and path[1][2:] in META_IGNORED:
        return True
    return bool(ignored) and any(path[: len(prefix)] == prefix for prefix in ignored)


def tracked_members(
    obj: Obj | None, schema: Schema, subresource: str, ignored: Collection[Path]
) -> dict[Path, Member]:
    if obj is None:
        return {}
    return {
        p: m for p, m in members_of(obj, schema).items() if not is_ignored(p, subresource, ignored)
    }


def member_changed(before: Member | None, after: Member | None) -> bool:
    if before is None or after is None:
        return before is not after
    if before.leaf != after.leaf:
        return True
    return before.leaf and not json_equal(before.value, after.value)


def diff_members(
    old: Obj,
    new: Obj,
    schema: Schema,
    path: Path,
    subresource: str,
    ignored: Collection[Path],
    changed: set[Path],
    removed: set[Path],
) -> None:
    """Add to `changed`/`removed` what comparing `tracked_members` of two whole objects would give,
    for the granular maps `old` and `new` at `path` — without walking equal subtrees.

    Why it is the same: the members under field `f:key` of a granular map depend only on that
    field's value (and schema), so a field whose value is JSON-equal on both sides has equal
    members and contributes nothing; ignored paths are closed downwards (`is_ignored` looks
    at a prefix), so an ignored field's subtree is skipped whole. Two granular maps are
    compared field by field; anything else is walked as `_walk` would and compared member by
    member. A granular map's own member (present when it is `{}` or not a declared property,
    never a leaf) counts only by its presence."""
    for key, nv in new.items():
        sub = (*path, f"f:{key}")
        if is_ignored(sub, subresource, ignored):
            continue
        if key in old:
            ov = old[key]
            if json_equal(ov, nv):
                continue
            child_s = child_schema(schema, key)
            if isinstance(ov, dict) and isinstance(nv, dict) and not is_atomic_map(child_s):
                diff_members(ov, nv, child_s, sub, subresource, ignored, changed, removed)
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
            changed.update(p for p, m in after.items() if member_changed(before.get(p), m))
            removed.update(p for p in before if p not in after)
        else:  # a new field: all its members are (`member_changed(None, m)`)
            changed.update(after)
    for key, ov in old.items():
        if key not in new:
            sub = (*path, f"f:{key}")
            if not is_ignored(sub, subresource, ignored):
                removed.update(_field_members(ov, key, schema, sub, subresource, ignored))


CREATED_CACHE_SIZE = 256
_created: dict[tuple[int, str, str, bytes], tuple[Schema, FieldSet, dict[str, Any]]] = {}


def created_fields(
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
    diff_members({}, new, schema, (), subresource, ignored, changed, set())
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
        kept = {k: v for k, v in meta.items() if k not in META_IGNORED}
        return ["", rest, "metadata" in new, kept, not meta]
    return ["", rest, "metadata" in new, meta]


def _field_members(
    value: Any, key: str, schema: Schema, sub: Path, subresource: str, ignored: Collection[Path]
) -> dict[Path, Member]:
    """The (not ignored) members a granular map's field `key` with `value` contributes."""
    found = member_of_field(value, key, schema, sub)
    if not ignored and sub[0] != "f:metadata":
        # `is_ignored` reads only a path's first element (and the second under metadata) and
        # the `ignored` prefixes, so under a kept field outside metadata nothing is ignored
        # (and callers pass a kept field: `diff_members` skips ignored ones).
        return found
    return {p: m for p, m in found.items() if not is_ignored(p, subresource, ignored)}


def without_meta(obj: Obj) -> Obj:
    out = dict(obj)
    metadata = out.get("metadata")
    if isinstance(metadata, dict):
        out["metadata"] = {k: v for k, v in metadata.items() if k != "managedFields"}
    return out


def with_managed(obj: Obj, entries: Iterable[Entry]) -> Obj:
    encoded = sorted_entries(entries)
    metadata = obj.get("metadata")
    metadata = dict(metadata) if isinstance(metadata, dict) else {}
    if encoded:
        metadata["managedFields"] = encoded
    else:
        metadata.pop("managedFields", None)
    if metadata or "metadata" in obj:
        obj = {**obj, "metadata": metadata}
    return obj
