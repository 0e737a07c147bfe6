"""Simulated nodes: node agents that register, heartbeat and "run" pods without running anything.

Theory of operation
-------------------
A `SimulatedNode` plays the kubelet's API-facing part (as kwok does) so the control plane —
scheduler, controllers, benchmarks — can be exercised at scale without containers:

* **Registration.** It creates its Node (labels, taints, capacity = allocatable, conditions with
  Ready=True and a lastHeartbeatTime, an InternalIP `10.a.b.1`, nodeInfo with kubeletVersion
  `v1.32.0-sim` and containerRuntimeVersion `simulated://1`). If the Node already exists (a
  restarted agent) it re-posts the status instead.
* **Heartbeats.** It creates, then renews every `renew_interval` seconds, the Lease
  `kube-node-lease/<name>` (holderIdentity = name, leaseDurationSeconds, renewTime as a
  MicroTime), and re-posts its Ready condition every `status_interval` seconds (upstream's
  nodeStatusReportFrequency; the Lease is the frequent signal).
* **Pods.** It watches pods bound to it (`fieldSelector=spec.nodeName=<name>`) and, level-based
  on each pod's latest state:
    - a live pod not yet started by this agent is marked Running and Ready, `start_delay`
      seconds after it was first seen, by a merge patch of the status subresource (phase,
      hostIP, podIP, startTime, conditions PodScheduled/Initialized/ContainersReady/Ready True,
      one containerStatus per container: ready, started, restartCount 0, state.running,
      image, imageID, containerID);
    - a pod with a deletionTimestamp is deleted for good (`gracePeriodSeconds=0`) after
      `grace_period` seconds (0 by default: simulated containers stop at once; None honours
      the pod's own deletionGracePeriodSeconds);
    - terminal pods (Succeeded/Failed) are left alone.
* **Partitions.** `stop_heartbeats()` makes the node behave as if cut off from the API: no Lease
  renewals, no node or pod status writes, no deletions (pods keep "running"; work that comes due
  is parked). `resume_heartbeats()` renews the Lease and re-posts the node status at once, then
  does the parked pod work.

Both `SimulatedNode.run` and `SimulatedCluster.run` drive the same engine (`_Engine`), which
serves any number of nodes with:

* ONE pod watch (a single node: `spec.nodeName=<name>`; a cluster: `spec.nodeName!=`, i.e. all
  bound pods) whose events are dispatched client-side by `spec.nodeName` — no watch per node;
* ONE timer task (a heap of deadlines) for start delays, grace periods, Lease renewals and
  status reports — no task per pod or per node;
* a fixed pool of `workers` tasks draining a queue of pod keys (deduplicated while queued), so
  many status writes are in flight at once and the store commits them in batches (one Raft
  append, one fsync, for all of them) — the write path's "batching".

Identities: given an `Api`, each node writes as `system:node:<name>` (group `system:nodes`)
through its own `InProcessClient`, so NodeRestriction is exercised on every write; the shared
pod watch of a cluster reads as the first node (a node may list and watch all pods). Given a
`Client` instead (HTTP, or an admin in-process client), every node uses it.

The pod watch is opened `read_only` (pods are only read; status writes are built afresh), so
the pod given to an `on_pod_running` callback is shared with other read-only watchers: do not
modify it.

Invariants: a pod is started at most once per UID by this engine (a later stale event cannot
re-patch it); a key is in the work queue at most once; nothing is written for a node whose
heartbeats are stopped. Errors writing a pod are logged and retried after `RETRY_DELAY`; a 404
drops the work (the pod is gone).
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import logging
import math
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from orchestrator.agent import node_client as agent_node_client
from orchestrator.agent.node import NODE_LEASE_NAMESPACE, lease_object, micro_time
from orchestrator.apiserver.resources import Api
from orchestrator.client.resource import LEASES, NODES, PODS
from orchestrator.controllers.runtime.client import Client
from orchestrator.controllers.runtime.inprocess import InProcessClient
from orchestrator.kube.errors import ApiError
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.columns import now_rfc3339

__all__ = [
    "KUBELET_VERSION",
    "LEASES",
    "NODE_LEASE_NAMESPACE",
    "RUNTIME_VERSION",
    "SimStatistics",
    "SimulatedCluster",
    "SimulatedNode",
    "node_client",
]

log = logging.getLogger(__name__)


KUBELET_VERSION = "v1.32.0-sim"
RUNTIME_VERSION = "simulated://1"
FIELD_MANAGER = "simulated-kubelet"
RETRY_DELAY = 1.0
WATCH_BACKOFF = 1.0
STATUS_REPORT_INTERVAL = 300.0  # upstream nodeStatusReportFrequency (5 min)
_TERMINAL = frozenset({"Succeeded", "Failed"})
_POD_CONDITIONS = ("PodScheduled", "Initialized", "ContainersReady", "Ready")


def node_client(api: Api, name: str) -> InProcessClient:
    """An in-process client acting as node `name` (NodeRestriction applies to its writes)."""
    return agent_node_client(api, name, field_manager=FIELD_MANAGER)


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


class SimulatedNode:
    """One simulated node agent (see the module doc). Start with `await nursery.start(n.run)`.

    `client`: a `Client`, or an `Api` to act as `system:node:<name>` in process. `clock`: wall
    time for the timestamps written (sleeps use trio's clock, so `MockClock` works).
    `start_delay`: seconds between seeing a bound pod and reporting it Running.
    `grace_period`: seconds before a pod being deleted is removed (None: the pod's own).
    `index`: picks the node's addresses (default: a hash of the name)."""

    def __init__(
        self,
        client: Client | Api,
        name: str,
        *,
        cpu: str = "4",
        memory: str = "8Gi",
        pods: int = 110,
        labels: Mapping[str, str] | None = None,
        taints: Sequence[Mapping[str, str]] | None = None,
        lease_duration: int = 40,
        renew_interval: float = 10.0,
        status_interval: float = STATUS_REPORT_INTERVAL,
        start_delay: float = 0.0,
        grace_period: float | None = 0.0,
        workers: int = 4,
        index: int | None = None,
        clock: Callable[[], float] = time.time,
        on_pod_running: Callable[[Obj, float], None] | None = None,
    ) -> None:
        self.name = name
        self.client: Client = node_client(client, name) if isinstance(client, Api) else client
        self.cpu, self.memory, self.max_pods = cpu, memory, pods
        self.labels = dict(labels or {})
        self.taints = [dict(t) for t in taints or ()]
        self.lease_duration = lease_duration
        self.renew_interval = renew_interval
        self.status_interval = status_interval
        self.start_delay = start_delay
        self.grace_period = grace_period
        self.workers = workers
        self.clock = clock
        self.on_pod_running = on_pod_running
        idx = zlib.crc32(name.encode()) & 0x3FFF if index is None else index & 0x3FFF
        self.address = f"10.{idx >> 8}.{idx & 255}.1"
        self._pod_prefix = f"10.{64 + (idx >> 8)}.{idx & 255}."
        self._ips_used: dict[str, int] = {}  # pod key -> last octet
        self._next_ip = 2
        self.uid = ""
        self._heartbeating = True
        self._resumed: Callable[[SimulatedNode], None] | None = None
        self.registered = trio.Event()

    # ------------------------------------------------------------------ partitions
    @property
    def heartbeating(self) -> bool:
        return self._heartbeating

    def stop_heartbeats(self) -> None:
        """Act partitioned: no Lease renewals, no node or pod writes (pods keep running)."""
        self._heartbeating = False

    def resume_heartbeats(self) -> None:
        """Reconnect: renew the Lease and post status at once, then do the parked pod work."""
        if self._heartbeating:
            return
        self._heartbeating = True
        if self._resumed is not None:
            self._resumed(self)

    # ------------------------------------------------------------------ objects
    def node_status(self, now: float) -> Obj:
        """The Node status this agent reports."""
        stamp = now_rfc3339(now)
        resources = {"cpu": self.cpu, "memory": self.memory, "pods": str(self.max_pods)}

        def cond(type_: str, status: str, reason: str, message: str) -> Obj:
            return {
                "type": type_,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": stamp,
                "lastTransitionTime": stamp,
            }

        digest = hashlib.sha256(self.name.encode()).hexdigest()
        return {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": [
                cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "sufficient memory"),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "no disk pressure"),
                cond("PIDPressure", "False", "KubeletHasSufficientPID", "sufficient PID"),
                cond("Ready", "True", "KubeletReady", "simulated kubelet is posting ready status"),
            ],
            "addresses": [
                {"type": "InternalIP", "address": self.address},
                {"type": "Hostname", "address": self.name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": digest[:32],
                "systemUUID": f"{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-"
                f"{digest[20:32]}",
                "bootID": digest[32:64],
                "kernelVersion": "6.1.0-sim",
                "osImage": "Simulated Linux",
                "containerRuntimeVersion": RUNTIME_VERSION,
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": KUBELET_VERSION,
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }

    def node_object(self, now: float) -> Obj:
        labels = {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "node.kubernetes.io/instance-type": "simulated",
            **self.labels,
        }
        spec: Obj = {"taints": [dict(t) for t in self.taints]} if self.taints else {}
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": labels},
            "spec": spec,
            "status": self.node_status(now),
        }

    def _lease(self, now: float) -> Obj:
        return lease_object(self.name, self.uid, self.lease_duration, now)

    def _pod_ip(self, key: str) -> str:
        octet = self._ips_used.get(key)
        if octet is None:
            used = set(self._ips_used.values())
            octet = self._next_ip
            for _ in range(253):
                if octet not in used:
                    break
                octet = octet + 1 if octet < 254 else 2
            self._next_ip = octet + 1 if octet < 254 else 2
            self._ips_used[key] = octet
        return self._pod_prefix + str(octet)

    def _release_ip(self, key: str) -> None:
        self._ips_used.pop(key, None)

    def pod_status(self, pod: Obj, key: str, now: float) -> Obj:
        """The Running/Ready status this node reports for `pod`."""
        stamp = now_rfc3339(now)
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid") or key)
        statuses = []
        for c in (pod.get("spec") or {}).get("containers") or []:
            cname = str(c.get("name") or "")
            image = str(c.get("image") or "")
            cid = hashlib.sha256(f"{uid}/{cname}".encode()).hexdigest()
            statuses.append(
                {
                    "name": cname,
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": stamp}},
                    "image": image,
                    "imageID": _image_id(image),
                    "containerID": f"simulated://{cid}",
                }
            )
        ip = self._pod_ip(key)
        return {
            "phase": "Running",
            "hostIP": self.address,
            "hostIPs": [{"ip": self.address}],
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": stamp,
            "conditions": [
                {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": stamp}
                for t in _POD_CONDITIONS
            ],
            "containerStatuses": statuses,
        }

    # ------------------------------------------------------------------ running alone
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Register, then heartbeat and run this node's pods until cancelled; `started` once
        registered and watching."""
        engine = _Engine(
            [self],
            self.client,
            f"spec.nodeName={self.name}",
            workers=self.workers,
            on_pod_running=self.on_pod_running,
        )
        await engine.run(task_status=task_status)


class SimulatedCluster:
    """`n` simulated nodes `<prefix>0`..`<prefix>{n-1}` run by one engine (one pod watch, one
    timer, a pool of `workers` writers); see the module doc. `node_options` are passed to every
    `SimulatedNode` (cpu, memory, pods, labels, taints, intervals, delays, clock)."""

    def __init__(
        self,
        client: Client | Api,
        n: int,
        prefix: str = "node-",
        *,
        workers: int = 64,
        on_pod_running: Callable[[Obj, float], None] | None = None,
        **node_options: Any,
    ) -> None:
        if n < 1:
            raise ValueError(f"a simulated cluster needs at least one node, got {n}")
        self.nodes = [
            SimulatedNode(client, f"{prefix}{i}", index=i, **node_options) for i in range(n)
        ]
        self.by_name = {node.name: node for node in self.nodes}
        self.workers = workers
        self.on_pod_running = on_pod_running
        self._engine: _Engine | None = None

    def __getitem__(self, name: str) -> SimulatedNode:
        return self.by_name[name]

    def statistics(self) -> SimStatistics:
        return self._engine.statistics() if self._engine else SimStatistics(len(self.nodes))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Register every node, then run them all until cancelled; `started` once all are
        registered and the pod watch is open."""
        self._engine = _Engine(
            self.nodes,
            self.nodes[0].client,
            "spec.nodeName!=",
            workers=self.workers,
            on_pod_running=self.on_pod_running,
        )
        await self._engine.run(task_status=task_status)


# ---------------------------------------------------------------------------------- engine
@dataclass(slots=True)
class _Pod:
    node: SimulatedNode
    pod: Obj
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


class _Engine:
    """Serves `nodes` with one pod watch, one timer and `workers` writers (module doc)."""

    def __init__(
        self,
        nodes: Sequence[SimulatedNode],
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
        self._wake = trio.Event()
        self._send, self._receive = trio.open_memory_channel[str](math.inf)
        for n in nodes:
            n._resumed = self._on_resume

    def statistics(self) -> SimStatistics:
        s = self.stats
        return SimStatistics(
            s.nodes,
            len(self.pods),
            s.started,
            s.deleted,
            s.lease_renewals,
            s.status_reports,
            s.errors,
            sum(len(p) for p in self.parked.values()),
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
            writes: list[tuple[str, SimulatedNode]] = []
            for t in due:
                if t.what == "pod":
                    self._enqueue(t.key)
                    continue
                node = self.nodes[t.key]
                interval = node.renew_interval if t.what == "lease" else node.status_interval
                self._at(now + interval, t.what, t.key)
                if node.heartbeating:
                    writes.append((t.what, node))
            if writes:
                await _parallel(writes, self._heartbeat, self.workers)
                continue
            self._wake = trio.Event()
            deadline = self._timers[0].due if self._timers else math.inf
            with trio.move_on_at(deadline):
                await self._wake.wait()

    async def _heartbeat(self, job: tuple[str, SimulatedNode]) -> None:
        what, node = job
        try:
            if what == "lease":
                await self._renew_lease(node)
            else:
                await self._report_status(node)
        except ApiError as exc:
            self.stats.errors += 1
            log.warning("simulated node %s: %s failed: %s", node.name, what, exc)

    async def _renew_lease(self, node: SimulatedNode) -> None:
        now = node.clock()
        patch = {"spec": {"renewTime": micro_time(now), "holderIdentity": node.name}}
        try:
            await node.client.patch(LEASES, node.name, patch, NODE_LEASE_NAMESPACE)
        except ApiError as exc:
            if exc.code != 404:
                raise
            await node.client.create(LEASES, node._lease(now), NODE_LEASE_NAMESPACE)
        self.stats.lease_renewals += 1

    async def _report_status(self, node: SimulatedNode) -> None:
        patch = {"status": node.node_status(node.clock())}
        await node.client.patch(NODES, node.name, patch, subresource="status")
        self.stats.status_reports += 1

    def _on_resume(self, node: SimulatedNode) -> None:
        now = trio.current_time()
        self._at(now, "lease", node.name)
        self._at(now, "status", node.name)
        parked, self.parked[node.name] = self.parked[node.name], []
        for key in parked:
            self._enqueue(key)

    # ------------------------------------------------------------------ registration
    async def _register(self, node: SimulatedNode) -> None:
        """Register `node`, retrying (as a kubelet does) while the API refuses, e.g. before
        the server has created the `kube-node-lease` namespace."""
        delay = 0.05
        while True:
            try:
                await self._register_once(node)
                return
            except ApiError as exc:
                self.stats.errors += 1
                log.info("simulated node %s: registration failed: %s; retrying", node.name, exc)
            await trio.sleep(delay)
            delay = min(delay * 2, RETRY_DELAY)

    async def _register_once(self, node: SimulatedNode) -> None:
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
        lease = node._lease(now)
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
        self._at(start + node.renew_interval, "lease", node.name)
        self._at(start + node.status_interval, "status", node.name)

    # ------------------------------------------------------------------ pod events
    def _observe(self, etype: str, pod: Obj) -> None:
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"
        node = self.nodes.get(str((pod.get("spec") or {}).get("nodeName") or ""))
        rec = self.pods.get(key)
        uid = str(meta.get("uid") or "")
        if etype == "DELETED" or node is None:
            if rec is not None:
                del self.pods[key]
                rec.node._release_ip(key)
            return
        if rec is None or rec.uid != uid:
            if rec is not None:
                rec.node._release_ip(key)
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
            return
        elif status.get("phase") == "Running" and _all_ready(status):
            rec.started = True  # already running (e.g. an agent restart): nothing to do
        else:
            self._schedule(key, rec, trio.current_time() + node.start_delay)

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
                self.stats.errors += 1
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
            try:
                if (rec.pod.get("metadata") or {}).get("deletionTimestamp"):
                    await self._finish_deletion(key, rec)
                elif not rec.started:
                    await self._start(key, rec)
            except ApiError as exc:
                if exc.code == 404:
                    continue
                self.stats.errors += 1
                log.info("simulated node %s: pod %s: %s; retrying", rec.node.name, key, exc)
                if self.pods.get(key) is rec and not rec.queued:
                    self._schedule(key, rec, trio.current_time() + RETRY_DELAY)

    async def _start(self, key: str, rec: _Pod) -> None:
        node, pod = rec.node, rec.pod
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
            await nursery.start(self._watch_loop)
            task_status.started()


@functools.lru_cache(maxsize=256)  # pure; a few images for thousands of pods
def _image_id(image: str) -> str:
    return f"{image.split('@')[0]}@sha256:{hashlib.sha256(image.encode()).hexdigest()}"


def _all_ready(status: Mapping[str, Any]) -> bool:
    statuses = status.get("containerStatuses") or []
    return bool(statuses) and all(s.get("ready") for s in statuses)
