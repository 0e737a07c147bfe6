"""How a write turns into the object that is stored: create/update preparation (pure).

The rules every kind shares, in one place:
* Create: the server sets uid, creationTimestamp, generation 1 and resolves generateName; it drops
  `resourceVersion`, `deletionTimestamp` and `status` when the kind has a status subresource
  (status is the system's, written through `/status`), keeping status for kinds whose status is
  written with the object (Node, CRD status set by the server itself).
* Update of the main resource: status changes are ignored (the old status is kept); of the
  status subresource: only status changes are taken. Server-owned metadata (uid,
  creationTimestamp, deletionTimestamp, deletionGracePeriodSeconds, generation) is never taken
  from the client. `generation` is bumped when anything outside metadata and status changed.
* `same_object` says whether a write would change nothing, so the server can skip it and keep
  the resourceVersion (what makes applying the same manifest twice a no-op).
"""

from __future__ import annotations

import uuid
from typing import Any

from orchestrator.kube.jsonvalue import copy_json
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.kind import Kind

_SERVER_META = (
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
)
# Fields that change on every write, or are bookkeeping: ignored when asking "did it change?".
_VOLATILE_META = ("resourceVersion", "managedFields", "generation")
# Kinds whose creator legitimately sets status in the same request.
_STATUS_ON_CREATE = {("", "nodes")}


def has_status(kind: Kind) -> bool:
    return "status" in kind.subresources


def content(obj: Obj) -> Obj:
    """Everything that counts as 'spec' for generation: all but metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def prepare_create(kind: Kind, obj: Obj, *, now: str, name: str, copy: bool = True) -> Obj:
    """The object to store for a create of client input `obj` (not mutated). `copy=False`:
    only the result's top level and metadata are new dicts, the rest is shared with `obj` — for
    a caller that copies it next anyway (admission's validation builds a new object)."""
    if copy:
        out: Obj = copy_json(obj)
        meta = out.setdefault("metadata", {})
    else:
        out = dict(obj)
        meta = out["metadata"] = dict(obj.get("metadata") or {})
    meta["name"] = name
    meta["uid"] = str(uuid.uuid4())
    meta["creationTimestamp"] = now
    meta["generation"] = 1
    for key in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
        meta.pop(key, None)
    if not kind.namespaced:
        meta.pop("namespace", None)
    if has_status(kind) and (kind.group, kind.plural) not in _STATUS_ON_CREATE:
        out.pop("status", None)
    out["apiVersion"] = kind.api_version
    out["kind"] = kind.kind
    return out


def prepare_update(kind: Kind, new: Obj, old: Obj, *, subresource: str, copy: bool = True) -> Obj:
    """The object to store for an update of `old` with client input `new` (neither mutated).
    `copy=False`: only the result's top level and metadata are new dicts, the rest is shared
    with `new` and `old` — for a caller that copies it next anyway (admission's validation
    builds a new object) and meanwhile changes at most top-level and metadata keys."""
    dup = copy_json if copy else _same
    if subresource == "status":
        out: Obj = dup(old) if copy else {**old, "metadata": dict(old.get("metadata") or {})}
        if "status" in new:
            out["status"] = dup(new["status"])
        else:
            out.pop("status", None)
        return out
    if copy:
        out = copy_json(new)
        meta = out.setdefault("metadata", {})
    else:
        out = dict(new)
        meta = out["metadata"] = dict(new.get("metadata") or {})
    old_meta = old.get("metadata", {})
    for key in _SERVER_META:
        if key in old_meta:
            meta[key] = dup(old_meta[key])
        else:
            meta.pop(key, None)
    meta.pop("selfLink", None)
    if has_status(kind):
        if "status" in old:
            out["status"] = dup(old["status"])
        else:
            out.pop("status", None)
    if content(out) != content(old):
        meta["generation"] = int(old_meta.get("generation", 1)) + 1
    out["apiVersion"] = kind.api_version
    out["kind"] = kind.kind
    return out


def _same(value: Any) -> Any:
    return value


def _comparable(obj: Obj) -> Obj:
    meta = {k: v for k, v in obj.get("metadata", {}).items() if k not in _VOLATILE_META}
    return {**obj, "metadata": meta}


def same_object(a: Obj, b: Obj) -> bool:
    """True when storing `a` over `b` would change nothing a client could observe."""
    if a.get("status") != b.get("status"):
        return False  # the usual difference (a status write), found before the rest is compared
    if _comparable(a) != _comparable(b):
        return False
    # managedFields count too, but not their timestamps.
    return _fields_without_time(a) == _fields_without_time(b)


def _fields_without_time(obj: Obj) -> list[Any]:
    entries = obj.get("metadata", {}).get("managedFields") or []
    return [
        {k: v for k, v in e.items() if k != "time"} if isinstance(e, dict) else e for e in entries
    ]
