"""The node agent: the Node, the pods bound to it, and their containers on one host.

Theory of operation
-------------------
`Agent.run` opens the local store (`agent.db` in the data dir) and starts, in its nursery:

* `NodeReporter` — registers the Node and heartbeats (Lease every 10 s, status on change);
  retried in the background, never awaited by anything else;
* the **restore**: one `PodWorker` per pod found in the local store, started at once — so after
  a host reboot with the server down the pods come back without waiting for it;
* the **pod source** — LIST pods with `spec.nodeName=<node>`, make the workers and the local
  store equal to that list (pods missing from it were deleted meanwhile: their workers stop
  them), then WATCH from the list's resourceVersion. Every pod object is written to the local
  store *before* its worker sees it. Any failure (server unreachable) is retried with
  back-off; the workers keep running meanwhile (edge autonomy). A successful relist after a
  failure makes every worker re-report its status;
* the **relist** (kubelet's generic PLEG, every `relist_interval` = 1 s; containerd 1.6 has no
  events): one `list_pod_sandbox` + `list_containers` filtered by this agent's label; a worker
  whose sandboxes/containers changed is poked; sandboxes and containers labelled as this
  agent's but belonging to no known pod are stopped and removed (strays from a crash, or pods
  deleted while the agent was down), and pod directories of unknown pods are removed;
* the `EventRecorder` for the workers' Events (best effort: dropped while offline);
* with `service_cache` on, `net.svccache.ServiceCache` (`Agent.services`): Services and
  EndpointSlices for the node proxy and DNS, restored from the local store before `started`.
* the node's other components (`AgentOptions.components`: e.g. the pod network, `agent/net/`),
  each made from the local store and started after the restore, before `started`.

ConfigMaps and Secrets are read through `ObjectCache`: from the API while connected (each copy
is also written to the local store), from the local store otherwise.

Invariants: at most one worker per pod UID; a UID whose worker finished is never started again
(a stale event cannot resurrect a deleted pod); the local store holds a pod until its worker
has stopped it and (when it was deleted through the API) confirmed the deletion.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import trio

from orchestrator.agent.localstore import LocalStore
from orchestrator.agent.net.clusterview import BoundView, ClusterView
from orchestrator.agent.net.poddns import PodDNS
from orchestrator.agent.node import HostFacts, NodeReporter, NodeReporterOptions, host_facts
from orchestrator.agent.podcontext import WorkerContext, WorkerOptions
from orchestrator.agent.podspec import LABEL_AGENT, LABEL_POD_UID, referenced_objects
from orchestrator.agent.podstatus import TERMINAL
from orchestrator.agent.podworker import PodWorker
from orchestrator.client.resource import PODS, ResourceInfo
from orchestrator.controllers.runtime import Client, EventRecorder
from orchestrator.controllers.runtime.client import CONFIGMAPS
from orchestrator.controllers.runtime.intern import Interner
from orchestrator.cri.runtime import CriError, RuntimeService
from orchestrator.kube.errors import ApiError
from orchestrator.kube.objects import Obj
from orchestrator.observability import TimedRuntime

if TYPE_CHECKING:
    from orchestrator.agent.net.svccache import ServiceCache

__all__ = ["Agent", "AgentOptions", "Component", "ObjectCache"]

log = logging.getLogger(__name__)


SECRETS = ResourceInfo("", "v1", "secrets", "Secret", True, "secret")
_RESOURCES = {"ConfigMap": CONFIGMAPS, "Secret": SECRETS}
API_TIMEOUT = 10.0
SOURCE_BACKOFF_INITIAL = 0.5
SOURCE_BACKOFF_MAX = 10.0
WATCH_TIMEOUT = 300.0
_FINISHED_MEMORY = 4096


class Component(Protocol):
    """A long-lived part of the node beside the pods (the pod network, ...)."""

    async def run(self, *, task_status: trio.TaskStatus[None] = ...) -> None: ...


@dataclass
class AgentOptions:
    """Knobs of one agent. Intervals in seconds; defaults are the kubelet's."""

    node_name: str
    data_dir: Path
    labels: Mapping[str, str] = field(default_factory=dict)
    node_ip: str = ""  # InternalIP; default: the host's outbound address
    kubelet_port: int = 10250  # the agent's log endpoint, published in the Node status
    relist_interval: float = 1.0
    housekeeping_interval: float = 60.0
    lease_duration: int = 40
    renew_interval: float = 10.0
    status_interval: float = 10.0
    report_interval: float = 300.0
    worker: WorkerOptions = field(default_factory=WorkerOptions)
    service_cache: bool = False  # run `Agent.services` (the node proxy and DNS need it)
    dns: PodDNS | None = None  # pods' resolv.conf (--cluster-dns...); None: the runtime's
    # Services and EndpointSlices for pods' env vars and the node DNS: bound to the Service
    # cache when `service_cache` runs, else empty
    cluster: ClusterView = field(default_factory=BoundView)
    # made from the local store and run beside the pods (module doc)
    components: list[Callable[[LocalStore], Component]] = field(default_factory=list)


class ObjectCache:
    """ConfigMaps/Secrets from the API while connected, else from the local store."""

    def __init__(self, client: Client, store: LocalStore, connected: Callable[[], bool]) -> None:
        self.client = client
        self.store = store
        self.connected = connected

    async def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        if self.connected():
            try:
                with trio.fail_after(API_TIMEOUT):
                    obj = await self.client.get(_RESOURCES[kind], name, namespace)
            except ApiError as exc:
                if exc.code == 404:
                    await self.store.delete_object(kind, namespace, name)
                    return None
                log.info("%s %s/%s: %s; using the local copy", kind, namespace, name, exc)
            except trio.TooSlowError:
                log.info("%s %s/%s: API timed out; using the local copy", kind, namespace, name)
            else:
                await self.store.put_object(kind, obj)
                return obj
        return await self.store.get_object(kind, namespace, name)


def _container_probes(*args: Any, **kwargs: Any) -> Any:
    """`probes.ContainerProbes(...)`, imported by the first container that has probes: a node
    whose pods have none does not load the prober (nor the HTTP client it needs)."""
    from orchestrator.agent.probes import ContainerProbes

    return ContainerProbes(*args, **kwargs)


def _uid(pod: Obj) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")


def _stored_form(pod: Obj) -> Obj:
    """The parts of a pod that matter to the local copy (no resourceVersion/managedFields).

    Of the status only a terminal phase (a finished pod must not run again after an offline
    reboot): the worker writes the local copy itself when the phase it reports changes, so the
    server's echo of that report (Pending -> Running) is not written a second time. That echo
    was one of the five fsynced agent.db transactions of every pod (flash wear, issue 18)."""
    meta = {
        k: v
        for k, v in (pod.get("metadata") or {}).items()
        if k not in ("resourceVersion", "managedFields")
    }
    phase = (pod.get("status") or {}).get("phase")
    return {
        "metadata": meta,
        "spec": pod.get("spec"),
        "phase": phase if phase in TERMINAL else None,
    }


class Agent:
    """The node agent (module doc). `runtime` is owned by the caller (close it after `run`)."""

    def __init__(
        self,
        client: Client,
        runtime: RuntimeService,
        options: AgentOptions,
        *,
        facts: HostFacts | None = None,
        clock: Callable[[], float] = time.time,
        probes: bool = True,
    ) -> None:
        self.client = client
        # Every runtime call is timed (agent_cri_call_duration_seconds{method}).
        self.runtime = cast(RuntimeService, TimedRuntime(runtime))
        self.opts = options
        self.name = options.node_name
        self.facts = facts or host_facts(node_ip=options.node_ip, hostname=options.node_name)
        self.clock = clock
        self._use_probes = probes
        self.workers: dict[str, PodWorker] = {}
        self.store: LocalStore | None = None
        self.services: ServiceCache | None = None  # when `options.service_cache`
        self.reporter = NodeReporter(
            client,
            self.name,
            self.runtime,
            self.facts,
            NodeReporterOptions(
                labels=dict(options.labels),
                kubelet_port=options.kubelet_port,
                lease_duration=options.lease_duration,
                renew_interval=options.renew_interval,
                status_interval=options.status_interval,
                report_interval=options.report_interval,
            ),
            clock=clock,
        )
        self.events = EventRecorder(client, "kubelet", self.name, clock=clock)
        self.connected = False  # the pod source's last LIST/WATCH worked
        self.restored = trio.Event()  # the pods of the local store have workers
        self.synced = trio.Event()  # a LIST from the server was applied at least once
        self._finished: dict[str, None] = {}  # UIDs whose worker finished (insertion order)
        self._fingerprints: dict[str, tuple[Any, ...]] = {}
        self._nursery: trio.Nursery | None = None
        self._ctx: WorkerContext | None = None
        self.relists = 0
        # The pods the agent keeps (its workers' copies) go through an informer's transform:
        # no managedFields (nothing here reads them: half of a decoded pod, 12 of 25 KB), and
        # the members sibling pods have alike (containers, tolerations, conditions) shared, as
        # the controllers' caches do (issue 18). So they are read-only, as an informer's are.
        self._intern = Interner()

    # ------------------------------------------------------------------ running
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled; `started` once the local pods have workers (never waits for the
        server). Cancelling leaves the containers running, as a kubelet restart does."""
        self.opts.data_dir.mkdir(parents=True, exist_ok=True)
        store = self.store = await LocalStore.open(self.opts.data_dir / "agent.db")
        try:
            runtime_name = "containerd"
            try:
                with trio.fail_after(10):
                    runtime_name = (await self.runtime.version()).runtime_name or runtime_name
            except (CriError, trio.TooSlowError) as exc:
                log.warning("agent %s: runtime version: %s", self.name, exc)
            probes = partial(_container_probes, runtime=self.runtime) if self._use_probes else None
            self._ctx = WorkerContext(
                runtime=self.runtime,
                client=self.client,
                store=store,
                objects=ObjectCache(self.client, store, lambda: self.connected),
                events=self.events,
                node_name=self.name,
                host_ip=self.facts.internal_ip,
                data_dir=self.opts.data_dir,
                options=self.opts.worker,
                clock=self.clock,
                runtime_name=runtime_name,
                node_cpus=self.facts.cpus,
                node_memory=self.facts.memory_bytes,
                probes=probes,
                connected=lambda: self.connected,
                cluster=self.opts.cluster,
                dns=self.opts.dns,
            )
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self.events.run)
                await nursery.start(self.reporter.run)
                if self.opts.service_cache:
                    from orchestrator.agent.net.svccache import ServiceCache, ServiceCacheView

                    self.services = ServiceCache(self.client, store)
                    await nursery.start(self.services.run)  # the stored copy, never the API
                    if isinstance(self.opts.cluster, BoundView):  # DNS and pods read it
                        self.opts.cluster.bind(ServiceCacheView(self.services))
                for stored in await store.pods():
                    self._ensure_worker(stored.pod)
                log.info(
                    "agent %s: restored %d pods from the local store", self.name, len(self.workers)
                )
                self.restored.set()
                for make in self.opts.components:
                    await nursery.start(make(store).run)
                nursery.start_soon(self._relist_loop)
                nursery.start_soon(self._source_loop)
                task_status.started()
        finally:
            with trio.CancelScope(shield=True):
                await store.aclose()

    # ------------------------------------------------------------------ workers
    def _ensure_worker(self, pod: Obj) -> PodWorker | None:
        uid = _uid(pod)
        if not uid or uid in self._finished:
            return None
        worker = self.workers.get(uid)
        if worker is not None:
            worker.update(pod)
            return worker
        assert self._ctx is not None
        assert self._nursery is not None
        worker = self.workers[uid] = PodWorker(self._ctx, pod)
        self._nursery.start_soon(self._run_worker, worker)
        return worker

    async def _run_worker(self, worker: PodWorker) -> None:
        try:
            await worker.run()
        finally:
            self.workers.pop(worker.uid, None)
            self._fingerprints.pop(worker.uid, None)
            self._finished[worker.uid] = None
            while len(self._finished) > _FINISHED_MEMORY:
                del self._finished[next(iter(self._finished))]

    # ------------------------------------------------------------------ pod source
    async def _apply(self, etype: str, pod: Obj) -> None:
        uid = _uid(pod)
        if not uid:
            return
        pod = self._intern.transform(pod)
        if etype == "DELETED":
            worker = self.workers.get(uid)
            if worker is not None:
                worker.update(pod)
                worker.mark_removed()
            return
        if uid in self._finished:
            return
        assert self.store is not None
        worker = self.workers.get(uid)
        if worker is None or _stored_form(worker.pod) != _stored_form(pod):
            await self.store.put_pod(pod)  # persisted before acted upon
        self._ensure_worker(pod)

    async def _reconcile(self, pods: list[Obj]) -> None:
        """Make workers and local store equal to the server's list of our pods."""
        assert self.store is not None
        listed = {_uid(p) for p in pods}
        for uid, worker in list(self.workers.items()):
            if uid not in listed:
                log.info(
                    "agent %s: pod %s was deleted meanwhile; stopping it", self.name, worker.key
                )
                worker.mark_removed()
        for stored in await self.store.pods():
            if stored.uid not in listed and stored.uid not in self.workers:
                await self.store.delete_pod(stored.uid)
        for p in pods:
            await self._apply("ADDED", p)
        for worker in self.workers.values():
            worker.force_report()
        keep = {
            (kind, str((p.get("metadata") or {}).get("namespace") or ""), name)
            for p in pods
            for kind, name in referenced_objects(p)
        }
        await self.store.prune_objects(keep)

    async def _source_loop(self) -> None:
        selector = f"spec.nodeName={self.name}"
        delay = SOURCE_BACKOFF_INITIAL
        while True:
            try:
                with trio.fail_after(API_TIMEOUT * 3):
                    listed = await self.client.list(PODS, field_selector=selector)
                self.connected = True
                await self._reconcile(list(listed.get("items") or []))
                self.synced.set()
                delay = SOURCE_BACKOFF_INITIAL
                rv = str((listed.get("metadata") or {}).get("resourceVersion") or "")
                async with self.client.watch(
                    PODS,
                    field_selector=selector,
                    resource_version=rv,
                    timeout_seconds=WATCH_TIMEOUT,
                    read_only=True,  # `_apply` keeps its own transformed copy, never these
                ) as events:
                    async for etype, obj in events:
                        if etype in ("ADDED", "MODIFIED", "DELETED"):
                            await self._apply(etype, obj)
                continue  # the watch ended cleanly: relist (cheap, and level-based)
            except ApiError as exc:
                if self.connected:
                    log.warning(
                        "agent %s: lost the API server (%s); running autonomously", self.name, exc
                    )
                self.connected = False
            except trio.TooSlowError:
                self.connected = False
                log.warning("agent %s: listing pods timed out; running autonomously", self.name)
            await trio.sleep(delay)
            delay = min(delay * 2, SOURCE_BACKOFF_MAX)

    # ------------------------------------------------------------------ relist (PLEG)
    async def relist(self) -> None:
        """One relist: poke changed workers, remove strays (see the module doc)."""
        labels = {LABEL_AGENT: self.name}
        with trio.fail_after(60):
            sandboxes = await self.runtime.list_pod_sandbox(labels=labels)
            containers = await self.runtime.list_containers(labels=labels)
        by_uid: dict[str, list[tuple[str, int, int]]] = {}
        for sb in sandboxes:
            uid = sb.labels.get(LABEL_POD_UID, sb.uid)
            by_uid.setdefault(uid, []).append((sb.id, int(sb.state), sb.attempt))
        for c in containers:
            uid = c.labels.get(LABEL_POD_UID, "")
            by_uid.setdefault(uid, []).append((c.id, int(c.state), c.attempt))
        for uid, worker in self.workers.items():
            fp = tuple(sorted(by_uid.get(uid, [])))
            if self._fingerprints.get(uid) != fp:
                self._fingerprints[uid] = fp
                worker.poke()
        strays = set(by_uid) - set(self.workers)
        if strays:
            await self._remove_strays(strays, sandboxes, containers)
        self.relists += 1

    async def _remove_strays(
        self, uids: set[str], sandboxes: list[Any], containers: list[Any]
    ) -> None:
        for sb in sandboxes:
            if sb.labels.get(LABEL_POD_UID, sb.uid) in uids:
                log.info(
                    "agent %s: removing stray sandbox %s (%s/%s)",
                    self.name,
                    sb.id,
                    sb.namespace,
                    sb.name,
                )
                with trio.fail_after(60):
                    await self.runtime.stop_pod_sandbox(sb.id)
                    await self.runtime.remove_pod_sandbox(sb.id)
        for c in containers:
            if c.labels.get(LABEL_POD_UID, "") in uids:
                with trio.fail_after(60):
                    await self.runtime.remove_container(c.id)

    def _housekeeping(self) -> None:
        """Remove pod directories of pods this agent no longer knows (blocking; a thread)."""
        root = self.opts.data_dir / "pods"
        if not root.is_dir():
            return
        known = set(self.workers)
        for entry in root.iterdir():
            uid = entry.name.rsplit("_", 1)[-1]
            if entry.is_dir() and uid not in known:
                shutil.rmtree(entry, ignore_errors=True)

    async def _relist_loop(self) -> None:
        next_housekeeping = trio.current_time() + self.opts.housekeeping_interval
        while True:
            try:
                await self.relist()
            except (CriError, trio.TooSlowError) as exc:
                log.warning("agent %s: relist failed: %s", self.name, exc)
            if trio.current_time() >= next_housekeeping:
                next_housekeeping = trio.current_time() + self.opts.housekeeping_interval
                await trio.to_thread.run_sync(self._housekeeping)
            await trio.sleep(self.opts.relist_interval)

    # ------------------------------------------------------------------ introspection
    def resolve_pod(self, namespace: str, name: str) -> Obj | None:
        """The pod as this agent runs it, with the status it last computed (for the log
        endpoint); None if the agent does not run it. Never blocks."""
        worker = self.worker_for(namespace, name)
        if worker is None:
            return None
        return {**worker.pod, "status": worker.last_status or worker.pod.get("status") or {}}

    def worker_for(self, namespace: str, name: str) -> PodWorker | None:
        for w in self.workers.values():
            if w.key == f"{namespace}/{name}":
                return w
        return None
