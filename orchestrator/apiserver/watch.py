"""The watch verb (kube-apiserver's watch.go) on top of the store's watch: events as
`{"type": ..., "object": ...}` dicts.

resourceVersion semantics (as the apiserver): unset or "0" -> a synthetic ADDED for every
current object (read at some revision R), then every change after R; "N" -> every change after
N. A start below the compacted revision ends the stream with one ERROR event carrying a 410
Expired Status (clients re-list). Label and field selectors apply to both the new and the
previous state: an object that starts matching is ADDED, one that stops matching is DELETED,
as in the apiserver's filtered watch. BOOKMARKs (only with allowWatchBookmarks) carry just the
current resourceVersion. With sendInitialEvents=true the initial ADDED events end with a
BOOKMARK annotated `k8s.io/initial-events-end`.

Decoding (msgpack -> dict) is most of a watcher's work, so it is not repeated needlessly:
a watch without selectors never decodes an update's previous state; a previous state decoded
to evaluate selectors comes from the `ObjectStore`'s small cache of decoded values keyed by
(key, mod_revision) (`storage.Decoded`) — it is only read; and a `read_only=True` watch
(in-process consumers that promise never to modify what they get: the controllers' informers,
the simulated nodes) is handed the cached object itself, shared with every other read-only
watcher of the event (and with binding, which reads the pod it binds from the same cache).
Every other watch gets objects of its own.

Invariants: events come in revision order with no gaps or duplicates (the store watch's
guarantee); the stream ends cleanly (no event) when the store cancels the watcher for any
reason other than compaction, so the client re-watches from its last resourceVersion.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from orchestrator.apiserver.get import matcher, select
from orchestrator.apiserver.handler import Call, Handler
from orchestrator.apiserver.options import WatchOptions
from orchestrator.apiserver.slices import TimeSlice
from orchestrator.apiserver.storage import Decoded, decode_value
from orchestrator.kube import errors
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.kind import Kind
from orchestrator.kube.selectors import FieldRequirement, FieldSelector
from orchestrator.store.types import EventType

# The initial state's ADDED events go out in batches of this many: a consumer handles a batch in
# one step (an informer fills its cache), so a batch is kept small enough for a short one.
INITIAL_BATCH = 100


def bookmark(kind: Kind, revision: int, annotations: dict[str, str] | None = None) -> Obj:
    meta: Obj = {"resourceVersion": str(revision)}
    if annotations:
        meta["annotations"] = annotations
    return {
        "type": "BOOKMARK",
        "object": {"kind": kind.kind, "apiVersion": kind.api_version, "metadata": meta},
    }


def expired_event(message: str) -> Obj:
    return {"type": "ERROR", "object": errors.expired(message).status()}


async def open_watch(
    h: Handler,
    call: Call,
    kind: Kind,
    ns: str,
    opts: WatchOptions,
    *,
    name: str = "",
    read_only: bool = False,
) -> AsyncIterator[list[Obj]]:
    """Check the request and read the initial state now (so errors are plain HTTP errors), then
    return the event stream; it runs until the store ends the watch (the caller owns timeouts,
    `opts.timeout_seconds` included). Events come in batches, one per store response (never
    empty), so that a consumer pays its per-wait costs (a timeout scope, a write to the socket)
    once per batch instead of per event. `read_only`: the caller never modifies the events'
    objects, which may then be shared with other read-only watchers (see the module doc)."""
    if not kind.namespaced and ns:
        raise errors.route_not_found()
    h.authorize(call, "watch", kind, ns, name)
    if name:  # the old-style watch on one object: /.../pods/NAME?watch=true
        by_name = FieldRequirement("metadata.name", "=", name)
        fields = FieldSelector((by_name, *opts.field_selector.requirements))
        opts = replace(opts, field_selector=fields)
    matches = matcher(kind, opts.label_selector, opts.field_selector)
    bookmarks = opts.allow_bookmarks
    rv_text = opts.resource_version
    initial = opts.send_initial_events
    first: list[Obj] = []
    if rv_text in ("", "0") or initial:
        objs, revision, _ = await select(h, kind, ns, opts.initial_list())
        first = [{"type": "ADDED", "object": obj} for obj in objs]
        if initial and bookmarks:
            first.append(bookmark(kind, revision, {"k8s.io/initial-events-end": "true"}))
        start = revision + 1
    else:
        try:
            start = int(rv_text) + 1
        except ValueError:
            raise errors.bad_request(f"invalid resourceVersion {rv_text!r}") from None
        if start < 1:
            raise errors.bad_request(f"invalid resourceVersion {rv_text!r}")
    watcher = h.objects.watch(kind, ns, start, bookmarks=bookmarks)
    decoded = h.objects.decoded
    only = None if opts.everything() else matches

    async def events() -> AsyncIterator[list[Obj]]:
        timeslice = TimeSlice()
        async with watcher:
            for i in range(0, len(first), INITIAL_BATCH):
                yield first[i : i + INITIAL_BATCH]
            async for response in watcher:
                if response.canceled:
                    if response.cancel_reason == "compacted":
                        yield [
                            expired_event(
                                f"too old resource version: {start - 1}"
                                f" ({response.compact_revision})"
                            )
                        ]
                    return
                if response.progress and not response.events:
                    if bookmarks:
                        yield [bookmark(kind, response.revision)]
                    continue
                batch = []
                for e in response.events:  # a catch-up from the history may be long
                    await timeslice.pause()
                    out = _translate(h, kind, e, only, decoded, read_only)
                    if out is not None:
                        batch.append(out)
                if batch:
                    yield batch

    return events()


def _translate(
    h: Handler, kind: Kind, ev: Any, matches: Any, decoded: Decoded, read_only: bool
) -> Obj | None:
    """The Kubernetes event for store event `ev`, or None; `matches` None: no selector."""
    revision = ev.kv.mod_revision
    if ev.type == EventType.DELETE:
        if ev.prev_kv is None:
            return None
        prev = decoded.get(ev.prev_kv)
        if matches is not None and not matches(prev):
            return None
        if read_only:  # the last state, carrying the deleting revision, sharing the rest
            gone = {**prev, "metadata": {**prev["metadata"], "resourceVersion": str(revision)}}
        else:
            gone = decode_value(ev.prev_kv.value, revision)
        return {"type": "DELETED", "object": _present(h, kind, gone, read_only)}
    new = decoded.get(ev.kv) if read_only else decode_value(ev.kv.value, revision)
    if matches is None:
        # Everything matches: the previous state only tells ADDED from MODIFIED, so it is
        # not decoded.
        etype = "MODIFIED" if ev.prev_kv else "ADDED"
        return {"type": etype, "object": _present(h, kind, new, read_only)}
    now_matches = matches(new)
    was = ev.prev_kv is not None and matches(decoded.get(ev.prev_kv))
    if now_matches and was:
        return {"type": "MODIFIED", "object": _present(h, kind, new, read_only)}
    if now_matches:
        return {"type": "ADDED", "object": _present(h, kind, new, read_only)}
    if was:  # it stopped matching: DELETED, with its new state (resourceVersion = revision)
        return {"type": "DELETED", "object": _present(h, kind, new, read_only)}
    return None


def _present(h: Handler, kind: Kind, obj: Obj, read_only: bool) -> Obj:
    if read_only and kind.custom and obj.get("apiVersion") != kind.api_version:
        obj = {**obj}  # a shared object is never modified: `Handler.present` sets apiVersion
    return h.present(kind, obj)
