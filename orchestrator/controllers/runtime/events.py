"""`EventRecorder`: core/v1 Events about objects, deduplicated, never blocking a reconcile.

Theory of operation
-------------------
`record(obj, type, reason, message)` is synchronous and never raises: it puts the request in a
bounded buffer (a trio memory channel) and returns; when the buffer is full the event is dropped
and `events_dropped_total{component}` counts it. The `run()` task drains the buffer and writes:

* like client-go's EventCorrelator, the same (involved object, type, reason, message) recorded
  again within `DEDUP_WINDOW` (10 min) bumps `count` and `lastTimestamp` of the Event already
  written (a merge patch) instead of creating another one; if that Event is gone (404) a new
  one is created;
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
from dataclasses import dataclass

import trio

from orchestrator.client import EVENTS
from orchestrator.controllers.runtime.client import Client
from orchestrator.kube.errors import ApiError
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.columns import now_rfc3339
from orchestrator.metrics import REGISTRY, Registry

__all__ = ["DEDUP_WINDOW", "EventRecorder"]

log = logging.getLogger(__name__)

DEDUP_WINDOW = 600.0  # seconds: client-go's correlator cache window
BUFFER = 1000
_MAX_REMEMBERED = 4096


@dataclass(slots=True)
class _Seen:
    namespace: str
    name: str  # the Event's name
    count: int
    last: float  # clock() of the last write


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
        self._seen: dict[tuple[str, ...], _Seen] = {}
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
        key = (
            involved.get("kind", ""),
            involved.get("namespace", ""),
            involved.get("name", ""),
            involved.get("uid", ""),
            type,
            reason,
            message,
        )
        now = self.clock()
        stamp = now_rfc3339(now)
        seen = self._seen.get(key)
        if seen is not None and now - seen.last < DEDUP_WINDOW:
            patch = {"count": seen.count + 1, "lastTimestamp": stamp}
            try:
                await self.client.patch(EVENTS, seen.name, patch, seen.namespace)
            except ApiError as exc:
                if exc.code != 404:
                    raise
            else:
                seen.count += 1
                seen.last = now
                return
        namespace = involved.get("namespace") or "default"
        name = f"{involved.get('name') or 'event'}.{secrets.token_hex(8)}"
        event: Obj = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": involved,
            "reason": reason,
            "message": message,
            "type": type,
            "source": {"component": self.component, **({"host": self.host} if self.host else {})},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
            "reportingComponent": self.component,
        }
        await self.client.create(EVENTS, event, namespace)
        if len(self._seen) >= _MAX_REMEMBERED:
            self._seen = {k: v for k, v in self._seen.items() if now - v.last < DEDUP_WINDOW}
            if len(self._seen) >= _MAX_REMEMBERED:
                self._seen.pop(next(iter(self._seen)))
        self._seen[key] = _Seen(namespace, name, 1, now)
