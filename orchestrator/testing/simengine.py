"""The engine behind simulated nodes: serves any number of them with ONE pod watch, ONE timer
task and a fixed pool of writers (the theory of operation is in `orchestrator.testing.nodes`,
whose `SimulatedNode.run` and `SimulatedCluster.run` each drive one `Engine`).

The engine does the I/O and the scheduling: registration (Node and Lease, re-posting the status
of a Node that exists), Lease renewals and status reports from a heap of deadlines (written by
heartbeat writers of their own, as many as nodes: every node renews on its own, as kubelets do,
and a pool smaller than the nodes would queue renewals behind each other whenever the server is
slow, measuring the pool; a node's next renewal is skipped while its last one is still in
flight, as a kubelet's lease loop is sequential), the shared
pod watch dispatched client-side by `spec.nodeName`, and a work queue of pod keys (deduplicated
while queued) drained by `workers` tasks that mark pods Running or finish their deletion. What a
node writes (its Node, status, Lease, a pod's status) and its partition state come from the node
itself, through the small `EngineNode` protocol.

Invariants: a pod is started at most once per UID; a key is in the work queue at most once;
nothing is written for a node whose heartbeats are stopped (its work is parked until
`on_resume`). Errors writing a pod are logged and retried after `RETRY_DELAY`; a 404 drops the
work; a failed watch is reopened after `WATCH_BACKOFF`.

Heartbeat phases: the k-th of n nodes makes its first renewal (and status report) 1 + k/n
intervals after registering, so n nodes registered in the same second do not all renew in the
same second ever after (real agents start at different times; a herd of 1,000 Lease writes
every 10 s would make the last ones seconds late and measure the herd, not the server).
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from orchestrator.agent.node import NODE_LEASE_NAMESPACE, micro_time
from orchestrator.client import ApiConnectionError
from orchestrator.client.resource import LEASES, NODES, PODS
from orchestrator.controllers.runtime.client import Client
from orchestrator.kube.errors import ApiError
from orchestrator.kube.objects import Obj

__all__ = ["LEASE_LATE", "RETRY_DELAY", "WATCH_BACKOFF", "Engine", "EngineNode", "SimStatistics"]

log = logging.getLogger(__name__)

RETRY_DELAY = 1.0
WATCH_BACKOFF = 1.0
LEASE_LATE = 2.0  # a renewal done later than this after its due time counts as late
_TERMINAL = frozenset({"Succeeded", "Failed"})


class EngineNode(Protocol):
    """What the engine needs of a node (`orchestrator.testing.nodes.SimulatedNode`)."""

    name: str
    client: Client
    clock: Callable[[], float]
    grace_period: float | None
    renew_interval: float
    start_delay: float
    status_interval: float
    lease_duration: int
    uid: str
    registered: trio.Event
    on_resume: Callable[[Any], None] | None  # the engine's hook, called by resume_heartbeats()

    @property
    def heartbeating(self) -> bool: ...

    def node_object(self, now: float) -> Obj: ...

    def node_status(self, now: float) -> Obj: ...

    def lease(self, now: float) -> Obj: ...

    def pod_status(self, pod: Obj, key: str, now: float) -> Obj: ...

    def release_ip(self, key: str) -> None: ...


@dataclass(slots=True)
class SimStatistics:
    """Counters of what the simulated nodes did (a snapshot from `statistics()`)."""

    nodes: int = 0
    pods: int = 0
    """Pods currently bound to these nodes (as last seen by the watch)."""
    started: int = 0
    """Pods marked Running by these nodes."""
    deleted: int = 0
    """Pod deletions finished by these nodes."""
    lease_renewals: int = 0
    status_reports: int = 0
    errors: int = 0
    parked: int = 0
    """Pod work waiting for a partitioned node to come back."""
    server_errors: int = 0
    """Requests (pods, Leases, Nodes, the pod watch) the API answered with a 5xx."""
    connection_errors: int = 0
    """Requests that got no answer (connection failed or broke, or the client's timeout)."""
    lease_failures: int = 0
    """Lease renewals the API refused or failed."""
    lease_late: int = 0
    """Lease renewals done more than `LEASE_LATE` seconds after they were due."""
    lease_lost: int = 0
    """Times a heartbeating node went `lease_duration` or longer without a renewal: the node
    lifecycle controller may have seen its Lease expire."""
    lease_max_delay: float = 0.0
    """The longest a renewal took from its due time to its success (s)."""


@dataclass(slots=True)
class _Pod:
    node: EngineNode
    pod: Obj | None  # its latest state while work is queued for it, else None (memory)
    uid: str
    started: bool = False  # this engine reported this UID Running
    queued: bool = False  # in the work queue, or waiting in the timer heap
    deleting_at: float | None = None  # trio time at which a pending deletion is finished


@dataclass(order=True, slots=True)
class _Timer:
    due: float
    seq: int
    what: str = field(compare=False)  # "pod", "lease", "status"
    key: str = field(compare=False)  # pod key or node name


async def _parallel(items: Iterable[Any], fn: Callable[[Any], Any], limit: int) -> None:
    """Run `await fn(item)` for every item with at most `limit` in flight."""
    it = iter(items)

    async def worker() -> None:
        for item in it:
            await fn(item)

    async with trio.open_nursery() as nursery:
        for _ in range(limit):
            nursery.start_soon(worker)


class Engine:
    """Serves `nodes` with one pod watch, one timer and `workers` writers (module doc)."""

    def __init__(
        self,
        nodes: Sequence[EngineNode],
        watch_client: Client,
        field_selector: str,
        *,
        workers: int,
        on_pod_running: Callable[[Obj, float], None] | None,
    ) -> None:
        self.nodes = {n.name: n for n in nodes}
        self.watch_client = watch_client
        self.field_selector = field_selector
        self.workers = max(1, workers)
        self.on_pod_running = on_pod_running
        self.pods: dict[str, _Pod] = {}
        self.parked: dict[str, list[str]] = {n.name: [] for n in nodes}
        self.stats = SimStatistics(nodes=len(nodes))
        self._timers: list[_Timer] = []
        self._seq = 0
        self._last_renewal: dict[str, float] = {}  # node -> trio time of its last Lease write
        # The first heartbeat after registering, in intervals (see the module doc).
        self._phase = {n.name: 1 + i / len(nodes) for i, n in enumerate(nodes)}
        self._wake = trio.Event()
        self._send, self._receive = trio.open_memory_channel[str](math.inf)
        # Heartbeats due, for their own writers: a slow write never holds up the timers (pod
        # starts are timers too), and a node has at most one renewal (one report) queued.
        self._beats_send, self._beats_receive = trio.open_memory_channel[
            tuple[str, EngineNode, float]
        ](math.inf)
        self._beats_queued: set[tuple[str, str]] = set()  # (what, node) queued or in flight
        for n in nodes:
            n.on_resume = self._on_resume

    def statistics(self) -> SimStatistics:
        s = self.stats
        return dataclasses.replace(
            s, pods=len(self.pods), parked=sum(len(p) for p in self.parked.values())
        )

    # ------------------------------------------------------------------ timers
    def _at(self, due: float, what: str, key: str) -> None:
        self._seq += 1
        heapq.heappush(self._timers, _Timer(due, self._seq, what, key))
        if self._timers[0].seq == self._seq:
            self._wake.set()

    def _enqueue(self, key: str) -> None:
        self._send.send_nowait(key)

    async def _timer_loop(self) -> None:
        while True:
            now = trio.current_time()
            due: list[_Timer] = []
            while self._timers and self._timers[0].due <= now:
                due.append(heapq.heappop(self._timers))
            for t in due:
                if t.what == "pod":
                    self._enqueue(t.key)
                    continue
                node = self.nodes[t.key]
                interval = node.renew_interval if t.what == "lease" else node.status_interval
                self._at(now + interval, t.what, t.key)
                job = (t.what, t.key)
                if node.heartbeating and job not in self._beats_queued:
                    self._beats_queued.add(job)  # else the previous one is not done: skip
                    self._beats_send.send_nowait((t.what, node, t.due))
            self._wake = trio.Event()
            deadline = self._timers[0].due if self._timers else math.inf
            with trio.move_on_at(deadline):
                await self._wake.wait()

    async def _heartbeat_worker(self) -> None:
        async for job in self._beats_receive:
            try:
                await self._heartbeat(job)
            finally:
                self._beats_queued.discard((job[0], job[1].name))

    async def _heartbeat(self, job: tuple[str, EngineNode, float]) -> None:
        what, node, due = job
        try:
            if what == "lease":
                await self._renew_lease(node)
                self._lease_renewed(node, due)
            else:
                await self._report_status(node)
        except ApiError as exc:
            self._count_error(exc, f"node {node.name}: {what}")
            if what == "lease":
                self.stats.lease_failures += 1
            log.warning("simulated node %s: %s failed: %s", node.name, what, exc)

    def _count_error(self, exc: ApiError, what: str) -> None:
        """Count a failed request; a 5xx, or a request that got no answer, is logged (warning)
        with what it was, so a benchmark's count can be traced to its requests."""
        self.stats.errors += 1
        if isinstance(exc.__cause__, ApiConnectionError):  # HttpClient's 503 for no answer
            self.stats.connection_errors += 1
            log.warning("simulated nodes: %s: no answer: %s", what, exc)
        elif exc.code >= 500:
            self.stats.server_errors += 1
            log.warning("simulated nodes: %s: the server answered %s", what, exc)

    def _lease_renewed(self, node: EngineNode, due: float) -> None:
        """Lease health: how late this renewal was, and whether the Lease lapsed before it."""
        now = trio.current_time()
        delay = max(0.0, now - due)
        stats = self.stats
        stats.lease_max_delay = max(stats.lease_max_delay, delay)
        if delay > LEASE_LATE:
            stats.lease_late += 1
        last = self._last_renewal.get(node.name)
        if last is not None and now - last >= node.lease_duration:
            stats.lease_lost += 1
        self._last_renewal[node.name] = now

    async def _renew_lease(self, node: EngineNode) -> None:
        now = node.clock()
        patch = {"spec": {"renewTime": micro_time(now), "holderIdentity": node.name}}
        try:
            await node.client.patch(LEASES, node.name, patch, NODE_LEASE_NAMESPACE)
        except ApiError as exc:
            if exc.code != 404:
                raise
            await node.client.create(LEASES, node.lease(now), NODE_LEASE_NAMESPACE)
        self.stats.lease_renewals += 1

    async def _report_status(self, node: EngineNode) -> None:
        patch = {"status": node.node_status(node.clock())}
        await node.client.patch(NODES, node.name, patch, subresource="status")
        self.stats.status_reports += 1

    def _on_resume(self, node: EngineNode) -> None:
        now = trio.current_time()
        self._at(now, "lease", node.name)
        self._at(now, "status", node.name)
        parked, self.parked[node.name] = self.parked[node.name], []
        for key in parked:
            self._enqueue(key)

    # ------------------------------------------------------------------ registration
    async def _register(self, node: EngineNode) -> None:
        """Register `node`, retrying (as a kubelet does) while the API refuses, e.g. before
        the server has created the `kube-node-lease` namespace."""
        delay = 0.05
        while True:
            try:
                await self._register_once(node)
                return
            except ApiError as exc:
                self._count_error(exc, f"node {node.name}: registration")
                log.info("simulated node %s: registration failed: %s; retrying", node.name, exc)
            await trio.sleep(delay)
            delay = min(delay * 2, RETRY_DELAY)

    async def _register_once(self, node: EngineNode) -> None:
        now = node.clock()
        try:
            created = await node.client.create(NODES, node.node_object(now))
        except ApiError as exc:
            if exc.code != 409:
                raise
            created = await node.client.patch(
                NODES, node.name, {"status": node.node_status(now)}, subresource="status"
            )
        node.uid = str((created.get("metadata") or {}).get("uid") or "")
        lease = node.lease(now)
        try:
            await node.client.create(LEASES, lease, NODE_LEASE_NAMESPACE)
        except ApiError as exc:
            if exc.code != 409:
                raise
            await node.client.patch(
                LEASES, node.name, {"spec": lease["spec"]}, NODE_LEASE_NAMESPACE
            )
        node.registered.set()
        start = trio.current_time()
        self._last_renewal[node.name] = start  # the Lease just written: lapses count from here
        phase = self._phase.get(node.name, 1.0)
        self._at(start + node.renew_interval * phase, "lease", node.name)
        self._at(start + node.status_interval * phase, "status", node.name)

    # ------------------------------------------------------------------ pod events
    def _observe(self, etype: str, pod: Obj) -> None:
        rec = self._observe_pod(etype, pod)
        if rec is not None and not rec.queued:
            rec.pod = None  # nothing to do for it: do not keep a pod per pod (100,000s of them)

    def _observe_pod(self, etype: str, pod: Obj) -> _Pod | None:
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"
        node = self.nodes.get(str((pod.get("spec") or {}).get("nodeName") or ""))
        rec = self.pods.get(key)
        uid = str(meta.get("uid") or "")
        if etype == "DELETED" or node is None:
            if rec is not None:
                del self.pods[key]
                rec.node.release_ip(key)
            return None
        if rec is None or rec.uid != uid:
            if rec is not None:
                rec.node.release_ip(key)
            rec = self.pods[key] = _Pod(node, pod, uid)
        else:
            rec.pod = pod
        status = pod.get("status") or {}
        if meta.get("deletionTimestamp"):
            if rec.deleting_at is None:  # first sight of the deletion: schedule it even if a
                grace = node.grace_period  # (delayed) start is queued; the worker rechecks
                if grace is None:
                    grace = float(meta.get("deletionGracePeriodSeconds") or 0)
                rec.deleting_at = trio.current_time() + grace
                self._schedule(key, rec, rec.deleting_at)
            elif not rec.queued:
                self._schedule(key, rec, rec.deleting_at)
        elif rec.queued or status.get("phase") in _TERMINAL or rec.started:
            pass
        elif status.get("phase") == "Running" and _all_ready(status):
            rec.started = True  # already running (e.g. an agent restart): nothing to do
        else:
            self._schedule(key, rec, trio.current_time() + node.start_delay)
        return rec

    def _schedule(self, key: str, rec: _Pod, due: float) -> None:
        rec.queued = True
        if due <= trio.current_time():
            self._enqueue(key)
        else:
            self._at(due, "pod", key)

    async def _watch_loop(self, *, task_status: trio.TaskStatus[None]) -> None:
        rv = ""
        started = False
        while True:
            try:
                async with self.watch_client.watch(
                    PODS, field_selector=self.field_selector, resource_version=rv, read_only=True
                ) as events:  # pods are only read (status writes are built afresh)
                    if not started:
                        started = True
                        task_status.started()
                    async for etype, obj in events:
                        new_rv = (obj.get("metadata") or {}).get("resourceVersion")
                        if new_rv:
                            rv = str(new_rv)
                        if etype != "BOOKMARK":
                            self._observe(etype, obj)
                continue  # a clean end: re-watch from the last resourceVersion
            except ApiError as exc:
                if exc.code == 410:
                    rv = ""  # compacted: start over from a fresh snapshot (level-based)
                    continue
                self._count_error(exc, "the pod watch")
                log.warning("simulated nodes: pod watch failed: %s; retrying", exc)
            await trio.sleep(WATCH_BACKOFF)

    # ------------------------------------------------------------------ pod work
    async def _worker(self) -> None:
        async for key in self._receive:
            rec = self.pods.get(key)
            if rec is None:
                continue
            if not rec.node.heartbeating:
                self.parked[rec.node.name].append(key)
                continue
            rec.queued = False
            pod = rec.pod
            try:
                if pod is None:
                    pass
                elif (pod.get("metadata") or {}).get("deletionTimestamp"):
                    await self._finish_deletion(key, rec)
                elif not rec.started:
                    await self._start(key, rec, pod)
                if not rec.queued:
                    rec.pod = None
            except ApiError as exc:
                if exc.code == 404:
                    continue
                self._count_error(exc, f"node {rec.node.name}: pod {key}")
                log.info("simulated node %s: pod %s: %s; retrying", rec.node.name, key, exc)
                if self.pods.get(key) is rec and not rec.queued:
                    self._schedule(key, rec, trio.current_time() + RETRY_DELAY)

    async def _start(self, key: str, rec: _Pod, pod: Obj) -> None:
        node = rec.node
        now = node.clock()
        status = node.pod_status(pod, key, now)
        ns, _, name = key.partition("/")
        rec.started = True  # a stale event arriving meanwhile must not start it again
        try:
            await node.client.patch(
                PODS, name, {"status": status}, ns, subresource="status", read_only=True
            )  # the reply is not even looked at
        except BaseException:
            rec.started = False
            raise
        self.stats.started += 1
        if self.on_pod_running is not None:
            self.on_pod_running(pod, now)

    async def _finish_deletion(self, key: str, rec: _Pod) -> None:
        ns, _, name = key.partition("/")
        uid = rec.uid
        await rec.node.client.delete(
            PODS, name, ns, grace_period_seconds=0, preconditions={"uid": uid} if uid else None
        )
        self.stats.deleted += 1

    # ------------------------------------------------------------------ running
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await _parallel(self.nodes.values(), self._register, self.workers)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._timer_loop)
            for _ in range(self.workers):
                nursery.start_soon(self._worker)
            for _ in range(max(self.workers, len(self.nodes))):  # each node renews on its own
                nursery.start_soon(self._heartbeat_worker)
            await nursery.start(self._watch_loop)
            task_status.started()


def _all_ready(status: Mapping[str, Any]) -> bool:
    statuses = status.get("containerStatuses") or []
    return bool(statuses) and all(s.get("ready") for s in statuses)
