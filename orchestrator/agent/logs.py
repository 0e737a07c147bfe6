"""The agent's authenticated log endpoint (HTTPS, client certificates required), serving the
container log files that `agent.logfiles` reads.

*Endpoint.* `LogEndpoint` serves `GET /containerLogs/{namespace}/{pod}/{container}?tailLines=
&follow=&previous=&timestamps=&sinceSeconds=&sinceTime=&limitBytes=` (and `/healthz`) over HTTPS
with `orchestrator.security.tls.serve`, on the node's own address (its InternalIP, never the
wildcard) and the port of `--kubelet-port`. The TLS context *requires* a client certificate
signed by the cluster CA (no certificate, or one of another CA: the handshake fails), and the app
admits exactly one identity, the API server's kubelet client (`AUTHORIZED_USER`, the certificate
`apiserver.logproxy.kubelet_client_cert` issues): a node's certificate, another node's, an admin's
(`system:masters` included) get 403 — even `/healthz` says nothing to them. Errors are
metav1.Status JSON bodies so the API server's `AgentLogProxy` relays them verbatim; success is
`200 text/plain`, streamed in chunks of whole lines.

How the agent uses it
---------------------
::

    tls = EndpointTLS.issue(pki, node_name, [node_name, node_ip], dir)  # the embedded agent:
    # its server holds the CA; or EndpointTLS(cert_path, key_path, ca_pem) with files it was
    # given (a joined agent: its own key, certificate signed by the server, `servingcert`).
    # Either way the certificate is `system:node:<name>`'s: the API server's proxy checks it.
    endpoint = LogEndpoint(data_dir, resolve_pod, tls=tls, host=node_ip, port=10250)
    port = await nursery.start(endpoint.run)   # report it as status.daemonEndpoints.kubeletEndpoint
    certs.on_reload(leaf, endpoint.reload_tls)  # `security.renewal`: renewed certs, no restart

`resolve_pod(namespace, name)` returns the agent's current pod object (at least `metadata.uid`,
`spec.containers`/`initContainers`, and `status.containerStatuses` as the agent last computed them)
or None when the agent does not run that pod. It is called on the trio thread and must not block.
"""

from __future__ import annotations

import json
import logging
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote

import trio

from orchestrator.agent.logfiles import (
    POLL_INTERVAL,
    LogOptions,
    LogOptionsError,
    choose_attempt,
    container_status,
    list_attempts,
    log_dir,
    read_log,
)
from orchestrator.kube import errors
from orchestrator.kube.errors import ApiError
from orchestrator.kube.objects import Obj
from orchestrator.security.authn import User, user_from_certificate
from orchestrator.security.pki import Pki, issue_serving_cert, pair_lock, write_pair
from orchestrator.security.tls import ReloadableContext, client_cert_der, serve

__all__ = ["AUTHORIZED_USER", "DEFAULT_PORT", "EndpointTLS", "LogEndpoint"]

log = logging.getLogger(__name__)

PodResolver = Callable[[str, str], Obj | None]

# The API server's client identity for node agents (issued by `logproxy.kubelet_client_cert`,
# whose KUBELET_CLIENT_USER it equals): the only caller the endpoint serves. Admins read logs
# through the API, which authorizes them; nobody reads them from the node directly.
AUTHORIZED_USER = "kube-apiserver-kubelet-client"
DEFAULT_PORT = 10250

# --------------------------------------------------------------------------- TLS


@dataclass(frozen=True)
class EndpointTLS:
    """The endpoint's serving certificate/key files and the cluster CA that signs its callers."""

    cert_path: Path
    key_path: Path
    ca_pem: bytes

    @classmethod
    def issue(cls, pki: Pki, node_name: str, sans: list[str], directory: Path) -> EndpointTLS:
        """A fresh serving certificate for node `node_name` (blocking file I/O), written to
        `directory/kubelet.crt` and `kubelet.key`."""
        cert, key = issue_serving_cert(pki, f"system:node:{node_name}", [node_name, *sans])
        cert_path, key_path = Path(directory) / "kubelet.crt", Path(directory) / "kubelet.key"
        write_pair(cert_path, key_path, cert, key)
        return cls(cert_path, key_path, pki.ca_pem)

    def ssl_context(self) -> ssl.SSLContext:
        """TLS >= 1.2, client certificates *required* and verified against the cluster CA."""
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.options |= ssl.OP_NO_COMPRESSION
        with pair_lock(self.cert_path):
            ctx.load_cert_chain(certfile=str(self.cert_path), keyfile=str(self.key_path))
        ctx.load_verify_locations(cadata=self.ca_pem.decode("ascii"))
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.set_alpn_protocols(["http/1.1"])
        return ctx


# --------------------------------------------------------------------------- endpoint

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class LogEndpoint:
    """The agent's HTTPS log endpoint (see the module docstring). `run` reports the bound port.

    `host` is the node's address (an IP literal): there is deliberately no wildcard default.
    """

    def __init__(
        self,
        data_dir: Path,
        pod_resolver: PodResolver,
        *,
        tls: EndpointTLS,
        host: str,
        port: int = DEFAULT_PORT,
        poll_interval: float = POLL_INTERVAL,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.pod_resolver = pod_resolver
        self.tls = tls
        self.host = host
        self.port = port
        self.poll_interval = poll_interval
        self.clock = clock
        self._ca_cert: Any = None
        self._streams = 0  # responses being streamed now
        self._context: ReloadableContext | None = None

    def statistics(self) -> dict[str, int]:
        return {"open_streams": self._streams}

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        from cryptography import x509

        self._ca_cert = x509.load_pem_x509_certificate(self.tls.ca_pem)
        self._context = context = await trio.to_thread.run_sync(
            ReloadableContext, self.tls.ssl_context
        )
        await serve(
            self, host=self.host, port=self.port, ssl_context=context, task_status=task_status
        )

    async def reload_tls(self) -> None:
        """Serve new connections with the certificate now in `tls`'s files (renewal)."""
        if self._context is not None:
            await self._context.reload()

    # ASGI
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        try:
            stream = await self._handle(scope)
        except ApiError as exc:
            await _send_whole(send, exc.code, json.dumps(exc.status()).encode(), "application/json")
            return
        except Exception as exc:  # keep serving; say what broke
            log.exception("log endpoint: %s %s", scope.get("method"), scope.get("path"))
            err = errors.internal(f"internal error: {exc!r}")
            await _send_whole(send, 500, json.dumps(err.status()).encode(), "application/json")
            return
        if isinstance(stream, bytes):
            await _send_whole(send, 200, stream, "text/plain")
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/plain"),
                    (b"cache-control", b"no-cache, private"),
                ],
            }
        )
        self._streams += 1
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_cancel_on_disconnect, receive, nursery.cancel_scope)
                async for chunk in stream:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                nursery.cancel_scope.cancel()
        finally:
            self._streams -= 1
            with trio.CancelScope(shield=True):
                await stream.aclose()  # type: ignore[attr-defined]  # an async generator
        with trio.move_on_after(5):
            try:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            except Exception:  # the client is gone: nobody to tell
                log.debug("log endpoint: client gone before the end of the stream")

    def _authorize(self, scope: Scope) -> User:
        der = client_cert_der(scope)
        user = user_from_certificate(der, self._ca_cert) if der and self._ca_cert else None
        if user is None:
            raise errors.unauthorized()
        if user.name != AUTHORIZED_USER:
            raise ApiError(
                403,
                "Forbidden",
                f"Forbidden (user={user.name}, verb=get, resource=nodes, subresource(s)=[log])",
            )
        return user

    async def _handle(self, scope: Scope) -> AsyncIterator[bytes] | bytes:
        path = str(scope.get("path", "/"))
        self._authorize(scope)
        if path in ("/healthz", "/livez", "/readyz"):
            return b"ok"
        parts = path.strip("/").split("/")
        if scope.get("method", "GET") != "GET" or len(parts) != 4 or parts[0] != "containerLogs":
            raise errors.route_not_found()
        namespace, name, container = (unquote(p) for p in parts[1:])
        qs = scope.get("query_string", b"")
        params = {
            k: v[-1]
            for k, v in parse_qs(
                qs.decode("latin-1") if isinstance(qs, bytes) else str(qs), keep_blank_values=True
            ).items()
        }
        try:
            options = LogOptions.from_query(params, int(self.clock() * 1e9))
        except LogOptionsError as exc:
            raise errors.bad_request(str(exc)) from None
        pod = self.pod_resolver(namespace, name)
        if pod is None:
            raise ApiError(404, "NotFound", f'pod "{namespace}/{name}" does not exist')
        spec = pod.get("spec") or {}
        names = {
            c.get("name")
            for key in ("containers", "initContainers", "ephemeralContainers")
            for c in spec.get(key) or []
            if isinstance(c, dict)
        }
        if container not in names:
            raise ApiError(
                404, "NotFound", f'container "{container}" not found in pod "{namespace}/{name}"'
            )
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        cdir = log_dir(self.data_dir, namespace, name, uid) / container
        attempts = await trio.to_thread.run_sync(list_attempts, cdir)
        attempt = choose_attempt(pod, container, attempts, options.previous)
        current = not attempts or attempt == attempts[-1]
        follow = options.follow and current and not options.previous

        async def still_current() -> bool:
            now = self.pod_resolver(namespace, name)
            if now is None or str((now.get("metadata") or {}).get("uid", "")) != uid:
                return False
            cs = container_status(now, container)
            if cs is not None and "running" not in (cs.get("state") or {}):
                return False
            newest = await trio.to_thread.run_sync(list_attempts, cdir)
            return not newest or newest[-1] <= attempt

        return read_log(
            cdir / f"{attempt}.log",
            options,
            still_current=still_current if follow else None,
            poll_interval=self.poll_interval,
        )


async def _send_whole(send: Send, status: int, body: bytes, content_type: str) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type.encode()),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _cancel_on_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return
