"""The client controllers use: one `Client` protocol, two transports, one error type.

Theory of operation
-------------------
Controllers program against `Client` (objects are plain dicts, resources are named by
`orchestrator.client.ResourceInfo`, the same value the CLI's `RestClient` and discovery use, so
the well-known ones — `PODS`, `NODES`, `DEPLOYMENTS`... and `CONFIGMAPS`, `EVENTS` below — need
no discovery round trip). Two implementations:

* `InProcessClient(api, user)` calls `orchestrator.apiserver.resources.Api` directly: no HTTP, no
  JSON, but every call still goes through authorization, admission and validation because `Api`
  does them (module `inprocess`, imported from there, so an agent that only speaks HTTPS never
  imports the API server's layers). Each call builds a fresh `Call(user, WriteOptions(...))`
  and passes list and watch options typed (`apiserver.options`), selectors parsed once.
  Inputs are deep-copied (`copy_json`: bodies are JSON values — dicts, lists, strings,
  numbers, booleans, None), so a controller's dicts are never aliased by the server (as if
  they had crossed a wire); a create's body and a merge patch are not, because the server
  only reads them (what is stored is built anew by validation). With
  `fence_term=T` every write is fenced to Raft term T (see `orchestrator.store.fencing`): once
  this server is no longer the leader of term T, writes fail with a 503 instead of landing.
* `HttpClient(rest)` speaks HTTPS through an entered `orchestrator.client.RestClient`.

Both raise `orchestrator.kube.errors.ApiError` for every failure (the HTTP transport converts
Status bodies; an unreachable server is a 503 ServiceUnavailable), so controllers handle one
type: `exc.code == 404`, `409`, `410`...

`watch(...)` is an async context manager yielding an async iterator of `(type, obj)`; with
`read_only=True` (the caller never modifies them) the in-process transport hands every
read-only watcher of an event the same decoded object (`orchestrator.apiserver.watch`); types are
ADDED, MODIFIED, DELETED and BOOKMARK. An in-stream ERROR event (e.g. 410 Expired after a
compaction) raises `ApiError`; a clean end of the stream ends the iteration (re-watch from the
last resourceVersion). `timeout_seconds` ends the stream cleanly after that long.

Namespaces: "" means "all namespaces" for `list`/`watch` of a namespaced resource and "no
namespace" for cluster-scoped ones; `get`/`delete`/`patch` of a namespaced object need one.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import AbstractAsyncContextManager, aclosing, asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol

from orchestrator.client import (
    APPLY_PATCH,
    MERGE_PATCH,
    ApiConnectionError,
    ApiException,
    ResourceInfo,
)
from orchestrator.client.resource import DEPLOYMENTS, EVENTS, NAMESPACES, NODES, PODS, REPLICASETS
from orchestrator.controllers.runtime.bodies import binding, delete_options
from orchestrator.kube.errors import ApiError
from orchestrator.kube.objects import Obj, metadata_of

if TYPE_CHECKING:  # not imported at run time: in-process users (the server) need no httpx
    from orchestrator.client.rest import RestClient

__all__ = [
    "CONFIGMAPS",
    "DEPLOYMENTS",
    "EVENTS",
    "NAMESPACES",
    "NODES",
    "PODS",
    "REPLICASETS",
    "Client",
    "HttpClient",
    "Obj",
    "WatchEvent",
    "WatchStream",
]

WatchEvent = tuple[str, Obj]
WatchStream = AbstractAsyncContextManager[AsyncIterator[WatchEvent]]

CONFIGMAPS = ResourceInfo("", "v1", "configmaps", "ConfigMap", True, "configmap", ("cm",))
DEFAULT_FIELD_MANAGER = "orchestrator-controller-manager"


class Client(Protocol):
    """What controllers may do to the API. Every method raises `ApiError` on failure."""

    async def get(self, res: ResourceInfo, name: str, namespace: str = "") -> Obj: ...

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
        """The `...List` dict: `items`, `metadata.resourceVersion`, `metadata.continue`."""
        ...

    async def create(
        self, res: ResourceInfo, body: Obj, namespace: str = "", *, read_only: bool = False
    ) -> Obj:
        """Namespace defaults to the body's. `read_only=True`: the caller never modifies the
        returned object (the in-process transport may then share it with the read-only
        watchers of the write, which need not decode it)."""
        ...

    async def update(self, res: ResourceInfo, body: Obj, *, subresource: str = "") -> Obj:
        """PUT `body` (name and namespace from its metadata; conditional on its
        resourceVersion when set). `subresource` is "" or "status"."""
        ...

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
        """`read_only` as in `create`."""
        ...

    async def apply(
        self, res: ResourceInfo, body: Obj, *, force: bool = False, subresource: str = ""
    ) -> Obj:
        """Server-side apply of `body` (name/namespace from its metadata) as this client's
        field manager."""
        ...

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
        """Returns the deleted object, or the object marked for deletion."""
        ...

    async def bind(self, pod: Obj, node: str) -> None:
        """Bind `pod` (its namespace/name/uid) to `node` (pods/binding)."""
        ...

    def watch(
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
    ) -> WatchStream:
        """`read_only=True`: the caller never modifies the objects it is handed, so an
        in-process transport may share them with other read-only watchers."""
        ...


# ---------------------------------------------------------------------------------- HTTP
def _api_error(exc: ApiException | ApiConnectionError) -> ApiError:
    if isinstance(exc, ApiConnectionError):
        return ApiError(503, "ServiceUnavailable", str(exc))
    details = exc.details
    # The server's Retry-After goes on (`kube.errors.retry_after` reads it): controllers
    # back off at least that long on a 429.
    headers = {} if exc.retry_after is None else {"Retry-After": f"{exc.retry_after:g}"}
    return ApiError(exc.code, exc.reason, exc.message, dict(details), headers)


class HttpClient:
    """`Client` over HTTPS through an entered `RestClient` (the caller owns its lifetime)."""

    def __init__(self, rest: RestClient, *, field_manager: str = DEFAULT_FIELD_MANAGER) -> None:
        self.rest = rest
        self.field_manager = field_manager

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str | None = None,
    ) -> Any:
        try:
            return await self.rest.request(
                method, path, params=params, body=body, content_type=content_type
            )
        except (ApiException, ApiConnectionError) as exc:
            raise _api_error(exc) from exc

    @staticmethod
    def _path(res: ResourceInfo, namespace: str, name: str | None = None, sub: str = "") -> str:
        return res.path(namespace or None, name, sub or None)

    def _write_params(self, **extra: Any) -> dict[str, Any]:
        return {"fieldManager": self.field_manager, "fieldValidation": "Strict", **extra}

    async def get(self, res: ResourceInfo, name: str, namespace: str = "") -> Obj:
        result: Obj = await self._request("GET", self._path(res, namespace, name))
        return result

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
        params = {
            "labelSelector": label_selector or None,
            "fieldSelector": field_selector or None,
            "limit": limit or None,
            "continue": continue_token or None,
            "resourceVersion": resource_version or None,
        }
        result: Obj = await self._request("GET", self._path(res, namespace), params=params)
        return result

    async def create(
        self,
        res: ResourceInfo,
        body: Obj,
        namespace: str = "",
        *,
        read_only: bool = False,  # every reply is decoded for this caller alone anyway
    ) -> Obj:
        ns = namespace or str(metadata_of(body).get("namespace") or "")
        result: Obj = await self._request(
            "POST", self._path(res, ns), params=self._write_params(), body=body
        )
        return result

    async def update(self, res: ResourceInfo, body: Obj, *, subresource: str = "") -> Obj:
        meta = metadata_of(body)
        path = self._path(
            res, str(meta.get("namespace") or ""), str(meta.get("name") or ""), subresource
        )
        result: Obj = await self._request("PUT", path, params=self._write_params(), body=body)
        return result

    async def patch(
        self,
        res: ResourceInfo,
        name: str,
        body: Any,
        namespace: str = "",
        *,
        content_type: str = MERGE_PATCH,
        subresource: str = "",
        read_only: bool = False,  # as in `create`
    ) -> Obj:
        result: Obj = await self._request(
            "PATCH",
            self._path(res, namespace, name, subresource),
            params=self._write_params(),
            body=body,
            content_type=content_type,
        )
        return result

    async def apply(
        self, res: ResourceInfo, body: Obj, *, force: bool = False, subresource: str = ""
    ) -> Obj:
        meta = metadata_of(body)
        path = self._path(
            res, str(meta.get("namespace") or ""), str(meta.get("name") or ""), subresource
        )
        params = self._write_params(force=True if force else None)
        result: Obj = await self._request(
            "PATCH", path, params=params, body=body, content_type=APPLY_PATCH
        )
        return result

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
        result: Obj = await self._request("DELETE", self._path(res, namespace, name), body=opts)
        return result

    async def bind(self, pod: Obj, node: str) -> None:
        meta = metadata_of(pod)
        path = self._path(
            PODS, str(meta.get("namespace") or ""), str(meta.get("name") or ""), "binding"
        )
        await self._request("POST", path, body=binding(pod, node))

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
        read_only: bool = False,  # every event is decoded for this watch alone anyway
    ) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        try:
            async with (
                self.rest.watch(
                    res,
                    namespace or None,
                    all_namespaces=not namespace,
                    resource_version=resource_version or None,
                    label_selector=label_selector or None,
                    field_selector=field_selector or None,
                    timeout_seconds=max(1, round(timeout_seconds)) if timeout_seconds else None,
                    allow_bookmarks=allow_bookmarks,
                ) as raw,
                aclosing(_http_events(raw)) as events,
            ):
                yield events
        except (ApiException, ApiConnectionError) as exc:
            raise _api_error(exc) from exc


async def _http_events(raw: AsyncIterator[WatchEvent]) -> AsyncGenerator[WatchEvent, None]:
    it = raw.__aiter__()
    while True:
        try:
            ev = await it.__anext__()
        except StopAsyncIteration:
            return
        except (ApiException, ApiConnectionError) as exc:
            raise _api_error(exc) from exc
        yield ev
