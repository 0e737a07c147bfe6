"""`EventRecorder`: core/v1 Events about objects, deduplicated, never blocking a reconcile.

Theory of operation
-------------------
`record(obj, type, reason, message)` is synchronous and never raises: it puts the request in a
bounded buffer (a trio memory channel) and returns; when the buffer is full the event is dropped
and `events_dropped_total{component}` counts it. The `run()` task drains the buffer and writes:

what the pure `EventCorrelator` (`eventcorrelator`, client-go's) answers for it:

* the same (involved object, type, reason, message) recorded again within `DEDUP_WINDOW`
  (10 min) bumps `count` and `lastTimestamp` of the Event already written (a merge patch)
  instead of creating another one; if that Event is gone (404) a new one is created;
* ten different messages with the same object, type and reason are combined into one Event
  ("(combined from similar events): ..."), bumped from then on;
* each object has a token bucket of 25 writes, refilled by one every 5 minutes: an Event
  beyond it is dropped (`events_dropped_total` counts it);
* otherwise a new Event `<object name>.<16 hex digits>` in the object's namespace ("default"
  for cluster-scoped objects) with involvedObject, source {component, host}, first/last
  timestamps and count 1.

A failed write is logged and dropped (`events_dropped_total` too): Events are best effort.
Invariant: no exception from the API ever reaches the caller of `record`.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable

import trio

from orchestrator.client import EVENTS
from orchestrator.controllers.runtime.client import Client
from orchestrator.controllers.runtime.eventcorrelator import (
    DEFAULT_WINDOW,
    Bump,
    Create,
    Drop,
    EventCorrelator,
)
from orchestrator.kube.errors import ApiError
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.columns import now_rfc3339
from orchestrator.metrics import REGISTRY, Registry

__all__ = ["DEDUP_WINDOW", "EventRecorder"]

log = logging.getLogger(__name__)

DEDUP_WINDOW = DEFAULT_WINDOW  # seconds: client-go's correlator cache window
BUFFER = 1000


class EventRecorder:
    """Records Events as `component` (on `host`); run `run()` in the controllers' nursery."""

    def __init__(
        self,
        client: Client,
        component: str,
        host: str = "",
        *,
        buffer: int = BUFFER,
        metrics: Registry = REGISTRY,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.component = component
        self.host = host
        self.clock = clock
        self._send, self._receive = trio.open_memory_channel[tuple[Obj, str, str, str]](buffer)
        self.correlator = EventCorrelator(window=DEDUP_WINDOW)
        self._dropped = metrics.counter(
            "events_dropped_total",
            "Events not recorded (buffer full or write failed)",
            ["component"],
        ).labels(component)

    def record(self, obj: Obj, type: str, reason: str, message: str) -> None:
        """Queue an Event about `obj` ("Normal" or "Warning"); never blocks, never raises."""
        try:
            self._send.send_nowait((obj, type, reason, message))
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            self._dropped.inc()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async for obj, type, reason, message in self._receive:
            try:
                await self._write(obj, type, reason, message)
            except ApiError as exc:
                self._dropped.inc()
                log.info("event %s/%s not recorded: %s", reason, type, exc)

    @staticmethod
    def _involved(obj: Obj) -> Obj:
        meta = obj.get("metadata") or {}
        ref = {
            "kind": obj.get("kind", ""),
            "apiVersion": obj.get("apiVersion", ""),
            "namespace": meta.get("namespace", ""),
            "name": meta.get("name", ""),
            "uid": meta.get("uid", ""),
            "resourceVersion": meta.get("resourceVersion", ""),
        }
        return {k: v for k, v in ref.items() if v}

    async def _write(self, obj: Obj, type: str, reason: str, message: str) -> None:
        involved = self._involved(obj)
        ref = (
            str(involved.get("kind", "")),
            str(involved.get("apiVersion", "")),
            str(involved.get("namespace", "")),
            str(involved.get("name", "")),
            str(involved.get("uid", "")),
        )
        now = self.clock()
        stamp = now_rfc3339(now)
        source = f"{self.component}/{self.host}"
        decision = self.correlator.correlate(source, ref, type, reason, message, now)
        if isinstance(decision, Drop):
            self._dropped.inc()
            log.debug("event %s/%s about %s dropped: too many", reason, type, ref)
            return
        if isinstance(decision, Bump):
            patch = {"count": decision.count, "lastTimestamp": stamp}
            try:
                await self.client.patch(EVENTS, decision.name, patch, decision.namespace)
            except ApiError as exc:
                if exc.code != 404:
                    raise
                self.correlator.forget(decision.identity)
                decision = Create(decision.identity, decision.message)
            else:
                self.correlator.bumped(decision, now)
                return
        namespace = involved.get("namespace") or "default"
        name = f"{involved.get('name') or 'event'}.{secrets.token_hex(8)}"
        event: Obj = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": involved,
            "reason": reason,
            "message": decision.message,
            "type": type,
            "source": {"component": self.component, **({"host": self.host} if self.host else {})},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
            "reportingComponent": self.component,
        }
        await self.client.create(EVENTS, event, namespace)
        self.correlator.created(decision, namespace, name, now)
