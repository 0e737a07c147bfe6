"""Test helpers for the ReplicaSet and Deployment controller tests: an admin in-process client,
simulated nodes, and polling helpers.

Pods are run by the real scheduler (registered in `default_controllers`) and a
`SimulatedCluster` (orchestrator/testing/nodes.py): bound pods become Running and Ready, deletions
finish at once. A pod that must never become ready gets `NOWHERE` as its nodeSelector (no
node matches, so it stays Pending).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from orchestrator.controllers.runtime.inprocess import InProcessClient
from orchestrator.kube.errors import ApiError
from orchestrator.security.authn import User
from orchestrator.testing.nodes import SimulatedCluster

log = logging.getLogger(__name__)

Obj = dict[str, Any]
ADMIN = User("system:admin", ("system:masters", "system:authenticated"))
NOWHERE = {"example.com/no-such-node": "true"}  # a nodeSelector no simulated node matches


def admin_client(h: Any) -> InProcessClient:
    assert h.server.api is not None
    return InProcessClient(h.server.api.api, ADMIN)


async def patch(client: InProcessClient, res: Any, name: str, body: Any, ns: str, **kw: Any) -> Obj:
    """A user's patch, retried on 409: the server answers a patch that raced another write with
    a Conflict instead of re-applying it (orchestrator/apiserver/update.py `guaranteed_update`
    takes the live object's resourceVersion as the patch's precondition)."""
    while True:
        try:
            result: Obj = await client.patch(res, name, body, ns, **kw)
            return result
        except ApiError as exc:
            if exc.code != 409:
                raise
            await trio.sleep(0.01)


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


async def start_nodes(nursery: trio.Nursery, h: Any, n: int = 2) -> SimulatedCluster:
    """`n` simulated nodes (Running/Ready for every pod the scheduler binds to them; deletions
    finished at once) on the harness's server."""
    assert h.server.api is not None
    cluster = SimulatedCluster(h.server.api.api, n, workers=8)
    await nursery.start(cluster.run)
    return cluster
