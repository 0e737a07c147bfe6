"""The garbage collector: deletes objects whose owners are gone, and carries out foreground and
orphan deletion of owners.

Modules: `graph` (the owner/dependent graph, no I/O), `collector` (the two controllers that
act on it), `kinds` (which served resources it watches; the namespace controller uses that
list too).

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

from orchestrator.controllers.gc.collector import GarbageCollector, garbage_collector
from orchestrator.controllers.gc.graph import FOREGROUND, ORPHAN, Graph, GraphNode, OwnerRef
from orchestrator.controllers.gc.kinds import resource_info, served_resources

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
