"""Agent tests: the in-process API server, a `SimulatedRuntime`, and an `Agent` acting as a node
through an in-process client (NodeRestriction applies), with short intervals and back-offs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
from api.apiharness import Harness
from sim.simharness import ADMIN, api_of

from orchestrator.agent import Agent, AgentOptions, HostFacts, WorkerOptions, node_client
from orchestrator.controllers.runtime.client import PODS, Client
from orchestrator.controllers.runtime.inprocess import InProcessClient
from orchestrator.cri.simulated import SimulatedRuntime
from orchestrator.kube.errors import ApiError

Obj = dict[str, Any]
NODE = "edge-1"
FACTS = HostFacts(
    hostname=NODE,
    internal_ip="192.0.2.10",
    cpus=4,
    memory_bytes=8 * 1024**3,
    arch="amd64",
    kernel="6.1.0-test",
    os_image="Test Linux",
    machine_id="0" * 32,
    boot_id="b" * 32,
)


def agent_options(data_dir: Path, **worker: Any) -> AgentOptions:
    w = {"backoff_initial": 0.2, "backoff_max": 1.0, "resync_interval": 1.0, "error_retry": 0.2}
    w.update(worker)
    return AgentOptions(
        NODE,
        data_dir,
        labels={"site": "lab"},
        relist_interval=0.05,
        renew_interval=0.2,
        status_interval=0.2,
        worker=WorkerOptions(**w),
    )


@asynccontextmanager
async def running_agent(
    client: Client, runtime: SimulatedRuntime, data_dir: Path, **worker: Any
) -> AsyncIterator[Agent]:
    agent = Agent(client, runtime, agent_options(data_dir, **worker), facts=FACTS)
    async with trio.open_nursery() as nursery:
        await nursery.start(agent.run)
        yield agent
        nursery.cancel_scope.cancel()


def admin(h: Harness) -> InProcessClient:
    return InProcessClient(api_of(h), ADMIN)


def as_node(h: Harness) -> InProcessClient:
    return node_client(api_of(h), NODE)


def pod(name: str, *containers: Obj, **spec: Any) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
        "spec": {"nodeName": NODE, "containers": list(containers), **spec},
    }


def container(name: str, *command: str, image: str = "localhost/busybox:1", **extra: Any) -> Obj:
    c: Obj = {"name": name, "image": image, **extra}
    if command:
        c["command"] = list(command)
    return c


async def get_pod(client: Client, name: str) -> Obj | None:
    try:
        return await client.get(PODS, name, "default")
    except ApiError as exc:
        if exc.code == 404:
            return None
        raise


async def wait_pod(
    client: Client, name: str, check: Callable[[Obj], bool], within: float = 20.0
) -> Obj:
    """Poll the pod until `check(pod)` holds (fails after `within` seconds)."""
    last: Obj | None = None
    with trio.move_on_after(within):
        while True:
            last = await get_pod(client, name)
            if last is not None and check(last):
                return last
            await trio.sleep(0.02)
    raise AssertionError(f"pod {name} never satisfied the condition; last: {last}")


async def wait_for(predicate: Callable[[], Awaitable[bool]], within: float = 20.0) -> None:
    with trio.fail_after(within):
        while not await predicate():  # noqa: ASYNC110  (polling state; no event to wait on)
            await trio.sleep(0.02)


def phase(p: Obj) -> str:
    return str((p.get("status") or {}).get("phase") or "")


def cstatus(p: Obj, name: str, *, init: bool = False) -> Obj:
    key = "initContainerStatuses" if init else "containerStatuses"
    for cs in (p.get("status") or {}).get(key) or []:
        if cs["name"] == name:
            return dict(cs)
    return {}
