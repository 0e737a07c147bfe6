"""`AgentLogProxy`: the API server's `LogSource`, fetching container logs from the pod's node agent.

Theory of operation
-------------------
`ApiApp._logs` has already checked the pod, the container name and the caller's right to read
`pods/log`; it calls `open_logs(pod, container, query)`. The proxy then

1. answers from the pod's status alone when it says the container never ran (400
   `container "c" in pod "p" is waiting to start: <reason>`) or has no previous instance for
   `previous=true` (400 `previous terminated container "c" in pod "p" not found`), as the
   kubelet would;
2. reads the pod's Node (`spec.nodeName`) for the agent's address — its `InternalIP` (then
   `ExternalIP`, `Hostname`), where every agent listens, this server's embedded one included —
   and port, `status.daemonEndpoints.kubeletEndpoint.Port` (10250 if unset; 0: the agent serves
   no log endpoint, a 503 that says so);
3. sends `GET https://<addr>:<port>/containerLogs/<ns>/<pod>/<container>?<log params>` with
   httpx, presenting the API server's kubelet-client certificate (`kubelet_client_cert`, CN
   `kube-apiserver-kubelet-client`, no groups: it grants nothing on the API itself), trusting
   only the cluster CA for the agent's certificate, which must name the address dialled, and
   then checking that it is *this node's* (`system:node:<nodeName>`) before reading anything:
   another process on that port (another agent, another cluster's) gets no say;
4. relays the agent's answer: a non-200 Status becomes the same `ApiError` (code, reason,
   message); 200 becomes the response stream, passed through chunk by chunk (so `follow` is
   flushed per line as the agent sends it). A failure is a 503 that names its real cause, in
   Go's words where Go has them: `Get "https://10.0.0.5:10250/containerLogs/...": dial tcp
   10.0.0.5:10250: connect: connection refused`; a certificate that does not verify (tested
   before any other OSError: `ssl.SSLCertVerificationError` is one) says so — `the process on
   10.0.0.5:10250 is not the agent of node "n1": its certificate is signed by an unknown
   authority (x509: certificate signed by unknown authority)` —, and so does an agent that
   refuses the API server's certificate.

The stream object closes the HTTP response and client when the app closes it (`aclose`), also
when it was never iterated, so a client that disconnects never leaks a connection to the agent.

The kubelet-client certificate is a renewed leaf (`kubelet_client_leaf`, `security.renewal`):
`reload_client_cert` swaps in a context built from the new files; requests already under way
keep the one they started with.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote, urlencode

import trio
from cryptography import x509

from orchestrator.apiserver.request import Query
from orchestrator.kube import errors
from orchestrator.kube.errors import ApiError
from orchestrator.kube.objects import Obj
from orchestrator.security.pki import (
    RENEW_BEFORE,
    Pki,
    issue_client_cert,
    pair_lock,
    signed_by,
    write_pair,
)
from orchestrator.security.renewal import Leaf, in_thread

if TYPE_CHECKING:  # imported by the first proxied request: a server that serves no logs needs none
    import httpx

log = logging.getLogger(__name__)

GetNode = Callable[[str], Awaitable[Obj | None]]

KUBELET_CLIENT_USER = "kube-apiserver-kubelet-client"
DEFAULT_AGENT_PORT = 10250
LOG_PARAMS = (
    "follow",
    "previous",
    "timestamps",
    "sinceSeconds",
    "sinceTime",
    "tailLines",
    "limitBytes",
)
CONNECT_TIMEOUT = 5.0  # seconds to reach the agent and get its response headers


KUBELET_CLIENT_LEAF = "apiserver-kubelet-client"


def kubelet_client_paths(pki: Pki) -> tuple[Path, Path]:
    return pki.dir / f"{KUBELET_CLIENT_LEAF}.crt", pki.dir / f"{KUBELET_CLIENT_LEAF}.key"


def kubelet_client_cert(pki: Pki, *, force: bool = False) -> tuple[Path, Path]:
    """The API server's client certificate for node agents, in `pki/` (blocking file I/O).

    Re-issued when missing, signed by another CA or expiring within `RENEW_BEFORE`, and with
    `force` (renewal, `orchestrator certs rotate`).
    """
    cert_path, key_path = kubelet_client_paths(pki)
    if not force and cert_path.exists() and key_path.exists():
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        now = dt.datetime.now(dt.UTC)
        if signed_by(cert, pki.ca_cert) and cert.not_valid_after_utc - RENEW_BEFORE > now:
            return cert_path, key_path
    cert_pem, key_pem = issue_client_cert(pki, KUBELET_CLIENT_USER)
    write_pair(cert_path, key_path, cert_pem, key_pem)
    return cert_path, key_path


def kubelet_client_leaf(pki: Pki) -> Leaf:
    """The kubelet-client certificate as a leaf the renewal loop re-issues from the local CA."""
    cert_path, key_path = kubelet_client_paths(pki)
    issue = in_thread(lambda: kubelet_client_cert(pki, force=True))
    return Leaf(KUBELET_CLIENT_LEAF, cert_path, key_path, issue)


def client_ssl_context(ca_pem: bytes, cert_path: Path, key_path: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=ca_pem.decode("ascii"))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    with pair_lock(cert_path):
        ctx.load_cert_chain(certfile=str(cert_path), keyfile=str(key_path))
    return ctx


def _container_status(pod: Obj, container: str) -> Obj | None:
    status = pod.get("status") or {}
    for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
        for cs in status.get(key) or []:
            if isinstance(cs, dict) and cs.get("name") == container:
                return cs
    return None


def precheck(pod: Obj, container: str, previous: bool) -> None:
    """Raise the kubelet's 400 when the pod's status already shows there is nothing to read."""
    name = str((pod.get("metadata") or {}).get("name", ""))
    cs = _container_status(pod, container)
    if cs is None:
        if (pod.get("status") or {}).get("phase", "Pending") == "Pending":
            raise errors.bad_request(
                f'container "{container}" in pod "{name}" is waiting to start: ContainerCreating'
            )
        return
    state = cs.get("state") or {}
    last = (cs.get("lastState") or {}).get("terminated")
    if previous and not last:
        raise errors.bad_request(
            f'previous terminated container "{container}" in pod "{name}" not found'
        )
    waiting = state.get("waiting")
    if not previous and not last and isinstance(waiting, dict) and len(state) == 1:
        reason = str(waiting.get("reason") or "")
        text = {
            "ErrImagePull": "image can't be pulled",
            "ImagePullBackOff": "trying and failing to pull image",
        }.get(reason, reason)
        raise errors.bad_request(
            f'container "{container}" in pod "{name}" is waiting to start: {text}'
        )


def node_address(node: Obj) -> str | None:
    addresses = [
        a for a in (node.get("status") or {}).get("addresses") or [] if isinstance(a, dict)
    ]
    for kind in ("InternalIP", "ExternalIP", "Hostname"):
        for a in addresses:
            if a.get("type") == kind and a.get("address"):
                return str(a["address"])
    return None


def node_port(node: Obj) -> int | None:
    """The agent's log port as its Node advertises it; None when it serves none (Port 0)."""
    endpoint = ((node.get("status") or {}).get("daemonEndpoints") or {}).get("kubeletEndpoint")
    port = (endpoint or {}).get("Port")
    if port == 0 and not isinstance(port, bool):
        return None
    return port if isinstance(port, int) and 0 < port < 65536 else DEFAULT_AGENT_PORT


NODE_PREFIX = "system:node:"

# OpenSSL's verify codes -> what is wrong with the certificate, and Go's x509 words for it.
_VERIFY_TEXT = {
    9: ("is not valid yet", "x509: certificate has expired or is not yet valid"),
    10: ("has expired", "x509: certificate has expired or is not yet valid"),
    18: ("is self-signed", "x509: certificate signed by unknown authority"),
    19: ("is signed by an unknown authority", "x509: certificate signed by unknown authority"),
    20: ("is signed by an unknown authority", "x509: certificate signed by unknown authority"),
    21: ("is signed by an unknown authority", "x509: certificate signed by unknown authority"),
}
_HOSTNAME_MISMATCH = 62


def _verify_text(node: str, host: str, port: int, exc: ssl.SSLCertVerificationError) -> str:
    code = exc.verify_code
    if code == _HOSTNAME_MISMATCH:
        what, go = f"is not valid for {host}", f"x509: certificate is not valid for {host}"
    elif code in _VERIFY_TEXT:
        what, go = _VERIFY_TEXT[code]
    else:
        what = "does not verify"
        go = f"x509: {exc.verify_message or exc.reason or exc}"
    return (
        f'the process on {_host(host)}:{port} is not the agent of node "{node}": '
        f"its certificate {what} ({go})"
    )


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def _dial_text(node: str, host: str, port: int, exc: BaseException) -> str:
    """What went wrong reaching the agent, for people. Certificate errors first: they are
    OSErrors too (errno unset), and the dial text would hide the real cause."""
    inner: BaseException | None = exc
    while inner is not None:
        if isinstance(inner, ssl.SSLCertVerificationError):
            return _verify_text(node, host, port, inner)
        if isinstance(inner, ssl.SSLError):
            reason = str(inner.reason or inner).lower()
            if "alert" in reason or "certificate" in reason:
                return (
                    f'the agent of node "{node}" on {_host(host)}:{port} refused the API '
                    f"server's client certificate (remote error: tls: {reason.replace('_', ' ')})"
                )
            return f"tls: {inner.reason or inner}"
        if isinstance(inner, OSError) and inner.errno:
            return f"dial tcp {_host(host)}:{port}: connect: {os.strerror(inner.errno).lower()}"
        if isinstance(inner, BaseExceptionGroup) and inner.exceptions:
            inner = inner.exceptions[0]  # trio: one error per address tried
            continue
        inner = inner.__cause__ or inner.__context__
    text = str(exc) or type(exc).__name__
    if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
        return (
            f'the process on {_host(host)}:{port} is not the agent of node "{node}": '
            f"its certificate does not verify ({text})"
        )
    return f"dial tcp {_host(host)}:{port}: connect: {text.lower()}"


class _Stream:
    """The agent's 200 response as an async iterator of chunks; `aclose` releases everything."""

    def __init__(self, client: httpx.AsyncClient, response: httpx.Response) -> None:
        import httpx

        self._client = client
        self._response = response
        self._chunks = response.aiter_raw()
        self._ended = (httpx.TransportError, httpx.StreamError)

    def __aiter__(self) -> _Stream:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self._chunks.__anext__()
        except self._ended as exc:
            log.info("log stream from the agent ended: %s", exc)
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            # httpx types aiter_raw() as an AsyncIterator; it is an async generator (aclose).
            await self._chunks.aclose()  # type: ignore[attr-defined]
            await self._response.aclose()
            await self._client.aclose()


class AgentLogProxy:
    """`LogSource` for `ApiApp`: streams container logs from node agents (see the module doc)."""

    def __init__(
        self,
        get_node: GetNode,
        ssl_context: ssl.SSLContext,
        *,
        connect_timeout: float = CONNECT_TIMEOUT,
    ) -> None:
        self.get_node = get_node
        self.ssl_context = ssl_context
        self.connect_timeout = connect_timeout
        self.pki: Pki | None = None  # set by `for_pki`: where `reload_client_cert` reads

    @classmethod
    async def for_pki(cls, pki: Pki, get_node: GetNode) -> AgentLogProxy:
        """Issue (or reuse) the kubelet-client certificate under `pki` and build the proxy."""

        def build() -> ssl.SSLContext:
            cert, key = kubelet_client_cert(pki)
            return client_ssl_context(pki.ca_pem, cert, key)

        proxy = cls(get_node, await trio.to_thread.run_sync(build))
        proxy.pki = pki
        return proxy

    async def reload_client_cert(self) -> None:
        """Use the kubelet-client certificate now on disk for new requests (renewal)."""
        if self.pki is None:
            return
        ca_pem = self.pki.ca_pem
        cert_path, key_path = kubelet_client_paths(self.pki)
        self.ssl_context = await trio.to_thread.run_sync(
            client_ssl_context, ca_pem, cert_path, key_path
        )

    async def open_logs(self, pod: Obj, container: str, query: Query) -> AsyncIterator[bytes]:
        meta = pod.get("metadata") or {}
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        node_name = str((pod.get("spec") or {}).get("nodeName") or "")
        precheck(pod, container, query.flag("previous"))
        node = await self.get_node(node_name)
        if node is None:
            raise errors.not_found("nodes", "", node_name)
        address = node_address(node)
        if address is None:
            raise errors.service_unavailable(
                f'no preferred addresses found for node "{node_name}"; known addresses: []'
            )
        port = node_port(node)
        if port is None:
            raise errors.service_unavailable(
                f'the agent of node "{node_name}" serves no log endpoint (its Node advertises '
                "kubelet port 0: see the agent's log)"
            )
        params = {k: query.get(k) for k in LOG_PARAMS if query.get(k)}
        path = "/".join(quote(p, safe="") for p in ("containerLogs", namespace, name, container))
        url = f"https://{_host(address)}:{port}/{path}"
        if params:
            url += "?" + urlencode(params)
        import httpx  # see the top of the module

        timeout = httpx.Timeout(self.connect_timeout, read=None)
        client = httpx.AsyncClient(verify=self.ssl_context, timeout=timeout)
        try:
            with trio.fail_after(self.connect_timeout):
                response = await client.send(client.build_request("GET", url), stream=True)
        except (httpx.HTTPError, OSError, trio.TooSlowError) as exc:
            with trio.CancelScope(shield=True):
                await client.aclose()
            if isinstance(exc, trio.TooSlowError | httpx.TimeoutException):
                text = f"dial tcp {_host(address)}:{port}: i/o timeout"
            else:
                text = _dial_text(node_name, address, port, exc)
            raise errors.service_unavailable(f'Get "{url}": {text}') from None
        wrong = _not_the_node(response, node_name)
        if wrong:
            with trio.CancelScope(shield=True):
                await response.aclose()
                await client.aclose()
            text = f'the process on {_host(address)}:{port} is not the agent of node "{node_name}"'
            raise errors.service_unavailable(f'Get "{url}": {text}: {wrong}')
        if response.status_code == 200:
            return _Stream(client, response)
        try:
            with trio.move_on_after(self.connect_timeout):
                body = await response.aread()
        finally:
            with trio.CancelScope(shield=True):
                await response.aclose()
                await client.aclose()
        raise _agent_error(node_name, response.status_code, body)


def _not_the_node(response: httpx.Response, node: str) -> str:
    """Why the agent's certificate (already verified against the cluster CA) is not node
    `node`'s, or "" when it is."""
    stream = response.extensions.get("network_stream")
    ssl_object = stream.get_extra_info("ssl_object") if stream is not None else None
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    if der is None:
        return "it presented no certificate"
    cert = x509.load_der_x509_certificate(der)
    names = cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    subject = str(names[0].value) if names else ""
    if subject == NODE_PREFIX + node:
        return ""
    return f'its certificate is for "{subject}", not "{NODE_PREFIX}{node}"'


def _agent_error(node: str, code: int, body: bytes) -> ApiError:
    try:
        status = json.loads(body)
    except ValueError:
        status = None
    if isinstance(status, dict) and status.get("kind") == "Status":
        code = int(status.get("code") or code)
        reason = str(status.get("reason") or "")
        text = str(status.get("message") or "")
    else:
        reason = {400: "BadRequest", 404: "NotFound"}.get(code, "InternalError")
        text = body.decode("utf-8", "replace").strip() or f"the node agent answered {code}"
    if code in (401, 403):
        # The agent refused *the API server*: relaying 401 would tell the user to log in.
        return errors.internal(
            f'the node agent of node "{node}" rejected the API server\'s credentials: {text}'
        )
    return ApiError(code, reason, text)
