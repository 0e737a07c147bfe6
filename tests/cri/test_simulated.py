"""SimulatedRuntime beyond the conformance suite: behaviours (crash loops, OOM, create and start
failures, exec answers, HTTP probes), start latency, late log lines, network and availability
switches. All under MockClock(autojump), so simulated seconds cost nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from orchestrator.cri import (
    ContainerConfig,
    ContainerState,
    ExecResult,
    PodSandboxConfig,
    RuntimeFailure,
    Unavailable,
)
from orchestrator.cri.simulated import Behaviour, SimulatedRuntime, format_cri_log_line

IMAGE = "localhost/busybox:1"


def sandbox_config(name: str = "p", *, host_network: bool = False, **kw: str) -> PodSandboxConfig:
    return PodSandboxConfig(
        name=name, namespace="ns", uid=name + "-uid", host_network=host_network, **kw
    )


async def start(
    rt: SimulatedRuntime,
    sandbox: tuple[str, PodSandboxConfig],
    name: str,
    *command: str,
    attempt: int = 0,
) -> str:
    cid = await rt.create_container(
        sandbox[0],
        ContainerConfig(name=name, image=IMAGE, command=command, attempt=attempt, log_path=name),
        sandbox[1],
    )
    await rt.start_container(cid)
    return cid


async def new_sandbox(
    rt: SimulatedRuntime, name: str = "p", **kw: str
) -> tuple[str, PodSandboxConfig]:
    config = sandbox_config(name, **kw)
    return await rt.run_pod_sandbox(config), config


def test_cri_log_line_format() -> None:
    assert format_cri_log_line(1_700_000_000_123_400_000, "stdout", "hi") == (
        "2023-11-14T22:13:20.1234Z stdout F hi\n"
    )
    assert format_cri_log_line(1_700_000_000_000_000_000, "stderr", "x") == (
        "2023-11-14T22:13:20Z stderr F x\n"
    )


async def test_crash_loop_that_heals(autojump_clock: trio.testing.MockClock) -> None:
    rt = SimulatedRuntime(
        behaviours={"app": Behaviour(run_for=2.0, exit_code=2, healthy_attempts_from=2)}
    )
    sandbox = await new_sandbox(rt)
    for attempt in (0, 1):
        cid = await start(rt, sandbox, "app", attempt=attempt)
        await trio.sleep(1.9)
        assert (await rt.container_status(cid)).state == ContainerState.RUNNING
        await trio.sleep(0.2)
        st = await rt.container_status(cid)
        assert (st.state, st.exit_code, st.reason) == (ContainerState.EXITED, 2, "Error")
        assert st.finished_at - st.started_at == pytest.approx(2e9, rel=0.01)
    cid = await start(rt, sandbox, "app", attempt=2)
    await trio.sleep(3600)
    assert (await rt.container_status(cid)).state == ContainerState.RUNNING


async def test_oom_create_and_start_errors(autojump_clock: trio.testing.MockClock) -> None:
    rt = SimulatedRuntime(
        behaviours={
            "hog": Behaviour(run_for=1.0, oom=True),
            "bad": Behaviour(create_error="failed to create: invalid mount"),
            "nostart": Behaviour(start_error='exec: "x": executable file not found in $PATH'),
        }
    )
    sandbox = await new_sandbox(rt)
    hog = await start(rt, sandbox, "hog")
    await trio.sleep(1.5)
    st = await rt.container_status(hog)
    assert (st.exit_code, st.reason) == (137, "OOMKilled")
    with pytest.raises(RuntimeFailure, match="invalid mount"):
        await start(rt, sandbox, "bad")
    with pytest.raises(RuntimeFailure, match="executable file not found"):
        await start(rt, sandbox, "nostart")
    exited = await rt.list_containers(state=ContainerState.EXITED, sandbox_id=sandbox[0])
    assert sorted(c.name for c in exited) == ["hog", "nostart"]  # "bad" was never created


async def test_start_latency_and_late_log_lines(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    rt = SimulatedRuntime(start_latency=0.5)
    config = sandbox_config(log_directory=str(tmp_path))
    sandbox = await rt.run_pod_sandbox(config), config
    t0 = trio.current_time()
    cid = await start(rt, sandbox, "c", "sh", "-c", "echo one; sleep 10; echo two; sleep 3600")
    assert trio.current_time() - t0 == pytest.approx(0.5)
    st = await rt.container_status(cid)
    text = await trio.Path(st.log_path).read_text()
    assert text.endswith(" stdout F one\n")
    assert "two" not in text
    await trio.sleep(10)
    await rt.container_status(cid)  # observing the container advances it
    lines = (await trio.Path(st.log_path).read_text()).splitlines()
    assert [line.split(" ", 3)[3] for line in lines] == ["one", "two"]


async def test_probes_exec_http_tcp(autojump_clock: trio.testing.MockClock) -> None:
    rt = SimulatedRuntime(
        behaviours={
            "api": Behaviour(http_status=503, ports=(8080,)),
            "probed": Behaviour(exec={"/bin/check": ExecResult(b"ok\n", b"", 0)}),
        }
    )
    sandbox = await new_sandbox(rt)
    ip = (await rt.pod_sandbox_status(sandbox[0])).ip
    assert ip.startswith("10.88.")
    web = await start(rt, sandbox, "web", "httpd", "-f", "-p", "8000")
    await start(rt, sandbox, "api")
    probed = await start(rt, sandbox, "probed")
    assert rt.http_get(ip, 8000, "/healthz") == 200
    assert rt.http_get(ip, 8080) == 503
    assert rt.http_get(ip, 9999) is None
    assert rt.tcp_connect(ip, 8000)
    assert not rt.tcp_connect(ip, 1234)
    assert (await rt.exec_sync(probed, ["/bin/check"], 1)).stdout == b"ok\n"
    r = await rt.exec_sync(web, ["wget", "-q", "-O-", "http://localhost:8000/"], 1)
    assert r.exit_code == 0
    await rt.stop_container(web, 0)
    assert rt.http_get(ip, 8000) is None


async def test_ips_are_released_and_network_switch(autojump_clock: trio.testing.MockClock) -> None:
    rt = SimulatedRuntime(network_ready=False)
    assert not (await rt.status()).network_ready
    with pytest.raises(RuntimeFailure, match="cni plugin not initialized"):
        await new_sandbox(rt)
    host = await rt.run_pod_sandbox(sandbox_config("h", host_network=True))
    assert (await rt.pod_sandbox_status(host)).ip == ""
    rt.network_ready = True
    a, _ = await new_sandbox(rt, "a")
    ip_a = (await rt.pod_sandbox_status(a)).ip
    await rt.remove_pod_sandbox(a)
    b, _ = await new_sandbox(rt, "b")
    assert (await rt.pod_sandbox_status(b)).ip == ip_a


async def test_unavailable(autojump_clock: trio.testing.MockClock) -> None:
    rt = SimulatedRuntime()
    rt.set_available(False)
    with pytest.raises(Unavailable):
        await rt.version()
    rt.set_available(True)
    assert (await rt.version()).runtime_name == "simulated"
