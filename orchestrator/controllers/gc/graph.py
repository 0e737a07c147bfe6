"""The garbage collector's owner/dependent graph (see the `gc` package doc): `uid ->
GraphNode`, fed synchronously by informer handlers (`Graph.observe` / `Graph.forget`), each
call returning the uids the workers must look at. Synchronous, no I/O; in trio that makes it
single-writer without a lock."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.controllers.runtime.informer import DeletedFinalStateUnknown
from orchestrator.kube.objects import Obj

FOREGROUND = "foregroundDeletion"
ORPHAN = "orphan"
ABSENT_CACHE_SIZE = 10_000


@dataclass(frozen=True, slots=True)
class OwnerRef:
    uid: str
    api_version: str
    kind: str
    name: str
    block: bool = False  # blockOwnerDeletion


def graph_facts(obj: Obj) -> tuple[Any, ...]:
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
    """The owner/dependent graph (see the package doc); synchronous, no I/O.

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
