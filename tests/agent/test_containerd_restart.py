"""containerd going away and coming back under a running agent.

A private containerd of this test's own (`ContainerdInstance(network="auto")`, not the shared
session daemon, since this test stops it): the in-process server with its embedded agent runs a
pod on it; containerd is stopped (its shims killed: the pod's processes die with it) — the agent
keeps running and the Node turns NotReady with the runtime's reason; containerd is started again
on the same state dir — the agent reconnects, the Node is Ready again and the pod Running again
(its sandbox may be recreated).

Skipped when containerd cannot run here; failed under ORCH_REQUIRE_CONTAINERD=1 (CI).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
import trio
from agent.agentharness import container, phase, wait_pod
from api.apiharness import api_server
from sim.simharness import ADMIN, api_of

from orchestrator.agent import WorkerOptions
from orchestrator.agent.service import AgentConfig
from orchestrator.controllers.runtime.client import NODES, PODS
from orchestrator.controllers.runtime.inprocess import InProcessClient
from orchestrator.kube.errors import ApiError
from orchestrator.testing.containerd import (
    ContainerdError,
    ContainerdInstance,
    missing_prerequisites,
)

pytestmark = pytest.mark.slow

Obj = dict[str, Any]
IMAGE = "localhost/busybox:1"
NODE = "ctd-restart"
WORKER = WorkerOptions(backoff_initial=0.5, backoff_max=2.0, resync_interval=1.0, error_retry=0.5)


def _unavailable(reason: str) -> None:
    if os.environ.get("ORCH_REQUIRE_CONTAINERD") == "1":
        pytest.fail(f"ORCH_REQUIRE_CONTAINERD=1 but containerd is unavailable: {reason}")
    pytest.skip(f"containerd unavailable: {reason}")


@pytest.fixture
def own_containerd() -> Any:
    """A containerd of this test's own, stopped and removed afterwards."""
    if os.geteuid() != 0:
        _unavailable("not root")
    problems = missing_prerequisites()
    if problems:
        _unavailable("; ".join(problems))
    base = Path(tempfile.mkdtemp(prefix="orch-ctd-restart-"))
    instance = ContainerdInstance(base, network="auto")
    try:
        instance.start()
    except ContainerdError as exc:
        _unavailable(str(exc))
    try:
        yield instance
    finally:
        instance.stop()
        instance.remove()


def node_ready(node: Obj) -> tuple[str, str]:
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return str(c.get("status")), str(c.get("message") or "")
    return "", ""


async def test_agent_survives_containerd_restart(
    own_containerd: ContainerdInstance, tmp_path: Path
) -> None:
    config = AgentConfig(
        runtime="containerd",
        containerd_socket=str(own_containerd.socket),
        node_name=NODE,
        kubelet_port=0,
        worker=WORKER,
    )
    spec = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "sleeper", "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": 1,
            "containers": [container("c", "sleep", "3600", image=IMAGE, imagePullPolicy="Never")],
        },
    }
    with trio.fail_after(150):
        async with api_server(tmp_path, agent=config) as h:
            a = InProcessClient(api_of(h), ADMIN)
            with trio.fail_after(30):
                while True:
                    try:
                        await a.get(NODES, NODE)
                        await a.create(PODS, spec, "default")
                        break
                    except ApiError:
                        await trio.sleep(0.1)
            first = await wait_pod(a, "sleeper", lambda p: phase(p) == "Running", within=60)

            async def node_state(want: str, within: float) -> str:
                with trio.move_on_after(within):
                    while True:
                        status, message = node_ready(await a.get(NODES, NODE))
                        if status == want:
                            return message
                        await trio.sleep(0.2)
                raise AssertionError(f"node {NODE} not Ready={want} within {within} s")

            await node_state("True", 30)
            await trio.to_thread.run_sync(lambda: own_containerd.stop(teardown=False))
            message = await node_state("False", 40)
            assert "runtime" in message
            await trio.sleep(2)  # the agent keeps running meanwhile (no crash of the server)
            await trio.to_thread.run_sync(own_containerd.start)
            await node_state("True", 40)

            def running_again(p: Obj) -> bool:
                statuses = (p.get("status") or {}).get("containerStatuses") or []
                return (
                    phase(p) == "Running"
                    and bool(statuses)
                    and "running" in (statuses[0].get("state") or {})
                    and statuses[0].get("containerID") != first_id
                )

            first_id = first["status"]["containerStatuses"][0]["containerID"]
            again = await wait_pod(a, "sleeper", running_again, within=60)
            assert again["metadata"]["uid"] == first["metadata"]["uid"]
