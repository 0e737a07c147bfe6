"""A single-member server (real Raft, SQLite, API) whose controller manager runs only the
controllers a test chooses, built with the test's options, plus an admin in-process client and
polling helpers. For the GC, namespace, node lifecycle and endpoints tests."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from orchestrator.apiserver.server import ApiOptions
from orchestrator.client import NAMESPACES, ResourceInfo
from orchestrator.controllers.runtime.inprocess import InProcessClient
from orchestrator.controllers.runtime.manager import Component, ControllerContext, ControllerManager
from orchestrator.kube.errors import ApiError
from orchestrator.metrics import Registry
from orchestrator.raft.node import NodeConfig
from orchestrator.security.authn import User
from orchestrator.server import Server, ServerOptions

Obj = dict[str, Any]
ADMIN = User("admin", ("system:masters", "system:authenticated"))
POLL = 0.02


@dataclass
class Env:
    server: Server
    manager: ControllerManager
    client: InProcessClient  # admin

    async def get_or_none(self, res: ResourceInfo, name: str, namespace: str = "") -> Obj | None:
        try:
            return await self.client.get(res, name, namespace)
        except ApiError as exc:
            if exc.code == 404:
                return None
            raise


async def eventually(check: Callable[[], Awaitable[bool]]) -> None:
    """Poll `check` until true (callers hold the deadline with `trio.fail_after`)."""
    while not await check():  # noqa: ASYNC110  (the condition is remote state, not an event)
        await trio.sleep(POLL)


@asynccontextmanager
async def controller_server(
    factory: Callable[[ControllerContext], Sequence[Component]],
) -> AsyncIterator[Env]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        node = NodeConfig(
            node_id=1,
            data_dir=root,
            peer_listen="127.0.0.1:0",
            founders={1: "127.0.0.1:0"},
            tick_interval=0.01,
        )
        opts = ServerOptions(
            node,
            "127.0.0.1:0",
            token="t",
            api=ApiOptions(root, "127.0.0.1:0", tls=False, cluster_token="t"),
            controllers=False,
        )
        server = Server(opts)
        async with trio.open_nursery() as nursery:
            with trio.fail_after(30):
                await nursery.start(server.run)
            assert server.api is not None
            client = InProcessClient(server.api.api, ADMIN, field_manager="test")
            manager = ControllerManager(
                server.api.api, factory, leadership=server.node, metrics=Registry()
            )
            env = Env(server, manager, client)
            with trio.fail_after(30):
                for ns in ("default", "kube-node-lease"):
                    while not await _exists(env, NAMESPACES, ns):  # noqa: ASYNC110  (remote state)
                        await trio.sleep(POLL)
                await nursery.start(manager.run)
                while not manager.controllers:  # noqa: ASYNC110  (state set by another task)
                    await trio.sleep(POLL)
            yield env
            nursery.cancel_scope.cancel()


async def _exists(env: Env, res: ResourceInfo, name: str) -> bool:
    try:
        return await env.get_or_none(res, name) is not None
    except ApiError:
        return False  # not ready yet (no leader)
