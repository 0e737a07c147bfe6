"""The garbage collector: deletes objects whose owners are gone, and carries out foreground and
orphan deletion of owners.

Theory of operation
-------------------
Three parts, as in kube-controller-manager's garbagecollector:

* **The graph** (`Graph`, no I/O): `uid -> GraphNode`, built from informers over every served
  kind that can own or be owned (all kinds but Events, custom kinds included; kinds that appear
  later, from new CRDs, get informers within `kinds_period`). Each node keeps its owner
  references and the uids of its dependents. An owner referenced before it has been observed
  (or one that is never observed because its kind is not watched) gets a *virtual* node, which
  must be verified by a GET. The informers' handlers call `Graph.observe` / `Graph.forget`
  synchronously; in trio that makes the graph single-writer without a lock. Each call returns
  the uids to enqueue on the two work queues.
* **attempt-to-delete** (`GarbageCollector`, a `Controller` over uids, `workers` = 20):
  - a virtual node: GET it; 404 or another uid -> it is absent: drop it and enqueue its
    dependents;
  - an owner with a deletionTimestamp and the `foregroundDeletion` finalizer ("deleting its
    dependents"): when no dependent with `blockOwnerDeletion: true` remains in the graph,
    remove the finalizer (the API server then deletes the owner); else enqueue those dependents;
  - a dependent: classify each owner as *solid* (exists, same uid, not deleting dependents),
    *dangling* (404 or another uid: an owner recreated with the same name is not the owner) or
    *waiting* (deleting its dependents). Some solid -> strip the references to dangling/waiting
    owners; none solid and some waiting -> delete in the foreground if it has dependents of its
    own, else with the policy its own finalizers ask for; all dangling -> delete (Background).
    Deletes carry a uid precondition.
* **attempt-to-orphan** (a second `Controller`): an owner with a deletionTimestamp and the
  `orphan` finalizer: remove its ownerReferences from every dependent, then the finalizer.

Invariants: a dependent is deleted only after every one of its owners was *verified* absent or
waiting for dependents' deletion — by a GET made for that decision, by a watch DELETE event, or
by a relist that no longer had it (uids are never reused, so "absent" never becomes stale). A
cached "owner exists" is trusted only to do nothing. All writes are conditional (uid
precondition on deletes, resourceVersion on updates), so a stale decision fails instead of
landing on a newer object.

Not done (as upstream, or left out): cross-namespace owner references are resolved in the
dependent's namespace (so they look absent); a cluster-scoped dependent naming a namespaced
owner kind is left alone; cycles of foreground deletion are not detected.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import trio

from orchestrator.client import ResourceInfo
from orchestrator.client import resource as _known
from orchestrator.controllers.runtime.client import Client
from orchestrator.controllers.runtime.controller import Controller, Result
from orchestrator.controllers.runtime.informer import (
    DeletedFinalStateUnknown,
    InformerFactory,
    SharedInformer,
)
from orchestrator.controllers.runtime.manager import ControllerContext
from orchestrator.kube.errors import ApiError
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.kind import Kind
from orchestrator.kube.schema.kind import Registry as KindRegistry
from orchestrator.metrics import REGISTRY, Registry

__all__ = [
    "FOREGROUND",
    "ORPHAN",
    "GarbageCollector",
    "Graph",
    "GraphNode",
    "OwnerRef",
    "garbage_collector",
    "resource_info",
    "served_resources",
]

log = logging.getLogger(__name__)


FOREGROUND = "foregroundDeletion"
ORPHAN = "orphan"
WORKERS = 20
KINDS_PERIOD = 30.0  # seconds between looks for new kinds (upstream's discovery resync)
VIRTUAL_RECHECK = 60.0  # seconds between GETs of a verified owner whose kind is not watched
ABSENT_CACHE_SIZE = 10_000
UPDATE_ATTEMPTS = 5
_SKIPPED = {("", "events")}  # never owners in practice; too many to cache


# ------------------------------------------------------------------------------ kinds
def resource_info(kind: Kind) -> ResourceInfo:
    """The `ResourceInfo` of a served kind: the well-known constant when there is one (so
    informers are shared with other controllers), else one built from the kind."""
    for value in vars(_known).values():
        if isinstance(value, ResourceInfo) and (value.group, value.version, value.plural) == (
            kind.group,
            kind.version,
            kind.plural,
        ):
            return value
    return ResourceInfo(
        kind.group,
        kind.version,
        kind.plural,
        kind.kind,
        kind.namespaced,
        kind.singular,
        kind.short_names,
        kind.verbs,
        kind.categories,
        tuple(sorted(kind.subresources)),
    )


def served_resources(
    registry: KindRegistry, *, namespaced_only: bool = False, events: bool = False
) -> list[ResourceInfo]:
    """One resource per (group, plural) the server serves with list, watch and delete (the
    first version seen for kinds served in several); Events only when `events`."""
    out: dict[tuple[str, str], ResourceInfo] = {}
    for kind in registry:
        key = (kind.group, kind.plural)
        if key in out or (key in _SKIPPED and not events):
            continue
        if namespaced_only and not kind.namespaced:
            continue
        if not {"list", "watch", "delete"} <= set(kind.verbs):
            continue
        out[key] = resource_info(kind)
    return list(out.values())


# ------------------------------------------------------------------------------ the graph
@dataclass(frozen=True, slots=True)
class OwnerRef:
    uid: str
    api_version: str
    kind: str
    name: str
    block: bool = False  # blockOwnerDeletion


def _graph_facts(obj: Obj) -> tuple[Any, ...]:
    """Everything of an object `Graph.observe` reads."""
    meta = obj.get("metadata") or {}
    return (
        obj.get("apiVersion"),
        obj.get("kind"),
        meta.get("uid"),
        meta.get("namespace"),
        meta.get("name"),
        meta.get("finalizers"),
        meta.get("deletionTimestamp"),
        meta.get("ownerReferences"),
    )


def owner_refs(obj: Obj) -> tuple[OwnerRef, ...]:
    refs = []
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("uid"):
            refs.append(
                OwnerRef(
                    str(ref["uid"]),
                    str(ref.get("apiVersion") or ""),
                    str(ref.get("kind") or ""),
                    str(ref.get("name") or ""),
                    bool(ref.get("blockOwnerDeletion")),
                )
            )
    return tuple(refs)


@dataclass(slots=True, eq=False)
class GraphNode:
    uid: str
    api_version: str
    kind: str
    namespace: str
    name: str
    owners: tuple[OwnerRef, ...] = ()
    dependents: set[str] = field(default_factory=set)
    virtual: bool = False  # referenced as an owner, not observed
    verified: bool = False  # a virtual node a GET found to exist
    being_deleted: bool = False  # has a deletionTimestamp
    deleting_dependents: bool = False  # ... and the foregroundDeletion finalizer
    orphaning: bool = False  # ... and the orphan finalizer
    finalizers: tuple[str, ...] = ()

    def blocking_dependents(self, graph: Graph) -> list[GraphNode]:
        """Dependents whose reference to this node has blockOwnerDeletion."""
        out = []
        for uid in sorted(self.dependents):
            dep = graph.nodes.get(uid)
            if dep is not None and any(r.uid == self.uid and r.block for r in dep.owners):
                out.append(dep)
        return out


@dataclass(slots=True)
class Work:
    """What a graph change asks the workers to look at."""

    delete: set[str] = field(default_factory=set)
    orphan: set[str] = field(default_factory=set)


class Graph:
    """The owner/dependent graph (see the module doc); synchronous, no I/O.

    `namespaced(api_version, kind)` says whether an owner kind is namespaced (None: unknown
    kind), to place virtual nodes. Invariants: `b in nodes[a].dependents` iff `a` is the uid of
    one of `nodes[b].owners`, for every node `b` in the graph; a virtual node is removed once it
    has no dependents; `absent` only holds uids verified absent."""

    def __init__(
        self,
        namespaced: Callable[[str, str], bool | None],
        *,
        absent_cache_size: int = ABSENT_CACHE_SIZE,
    ) -> None:
        self.nodes: dict[str, GraphNode] = {}
        self.namespaced = namespaced
        self._absent: OrderedDict[str, None] = OrderedDict()
        self._absent_size = absent_cache_size

    # ------------------------------------------------------------------ absent owners
    def mark_absent(self, uid: str) -> None:
        self._absent[uid] = None
        self._absent.move_to_end(uid)
        while len(self._absent) > self._absent_size:
            self._absent.popitem(last=False)

    def is_absent(self, uid: str) -> bool:
        return uid in self._absent

    # ------------------------------------------------------------------ changes
    def observe(self, obj: Obj) -> Work:
        """An object was added or updated."""
        work = Work()
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        if not uid:
            return work
        node = self.nodes.get(uid)
        if node is None:
            node = GraphNode(uid, "", "", "", "")
            self.nodes[uid] = node
            was_deleting, was_orphaning = False, False
        else:
            was_deleting, was_orphaning = node.deleting_dependents, node.orphaning
        node.virtual = False
        node.verified = False
        node.api_version = str(obj.get("apiVersion") or "")
        node.kind = str(obj.get("kind") or "")
        node.namespace = str(meta.get("namespace") or "")
        node.name = str(meta.get("name") or "")
        finalizers = tuple(str(f) for f in meta.get("finalizers") or [])
        node.finalizers = finalizers
        node.being_deleted = bool(meta.get("deletionTimestamp"))
        node.deleting_dependents = node.being_deleted and FOREGROUND in finalizers
        node.orphaning = node.being_deleted and ORPHAN in finalizers
        old, new = node.owners, owner_refs(obj)
        node.owners = new
        self._relink(node, old, new, work)
        if node.deleting_dependents and not was_deleting:
            work.delete.update(node.dependents)
            work.delete.add(uid)
        if node.orphaning and not was_orphaning:
            work.orphan.add(uid)
        return work

    def forget(self, obj: Obj | DeletedFinalStateUnknown) -> Work:
        """An object was deleted (seen by a watch or a relist): it is verified absent."""
        if isinstance(obj, DeletedFinalStateUnknown):
            obj = obj.obj
        work = Work()
        uid = str((obj.get("metadata") or {}).get("uid") or "")
        node = self.nodes.pop(uid, None)
        if not uid:
            return work
        self.mark_absent(uid)
        if node is None:
            return work
        self._relink(node, node.owners, (), work)
        work.delete.update(d for d in node.dependents if d in self.nodes)
        return work

    def remove_virtual(self, uid: str) -> Work:
        """A virtual node was verified absent: drop it, look at its dependents again."""
        work = Work()
        self.mark_absent(uid)
        node = self.nodes.get(uid)
        if node is None or not node.virtual:
            return work
        del self.nodes[uid]
        work.delete.update(d for d in node.dependents if d in self.nodes)
        return work

    def _relink(
        self, node: GraphNode, old: tuple[OwnerRef, ...], new: tuple[OwnerRef, ...], work: Work
    ) -> None:
        old_by_uid = {r.uid: r for r in old}
        new_by_uid = {r.uid: r for r in new}
        for uid, ref in old_by_uid.items():
            owner = self.nodes.get(uid)
            if owner is None:
                continue
            if uid not in new_by_uid:
                owner.dependents.discard(node.uid)
                if owner.virtual and not owner.dependents:
                    del self.nodes[uid]
            if owner.deleting_dependents and new_by_uid.get(uid) != ref:
                work.delete.add(uid)  # a (blocking) dependent went away or stopped blocking
        for uid, ref in new_by_uid.items():
            if uid in old_by_uid:
                continue
            owner = self.nodes.get(uid)
            if owner is None:
                if self.is_absent(uid):
                    work.delete.add(node.uid)  # its owner is already known to be gone
                    continue
                namespaced = self.namespaced(ref.api_version, ref.kind)
                ns = node.namespace if namespaced else ""
                owner = GraphNode(uid, ref.api_version, ref.kind, ns, ref.name, virtual=True)
                self.nodes[uid] = owner
                work.delete.add(uid)  # verify it
            owner.dependents.add(node.uid)
            if owner.deleting_dependents:
                work.delete.add(node.uid)


# ------------------------------------------------------------------------------ the controller
SOLID, DANGLING, WAITING = "solid", "dangling", "waiting"


class _Reconciler:
    def __init__(self, fn: Callable[[str], Any]) -> None:
        self.fn = fn

    async def reconcile(self, key: str) -> Result:
        result: Result = await self.fn(key)
        return result


class GarbageCollector(Controller):
    """The garbage collector (see the module doc): the attempt-to-delete controller, which also
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
        if _graph_facts(old) != _graph_facts(new):
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
        """SOLID, DANGLING or WAITING, from a GET unless known absent (see the module doc)."""
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
        """Read-modify-write the object `uid` (conditional on its resourceVersion); `change`
        returns False when there is nothing to change. Gone: nothing to do."""
        for _ in range(UPDATE_ATTEMPTS):
            live = await self._get(res, ns, name, uid)
            if live is None or not change(live):
                return
            log.info("garbage collector: updating %s %s/%s", res.group_resource, ns, name)
            try:
                await self.client.update(res, live)
                return
            except ApiError as exc:
                if exc.code == 404:
                    return
                if exc.code != 409:
                    raise
        raise ApiError(409, "Conflict", f"{res.group_resource} {ns}/{name}: too many conflicts")

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
