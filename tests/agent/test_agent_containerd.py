"""The node agent on a real containerd (the session's private daemon, `cri.containerd_env`).

Each test runs the in-process API server with its embedded agent (`AgentConfig(runtime=
"containerd")`, its own node name, so the agents of different tests never sweep each other's
sandboxes) and drives it as a user would: pods created through the API, `kubectl logs` and
`kubectl delete` against the server's kubeconfig. What the runtime really did is checked through
a separate `CriRuntime` on the same socket, and HTTP goes to the pod IP on the fixture's CNI
bridge.

The agent's CrashLoopBackOff base is shortened to 0.5 s (`WorkerOptions.backoff_initial`; the
production default stays 10 s, doubling to 300 s) so the crash-loop test sees several growing
delays in seconds.

Skipped with the reason when containerd cannot run here; failed under ORCH_REQUIRE_CONTAINERD=1
(CI). Waiting is polling with deadlines, never a fixed sleep.
"""

from __future__ import annotations

import ipaddress
import re
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from agent.agentharness import container, cstatus, get_pod, phase, wait_for, wait_pod
from api.apiharness import Harness, api_server
from cri import containerd_env
from e2e.kubectlrun import Kubectl, kubectl_binary
from sim.simharness import ADMIN, api_of

from orchestrator.agent import Agent, AgentOptions, WorkerOptions
from orchestrator.agent.podspec import LABEL_AGENT, LABEL_POD_UID
from orchestrator.agent.service import AgentConfig
from orchestrator.controllers.runtime.client import PODS
from orchestrator.controllers.runtime.inprocess import InProcessClient
from orchestrator.cri.containerd import CriRuntime
from orchestrator.cri.runtime import ContainerState, SandboxState
from orchestrator.kube.errors import ApiError
from orchestrator.testing.containerd import ContainerdInstance

pytestmark = pytest.mark.slow

containerd = containerd_env.containerd
containerd_instance = containerd_env.containerd_instance

Obj = dict[str, Any]
IMAGE = "localhost/busybox:1"
HTTPD = "mkdir -p /www; echo hello > /www/index.html; httpd -f -p 8080 -h /www"
WORKER = WorkerOptions(backoff_initial=0.5, backoff_max=4.0, resync_interval=2.0, error_retry=0.5)


# ---------------------------------------------------------------------------------- helpers
@pytest.fixture
def node(request: pytest.FixtureRequest) -> str:
    """A node name of this test's own (the agent label its sandboxes carry)."""
    return "ctd-" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40]


@pytest.fixture
async def cri(containerd: str, node: str) -> AsyncIterator[CriRuntime]:
    """A CRI client of our own, to check the runtime; sweeps the test's sandboxes afterwards."""
    rt = CriRuntime(containerd, call_timeout=20.0)
    try:
        yield rt
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(60):
            for sb in await rt.list_pod_sandbox(labels={LABEL_AGENT: node}):
                await rt.stop_pod_sandbox(sb.id)
                await rt.remove_pod_sandbox(sb.id)
        await rt.aclose()


def agent_config(containerd: str, node: str) -> AgentConfig:
    return AgentConfig(
        runtime="containerd",
        containerd_socket=containerd,
        node_name=node,
        kubelet_port=0,
        worker=WORKER,
    )


@asynccontextmanager
async def cluster(containerd: str, node: str, data_dir: Path) -> AsyncIterator[Harness]:
    """The in-process server with its embedded agent on containerd, system namespaces ready."""
    async with api_server(data_dir, agent=agent_config(containerd, node)) as h:
        with trio.fail_after(30):
            url = "/api/v1/namespaces/kube-node-lease"
            while (await h.client.get(url)).status_code != 200:  # noqa: ASYNC110  (polling)
                await trio.sleep(0.02)
        yield h


def admin(h: Harness) -> InProcessClient:
    return InProcessClient(api_of(h), ADMIN)


def pod(node: str, name: str, *containers: Obj, **spec: Any) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 2,
            "containers": list(containers),
            **spec,
        },
    }


def shell(name: str, script: str, **extra: Any) -> Obj:
    return container(name, "sh", "-c", script, image=IMAGE, imagePullPolicy="Never", **extra)


def web_pod(node: str, name: str) -> Obj:
    probe = {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1, "failureThreshold": 1}
    return pod(node, name, shell("web", HTTPD, readinessProbe=probe))


def ready(p: Obj) -> bool:
    conds = {c["type"]: c["status"] for c in (p.get("status") or {}).get("conditions") or []}
    return phase(p) == "Running" and conds.get("Ready") == "True"


def terminated(p: Obj, name: str) -> Obj:
    cs = cstatus(p, name)
    return dict(
        (cs.get("state") or {}).get("terminated") or cs.get("lastState", {}).get("terminated") or {}
    )


async def http_get(url: str, within: float = 20.0) -> str:
    """GET `url` until it answers 200 (the server may still be binding)."""
    async with httpx.AsyncClient(trust_env=False, timeout=2.0) as client:
        with trio.fail_after(within):
            while True:
                try:
                    r = await client.get(url)
                    if r.status_code == 200:
                        return r.text
                except httpx.TransportError:
                    pass
                await trio.sleep(0.1)


async def running_containers(cri: CriRuntime, uid: str) -> dict[str, str]:
    """{container name: id} of the pod's running containers, as the runtime lists them."""
    listed = await cri.list_containers(labels={LABEL_POD_UID: uid})
    return {c.name: c.id for c in listed if c.state == ContainerState.RUNNING}


def kubectl(h: Harness, tmp_path: Path) -> Kubectl:
    (tmp_path / "kube-cache").mkdir(exist_ok=True)
    return Kubectl(kubectl_binary(), h.kubeconfig, tmp_path / "kube-cache", tmp_path)


async def run_kubectl(k: Kubectl, *args: str, within: float = 60.0) -> str:
    """Run kubectl without blocking the event loop (the server runs in this process)."""
    with trio.fail_after(within):
        proc = await trio.run_process(
            k.argv(*args), capture_stdout=True, capture_stderr=True, env=k.env(), check=False
        )
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert proc.returncode == 0, f"kubectl {' '.join(args)}: exit {proc.returncode}\n{out}{err}"
    return out


async def poll(check: Callable[[], Awaitable[bool]], within: float = 30.0) -> None:
    await wait_for(check, within)


# ---------------------------------------------------------------------------------- scenarios
async def test_http_server_reachable_on_pod_ip_with_readiness(
    containerd: str,
    containerd_instance: ContainerdInstance,
    cri: CriRuntime,
    node: str,
    tmp_path: Path,
) -> None:
    with trio.fail_after(90):
        async with cluster(containerd, node, tmp_path) as h:
            a = admin(h)
            await a.create(PODS, web_pod(node, "web"), "default")
            p = await wait_pod(a, "web", ready, within=60)
            ip = p["status"]["podIP"]
            assert ipaddress.ip_address(ip) in containerd_instance.subnet
            cs = cstatus(p, "web")
            assert cs["ready"]
            assert cs["started"]
            assert "running" in cs["state"]
            assert cs["containerID"].startswith("containerd://")
            assert "sha256:" in cs["imageID"]
            assert await http_get(f"http://{ip}:8080/") == "hello\n"
            # the same server the probe saw: the container the runtime reports, running
            running = await running_containers(cri, p["metadata"]["uid"])
            assert running == {"web": cs["containerID"].split("://", 1)[1]}
            # readiness follows the server: kill httpd's content -> 404 -> not ready
            cid = running["web"]
            res = await cri.exec_sync(cid, ["rm", "/www/index.html"], timeout_seconds=10)
            assert res.exit_code == 0, res
            await wait_pod(a, "web", lambda p: not ready(p) and phase(p) == "Running")


async def test_crash_loop_backoff_delays_grow(
    containerd: str, cri: CriRuntime, node: str, tmp_path: Path
) -> None:
    seen: list[str] = []
    with trio.fail_after(120):
        async with cluster(containerd, node, tmp_path) as h:
            a = admin(h)
            await a.create(PODS, pod(node, "crash", shell("app", "exit 1")), "default")
            last: Obj | None = None
            while "4s" not in seen:
                last = await get_pod(a, "crash")
                assert last is not None
                w = (cstatus(last, "app").get("state") or {}).get("waiting") or {}
                if w.get("reason") == "CrashLoopBackOff":
                    delay = str(w["message"]).split()[1]
                    if not seen or seen[-1] != delay:
                        seen.append(delay)
                await trio.sleep(0.05)
            assert last is not None
            uid = last["metadata"]["uid"]
            assert re.fullmatch(
                rf"back-off \S+ restarting failed container=app pod=crash_default\({uid}\)",
                str(cstatus(last, "app")["state"]["waiting"]["message"]),
            )
            cs = cstatus(last, "app")
            assert cs["restartCount"] >= 3
            assert cs["lastState"]["terminated"]["exitCode"] == 1
            assert cs["lastState"]["terminated"]["reason"] == "Error"
            assert phase(last) == "Running"  # restartPolicy Always
            # at most the current and the previous container of the name are kept
            listed = await cri.list_containers(labels={LABEL_POD_UID: uid})
            assert 1 <= len(listed) <= 2
    # The delays double from 500ms up to the 4s cap. The relist (every 1 s) may notice an exit
    # only after a short delay already ran out (the restart is then immediate), so short
    # delays can go unseen; those seen grow, in the series' order, up to the cap.
    series = ["500ms", "1s", "2s", "4s"]
    assert all(d in series for d in seen), seen
    assert [series.index(d) for d in seen] == sorted({series.index(d) for d in seen}), seen
    assert len(seen) >= 2, seen


async def test_memory_limit_oom_killed(containerd: str, node: str, tmp_path: Path) -> None:
    hog = shell(
        "hog",
        "x=a; while :; do x=$x$x; done",  # doubles a shell string until the cgroup kills it
        resources={"limits": {"memory": "16Mi"}},
    )
    with trio.fail_after(90):
        async with cluster(containerd, node, tmp_path) as h:
            a = admin(h)
            await a.create(PODS, pod(node, "hog", hog, restartPolicy="Never"), "default")
            p = await wait_pod(a, "hog", lambda p: phase(p) == "Failed", within=60)
    t = terminated(p, "hog")
    assert t["reason"] == "OOMKilled", p["status"]
    assert t["exitCode"] == 137
    assert cstatus(p, "hog")["restartCount"] == 0


async def test_logs_via_kubectl(containerd: str, node: str, tmp_path: Path) -> None:
    chatty = shell("app", "echo one; echo two; echo three; sleep 3600")
    ticker = shell("tick", "i=0; while :; do echo tick $i; i=$((i+1)); sleep 0.2; done")
    with trio.fail_after(120):
        async with cluster(containerd, node, tmp_path) as h:
            a = admin(h)
            await a.create(PODS, pod(node, "chatty", chatty, ticker), "default")
            await wait_pod(a, "chatty", ready, within=60)
            k = kubectl(h, tmp_path)

            async def all_logged() -> bool:
                out = await run_kubectl(k, "logs", "chatty", "-c", "app")
                return out == "one\ntwo\nthree\n"

            await poll(all_logged)
            assert await run_kubectl(k, "logs", "chatty", "-c", "app", "--tail=1") == "three\n"
            stamped = await run_kubectl(k, "logs", "chatty", "-c", "app", "--timestamps")
            assert re.fullmatch(r"(\S+Z (one|two|three)\n){3}", stamped), stamped
            # follow: new lines keep arriving until we stop kubectl
            proc = await trio.lowlevel.open_process(
                k.argv("logs", "-f", "chatty", "-c", "tick", "--tail=1"),
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=k.env(),
            )
            try:
                assert proc.stdout is not None
                got = b""
                with trio.fail_after(30):
                    while got.count(b"\n") < 6:
                        chunk = await proc.stdout.receive_some(4096)
                        assert chunk, f"kubectl logs -f ended early: {got!r}"
                        got += chunk
            finally:
                proc.kill()
                await proc.wait()
            numbers = [int(line.split()[1]) for line in got.decode().splitlines()[:6]]
            assert numbers == list(range(numbers[0], numbers[0] + 6)), got


async def test_delete_stops_everything(
    containerd: str, cri: CriRuntime, node: str, tmp_path: Path
) -> None:
    with trio.fail_after(120):
        async with cluster(containerd, node, tmp_path) as h:
            a = admin(h)
            spec = pod(node, "bye", shell("a", "sleep 3600"), shell("b", HTTPD))
            await a.create(PODS, spec, "default")
            p = await wait_pod(a, "bye", ready, within=60)
            uid = p["metadata"]["uid"]
            assert set(await running_containers(cri, uid)) == {"a", "b"}
            k = kubectl(h, tmp_path)
            out = await run_kubectl(k, "delete", "pod", "bye")  # waits until the pod is gone
            assert out.strip() == 'pod "bye" deleted'
            assert await get_pod(a, "bye") is None
            # the node said so only after stopping and removing everything
            assert not await cri.list_containers(labels={LABEL_POD_UID: uid})
            assert not await cri.list_pod_sandbox(labels={LABEL_POD_UID: uid})
            assert not list((tmp_path / "agent" / "pods").glob(f"*_{uid}"))


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


async def test_agent_restart_with_server_down(
    containerd: str, cri: CriRuntime, node: str, tmp_path: Path
) -> None:
    with trio.fail_after(180):
        # 1. the server and its agent run a web pod
        async with cluster(containerd, node, tmp_path) as h:
            a = admin(h)
            await a.create(PODS, web_pod(node, "web"), "default")
            p = await wait_pod(a, "web", ready, within=60)
        uid, ip = p["metadata"]["uid"], p["status"]["podIP"]
        cid = cstatus(p, "web")["containerID"].split("://", 1)[1]
        url = f"http://{ip}:8080/"
        # 2. server and agent are gone: the pod keeps serving
        assert await running_containers(cri, uid) == {"web": cid}
        assert await http_get(url) == "hello\n"
        # 3. a new agent starts while the server is still down
        options = AgentOptions(node, tmp_path / "agent", worker=WORKER, kubelet_port=0)
        runtime = CriRuntime(containerd, call_timeout=20.0)
        try:
            agent = Agent(Unreachable(), runtime, options)
            async with trio.open_nursery() as nursery:
                await nursery.start(agent.run)
                assert agent.workers
                assert not agent.connected
                worker = next(iter(agent.workers.values()))
                await poll(lambda: _synced(worker))
                # adopted, not re-created: the same container still serves
                assert await running_containers(cri, uid) == {"web": cid}
                assert await http_get(url) == "hello\n"
                # the container dies while the server is down: the agent restarts it
                await cri.stop_container(cid, 0)

                async def restarted() -> bool:
                    now = await running_containers(cri, uid)
                    return "web" in now and now["web"] != cid

                await poll(restarted)
                assert await http_get(url) == "hello\n"
                sandboxes = await cri.list_pod_sandbox(labels={LABEL_POD_UID: uid})
                assert [s.state for s in sandboxes] == [SandboxState.READY]  # the same sandbox
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await runtime.aclose()
        new_cid = (await running_containers(cri, uid))["web"]
        # 4. the server comes back (same data dir) with its agent: the status is reported
        async with cluster(containerd, node, tmp_path) as h:
            a = admin(h)

            def reported(p: Obj) -> bool:
                cs = cstatus(p, "web")
                return (
                    ready(p)
                    and cs.get("restartCount", 0) >= 1
                    and cs.get("containerID") == f"containerd://{new_cid}"
                )

            p = await wait_pod(a, "web", reported, within=60)
            assert p["metadata"]["uid"] == uid
            assert p["status"]["podIP"] == ip
            assert cstatus(p, "web")["lastState"]["terminated"]["exitCode"] == 137
            assert await running_containers(cri, uid) == {"web": new_cid}
            assert await http_get(url) == "hello\n"


async def _synced(worker: Any) -> bool:
    return bool(worker.syncs)
