"""Objects in the MVCC store: key layout, encoding, resourceVersion, and store errors as Status.

Key layout (etcd's, as the API server uses it): `/registry/<group or "core">/<plural>/<ns>/<name>`
for namespaced kinds and `/registry/<group>/<plural>/<name>` for cluster-scoped ones; all
versions of one resource share keys. Values are msgpack of the object WITHOUT
`metadata.resourceVersion`: an object's resourceVersion is the store's `mod_revision` of its key,
set when it is read, so it can never disagree with the store.

Invariants: every write is a compare-and-swap against the revision the caller read (or a create
that fails when the key exists), so concurrent writers never silently overwrite each other; store
failures surface as Status errors (409, 410, 413, 429/503, 504), never as a 500.
"""

from __future__ import annotations

from typing import Any

import msgpack

from ..store import types as st
from ..store.api import ListResult, Store
from ..store.watch import Watcher
from . import errors
from .schema.kind import Kind

Obj = dict[str, Any]


def prefix_of(kind: Kind, namespace: str = "") -> str:
    base = f"/registry/{kind.group or 'core'}/{kind.plural}/"
    return f"{base}{namespace}/" if kind.namespaced and namespace else base


def key_of(kind: Kind, namespace: str, name: str) -> str:
    if kind.namespaced:
        return f"/registry/{kind.group or 'core'}/{kind.plural}/{namespace}/{name}"
    return f"/registry/{kind.group or 'core'}/{kind.plural}/{name}"


def encode(obj: Obj) -> bytes:
    meta = obj.get("metadata") or {}
    if "resourceVersion" in meta:
        obj = {**obj, "metadata": {k: v for k, v in meta.items() if k != "resourceVersion"}}
    try:
        data: bytes = msgpack.packb(obj, use_bin_type=True)
    except (OverflowError, TypeError, ValueError) as exc:
        raise errors.bad_request(f"the object cannot be stored: {exc}") from exc
    return data


def decode(kv: st.KeyValue) -> Obj:
    obj: Obj = msgpack.unpackb(kv.value, raw=False)
    obj.setdefault("metadata", {})["resourceVersion"] = str(kv.mod_revision)
    return obj


def decode_prev(kv: st.KeyValue, revision: int) -> Obj:
    """The last state of a deleted object, carrying the deleting revision (as watch DELETED)."""
    obj: Obj = msgpack.unpackb(kv.value, raw=False)
    obj.setdefault("metadata", {})["resourceVersion"] = str(revision)
    return obj


def store_error(exc: st.StoreError, kind: Kind, name: str) -> errors.ApiError:
    """Map a store failure to the Status a Kubernetes client understands."""
    if isinstance(exc, st.KeyExists):
        return errors.already_exists(kind.plural, kind.group, name)
    if isinstance(exc, st.KeyNotFound):
        return errors.not_found(kind.plural, kind.group, name)
    if isinstance(exc, st.Conflict):
        return errors.conflict(kind.plural, kind.group, name)
    if isinstance(exc, st.Compacted):
        return errors.expired(
            f"The resourceVersion for the provided list is too old (compacted at "
            f"{exc.compact_revision}); re-list without a continue token"
        )
    if isinstance(exc, st.TooLarge):
        return errors.too_large(f"{kind.resource} {name!r} is too large to store: {exc}")
    if isinstance(exc, st.QuotaExceeded):
        return errors.ApiError(
            507, "InsufficientStorage", f"the store is full ({exc}): delete objects to free space"
        )
    if isinstance(exc, st.NoQuorum | st.Unavailable):
        return errors.service_unavailable(f"the store cannot serve the request: {exc}")
    if isinstance(exc, st.FutureRevision):
        return errors.timeout(f"Too large resource version: {exc}")
    return errors.bad_request(f"store: {exc}")


class ObjectStore:
    """Typed access to the store for one API server; all methods raise `ApiError` on failure."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def get(self, kind: Kind, namespace: str, name: str, *, stale_ok: bool = False) -> Obj:
        try:
            kv = await self.store.get(key_of(kind, namespace, name), linearizable=not stale_ok)
        except st.StoreError as exc:
            raise store_error(exc, kind, name) from exc
        if kv is None:
            raise errors.not_found(kind.plural, kind.group, name)
        return decode(kv)

    async def list(
        self,
        kind: Kind,
        namespace: str,
        *,
        limit: int = 0,
        continue_token: str | None = None,
        stale_ok: bool = False,
    ) -> tuple[list[Obj], ListResult]:
        try:
            res = await self.store.list(
                prefix_of(kind, namespace),
                limit=limit,
                continue_token=continue_token,
                linearizable=not stale_ok,
            )
        except st.InvalidRequest as exc:
            raise errors.bad_request(str(exc)) from exc
        except st.StoreError as exc:
            raise store_error(exc, kind, "") from exc
        return [decode(kv) for kv in res.kvs], res

    async def create(self, kind: Kind, obj: Obj) -> Obj:
        meta = obj["metadata"]
        try:
            kv = await self.store.create(
                key_of(kind, meta.get("namespace", ""), meta["name"]), encode(obj)
            )
        except st.StoreError as exc:
            raise store_error(exc, kind, meta["name"]) from exc
        return {**obj, "metadata": {**meta, "resourceVersion": str(kv.mod_revision)}}

    async def update(self, kind: Kind, obj: Obj, expected_rv: int) -> Obj:
        meta = obj["metadata"]
        try:
            kv = await self.store.update(
                key_of(kind, meta.get("namespace", ""), meta["name"]),
                encode(obj),
                expected_mod_revision=expected_rv,
            )
        except st.StoreError as exc:
            raise store_error(exc, kind, meta["name"]) from exc
        return {**obj, "metadata": {**meta, "resourceVersion": str(kv.mod_revision)}}

    async def delete(self, kind: Kind, namespace: str, name: str, expected_rv: int) -> None:
        """Delete the object if it is still at `expected_rv` (Conflict otherwise)."""
        try:
            await self.store.delete(
                key_of(kind, namespace, name), expected_mod_revision=expected_rv
            )
        except st.StoreError as exc:
            raise store_error(exc, kind, name) from exc

    async def revision(self, *, stale_ok: bool = False) -> int:
        try:
            return await self.store.current_revision(linearizable=not stale_ok)
        except st.StoreError as exc:
            raise errors.service_unavailable(str(exc)) from exc

    def watch(self, kind: Kind, namespace: str, start_revision: int, *, bookmarks: bool) -> Watcher:
        return self.store.watch(
            prefix_of(kind, namespace), start_revision, progress_notify=bookmarks
        )
