"""Probes: spec defaults, the pure threshold state, single probes against real loopback targets
and a fake runtime, probes of simulated pods answered without any socket, and the per-container
workers on trio's MockClock."""

from __future__ import annotations

import functools
import socket
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
import trio
import trio.testing

from orchestrator.agent.probes import (
    ContainerProbes,
    Exec,
    Grpc,
    HttpGet,
    ProbeEvent,
    ProbeKind,
    Prober,
    ProbeSpec,
    ProbeState,
    Result,
    TcpSocket,
    Unresolvable,
)
from orchestrator.cri.runtime import (
    ContainerConfig,
    DeadlineExceeded,
    ExecResult,
    PodSandboxConfig,
    RuntimeFailure,
)
from orchestrator.cri.simulated import Behaviour, SimulatedRuntime
from orchestrator.observability import TimedRuntime

Obj = dict[str, Any]


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


# --------------------------------------------------------------------------- specs


def test_defaults_are_the_kubelets() -> None:
    c = {"name": "app", "livenessProbe": {"httpGet": {"port": 8080}}}
    spec = ProbeSpec.from_container(c, ProbeKind.LIVENESS)
    assert spec is not None
    assert (spec.period, spec.timeout, spec.failure_threshold, spec.success_threshold) == (
        10.0,
        1.0,
        3,
        1,
    )
    assert spec.initial_delay == 0.0
    assert spec.handler == HttpGet(port=8080, path="/")
    assert ProbeSpec.from_container(c, ProbeKind.READINESS) is None


def test_explicit_values_named_ports_and_headers() -> None:
    c = {
        "name": "app",
        "ports": [{"name": "http", "containerPort": 8080}],
        "readinessProbe": {
            "httpGet": {
                "port": "http",
                "path": "healthz",
                "scheme": "HTTPS",
                "host": "10.0.0.9",
                "httpHeaders": [{"name": "X-Probe", "value": "1"}],
            },
            "initialDelaySeconds": 5,
            "periodSeconds": 2,
            "timeoutSeconds": 3,
            "successThreshold": 2,
            "failureThreshold": 4,
        },
        "livenessProbe": {"tcpSocket": {"port": "nope"}, "successThreshold": 5},
        "startupProbe": {"exec": {"command": ["cat", "/tmp/ok"]}, "periodSeconds": 0.2},
    }
    r = ProbeSpec.from_container(c, ProbeKind.READINESS)
    assert r is not None
    assert r.handler == HttpGet(8080, "/healthz", "10.0.0.9", "HTTPS", (("X-Probe", "1"),))
    assert (r.initial_delay, r.period, r.timeout, r.success_threshold, r.failure_threshold) == (
        5.0,
        2.0,
        3.0,
        2,
        4,
    )
    live = ProbeSpec.from_container(c, ProbeKind.LIVENESS)
    assert live is not None
    assert isinstance(live.handler, Unresolvable)
    assert "couldn't find port: nope" in live.handler.reason
    assert live.success_threshold == 1  # liveness/startup: always 1
    start = ProbeSpec.from_container(c, ProbeKind.STARTUP)
    assert start is not None
    assert start.handler == Exec(("cat", "/tmp/ok"))
    assert start.period == 1.0  # minimum period
    grpc = ProbeSpec.from_container(
        {"name": "g", "livenessProbe": {"grpc": {"port": 9000}}}, ProbeKind.LIVENESS
    )
    assert grpc is not None
    assert grpc.handler == Grpc(9000)


# --------------------------------------------------------------------------- pure state


def _spec(kind: ProbeKind, **kw: Any) -> ProbeSpec:
    return ProbeSpec(kind, TcpSocket(80), **kw)


def test_liveness_needs_failure_threshold_failures_in_a_row() -> None:
    s = ProbeState(_spec(ProbeKind.LIVENESS, failure_threshold=3))
    assert s.result is Result.SUCCESS
    F, S = Result.FAILURE, Result.SUCCESS
    assert [s.record(x) for x in (F, F, S, F, F)] == [None] * 5
    assert s.record(F) is F
    assert s.on_hold
    assert s.record(S) is None  # on hold until the container is replaced


def test_readiness_thresholds_and_flapping() -> None:
    s = ProbeState(_spec(ProbeKind.READINESS, success_threshold=2, failure_threshold=2))
    F, S, U = Result.FAILURE, Result.SUCCESS, Result.UNKNOWN
    assert s.result is F
    assert s.record(S) is None
    assert s.record(U) is None  # an outcome that could not be measured is thrown away
    assert s.record(S) is S
    assert s.record(S) is None  # unchanged: not published again
    assert s.record(F) is None
    assert s.record(F) is F
    assert s.record(F) is None
    assert not s.on_hold  # readiness keeps probing
    assert s.consecutive == (F, 3)


def test_startup_success_puts_it_on_hold() -> None:
    s = ProbeState(_spec(ProbeKind.STARTUP))
    assert s.result is Result.UNKNOWN
    assert s.record(Result.FAILURE) is None
    assert s.record(Result.SUCCESS) is Result.SUCCESS
    assert s.on_hold


def test_first_probe_delay() -> None:
    s = ProbeState(_spec(ProbeKind.READINESS, initial_delay=10))
    assert s.first_probe_delay(0) == 10
    assert s.first_probe_delay(4) == 6
    assert s.first_probe_delay(30) == 0


# --------------------------------------------------------------------------- single probes


async def _http_handler(stream: trio.SocketStream) -> None:
    data = b""
    with trio.move_on_after(5):
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some(4096)
            if not chunk:
                return
            data += chunk
    line = data.split(b"\r\n", 1)[0].decode()
    path = line.split(" ")[1]
    headers = data.decode().lower()
    if path == "/hang":
        await trio.sleep_forever()
    status, body = {
        "/ok": (200, b"fine"),
        "/redirect": (302, b""),
        "/broken": (500, b"database down"),
    }.get(path, (404, b"no"))
    if path == "/headers":
        status, body = (200, b"") if "x-probe: yes" in headers else (400, b"missing header")
    await stream.send_all(
        f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    await stream.aclose()


@pytest.fixture
async def http_port() -> AsyncIterator[int]:
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, _http_handler, 0, host="127.0.0.1")
        )
        yield listeners[0].socket.getsockname()[1]
        nursery.cancel_scope.cancel()


async def _probe(handler: Any, runtime: Any = None, seconds: float = 1.0) -> tuple[Result, str]:
    spec = ProbeSpec(ProbeKind.LIVENESS, handler, timeout=seconds)
    with trio.fail_after(10):
        return await Prober().probe(spec, "127.0.0.1", "192.0.2.1", "cid", runtime)


async def test_http_probe_outcomes(http_port: int) -> None:
    assert await _probe(HttpGet(http_port, "/ok")) == (Result.SUCCESS, "")
    assert await _probe(HttpGet(http_port, "/redirect")) == (Result.SUCCESS, "")
    assert await _probe(HttpGet(http_port, "/broken")) == (
        Result.FAILURE,
        "HTTP probe failed with statuscode: 500: database down",
    )
    assert (await _probe(HttpGet(http_port, "/headers")))[0] is Result.FAILURE
    with_header = HttpGet(http_port, "/headers", headers=(("X-Probe", "yes"),))
    assert await _probe(with_header) == (Result.SUCCESS, "")


async def test_http_probe_timeout(http_port: int) -> None:
    result, message = await _probe(HttpGet(http_port, "/hang"), seconds=0.2)
    assert result is Result.FAILURE
    assert "context deadline exceeded" in message


async def _closed_port() -> int:
    sock = trio.socket.socket()
    await sock.bind(("127.0.0.1", 0))
    port: int = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    return port


async def test_http_probe_connection_refused() -> None:
    port = await _closed_port()
    result, message = await _probe(HttpGet(port, "/"))
    assert result is Result.FAILURE
    assert message == (
        f'Get "http://127.0.0.1:{port}/": dial tcp 127.0.0.1:{port}: connect: connection refused'
    )


async def test_tcp_probe(http_port: int) -> None:
    assert await _probe(TcpSocket(http_port)) == (Result.SUCCESS, "")
    port = await _closed_port()
    assert await _probe(TcpSocket(port)) == (
        Result.FAILURE,
        f"dial tcp 127.0.0.1:{port}: connect: connection refused",
    )


class FakeRuntime:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[str, ...], float]] = []
        self.replies: list[ExecResult | Exception] = []

    async def exec_sync(
        self, container_id: str, cmd: Sequence[str], timeout_seconds: float = 0
    ) -> ExecResult:
        await trio.lowlevel.checkpoint()
        self.calls.append((container_id, tuple(cmd), timeout_seconds))
        reply = self.replies.pop(0) if self.replies else ExecResult(b"", b"", 0)
        if isinstance(reply, Exception):
            raise reply
        return reply


async def test_exec_probe() -> None:
    rt = FakeRuntime()
    rt.replies = [
        ExecResult(b"", b"", 0),
        ExecResult(b"", b"cat: can't open '/tmp/ok'\n", 1),
        DeadlineExceeded("timeout 1s exceeded"),
        RuntimeFailure("executable file not found in $PATH"),
    ]
    h = Exec(("cat", "/tmp/ok"))
    assert await _probe(h, rt) == (Result.SUCCESS, "")
    assert await _probe(h, rt) == (
        Result.FAILURE,
        "command 'cat /tmp/ok' exited with 1: cat: can't open '/tmp/ok'",
    )
    assert await _probe(h, rt) == (Result.FAILURE, "command 'cat /tmp/ok' timed out")
    result, message = await _probe(h, rt)
    assert result is Result.UNKNOWN  # not the container's fault: thrown away, no restart
    assert "executable file not found" in message
    assert rt.calls[0] == ("cid", ("cat", "/tmp/ok"), 1.0)


async def test_grpc_and_unresolvable_are_unknown() -> None:
    assert (await _probe(Grpc(9000)))[0] is Result.UNKNOWN
    assert await _probe(Unresolvable("couldn't find port")) == (
        Result.UNKNOWN,
        "couldn't find port",
    )


# --------------------------------------------------------------------------- simulated pods


@pytest.fixture
def no_sockets(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every way a probe could open a connection raises (and is recorded)."""
    attempts: list[object] = []

    def refuse(*args: object, **kwargs: object) -> None:
        attempts.append(args[1:] if len(args) > 1 else args)
        raise AssertionError(f"a socket connect was attempted: {args!r}")

    async def refuse_async(*args: object, **kwargs: object) -> None:
        refuse(None, *args)

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(trio, "open_tcp_stream", refuse_async)
    monkeypatch.setattr(trio, "open_ssl_over_tcp_stream", refuse_async)
    return attempts


async def _simulated_pod(rt: SimulatedRuntime, name: str, *command: str) -> tuple[str, str]:
    config = PodSandboxConfig(name=name, namespace="ns", uid=name + "-uid")
    sandbox = await rt.run_pod_sandbox(config)
    container = ContainerConfig(name=name, image="localhost/busybox:1", command=command)
    cid = await rt.create_container(sandbox, container, config)
    await rt.start_container(cid)
    return cid, (await rt.pod_sandbox_status(sandbox)).ip


async def test_simulated_pods_are_probed_without_a_socket(no_sockets: list[object]) -> None:
    """httpGet and tcpSocket probes of a simulated pod are answered by the simulated runtime
    (also through the agent's TimedRuntime wrapper): its pod IPs may be real hosts."""
    sim = SimulatedRuntime(behaviours={"sick": Behaviour(http_status=503, ports=(8080,))})
    rt: Any = TimedRuntime(sim)
    web, ip = await _simulated_pod(sim, "web", "httpd", "-f", "-p", "8080")
    assert ip.startswith("10.88.")

    async def probe(handler: Any, cid: str = web, pod_ip: str = ip) -> tuple[Result, str]:
        spec = ProbeSpec(ProbeKind.READINESS, handler, timeout=1.0)
        with trio.fail_after(5):
            return await Prober().probe(spec, pod_ip, "192.0.2.1", cid, rt)

    assert await probe(HttpGet(8080, "/healthz")) == (Result.SUCCESS, "")
    assert await probe(TcpSocket(8080)) == (Result.SUCCESS, "")
    refused = f"dial tcp {ip}:9090: connect: connection refused"
    assert await probe(HttpGet(9090, "/")) == (
        Result.FAILURE,
        f'Get "http://{ip}:9090/": {refused}',
    )
    assert await probe(TcpSocket(9090)) == (Result.FAILURE, refused)
    # A probe naming another host: a simulated pod's IP answers, anything else refuses.
    _, sick_ip = await _simulated_pod(sim, "sick", "sleep", "infinity")
    assert await probe(HttpGet(8080, "/", host=sick_ip)) == (
        Result.FAILURE,
        "HTTP probe failed with statuscode: 503",
    )
    assert await probe(TcpSocket(8080, host="192.168.1.10")) == (
        Result.FAILURE,
        "dial tcp 192.168.1.10:8080: connect: connection refused",
    )
    # A host-network pod (no IP of its own) is probed on the node's address: the simulation
    # answers for its own containers, still without a socket.
    assert await probe(TcpSocket(8080), pod_ip="") == (Result.SUCCESS, "")
    # A container the runtime does not know: UNKNOWN (never a restart).
    assert (await probe(TcpSocket(8080), cid="gone"))[0] is Result.UNKNOWN
    await sim.stop_container(web, 0)
    assert (await probe(TcpSocket(8080)))[0] is Result.FAILURE
    assert no_sockets == []


async def test_the_guard_catches_a_real_probe(no_sockets: list[object]) -> None:
    """The `no_sockets` guard does see a dial: a probe without a simulated runtime trips it."""
    with pytest.raises(AssertionError, match="socket connect was attempted"):
        await Prober().probe(
            ProbeSpec(ProbeKind.READINESS, TcpSocket(80)), "10.88.0.2", "", "cid", None
        )
    assert no_sockets


# --------------------------------------------------------------------------- workers


class ScriptedProber(Prober):
    """Answers from a per-kind script (last answer repeats) and records when it was asked."""

    def __init__(self, script: dict[ProbeKind, list[Result]]) -> None:
        super().__init__()
        self.script = script
        self.times: dict[ProbeKind, list[float]] = {k: [] for k in script}

    async def probe(
        self, spec: ProbeSpec, pod_ip: str, host_ip: str, container_id: str, runtime: Any
    ) -> tuple[Result, str]:
        await trio.sleep(0.01)  # a probe takes a little time
        self.times[spec.kind].append(trio.current_time())
        answers = self.script[spec.kind]
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        return answer, "" if answer is Result.SUCCESS else f"{spec.kind} says no"


def _container(**probes: Obj) -> Obj:
    return {"name": "app", **{f"{k}Probe": v for k, v in probes.items()}}


async def test_worker_cadence_and_liveness_restart(autojump_clock: trio.testing.MockClock) -> None:
    F, S = Result.FAILURE, Result.SUCCESS
    events: list[tuple[float, ProbeEvent]] = []
    prober = ScriptedProber({ProbeKind.LIVENESS: [S, S, F, F, F, S]})
    c = _container(liveness={"exec": {"command": ["true"]}, "initialDelaySeconds": 5})
    probes = ContainerProbes(
        c,
        "cid-1",
        pod_ip="10.0.0.2",
        host_ip="10.0.0.1",
        runtime=None,
        on_result=lambda e: events.append((trio.current_time(), e)),
        prober=prober,
    )
    t0 = trio.current_time()
    with trio.fail_after(300):
        await probes.run()  # returns: liveness failed and went on hold
    times = [round(t - t0, 2) for t in prober.times[ProbeKind.LIVENESS]]
    assert times == [5.01, 15.01, 25.01, 35.01, 45.01]
    assert [(round(t - t0, 2), e.kind, e.result, e.message) for t, e in events] == [
        (45.01, ProbeKind.LIVENESS, F, "liveness says no")
    ]
    assert events[0][1].container == "app"
    assert events[0][1].container_id == "cid-1"
    assert not probes.live


async def test_startup_gates_liveness_and_readiness(
    autojump_clock: trio.testing.MockClock,
) -> None:
    F, S = Result.FAILURE, Result.SUCCESS
    prober = ScriptedProber(
        {
            ProbeKind.STARTUP: [F, F, S],
            ProbeKind.READINESS: [S],
            ProbeKind.LIVENESS: [S],
        }
    )
    events: list[tuple[float, ProbeKind, Result]] = []
    c = _container(
        startup={"tcpSocket": {"port": 80}, "periodSeconds": 1, "failureThreshold": 30},
        readiness={"tcpSocket": {"port": 80}, "periodSeconds": 5},
        liveness={"tcpSocket": {"port": 80}, "periodSeconds": 5, "initialDelaySeconds": 1},
    )
    probes = ContainerProbes(
        c,
        "cid",
        pod_ip="10.0.0.2",
        host_ip="",
        runtime=None,
        on_result=lambda e: events.append((trio.current_time(), e.kind, e.result)),
        prober=prober,
    )
    assert not probes.started
    assert not probes.ready
    assert probes.live
    t0 = trio.current_time()
    with trio.move_on_after(20):
        await probes.run()
    assert [round(t - t0, 2) for t in prober.times[ProbeKind.STARTUP]] == [0.01, 1.01, 2.01]
    # Neither ran before the startup probe succeeded at 2.01.
    assert min(prober.times[ProbeKind.READINESS]) - t0 > 2.01
    assert min(prober.times[ProbeKind.LIVENESS]) - t0 > 2.01
    assert [(round(t - t0, 2), k, r) for t, k, r in events] == [
        (2.01, ProbeKind.STARTUP, S),
        (2.02, ProbeKind.READINESS, S),
    ]
    assert probes.started
    assert probes.ready
    assert len(prober.times[ProbeKind.READINESS]) == 4  # 2.02, 7.02, 12.02, 17.02


async def test_started_ago_shortens_the_initial_delay(
    autojump_clock: trio.testing.MockClock,
) -> None:
    prober = ScriptedProber({ProbeKind.READINESS: [Result.SUCCESS]})
    c = _container(readiness={"tcpSocket": {"port": 80}, "initialDelaySeconds": 30})
    probes = ContainerProbes(
        c,
        "cid",
        pod_ip="10.0.0.2",
        host_ip="",
        runtime=None,
        on_result=lambda e: None,
        started_ago=25,
        prober=prober,
    )
    t0 = trio.current_time()
    with trio.move_on_after(6):
        await probes.run()
    assert [round(t - t0, 2) for t in prober.times[ProbeKind.READINESS]] == [5.01]
    assert probes.ready


async def test_no_probes_means_started_and_ready() -> None:
    probes = ContainerProbes(
        {"name": "app"}, "cid", pod_ip="", host_ip="", runtime=None, on_result=lambda e: None
    )
    with trio.fail_after(1):
        await probes.run()
    assert probes.started
    assert probes.ready
    assert probes.live
