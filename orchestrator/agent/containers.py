"""One container of a pod, as its worker (`agent.podworker`) creates and stops it.

`container_config` builds the runtime's `ContainerConfig` for a container of the pod spec: the
command and args with `$(VAR)` expanded from its environment (`agent.podspec.container_env`),
its mounts (`agent.volumes`), resources, and the labels the agent's relist finds it by
(`LABEL_AGENT`, `LABEL_POD_UID`, ...). Its log goes to `{name}/{attempt}.log` under the
sandbox's log directory. A problem with the spec is a `ContainerWaiting`
(CreateContainerConfigError) for the worker to report.

`stop_container` stops a running container within the pod's grace period: the preStop exec hook
first (a FailedPreStopHook event when it fails), then the runtime's stop with what is left of
the grace period.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import trio

from orchestrator.agent.podcontext import RUNTIME_TIMEOUT, WorkerContext
from orchestrator.agent.podspec import (
    LABEL_AGENT,
    LABEL_CONTAINER_KIND,
    LABEL_CONTAINER_NAME,
    LABEL_POD_NAME,
    LABEL_POD_NAMESPACE,
    LABEL_POD_UID,
    ContainerWaiting,
    container_env,
    expand,
    linux_resources,
    meta_of,
)
from orchestrator.agent.volumes import container_mounts
from orchestrator.cri.runtime import ContainerConfig, ContainerStatus, CriError, RuntimeService
from orchestrator.kube.objects import Obj

__all__ = ["container_config", "stop_container"]


async def container_config(
    ctx: WorkerContext, pod: Obj, c: Obj, kind: str, attempt: int, pod_ip: str
) -> ContainerConfig:
    m = meta_of(pod)
    name = str(c.get("name", ""))
    env = await container_env(ctx, pod, c, pod_ip)
    mounts = await container_mounts(ctx, pod, c)
    labels = {
        LABEL_AGENT: ctx.node_name,
        LABEL_POD_UID: str(m.get("uid", "")),
        LABEL_POD_NAME: str(m.get("name", "")),
        LABEL_POD_NAMESPACE: str(m.get("namespace", "")),
        LABEL_CONTAINER_NAME: name,
        LABEL_CONTAINER_KIND: kind,
    }
    try:
        resources = linux_resources(c)
    except ValueError as exc:
        raise ContainerWaiting("CreateContainerConfigError", f"invalid resources: {exc}") from None
    return ContainerConfig(
        name=name,
        image=str(c.get("image", "")),
        attempt=attempt,
        command=tuple(expand(str(x), env) for x in c.get("command") or []),
        args=tuple(expand(str(x), env) for x in c.get("args") or []),
        working_dir=str(c.get("workingDir") or ""),
        envs=env,
        mounts=tuple(mounts),
        labels=labels,
        log_path=f"{name}/{attempt}.log",
        resources=resources,
        stdin=bool(c.get("stdin")),
        tty=bool(c.get("tty")),
    )


async def stop_container(
    rt: RuntimeService,
    cs: ContainerStatus,
    spec: Obj | None,
    deadline: float,
    event: Callable[[str, str, str], None],
) -> None:
    """Stop `cs` by trio time `deadline`, running the preStop exec hook of its `spec` first;
    `event(type, reason, message)` records an event on the pod."""
    pre_stop = ((spec or {}).get("lifecycle") or {}).get("preStop") or {}
    command = (pre_stop.get("exec") or {}).get("command")
    if command:
        left = deadline - trio.current_time()
        with trio.move_on_after(max(0.0, left)):
            try:
                res = await rt.exec_sync(cs.id, [str(x) for x in command], max(1.0, left))
                if res.exit_code != 0:
                    event(
                        "Warning",
                        "FailedPreStopHook",
                        f"PreStopHook failed: exit code {res.exit_code}: "
                        + (res.stdout + res.stderr).decode("utf-8", "replace").strip(),
                    )
            except CriError as exc:
                event("Warning", "FailedPreStopHook", f"PreStopHook failed: {exc}")
    left = max(0, math.ceil(deadline - trio.current_time()))
    with trio.fail_after(left + RUNTIME_TIMEOUT):
        await rt.stop_container(cs.id, left)
