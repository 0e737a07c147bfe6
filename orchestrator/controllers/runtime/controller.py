"""Controllers: a work queue of keys, N workers, and a level-based `Reconciler`.

Theory of operation
-------------------
Informer event handlers only enqueue keys (`watches(informer, key_fn)`); workers take a key,
call `reconciler.reconcile(key)` and turn the outcome into a queue action exactly as
controller-runtime's `reconcileHandler` does:

    outcome                       queue action                       reconcile_total{result=}
    raises TerminalError          forget (no retry), counted         error
    raises any other Exception    add_rate_limited (per-key backoff) error
    Result(requeue_after=d > 0)   forget + add_after(d)              requeue_after
    Result(requeue=True)          add_rate_limited                   requeue
    Result()                      forget                             success

and always `done(key)` afterwards (else the key is wedged). An exception in a reconcile never
kills its worker: it is logged and counted. A key is never reconciled by two workers at once
(the queue is stingy); a key re-added while being reconciled is reconciled again afterwards.

`run()` waits for the caches of the informers it watches to sync, starts the queue's delay task
and the workers, signals `started`, and on cancellation shuts the queue down (adds are ignored
from then on) — the workers are cancelled with the rest of the nursery.

Metrics (registry `REGISTRY` unless given; label `controller`):
`controller_runtime_reconcile_total{controller,result}`, `_reconcile_errors_total`,
`_terminal_reconcile_errors_total`, `_reconcile_time_seconds` (histogram, 5 ms ... 60 s),
`_active_workers`, `_max_concurrent_reconciles`; the queue keeps `workqueue_*{name}`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import trio

from orchestrator.controllers.runtime.informer import (
    SharedInformer,
    controller_of,
    deleted_object,
    object_key,
)
from orchestrator.controllers.runtime.ratelimit import RateLimiter, default_controller_rate_limiter
from orchestrator.controllers.runtime.workqueue import QueueShutDown, WorkQueue
from orchestrator.kube.objects import Obj
from orchestrator.metrics import REGISTRY, Registry

__all__ = [
    "Controller",
    "KeyFn",
    "Reconciler",
    "Result",
    "TerminalError",
    "enqueue_owner",
]

log = logging.getLogger(__name__)

KeyFn = Callable[[Obj], "str | None"]  # None: nothing to enqueue for this object

RECONCILE_TIME_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.15,
    0.2,
    0.25,
    0.3,
    0.35,
    0.4,
    0.45,
    0.5,
    0.6,
    0.7,
    0.8,
    0.9,
    1.0,
    1.25,
    1.5,
    1.75,
    2.0,
    2.5,
    3.0,
    3.5,
    4.0,
    4.5,
    5.0,
    6.0,
    7.0,
    8.0,
    9.0,
    10.0,
    15.0,
    20.0,
    25.0,
    30.0,
    40.0,
    50.0,
    60.0,
)  # fmt: skip  (controller-runtime's buckets)


@dataclass(frozen=True, slots=True)
class Result:
    """What a reconcile asks for: nothing (done), a rate-limited retry, or a retry after a
    delay (`requeue_after` wins over `requeue`)."""

    requeue: bool = False
    requeue_after: float = 0.0


class TerminalError(Exception):
    """A reconcile failure that retrying cannot fix (bad input): the key is not requeued."""


class Reconciler(Protocol):
    async def reconcile(self, key: str) -> Result:
        """Drive the object `key` (namespace/name) towards its desired state; level-based."""
        ...


def enqueue_owner(kind: str, api_version: str | None = None) -> KeyFn:
    """A key function mapping an object to its controller owner's key, when that owner is a
    `kind` (and `api_version`, if given): pods -> their ReplicaSet, say."""

    def key(obj: Obj) -> str | None:
        ref = controller_of(obj)
        if ref is None or ref.get("kind") != kind or not ref.get("name"):
            return None
        if api_version is not None and ref.get("apiVersion") != api_version:
            return None
        ns = (obj.get("metadata") or {}).get("namespace") or ""
        return f"{ns}/{ref['name']}" if ns else str(ref["name"])

    return key


class _Metrics:
    def __init__(self, registry: Registry, name: str) -> None:
        self.total = registry.counter(
            "controller_runtime_reconcile_total",
            "Total number of reconciliations per controller",
            ["controller", "result"],
        )
        self.errors = registry.counter(
            "controller_runtime_reconcile_errors_total",
            "Total number of reconciliation errors per controller",
            ["controller"],
        ).labels(name)
        self.terminal = registry.counter(
            "controller_runtime_terminal_reconcile_errors_total",
            "Total number of terminal reconciliation errors per controller",
            ["controller"],
        ).labels(name)
        self.time = registry.histogram(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            ["controller"],
            RECONCILE_TIME_BUCKETS,
        ).labels(name)
        self.active = registry.gauge(
            "controller_runtime_active_workers",
            "Number of currently used workers per controller",
            ["controller"],
        ).labels(name)
        self.max_concurrent = registry.gauge(
            "controller_runtime_max_concurrent_reconciles",
            "Maximum number of concurrent reconciles per controller",
            ["controller"],
        ).labels(name)
        self.name = name

    def result(self, result: str) -> None:
        self.total.labels(self.name, result).inc()


class Controller:
    """A named reconcile loop; see the module doc. Start with `await nursery.start(c.run)`."""

    def __init__(
        self,
        name: str,
        reconciler: Reconciler,
        workers: int = 1,
        rate_limiter: RateLimiter | None = None,
        queue: WorkQueue[str] | None = None,
        *,
        metrics: Registry = REGISTRY,
    ) -> None:
        if workers < 1:
            raise ValueError(f"controller {name!r}: workers must be >= 1, got {workers}")
        self.name = name
        self.reconciler = reconciler
        self.workers = workers
        self.queue: WorkQueue[str] = queue or WorkQueue(
            name, rate_limiter or default_controller_rate_limiter(), metrics
        )
        self._metrics = _Metrics(metrics, name)
        self._informers: list[SharedInformer] = []

    # ------------------------------------------------------------------ sources
    def enqueue(self, key: str) -> None:
        self.queue.add(key)

    def watches(
        self,
        informer: SharedInformer,
        key_fn: KeyFn = object_key,
        *,
        when: Callable[[Obj], bool] | None = None,
    ) -> None:
        """Enqueue `key_fn(obj)` for every add, update and delete the informer sees (the new
        state for updates, both old and new when the key changes); `run` waits for its sync.
        `when`: only for the objects it accepts (a cheap test in the event handler that spares
        the queue the objects whose reconcile would do nothing)."""
        if informer not in self._informers:
            self._informers.append(informer)

        def one(obj: Obj) -> None:
            key = key_fn(obj)
            if key and (when is None or when(obj)):
                self.queue.add(key)

        def updated(old: Obj, new: Obj) -> None:
            key = key_fn(new)
            if key and (when is None or when(new)):
                self.queue.add(key)
            old_key = key_fn(old)
            if old_key and old_key != key:
                self.queue.add(old_key)

        informer.add_event_handler(
            on_add=one, on_update=updated, on_delete=lambda obj: one(deleted_object(obj))
        )

    # ------------------------------------------------------------------ running
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:  # the queue is shut down however run ends, also when cancelled during the sync
            for inf in self._informers:
                await inf.wait_for_cache_sync()
            self._metrics.max_concurrent.set(self.workers)
            async with trio.open_nursery() as nursery:
                await nursery.start(self.queue.run)
                for _ in range(self.workers):
                    nursery.start_soon(self._worker)
                log.info("controller %s: started %d workers", self.name, self.workers)
                task_status.started()
        finally:
            self.queue.shutdown()

    async def _worker(self) -> None:
        while True:
            try:
                key = await self.queue.get()
            except QueueShutDown:
                return
            await self._process(key)

    async def _process(self, key: str) -> None:
        m, queue = self._metrics, self.queue
        m.active.inc()
        start = trio.current_time()
        try:
            result = await self.reconciler.reconcile(key)
        except TerminalError as exc:
            log.warning("controller %s: %s: terminal error, not retrying: %s", self.name, key, exc)
            queue.forget(key)
            m.terminal.inc()
            m.errors.inc()
            m.result("error")
        except Exception:
            log.exception("controller %s: reconciling %s failed; retrying", self.name, key)
            queue.add_rate_limited(key)
            m.errors.inc()
            m.result("error")
        else:
            if result.requeue_after > 0:
                queue.forget(key)
                queue.add_after(key, result.requeue_after)
                m.result("requeue_after")
            elif result.requeue:
                queue.add_rate_limited(key)
                m.result("requeue")
            else:
                queue.forget(key)
                m.result("success")
        finally:
            queue.done(key)
            m.time.observe(trio.current_time() - start)
            m.active.dec()
