"""Kubernetes watch on top of the store's watch: events as `{"type": ..., "object": ...}` dicts.

resourceVersion semantics (as the apiserver): unset or "0" -> a synthetic ADDED for every
current object (read at some revision R), then every change after R; "N" -> every change after
N. A start below the compacted revision ends the stream with one ERROR event carrying a 410
Expired Status (clients re-list). Label and field selectors apply to both the new and the
previous state: an object that starts matching is ADDED, one that stops matching is DELETED,
as in the apiserver's filtered watch. BOOKMARKs (only with allowWatchBookmarks) carry just the
current resourceVersion. With sendInitialEvents=true the initial ADDED events end with a
BOOKMARK annotated `k8s.io/initial-events-end`.

Invariants: events come in revision order with no gaps or duplicates (the store watch's
guarantee); the stream ends cleanly (no event) when the store cancels the watcher for any
reason other than compaction, so the client re-watches from its last resourceVersion.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlencode

import msgpack

from ..store.types import EventType
from . import errors
from .request import Query
from .resources import Api, Call
from .schema.kind import Kind
from .selectors import parse_field_selector, parse_label_selector

Obj = dict[str, Any]


def _decode(value: bytes, revision: int) -> Obj:
    obj: Obj = msgpack.unpackb(value, raw=False)
    obj.setdefault("metadata", {})["resourceVersion"] = str(revision)
    return obj


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
    api: Api, call: Call, kind: Kind, ns: str, query: Query, *, name: str = ""
) -> AsyncIterator[Obj]:
    """Check the request and read the initial state now (so errors are plain HTTP errors), then
    return the event stream; it runs until the store ends the watch (the caller owns timeouts)."""
    if not kind.namespaced and ns:
        raise errors.route_not_found()
    api._authorize(call, "watch", kind, ns, name)
    if name:  # the old-style watch on one object: /.../pods/NAME?watch=true
        selector = query.get("fieldSelector")
        extra = f",{selector}" if selector else ""
        query = Query(
            urlencode({**_params(query), "fieldSelector": f"metadata.name={name}{extra}"})
        )
    matches = api.matcher(kind, query)
    everything = (
        parse_label_selector(query.get("labelSelector")).empty()
        and parse_field_selector(query.get("fieldSelector")).empty()
    )
    bookmarks = query.flag("allowWatchBookmarks")
    rv_text = query.get("resourceVersion")
    initial = query.flag("sendInitialEvents")
    first: list[Obj] = []
    if rv_text in ("", "0") or initial:
        objs, revision, _ = await api.select(kind, ns, Query(urlencode(_params(query))))
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
    watcher = api.objects.watch(kind, ns, start, bookmarks=bookmarks)

    async def events() -> AsyncIterator[Obj]:
        async with watcher:
            for ev in first:
                yield ev
            async for response in watcher:
                if response.canceled:
                    if response.cancel_reason == "compacted":
                        yield expired_event(
                            f"too old resource version: {start - 1} ({response.compact_revision})"
                        )
                    return
                if response.progress and not response.events:
                    if bookmarks:
                        yield bookmark(kind, response.revision)
                    continue
                for e in response.events:
                    out = _translate(api, kind, e, None if everything else matches)
                    if out is not None:
                        yield out

    return events()


def _translate(api: Api, kind: Kind, ev: Any, matches: Any) -> Obj | None:
    """The Kubernetes event for store event `ev`, or None; `matches` None: no selector."""
    revision = ev.kv.mod_revision
    if matches is None and ev.type != EventType.DELETE:
        # Everything matches: the previous state only tells ADDED from MODIFIED, so it is
        # not decoded (decoding is the bulk of a watcher's work).
        new = _decode(ev.kv.value, revision)
        etype = "MODIFIED" if ev.prev_kv else "ADDED"
        return {"type": etype, "object": api._present(kind, new)}
    if matches is None:
        matches = _everything
    prev = _decode(ev.prev_kv.value, ev.prev_kv.mod_revision) if ev.prev_kv else None
    if ev.type == EventType.DELETE:
        if prev is None or not matches(prev):
            return None
        prev["metadata"]["resourceVersion"] = str(revision)
        return {"type": "DELETED", "object": api._present(kind, prev)}
    new = _decode(ev.kv.value, revision)
    now_matches = matches(new)
    was = prev is not None and matches(prev)
    if now_matches and was:
        return {"type": "MODIFIED", "object": api._present(kind, new)}
    if now_matches:
        return {"type": "ADDED", "object": api._present(kind, new)}
    if was:
        new["metadata"]["resourceVersion"] = str(revision)
        return {"type": "DELETED", "object": api._present(kind, new)}
    return None


def _everything(obj: Obj) -> bool:
    return True


def _params(query: Query) -> dict[str, str]:
    """The selector and resourceVersion parameters, for the initial list."""
    return {
        k: query.get(k)
        for k in ("labelSelector", "fieldSelector", "resourceVersion")
        if query.get(k)
    }
