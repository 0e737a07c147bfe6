"""Shared informers: a local, indexed, event-driven cache of one kind of object.

Theory of operation
-------------------
A `SharedInformer` is client-go's Reflector + Indexer + event distribution in one trio task:

    LIST (resourceVersion "0" the first time: any server's copy will do; "" — a quorum read —
          after a 410 or any other failure)
      -> replace the cache: new keys are adds, changed ones updates, and keys the list no longer
         has are deletes of a `DeletedFinalStateUnknown` (we missed the real DELETE event)
      -> WATCH from the list's resourceVersion with allowWatchBookmarks and a random 5-10 min
         timeoutSeconds; each event updates the cache and then calls the handlers; BOOKMARKs
         only advance the resourceVersion
      -> a clean end of the watch (timeout, the server restarting it) re-watches from the last
         resourceVersion; a 410 Expired (compaction) or an ERROR relists at once; any other
         failure relists after a backoff of 0.8 s, doubling to 30 s (reset once a watch works).

Cached objects, and those handed to handlers, are read-only: no consumer may modify them (copy
first) — they are shared by every controller of the process and, with the in-process client, by
other read-only watchers of the same events (the watch is opened `read_only`).

Handlers run synchronously after the cache is updated, in event order; they must be quick
(enqueue a key) and an exception in one is logged, never fatal. `on_update(old, new)` is not
called when old and new have the same resourceVersion, except on resync, which replays the
whole cache as updates every `resync` seconds (no API call). A handler added after the cache
filled gets a synthetic `on_add` for every cached object. Identity is namespace/name: a delete
and re-create between two lists may look like one update (compare UIDs when it matters).

Guarantees (as client-go's): eventually consistent; per object the handlers see a subsequence of
its states, in order; no ordering across objects.

`InformerFactory` hands out one informer per (resource, namespace, label selector) so all
controllers of a process share one cache and one watch per kind.

Transform (client-go's `SetTransform`): an informer given `transform` caches, and hands its
handlers, `transform(obj)` instead of `obj`. `strip_managed_fields` is the usual one (as
kube-controller-manager and kube-scheduler do): `metadata.managedFields` is most of a small
object's memory, no controller reads it, and an update that omits it keeps the stored entries.
It copies only the top level and `metadata` (the rest is shared with the decoded object).

Metrics (in the given registry, default `REGISTRY`): `informer_events_total{resource,type}`
(watch events received, by type), `informer_relists_total{resource}` (LISTs after the first).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import trio

from orchestrator.client import ResourceInfo
from orchestrator.controllers.runtime.client import Client
from orchestrator.kube.errors import ApiError
from orchestrator.kube.objects import Obj
from orchestrator.metrics import REGISTRY, Registry

__all__ = [
    "LABEL_INDEX",
    "NAMESPACE_INDEX",
    "NODE_NAME_INDEX",
    "OWNER_INDEX",
    "DeletedFinalStateUnknown",
    "InformerFactory",
    "SharedInformer",
    "controller_of",
    "deleted_object",
    "object_key",
    "strip_managed_fields",
]

log = logging.getLogger(__name__)

Objs = list[Obj]  # (`SharedInformer.list` shadows the builtin in its class body)
Names = list[str]
IndexFn = Callable[[Obj], Iterable[str]]

NAMESPACE_INDEX = "namespace"
OWNER_INDEX = "owner"  # the uid of the controller ownerReference
NODE_NAME_INDEX = "spec.nodeName"
LABEL_INDEX = "label"  # "key=value" for each label

WATCH_TIMEOUT_MIN = 300.0
WATCH_TIMEOUT_MAX = 600.0
BACKOFF_INITIAL = 0.8
BACKOFF_MAX = 30.0


@dataclass(frozen=True, slots=True)
class DeletedFinalStateUnknown:
    """A delete noticed by a relist, not by a watch event: `obj` is the last state we saw."""

    key: str
    obj: Obj


def object_key(obj: Obj) -> str:
    """`namespace/name`, or `name` for cluster-scoped objects (client-go's MetaNamespaceKey)."""
    meta = obj.get("metadata") or {}
    ns, name = meta.get("namespace") or "", meta.get("name") or ""
    return f"{ns}/{name}" if ns else str(name)


def deleted_object(obj: Obj | DeletedFinalStateUnknown) -> Obj:
    """The object an `on_delete` handler got, whether from a watch event or a relist."""
    return obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj


def controller_of(obj: Obj) -> Obj | None:
    """The ownerReference with `controller: true`, if any."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller"):
            return ref
    return None


def strip_managed_fields(obj: Obj) -> Obj:
    """`obj` without `metadata.managedFields` (a shallow copy; `obj` itself if it has none)."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or "managedFields" not in meta:
        return obj
    return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


def _index_namespace(obj: Obj) -> list[str]:
    return [str((obj.get("metadata") or {}).get("namespace") or "")]


def _index_owner(obj: Obj) -> list[str]:
    ref = controller_of(obj)
    return [str(ref["uid"])] if ref and ref.get("uid") else []


def _index_node_name(obj: Obj) -> list[str]:
    node = (obj.get("spec") or {}).get("nodeName")
    return [str(node)] if node else []


def _index_labels(obj: Obj) -> list[str]:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return [f"{k}={v}" for k, v in labels.items()]


BUILTIN_INDEXERS: dict[str, IndexFn] = {
    NAMESPACE_INDEX: _index_namespace,
    OWNER_INDEX: _index_owner,
    NODE_NAME_INDEX: _index_node_name,
    LABEL_INDEX: _index_labels,
}


@dataclass(slots=True)
class _Handler:
    on_add: Callable[[Obj], None] | None
    on_update: Callable[[Obj, Obj], None] | None
    on_delete: Callable[[Obj | DeletedFinalStateUnknown], None] | None


def _rv(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


class SharedInformer:
    """A cache of `resource` objects (in `namespace`, "" = all, matching `label_selector`) kept
    current by LIST + WATCH; see the module doc. Start with `await nursery.start(inf.run)`."""

    def __init__(
        self,
        client: Client,
        resource: ResourceInfo,
        namespace: str = "",
        label_selector: str = "",
        resync: float | None = None,
        *,
        metrics: Registry = REGISTRY,
        rng: random.Random | None = None,
        backoff_initial: float = BACKOFF_INITIAL,
        backoff_max: float = BACKOFF_MAX,
        transform: Callable[[Obj], Obj] | None = None,
    ) -> None:
        self.client = client
        self._transform = transform
        self.resource = resource
        self.namespace = namespace
        self.label_selector = label_selector
        self.resync = resync
        self._rng = rng or random.Random()
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._cache: dict[str, Obj] = {}
        self._indexers: dict[str, IndexFn] = {}
        self._indices: dict[str, dict[str, set[str]]] = {}
        self._handlers: list[_Handler] = []
        self._synced = trio.Event()
        self.resource_version = ""
        label = resource.group_resource
        self._events = metrics.counter(
            "informer_events_total", "Watch events received by informers.", ["resource", "type"]
        )
        self._relists = metrics.counter(
            "informer_relists_total", "LISTs made by informers after their first.", ["resource"]
        )
        self._label = label
        for name, fn in BUILTIN_INDEXERS.items():
            self.add_indexer(name, fn)

    # ------------------------------------------------------------------ cache
    def add_indexer(self, name: str, fn: IndexFn) -> None:
        """Index the cache by `fn(obj)` (a list of values); existing objects are indexed now."""
        if name in self._indexers:
            raise ValueError(f"informer for {self._label}: indexer {name!r} already exists")
        self._indexers[name] = fn
        index: dict[str, set[str]] = {}
        self._indices[name] = index
        for key, obj in self._cache.items():
            for value in fn(obj):
                index.setdefault(value, set()).add(key)

    def get(self, key: str) -> Obj | None:
        """The cached object `namespace/name` (or `name`); do not modify it."""
        return self._cache.get(key)

    def list(self) -> Objs:
        return list(self._cache.values())

    def keys(self) -> Names:
        return list(self._cache)

    def by_index(self, name: str, value: str) -> Objs:
        """Cached objects whose indexer `name` yields `value` (KeyError: no such indexer)."""
        keys = self._indices[name].get(value, set())
        return [self._cache[k] for k in sorted(keys)]

    @property
    def has_synced(self) -> bool:
        """True once the first LIST has been put in the cache."""
        return self._synced.is_set()

    async def wait_for_cache_sync(self) -> None:
        await self._synced.wait()

    def _index(self, key: str, obj: Obj | None, old: Obj | None) -> None:
        for name, fn in self._indexers.items():
            values = () if obj is None else fn(obj)
            if old is not None:
                before = fn(old)
                if before == values:
                    continue  # the usual update (a status write): the index stays as it is
            index = self._indices[name]
            if old is not None:
                for value in before:
                    keys = index.get(value)
                    if keys is not None:
                        keys.discard(key)
                        if not keys:
                            del index[value]
            for value in values:
                index.setdefault(value, set()).add(key)

    # ------------------------------------------------------------------ handlers
    def add_event_handler(
        self,
        *,
        on_add: Callable[[Obj], None] | None = None,
        on_update: Callable[[Obj, Obj], None] | None = None,
        on_delete: Callable[[Obj | DeletedFinalStateUnknown], None] | None = None,
    ) -> None:
        """Register handlers; they get a synthetic `on_add` for every object already cached."""
        handler = _Handler(on_add, on_update, on_delete)
        self._handlers.append(handler)
        if on_add is not None:
            for obj in list(self._cache.values()):
                self._call(on_add, obj)

    def _call(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception:
            log.exception("informer for %s: an event handler failed", self._label)

    def _added(self, obj: Obj) -> None:
        for h in self._handlers:
            if h.on_add is not None:
                self._call(h.on_add, obj)

    def _updated(self, old: Obj, new: Obj, *, resync: bool = False) -> None:
        if not resync and _rv(old) == _rv(new):
            return
        for h in self._handlers:
            if h.on_update is not None:
                self._call(h.on_update, old, new)

    def _deleted(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        for h in self._handlers:
            if h.on_delete is not None:
                self._call(h.on_delete, obj)

    # ------------------------------------------------------------------ applying changes
    def _upsert(self, obj: Obj) -> None:
        if self._transform is not None:
            obj = self._transform(obj)
        key = object_key(obj)
        old = self._cache.get(key)
        self._cache[key] = obj
        self._index(key, obj, old)
        if old is None:
            self._added(obj)
        else:
            self._updated(old, obj)

    def _remove(self, key: str, last: Obj | DeletedFinalStateUnknown) -> None:
        old = self._cache.pop(key, None)
        if old is None:
            return
        self._index(key, None, old)
        self._deleted(last)

    def _replace(self, items: Objs) -> None:
        """A LIST's result becomes the cache: adds, updates, and deletes for what is gone."""
        seen: set[str] = set()
        for obj in items:
            seen.add(object_key(obj))
            self._upsert(obj)
        for key in [k for k in self._cache if k not in seen]:
            self._remove(key, DeletedFinalStateUnknown(key, self._cache[key]))

    def _resync(self) -> None:
        for obj in list(self._cache.values()):
            self._updated(obj, obj, resync=True)

    # ------------------------------------------------------------------ running
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """LIST + WATCH until cancelled; `started` once the first LIST is in the cache."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self._reflect)
            if self.resync:
                nursery.start_soon(self._resync_loop, self.resync)
            task_status.started()

    async def _resync_loop(self, period: float) -> None:
        while True:
            await trio.sleep(period)
            self._resync()

    async def _reflect(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        list_rv = "0"
        backoff = self._backoff_initial
        first = True
        while True:
            try:
                listed = await self.client.list(
                    self.resource,
                    self.namespace,
                    label_selector=self.label_selector,
                    resource_version=list_rv,
                )
                if not first:
                    self._relists.labels(self._label).inc()
                self._replace(list(listed.get("items") or []))
                self.resource_version = str((listed.get("metadata") or {}).get("resourceVersion"))
                if first:
                    first = False
                    self._synced.set()
                    task_status.started()
                while True:  # re-watch from the last resourceVersion after each clean end
                    if await self._watch():
                        backoff = self._backoff_initial
            except ApiError as exc:
                list_rv = ""
                if exc.code == 410:
                    log.info("informer for %s: %s; relisting", self._label, exc)
                    continue
                log.warning("informer for %s: %s; relisting in %.1fs", self._label, exc, backoff)
            await trio.sleep(backoff * (1 + self._rng.random()))  # jitter 1.0, as client-go
            backoff = min(backoff * 2, self._backoff_max)

    async def _watch(self) -> bool:
        """One watch from `resource_version` until it ends; True if it delivered events."""
        timeout = self._rng.uniform(WATCH_TIMEOUT_MIN, WATCH_TIMEOUT_MAX)
        delivered = False
        async with self.client.watch(
            self.resource,
            self.namespace,
            resource_version=self.resource_version,
            label_selector=self.label_selector,
            timeout_seconds=timeout,
            allow_bookmarks=True,
            read_only=True,  # cached objects are never modified (see `get`)
        ) as events:
            async for etype, obj in events:
                delivered = True
                self._events.labels(self._label, etype).inc()
                rv = _rv(obj)
                if etype in ("ADDED", "MODIFIED"):
                    self._upsert(obj)
                elif etype == "DELETED":
                    last = self._transform(obj) if self._transform is not None else obj
                    self._remove(object_key(obj), last)
                elif etype != "BOOKMARK":
                    log.warning("informer for %s: unknown watch event %r", self._label, etype)
                    continue
                if rv:
                    self.resource_version = rv
        return delivered


class InformerFactory:
    """One `SharedInformer` per (resource, namespace, label selector) for a process's
    controllers. `informer(...)` before `start(nursery)`; informers asked for later are started
    by the next `start`."""

    def __init__(
        self,
        client: Client,
        *,
        resync: float | None = None,
        metrics: Registry = REGISTRY,
        transform: Callable[[Obj], Obj] | None = None,
    ) -> None:
        self.client = client
        self.resync = resync
        self.metrics = metrics
        self.transform = transform
        self._informers: dict[tuple[ResourceInfo, str, str], SharedInformer] = {}
        self._started: set[tuple[ResourceInfo, str, str]] = set()

    def informer(
        self, resource: ResourceInfo, namespace: str = "", label_selector: str = ""
    ) -> SharedInformer:
        key = (resource, namespace, label_selector)
        inf = self._informers.get(key)
        if inf is None:
            inf = SharedInformer(
                self.client,
                resource,
                namespace,
                label_selector,
                self.resync,
                metrics=self.metrics,
                transform=self.transform,
            )
            self._informers[key] = inf
        return inf

    def start(self, nursery: trio.Nursery) -> None:
        """Start every informer not started yet (each signals its own sync)."""
        for key, inf in self._informers.items():
            if key not in self._started:
                self._started.add(key)
                nursery.start_soon(inf.run)

    async def wait_for_cache_sync(self) -> None:
        for inf in list(self._informers.values()):
            await inf.wait_for_cache_sync()
