"""Test helpers for the ReplicaSet and Deployment controller tests: an admin in-process client,
a fake kubelet that binds pods and makes them Running/Ready, and polling helpers.

`FakeKubelet` stands in for the scheduler + simulated nodes (orchestrator/sim/nodes.py and the
scheduler driver) until those land: level-based on a pod informer, it binds every unbound pod
to `node-a`, marks bound pods Running and Ready (unless `hold(pod)` says the pod must stay
not ready: a "broken" image), and finishes graceful deletions at once (grace 0).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import trio

from orchestrator.api.auth.authn import User
from orchestrator.api.errors import ApiError
from orchestrator.api.schema.columns import now_rfc3339
from orchestrator.controllers.runtime.client import PODS, InProcessClient
from orchestrator.controllers.runtime.informer import SharedInformer, deleted_object, object_key
from orchestrator.controllers.runtime.metrics import Registry

log = logging.getLogger(__name__)

Obj = dict[str, Any]
ADMIN = User("system:admin", ("system:masters", "system:authenticated"))
BROKEN_IMAGE = "registry.invalid/broken:1"


def admin_client(h: Any) -> InProcessClient:
    assert h.server.api is not None
    return InProcessClient(h.server.api.api, ADMIN)


async def until(predicate: Callable[[], bool]) -> None:
    """Poll a condition (callers hold the deadline with `trio.fail_after`)."""
    while not predicate():  # noqa: ASYNC110  (the condition is data, not an event to wait on)
        await trio.sleep(0.01)


async def until_async(predicate: Callable[[], Any]) -> Any:
    """Poll an async condition until it returns something truthy; returns it."""
    while True:
        value = await predicate()
        if value:
            return value
        await trio.sleep(0.02)


def broken(pod: Obj) -> bool:
    containers = (pod.get("spec") or {}).get("containers") or []
    return any(c.get("image") == BROKEN_IMAGE for c in containers)


class FakeKubelet:
    """See the module doc. `await nursery.start(kubelet.run)`."""

    def __init__(
        self,
        client: InProcessClient,
        *,
        node: str = "node-a",
        hold: Callable[[Obj], bool] = broken,
    ) -> None:
        self.client = client
        self.node = node
        self.hold = hold
        self.pods = SharedInformer(client, PODS, metrics=Registry())
        self._send, self._receive = trio.open_memory_channel[str](10_000)
        self._queued: set[str] = set()
        self.paused = False

    def _enqueue(self, obj: Obj) -> None:
        key = object_key(obj)
        if key not in self._queued:
            self._queued.add(key)
            self._send.send_nowait(key)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.pods.add_event_handler(
            on_add=self._enqueue,
            on_update=lambda _old, new: self._enqueue(new),
            on_delete=lambda obj: self._enqueue(deleted_object(obj)),
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(self.pods.run)
            for _ in range(4):
                nursery.start_soon(self._worker)
            task_status.started()

    async def _worker(self) -> None:
        async for key in self._receive:
            self._queued.discard(key)
            try:
                await self._sync(key)
            except ApiError as exc:
                if exc.code not in (404, 409):
                    log.warning("fake kubelet: %s: %s", key, exc)
                self._enqueue_later(key)

    def _enqueue_later(self, key: str) -> None:
        pod = self.pods.get(key)
        if pod is not None:
            self._enqueue(pod)

    async def _sync(self, key: str) -> None:
        pod = self.pods.get(key)
        if pod is None or self.paused:
            return
        meta = pod["metadata"]
        ns, name = meta["namespace"], meta["name"]
        if meta.get("deletionTimestamp"):
            await self.client.delete(
                PODS, name, ns, grace_period_seconds=0, preconditions={"uid": meta["uid"]}
            )
            return
        if not (pod.get("spec") or {}).get("nodeName"):
            await self.client.bind(pod, self.node)
            return
        status = pod.get("status") or {}
        if status.get("phase") == "Running" or (self.hold(pod) and status.get("phase")):
            return
        now = now_rfc3339(time.time())
        ready = "False" if self.hold(pod) else "True"
        conditions = [
            {"type": t, "status": s, "lastTransitionTime": now}
            for t, s in (
                ("PodScheduled", "True"),
                ("Initialized", "True"),
                ("ContainersReady", ready),
                ("Ready", ready),
            )
        ]
        patch = {
            "status": {
                "phase": "Pending" if self.hold(pod) else "Running",
                "conditions": conditions,
                "startTime": now,
                "hostIP": "10.0.0.1",
                "podIP": "10.1.0.1",
            }
        }
        await self.client.patch(PODS, name, patch, ns, subresource="status")
