"""The update verb (kube-apiserver's update.go) and the compare-and-swap loop every write of an
existing object goes through (`guaranteed_update`, the apiserver's GuaranteedUpdate): patch,
apply, scale and the finalizer-completing updates use it too.

Theory of operation
-------------------
`guaranteed_update` reads the live object, lets the verb `mutate` it into the proposed one,
runs `strategy.prepare_update` (spec/status split, generation, server-owned metadata) and
admission, tracks managedFields, and stores it conditionally on the revision it read; on a
conflict it re-reads and recomputes, unless the client itself named a resourceVersion, in
which case the 409 is the client's. The first read is local (serializable, like the
apiserver's watch-cache read): the compare-and-swap is what makes the write safe, so a stale
read costs a retry, never a wrong write. Whatever would answer without a write (a 404, a
precondition mismatch, a no-op, a dry run) is decided on a linearizable read, so a stale copy
never answers a client.

Invariants: a write that would change nothing is not stored (the resourceVersion stays); an
object with a deletionTimestamp is removed exactly when its last finalizer goes (for a
Namespace: the last of `metadata.finalizers` and `spec.finalizers`); `live` is never modified,
so a `read_only` caller may be handed the shared decoded object.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestrator.apiserver.handler import (
    CRD,
    MAX_UPDATE_ATTEMPTS,
    NAMESPACES,
    Call,
    Handler,
    client_rv,
    revision_of,
)
from orchestrator.apiserver.servicefields import carry_over
from orchestrator.apiserver.storage import ClaimTaken
from orchestrator.apiserver.strategy import prepare_update, same_object
from orchestrator.kube import errors
from orchestrator.kube.errors import ApiError
from orchestrator.kube.jsonvalue import copy_json
from orchestrator.kube.objects import Obj
from orchestrator.kube.patch.apply import track_update
from orchestrator.kube.schema import crd as crds
from orchestrator.kube.schema.kind import Kind


async def update_object(
    h: Handler, call: Call, kind: Kind, ns: str, name: str, body: Any, sub: str = ""
) -> tuple[Obj, bool]:
    h.check_namespace_arg(kind, ns)
    h.authorize(call, "update", kind, ns, name, sub)
    body = h.check_body_kind(kind, body)
    meta = body["metadata"]
    if meta.get("name") not in (None, "", name):
        raise errors.bad_request(
            f"the name of the object ({meta.get('name')}) does not match the name on the "
            f"URL ({name})"
        )
    if kind.namespaced and meta.get("namespace") not in (None, "", ns):
        raise errors.bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )
    precondition = client_rv(body)

    def mutate(live: Obj) -> Obj:
        fresh: Obj = copy_json(body)
        return fresh

    obj = await guaranteed_update(h, call, kind, ns, name, sub, mutate, precondition)
    return obj, False


async def guaranteed_update(
    h: Handler,
    call: Call,
    kind: Kind,
    ns: str,
    name: str,
    sub: str,
    mutate: Callable[[Obj], Obj],
    precondition: int | None,
    *,
    managed: bool = False,
) -> Obj:
    """Read, mutate, admit and compare-and-swap until it sticks (see the module doc).
    `mutate(live)` returns the proposed object; it must not modify `live` (the patch
    engines copy what they change, an update ignores it). Nothing below modifies `live`
    either, so for a `read_only` caller (who may be handed `live` or parts of it) it is
    the shared decoded object the read-only watches were handed."""
    read = h.objects.get_shared if call.read_only else h.objects.get
    fresh = False  # read linearizably (after a local read fell short)
    allocates = h.allocates(kind) and sub != "status"
    for _ in range(MAX_UPDATE_ATTEMPTS):
        if allocates:
            await h.services.refresh(h.objects)
        try:
            live = await read(kind, ns, name, stale_ok=not fresh)
            obj, picked = _updated(h, call, kind, sub, live, mutate, precondition, managed)
        except ApiError:
            if fresh:
                raise
            fresh = True  # a 404, a failed check or a mismatch: only the latest state says
            continue
        noop = same_object(obj, live)
        if picked and (noop or call.opts.dry_run):
            h.services.assigner.forget(picked)  # no write keeps them
        if not fresh and (noop or call.opts.dry_run):
            fresh = True  # answered without a write: only from the latest state
            continue
        if noop:
            return h.present(kind, live)
        if call.opts.dry_run:
            return h.present(kind, obj)
        meta = obj["metadata"]
        try:
            if (
                meta.get("deletionTimestamp")
                and _finalizing(kind, live)
                and not _finalizing(kind, obj)
            ):
                # This update removed the last finalizer: the deletion completes. (A pod
                # being deleted gracefully has none to remove: updates leave it in place.)
                await h.objects.delete(kind, ns, name, revision_of(live), old=live)
                if allocates:
                    h.services.written(live, None)
                h.after_write(kind, obj, deleted=True)
                return h.present(kind, obj)
            stored = await h.objects.update(
                kind, obj, revision_of(live), share=call.read_only, old=live
            )
        except ClaimTaken as exc:
            h.services.assigner.forget(picked - exc.keys)
            if exc.keys <= picked:
                fresh = True  # another API server took what we picked: pick again
                continue
            raise
        except ApiError as exc:
            h.services.assigner.forget(picked)
            if exc.code == 409 and exc.reason == "Conflict" and (precondition is None or not fresh):
                # Someone else wrote meanwhile (or the local read was stale): recompute on
                # the new state. A patch that named a resourceVersion fails the check above
                # on the next round (the live one moved on); one that did not just
                # inherited the live one.
                fresh = True
                continue
            raise
        if allocates:
            h.services.written(live, stored)
        h.after_write(kind, stored)
        return h.present(kind, stored)
    raise errors.conflict(kind.plural, kind.group, name, "too many concurrent writers")


def _updated(
    h: Handler,
    call: Call,
    kind: Kind,
    sub: str,
    live: Obj,
    mutate: Callable[[Obj], Obj],
    precondition: int | None,
    managed: bool,
) -> tuple[Obj, frozenset[str]]:
    """The object `guaranteed_update` would store over `live` (raises ApiError), and for a
    Service the allocation keys picked for it (`services`)."""
    proposed = mutate(live)
    allocates = h.allocates(kind) and sub != "status"
    if allocates:
        # What the body left out of the allocated fields it keeps (before validation, which
        # holds the ClusterIP immutable).
        proposed = carry_over(proposed, live)
    wanted = precondition if precondition is not None else client_rv(proposed)
    if wanted is not None and wanted != revision_of(live):
        raise errors.conflict(kind.plural, kind.group, str(live["metadata"].get("name")))
    # Not copied: admission's validation makes the object to store a new one.
    obj = prepare_update(kind, proposed, live, subresource=sub, copy=False)
    if managed:
        obj["metadata"]["managedFields"] = proposed["metadata"].get("managedFields", [])
    obj = h.admit(call, "update", kind, obj, live, sub)
    if (kind.group, kind.plural) == CRD:
        obj["status"] = crds.crd_status(obj, h.now())
    if not managed:
        obj = track_update(
            live,
            obj,
            manager=call.opts.field_manager,
            schema=kind.schema,
            api_version=kind.api_version,
            now=h.now(),
            subresource=sub,
            copy=False,
        )
    picked: frozenset[str] = frozenset()
    if allocates:
        obj, picked = h.services.assigner.assign(obj, live)
    obj["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]
    return obj, picked


def _namespace_finalizers(kind: Kind, obj: Obj) -> bool:
    """A terminating Namespace also waits for its `spec.finalizers` (the namespace controller
    empties it, then removes "kubernetes"); it goes once both lists are empty."""
    return (kind.group, kind.plural) == NAMESPACES and bool(
        (obj.get("spec") or {}).get("finalizers")
    )


def _finalizing(kind: Kind, obj: Obj) -> bool:
    """Whether finalizers still hold the object (its metadata's, or a Namespace's spec's)."""
    return bool(obj["metadata"].get("finalizers")) or _namespace_finalizers(kind, obj)
