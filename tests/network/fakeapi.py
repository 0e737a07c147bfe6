"""A fake API for informer tests: objects per resource in memory, LIST and WATCH, switchable
down (every call then fails with 503, open watches end with it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import trio

from orchestrator.client.resource import ResourceInfo
from orchestrator.kube.errors import ApiError

Obj = dict[str, Any]


class FakeApi:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Obj]] = {}
        self.rv = 1
        self.up = True
        self.missing: set[str] = set()  # plurals the server does not serve (404)
        self._watchers: list[tuple[str, trio.MemorySendChannel[tuple[str, Obj]]]] = []

    def _check(self, res: ResourceInfo) -> None:
        if not self.up:
            raise ApiError(503, "ServiceUnavailable", "the fake API is down")
        if res.plural in self.missing:
            raise ApiError(404, "NotFound", f"the server could not find {res.plural}")

    def _key(self, obj: Obj) -> str:
        meta = obj["metadata"]
        return f"{meta.get('namespace', '')}/{meta['name']}"

    def _emit(self, plural: str, etype: str, obj: Obj) -> None:
        for p, ch in list(self._watchers):
            if p == plural:
                with suppress(trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                    ch.send_nowait((etype, obj))

    def put(self, res: ResourceInfo, obj: Obj) -> Obj:
        self.rv += 1
        obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self.rv)}}
        store = self.objects.setdefault(res.plural, {})
        etype = "MODIFIED" if self._key(obj) in store else "ADDED"
        store[self._key(obj)] = obj
        self._emit(res.plural, etype, obj)
        return obj

    def delete(self, res: ResourceInfo, namespace: str, name: str) -> None:
        self.rv += 1
        obj = self.objects.get(res.plural, {}).pop(f"{namespace}/{name}")
        self._emit(res.plural, "DELETED", obj)

    def set_up(self, up: bool) -> None:
        self.up = up
        if not up:
            for _p, ch in self._watchers:
                ch.close()
            self._watchers.clear()

    # the Client methods the informer uses
    async def list(self, res: ResourceInfo, namespace: str = "", **_: Any) -> Obj:
        await trio.lowlevel.checkpoint()
        self._check(res)
        items = list(self.objects.get(res.plural, {}).values())
        return {"items": items, "metadata": {"resourceVersion": str(self.rv)}}

    @asynccontextmanager
    async def watch(self, res: ResourceInfo, namespace: str = "", **_: Any) -> AsyncIterator[Any]:
        self._check(res)
        send, recv = trio.open_memory_channel[tuple[str, Obj]](1000)
        self._watchers.append((res.plural, send))
        try:

            async def events() -> AsyncIterator[tuple[str, Obj]]:
                async for ev in recv:
                    yield ev
                if not self.up:
                    raise ApiError(503, "ServiceUnavailable", "the fake API went down")

            yield events()
        finally:
            if (res.plural, send) in self._watchers:
                self._watchers.remove((res.plural, send))
