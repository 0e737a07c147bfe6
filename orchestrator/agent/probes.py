"""Container probes (liveness, readiness, startup) as the kubelet runs them.

Theory of operation
-------------------
Three layers, from pure to I/O:

1. `ProbeSpec.from_container(container, kind)` reads a container's `livenessProbe`,
   `readinessProbe` or `startupProbe` and applies the kubelet defaults: periodSeconds 10 (minimum
   1), timeoutSeconds 1, failureThreshold 3, successThreshold 1 (always 1 for liveness and
   startup), initialDelaySeconds 0. Named ports (`port: http`) are resolved against the
   container's `ports` here, once.
2. `ProbeState` is the kubelet's per-container probe worker bookkeeping without any I/O: it is
   told each probe outcome and answers the *published* result. A result is published only after
   `failureThreshold` consecutive failures or `successThreshold` consecutive successes, and only
   when it changes. An outcome of `UNKNOWN` (the probe could not be run at all, e.g. a gRPC probe
   or a runtime error other than a timeout) is thrown away, as the kubelet does with prober
   errors. After a published liveness or startup failure the state is *on hold*: the container is
   going to be restarted and the new container gets a fresh `ProbeState`.
   Initial results: readiness `FAILURE` (a container is not ready until a probe says so),
   liveness `SUCCESS`, startup `UNKNOWN`.
3. `Prober.probe(spec, pod_ip, host_ip, container_id, runtime)` runs one probe: `httpGet` (httpx,
   2xx/3xx is success, redirects are not followed, HTTPS is not verified — as the kubelet),
   `tcpSocket` (a TCP connect), `exec` (`runtime.exec_sync`, exit 0 is success, a timeout is a
   failure) and `grpc` (not supported: `UNKNOWN`, so it never restarts a container).
   When the runtime simulates its pods' network (`cri.runtime.simulated_network`: the simulated
   runtime, whose pod IPs are made up and may be real hosts on the user's LAN), `httpGet` and
   `tcpSocket` are asked of the runtime (`probe_network`) and *never dialled*: a simulated pod
   causes no packet. The outcomes and messages are the same as over a real network.
   `ContainerProbes` runs one trio task per configured probe of one container *instance*: the
   first probe `initialDelaySeconds` after the container started, then every `periodSeconds`.
   Liveness and readiness wait until the startup probe (if any) has succeeded; the startup task
   ends after its first published success. Each published result is handed to the `on_result`
   callback as a `ProbeEvent`.

How the pod worker uses it
--------------------------
Right after a container starts (or, after an agent restart, for a container found running)::

    probes = ContainerProbes(container_spec, container_id, pod_ip=ip, host_ip=node_ip,
                             runtime=runtime, on_result=handle, started_ago=0.0)
    nursery.start_soon(probes.run)       # cancel its scope when the container stops

`handle(event)` is a plain (non-async) function and must not block: liveness `FAILURE` → restart
the container (per restartPolicy), startup `FAILURE` → the same, readiness → the pod's `Ready`
condition and `containerStatuses[].ready`, startup `SUCCESS` → `containerStatuses[].started`.
`probes.ready` and `probes.started` give the current values at any time (a container without a
readiness probe is ready once running; without a startup probe it is started at once). A
restarted container gets a new `ContainerProbes` (new id, fresh counters).

Invariants: nothing here touches the API server or changes containers; the callback is the only
output; no socket is opened for a pod of a runtime that simulates its network. All waiting uses
trio's clock, so tests run on `MockClock(autojump_threshold=0)`.
"""

from __future__ import annotations

import enum
import math
import os
import shlex
import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from orchestrator.cri.runtime import (
    CriError,
    DeadlineExceeded,
    ExecResult,
    NetworkProbe,
    SimulatedNetwork,
    simulated_network,
)

__all__ = [
    "ContainerProbes",
    "ExecRuntime",
    "ProbeEvent",
    "ProbeKind",
    "ProbeSpec",
    "ProbeState",
    "Prober",
    "Result",
]


DEFAULT_PERIOD = 10.0
MIN_PERIOD = 1.0
DEFAULT_TIMEOUT = 1.0
DEFAULT_FAILURE_THRESHOLD = 3
DEFAULT_SUCCESS_THRESHOLD = 1
USER_AGENT = "kube-probe/1.32"
MAX_BODY = 10 * 1024  # the kubelet keeps at most 10 KiB of a probe's response body


class ProbeKind(enum.StrEnum):
    LIVENESS = "liveness"
    READINESS = "readiness"
    STARTUP = "startup"

    @property
    def field(self) -> str:
        return f"{self.value}Probe"


class Result(enum.Enum):
    SUCCESS = "Success"
    FAILURE = "Failure"
    UNKNOWN = "Unknown"


# --------------------------------------------------------------------------- specs


@dataclass(frozen=True)
class HttpGet:
    port: int
    path: str = "/"
    host: str = ""
    scheme: str = "HTTP"
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class TcpSocket:
    port: int
    host: str = ""


@dataclass(frozen=True)
class Exec:
    command: tuple[str, ...]


@dataclass(frozen=True)
class Grpc:
    port: int
    service: str = ""


@dataclass(frozen=True)
class Unresolvable:
    """A handler the agent cannot run (a named port the container does not declare, no handler)."""

    reason: str


Handler = HttpGet | TcpSocket | Exec | Grpc | Unresolvable


def _number(value: Any, default: float, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return default
    return max(float(value), minimum)


def _threshold(value: Any, default: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return default
    return value


def resolve_port(port: Any, container: Mapping[str, Any]) -> int | str:
    """An int, a numeric string, or the `containerPort` of the container port with that name.

    Returns the error text (a str) when the port cannot be resolved.
    """
    if isinstance(port, int) and not isinstance(port, bool):
        return port if 0 < port < 65536 else f"invalid port number: {port}"
    if isinstance(port, str) and port:
        if port.isdigit():
            return resolve_port(int(port), container)
        for p in container.get("ports") or []:
            if isinstance(p, dict) and p.get("name") == port:
                return resolve_port(p.get("containerPort"), container)
        return f"couldn't find port: {port} in container {container.get('name', '')!r}"
    return f"invalid port: {port!r}"


def _handler(probe: Mapping[str, Any], container: Mapping[str, Any]) -> Handler:
    if isinstance(probe.get("exec"), dict):
        cmd = probe["exec"].get("command") or []
        return Exec(tuple(str(c) for c in cmd))
    if isinstance(probe.get("httpGet"), dict):
        h = probe["httpGet"]
        port = resolve_port(h.get("port"), container)
        if isinstance(port, str):
            return Unresolvable(port)
        path = str(h.get("path") or "/")
        if not path.startswith("/"):
            path = "/" + path
        headers = tuple(
            (str(x.get("name", "")), str(x.get("value", "")))
            for x in h.get("httpHeaders") or []
            if isinstance(x, dict) and x.get("name")
        )
        return HttpGet(
            port=port,
            path=path,
            host=str(h.get("host") or ""),
            scheme=str(h.get("scheme") or "HTTP").upper(),
            headers=headers,
        )
    if isinstance(probe.get("tcpSocket"), dict):
        t = probe["tcpSocket"]
        port = resolve_port(t.get("port"), container)
        if isinstance(port, str):
            return Unresolvable(port)
        return TcpSocket(port=port, host=str(t.get("host") or ""))
    if isinstance(probe.get("grpc"), dict):
        g = probe["grpc"]
        port = resolve_port(g.get("port"), container)
        return Grpc(port=port if isinstance(port, int) else 0, service=str(g.get("service") or ""))
    return Unresolvable("the probe has no handler (exec, httpGet, tcpSocket or grpc)")


@dataclass(frozen=True)
class ProbeSpec:
    """One probe of one container with the kubelet's defaults applied (times in seconds)."""

    kind: ProbeKind
    handler: Handler
    initial_delay: float = 0.0
    period: float = DEFAULT_PERIOD
    timeout: float = DEFAULT_TIMEOUT
    success_threshold: int = DEFAULT_SUCCESS_THRESHOLD
    failure_threshold: int = DEFAULT_FAILURE_THRESHOLD

    @classmethod
    def from_container(cls, container: Mapping[str, Any], kind: ProbeKind) -> ProbeSpec | None:
        """The container's probe of this kind, or None if it has none."""
        probe = container.get(kind.field)
        if not isinstance(probe, dict):
            return None
        success = _threshold(probe.get("successThreshold"), DEFAULT_SUCCESS_THRESHOLD)
        if kind is not ProbeKind.READINESS:
            success = 1  # API validation insists; be safe with objects that skipped it
        delay = probe.get("initialDelaySeconds")
        return cls(
            kind=kind,
            handler=_handler(probe, container),
            initial_delay=float(delay)
            if isinstance(delay, int | float) and not isinstance(delay, bool) and delay > 0
            else 0.0,
            period=_number(probe.get("periodSeconds"), DEFAULT_PERIOD, MIN_PERIOD),
            timeout=_number(probe.get("timeoutSeconds"), DEFAULT_TIMEOUT),
            success_threshold=success,
            failure_threshold=_threshold(probe.get("failureThreshold"), DEFAULT_FAILURE_THRESHOLD),
        )


def initial_result(kind: ProbeKind) -> Result:
    """What the kubelet reports before a probe of this kind has decided anything."""
    return {
        ProbeKind.READINESS: Result.FAILURE,
        ProbeKind.LIVENESS: Result.SUCCESS,
        ProbeKind.STARTUP: Result.UNKNOWN,
    }[kind]


# --------------------------------------------------------------------------- pure state


@dataclass
class ProbeState:
    """Consecutive-outcome counting for one probe of one container instance (no I/O).

    `record(outcome)` returns the newly published result, or None when the published result
    stays as it is. `on_hold` becomes true after a published liveness/startup failure (stop
    probing: the container will be restarted) and after a published startup success (the startup
    probe has done its job).
    """

    spec: ProbeSpec
    result: Result = field(init=False)
    on_hold: bool = field(init=False, default=False)
    _last: Result | None = field(init=False, default=None)
    _run: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.result = initial_result(self.spec.kind)

    @property
    def consecutive(self) -> tuple[Result | None, int]:
        """The last counted outcome and how many times in a row it was seen."""
        return self._last, self._run

    def record(self, outcome: Result) -> Result | None:
        if self.on_hold or outcome is Result.UNKNOWN:
            return None
        if outcome is self._last:
            self._run += 1
        else:
            self._last, self._run = outcome, 1
        if outcome is Result.FAILURE and self._run < self.spec.failure_threshold:
            return None
        if outcome is Result.SUCCESS and self._run < self.spec.success_threshold:
            return None
        kind = self.spec.kind
        if outcome is Result.FAILURE and kind in (ProbeKind.LIVENESS, ProbeKind.STARTUP):
            self.on_hold, self._run = True, 0
        if outcome is Result.SUCCESS and kind is ProbeKind.STARTUP:
            self.on_hold = True
        if outcome is self.result:
            return None
        self.result = outcome
        return outcome

    def first_probe_delay(self, started_ago: float) -> float:
        """Seconds from now until the first probe, for a container started `started_ago` s ago."""
        return max(0.0, self.spec.initial_delay - max(0.0, started_ago))


# --------------------------------------------------------------------------- prober (I/O)


class ExecRuntime(Protocol):
    """The one runtime call probes need (`orchestrator.cri.runtime.RuntimeService` has it)."""

    async def exec_sync(
        self, container_id: str, cmd: Sequence[str], timeout_seconds: float = 0
    ) -> ExecResult: ...


def _insecure_context() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the kubelet does not verify probe targets either
    return ctx


def _host_literal(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


class Prober:
    """Runs single probes. Stateless apart from a reusable TLS context for HTTPS probes."""

    def __init__(self) -> None:
        self._tls: ssl.SSLContext | None = None

    async def probe(
        self,
        spec: ProbeSpec,
        pod_ip: str,
        host_ip: str,
        container_id: str,
        runtime: ExecRuntime | None,
    ) -> tuple[Result, str]:
        """Run the probe once (bounded by `spec.timeout`): (outcome, message for people).

        The message is empty on success; on failure it says why, in the kubelet's words.
        `pod_ip` is the default target host (`host_ip` when the pod has no IP of its own).
        """
        h = spec.handler
        target = pod_ip or host_ip
        network = simulated_network(runtime) if runtime is not None else None
        if isinstance(h, HttpGet | TcpSocket) and network is not None:
            return await _simulated(network, h, h.host or target, container_id, target)
        if isinstance(h, HttpGet):
            return await self._http(h, h.host or target, spec.timeout)
        if isinstance(h, TcpSocket):
            return await self._tcp(h.host or target, h.port, spec.timeout)
        if isinstance(h, Exec):
            if runtime is None:
                return Result.UNKNOWN, "no container runtime to exec the probe in"
            return await self._exec(runtime, container_id, h.command, spec.timeout)
        if isinstance(h, Grpc):
            return Result.UNKNOWN, "gRPC probes are not supported by this agent"
        return Result.UNKNOWN, h.reason

    async def _http(self, h: HttpGet, host: str, seconds: float) -> tuple[Result, str]:
        import httpx  # here, not at the top: an agent whose pods have no HTTP probes never needs it

        scheme = "https" if h.scheme == "HTTPS" else "http"
        url = _http_url(h, host)
        headers = {"User-Agent": USER_AGENT, "Accept": "*/*", "Connection": "close"}
        for name, value in h.headers:  # probe headers replace the defaults (Host included)
            headers = {k: v for k, v in headers.items() if k.lower() != name.lower()}
            headers[name] = value
        if scheme == "https" and self._tls is None:
            self._tls = _insecure_context()
        verify: ssl.SSLContext | bool = self._tls if scheme == "https" and self._tls else False
        try:
            with trio.fail_after(seconds):
                async with (
                    httpx.AsyncClient(
                        verify=verify, timeout=seconds, follow_redirects=False
                    ) as client,
                    client.stream("GET", url, headers=headers) as response,
                ):
                    body = b""
                    async for chunk in response.aiter_bytes():
                        body += chunk
                        if len(body) >= MAX_BODY:
                            break
        except (trio.TooSlowError, httpx.TimeoutException):
            return Result.FAILURE, (
                f'Get "{url}": context deadline exceeded '
                "(Client.Timeout exceeded while awaiting headers)"
            )
        except httpx.ConnectError as exc:
            return Result.FAILURE, f'Get "{url}": {_dial_error(host, h.port, exc)}'
        except (httpx.HTTPError, OSError) as exc:
            return Result.FAILURE, f'Get "{url}": {exc or type(exc).__name__}'
        if 200 <= response.status_code < 400:
            return Result.SUCCESS, ""
        text = body[:MAX_BODY].decode("utf-8", "replace")
        message = f"HTTP probe failed with statuscode: {response.status_code}"
        return Result.FAILURE, f"{message}: {text}" if text else message

    async def _tcp(self, host: str, port: int, seconds: float) -> tuple[Result, str]:
        try:
            with trio.fail_after(seconds):
                stream = await trio.open_tcp_stream(host, port)
        except trio.TooSlowError:
            return Result.FAILURE, f"dial tcp {_host_literal(host)}:{port}: i/o timeout"
        except OSError as exc:
            return Result.FAILURE, _dial_error(host, port, exc)
        await trio.aclose_forcefully(stream)
        return Result.SUCCESS, ""

    async def _exec(
        self, runtime: ExecRuntime, container_id: str, cmd: tuple[str, ...], seconds: float
    ) -> tuple[Result, str]:
        shown = shlex.join(cmd)
        if not cmd:
            return Result.UNKNOWN, "the exec probe has an empty command"
        try:
            # The runtime enforces the timeout (whole seconds); the margin is for its reply.
            with trio.fail_after(math.ceil(seconds) + 2.0):
                res = await runtime.exec_sync(container_id, cmd, seconds)
        except (DeadlineExceeded, trio.TooSlowError):
            return Result.FAILURE, f"command {shown!r} timed out"
        except CriError as exc:
            return Result.UNKNOWN, f"exec of {shown!r} failed: {exc.message}"
        if res.exit_code == 0:
            return Result.SUCCESS, ""
        output = (res.stdout + res.stderr).decode("utf-8", "replace").strip()
        message = f"command {shown!r} exited with {res.exit_code}"
        return Result.FAILURE, f"{message}: {output}" if output else message


def _http_url(h: HttpGet, host: str) -> str:
    scheme = "https" if h.scheme == "HTTPS" else "http"
    return f"{scheme}://{_host_literal(host)}:{h.port}{h.path}"


async def _simulated(
    network: SimulatedNetwork, h: HttpGet | TcpSocket, host: str, container_id: str, own: str
) -> tuple[Result, str]:
    """An httpGet or tcpSocket probe answered by the runtime's simulated network (no socket)."""
    http = isinstance(h, HttpGet)
    probe = NetworkProbe(
        container_id,
        "http" if http else "tcp",
        host,
        h.port,
        own_address=host == own,
        path=h.path if isinstance(h, HttpGet) else "/",
    )
    try:
        answer = await network.probe_network(probe)
    except CriError as exc:  # e.g. the container is gone: not the container's fault
        return Result.UNKNOWN, f"probe of {host}:{h.port} not answered: {exc.message}"
    refused = f"dial tcp {_host_literal(host)}:{h.port}: connect: connection refused"
    if not isinstance(h, HttpGet):
        return (Result.SUCCESS, "") if answer.connected else (Result.FAILURE, refused)
    url = _http_url(h, host)
    if not answer.connected:
        return Result.FAILURE, f'Get "{url}": {refused}'
    if 200 <= answer.status < 400:
        return Result.SUCCESS, ""
    text = answer.body[:MAX_BODY].decode("utf-8", "replace")
    message = f"HTTP probe failed with statuscode: {answer.status}"
    return Result.FAILURE, f"{message}: {text}" if text else message


def _dial_error(host: str, port: int, exc: BaseException) -> str:
    """Go-like dial error text: `dial tcp 10.0.0.5:80: connect: connection refused`."""
    text = str(exc)
    inner: BaseException | None = exc
    while inner is not None:  # httpx wraps the OSError (and trio a MultiError of attempts)
        if isinstance(inner, OSError) and (inner.errno or inner.strerror):
            text = os.strerror(inner.errno) if inner.errno else str(inner.strerror)
            break
        if isinstance(inner, BaseExceptionGroup) and inner.exceptions:
            inner = inner.exceptions[0]
            continue
        inner = inner.__cause__ or inner.__context__
    text = text.lower() if text else type(exc).__name__
    return f"dial tcp {_host_literal(host)}:{port}: connect: {text}"


# --------------------------------------------------------------------------- workers (trio)


@dataclass(frozen=True)
class ProbeEvent:
    """A published probe result for one container instance."""

    container: str  # container name
    container_id: str
    kind: ProbeKind
    result: Result
    message: str  # why (the last probe's message); empty on success


OnResult = Callable[[ProbeEvent], None]


class ContainerProbes:
    """The probe tasks of one running container instance. See the module docstring.

    `run()` returns when no probe is left to run (none configured, or all on hold); cancel it
    when the container stops.
    """

    def __init__(
        self,
        container: Mapping[str, Any],
        container_id: str,
        *,
        pod_ip: str,
        host_ip: str,
        runtime: ExecRuntime | None,
        on_result: OnResult,
        started_ago: float = 0.0,
        prober: Prober | None = None,
    ) -> None:
        self.name = str(container.get("name", ""))
        self.container_id = container_id
        self.pod_ip = pod_ip
        self.host_ip = host_ip
        self.runtime = runtime
        self.on_result = on_result
        self.started_ago = started_ago
        self.prober = prober or Prober()
        self.states: dict[ProbeKind, ProbeState] = {}
        for kind in ProbeKind:
            spec = ProbeSpec.from_container(container, kind)
            if spec is not None:
                self.states[kind] = ProbeState(spec)
        self._startup_done = trio.Event()
        if ProbeKind.STARTUP not in self.states:
            self._startup_done.set()

    @property
    def started(self) -> bool:
        """The container counts as started (its startup probe, if any, succeeded)."""
        return self._startup_done.is_set()

    @property
    def ready(self) -> bool:
        """Readiness as the pod's Ready condition needs it (no probe: ready once started)."""
        state = self.states.get(ProbeKind.READINESS)
        if state is None:
            return self.started
        return self.started and state.result is Result.SUCCESS

    @property
    def live(self) -> bool:
        state = self.states.get(ProbeKind.LIVENESS)
        return state is None or state.result is not Result.FAILURE

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        start = trio.current_time() - max(0.0, self.started_ago)
        async with trio.open_nursery() as nursery:
            for kind, state in self.states.items():
                nursery.start_soon(self._worker, kind, state, start)
            task_status.started()

    async def _worker(self, kind: ProbeKind, state: ProbeState, start: float) -> None:
        spec = state.spec
        await trio.sleep_until(start + spec.initial_delay)
        if kind is not ProbeKind.STARTUP:
            await self._startup_done.wait()
        next_at = trio.current_time()
        while not state.on_hold:
            await trio.sleep_until(next_at)
            outcome, message = await self.prober.probe(
                spec, self.pod_ip, self.host_ip, self.container_id, self.runtime
            )
            published = state.record(outcome)
            if kind is ProbeKind.STARTUP and state.result is Result.SUCCESS:
                self._startup_done.set()
            if published is not None:
                self.on_result(ProbeEvent(self.name, self.container_id, kind, published, message))
            # Keep the cadence; after a probe that overran its period, probe again at once.
            next_at = max(next_at + spec.period, trio.current_time())
