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

Both `SimulatedNode.run` and `SimulatedCluster.run` drive the same engine (`Engine`), which
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
import logging
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import trio

from orchestrator.agent import node_client as agent_node_client
from orchestrator.agent.node import NODE_LEASE_NAMESPACE, lease_object
from orchestrator.apiserver.resources import Api
from orchestrator.client.resource import LEASES
from orchestrator.controllers.runtime.client import Client
from orchestrator.controllers.runtime.inprocess import InProcessClient
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.columns import now_rfc3339
from orchestrator.testing.simengine import Engine, SimStatistics

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
STATUS_REPORT_INTERVAL = 300.0  # upstream nodeStatusReportFrequency (5 min)
_POD_CONDITIONS = ("PodScheduled", "Initialized", "ContainersReady", "Ready")


def node_client(api: Api, name: str) -> InProcessClient:
    """An in-process client acting as node `name` (NodeRestriction applies to its writes)."""
    return agent_node_client(api, name, field_manager=FIELD_MANAGER)


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
        self.on_resume: Callable[[Any], None] | None = None  # set by the engine serving it
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
        if self.on_resume is not None:
            self.on_resume(self)

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

    def lease(self, now: float) -> Obj:
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

    def release_ip(self, key: str) -> None:
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
        engine = Engine(
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
    `SimulatedNode` (cpu, memory, pods, labels, taints, intervals, delays, clock).

    `client_for(name)`, if given, is each node's own `Client` (e.g. an `HttpClient` holding
    that node's token, as a real agent over HTTPS) and `client` is then not used."""

    def __init__(
        self,
        client: Client | Api | None,
        n: int,
        prefix: str = "node-",
        *,
        workers: int = 64,
        on_pod_running: Callable[[Obj, float], None] | None = None,
        client_for: Callable[[str], Client] | None = None,
        **node_options: Any,
    ) -> None:
        if n < 1:
            raise ValueError(f"a simulated cluster needs at least one node, got {n}")

        def client_of(name: str) -> Client | Api:
            if client_for is not None:
                return client_for(name)
            if client is None:
                raise ValueError("a simulated cluster needs a client, an Api or client_for")
            return client

        self.nodes = [
            SimulatedNode(client_of(f"{prefix}{i}"), f"{prefix}{i}", index=i, **node_options)
            for i in range(n)
        ]
        self.by_name = {node.name: node for node in self.nodes}
        self.workers = workers
        self.on_pod_running = on_pod_running
        self._engine: Engine | None = None

    def __getitem__(self, name: str) -> SimulatedNode:
        return self.by_name[name]

    def statistics(self) -> SimStatistics:
        return self._engine.statistics() if self._engine else SimStatistics(len(self.nodes))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Register every node, then run them all until cancelled; `started` once all are
        registered and the pod watch is open."""
        self._engine = Engine(
            self.nodes,
            self.nodes[0].client,
            "spec.nodeName!=",
            workers=self.workers,
            on_pod_running=self.on_pod_running,
        )
        await self._engine.run(task_status=task_status)


@functools.lru_cache(maxsize=256)  # pure; a few images for thousands of pods
def _image_id(image: str) -> str:
    return f"{image.split('@')[0]}@sha256:{hashlib.sha256(image.encode()).hexdigest()}"
