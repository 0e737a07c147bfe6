"""`Api`: the verbs on resources — get, list, create, update, patch, delete, deletecollection,
and the status, scale and binding subresources — in one transport-free facade. The HTTP app
and the in-process client both call it, so every caller goes through authorization, admission
and validation. Watch is `watch.open_watch` (a stream, not a call).

Theory of operation
-------------------
A write is: authorize -> build the proposed object (body, or patch applied to the live object)
-> `strategy` (server-owned metadata, spec/status split, generation) -> admission (schema
validation with pruning and defaults, kind defaults, metadata and kind checks, node restriction:
`handler.Handler.admit`) -> managedFields -> store. Writes of an existing object run in the
compare-and-swap loop of `update.guaranteed_update`. Each verb family is a module of its own
(`get`, `create`, `update`, `patch`, `delete`, `scale`, `binding`), a function of the
`handler.Handler` the facade is; the options arrive typed (`options`).

Invariants: nothing is stored unless the whole pipeline accepted it (every failure leaves the
store unchanged); a write that would change nothing is not stored (the resourceVersion stays);
an object with a deletionTimestamp is removed exactly when its last finalizer goes (for a
Namespace: the last of `metadata.finalizers` and `spec.finalizers`).
"""

from __future__ import annotations

from typing import Any

from orchestrator.apiserver import binding, create, delete, get, patch, scale, update
from orchestrator.apiserver.handler import Call, Handler
from orchestrator.apiserver.options import ListOptions
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.kind import Kind

__all__ = ["Api"]


class Api(Handler):
    """The verbs; each raises `ApiError` (a Status) for every refusal or failure."""

    # ------------------------------------------------------------------ reads
    async def get(self, call: Call, kind: Kind, ns: str, name: str, *, rv: str = "") -> Obj:
        return await get.get_object(self, call, kind, ns, name, rv=rv)

    async def list_objects(self, call: Call, kind: Kind, ns: str, opts: ListOptions) -> Obj:
        """The list verb: a `<Kind>List`."""
        return await get.list_objects(self, call, kind, ns, opts)

    async def list_json(self, call: Call, kind: Kind, ns: str, opts: ListOptions) -> list[bytes]:
        """The list verb's `<Kind>List` as JSON, in pieces (each object encoded as it is read)."""
        return await get.list_json(self, call, kind, ns, opts)

    async def list_table_json(
        self, call: Call, kind: Kind, ns: str, opts: ListOptions, include_object: str
    ) -> list[bytes]:
        """The list verb as a Table, as JSON in pieces (`include_object`: the query's)."""
        return await get.list_table_json(self, call, kind, ns, opts, include_object)

    # ------------------------------------------------------------------ writes
    async def create(self, call: Call, kind: Kind, ns: str, body: Any) -> Obj:
        return await create.create_object(self, call, kind, ns, body)

    async def update(
        self, call: Call, kind: Kind, ns: str, name: str, body: Any, sub: str = ""
    ) -> tuple[Obj, bool]:
        """The object, and whether it was created (never, today: an update needs the object)."""
        return await update.update_object(self, call, kind, ns, name, body, sub)

    async def patch(
        self,
        call: Call,
        kind: Kind,
        ns: str,
        name: str,
        content_type: str,
        body: Any,
        sub: str = "",
    ) -> tuple[Obj, bool]:
        """The object, and whether it was created (a server-side apply of a missing one)."""
        return await patch.patch_object(self, call, kind, ns, name, content_type, body, sub)

    async def delete(
        self, call: Call, kind: Kind, ns: str, name: str, options: Any
    ) -> tuple[Obj, int]:
        """Delete (or start deleting) one object; returns the reply and its HTTP code."""
        return await delete.delete_object(self, call, kind, ns, name, options)

    async def delete_collection(
        self, call: Call, kind: Kind, ns: str, opts: ListOptions, options: Any
    ) -> Obj:
        return await delete.delete_collection(self, call, kind, ns, opts, options)

    # ------------------------------------------------------------------ subresources
    async def get_scale(self, call: Call, kind: Kind, ns: str, name: str) -> Obj:
        return await scale.get_scale(self, call, kind, ns, name)

    async def write_scale(
        self, call: Call, kind: Kind, ns: str, name: str, body: Any, content_type: str | None
    ) -> Obj:
        """PUT (content_type None) or PATCH of the scale subresource."""
        return await scale.write_scale(self, call, kind, ns, name, body, content_type)

    async def bind(self, call: Call, kind: Kind, ns: str, name: str, body: Any) -> Obj:
        return await binding.bind(self, call, kind, ns, name, body)
