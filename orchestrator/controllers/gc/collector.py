"""The garbage collector's controllers (see the `gc` package doc): attempt-to-delete over the
graph's uids, which also runs the graph's informers (following new kinds), and
attempt-to-orphan. Every write is conditional: a uid precondition on deletes, the
resourceVersion on updates (`writes.update_retrying`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import trio

from orchestrator.client import ResourceInfo
from orchestrator.controllers.gc.graph import (
    FOREGROUND,
    ORPHAN,
    Graph,
    GraphNode,
    OwnerRef,
    Work,
    graph_facts,
    owner_refs,
)
from orchestrator.controllers.gc.kinds import resource_info, served_resources
from orchestrator.controllers.runtime.client import Client
from orchestrator.controllers.runtime.controller import Controller, Result
from orchestrator.controllers.runtime.informer import InformerFactory, SharedInformer
from orchestrator.controllers.runtime.manager import ControllerContext
from orchestrator.controllers.writes import update_retrying
from orchestrator.kube.errors import ApiError
from orchestrator.kube.objects import Obj
from orchestrator.metrics import REGISTRY, Registry

log = logging.getLogger(__name__)

WORKERS = 20
KINDS_PERIOD = 30.0  # seconds between looks for new kinds (upstream's discovery resync)
VIRTUAL_RECHECK = 60.0  # seconds between GETs of a verified owner whose kind is not watched


# ------------------------------------------------------------------------------ the controller
SOLID, DANGLING, WAITING = "solid", "dangling", "waiting"


class _Reconciler:
    def __init__(self, fn: Callable[[str], Any]) -> None:
        self.fn = fn

    async def reconcile(self, key: str) -> Result:
        result: Result = await self.fn(key)
        return result


class GarbageCollector(Controller):
    """The garbage collector (see the package doc): the attempt-to-delete controller, which also
    runs the graph's informers and the attempt-to-orphan controller.

    `kinds()` lists the resources to watch (called at start and every `kinds_period` s);
    `resolve(api_version, kind)` maps an owner reference to its resource (None: not served)."""

    def __init__(
        self,
        client: Client,
        informers: InformerFactory,
        kinds: Callable[[], Iterable[ResourceInfo]],
        resolve: Callable[[str, str], ResourceInfo | None],
        *,
        workers: int = WORKERS,
        kinds_period: float = KINDS_PERIOD,
        virtual_recheck: float = VIRTUAL_RECHECK,
        metrics: Registry = REGISTRY,
    ) -> None:
        super().__init__(
            "garbagecollector", _Reconciler(self._attempt_to_delete), workers, metrics=metrics
        )
        self.client = client
        self.factory = informers
        self.kinds = kinds
        self.resolve = resolve
        self.kinds_period = kinds_period
        self.virtual_recheck = virtual_recheck
        self.metrics = metrics

        def namespaced(api_version: str, kind: str) -> bool | None:
            res = self.resolve(api_version, kind)
            return None if res is None else res.namespaced

        self.graph = Graph(namespaced)
        self.orphaner = Controller(
            "garbagecollector-orphan",
            _Reconciler(self._attempt_to_orphan),
            workers,
            metrics=metrics,
        )
        self.watched: dict[tuple[str, str], SharedInformer] = {}
        self._started: set[tuple[str, str]] = set()
        for res in kinds():
            self._watch(res, informers.informer(res))

    # ------------------------------------------------------------------ graph feeding
    def _watch(self, res: ResourceInfo, inf: SharedInformer) -> None:
        self.watched[(res.group, res.plural)] = inf
        inf.add_event_handler(
            on_add=lambda obj: self._work(self.graph.observe(obj)),
            on_update=self._updated,
            on_delete=lambda obj: self._work(self.graph.forget(obj)),
        )

    def _updated(self, old: Obj, new: Obj) -> None:
        # Most updates (every status write) change nothing the graph holds: skip them.
        if graph_facts(old) != graph_facts(new):
            self._work(self.graph.observe(new))

    def _work(self, work: Work) -> None:
        for uid in work.delete:
            self.queue.add(uid)
        for uid in work.orphan:
            self.orphaner.queue.add(uid)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Informers of kinds found later run here; the caches sync before any worker starts."""
        async with trio.open_nursery() as nursery:
            for inf in list(self.watched.values()):
                await inf.wait_for_cache_sync()
            self._started.update(self.watched)
            await nursery.start(self.orphaner.run)
            await nursery.start(super().run)
            nursery.start_soon(self._follow_kinds, nursery)
            task_status.started()

    async def _follow_kinds(self, nursery: trio.Nursery) -> None:
        """Start informers for kinds served since the last look (new CRDs)."""
        while True:
            await trio.sleep(self.kinds_period)
            for res in self.kinds():
                key = (res.group, res.plural)
                if key in self.watched:
                    continue
                inf = SharedInformer(self.client, res, metrics=self.metrics)
                self._watch(res, inf)
                log.info("garbage collector: watching %s", res.group_resource)
                nursery.start_soon(inf.run)

    def watching(self, res: ResourceInfo) -> bool:
        inf = self.watched.get((res.group, res.plural))
        return inf is not None and inf.has_synced

    # ------------------------------------------------------------------ attempt to delete
    async def _attempt_to_delete(self, uid: str) -> Result:
        node = self.graph.nodes.get(uid)
        if node is None:
            return Result()
        res = self.resolve(node.api_version, node.kind)
        if res is None:
            log.info("garbage collector: %s %s: kind not served; ignored", node.kind, node.name)
            return Result()
        if node.virtual:
            return await self._verify_virtual(node, res)
        if node.deleting_dependents:
            return await self._delete_dependents(node, res)
        if node.being_deleted or not node.owners:
            return Result()
        if all(self._cached_solid(ref) for ref in node.owners):
            return Result()  # the cache says every owner exists: nothing to do (safe if stale)
        latest = await self._get(res, node.namespace, node.name, uid)
        if latest is None:
            return Result()  # gone already; the informer will tell the graph
        refs = owner_refs(latest)
        if not refs:
            return Result()
        states = {ref.uid: await self._owner_state(ref, node) for ref in refs}
        solid = [u for u, s in states.items() if s == SOLID]
        waiting = [u for u, s in states.items() if s == WAITING]
        if solid:
            if len(solid) < len(states):
                drop = set(states) - set(solid)
                await self._update(res, node.namespace, node.name, uid, _without_owners(drop))
            return Result()
        meta = latest.get("metadata") or {}
        finalizers = meta.get("finalizers") or []
        if waiting and self.graph.nodes.get(uid, node).dependents:
            policy = "Foreground"
        elif ORPHAN in finalizers:
            policy = "Orphan"
        elif FOREGROUND in finalizers:
            policy = "Foreground"
        else:
            policy = "Background"
        log.info(
            "garbage collector: deleting %s %s/%s (owners %s, policy %s)",
            node.kind,
            node.namespace,
            node.name,
            states,
            policy,
        )
        await self._delete(res, node.namespace, node.name, uid, policy)
        return Result()

    def _cached_solid(self, ref: OwnerRef) -> bool:
        owner = self.graph.nodes.get(ref.uid)
        return owner is not None and not owner.virtual and not owner.being_deleted

    async def _owner_state(self, ref: OwnerRef, dependent: GraphNode) -> str:
        """SOLID, DANGLING or WAITING, from a GET unless known absent (see the package doc)."""
        if self.graph.is_absent(ref.uid):
            return DANGLING
        if self._cached_solid(ref):
            return SOLID
        res = self.resolve(ref.api_version, ref.kind)
        if res is None:
            log.info("garbage collector: owner kind %s %s not served", ref.api_version, ref.kind)
            return SOLID  # unresolvable: never a reason to delete
        if res.namespaced and not dependent.namespace:
            log.warning(
                "garbage collector: cluster-scoped %s %s names namespaced owner %s %s; ignored",
                dependent.kind,
                dependent.name,
                ref.kind,
                ref.name,
            )
            return SOLID
        ns = dependent.namespace if res.namespaced else ""
        owner = await self._get(res, ns, ref.name, ref.uid)
        if owner is None:
            self.graph.mark_absent(ref.uid)
            return DANGLING
        meta = owner.get("metadata") or {}
        if meta.get("deletionTimestamp") and FOREGROUND in (meta.get("finalizers") or []):
            return WAITING
        return SOLID

    async def _verify_virtual(self, node: GraphNode, res: ResourceInfo) -> Result:
        ns = node.namespace if res.namespaced else ""
        live = await self._get(res, ns, node.name, node.uid)
        if live is None:
            log.info("garbage collector: owner %s %s/%s is absent", node.kind, ns, node.name)
            self._work(self.graph.remove_virtual(node.uid))
            return Result()
        current = self.graph.nodes.get(node.uid)
        if current is not None and current.virtual:
            current.verified = True
            if not self.watching(res):  # no informer will tell us when it goes: look again
                return Result(requeue_after=self.virtual_recheck)
        return Result()

    async def _delete_dependents(self, node: GraphNode, res: ResourceInfo) -> Result:
        blocking = node.blocking_dependents(self.graph)
        if not blocking:
            log.info(
                "garbage collector: %s %s/%s has no blocking dependents: removing %s",
                node.kind,
                node.namespace,
                node.name,
                FOREGROUND,
            )
            await self._update(
                res, node.namespace, node.name, node.uid, _without_finalizer(FOREGROUND)
            )
            return Result()
        for dep in blocking:
            if not dep.deleting_dependents:
                self.queue.add(dep.uid)
        return Result()

    # ------------------------------------------------------------------ attempt to orphan
    async def _attempt_to_orphan(self, uid: str) -> Result:
        node = self.graph.nodes.get(uid)
        if node is None or not node.orphaning:
            return Result()
        res = self.resolve(node.api_version, node.kind)
        if res is None:
            return Result()
        for dep_uid in sorted(node.dependents):
            dep = self.graph.nodes.get(dep_uid)
            if dep is None:
                continue
            dep_res = self.resolve(dep.api_version, dep.kind)
            if dep_res is not None:
                await self._update(
                    dep_res, dep.namespace, dep.name, dep.uid, _without_owners({uid})
                )
        log.info(
            "garbage collector: orphaned the dependents of %s %s/%s",
            node.kind,
            node.namespace,
            node.name,
        )
        await self._update(res, node.namespace, node.name, uid, _without_finalizer(ORPHAN))
        return Result()

    # ------------------------------------------------------------------ API helpers
    async def _get(self, res: ResourceInfo, ns: str, name: str, uid: str) -> Obj | None:
        """The live object, or None when it is gone or has another uid."""
        try:
            obj = await self.client.get(res, name, ns)
        except ApiError as exc:
            if exc.code == 404:
                return None
            raise
        return obj if (obj.get("metadata") or {}).get("uid") == uid else None

    async def _update(
        self, res: ResourceInfo, ns: str, name: str, uid: str, change: Callable[[Obj], bool]
    ) -> None:
        """Read-modify-write the object `uid` (`writes.update_retrying`); `change` returns False
        when there is nothing to change. Gone: nothing to do."""

        def logged(live: Obj) -> bool:
            if not change(live):
                return False
            log.info("garbage collector: updating %s %s/%s", res.group_resource, ns, name)
            return True

        await update_retrying(self.client, res, name, logged, ns, uid=uid)

    async def _delete(self, res: ResourceInfo, ns: str, name: str, uid: str, policy: str) -> None:
        try:
            await self.client.delete(
                res, name, ns, propagation_policy=policy, preconditions={"uid": uid}
            )
        except ApiError as exc:
            if exc.code not in (404, 409):  # gone, or replaced by another object of that name
                raise


def _without_owners(uids: set[str]) -> Callable[[Obj], bool]:
    def change(obj: Obj) -> bool:
        meta = obj.setdefault("metadata", {})
        refs = meta.get("ownerReferences") or []
        kept = [r for r in refs if not (isinstance(r, dict) and r.get("uid") in uids)]
        if len(kept) == len(refs):
            return False
        if kept:
            meta["ownerReferences"] = kept
        else:
            meta.pop("ownerReferences", None)
        return True

    return change


def _without_finalizer(name: str) -> Callable[[Obj], bool]:
    def change(obj: Obj) -> bool:
        meta = obj.setdefault("metadata", {})
        finalizers = list(meta.get("finalizers") or [])
        if name not in finalizers:
            return False
        meta["finalizers"] = [f for f in finalizers if f != name]
        return True

    return change


def garbage_collector(
    ctx: ControllerContext,
    *,
    workers: int = WORKERS,
    kinds_period: float = KINDS_PERIOD,
    virtual_recheck: float = VIRTUAL_RECHECK,
) -> GarbageCollector:
    """A `GarbageCollector` over every kind this server's API serves (its kind registry, read
    again every `kinds_period` s for new CRDs)."""
    registry = ctx.client.api.registry

    def resolve(api_version: str, kind: str) -> ResourceInfo | None:
        k = registry.by_gvk(api_version, kind)
        return None if k is None else resource_info(k)

    return GarbageCollector(
        ctx.client,
        ctx.informers,
        lambda: served_resources(registry),
        resolve,
        workers=workers,
        kinds_period=kinds_period,
        virtual_recheck=virtual_recheck,
        metrics=ctx.metrics,
    )
