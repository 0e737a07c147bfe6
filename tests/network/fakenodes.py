"""An in-memory stand-in for the API's Nodes (list, watch, merge-patch of metadata), shared by
several `PodNetwork`s in a test: what one publishes, the others see. `down = True` makes every
call fail as an unreachable server does (503)."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from orchestrator.kube.errors import ApiError
from orchestrator.kube.objects import Obj


def node(name: str, pod_cidr: str, ip: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": {}},
        "spec": {"podCIDR": pod_cidr},
        "status": {"addresses": [{"type": "InternalIP", "address": ip}]},
    }


class FakeNodes:
    def __init__(self) -> None:
        self.nodes: dict[str, Obj] = {}
        self.rv = 0
        self.down = False
        self.patches: list[tuple[str, Any]] = []
        self._watchers: list[trio.MemorySendChannel[tuple[str, Obj]]] = []
        self._history: list[tuple[int, str, Obj]] = []  # a watch from a LIST's rv replays

    def _check(self) -> None:
        if self.down:
            raise ApiError(503, "ServiceUnavailable", "the server is unreachable (test)")

    def _emit(self, etype: str, obj: Obj) -> None:
        self._history.append((self.rv, etype, copy.deepcopy(obj)))
        for w in list(self._watchers):
            try:
                w.send_nowait((etype, copy.deepcopy(obj)))
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                self._watchers.remove(w)

    def put(self, obj: Obj) -> None:
        self.rv += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.rv)
        name = obj["metadata"]["name"]
        etype = "MODIFIED" if name in self.nodes else "ADDED"
        self.nodes[name] = obj
        self._emit(etype, obj)

    def delete(self, name: str) -> None:
        self.rv += 1
        self._emit("DELETED", self.nodes.pop(name))

    def cut(self) -> None:
        """The server goes away: calls fail and open watches end."""
        self.down = True
        for w in self._watchers:
            w.close()
        self._watchers.clear()

    async def list(self, res: Any, namespace: str = "", **_: Any) -> Obj:
        await trio.lowlevel.checkpoint()
        self._check()
        return {
            "items": [copy.deepcopy(n) for n in self.nodes.values()],
            "metadata": {"resourceVersion": str(self.rv)},
        }

    @asynccontextmanager
    async def watch(
        self, res: Any, namespace: str = "", *, resource_version: str = "", **_: Any
    ) -> AsyncIterator[Any]:
        self._check()
        send, receive = trio.open_memory_channel[tuple[str, Obj]](1000)
        since = int(resource_version or self.rv)
        for rv, etype, obj in self._history:  # what happened after the caller's LIST
            if rv > since:
                send.send_nowait((etype, copy.deepcopy(obj)))
        self._watchers.append(send)
        async with receive:
            yield receive

    async def patch(self, res: Any, name: str, body: Any, namespace: str = "", **_: Any) -> Obj:
        await trio.lowlevel.checkpoint()
        self._check()
        self.patches.append((name, body))
        obj = copy.deepcopy(self.nodes[name])
        obj["metadata"]["annotations"].update(body["metadata"]["annotations"])
        self.put(obj)
        return obj
