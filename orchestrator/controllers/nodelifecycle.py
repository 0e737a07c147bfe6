"""Node lifecycle: nodes whose heartbeats stop become Ready=Unknown and tainted; pods on
NoExecute-tainted nodes are evicted once their tolerations run out.

Theory of operation
-------------------
**Health monitor** (`NodeLifecycleController`, a `Controller` over node names). A node's
heartbeats are its Lease `kube-node-lease/<node>` (`spec.renewTime`, renewed every 10 s by the
kubelet) and its Ready condition's `lastHeartbeatTime`. Like upstream, the controller does not
compare those timestamps with its own clock (clocks at the edge drift): `HealthTracker` records
*when it observed* the pair change, on its own monotonic clock (`probe time`). Each node is
reconciled when it or its Lease changes and every `monitor_period` (5 s) anyway:

    now - probe time > grace_period (40 s; 10 s suits a small edge site)
        and Ready is not Unknown      -> Ready (and the pressure conditions) := Unknown,
                                         reason NodeStatusUnknown, "Kubelet stopped posting
                                         node status." (status subresource)
    then the lifecycle taint follows Ready, with effects NoExecute (timeAdded set when added)
    and NoSchedule (so the scheduler stays away):
        Unknown -> node.kubernetes.io/unreachable, False -> node.kubernetes.io/not-ready,
        True -> neither.

Recovery is the kubelet's: once it posts Ready=True again, the taint is removed. A node first
seen by this controller (a start, a new leader) gets a whole grace period from then.

**Taint manager** (`TaintManager`, a `Controller` over pod keys; pods are enqueued on their own
changes and on any change of their node's NoExecute taints). For a pod bound to a node with
NoExecute taints, `eviction_delay` (pure) decides:

    a taint no toleration matches                -> evict now
    every taint tolerated; the matching ones'
      smallest tolerationSeconds is S            -> evict at (the taint's timeAdded + S)
    matching tolerations without tolerationSeconds -> never

and the reconcile either deletes the pod or requeues itself for the eviction time. On an
unreachable node the kubelet cannot confirm a graceful stop, so the eviction is a force delete
(gracePeriodSeconds 0), and so is a pod stuck terminating there past its eviction time; on
other nodes the pod's own grace period applies. The pods' controllers then replace them on
healthy nodes. Every pod gets not-ready/unreachable NoExecute tolerations of 300 s at admission
(the Pod kind's defaults), so by default a dead node's pods go after grace + 300 s.

Invariants: the monitor writes only Ready-family conditions and the two lifecycle taints; the
taint manager only deletes pods bound to a node that currently has a NoExecute taint the pod
has not tolerated for long enough, as read from the caches at decision time, with a uid
precondition on the delete.

Not done: per-zone eviction rate limits and the all-zones-disrupted stop (upstream's
protection against control-plane partitions).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import trio

from orchestrator.client.resource import LEASES, NODES, PODS
from orchestrator.controllers.runtime.client import Client
from orchestrator.controllers.runtime.controller import Controller, Result
from orchestrator.controllers.runtime.events import EventRecorder
from orchestrator.controllers.runtime.informer import (
    NODE_NAME_INDEX,
    InformerFactory,
    SharedInformer,
    object_key,
)
from orchestrator.controllers.runtime.manager import ControllerContext
from orchestrator.controllers.writes import update_retrying
from orchestrator.kube.conditions import get_condition
from orchestrator.kube.errors import ApiError
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.columns import now_rfc3339, parse_rfc3339
from orchestrator.kube.taints import tolerates_taint
from orchestrator.metrics import REGISTRY, Registry

__all__ = [
    "NOT_READY_TAINT",
    "UNREACHABLE_TAINT",
    "HealthTracker",
    "NodeLifecycleController",
    "NodeLifecycleOptions",
    "TaintManager",
    "eviction_delay",
    "node_lifecycle_controllers",
    "tolerates",
]

log = logging.getLogger(__name__)


UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
NO_EXECUTE = "NoExecute"
NO_SCHEDULE = "NoSchedule"
NODE_LEASE_NAMESPACE = "kube-node-lease"
UNKNOWN_REASON = "NodeStatusUnknown"
UNKNOWN_MESSAGE = "Kubelet stopped posting node status."
NEVER_REASON = "NodeStatusNeverUpdated"
NEVER_MESSAGE = "Kubelet never posted node status."
# Conditions the monitor sets to Unknown along with Ready (as upstream).
_CONDITIONS = ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure")


@dataclass(frozen=True, slots=True)
class NodeLifecycleOptions:
    """`grace_period`: heartbeat silence before Ready=Unknown (--node-monitor-grace-period;
    upstream 40 s before v1.32, 50 s since); `monitor_period`: how often every node is looked
    at (--node-monitor-period)."""

    grace_period: float = 40.0
    monitor_period: float = 5.0
    lease_namespace: str = NODE_LEASE_NAMESPACE
    workers: int = 5
    taint_workers: int = 5


# ------------------------------------------------------------------------------ pure cores
class HealthTracker:
    """When each node's heartbeats last changed, on the controller's clock (no I/O)."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[tuple[str, str], float]] = {}

    def observe(self, node: str, heartbeat: tuple[str, str], now: float) -> float:
        """Record the node's (lease renewTime, Ready lastHeartbeatTime); return its probe time:
        `now` if that pair is new or changed, else when it last changed."""
        seen = self._seen.get(node)
        if seen is None or seen[0] != heartbeat:
            self._seen[node] = (heartbeat, now)
            return now
        return seen[1]

    def forget(self, node: str) -> None:
        self._seen.pop(node, None)


def tolerates(toleration: Obj, taint: Obj) -> bool:
    """Does `toleration` tolerate `taint` (core/v1 Toleration.ToleratesTaint, `kube.taints`)?"""
    return tolerates_taint(toleration, taint)


def eviction_delay(tolerations: list[Obj], taints: list[Obj]) -> float | None:
    """Seconds a pod may stay on a node with these NoExecute `taints` once they are added:
    0 when one is not tolerated, None for ever. Like upstream, each taint uses the first
    toleration that matches it, and the smallest tolerationSeconds among those counts."""
    delay: float | None = None
    for taint in taints:
        match = next((t for t in tolerations if tolerates(t, taint)), None)
        if match is None:
            return 0.0
        seconds = match.get("tolerationSeconds")
        if seconds is None:
            continue
        seconds = max(float(seconds), 0.0)
        delay = seconds if delay is None else min(delay, seconds)
    return delay


def _no_execute_taints(node: Obj) -> list[Obj]:
    taints = (node.get("spec") or {}).get("taints") or []
    return [t for t in taints if isinstance(t, dict) and t.get("effect") == NO_EXECUTE]


def wanted_taint(node: Obj) -> str | None:
    """The lifecycle taint the node's Ready condition calls for."""
    ready = get_condition(node.get("status"), "Ready")
    status = (ready or {}).get("status", "Unknown")
    if status == "True":
        return None
    return NOT_READY_TAINT if status == "False" else UNREACHABLE_TAINT


# ------------------------------------------------------------------------------ health monitor
class NodeLifecycleController(Controller):
    """The health monitor (see the module doc)."""

    def __init__(
        self,
        client: Client,
        informers: InformerFactory,
        options: NodeLifecycleOptions | None = None,
        *,
        events: EventRecorder | None = None,
        clock: Callable[[], float] = time.time,
        metrics: Registry = REGISTRY,
    ) -> None:
        self.options = opts = options or NodeLifecycleOptions()
        super().__init__("node-lifecycle", self, opts.workers, metrics=metrics)
        self.client = client
        self.events = events
        self.clock = clock
        self.tracker = HealthTracker()
        self.nodes = informers.informer(NODES)
        self.leases = informers.informer(LEASES, opts.lease_namespace)
        self.watches(self.nodes)
        self.watches(self.leases, lambda lease: (lease.get("metadata") or {}).get("name"))

    async def reconcile(self, key: str) -> Result:
        node = self.nodes.get(key)
        if node is None:
            self.tracker.forget(key)
            return Result()
        opts = self.options
        lease = self.leases.get(f"{opts.lease_namespace}/{key}") or {}
        renew = str((lease.get("spec") or {}).get("renewTime") or "")
        ready = get_condition(node.get("status"), "Ready") or {}
        now = trio.current_time()
        probe = self.tracker.observe(key, (renew, str(ready.get("lastHeartbeatTime") or "")), now)
        if now - probe > opts.grace_period and ready.get("status") != "Unknown":
            log.info("node %s: no heartbeat for %.0fs: Ready=Unknown", key, now - probe)
            node = await self._mark_unknown(key) or node
            if self.events is not None:
                self.events.record(
                    node, "Normal", "NodeNotReady", f"Node {key} status is now: NodeNotReady"
                )
        await self._sync_taints(key, wanted_taint(node))
        wait = opts.grace_period - (now - probe)
        return Result(
            requeue_after=min(opts.monitor_period, wait) if wait > 0 else opts.monitor_period
        )

    async def _mark_unknown(self, name: str) -> Obj | None:
        stamp = now_rfc3339(self.clock())

        def change(node: Obj) -> bool:
            status = node.setdefault("status", {})
            conditions = [c for c in status.get("conditions") or [] if isinstance(c, dict)]
            changed = False
            for ctype in _CONDITIONS:
                c = next((c for c in conditions if c.get("type") == ctype), None)
                if c is None:
                    if ctype != "Ready":
                        continue
                    c = {
                        "type": "Ready",
                        "reason": NEVER_REASON,
                        "message": NEVER_MESSAGE,
                        "lastHeartbeatTime": stamp,
                    }
                    conditions.append(c)
                elif c.get("status") == "Unknown":
                    continue
                else:
                    c["reason"], c["message"] = UNKNOWN_REASON, UNKNOWN_MESSAGE
                c["status"] = "Unknown"
                c["lastTransitionTime"] = stamp
                changed = True
            status["conditions"] = conditions
            return changed

        return await update_retrying(self.client, NODES, name, change, subresource="status")

    async def _sync_taints(self, name: str, wanted: str | None) -> None:
        """Make the node's lifecycle taints exactly `wanted` with both effects (NoExecute for
        the taint manager, NoSchedule for the scheduler), keeping timeAdded of those kept."""
        lifecycle = {UNREACHABLE_TAINT, NOT_READY_TAINT}
        want = {(wanted, effect) for effect in (NO_EXECUTE, NO_SCHEDULE)} if wanted else set()

        def lifecycle_taints(node: Obj) -> set[tuple[str, str]]:
            taints = (node.get("spec") or {}).get("taints") or []
            return {
                (str(t.get("key")), str(t.get("effect")))
                for t in taints
                if isinstance(t, dict) and t.get("key") in lifecycle
            }

        if lifecycle_taints(self.nodes.get(name) or {}) == want:
            return  # the cache agrees already (the update below re-checks the live object)
        stamp = now_rfc3339(self.clock())

        def change(live: Obj) -> bool:
            if lifecycle_taints(live) == want:
                return False
            spec = live.setdefault("spec", {})
            taints = [t for t in spec.get("taints") or [] if isinstance(t, dict)]
            kept = [
                t
                for t in taints
                if t.get("key") not in lifecycle or (t.get("key"), t.get("effect")) in want
            ]
            have = {(t.get("key"), t.get("effect")) for t in kept}
            for key, effect in sorted(want - have):
                taint: Obj = {"key": key, "effect": effect}
                if effect == NO_EXECUTE:
                    taint["timeAdded"] = stamp
                kept.append(taint)
            if kept:
                spec["taints"] = kept
            else:
                spec.pop("taints", None)
            return True

        log.info("node %s: lifecycle taint -> %s", name, wanted or "none")
        await update_retrying(self.client, NODES, name, change)


# ------------------------------------------------------------------------------ taint manager
class TaintManager(Controller):
    """Evicts pods from NoExecute-tainted nodes (see the module doc)."""

    def __init__(
        self,
        client: Client,
        informers: InformerFactory,
        *,
        workers: int = 5,
        events: EventRecorder | None = None,
        clock: Callable[[], float] = time.time,
        metrics: Registry = REGISTRY,
    ) -> None:
        super().__init__("taint-eviction", self, workers, metrics=metrics)
        self.client = client
        self.events = events
        self.clock = clock
        self.pods = informers.informer(PODS)
        self.nodes: SharedInformer = informers.informer(NODES)
        # A pod on a node without NoExecute taints has nothing to fear (its reconcile would
        # return at once), so it is not queued at all; when its node gets tainted, the node's
        # pods are queued then (`_node_changed`). Every pod write would be queued otherwise.
        self.watches(self.pods, when=self._on_tainted_node)
        self._first_seen: dict[tuple[str, str], float] = {}  # (node, taint key) without timeAdded
        self.nodes.add_event_handler(
            on_add=self._node_changed,
            on_update=lambda old, new: self._node_changed(new, old),
        )
        if self.nodes not in self._informers:
            self._informers.append(self.nodes)

    def _on_tainted_node(self, pod: Obj) -> bool:
        node_name = (pod.get("spec") or {}).get("nodeName")
        node = self.nodes.get(str(node_name)) if node_name else None
        return node is not None and bool(_no_execute_taints(node))

    def _node_changed(self, node: Obj, old: Obj | None = None) -> None:
        taints = _no_execute_taints(node)
        if old is not None and taints == _no_execute_taints(old):
            return
        name = str((node.get("metadata") or {}).get("name") or "")
        for pod in self.pods.by_index(NODE_NAME_INDEX, name):
            self.queue.add(object_key(pod))

    def _taint_added(self, node: str, taint: Obj, now: float) -> float:
        added = parse_rfc3339(str(taint.get("timeAdded") or ""))
        if added is not None:
            return added
        return self._first_seen.setdefault((node, str(taint.get("key"))), now)

    async def reconcile(self, key: str) -> Result:
        pod = self.pods.get(key)
        if pod is None:
            return Result()
        node_name = (pod.get("spec") or {}).get("nodeName")
        node = self.nodes.get(str(node_name)) if node_name else None
        if node is None:
            return Result()
        taints = _no_execute_taints(node)
        if not taints:
            return Result()
        tolerations = [
            t for t in (pod.get("spec") or {}).get("tolerations") or [] if isinstance(t, dict)
        ]
        delay = eviction_delay(tolerations, taints)
        if delay is None:
            return Result()
        now = self.clock()
        since = min(self._taint_added(str(node_name), t, now) for t in taints)
        evict_at = since + delay if delay else now
        if evict_at > now:
            return Result(requeue_after=evict_at - now)
        unreachable = any(t.get("key") == UNREACHABLE_TAINT for t in taints)
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp") and not unreachable:
            return Result()  # already terminating; its kubelet will finish it
        ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        log.info("taint manager: evicting pod %s from node %s", key, node_name)
        if self.events is not None:
            self.events.record(
                pod, "Normal", "TaintManagerEviction", f"Marking for deletion Pod {key}"
            )
        try:
            await self.client.delete(
                PODS,
                name,
                ns,
                preconditions={"uid": meta.get("uid")},
                grace_period_seconds=0 if unreachable else None,
            )
        except ApiError as exc:
            if exc.code not in (404, 409):
                raise
        return Result()


def node_lifecycle_controllers(
    ctx: ControllerContext, options: NodeLifecycleOptions | None = None
) -> list[Controller]:
    """The health monitor and the taint manager."""
    opts = options or NodeLifecycleOptions()
    return [
        NodeLifecycleController(
            ctx.client, ctx.informers, opts, events=ctx.events, metrics=ctx.metrics
        ),
        TaintManager(
            ctx.client,
            ctx.informers,
            workers=opts.taint_workers,
            events=ctx.events,
            metrics=ctx.metrics,
        ),
    ]
