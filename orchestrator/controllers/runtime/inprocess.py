"""`InProcessClient`: the controllers' `Client` over `orchestrator.apiserver.resources.Api` in this
process — see `client` for the contract (the protocol, errors, watch semantics, fencing).

A module of its own so that users of `client` that only speak HTTPS (a standalone node agent)
do not import the API server's layers: import `InProcessClient` from here. It builds the
verbs' typed options (`apiserver.options`) directly from its arguments: selectors are parsed
once, here, and nothing goes through a query string.

Every call takes a seat of the API's overload gate (`apiserver.flowcontrol`) as an HTTP request
does, so the controllers, the scheduler and the embedded agent share the server fairly with
HTTP clients (a node's Lease renewal keeps its priority level). Their waits are unbounded (no
429 for a long queue): their callers own their timeouts. A watch holds its seat only while it
opens.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, asynccontextmanager
from typing import Any

import trio

from orchestrator.apiserver.handler import Call
from orchestrator.apiserver.options import ListOptions, WatchOptions, WriteOptions
from orchestrator.apiserver.resources import Api
from orchestrator.apiserver.watch import open_watch
from orchestrator.client import APPLY_PATCH, MERGE_PATCH, ResourceInfo
from orchestrator.client.resource import PODS
from orchestrator.controllers.runtime.bodies import binding, delete_options
from orchestrator.controllers.runtime.client import DEFAULT_FIELD_MANAGER, WatchEvent
from orchestrator.kube.errors import ApiError
from orchestrator.kube.jsonvalue import copy_json
from orchestrator.kube.objects import Obj, metadata_of
from orchestrator.kube.selectors import parse_field_selector, parse_label_selector
from orchestrator.security.authn import User
from orchestrator.store.fencing import fenced

__all__ = ["InProcessClient"]


def _watch_error(obj: Obj) -> ApiError:
    code, details = obj.get("code"), obj.get("details")
    return ApiError(
        code if isinstance(code, int) and code else 500,
        str(obj.get("reason") or "InternalError"),
        str(obj.get("message") or "watch error"),
        details if isinstance(details, dict) else {},
    )


class InProcessClient:
    """`Client` over `Api` in this process (see the module doc). `fence_term`: fence writes."""

    def __init__(
        self,
        api: Api,
        user: User,
        *,
        field_manager: str = DEFAULT_FIELD_MANAGER,
        fence_term: int | None = None,
    ) -> None:
        self.api = api
        self.user = user
        self.field_manager = field_manager
        self.fence_term = fence_term
        # Immutable, so made once instead of per call.
        self._opts = WriteOptions(False, field_manager, "Strict", False)
        self._forced = WriteOptions(False, field_manager, "Strict", True)

    def _call(self, *, force: bool = False, read_only: bool = False) -> Call:
        opts = self._forced if force else self._opts
        return Call(self.user, opts, read_only=read_only)

    def _kind(self, res: ResourceInfo) -> Any:
        return self.api.kind(res.group, res.version, res.plural)

    def _seat(self, res: ResourceInfo, namespace: str) -> Any:
        """The overload gate's seat for one call (module doc)."""
        return self.api.flowcontrol.seat(self.user, res.group, res.plural, namespace, bounded=False)

    async def get(self, res: ResourceInfo, name: str, namespace: str = "") -> Obj:
        async with self._seat(res, namespace):
            return await self.api.get(self._call(), self._kind(res), namespace, name)

    async def list(
        self,
        res: ResourceInfo,
        namespace: str = "",
        *,
        label_selector: str = "",
        field_selector: str = "",
        limit: int = 0,
        continue_token: str = "",
        resource_version: str = "",
    ) -> Obj:
        opts = ListOptions(
            label_selector=parse_label_selector(label_selector),
            field_selector=parse_field_selector(field_selector),
            limit=limit,
            continue_token=continue_token or None,
            resource_version=resource_version,
        )
        async with self._seat(res, namespace):
            return await self.api.list_objects(self._call(), self._kind(res), namespace, opts)

    async def create(
        self, res: ResourceInfo, body: Obj, namespace: str = "", *, read_only: bool = False
    ) -> Obj:
        ns = namespace or str(metadata_of(body).get("namespace") or "")
        with fenced(self.fence_term):
            # Not copied: a create only reads `body` and stores what validation built from it.
            async with self._seat(res, ns):
                return await self.api.create(
                    self._call(read_only=read_only), self._kind(res), ns, body
                )

    async def update(self, res: ResourceInfo, body: Obj, *, subresource: str = "") -> Obj:
        meta = metadata_of(body)
        ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        with fenced(self.fence_term):
            async with self._seat(res, ns):
                obj, _ = await self.api.update(
                    self._call(), self._kind(res), ns, name, copy_json(body), subresource
                )
        return obj

    async def patch(
        self,
        res: ResourceInfo,
        name: str,
        body: Any,
        namespace: str = "",
        *,
        content_type: str = MERGE_PATCH,
        subresource: str = "",
        read_only: bool = False,
    ) -> Obj:
        # A merge patch is only read: its values go into the proposed object, which validation
        # copies into the one stored. The other kinds of patch get a copy of their own.
        sent = body if content_type == MERGE_PATCH else copy_json(body)
        with fenced(self.fence_term):
            async with self._seat(res, namespace):
                obj, _ = await self.api.patch(
                    self._call(read_only=read_only),
                    self._kind(res),
                    namespace,
                    name,
                    content_type,
                    sent,
                    subresource,
                )
        return obj

    async def apply(
        self, res: ResourceInfo, body: Obj, *, force: bool = False, subresource: str = ""
    ) -> Obj:
        meta = metadata_of(body)
        ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        with fenced(self.fence_term):
            async with self._seat(res, ns):
                obj, _ = await self.api.patch(
                    self._call(force=force),
                    self._kind(res),
                    ns,
                    name,
                    APPLY_PATCH,
                    copy_json(body),
                    subresource,
                )
        return obj

    async def delete(
        self,
        res: ResourceInfo,
        name: str,
        namespace: str = "",
        *,
        propagation_policy: str | None = None,
        preconditions: Obj | None = None,
        grace_period_seconds: int | None = None,
    ) -> Obj:
        opts = delete_options(propagation_policy, preconditions, grace_period_seconds)
        with fenced(self.fence_term):
            async with self._seat(res, namespace):
                obj, _code = await self.api.delete(
                    self._call(), self._kind(res), namespace, name, opts
                )
        return obj

    async def bind(self, pod: Obj, node: str) -> None:
        meta = metadata_of(pod)
        kind = self._kind(PODS)
        ns = str(meta.get("namespace") or "")
        with fenced(self.fence_term):
            async with self._seat(PODS, ns):
                await self.api.bind(
                    self._call(), kind, ns, str(meta.get("name") or ""), binding(pod, node)
                )

    @asynccontextmanager
    async def watch(
        self,
        res: ResourceInfo,
        namespace: str = "",
        *,
        resource_version: str = "",
        label_selector: str = "",
        field_selector: str = "",
        timeout_seconds: float | None = None,
        allow_bookmarks: bool = False,
        read_only: bool = False,
    ) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        opts = WatchOptions(
            label_selector=parse_label_selector(label_selector),
            field_selector=parse_field_selector(field_selector),
            resource_version=resource_version,
            allow_bookmarks=allow_bookmarks,
        )
        async with self._seat(res, namespace):
            stream = await open_watch(
                self.api, self._call(), self._kind(res), namespace, opts, read_only=read_only
            )
        deadline = (
            trio.current_time() + timeout_seconds if timeout_seconds is not None else float("inf")
        )
        # open_watch returns an async generator; close it (and its store watcher) on exit.
        async with (
            aclosing(stream) as raw,  # type: ignore[type-var]  # an async generator in fact
            aclosing(_in_process_events(raw, deadline)) as events,
        ):
            yield events


async def _in_process_events(
    raw: AsyncIterator[list[Obj]], deadline: float
) -> AsyncGenerator[WatchEvent, None]:
    it = raw.__aiter__()
    while True:
        # The cancel scope covers only the wait, never a yield (trio forbids that in generators);
        # one per batch of events, not per event.
        with trio.move_on_at(deadline):
            try:
                batch = await it.__anext__()
            except StopAsyncIteration:
                return
        if trio.current_time() >= deadline:
            return
        for ev in batch:
            etype = str(ev.get("type", ""))
            obj = ev.get("object") or {}
            if etype == "ERROR":
                raise _watch_error(obj)
            yield etype, obj
