"""`SimulatedRuntime`: a `RuntimeService` whose containers "run" in memory.

For the benchmark harness and fast agent tests: no processes, no threads, no network; it passes
the same conformance suite as `CriRuntime` (tests/cri/conformance.py).

Theory of operation
-------------------
A started container is a *timeline*, computed once when it starts, of events at offsets from its
start: log lines, files created or removed (what exec probes look at), and at most one exit (code,
reason). Nothing runs in the background: every call that observes a container first *advances*
it to the current trio time (`trio.current_time()`, so `MockClock` drives it), applying the events
that are due: lines are appended to its log file (CRI format, stamped with the event's own time),
files change, and a due exit turns it EXITED with `finished_at` at the exit's time. The one
consequence: a log line due after start appears in the file on the next call that looks at the
container (the agent relists every second anyway); lines due at start are written by
`start_container` itself.

Where the timeline comes from, first match wins:
1. `behaviours`: a `Behaviour` for the container's name, else for its image (or a callable
   `(ContainerConfig) -> Behaviour | None`); it says how long it runs, the exit code, OOMKilled,
   a create or start failure, log lines, exec answers, whether it answers HTTP probes.
2. Otherwise the command is read as a tiny busybox shell, enough for the scripts tests and
   examples use: `sleep N|infinity`, `echo ...` (with `>&2`, `> file`, `>> file`), `touch F`,
   `rm [-f] F`, `exit N`, `true`, `false`, `httpd [-f] [-p PORT]` (serves until stopped),
   `trap ... TERM`, `sh -c SCRIPT`, joined with `;`, `&&`, `||` or newlines. Anything else is
   taken as a command that succeeds at once. No command at all: runs until stopped.

`stop_container(grace)`: a main process that handles SIGTERM (a script with `trap ... TERM`, or a
`Behaviour` without `ignore_sigterm`) exits 143 at once; any other command (PID 1 without a
handler ignores SIGTERM, as observed with busybox on containerd) runs on until the grace period
ends, or until its own exit if sooner, and is then killed: 137. `exec_sync` answers from the
behaviour's table, else interprets the command the same way (`cat F` reads the container's files,
`sleep N` past the timeout raises `DeadlineExceeded`, an unknown binary is a `RuntimeFailure` as
with runc).

Sandboxes: pod-network sandboxes get an IP from `pod_cidr` (10.88.0.0/16 by default, until the
agent sets its node's podCIDR through `update_runtime_config`; `simstate.PodIps`), released on
removal; host-network ones get none. Pod-network sandboxes fail while `network_ready` is off.

The network is simulated too, and nothing here ever opens a socket: the pod IPs are made up and
may well be real hosts on the user's network. `probe_network` (the `SimulatedNetwork` capability
the agent's prober uses instead of dialling) answers an httpGet or tcpSocket probe from the
containers running in the probed container's own sandbox (or, for a probe that names another
host, in the sandbox that owns that IP; any other host refuses). `http_get(ip, port, path)` and
`tcp_connect(ip, port)` answer the same way by IP (`wget` in `exec_sync` uses the former).
`set_available(False)` makes every call raise `Unavailable`, as a stopped runtime does.

Parts: `cri.simshell` (behaviours, the tiny shell, timelines; pure), `cri.simstate` (per
sandbox/container state, log records, the simulated network and exec); this module keeps the
runtime itself (the `RuntimeService` calls, advancing containers, sandboxes and IPs, images).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Final, TypeVar

import trio

from orchestrator.cri.runtime import (
    NETWORK_READY,
    RUNTIME_READY,
    Container,
    ContainerConfig,
    ContainerState,
    ContainerStatus,
    ExecResult,
    ImageInfo,
    NetworkAnswer,
    NetworkProbe,
    NotFound,
    PodSandbox,
    PodSandboxConfig,
    Resources,
    RuntimeCondition,
    RuntimeFailure,
    RuntimeStatus,
    RuntimeVersion,
    SandboxState,
    SandboxStatus,
    Unavailable,
)
from orchestrator.cri.simshell import Behaviour, BehaviourSource, timeline_of
from orchestrator.cri.simstate import (
    PodIndex,
    PodIps,
    SimContainer,
    SimSandbox,
    accepts,
    format_cri_log_line,
    http_status,
    run_exec,
)

__all__ = ["DEFAULT_IMAGES", "Behaviour", "SimulatedRuntime", "format_cri_log_line"]

DEFAULT_IMAGES: Final = ("localhost/busybox:1", "localhost/pause:1")
_E = TypeVar("_E", SimSandbox, SimContainer)


class SimulatedRuntime:
    """An in-memory `RuntimeService` (see the module docstring)."""

    def __init__(
        self,
        *,
        start_latency: float = 0.0,
        behaviours: BehaviourSource | None = None,
        images: Sequence[str] = DEFAULT_IMAGES,
        pod_cidr: str = "10.88.0.0/16",
        network_ready: bool = True,
        rng: random.Random | None = None,
        epoch: float | None = None,
    ) -> None:
        self.start_latency = start_latency
        self.behaviours = behaviours
        self.network_ready = network_ready
        self._rng = rng if rng is not None else random.Random(0)
        self._epoch = epoch
        self._t0: float | None = None
        self._available = True
        self._images: dict[str, ImageInfo] = {}
        for ref in images:
            self._add_image(ref)
        self.ips = PodIps(pod_cidr)
        self._sandboxes: dict[str, SimSandbox] = {}
        self._containers: dict[str, SimContainer] = {}
        self._pods = PodIndex()  # the ids of each pod's sandboxes and containers

    # ------------------------------------------------------------------ sim-only controls

    def set_available(self, available: bool) -> None:
        """While False, every call raises Unavailable (the runtime is "down")."""
        self._available = available

    def add_image(self, ref: str) -> None:
        self._add_image(ref)

    def http_get(self, ip: str, port: int, path: str = "/") -> int | None:
        """Status code a GET to a running container at (ip, port) gets; None: refused."""
        return http_status(self._running_at(ip), port)

    def tcp_connect(self, ip: str, port: int) -> bool:
        """Whether a running container at `ip` accepts a connection on `port`."""
        return accepts(self._running_at(ip), port)

    async def probe_network(self, probe: NetworkProbe) -> NetworkAnswer:
        """Answer a probe of container `probe.container_id` from the simulation (module doc);
        no packet is sent. NotFound for an unknown container."""
        await self._enter()
        c = self._container(probe.container_id)
        if probe.own_address:
            running = self._running_in({c.sandbox_id})
        else:  # another host: a simulated pod's IP, or nobody
            running = self._running_at(probe.host) if probe.host else iter(())
        if probe.protocol == "http":
            status = http_status(running, probe.port)
            return NetworkAnswer(status is not None, status or 0)
        return NetworkAnswer(accepts(running, probe.port))

    def _running_at(self, ip: str) -> Iterator[SimContainer]:
        return self._running_in({s.id for s in self._sandboxes.values() if s.ip and s.ip == ip})

    def _running_in(self, sandboxes: set[str]) -> Iterator[SimContainer]:
        for c in list(self._containers.values()):
            if c.sandbox_id in sandboxes:
                self._advance(c)
                if c.state == ContainerState.RUNNING:
                    yield c

    # ------------------------------------------------------------------ helpers

    async def _enter(self) -> None:
        await trio.lowlevel.checkpoint()
        if not self._available:
            raise Unavailable("simulated runtime unavailable (set_available(False))")

    def _now_ns(self) -> int:
        mono = trio.current_time()
        if self._t0 is None:
            self._t0 = mono
            if self._epoch is None:
                self._epoch = time.time()
        assert self._epoch is not None
        return int((self._epoch + (mono - self._t0)) * 1e9)

    def _mono_to_ns(self, mono: float) -> int:
        self._now_ns()
        assert self._epoch is not None
        assert self._t0 is not None
        return int((self._epoch + (mono - self._t0)) * 1e9)

    def _new_id(self) -> str:
        return f"{self._rng.getrandbits(256):064x}"

    def _add_image(self, ref: str) -> ImageInfo:
        digest = "sha256:" + hashlib.sha256(ref.encode()).hexdigest()
        info = ImageInfo(id=digest, repo_tags=(ref,), size=2_000_000)
        self._images[ref] = info
        return info

    def _find_image(self, ref: str) -> ImageInfo | None:
        if ref in self._images:
            return self._images[ref]
        for info in self._images.values():
            if ref == info.id:
                return info
        return None

    def _behaviour(self, config: ContainerConfig) -> Behaviour | None:
        src = self.behaviours
        if src is None:
            return None
        if callable(src):
            return src(config)
        return src.get(config.name) or src.get(config.image)

    def _write_log(self, c: SimContainer, ts_ns: int, stream: str, data: bytes) -> None:
        if not c.log_path:
            return
        text = data.decode(errors="replace")
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        with open(c.log_path, "a", encoding="utf-8") as f:  # small local appends
            for line in lines:
                f.write(format_cri_log_line(ts_ns, stream, line))

    def _advance(self, c: SimContainer) -> None:
        """Apply the events of a running container's timeline that are due by now."""
        if c.state != ContainerState.RUNNING:
            return
        elapsed = trio.current_time() - c.started_mono
        tl = c.timeline
        while c.next_event < len(tl.events) and tl.events[c.next_event][0] <= elapsed:
            t, kind, arg, data = tl.events[c.next_event]
            c.next_event += 1
            if t > tl.exit_at:
                break
            self._apply(c, c.started_mono + t, kind, arg, data)
        if tl.exit_at <= elapsed:
            self._exit(c, c.started_mono + tl.exit_at, tl.exit_code, tl.reason)

    def _apply(self, c: SimContainer, mono: float, kind: str, arg: str, data: bytes) -> None:
        if kind == "log":
            self._write_log(c, self._mono_to_ns(mono), arg, data)
        elif kind == "write":
            c.files[arg] = data
        elif kind == "append":
            c.files[arg] = c.files.get(arg, b"") + data
        elif kind == "rm":
            c.files.pop(arg, None)

    def _exit(self, c: SimContainer, mono: float, code: int, reason: str = "") -> None:
        c.state = ContainerState.EXITED
        c.finished_at = self._mono_to_ns(mono)
        c.exit_code = code
        c.reason = reason or ("Completed" if code == 0 else "Error")

    def _select(self, table: dict[str, _E], labels: Mapping[str, str] | None) -> list[_E]:
        """The entries of `table` a list filtered by `labels` must look at (in creation
        order): one pod's, when the filter names a pod."""
        ids = self._pods.narrow(labels)
        if ids is None:
            return list(table.values())
        return [table[i] for i in ids if i in table]

    def _sandbox(self, sandbox_id: str) -> SimSandbox:
        try:
            return self._sandboxes[sandbox_id]
        except KeyError:
            raise NotFound(
                f'an error occurred when try to find sandbox "{sandbox_id}": not found'
            ) from None

    def _container(self, container_id: str) -> SimContainer:
        try:
            c = self._containers[container_id]
        except KeyError:
            raise NotFound(
                f'an error occurred when try to find container "{container_id}": not found'
            ) from None
        self._advance(c)
        return c

    # ------------------------------------------------------------------ runtime

    async def version(self) -> RuntimeVersion:
        await self._enter()
        return RuntimeVersion("0.1.0", "simulated", "0.1.0", "v1")

    async def status(self) -> RuntimeStatus:
        await self._enter()
        net = RuntimeCondition(NETWORK_READY, True)
        if not self.network_ready:
            net = RuntimeCondition(
                NETWORK_READY,
                False,
                "NetworkPluginNotReady",
                "Network plugin returns error: cni plugin not initialized",
            )
        return RuntimeStatus((RuntimeCondition(RUNTIME_READY, True), net))

    async def update_runtime_config(self, pod_cidr: str) -> None:
        await self._enter()
        if pod_cidr:
            self.ips.set_network(pod_cidr)

    # ------------------------------------------------------------------ sandboxes

    async def run_pod_sandbox(self, config: PodSandboxConfig, runtime_handler: str = "") -> str:
        await self._enter()
        if runtime_handler:
            raise RuntimeFailure(f'no runtime for "{runtime_handler}" is configured')
        key = (config.name, config.namespace, config.uid, config.attempt)
        for s in self._sandboxes.values():
            c = s.config
            if (c.name, c.namespace, c.uid, c.attempt) == key:
                name = f"{config.name}_{config.namespace}_{config.uid}_{config.attempt}"
                raise RuntimeFailure(
                    f'failed to reserve sandbox name "{name}": name "{name}" is reserved for '
                    f'"{s.id}"'
                )
        if config.host_network and config.hostname:
            raise RuntimeFailure(
                "failed to create containerd task: runc create failed: unable to start container "
                "process: unable to set hostname without a private UTS namespace"
            )
        if not config.host_network and not self.network_ready:
            raise RuntimeFailure("failed to setup network for sandbox: cni plugin not initialized")
        ip = "" if config.host_network else self.ips.allocate()
        sid = self._new_id()
        self._sandboxes[sid] = SimSandbox(sid, config, SandboxState.READY, self._now_ns(), ip)
        self._pods.add(sid, config.labels)
        if config.log_directory:
            os.makedirs(config.log_directory, exist_ok=True)
        return sid

    async def stop_pod_sandbox(self, sandbox_id: str) -> None:
        await self._enter()
        s = self._sandboxes.get(sandbox_id)
        if s is None:
            return
        now = trio.current_time()
        for c in self._containers.values():
            if c.sandbox_id == sandbox_id:
                self._advance(c)
                if c.state == ContainerState.RUNNING:
                    self._exit(c, now, 137)
        s.state = SandboxState.NOTREADY

    async def remove_pod_sandbox(self, sandbox_id: str) -> None:
        await self._enter()
        s = self._sandboxes.pop(sandbox_id, None)
        if s is None:
            return
        self._pods.discard(sandbox_id, s.config.labels)
        for cid in [c.id for c in self._containers.values() if c.sandbox_id == sandbox_id]:
            self._pods.discard(cid, self._containers.pop(cid).config.labels)
        if s.ip:
            self.ips.release(s.ip)

    async def pod_sandbox_status(self, sandbox_id: str) -> SandboxStatus:
        await self._enter()
        s = self._sandbox(sandbox_id)
        c = s.config
        return SandboxStatus(
            id=s.id,
            name=c.name,
            namespace=c.namespace,
            uid=c.uid,
            attempt=c.attempt,
            state=s.state,
            created_at=s.created_at,
            ip=s.ip,
            host_network=c.host_network,
            labels=dict(c.labels),
            annotations=dict(c.annotations),
        )

    async def list_pod_sandbox(
        self,
        *,
        sandbox_id: str | None = None,
        state: SandboxState | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> list[PodSandbox]:
        await self._enter()
        out = []
        for s in self._select(self._sandboxes, labels):
            c = s.config
            if sandbox_id and s.id != sandbox_id:
                continue
            if state is not None and s.state != state:
                continue
            if labels and any(c.labels.get(k) != v for k, v in labels.items()):
                continue
            out.append(
                PodSandbox(
                    id=s.id,
                    name=c.name,
                    namespace=c.namespace,
                    uid=c.uid,
                    attempt=c.attempt,
                    state=s.state,
                    created_at=s.created_at,
                    labels=dict(c.labels),
                    annotations=dict(c.annotations),
                )
            )
        return out

    # ------------------------------------------------------------------ containers

    async def create_container(
        self, sandbox_id: str, config: ContainerConfig, sandbox_config: PodSandboxConfig
    ) -> str:
        await self._enter()
        s = self._sandbox(sandbox_id)
        if s.state != SandboxState.READY:
            raise RuntimeFailure(f'sandbox container "{sandbox_id}" is not running')
        image = self._find_image(config.image)
        if image is None:
            raise RuntimeFailure(
                f'failed to get image "{config.image}": image "{config.image}": not found'
            )
        for other in self._containers.values():
            if (
                other.sandbox_id == sandbox_id
                and other.config.name == config.name
                and other.config.attempt == config.attempt
            ):
                name = f"{config.name}_{s.config.name}_{s.config.namespace}_{config.attempt}"
                raise RuntimeFailure(
                    f'failed to reserve container name "{name}": name "{name}" is reserved for '
                    f'"{other.id}"'
                )
        behaviour = self._behaviour(config)
        if behaviour is not None and behaviour.create_error:
            raise RuntimeFailure(behaviour.create_error)
        log_path = ""
        if s.config.log_directory and config.log_path:
            log_path = os.path.join(s.config.log_directory, config.log_path)
            os.makedirs(os.path.dirname(log_path), exist_ok=True)
        cid = self._new_id()
        self._containers[cid] = SimContainer(
            id=cid,
            sandbox_id=sandbox_id,
            config=config,
            behaviour=behaviour,
            image_ref=image.id,
            log_path=log_path,
            created_at=self._now_ns(),
            resources=config.resources,
        )
        self._pods.add(cid, config.labels)
        return cid

    async def start_container(self, container_id: str) -> None:
        await self._enter()
        c = self._container(container_id)
        if c.state != ContainerState.CREATED:
            raise RuntimeFailure(
                f'failed to start container "{container_id}": container is in {c.state.name} state'
            )
        b = c.behaviour
        latency = b.start_latency if b is not None and b.start_latency is not None else None
        latency = self.start_latency if latency is None else latency
        if latency > 0:
            await trio.sleep(latency)
        if c.id not in self._containers or c.state != ContainerState.CREATED:
            raise RuntimeFailure(f'container "{container_id}" was removed while starting')
        if b is not None and b.start_error:
            c.state = ContainerState.EXITED
            c.finished_at = self._now_ns()
            c.exit_code, c.reason, c.message = 128, "StartError", b.start_error
            raise RuntimeFailure(b.start_error)
        c.timeline = timeline_of(c.config, c.behaviour)
        c.state = ContainerState.RUNNING
        c.started_mono = trio.current_time()
        c.started_at = self._now_ns()
        self._write_log(c, 0, "stdout", b"")  # creates the (empty) log file
        self._advance(c)

    async def stop_container(self, container_id: str, grace_period: int) -> None:
        await self._enter()
        c = self._containers.get(container_id)
        if c is None:
            return
        self._advance(c)
        if c.state == ContainerState.CREATED:
            self._exit(c, trio.current_time(), 0)
            c.reason = "Error" if c.reason == "Completed" else c.reason
            return
        if c.state != ContainerState.RUNNING:
            return
        if c.timeline.handles_term:
            self._exit(c, trio.current_time(), 143)
            return
        remaining = c.started_mono + c.timeline.exit_at - trio.current_time()
        if grace_period > 0:
            await trio.sleep(max(0.0, min(float(grace_period), remaining)))
        self._advance(c)
        if c.state == ContainerState.RUNNING:
            self._exit(c, trio.current_time(), 137)

    async def remove_container(self, container_id: str) -> None:
        await self._enter()
        c = self._containers.pop(container_id, None)
        if c is not None:
            self._pods.discard(container_id, c.config.labels)

    async def container_status(self, container_id: str) -> ContainerStatus:
        await self._enter()
        c = self._container(container_id)
        cfg = c.config
        return ContainerStatus(
            id=c.id,
            name=cfg.name,
            attempt=cfg.attempt,
            state=c.state,
            created_at=c.created_at,
            started_at=c.started_at,
            finished_at=c.finished_at,
            exit_code=c.exit_code,
            reason=c.reason,
            message=c.message,
            image=cfg.image,
            image_ref=c.image_ref,
            log_path=c.log_path,
            labels=dict(cfg.labels),
            annotations=dict(cfg.annotations),
        )

    async def list_containers(
        self,
        *,
        container_id: str | None = None,
        sandbox_id: str | None = None,
        state: ContainerState | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> list[Container]:
        await self._enter()
        out = []
        for c in self._select(self._containers, labels):
            self._advance(c)
            cfg = c.config
            if container_id and c.id != container_id:
                continue
            if sandbox_id and c.sandbox_id != sandbox_id:
                continue
            if state is not None and c.state != state:
                continue
            if labels and any(cfg.labels.get(k) != v for k, v in labels.items()):
                continue
            out.append(
                Container(
                    id=c.id,
                    sandbox_id=c.sandbox_id,
                    name=cfg.name,
                    attempt=cfg.attempt,
                    image=cfg.image,
                    image_ref=c.image_ref,
                    state=c.state,
                    created_at=c.created_at,
                    labels=dict(cfg.labels),
                    annotations=dict(cfg.annotations),
                )
            )
        return out

    async def exec_sync(
        self, container_id: str, cmd: Sequence[str], timeout_seconds: float = 0
    ) -> ExecResult:
        await self._enter()
        c = self._container(container_id)
        if c.state != ContainerState.RUNNING:
            raise RuntimeFailure(
                f'failed to exec in container: container "{container_id}" is in '
                f"{c.state.name} state"
            )
        if not cmd:
            raise RuntimeFailure("ExecSync: command must not be empty")
        if c.behaviour is not None and " ".join(cmd) in c.behaviour.exec:
            return c.behaviour.exec[" ".join(cmd)]
        return await run_exec(c, cmd, timeout_seconds, lambda: self._running_in({c.sandbox_id}))

    async def update_container_resources(self, container_id: str, resources: Resources) -> None:
        await self._enter()
        c = self._container(container_id)
        if c.state == ContainerState.EXITED:
            raise RuntimeFailure(f'container "{container_id}" is not running or created')
        c.resources = dataclasses.replace(resources)

    # ------------------------------------------------------------------ images

    async def image_status(self, image: str) -> ImageInfo | None:
        await self._enter()
        return self._find_image(image)

    async def pull_image(self, image: str) -> str:
        await self._enter()
        info = self._find_image(image) or self._add_image(image)
        return info.id

    async def list_images(self) -> list[ImageInfo]:
        await self._enter()
        return list(self._images.values())

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()
