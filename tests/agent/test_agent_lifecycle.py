"""Agent lifecycle: CrashLoopBackOff delays grow, runtime rejections surface as waiting reasons,
graceful deletion, and edge autonomy (restart with the server unreachable)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
from agent.agentharness import (
    NODE,
    admin,
    as_node,
    container,
    cstatus,
    get_pod,
    phase,
    pod,
    running_agent,
    wait_for,
    wait_pod,
)
from api.apiharness import Harness

from orchestrator.controllers.runtime.client import CONFIGMAPS, EVENTS, PODS
from orchestrator.cri.runtime import ContainerState
from orchestrator.cri.simulated import Behaviour, SimulatedRuntime
from orchestrator.kube.errors import ApiError

Obj = dict[str, Any]


def waiting(p: Obj, name: str) -> tuple[str, str]:
    w = cstatus(p, name).get("state", {}).get("waiting") or {}
    return str(w.get("reason", "")), str(w.get("message", ""))


async def test_crash_loop_backoff_grows(h: Harness, tmp_path: Path) -> None:
    rt = SimulatedRuntime(behaviours={"app": Behaviour(run_for=0.05, exit_code=1)})
    a = admin(h)
    seen: list[str] = []
    with trio.fail_after(60):
        async with running_agent(a, rt, tmp_path, backoff_initial=0.2, backoff_max=0.8):
            await a.create(PODS, pod("crash", container("app")), "default")
            uid = ""
            while len(seen) < 4:
                p = await get_pod(a, "crash")
                assert p is not None
                uid = p["metadata"]["uid"]
                reason, message = waiting(p, "app")
                restarts = cstatus(p, "app").get("restartCount", 0)
                if reason == "CrashLoopBackOff" and len(seen) < restarts:
                    seen.append(message)  # the back-off after the restarts-th exit
                await trio.sleep(0.01)
            p = await get_pod(a, "crash")
            assert p is not None
    delays = [m.split()[1] for m in seen]
    assert delays == ["200ms", "400ms", "800ms", "800ms"]  # doubling, capped
    assert seen[0] == f"back-off 200ms restarting failed container=app pod=crash_default({uid})"
    cs = cstatus(p, "app")
    assert cs["restartCount"] >= 3
    assert cs["lastState"]["terminated"]["exitCode"] == 1
    assert phase(p) == "Running"  # restartPolicy Always: the pod keeps running
    # only the current and the previous container of a name are kept
    assert len([c for c in rt._containers.values() if c.config.name == "app"]) <= 2


async def test_create_container_error_is_a_waiting_reason(h: Harness, tmp_path: Path) -> None:
    rt = SimulatedRuntime(
        behaviours={"bad": Behaviour(create_error="invalid mount: /nope is not absolute")}
    )
    a = admin(h)
    with trio.fail_after(60):
        async with running_agent(a, rt, tmp_path) as agent:
            await a.create(
                PODS,
                pod("rejected", container("good", "sleep", "infinity"), container("bad")),
                "default",
            )
            p = await wait_pod(
                a, "rejected", lambda p: waiting(p, "bad")[0] == "CreateContainerError"
            )
            assert waiting(p, "bad")[1] == "invalid mount: /nope is not absolute"
            assert "running" in await_state(p, "good")
            assert phase(p) == "Pending"
            await a.create(
                PODS,
                pod(
                    "neverpull",
                    container("x", image="registry.example/absent:1", imagePullPolicy="Never"),
                ),
                "default",
            )
            q = await wait_pod(a, "neverpull", lambda p: waiting(p, "x")[0] == "ErrImageNeverPull")
            assert "is not present with pull policy of Never" in waiting(q, "x")[1]
            await a.create(
                PODS,
                pod("nocm", container("x", envFrom=[{"configMapRef": {"name": "missing"}}])),
                "default",
            )
            r = await wait_pod(
                a, "nocm", lambda p: waiting(p, "x")[0] == "CreateContainerConfigError"
            )
            assert waiting(r, "x")[1] == 'configmap "missing" not found'

            async def has_event() -> bool:
                events = await a.list(EVENTS, "default")
                return any(
                    e.get("reason") == "Failed" and "invalid mount" in e.get("message", "")
                    for e in events["items"]
                )

            await wait_for(has_event)
            assert not agent_task_failed(agent)


def await_state(p: Obj, name: str) -> Obj:
    return dict(cstatus(p, name).get("state") or {})


def agent_task_failed(agent: Any) -> bool:
    return not agent.workers  # every pod still has its worker: nothing crashed


async def test_graceful_delete_stops_then_removes(h: Harness, tmp_path: Path) -> None:
    rt = SimulatedRuntime()
    a = admin(h)
    spec = pod(
        "bye",
        container(
            "app",
            "sleep",
            "infinity",
            lifecycle={"preStop": {"exec": {"command": ["touch", "/tmp/prestop"]}}},
        ),
        terminationGracePeriodSeconds=1,
    )
    with trio.fail_after(60):
        async with running_agent(a, rt, tmp_path) as agent:
            await a.create(PODS, spec, "default")
            p = await wait_pod(a, "bye", lambda p: phase(p) == "Running")
            uid = p["metadata"]["uid"]
            cid = cstatus(p, "app")["containerID"].split("://", 1)[1]
            sim = rt._containers[cid]
            deleted = await a.delete(PODS, "bye", "default")
            assert deleted["metadata"].get("deletionTimestamp")  # graceful: waits for the node

            async def gone() -> bool:
                return await get_pod(a, "bye") is None

            await wait_for(gone)
            assert sim.state == ContainerState.EXITED  # stopped ...
            assert "/tmp/prestop" in sim.files  # ... after its preStop hook ran
            assert cid not in rt._containers  # ... then removed, with the sandbox
            assert not await rt.list_pod_sandbox(labels={"io.kubernetes.pod.uid": uid})
            assert not (tmp_path / "pods" / f"default_bye_{uid}").exists()
            assert uid not in {sp.uid for sp in await agent.store.pods()}  # type: ignore[union-attr]


class Unreachable:
    """A `Client` whose server is down: every call fails with 503."""

    def _down(self) -> ApiError:
        return ApiError(503, "ServiceUnavailable", "connection refused")

    async def get(self, *args: Any, **kw: Any) -> Obj:
        raise self._down()

    list = create = update = patch = apply = delete = get

    async def bind(self, *args: Any, **kw: Any) -> None:
        raise self._down()

    def watch(self, *args: Any, **kw: Any) -> Any:
        raise self._down()


async def test_restart_with_server_down_restores_pods(h: Harness, tmp_path: Path) -> None:
    a = admin(h)
    await a.create(CONFIGMAPS, {"metadata": {"name": "cfg"}, "data": {"MODE": "edge"}}, "default")
    rt = SimulatedRuntime()
    c = container(
        "app",
        "sleep",
        "infinity",
        env=[{"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "MODE"}}}],
    )
    with trio.fail_after(60):
        async with running_agent(as_node(h), rt, tmp_path):
            await a.create(PODS, pod("keep", c), "default")
            drop = pod("drop", container("x", "sleep", "infinity"), terminationGracePeriodSeconds=1)
            await a.create(PODS, drop, "default")
            await wait_pod(a, "keep", lambda p: phase(p) == "Running")
            await wait_pod(a, "drop", lambda p: phase(p) == "Running")
        # The host reboots (nothing runs any more) while the server is unreachable.
        rebooted = SimulatedRuntime()
        async with running_agent(Unreachable(), rebooted, tmp_path) as agent:  # type: ignore[arg-type]

            async def both_running() -> bool:
                running = {
                    cfg.name
                    for cfg in (x.config for x in rebooted._containers.values())
                    if rebooted._containers
                }
                return running >= {"app", "x"}

            await wait_for(both_running)
            app = next(x for x in rebooted._containers.values() if x.config.name == "app")
            assert dict(app.config.envs)["MODE"] == "edge"  # from the local copy
            assert not agent.connected
        # The server comes back; "drop" was deleted meanwhile (force: the node was away).
        await a.delete(PODS, "drop", "default", grace_period_seconds=0)
        async with running_agent(as_node(h), rebooted, tmp_path) as agent:
            await agent.synced.wait()

            async def drop_stopped() -> bool:
                return not any(x.config.name == "x" for x in rebooted._containers.values())

            await wait_for(drop_stopped)
            keep = await wait_pod(a, "keep", lambda p: phase(p) == "Running")
            assert cstatus(keep, "app")["ready"]
    assert NODE
