"""`--runtime auto`: containerd only when its socket exists and answers, else the simulated
runtime with a WARNING and the Node label `orchestrator.dev/runtime=simulated`."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest
import trio

from orchestrator.agent.runtimes import RUNTIME_LABEL, choose_runtime, detect_runtime
from orchestrator.cli.main import _build_parser
from orchestrator.cri.simulated import SimulatedRuntime


async def test_no_socket_means_simulated_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    missing = str(tmp_path / "containerd.sock")
    assert await detect_runtime(missing) == ("simulated", f"no containerd socket at {missing}")
    labels = {"zone": "a"}
    with caplog.at_level(logging.WARNING, logger="orchestrator.agent.service"):
        kind, runtime = await choose_runtime("auto", missing, labels)
    assert kind == "simulated"
    assert isinstance(runtime, SimulatedRuntime)
    assert labels == {"zone": "a", RUNTIME_LABEL: "simulated"}
    assert any("SIMULATED" in r.getMessage() for r in caplog.records)


async def test_a_socket_that_does_not_answer_means_simulated(tmp_path: Path) -> None:
    path = tmp_path / "c.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)  # accepts connections but never speaks gRPC
    try:
        start = trio.current_time()
        kind, why = await detect_runtime(str(path))
        assert kind == "simulated"
        assert "does not answer" in why
        assert trio.current_time() - start < 5
    finally:
        listener.close()


async def test_explicit_runtimes_are_not_probed(tmp_path: Path) -> None:
    labels: dict[str, str] = {}
    kind, runtime = await choose_runtime("simulated", None, labels)
    assert (kind, labels) == ("simulated", {RUNTIME_LABEL: "simulated"})
    await runtime.aclose()
    labels = {}
    kind, runtime = await choose_runtime("containerd", str(tmp_path / "none.sock"), labels)
    assert (kind, labels) == ("containerd", {})  # no probe: the agent waits for it instead
    await runtime.aclose()


def test_auto_is_the_default(tmp_path: Path) -> None:
    parser = _build_parser()
    assert parser.parse_args(["server", "--data-dir", str(tmp_path)]).runtime == "auto"
    args = parser.parse_args(["agent", "--data-dir", str(tmp_path)])
    assert args.runtime == "auto"
    assert args.lease_renew_interval == 10.0
