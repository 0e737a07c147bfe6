"""The agent's cache of Services, EndpointSlices and Nodes, kept for outages and reboots.

Theory of operation
-------------------
`ServiceCache.run` first loads the Services and EndpointSlices of the local store
(`LocalStore.objects_of`), so that after a reboot with the servers down the node proxy and the
DNS server serve what they served before, then signals `started` (never waiting for the API).
It then runs shared informers (LIST + WATCH, retried with back-off while the servers are away)
of Services, `discovery.k8s.io/v1` EndpointSlices and Nodes. Per kind, until its informer's
first LIST succeeds the readers see the stored copy; from then on the informer's cache. Every
`flush_interval` seconds the changed Services and slices are written to the local store in one
transaction per kind (objects the API no longer has are forgotten), so a flapping endpoint
costs one fsync a second at most (flash). Nodes are not stored (nothing needs them offline).

Read API (for the node proxy, the DNS server and anyone else; never blocks, read-only objects:
copy before modifying):

* `services()` / `service(ns, name)`; `slices()` / `slices_for(ns, name)` (the slices of one
  Service, by the `kubernetes.io/service-name` label);
* `node_addresses(name)`: the Node's `status.addresses` as (type, address) pairs;
* `version`: an int that grows on every change; `await wait_changed(version)` returns the new
  version once it differs (a level trigger: read everything again, never count events);
* `changes_since(version)`: (namespace, name) of the Services whose Service or slices changed
  after `version`, or None when that is not known (the readers switched from the stored copy
  to the API's, or `version` is older than the last `CHANGE_LOG` changes): read everything;
* `restored` / `synced(kind)`: the stored copy is loaded / a kind's informer has listed once.

`ServiceCacheView` presents the cache as the `clusterview.ClusterView` the DNS server and the
pods' Service variables read (mappings by Service, rebuilt when `version` moved).

Invariants: readers never see a mix of stored and live objects of one kind; the store holds
what the readers of a synced kind saw at the last flush.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable

import trio

from orchestrator.agent.localstore import LocalStore
from orchestrator.agent.net.clusterview import SERVICE_NAME_LABEL, ServiceKey
from orchestrator.client.resource import ENDPOINT_SLICES, NODES, SERVICES, ResourceInfo
from orchestrator.controllers.runtime.client import Client
from orchestrator.controllers.runtime.informer import (
    DeletedFinalStateUnknown,
    SharedInformer,
    deleted_object,
    object_key,
    strip_managed_fields,
)
from orchestrator.kube.objects import Obj
from orchestrator.metrics import REGISTRY, Registry

__all__ = ["SERVICE_NAME_LABEL", "ServiceCache", "ServiceCacheView"]

log = logging.getLogger(__name__)

FLUSH_INTERVAL = 1.0  # seconds between writes of changed objects to the local store
CHANGE_LOG = 4096  # changes remembered for `changes_since`
SERVICE_INDEX = "service"  # EndpointSlice informer index: "namespace/service name"
_STORED = {"Service": SERVICES, "EndpointSlice": ENDPOINT_SLICES}


def _split(key: str) -> tuple[str, str]:
    ns, _, name = key.rpartition("/")
    return ns, name


class ServiceCache:
    """Services, EndpointSlices and Nodes for the node's networking (module doc)."""

    def __init__(
        self,
        client: Client,
        store: LocalStore | None,
        *,
        flush_interval: float = FLUSH_INTERVAL,
        metrics: Registry = REGISTRY,
        informer: Callable[[ResourceInfo], SharedInformer] | None = None,
    ) -> None:
        self.store = store
        self.flush_interval = flush_interval
        make = informer or (
            lambda res: SharedInformer(client, res, metrics=metrics, transform=strip_managed_fields)
        )
        self._informers = {
            "Service": make(SERVICES),
            "EndpointSlice": make(ENDPOINT_SLICES),
            "Node": make(NODES),
        }
        self._stored: dict[str, dict[str, Obj]] = {kind: {} for kind in _STORED}
        self._persisted: dict[str, set[str]] = {kind: set() for kind in _STORED}
        self._dirty: dict[str, set[str]] = {kind: set() for kind in _STORED}
        # the stored copy's slices by Service (the informer's index serves the live ones)
        self._stored_by_service: dict[tuple[str, str], dict[str, Obj]] | None = None
        self._log: list[tuple[int, tuple[str, str]]] = []  # (version, Service) changes
        self._log_floor = 0  # changes after this version are all in the log
        self.version = 0
        self._changed = trio.Event()
        self.restored = False
        self._informers["EndpointSlice"].add_indexer(SERVICE_INDEX, _slice_service)
        for kind, inf in self._informers.items():
            self._watch_kind(kind, inf)

    # ------------------------------------------------------------------ reading
    def _objects(self, kind: str) -> list[Obj]:
        inf = self._informers[kind]
        if inf.has_synced or kind not in self._stored:
            return inf.list()
        return list(self._stored[kind].values())

    def _get(self, kind: str, key: str) -> Obj | None:
        inf = self._informers[kind]
        if inf.has_synced or kind not in self._stored:
            return inf.get(key)
        return self._stored[kind].get(key)

    def synced(self, kind: str) -> bool:
        """Whether `kind` ("Service", "EndpointSlice", "Node") comes from the API by now."""
        return self._informers[kind].has_synced

    def services(self) -> list[Obj]:
        return self._objects("Service")

    def service(self, namespace: str, name: str) -> Obj | None:
        return self._get("Service", f"{namespace}/{name}")

    def slices(self) -> list[Obj]:
        return self._objects("EndpointSlice")

    def slices_for(self, namespace: str, name: str) -> list[Obj]:
        """The EndpointSlices of Service `namespace/name` (by their service-name label)."""
        inf = self._informers["EndpointSlice"]
        if inf.has_synced:
            return inf.by_index(SERVICE_INDEX, f"{namespace}/{name}")
        if self._stored_by_service is None:
            index: dict[tuple[str, str], dict[str, Obj]] = {}
            for sl in self._stored["EndpointSlice"].values():
                for value in _slice_service(sl):
                    ns, _, owner = value.partition("/")
                    index.setdefault((ns, owner), {})[object_key(sl)] = sl
            self._stored_by_service = index
        return list(self._stored_by_service.get((namespace, name), {}).values())

    def changes_since(self, version: int) -> set[tuple[str, str]] | None:
        """The Services changed after `version` (module doc); None: not known."""
        if version < self._log_floor:
            return None
        i = bisect.bisect_right(self._log, version, key=lambda entry: entry[0])
        return {key for _v, key in self._log[i:]}

    def node_addresses(self, name: str) -> list[tuple[str, str]]:
        node = self._informers["Node"].get(name)
        if node is None:
            return []
        return [
            (str(a.get("type") or ""), str(a.get("address") or ""))
            for a in (node.get("status") or {}).get("addresses") or []
            if isinstance(a, dict) and a.get("address")
        ]

    async def wait_changed(self, version: int) -> int:
        """The current version, once it differs from `version`."""
        while self.version == version:
            await self._changed.wait()
        return self.version

    # ------------------------------------------------------------------ changes
    def _bump(self, services: tuple[tuple[str, str], ...] | None = None) -> None:
        """A new version; `services`: the Services it changes (None: maybe any)."""
        self.version += 1
        if services is None:
            self._log.clear()
            self._log_floor = self.version
        else:
            self._log.extend((self.version, key) for key in services)
            if len(self._log) > CHANGE_LOG:
                drop = len(self._log) - CHANGE_LOG // 2
                self._log_floor = self._log[drop - 1][0]
                del self._log[:drop]
        self._changed.set()
        self._changed = trio.Event()

    def _watch_kind(self, kind: str, inf: SharedInformer) -> None:
        def added(obj: Obj) -> None:
            self._touch(kind, object_key(obj), obj)

        def updated(old: Obj, new: Obj) -> None:
            self._touch(kind, object_key(new), new, old)

        def deleted(obj: Obj | DeletedFinalStateUnknown) -> None:
            self._touch(kind, _deleted_key(obj), deleted_object(obj))

        inf.add_event_handler(on_add=added, on_update=updated, on_delete=deleted)

    def _touch(self, kind: str, key: str, *objs: Obj) -> None:
        if kind in self._dirty:
            self._dirty[kind].add(key)
        if kind == "Service":
            self._bump((_split(key),))
        elif kind == "EndpointSlice":  # its Service, before and after (the label may change)
            owners = {value for obj in objs for value in _slice_service(obj)}
            self._bump(tuple(_split(value) for value in sorted(owners)))
        else:
            self._bump(())  # Nodes: no Service's rules change

    # ------------------------------------------------------------------ running
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Load the stored copy, signal `started`, then follow the API until cancelled."""
        if self.store is not None:
            for kind in _STORED:
                objs = await self.store.objects_of(kind)
                self._stored[kind] = {object_key(o): o for o in objs}
                self._stored_by_service = None
                self._persisted[kind] = set(self._stored[kind])
            count = sum(len(v) for v in self._stored.values())
            log.info("service cache: restored %d Services and EndpointSlices", count)
        self.restored = True
        self._bump()
        async with trio.open_nursery() as nursery:
            for kind, inf in self._informers.items():
                nursery.start_soon(self._follow, kind, inf)
            if self.store is not None:
                nursery.start_soon(self._flush_loop)
            task_status.started()

    async def _follow(self, kind: str, inf: SharedInformer) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(inf.run)
            await inf.wait_for_cache_sync()
            log.info("service cache: %s synced from the API", kind)
            self._bump(None if kind in _STORED else ())  # stored copy -> informer's

    async def _flush_loop(self) -> None:
        while True:
            await trio.sleep(self.flush_interval)
            try:
                await self.flush()
            except Exception:  # a full disk must not stop the proxy: retried next time
                log.exception("service cache: writing the local copy failed; will retry")

    async def flush(self) -> None:
        """Write what changed since the last flush to the local store (synced kinds only)."""
        assert self.store is not None
        for kind in _STORED:
            inf = self._informers[kind]
            if not inf.has_synced:
                continue
            dirty, self._dirty[kind] = self._dirty[kind], set()
            live = set(inf.keys())
            put = [obj for key in sorted(dirty & live) if (obj := inf.get(key)) is not None]
            put += [obj for key in sorted(live - self._persisted[kind] - dirty)
                    if (obj := inf.get(key)) is not None]  # fmt: skip
            gone = sorted(self._persisted[kind] - live)
            try:
                await self.store.write_objects(kind, put, [_split(k) for k in gone])
            except BaseException:
                self._dirty[kind] |= dirty
                raise
            self._persisted[kind] = live
            self._stored[kind] = {}  # the informer's cache is what readers see now


def _slice_service(sl: Obj) -> list[str]:
    """The `SERVICE_INDEX` value of an EndpointSlice: "namespace/service" ([] if unlabelled)."""
    meta = sl.get("metadata") or {}
    owner = (meta.get("labels") or {}).get(SERVICE_NAME_LABEL)
    return [f"{meta.get('namespace') or ''}/{owner}"] if owner else []


def _deleted_key(obj: Obj | DeletedFinalStateUnknown) -> str:
    return obj.key if isinstance(obj, DeletedFinalStateUnknown) else object_key(obj)


class ServiceCacheView:
    """`ServiceCache` as a `ClusterView`: Services and their slices by (namespace, name),
    rebuilt on the first read after the cache's version moved."""

    def __init__(self, cache: ServiceCache) -> None:
        self._cache = cache
        self._at = -1
        self._services: dict[ServiceKey, Obj] = {}
        self._slices: dict[ServiceKey, tuple[Obj, ...]] = {}

    @property
    def generation(self) -> int:
        return self._cache.version

    def _refresh(self) -> None:
        if self._at == self._cache.version:
            return
        self._at = self._cache.version
        self._services = {_key(s): s for s in self._cache.services()}
        slices: dict[ServiceKey, list[Obj]] = {}
        for sl in self._cache.slices():
            for value in _slice_service(sl):
                ns, _, owner = value.partition("/")
                slices.setdefault((ns, owner), []).append(sl)
        self._slices = {k: tuple(v) for k, v in slices.items()}

    def services(self) -> dict[ServiceKey, Obj]:
        self._refresh()
        return self._services

    def endpoint_slices(self) -> dict[ServiceKey, tuple[Obj, ...]]:
        self._refresh()
        return self._slices


def _key(obj: Obj) -> ServiceKey:
    m = obj.get("metadata") or {}
    return str(m.get("namespace") or ""), str(m.get("name") or "")
