"""The agent on the in-process server with the simulated runtime: pods run with the right
status, env and volumes reach the runtime, init containers run in order, restart policies."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio
from agent.agentharness import (
    FACTS,
    NODE,
    admin,
    container,
    cstatus,
    phase,
    pod,
    running_agent,
    wait_pod,
)
from api.apiharness import Harness

from orchestrator.agent.agent import SECRETS
from orchestrator.controllers.runtime.client import CONFIGMAPS, NODES, PODS
from orchestrator.cri.runtime import ContainerConfig
from orchestrator.cri.simulated import Behaviour, SimulatedRuntime

Obj = dict[str, Any]


async def test_pod_runs_with_status(h: Harness, tmp_path: Path) -> None:
    rt = SimulatedRuntime()
    a = admin(h)
    with trio.fail_after(60):
        async with running_agent(a, rt, tmp_path) as agent:
            await agent.reporter.registered.wait()
            node = await a.get(NODES, NODE)
            assert node["metadata"]["labels"]["kubernetes.io/hostname"] == NODE
            assert node["metadata"]["labels"]["site"] == "lab"
            ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
            assert (ready["status"], ready["reason"]) == ("True", "KubeletReady")
            assert node["status"]["capacity"]["pods"] == "110"
            assert node["status"]["nodeInfo"]["containerRuntimeVersion"] == "simulated://0.1.0"

            await a.create(PODS, pod("web", container("app", "sleep", "infinity")), "default")
            p = await wait_pod(a, "web", lambda p: phase(p) == "Running")
            st = p["status"]
            assert st["hostIP"] == FACTS.internal_ip
            assert st["podIP"].startswith("10.88.")
            assert st["startTime"]
            conds = {c["type"]: c["status"] for c in st["conditions"]}
            assert conds == {
                "PodScheduled": "True",
                "Initialized": "True",
                "ContainersReady": "True",
                "Ready": "True",
            }
            cs = cstatus(p, "app")
            assert cs["ready"]
            assert cs["started"]
            assert cs["restartCount"] == 0
            assert cs["state"]["running"]["startedAt"]
            assert cs["containerID"].startswith("simulated://")
            assert cs["imageID"].startswith("sha256:")
            assert cs["image"] == "localhost/busybox:1"
            log_dir = tmp_path / "pods" / f"default_web_{p['metadata']['uid']}"
            assert (log_dir / "app" / "0.log").exists()


def configs(rt: SimulatedRuntime, name: str) -> list[Any]:
    """The ContainerConfigs the runtime was given for containers named `name`, by attempt (the
    simulated runtime keeps them; no public accessor yet)."""
    found = [c.config for c in rt._containers.values() if c.config.name == name]
    return sorted(found, key=lambda cfg: cfg.attempt)


async def test_env_from_configmap_secret_and_downward_api(h: Harness, tmp_path: Path) -> None:
    rt = SimulatedRuntime()
    a = admin(h)
    await a.create(
        CONFIGMAPS,
        {"metadata": {"name": "cfg"}, "data": {"MODE": "edge", "LEVEL": "3"}},
        "default",
    )
    await a.create(
        SECRETS,
        {"metadata": {"name": "creds"}, "data": {"PASSWORD": base64.b64encode(b"s3cr3t").decode()}},
        "default",
    )
    c = container(
        "app",
        "sh",
        "-c",
        "echo $(GREETING)",
        env=[
            {"name": "GREETING", "value": "hello-$(POD_NAME)"},
            {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "MODE"}}},
            {
                "name": "PASSWORD",
                "valueFrom": {"secretKeyRef": {"name": "creds", "key": "PASSWORD"}},
            },
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        ],
        envFrom=[{"configMapRef": {"name": "cfg"}, "prefix": "CFG_"}],
        workingDir="/work",
        resources={"requests": {"cpu": "250m"}, "limits": {"cpu": "500m", "memory": "64Mi"}},
    )
    c["command"] = ["sleep", "infinity"]
    c["args"] = ["$(MODE)"]
    with trio.fail_after(60):
        async with running_agent(a, rt, tmp_path):
            # GREETING is defined before POD_NAME: $(POD_NAME) stays as written (as upstream)
            await a.create(PODS, pod("envy", c), "default")
            p = await wait_pod(a, "envy", lambda p: phase(p) == "Running")
    cfg = configs(rt, "app")[0]
    env = dict(cfg.envs)
    assert env["MODE"] == "edge"
    assert env["PASSWORD"] == "s3cr3t"
    assert env["POD_NAME"] == "envy"
    assert env["POD_NS"] == "default"
    assert env["POD_UID"] == p["metadata"]["uid"]
    assert env["POD_IP"] == p["status"]["podIP"]
    assert env["NODE"] == NODE
    assert env["CFG_LEVEL"] == "3"
    assert env["GREETING"] == "hello-$(POD_NAME)"
    assert cfg.args == ("edge",)
    assert cfg.working_dir == "/work"
    assert cfg.log_path == "app/0.log"
    assert cfg.resources is not None
    assert cfg.resources.cpu_shares == 256
    assert (cfg.resources.cpu_quota, cfg.resources.cpu_period) == (50_000, 100_000)
    assert cfg.resources.memory_limit_in_bytes == 64 * 1024**2
    assert cfg.labels["io.kubernetes.pod.uid"] == p["metadata"]["uid"]


async def test_volumes_materialised(h: Harness, tmp_path: Path) -> None:
    rt = SimulatedRuntime()
    a = admin(h)
    await a.create(
        CONFIGMAPS, {"metadata": {"name": "site"}, "data": {"a.conf": "x=1", "b": "2"}}, "default"
    )
    await a.create(
        SECRETS,
        {"metadata": {"name": "tls"}, "data": {"key.pem": base64.b64encode(b"KEY").decode()}},
        "default",
    )
    host_dir = tmp_path / "host" / "data"
    c = container(
        "app",
        "sleep",
        "infinity",
        volumeMounts=[
            {"name": "scratch", "mountPath": "/scratch"},
            {"name": "conf", "mountPath": "/etc/app"},
            {"name": "certs", "mountPath": "/certs"},
            {"name": "host", "mountPath": "/data", "readOnly": True},
        ],
    )
    volumes = [
        {"name": "scratch", "emptyDir": {}},
        {
            "name": "conf",
            "configMap": {"name": "site", "items": [{"key": "a.conf", "path": "app.conf"}]},
        },
        {"name": "certs", "secret": {"secretName": "tls", "defaultMode": 0o400}},
        {"name": "host", "hostPath": {"path": str(host_dir), "type": "DirectoryOrCreate"}},
    ]
    with trio.fail_after(60):
        async with running_agent(a, rt, tmp_path / "agent"):
            await a.create(PODS, pod("vols", c, volumes=volumes), "default")
            p = await wait_pod(a, "vols", lambda p: phase(p) == "Running")
            mounts = {m.container_path: m for m in configs(rt, "app")[0].mounts}
            check_volumes(mounts, tmp_path / "agent", p["metadata"]["uid"], host_dir)


def check_volumes(mounts: dict[str, Any], data_dir: Path, uid: str, host_dir: Path) -> None:
    """Blocking file checks, out of the async test."""
    base = data_dir / "pods" / f"default_vols_{uid}" / "volumes"
    assert Path(mounts["/scratch"].host_path) == base / "kubernetes.io~empty-dir" / "scratch"
    assert Path(mounts["/scratch"].host_path).is_dir()
    assert not mounts["/scratch"].readonly
    conf = Path(mounts["/etc/app"].host_path)
    assert (conf / "app.conf").read_text() == "x=1"
    assert not (conf / "b").exists()  # items select keys
    assert mounts["/etc/app"].readonly
    certs = Path(mounts["/certs"].host_path)
    assert (certs / "key.pem").read_bytes() == b"KEY"  # base64-decoded
    assert (certs / "key.pem").stat().st_mode & 0o777 == 0o400
    assert mounts["/data"].host_path == str(host_dir)
    assert mounts["/data"].readonly
    assert host_dir.is_dir()


async def test_init_containers_run_in_order_before_containers(h: Harness, tmp_path: Path) -> None:
    order: list[str] = []

    def behaviour(cfg: ContainerConfig) -> Behaviour | None:
        order.append(cfg.name)
        return Behaviour(run_for=0.2, exit_code=0) if cfg.name.startswith("init") else None

    rt = SimulatedRuntime(behaviours=behaviour)
    a = admin(h)
    spec = pod("inits", container("main", "sleep", "infinity"))
    spec["spec"]["initContainers"] = [container("init-1"), container("init-2")]
    with trio.fail_after(60):
        async with running_agent(a, rt, tmp_path):
            await a.create(PODS, spec, "default")
            pending = await wait_pod(
                a, "inits", lambda p: bool(cstatus(p, "init-1", init=True).get("state"))
            )
            assert phase(pending) == "Pending"
            p = await wait_pod(a, "inits", lambda p: phase(p) == "Running")
    assert order == ["init-1", "init-2", "main"]
    for name in ("init-1", "init-2"):
        term = cstatus(p, name, init=True)["state"]["terminated"]
        assert (term["exitCode"], term["reason"]) == (0, "Completed")
    conds = {c["type"]: c["status"] for c in p["status"]["conditions"]}
    assert conds["Initialized"] == "True"


async def test_restart_policy_never_and_on_failure(h: Harness, tmp_path: Path) -> None:
    rt = SimulatedRuntime(
        behaviours={
            "ok": Behaviour(run_for=0.1, exit_code=0),
            "bad": Behaviour(run_for=0.1, exit_code=3),
            "flaky": Behaviour(run_for=0.1, exit_code=1, healthy_attempts_from=2),
        }
    )
    a = admin(h)
    with trio.fail_after(60):
        async with running_agent(a, rt, tmp_path):
            await a.create(PODS, pod("done", container("ok"), restartPolicy="Never"), "default")
            await a.create(PODS, pod("fail", container("bad"), restartPolicy="Never"), "default")
            await a.create(
                PODS, pod("onfail", container("flaky"), restartPolicy="OnFailure"), "default"
            )
            done = await wait_pod(a, "done", lambda p: phase(p) == "Succeeded")
            fail = await wait_pod(a, "fail", lambda p: phase(p) == "Failed")
            onfail = await wait_pod(
                a,
                "onfail",
                lambda p: (
                    cstatus(p, "flaky").get("restartCount") == 2
                    and "running" in cstatus(p, "flaky")["state"]
                ),
            )
            assert phase(onfail) == "Running"
            assert (
                onfail["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] == 1
            )
            await trio.sleep(0.5)  # nothing restarts a finished pod
            assert (
                cstatus(await wait_pod(a, "done", phase_is("Succeeded")), "ok")["restartCount"] == 0
            )
    assert cstatus(done, "ok")["state"]["terminated"]["reason"] == "Completed"
    assert cstatus(fail, "bad")["state"]["terminated"]["exitCode"] == 3
    assert {c["type"]: c.get("reason") for c in fail["status"]["conditions"]}[
        "Ready"
    ] == "PodCompleted"
    assert len(configs(rt, "ok")) == 1
    assert len(configs(rt, "bad")) == 1


def phase_is(want: str) -> Callable[[Obj], bool]:
    return lambda p: phase(p) == want
