"""Helpers for the DaemonSet and StatefulSet controller tests against the in-process server.

* `Nodes`: simulated nodes (`orchestrator.testing.nodes.SimulatedNode`, which mark pods bound to
  them
  Running/Ready and finish deletions) that can join and leave while a test runs.
* `PodWatch`: the pods of a namespace as one watch stream shows them, with an invariant checked
  at every event (one stream sees writes in commit order, so "at every event" is meaningful).
* `until`: poll a condition; callers hold the deadline with `trio.fail_after`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import trio
from api.apiharness import Harness

from orchestrator.client.resource import NODES, PODS
from orchestrator.controllers.runtime.inprocess import InProcessClient
from orchestrator.security.authn import User
from orchestrator.testing.nodes import SimulatedNode

Obj = dict[str, Any]
ADMIN = User("system:admin", ("system:masters", "system:authenticated"))


def admin(h: Harness) -> InProcessClient:
    assert h.server.api is not None
    return InProcessClient(h.server.api.api, ADMIN, field_manager="test")


async def until(predicate: Callable[[], bool | Awaitable[bool]], poll: float = 0.02) -> None:
    """Poll `predicate` (sync or async) until true."""
    while True:
        got = predicate()
        if not isinstance(got, bool):
            got = await got
        if got:
            return
        await trio.sleep(poll)


def is_ready(pod: Obj) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def terminating(pod: Obj) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


class Nodes:
    """Simulated nodes started in `nursery`, each in its own cancel scope."""

    def __init__(self, h: Harness, nursery: trio.Nursery) -> None:
        assert h.server.api is not None
        self.api = h.server.api.api
        self.client = admin(h)
        self.nursery = nursery
        self.scopes: dict[str, trio.CancelScope] = {}

    async def join(
        self,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        taints: Sequence[Mapping[str, str]] | None = None,
        start_delay: float = 0.0,
    ) -> SimulatedNode:
        node = SimulatedNode(self.api, name, labels=labels, taints=taints, start_delay=start_delay)
        scope = trio.CancelScope()
        self.scopes[name] = scope

        async def run(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            with scope:
                await node.run(task_status=task_status)

        await self.nursery.start(run)
        return node

    async def leave(self, name: str) -> None:
        """Stop the agent and delete its Node."""
        self.scopes.pop(name).cancel()
        await self.client.delete(NODES, name)


class PodWatch:
    """The pods of `namespace`, kept current by one watch; `check(pods)` runs after every
    event and may raise `AssertionError`. `events` counts the events seen."""

    def __init__(
        self,
        client: InProcessClient,
        namespace: str,
        check: Callable[[dict[str, Obj]], None] | None = None,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.check = check
        self.pods: dict[str, Obj] = {}
        self.events = 0
        self.history: list[tuple[str, str]] = []  # (type, pod name)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listed = await self.client.list(PODS, self.namespace)
        for pod in listed.get("items") or []:
            self.pods[pod["metadata"]["name"]] = pod
        rv = str((listed.get("metadata") or {}).get("resourceVersion") or "")
        if self.check is not None:
            self.check(self.pods)
        async with self.client.watch(PODS, self.namespace, resource_version=rv) as events:
            task_status.started()
            async for etype, pod in events:
                name = pod["metadata"]["name"]
                if etype == "DELETED":
                    self.pods.pop(name, None)
                elif etype in ("ADDED", "MODIFIED"):
                    self.pods[name] = pod
                else:
                    continue
                self.events += 1
                self.history.append((etype, name))
                if self.check is not None:
                    self.check(self.pods)
