"""An async Kubernetes REST client on httpx: CRUD, patch, watch and streams, with Status errors.

Theory of operation. `RestClient(config)` is used as `async with RestClient(cfg) as c:`; the
`httpx.AsyncClient` (one connection pool, TLS with the cluster CA, bearer token or client
certificate) lives exactly as long as that block. Every call is one HTTP request:

* a 2xx answer is decoded (JSON when the Content-Type says so, else text) and returned;
* any other answer raises `ApiException(code, reason, message, status_body)`, parsed from the
  metav1.Status body when there is one (else built from the HTTP status line), with the
  `Retry-After` of a 429 or 503 as `retry_after` (never retried here: callers back off);
* a transport failure (refused, TLS, reset) raises `ApiConnectionError`, naming the server.

Streams (watches, `pods/log?follow=true`) are async context managers, so the response is closed
when the caller's block ends, by cancellation too: `async with c.watch(PODS, "default") as
events: async for etype, obj in events: ...`. Watch lines are split by the sans-IO
`WatchDecoder`; an in-stream `ERROR` event raises `ApiException` (e.g. 410 Expired), a clean end
of the stream ends the iteration (callers re-watch from the last resourceVersion).

Leaving a stream early is fine (the response is closed on exit), but httpx's stream iterators
are async generators (encode/httpx#3686), so trio may warn `ResourceWarning` about them at GC.

Several servers (`endpoints=EndpointSet`, the standalone agent): each request goes to
`endpoints.pick(now)` (sticky: the same server while it works). A transport failure or a 503
(the server's store has no quorum) marks that server failed (`EndpointSet.failed`), and every
open stream to it is ended at once with `ApiConnectionError`, so watches are re-established
on another server even when the failed one went silent rather than closing its connections.
A request that never reached a server (connection refused, connect timeout, TLS handshake) is
sent to the next one at once; anything else is raised for the caller to retry, which then
goes to the next server. All servers share the cluster CA, so verification stays strict.

Invariants: no printing, and no retries except the one above (a request not sent is safe to
send elsewhere); callers own policy and timeouts (`trio.fail_after` around calls); `Warning`
headers go to the `on_warning` callback.
"""

from __future__ import annotations

import json
import os
import ssl
import tempfile
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from contextlib import aclosing, asynccontextmanager
from typing import Any, Self

import httpx
import trio

from orchestrator.client.config import ClientConfig
from orchestrator.client.endpoints import EndpointSet
from orchestrator.client.protocol import (
    JSON,
    MERGE_PATCH,
    ApiConnectionError,
    ApiException,
    WatchDecoder,
    WatchEvent,
)
from orchestrator.client.resource import ResourceInfo

__all__ = ["RestClient"]  # the transport-free values live in `protocol`


Params = Mapping[str, str | int | bool | None]
FAILOVER_CODES = frozenset({503})  # answers that say "this server cannot serve now"
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout)  # the request never reached a server
# Idle connections are kept this long (httpx's default is 5 s): an agent renews its Lease every
# 10 s, and a new connection per renewal is a TLS handshake on both sides. Below the server's
# `KEEP_ALIVE_TIMEOUT`, so the client never reuses a connection the server is closing.
KEEPALIVE_EXPIRY = 60.0


def _ssl_context(cfg: ClientConfig) -> ssl.SSLContext:
    if cfg.insecure:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif cfg.ca_pem:
        ctx = ssl.create_default_context(cadata=cfg.ca_pem.decode("ascii", "replace"))
    else:
        ctx = ssl.create_default_context()
    if cfg.cert_pem and cfg.key_pem:
        # ssl can only load a client key from a file: write both to a private temp dir, briefly.
        with tempfile.TemporaryDirectory(prefix="orch-client-") as d:
            cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
            for path, data in ((cert, cfg.cert_pem), (key, cfg.key_pem)):
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
            ctx.load_cert_chain(cert, key)
    return ctx


def _clean(params: Params | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in (params or {}).items():
        if v is None:
            continue
        out[k] = ("true" if v else "false") if isinstance(v, bool) else str(v)
    return out


class RestClient:
    """Async REST client for an API server; use as `async with RestClient(cfg) as client`.

    `transport` replaces the network (tests pass `httpx.MockTransport`); `timeout` bounds each
    non-streaming request (connect/read/write), streams have no read timeout; `connect_timeout`
    (default `timeout`) bounds connecting. `endpoints`: several servers to fail over between
    (module doc); without it every request goes to `config.server`.
    """

    def __init__(
        self,
        config: ClientConfig,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout: float = 30.0,
        connect_timeout: float | None = None,
        user_agent: str = "orchestrator-client/0.1",
        on_warning: Callable[[str], None] | None = None,
        endpoints: EndpointSet | None = None,
    ) -> None:
        self.config = config
        self.endpoints = endpoints
        self._transport = transport
        self._timeout = timeout
        self._connect_timeout = timeout if connect_timeout is None else connect_timeout
        self._user_agent = user_agent
        self._on_warning = on_warning
        self._http: httpx.AsyncClient | None = None
        self._streams: dict[str, set[trio.CancelScope]] = {}  # open streams per endpoint

    async def __aenter__(self) -> Self:
        headers = {"User-Agent": self._user_agent}
        if self.config.token:
            headers["Authorization"] = f"Bearer {self.config.token}"
        verify: ssl.SSLContext | bool = True
        if self._transport is None and self.config.server.startswith("https:"):
            verify = _ssl_context(self.config)
        self._http = httpx.AsyncClient(
            base_url=self.config.server,
            headers=headers,
            verify=verify,
            transport=self._transport,
            timeout=httpx.Timeout(self._timeout, connect=self._connect_timeout),
            limits=httpx.Limits(  # httpx's default limits, but the idle expiry
                max_connections=100, max_keepalive_connections=20, keepalive_expiry=KEEPALIVE_EXPIRY
            ),
        )
        await self._http.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        http, self._http = self._http, None
        if http is not None:
            await http.__aexit__(*exc)  # type: ignore[arg-type]  # forwards the exc triple as is

    # ---- raw requests -------------------------------------------------------------------------

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            raise RuntimeError("RestClient used outside `async with`")
        return self._http

    def _build(
        self,
        method: str,
        path: str,
        params: Params | None,
        body: Any,
        content_type: str | None,
        accept: str,
        stream: bool,
        base: str | None = None,
    ) -> httpx.Request:
        headers = {"Accept": accept}
        content: bytes | None = None
        if body is not None:
            if isinstance(body, bytes):
                content = body
            elif isinstance(body, str):
                content = body.encode()
            else:
                content = json.dumps(body, separators=(",", ":")).encode()
            headers["Content-Type"] = content_type or JSON
        extensions: dict[str, Any] = {}
        if self.config.tls_server_name:
            extensions["sni_hostname"] = self.config.tls_server_name
        timeout = (
            httpx.Timeout(self._timeout, connect=self._connect_timeout, read=None)
            if stream
            else httpx.USE_CLIENT_DEFAULT
        )
        return self._client().build_request(
            method,
            path if base is None else base + path,  # an absolute URL overrides base_url
            params=_clean(params),
            content=content,
            headers=headers,
            extensions=extensions,
            timeout=timeout,
        )

    def _warn(self, response: httpx.Response) -> None:
        if self._on_warning is None:
            return
        for value in response.headers.get_list("warning"):
            # `299 - "text"`: kubectl shows only the text.
            code, _, rest = value.partition(" ")
            _agent, _, text = rest.partition(" ")
            text = text.strip()
            if text.startswith('"') and text.endswith('"') and len(text) >= 2:
                text = text[1:-1].replace('\\"', '"')
            self._on_warning(text if code.isdigit() and text else value)

    async def send(
        self,
        method: str,
        path: str,
        *,
        params: Params | None = None,
        body: Any = None,
        content_type: str | None = None,
        accept: str = JSON,
    ) -> httpx.Response:
        """One request; the whole response is read. Non-2xx raises `ApiException`."""
        tried: set[str] = set()
        while True:
            base = self._pick()
            req = self._build(method, path, params, body, content_type, accept, False, base)
            try:
                resp = await self._client().send(req)
            except httpx.TransportError as exc:
                if self._retry_elsewhere(base, exc, tried):
                    continue
                raise self._connection_error(exc, base) from exc
            self._warn(resp)
            self._answered(base, resp.status_code)
            if not resp.is_success:
                raise ApiException.from_response(
                    resp.status_code,
                    resp.content,
                    resp.reason_phrase,
                    resp.headers.get("retry-after"),
                )
            return resp

    # ---- several servers ----------------------------------------------------------------------

    def _pick(self) -> str | None:
        """The endpoint for the next request (None: `config.server`, the client's base URL)."""
        return None if self.endpoints is None else self.endpoints.pick(trio.current_time())

    def _failed(self, base: str, keep: trio.CancelScope | None = None) -> None:
        """`base` cannot serve: avoid it, and end the streams open to it (but `keep`)."""
        assert self.endpoints is not None
        self.endpoints.failed(base, trio.current_time())
        for scope in self._streams.get(base, set()) - {keep}:
            scope.cancel()

    def _retry_elsewhere(
        self, base: str | None, exc: httpx.TransportError, tried: set[str]
    ) -> bool:
        """After a transport failure on `base`: True if the request should be sent again to
        another endpoint (it never reached `base`, and there is one not tried yet)."""
        if base is None:
            return False
        self._failed(base)
        tried.add(base)
        return isinstance(exc, _NOT_SENT) and self._pick() not in tried

    def _answered(self, base: str | None, code: int) -> None:
        if base is None:
            return
        if code in FAILOVER_CODES:
            self._failed(base)
        else:
            assert self.endpoints is not None
            self.endpoints.succeeded(base)

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Params | None = None,
        body: Any = None,
        content_type: str | None = None,
        accept: str = JSON,
    ) -> Any:
        """One request; returns the decoded JSON body (or the text for non-JSON answers)."""
        resp = await self.send(
            method, path, params=params, body=body, content_type=content_type, accept=accept
        )
        return _decode(resp)

    @asynccontextmanager
    async def stream(
        self,
        method: str,
        path: str,
        *,
        params: Params | None = None,
        body: Any = None,
        content_type: str | None = None,
        accept: str = JSON,
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        """A streaming request; yields an iterator of body chunks (no read timeout).

        Errors before the body starts (non-2xx) raise `ApiException` on entry. With several
        endpoints, the stream ends with `ApiConnectionError` as soon as its server is marked
        failed (by this or any other request).
        """
        tried: set[str] = set()
        while True:
            base = self._pick()
            req = self._build(method, path, params, body, content_type, accept, True, base)
            try:
                resp = await self._client().send(req, stream=True)
                break
            except httpx.TransportError as exc:
                if self._retry_elsewhere(base, exc, tried):
                    continue
                raise self._connection_error(exc, base) from exc
        try:
            self._warn(resp)
            self._answered(base, resp.status_code)
            if not resp.is_success:
                data = await resp.aread()
                raise ApiException.from_response(
                    resp.status_code, data, resp.reason_phrase, resp.headers.get("retry-after")
                )
            scope = trio.CancelScope()
            async with aclosing(self._chunks(resp, base, scope)) as chunks:
                if base is None:
                    yield chunks
                    return
                streams = self._streams.setdefault(base, set())
                with scope:
                    streams.add(scope)
                    try:
                        yield chunks
                    finally:
                        streams.discard(scope)
                if scope.cancelled_caught:
                    raise ApiConnectionError(
                        f"the API server at {base} failed; its streams are closed"
                    )
        finally:
            await resp.aclose()

    async def _chunks(
        self, resp: httpx.Response, base: str | None, scope: trio.CancelScope
    ) -> AsyncGenerator[bytes, None]:
        try:
            # httpx types aiter_bytes() as an AsyncIterator; it is an async generator (aclose).
            async with aclosing(resp.aiter_bytes()) as raw:  # type: ignore[type-var]
                async for chunk in raw:
                    yield chunk
        except httpx.TransportError as exc:
            if base is not None:
                self._failed(base, keep=scope)
            raise self._connection_error(exc, base) from exc

    def _connection_error(
        self, exc: httpx.TransportError, base: str | None = None
    ) -> ApiConnectionError:
        detail = str(exc) or type(exc).__name__
        where = base or self.config.server
        return ApiConnectionError(f"cannot reach the API server at {where}: {detail}")

    # ---- resource verbs -----------------------------------------------------------------------

    def _ns(self, res: ResourceInfo, namespace: str | None) -> str | None:
        return (namespace or self.config.namespace) if res.namespaced else None

    async def get(
        self,
        res: ResourceInfo,
        name: str,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        params: Params | None = None,
        accept: str = JSON,
    ) -> Any:
        """GET one object (namespace defaults to the config's)."""
        path = res.path(self._ns(res, namespace), name, subresource)
        return await self.request("GET", path, params=params, accept=accept)

    async def list(
        self,
        res: ResourceInfo,
        namespace: str | None = None,
        *,
        all_namespaces: bool = False,
        label_selector: str | None = None,
        field_selector: str | None = None,
        params: Params | None = None,
        accept: str = JSON,
    ) -> Any:
        """LIST a collection (a `...List`, or a Table with `accept=TABLE_ACCEPT`)."""
        ns = None if all_namespaces else self._ns(res, namespace)
        q: dict[str, Any] = dict(params or {})
        q.setdefault("labelSelector", label_selector)
        q.setdefault("fieldSelector", field_selector)
        return await self.request("GET", res.path(ns), params=q, accept=accept)

    async def create(
        self,
        res: ResourceInfo,
        body: dict[str, Any],
        namespace: str | None = None,
        *,
        params: Params | None = None,
    ) -> Any:
        """POST a new object; the namespace defaults to the body's, then the config's."""
        ns = namespace or (body.get("metadata") or {}).get("namespace")
        return await self.request("POST", res.path(self._ns(res, ns)), params=params, body=body)

    async def replace(
        self,
        res: ResourceInfo,
        name: str,
        body: dict[str, Any],
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        params: Params | None = None,
    ) -> Any:
        """PUT the whole object (conditional on `metadata.resourceVersion` when it is set)."""
        path = res.path(self._ns(res, namespace), name, subresource)
        return await self.request("PUT", path, params=params, body=body)

    async def patch(
        self,
        res: ResourceInfo,
        name: str,
        body: Any,
        namespace: str | None = None,
        *,
        content_type: str = MERGE_PATCH,
        subresource: str | None = None,
        params: Params | None = None,
    ) -> Any:
        """PATCH with one of the four patch types (`MERGE_PATCH`, `STRATEGIC_MERGE_PATCH`,
        `JSON_PATCH`, `APPLY_PATCH` with a `fieldManager` param)."""
        path = res.path(self._ns(res, namespace), name, subresource)
        return await self.request(
            "PATCH", path, params=params, body=body, content_type=content_type
        )

    async def delete(
        self,
        res: ResourceInfo,
        name: str,
        namespace: str | None = None,
        *,
        propagation_policy: str | None = "Background",
        params: Params | None = None,
    ) -> Any:
        """DELETE one object; returns the deleted object or a Status."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if propagation_policy:
            body["propagationPolicy"] = propagation_policy
        path = res.path(self._ns(res, namespace), name)
        return await self.request("DELETE", path, params=params, body=body)

    @asynccontextmanager
    async def watch(
        self,
        res: ResourceInfo,
        namespace: str | None = None,
        *,
        all_namespaces: bool = False,
        resource_version: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int | None = None,
        allow_bookmarks: bool = False,
        params: Params | None = None,
        accept: str = JSON,
    ) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        """WATCH a collection: yields an async iterator of `(type, object)`.

        `resource_version` None or "0" starts with synthetic ADDED events for what exists.
        """
        ns = None if all_namespaces else self._ns(res, namespace)
        q: dict[str, Any] = dict(params or {})
        q.update(watch=True, resourceVersion=resource_version, labelSelector=label_selector)
        q.update(fieldSelector=field_selector, timeoutSeconds=timeout_seconds)
        if allow_bookmarks:
            q["allowWatchBookmarks"] = True
        async with (
            self.stream("GET", res.path(ns), params=q, accept=accept) as chunks,
            aclosing(_events(chunks)) as events,
        ):
            yield events


async def _events(chunks: AsyncIterator[bytes]) -> AsyncGenerator[WatchEvent, None]:
    dec = WatchDecoder()
    async for chunk in chunks:
        for ev in dec.receive_data(chunk):
            yield ev
    for ev in dec.close():
        yield ev


def _decode(resp: httpx.Response) -> Any:
    ctype = resp.headers.get("content-type", "")
    if not resp.content:
        return None
    if "json" in ctype or (not ctype and resp.content[:1] in (b"{", b"[")):
        try:
            return resp.json()
        except ValueError as exc:
            raise ApiException(
                resp.status_code, "InternalError", f"the server sent invalid JSON: {exc}"
            ) from exc
    return resp.text
