"""Serving an ASGI app over HTTPS (or plain HTTP) with hypercorn's trio machinery, such that the
app sees the client certificate.

Why not `hypercorn.trio.serve`: hypercorn 0.18 does not put the peer certificate in the ASGI
scope, and its `worker_serve` hard-codes its `TCPServer`. So `serve` builds the listeners itself
(as `worker_serve` does) and hands each accepted stream to a small handler that

1. completes the TLS handshake (bounded by `config.ssl_handshake_timeout`; a failed or slow
   handshake just drops the connection),
2. reads `getpeercert(binary_form=True)` (None when the client sent no certificate; the SSL
   context's `CERT_OPTIONAL` + cluster CA means any certificate that *is* sent was verified by
   the handshake),
3. runs hypercorn's own `TCPServer` with the app wrapped so that every http/websocket scope gets
   `scope["extensions"]["tls"] = {"client_cert_der": <bytes | None>}` (TLS connections only;
   plain HTTP scopes have no "tls" extension). `TCPServer.run` calls `do_handshake` again,
   which is a no-op on a completed handshake.

Hypercorn internals relied on (pin `hypercorn>=0.17,<0.19`, checked against 0.18.0):
`hypercorn.trio.tcp_server.TCPServer(app_wrapper, config, context, state, stream)`,
`hypercorn.trio.worker_context.WorkerContext(max_requests)` (and its `terminated` event, which
HTTP/1.1 connections check before they are kept alive), `hypercorn.app_wrappers.ASGIWrapper`, and
`hypercorn.protocol.h11.H11Protocol._send_h11_event`, wrapped (once, at import) to add the
reason phrase hypercorn leaves out: Go's net/http sends `HTTP/1.1 404 Not Found`, and the Python
client shows that phrase as `ApiException.reason`; and `H11Protocol._send_error_response`
(hypercorn's answer to a request h11 cannot read: malformed, or a head over
`h11_max_incomplete_size`), replaced so that its body is a metav1.Status, not empty.

Certificates renewed while serving: `ssl_context` may be a `ReloadableContext`; each accepted
connection then gets its *current* context, and `reload()` builds a new one from the files (in a
worker thread) and swaps the reference. Connections already open keep the context they were
accepted with (and their TLS session); a build that fails leaves the old context in place. That
is how `renewal.CertRenewer` hot-swaps a renewed or rotated certificate without a restart.

Structured concurrency: `serve` runs until cancelled; it starts its per-connection tasks in its
own nursery, so cancelling the caller's scope closes the listeners and every connection. The
ASGI lifespan protocol is not run: long-lived components start in the caller's nursery.
`task_status.started(port)` reports the bound port (useful with `port=0`).

Graceful stop, as hypercorn's `worker_serve`: once `shutdown_trigger()` returns, the listeners
close (new connections are refused), the worker context's `terminated` is set (an idle
keep-alive connection closes at once, a busy one after its current response) and the
connections get `config.graceful_timeout` seconds to finish before they are cancelled; then
`serve` returns. Streams that never end by themselves (watches) are the app's to end. A
connection's `TCPServer` also ends as soon as it has closed its stream (`_EndOnClose`): in 0.18
a reader that read the client's next request before the current response cycle ended waits
(h11 PAUSED) for a new cycle that a closing connection never starts, so it would hold the stop
until the timeout (and, outside a stop, leak the connection's task).

Logging: hypercorn's error log goes through the process's handlers (`orchestrator.logsetup`),
not through the stderr handler of its own hypercorn adds by default; no access log is kept.
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import Awaitable, Callable, MutableMapping
from functools import partial
from http import HTTPStatus
from typing import Any, cast

import h11
import trio
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.config import Config
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState

from orchestrator.security.pki import Pki, pair_lock

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


_send_h11_event = H11Protocol._send_h11_event


async def _send_with_reason(self: H11Protocol, event: Any) -> None:
    if isinstance(event, h11.Response) and not event.reason:
        try:
            phrase = HTTPStatus(event.status_code).phrase.encode()
        except ValueError:  # a code without a standard phrase keeps none
            phrase = b""
        event = h11.Response(
            status_code=event.status_code,
            headers=list(event.headers),
            http_version=event.http_version,
            reason=phrase,
        )
    await _send_h11_event(self, event)


H11Protocol._send_h11_event = _send_with_reason  # type: ignore[method-assign]  # see module doc

# The request head (request line and headers) hypercorn buffers before it gives up with a 431;
# as Go's net/http (MaxHeaderBytes), 1 MiB. Set as `h11_max_incomplete_size` by servers whose
# app refuses over-long URLs and headers itself, below this (`apiserver.app.MAX_URL`/`MAX_HEADERS`).
MAX_REQUEST_HEAD = 1024 * 1024

_ERROR_REASONS = {
    400: ("BadRequest", "the request could not be parsed as HTTP/1.1"),
    414: ("RequestURITooLong", "the request URL is too long"),
    431: ("RequestHeaderFieldsTooLarge", "the request line and headers are too large"),
}


async def _send_status_error(self: H11Protocol, status_code: int) -> None:
    """hypercorn's answer to a request h11 could not read (malformed, head over the limit):
    a metav1.Status JSON body instead of an empty one, so every answer a client gets from an
    API listener is a Status."""
    reason, message = _ERROR_REASONS.get(status_code, ("BadRequest", "bad request"))
    body = json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": status_code,
        },
        separators=(",", ":"),
    ).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        *self.config.response_headers("h11"),
    ]
    await self._send_h11_event(h11.Response(status_code=status_code, headers=headers))
    await self._send_h11_event(h11.Data(data=body))
    await self._send_h11_event(h11.EndOfMessage())


H11Protocol._send_error_response = _send_status_error  # type: ignore[method-assign]  # see above


def server_ssl_context(pki: Pki, *, http2: bool = False) -> ssl.SSLContext:
    """TLS >= 1.2 with the serving certificate; client certificates optional, verified
    against the cluster CA. ALPN offers http/1.1 (and h2 first when `http2`)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= ssl.OP_NO_COMPRESSION
    with pair_lock(pki.serving_cert_path):
        ctx.load_cert_chain(certfile=str(pki.serving_cert_path), keyfile=str(pki.serving_key_path))
    ctx.load_verify_locations(cadata=pki.ca_pem.decode("ascii"))
    ctx.verify_mode = ssl.CERT_OPTIONAL
    ctx.set_alpn_protocols(["h2", "http/1.1"] if http2 else ["http/1.1"])
    return ctx


class ReloadableContext:
    """A server SSL context that can be rebuilt while serving (module doc). `build` makes a
    complete context from the files (blocking I/O); the constructor calls it once."""

    def __init__(self, build: Callable[[], ssl.SSLContext]) -> None:
        self._build = build
        self.current = build()
        self.reloads = 0

    async def reload(self) -> None:
        """Build a new context in a worker thread and give it to new connections; raises (and
        keeps the old one) when the build fails, e.g. ssl.SSLError for a mismatched pair."""
        self.current = await trio.to_thread.run_sync(self._build)
        self.reloads += 1


class _ReloadingSSLListener(trio.abc.Listener[trio.SSLStream[trio.SocketStream]]):
    """trio.SSLListener, but with the context current at each accept."""

    def __init__(self, transport: trio.SocketListener, context: ReloadableContext) -> None:
        self.transport = transport
        self.context = context

    async def accept(self) -> trio.SSLStream[trio.SocketStream]:
        stream = await self.transport.accept()
        return trio.SSLStream(stream, self.context.current, server_side=True, https_compatible=True)

    async def aclose(self) -> None:
        await self.transport.aclose()


class _EndOnClose:
    """A connection's stream as `TCPServer` sees it: closing it also cancels `scope`, the
    connection's, once the close is done (why: module doc). Everything else is the stream's."""

    def __init__(self, stream: trio.abc.Stream, scope: trio.CancelScope) -> None:
        self._stream = stream
        self._scope = scope

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            self._scope.cancel()


def client_cert_der(scope: Scope) -> bytes | None:
    """The verified client certificate (DER) of the connection a scope came from, if any."""
    tls = (scope.get("extensions") or {}).get("tls") or {}
    der = tls.get("client_cert_der")
    return der if isinstance(der, bytes) else None


def _with_tls(app: ASGIApp, der: bytes | None) -> ASGIApp:
    info = {"client_cert_der": der}

    async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") in ("http", "websocket"):
            ext = scope.get("extensions")
            if ext is None:
                ext = scope["extensions"] = {}
            ext["tls"] = info
        await app(scope, receive, send)

    return asgi


async def serve(
    app: ASGIApp,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    ssl_context: ssl.SSLContext | ReloadableContext | None = None,
    config: Config | None = None,
    shutdown_trigger: Callable[[], Awaitable[object]] | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `app` on host:port until cancelled, or until `shutdown_trigger()` returns and
    the connections have finished (module doc); `task_status.started(bound_port)`.

    `host` should be an address literal ("127.0.0.1", "::", "0.0.0.0"): with `port=0` only the
    first resolved address is bound, so there is one port to report.
    """
    config = config or Config()
    if config.errorlog == "-":  # hypercorn's default adds its own stderr handler beside ours
        config.errorlog = logging.getLogger("hypercorn.error")  # so: through the root's
    listeners: list[trio.SocketListener] = await trio.open_tcp_listeners(
        port, host=host, backlog=config.backlog
    )
    if port == 0:
        for extra in listeners[1:]:
            await extra.aclose()
        listeners = listeners[:1]
    bound = int(listeners[0].socket.getsockname()[1])
    context = WorkerContext(None)

    async def handle(stream: trio.SocketStream | trio.SSLStream[trio.SocketStream]) -> None:
        der: bytes | None = None
        if isinstance(stream, trio.SSLStream):
            try:
                with trio.fail_after(config.ssl_handshake_timeout):
                    await stream.do_handshake()
            except (trio.BrokenResourceError, trio.TooSlowError):
                await trio.aclose_forcefully(stream)
                return
            der = stream.getpeercert(binary_form=True)
        asgi = _with_tls(app, der) if isinstance(stream, trio.SSLStream) else app
        wrapped = ASGIWrapper(cast(Any, asgi))  # hypercorn's ASGIFramework is a narrower Protocol
        with trio.CancelScope() as connection:
            # TCPServer is annotated for SSL streams only but handles plain ones (AttributeError
            # path, which `_EndOnClose` keeps).
            ending = _EndOnClose(stream, connection)
            await TCPServer(wrapped, config, context, ConnectionState({}), cast(Any, ending))

    serving: list[trio.abc.Listener[Any]] = []
    for listener in listeners:
        if ssl_context is None:
            serving.append(listener)
        elif isinstance(ssl_context, ReloadableContext):
            serving.append(_ReloadingSSLListener(listener, ssl_context))
        else:
            serving.append(trio.SSLListener(listener, ssl_context, https_compatible=True))
    async with trio.open_nursery() as connections:
        async with trio.open_nursery() as accepting:
            await accepting.start(
                partial(trio.serve_listeners, handle, serving, handler_nursery=connections)
            )
            task_status.started(bound)
            await (shutdown_trigger or trio.sleep_forever)()
            accepting.cancel_scope.cancel()  # closes the listeners
        await context.terminated.set()
        connections.cancel_scope.deadline = trio.current_time() + config.graceful_timeout
