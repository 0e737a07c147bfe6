"""Container logs: reading CRI log files (pure) and the agent's authenticated log endpoint.

Theory of operation
-------------------
*Files.* The runtime writes each container's output to
`{data_dir}/pods/{namespace}_{name}_{uid}/{container}/{attempt}.log` (the sandbox's
`log_directory` plus the container's `log_path`), one CRI record per line:
`<RFC3339Nano> <stdout|stderr> <F|P> <text>`. A line longer than the runtime's limit is split
into `P` (partial) records closed by an `F` record; `parse_line` reads one record and
`LogFormatter` joins partial records back into one line per stream.

*Options* (`LogOptions.from_query`, the kubelet's `PodLogOptions`): `tailLines` = the last N
full lines (found by reading the file backwards, `tail_start`; a line split into P records counts
once), then `sinceTime`/`sinceSeconds` drop lines older than that instant, `timestamps` prefixes
each line with its (first record's) time in the fixed-width RFC3339Nano form, and `limitBytes`
cuts the output after that many bytes (mid-line, as the kubelet does). `previous` selects the
previous container instance's file, `follow` keeps the stream open for new lines.

*Which file* (`choose_attempt`): as the kubelet's `validateContainerLogStatus`, from the pod's
status as the agent knows it and the attempt files present: the current instance is the highest
attempt; `previous` needs `lastState.terminated` and means the attempt before a running (or
terminated) one, or the newest one when the container is waiting to restart. A container that
never ran answers 400 `container "c" in pod "p" is waiting to start: <reason>`; a missing
previous instance 400 `previous terminated container "c" in pod "p" not found`.

*Follow* (`read_log`): read to the end, then poll every `poll_interval` seconds (no inotify).
Following stops, after the rest of the file is sent, when the file is replaced or truncated
(rotation), when a newer attempt appears, when the container is no longer running, or when the
pod is gone or has another UID; it also stops when the client disconnects (the ASGI app cancels
the stream).

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

import calendar
import json
import logging
import os
import re
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import parse_qs, unquote

import trio

from orchestrator.kube import errors
from orchestrator.kube.errors import ApiError
from orchestrator.kube.objects import Obj
from orchestrator.security.authn import User, user_from_certificate
from orchestrator.security.pki import Pki, issue_serving_cert, pair_lock, write_pair
from orchestrator.security.tls import ReloadableContext, client_cert_der, serve

__all__ = [
    "AUTHORIZED_USER",
    "EndpointTLS",
    "LogEndpoint",
    "LogFormatter",
    "LogOptions",
    "LogRecord",
    "choose_attempt",
    "format_timestamp",
    "list_attempts",
    "log_dir",
    "parse_line",
    "parse_timestamp",
    "read_log",
    "tail_start",
]

log = logging.getLogger(__name__)

PodResolver = Callable[[str, str], Obj | None]

# The API server's client identity for node agents (issued by `logproxy.kubelet_client_cert`,
# whose KUBELET_CLIENT_USER it equals): the only caller the endpoint serves. Admins read logs
# through the API, which authorizes them; nobody reads them from the node directly.
AUTHORIZED_USER = "kube-apiserver-kubelet-client"
DEFAULT_PORT = 10250
POLL_INTERVAL = 0.2
READ_CHUNK = 64 * 1024

# --------------------------------------------------------------------------- records

_TS = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})"
)


def parse_timestamp(text: str) -> int:
    """RFC 3339 (any fraction up to nanoseconds, Z or an offset) -> nanoseconds since the epoch."""
    m = _TS.fullmatch(text)
    if m is None:
        raise ValueError(f"{text!r} is not an RFC 3339 timestamp")
    y, mo, d, h, mi, s = (int(m.group(i)) for i in range(1, 7))
    frac = int((m.group(7) or "0").ljust(9, "0"))
    zone = m.group(8)
    offset = 0
    if zone not in ("Z", "z"):
        sign = 1 if zone[0] == "+" else -1
        offset = sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    try:
        secs = calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0))
        time.gmtime(secs)  # range check
    except (ValueError, OverflowError) as exc:
        raise ValueError(f"{text!r} is not a valid time") from exc
    if not (1 <= mo <= 12 and 1 <= d <= 31 and h < 24 and mi < 60 and s < 61):
        raise ValueError(f"{text!r} is not a valid time")
    return (secs - offset) * 1_000_000_000 + frac


def format_timestamp(ns: int) -> str:
    """Nanoseconds -> the kubelet's output form, RFC3339Nano with all nine digits, UTC."""
    secs, frac = divmod(ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{frac:09d}Z"


@dataclass(frozen=True, slots=True)
class LogRecord:
    timestamp: int  # nanoseconds since the epoch
    stream: str  # "stdout" | "stderr"
    partial: bool  # a `P` record: the line continues in the next record of this stream
    text: bytes  # without the line's newline


def parse_line(line: bytes) -> LogRecord:
    """One CRI log record (with or without its trailing newline); ValueError if malformed."""
    if line.endswith(b"\n"):
        line = line[:-1]
    parts = line.split(b" ", 3)
    if len(parts) < 3:
        raise ValueError(f"not a CRI log record: {line[:80]!r}")
    ts, stream, tag = parts[0], parts[1], parts[2]
    if stream not in (b"stdout", b"stderr"):
        raise ValueError(f"unknown stream {stream[:20]!r} in a CRI log record")
    if tag not in (b"F", b"P"):
        raise ValueError(f"unknown tag {tag[:20]!r} in a CRI log record")
    try:
        when = parse_timestamp(ts.decode("ascii"))
    except UnicodeDecodeError as exc:
        raise ValueError("bad timestamp in a CRI log record") from exc
    return LogRecord(when, stream.decode(), tag == b"P", parts[3] if len(parts) > 3 else b"")


def _is_full_record(line: bytes) -> bool:
    parts = line.split(b" ", 3)
    return len(parts) >= 3 and parts[2] == b"F"


# --------------------------------------------------------------------------- options


class LogOptionsError(ValueError):
    """An invalid log query; the message names the parameter."""


_TRUE = ("true", "1", "True", "TRUE", "t", "T")
_FALSE = ("false", "0", "False", "FALSE", "f", "F", "")


def _flag(params: Mapping[str, str], name: str) -> bool:
    value = params.get(name, "")
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise LogOptionsError(f"invalid boolean value {value!r} for query parameter {name!r}")


def _int(params: Mapping[str, str], name: str) -> int | None:
    value = params.get(name, "")
    if value == "":
        return None
    if re.fullmatch(r"[+-]?[0-9]+", value) is None:
        raise LogOptionsError(f"invalid integer value {value!r} for query parameter {name!r}")
    return int(value)


@dataclass(frozen=True)
class LogOptions:
    follow: bool = False
    previous: bool = False
    timestamps: bool = False
    since: int | None = None  # nanoseconds since the epoch: drop lines older than this
    tail_lines: int | None = None
    limit_bytes: int | None = None

    @classmethod
    def from_query(cls, params: Mapping[str, str], now_ns: int) -> LogOptions:
        """From query parameters (last value of each); validation as the API server's."""
        tail = _int(params, "tailLines")
        if tail is not None and tail < 0:
            raise LogOptionsError("tailLines: Invalid value: must be greater than or equal to 0")
        limit = _int(params, "limitBytes")
        if limit is not None and limit < 1:
            raise LogOptionsError("limitBytes: Invalid value: must be greater than 0")
        since_seconds = _int(params, "sinceSeconds")
        since_time = params.get("sinceTime", "")
        if since_seconds is not None and since_time:
            raise LogOptionsError("at most one of `sinceTime` or `sinceSeconds` may be specified")
        since: int | None = None
        if since_seconds is not None:
            if since_seconds < 1:
                raise LogOptionsError("sinceSeconds: Invalid value: must be greater than 0")
            since = now_ns - since_seconds * 1_000_000_000
        elif since_time:
            try:
                since = parse_timestamp(since_time)
            except ValueError as exc:
                raise LogOptionsError(f"sinceTime: {exc}") from None
        return cls(
            follow=_flag(params, "follow"),
            previous=_flag(params, "previous"),
            timestamps=_flag(params, "timestamps"),
            since=since,
            tail_lines=tail,
            limit_bytes=limit,
        )


# --------------------------------------------------------------------------- formatting


class LogFormatter:
    """Bytes of a CRI log file in, the user's log text out (pure; feed it in any chunks).

    Partial (`P`) records are held per stream until their `F` record; an unterminated last line
    of the file is held until its newline (or until `finish`).
    """

    def __init__(self, options: LogOptions) -> None:
        self.options = options
        self._rest = b""  # bytes after the last newline seen
        self._partial: dict[str, tuple[int, list[bytes]]] = {}
        self._left = options.limit_bytes

    @property
    def done(self) -> bool:
        """True once `limitBytes` bytes were produced: stop reading."""
        return self._left is not None and self._left <= 0

    def feed(self, data: bytes) -> bytes:
        if self.done:
            return b""
        data = self._rest + data
        cut = data.rfind(b"\n")
        if cut < 0:
            self._rest = data
            return b""
        self._rest = data[cut + 1 :]
        out = [self._record(line) for line in data[:cut].split(b"\n")]
        return self._limit(b"".join(out))

    def finish(self) -> bytes:
        """The end of input: an unterminated last record and pending partial lines (without a
        newline, as the kubelet writes partial records)."""
        if self.done:
            return b""
        out = [self._record(self._rest)] if self._rest else []
        self._rest = b""
        for first, pieces in self._partial.values():
            out.append(self._line(first, b"".join(pieces), b""))
        self._partial.clear()
        return self._limit(b"".join(out))

    def _record(self, line: bytes) -> bytes:
        try:
            rec = parse_line(line)
        except ValueError as exc:
            log.debug("skipping a malformed log line: %s", exc)
            return b""
        pending = self._partial.get(rec.stream)
        if rec.partial:
            if pending is None:
                self._partial[rec.stream] = (rec.timestamp, [rec.text])
            else:
                pending[1].append(rec.text)
            return b""
        if pending is not None:
            del self._partial[rec.stream]
            return self._line(pending[0], b"".join(pending[1]) + rec.text, b"\n")
        return self._line(rec.timestamp, rec.text, b"\n")

    def _line(self, when: int, text: bytes, end: bytes) -> bytes:
        since = self.options.since
        if since is not None and when < since:
            return b""
        if self.options.timestamps:
            return format_timestamp(when).encode() + b" " + text + end
        return text + end

    def _limit(self, out: bytes) -> bytes:
        if self._left is None or not out:
            return out
        out = out[: self._left]
        self._left -= len(out)
        return out


def tail_start(f: BinaryIO, n: int, block: int = READ_CHUNK) -> int:
    """The offset in `f` where its last `n` full lines start (blocking; reads backwards).

    A line split into P records counts once; an unterminated last line does not count (it is
    still being written) but lies after the offset, so it is shown too.
    """
    f.seek(0, os.SEEK_END)
    end = f.tell()
    if n <= 0:
        return end
    buf, buf_start = b"", end  # buf = file[buf_start : buf_start + len(buf)]
    line_end: int | None = None  # newline of the line being looked at (absolute)
    search_to = end
    full = 0
    while True:
        rel = buf.rfind(b"\n", 0, search_to - buf_start)
        if rel < 0:
            if buf_start > 0:
                size = min(block, buf_start)
                buf_start -= size
                f.seek(buf_start)
                buf = f.read(size) + buf
                continue
            # The first line of the file.
            if line_end is not None and _is_full_record(buf[: line_end - buf_start]):
                full += 1
                if full == n + 1:
                    return line_end + 1
            return 0
        if line_end is not None and _is_full_record(buf[rel + 1 : line_end - buf_start]):
            full += 1
            if full == n + 1:
                return line_end + 1
        line_end = search_to = buf_start + rel
        buf = buf[: rel + 1]


# --------------------------------------------------------------------------- files


def log_dir(data_dir: Path, namespace: str, name: str, uid: str) -> Path:
    """The sandbox's log directory (the agent core creates it with this name)."""
    return Path(data_dir) / "pods" / f"{namespace}_{name}_{uid}"


def list_attempts(container_dir: Path) -> list[int]:
    """The attempts with a log file (`{attempt}.log`) in a container's directory, ascending."""
    try:
        names = os.listdir(container_dir)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(int(n[:-4]) for n in names if n.endswith(".log") and n[:-4].isdigit())


def _container_status(pod: Mapping[str, Any], container: str) -> Obj | None:
    status = pod.get("status") or {}
    for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
        for cs in status.get(key) or []:
            if isinstance(cs, dict) and cs.get("name") == container:
                return cs
    return None


def _waiting_message(container: str, pod: str, reason: str) -> str:
    if reason == "ErrImagePull":
        return f'container "{container}" in pod "{pod}" is waiting to start: image can\'t be pulled'
    if reason == "ImagePullBackOff":
        return (
            f'container "{container}" in pod "{pod}" is waiting to start: '
            "trying and failing to pull image"
        )
    return f'container "{container}" in pod "{pod}" is waiting to start: {reason}'


def choose_attempt(
    pod: Mapping[str, Any], container: str, attempts: list[int], previous: bool
) -> int:
    """Which attempt's file to serve (see the module docstring); ApiError(400) if none."""
    name = str((pod.get("metadata") or {}).get("name", ""))
    cs = _container_status(pod, container)
    not_found = errors.bad_request(
        f'previous terminated container "{container}" in pod "{name}" not found'
    )
    if cs is None:  # the agent has not reported it yet: trust the files
        if previous:
            if len(attempts) < 2:
                raise not_found
            return attempts[-2]
        if not attempts:
            raise errors.bad_request(_waiting_message(container, name, "ContainerCreating"))
        return attempts[-1]
    state = cs.get("state") or {}
    last = (cs.get("lastState") or {}).get("terminated")
    current = "running" in state or "terminated" in state
    if previous:
        if not last:
            raise not_found
        wanted = attempts[:-1] if current else attempts
        if not wanted:
            raise not_found
        return wanted[-1]
    if current or last:
        if not attempts:
            if current:
                return 0  # started, but the runtime has not created its file yet
            raise errors.bad_request(f'container "{container}" in pod "{name}" is terminated')
        return attempts[-1]
    waiting = state.get("waiting")
    if isinstance(waiting, dict):
        return _raise(_waiting_message(container, name, str(waiting.get("reason") or "")))
    return _raise(f'container "{container}" in pod "{name}" is waiting to start - no logs yet')


def _raise(message: str) -> int:
    raise errors.bad_request(message)


def _same_file(path: Path, fd: int) -> bool:
    """False if `path` no longer names the open file or the file shrank (rotated, truncated)."""
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino) and now.st_size >= os.lseek(
        fd, 0, os.SEEK_CUR
    )


async def read_log(
    path: Path,
    options: LogOptions,
    *,
    still_current: Callable[[], Awaitable[bool]] | None = None,
    poll_interval: float = POLL_INTERVAL,
) -> AsyncIterator[bytes]:
    """The formatted log of one file, in chunks of whole lines.

    With `options.follow` and a `still_current` check, waits for more lines (polling) until the
    file is rotated or truncated or `still_current()` says the container moved on; the rest of the
    file is sent first. Without them it ends at the end of the file.
    """
    fmt = LogFormatter(options)
    follow = options.follow and still_current is not None
    f: Any = None  # trio's AsyncIOWrapper around a binary file
    try:
        while f is None:
            try:
                f = await trio.open_file(path, "rb")
            except FileNotFoundError:
                if not follow or still_current is None or not await still_current():
                    return
                await trio.sleep(poll_interval)
        raw: BinaryIO = f.wrapped
        if options.tail_lines is not None:
            offset = await trio.to_thread.run_sync(tail_start, raw, options.tail_lines)
            await f.seek(offset)
        ending = not follow
        while True:
            chunk = await f.read(READ_CHUNK)
            if chunk:
                out = fmt.feed(chunk)
                if out:
                    yield out
                if fmt.done:
                    return
                continue
            if ending:
                break
            assert still_current is not None
            same = await trio.to_thread.run_sync(_same_file, path, raw.fileno())
            if not same or not await still_current():
                ending = True  # one more pass: send what was written meanwhile, then stop
                continue
            await trio.sleep(poll_interval)
        out = fmt.finish()
        if out:
            yield out
    finally:
        if f is not None:
            with trio.CancelScope(shield=True):
                await f.aclose()


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
            cs = _container_status(now, container)
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
