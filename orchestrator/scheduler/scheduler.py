"""`Scheduler`: the driver that runs the pure scheduling core against the API.

Theory of operation
-------------------
The core (`SchedulerCache`, `SchedulingQueue`, `Framework.schedule_one`) decides; this module
only feeds it events and carries its decisions out::

    pods informer ──┬─ bound pod (spec.nodeName) ─▶ cache.add_pod (confirms an assumption),
                    │                                queue.delete; deleted/terminal ─▶ cache
                    │                                remove + queue.move_all (room was freed)
                    └─ unbound pod of ours ────────▶ queue.add (deletionTimestamp: queue.delete)
    nodes informer ───────────────────────────────▶ cache.add/update/remove_node; a new node or
                                                     a relevant change ─▶ queue.move_all
    scheduling loop (one task):
        pod = queue.pop(now)            None ─▶ sleep until an informer event or next_deadline()
        decision = schedule_one(pod, cache, rng, now)
        no node ─▶ queue.add_unschedulable, FailedScheduling event (the per-node reasons, e.g.
                   "0/3 nodes are available: 3 Insufficient cpu."), PodScheduled=False
        a node  ─▶ cache.assume(pod, node), then hand (pod, node) to the binders
    binders (`parallel_binds` tasks, 64 by default, fed by a bounded channel):
        client.bind(pod, node)
          ok    ─▶ cache.finish_binding, queue.done, Scheduled event ("Successfully assigned
                   ns/pod to node")
          error ─▶ cache.forget, queue.add_backoff (1 s doubling to 10 s), FailedScheduling event

Because the loop assumes before binding, the next decision already sees the resources taken:
binds in flight can never overcommit a node, however far the watch lags (the cache's promise).
Several binds run at once, so throughput is not one API round trip per pod; when all binders
are busy the loop waits (back-pressure), so at most `parallel_binds` + 1 pods are assumed but
unbound at a time.

Only pods whose `spec.schedulerName` is ours (default "default-scheduler") are scheduled, but
every bound pod is counted, whoever placed it. The pod informer is the process's shared one
(`InformerFactory.informer(PODS)`), so the scheduler adds no watch of its own when controllers
already watch pods.

It runs as a component of the `ControllerManager` (leader only, rebuilt per term, writes
fenced): `Scheduler(ctx)` takes the term's client, informers and event recorder. Given a plain
`Client` instead, it builds and runs its own informers and recorder.

Time: `now` comes from trio's clock (monotonic; `MockClock` works), randomness from `rng`.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import trio

from orchestrator.client.resource import NODES, PODS
from orchestrator.controllers.runtime import (
    Client,
    ControllerContext,
    DeletedFinalStateUnknown,
    EventRecorder,
    InformerFactory,
    SharedInformer,
    deleted_object,
)
from orchestrator.kube.errors import ApiError
from orchestrator.kube.objects import Obj
from orchestrator.metrics import REGISTRY, Registry
from orchestrator.scheduler.cache import SchedulerCache
from orchestrator.scheduler.framework import DEFAULT_FRAMEWORK, Framework
from orchestrator.scheduler.info import PodInfo
from orchestrator.scheduler.queue import SchedulingQueue

__all__ = [
    "DEFAULT_PARALLEL_BINDS",
    "DEFAULT_SCHEDULER_NAME",
    "Scheduler",
    "SchedulerStatistics",
]

log = logging.getLogger(__name__)

DEFAULT_SCHEDULER_NAME: Final = "default-scheduler"
DEFAULT_PARALLEL_BINDS: Final = 64
COMPONENT: Final = "default-scheduler"
_TERMINAL: Final = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, slots=True)
class SchedulerStatistics:
    attempts: int
    """Scheduling cycles run (one per pod popped)."""
    scheduled: int
    """Pods bound successfully."""
    unschedulable: int
    """Cycles that found no node."""
    bind_errors: int
    binding: int
    """Binds in flight (assumed, not yet answered)."""
    active: int
    backoff: int
    pending_unschedulable: int
    assumed: int


@dataclass(frozen=True, slots=True)
class _Bind:
    pod: Obj
    info: PodInfo
    node: str
    message: str


@dataclass(frozen=True, slots=True)
class _Unschedulable:
    pod: Obj
    message: str


def _spec(pod: Obj) -> Obj:
    spec = pod.get("spec")
    return spec if isinstance(spec, dict) else {}


def _meta(pod: Obj) -> Obj:
    meta = pod.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _counted(pod: Obj) -> bool:
    """Does this pod take room on a node (bound and not finished)?"""
    phase = (pod.get("status") or {}).get("phase")
    return bool(_spec(pod).get("nodeName")) and phase not in _TERMINAL


class Scheduler:
    """The scheduling driver (see the module doc). Start with `await nursery.start(s.run)`."""

    def __init__(
        self,
        ctx_or_client: ControllerContext | Client,
        *,
        scheduler_name: str = DEFAULT_SCHEDULER_NAME,
        parallel_binds: int = DEFAULT_PARALLEL_BINDS,
        framework: Framework = DEFAULT_FRAMEWORK,
        rng: random.Random | None = None,
        cache: SchedulerCache | None = None,
        queue: SchedulingQueue | None = None,
        metrics: Registry | None = None,
        scheduled_events: bool = True,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        if parallel_binds < 1:
            raise ValueError(f"parallel_binds must be >= 1, got {parallel_binds}")
        self._own_informers: InformerFactory | None = None
        self._own_events: EventRecorder | None = None
        if isinstance(ctx_or_client, ControllerContext):
            self.client: Client = ctx_or_client.client
            informers = ctx_or_client.informers
            self.events = ctx_or_client.events
            registry = metrics or ctx_or_client.metrics
        else:
            registry = metrics or REGISTRY
            self.client = ctx_or_client
            informers = self._own_informers = InformerFactory(ctx_or_client, metrics=registry)
            self.events = self._own_events = EventRecorder(
                ctx_or_client, COMPONENT, metrics=registry
            )
        self.scheduler_name = scheduler_name
        self.parallel_binds = parallel_binds
        self.framework = framework
        self.rng = rng or random.Random()
        self.cache = cache or SchedulerCache()
        self.queue = queue or SchedulingQueue()
        self.scheduled_events = scheduled_events
        self.clock = clock
        self.pods: SharedInformer = informers.informer(PODS)
        self.nodes: SharedInformer = informers.informer(NODES)
        self._wake = trio.Event()
        self._attempts = 0
        self._scheduled = 0
        self._unschedulable = 0
        self._bind_errors = 0
        self._binding = 0
        self._attempts_metric = registry.counter(
            "scheduler_schedule_attempts_total",
            "Scheduling attempts by result (scheduled, unschedulable, error).",
            ["result"],
        )
        self.pods.add_event_handler(
            on_add=self._pod_added, on_update=self._pod_updated, on_delete=self._pod_deleted
        )
        self.nodes.add_event_handler(
            on_add=self._node_added, on_update=self._node_updated, on_delete=self._node_deleted
        )

    def statistics(self) -> SchedulerStatistics:
        q = self.queue.statistics()
        return SchedulerStatistics(
            attempts=self._attempts,
            scheduled=self._scheduled,
            unschedulable=self._unschedulable,
            bind_errors=self._bind_errors,
            binding=self._binding,
            active=q.active,
            backoff=q.backoff,
            pending_unschedulable=q.unschedulable,
            assumed=self.cache.statistics().assumed,
        )

    # ------------------------------------------------------------------ informer events
    def _kick(self) -> None:
        self._wake.set()

    def _ours(self, pod: Obj) -> bool:
        return (_spec(pod).get("schedulerName") or DEFAULT_SCHEDULER_NAME) == self.scheduler_name

    def _pod_added(self, pod: Obj) -> None:
        if _spec(pod).get("nodeName"):
            self.cache.add_pod(pod)
            self.queue.delete(pod)
        elif _meta(pod).get("deletionTimestamp") or not self._ours(pod):
            self.queue.delete(pod)
        else:
            self.queue.add(pod, self.clock())
            self._kick()

    def _pod_updated(self, old: Obj, new: Obj) -> None:
        self._pod_added(new)
        if _counted(old) and not _counted(new):  # finished: its room is free again
            self._moved("AssignedPodUpdate")

    def _pod_deleted(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        pod = deleted_object(obj)
        self.queue.delete(pod)
        if _spec(pod).get("nodeName"):
            self.cache.remove_pod(pod)
            self._moved("AssignedPodDelete")

    def _node_added(self, node: Obj) -> None:
        new = self.cache.get_node(str(_meta(node).get("name") or "")) is None
        if self.cache.add_node(node) or new:
            self._moved("NodeAdd" if new else "NodeUpdate")

    def _node_updated(self, old: Obj, new: Obj) -> None:
        del old
        self._node_added(new)

    def _node_deleted(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        self.cache.remove_node(deleted_object(obj))

    def _moved(self, event: str) -> None:
        if self.queue.move_all_to_active_or_backoff(self.clock(), event):
            self._kick()

    # ------------------------------------------------------------------ running
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Schedule until cancelled; `started` once the pod and node caches have synced."""
        async with trio.open_nursery() as nursery:
            if self._own_events is not None:
                await nursery.start(self._own_events.run)
            if self._own_informers is not None:
                self._own_informers.start(nursery)
            await self.pods.wait_for_cache_sync()
            await self.nodes.wait_for_cache_sync()
            send, receive = trio.open_memory_channel[_Bind | _Unschedulable](0)
            for _ in range(self.parallel_binds):
                nursery.start_soon(self._binder, receive.clone())
            receive.close()
            log.info("scheduler %s: started (%d binders)", self.scheduler_name, self.parallel_binds)
            task_status.started()
            async with send:
                await self._loop(send)

    async def _loop(self, send: trio.MemorySendChannel[_Bind | _Unschedulable]) -> None:
        queue, cache = self.queue, self.cache
        while True:
            now = self.clock()
            pod = queue.pop(now)
            if pod is None:
                self._wake = trio.Event()
                deadline = queue.next_deadline()
                with trio.move_on_at(float("inf") if deadline is None else deadline):
                    await self._wake.wait()
                continue
            pod = dict(pod)
            if _meta(pod).get("deletionTimestamp") or _spec(pod).get("nodeName"):
                queue.done(pod)  # being deleted, or bound meanwhile: nothing to do
                continue
            self._attempts += 1
            decision = self.framework.schedule_one(pod, cache, self.rng, now)
            if decision.node is None or decision.pod is None:
                self._unschedulable += 1
                self._attempts_metric.labels("unschedulable").inc()
                queue.add_unschedulable(pod, now)
                await send.send(_Unschedulable(pod, decision.message))
                continue
            try:
                cache.assume(decision.pod, decision.node, now)
            except ValueError as exc:  # already counted: the bind raced the watch
                log.info("scheduler: %s", exc)
                queue.done(pod)
                continue
            self._binding += 1
            await send.send(_Bind(pod, decision.pod, decision.node, decision.message))

    async def _binder(self, receive: trio.MemoryReceiveChannel[_Bind | _Unschedulable]) -> None:
        async with receive:
            async for job in receive:
                if isinstance(job, _Bind):
                    await self._bind(job)
                else:
                    await self._report_unschedulable(job)

    async def _bind(self, job: _Bind) -> None:
        try:
            await self.client.bind(job.pod, job.node)
        except ApiError as exc:
            self._binding -= 1
            self._bind_errors += 1
            self._attempts_metric.labels("error").inc()
            self.cache.forget(job.info)
            self.queue.add_backoff(job.pod, self.clock())
            self._kick()
            meta = _meta(job.pod)
            log.info(
                "scheduler: binding %s/%s to %s failed: %s",
                meta.get("namespace"),
                meta.get("name"),
                job.node,
                exc,
            )
            if exc.code != 404:
                self.events.record(
                    job.pod, "Warning", "FailedScheduling", f"Binding rejected: {exc.message}"
                )
            return
        self._binding -= 1
        self._scheduled += 1
        self._attempts_metric.labels("scheduled").inc()
        self.cache.finish_binding(job.info, self.clock())
        self.queue.done(job.pod)
        if self.scheduled_events:
            self.events.record(job.pod, "Normal", "Scheduled", job.message)

    async def _report_unschedulable(self, job: _Unschedulable) -> None:
        """FailedScheduling event, and the PodScheduled=False condition (written only when its
        message changes, so a pod retried on every node event does not churn writes)."""
        pod = job.pod
        self.events.record(pod, "Warning", "FailedScheduling", job.message)
        conditions = (pod.get("status") or {}).get("conditions") or []
        for cond in conditions:
            if (
                cond.get("type") == "PodScheduled"
                and cond.get("status") == "False"
                and cond.get("message") == job.message
            ):
                return
        others = [c for c in conditions if c.get("type") != "PodScheduled"]
        stamp = _rfc3339_now()
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": job.message,
            "lastProbeTime": None,
            "lastTransitionTime": stamp,
        }
        meta = _meta(pod)
        try:
            await self.client.patch(
                PODS,
                str(meta.get("name") or ""),
                {"status": {"conditions": [*others, condition]}},
                str(meta.get("namespace") or ""),
                subresource="status",
            )
        except ApiError as exc:
            log.info("scheduler: PodScheduled condition of %s: %s", meta.get("name"), exc)


def _rfc3339_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
