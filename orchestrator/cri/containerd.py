"""`CriRuntime`: the `RuntimeService` over CRI `runtime.v1` gRPC (containerd's CRI plugin).

Theory of operation
-------------------
grpcio's asyncio API does not run under trio, so every RPC is a *synchronous* stub call made in a
worker thread: `trio.to_thread.run_sync(stub.Method, request, timeout=T)`, through a dedicated
`CapacityLimiter` (16 by default) so CRI traffic neither starves nor is starved by other thread
users. A gRPC deadline (`timeout=`) is passed on **every** call: trio cannot interrupt a thread
that is inside a call, so the deadline is what really bounds it; a cancelled trio caller waits
for the thread to return (at most that deadline) and then sees the cancellation.

Deadlines: `call_timeout` for ordinary calls; `long_call_timeout` for image pulls and for
`exec_sync` without a timeout of its own; an `exec_sync` with `timeout_seconds` sends that (whole
seconds, rounded up) to containerd, which enforces it, and uses it plus `call_timeout` as the gRPC
deadline.

Connection: one channel (`unix://<socket>`), created lazily; stubs are thread-safe. When a call
fails with UNAVAILABLE (containerd not started yet, restarted, crashed) the channel is replaced by
a new one, because an old channel may sit in a long reconnect back-off after the daemon comes
back. Idempotent calls (status, list, stop, remove, version, image status, resource updates) are
then retried a bounded number of times with exponential back-off; calls that create something
(run/create/start, exec, pull) are not retried, since the first attempt may have taken effect
before the daemon died. Retired channels are closed once no call can still be using them.

Errors (`grpc.StatusCode` → `orchestrator.cri.runtime`):
- NOT_FOUND → `NotFound`, except on stop/remove, where it means "already gone" → success;
- UNAVAILABLE (and CANCELLED because a channel was closed) → `Unavailable`;
- DEADLINE_EXCEEDED → `DeadlineExceeded`;
- anything else (containerd mostly answers UNKNOWN) → `RuntimeFailure` with containerd's text.

Conversions between the plain dataclasses and protobuf messages are plain functions at the
bottom of this module; no protobuf type crosses the `RuntimeService` boundary.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TypeVar

import grpc
import trio

from orchestrator.cri.gen import cri_api_pb2 as pb
from orchestrator.cri.gen import cri_api_pb2_grpc as _pb_grpc
from orchestrator.cri.runtime import (
    Container,
    ContainerConfig,
    ContainerState,
    ContainerStatus,
    CriError,
    DeadlineExceeded,
    ExecResult,
    ImageInfo,
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

__all__ = ["DEFAULT_SOCKET", "CriRuntime"]

pb_grpc: Any = _pb_grpc  # generated without type hints (the messages have a .pyi, the stubs not)

DEFAULT_SOCKET: Final = "/run/containerd/containerd.sock"
CRI_API_VERSION: Final = "v1"
_MAX_MESSAGE: Final = 32 * 1024 * 1024  # ExecSync answers carry up to 16 MiB per stream

T = TypeVar("T")


class CriRuntime:
    """A `RuntimeService` talking CRI to containerd on a unix socket."""

    def __init__(
        self,
        socket_path: str | os.PathLike[str] = DEFAULT_SOCKET,
        *,
        call_timeout: float = 10.0,
        long_call_timeout: float = 600.0,
        limiter: trio.CapacityLimiter | None = None,
        retries: int = 3,
        retry_backoff: float = 0.2,
    ) -> None:
        self.socket_path = os.fspath(socket_path)
        self.call_timeout = call_timeout
        self.long_call_timeout = long_call_timeout
        self.retries = retries
        self.retry_backoff = retry_backoff
        self._limiter = limiter if limiter is not None else trio.CapacityLimiter(16)
        self._channel: grpc.Channel | None = None
        self._runtime: Any = None  # pb_grpc.RuntimeServiceStub (untyped generated code)
        self._images: Any = None  # pb_grpc.ImageServiceStub
        self._generation = 0
        # channels replaced after UNAVAILABLE, with the trio time after which no call uses them
        self._retired: list[tuple[float, grpc.Channel]] = []
        self._closed = False

    def __repr__(self) -> str:
        return f"CriRuntime({self.socket_path!r})"

    # ------------------------------------------------------------------ connection

    def _stubs(self) -> tuple[int, Any, Any]:
        if self._closed:
            raise Unavailable(f"{self!r} is closed")
        if self._retired:
            now = trio.current_time()
            keep = []
            for until, ch in self._retired:
                if until <= now:
                    ch.close()
                else:
                    keep.append((until, ch))
            self._retired = keep
        if self._channel is None:
            self._channel = grpc.insecure_channel(
                f"unix://{self.socket_path}",
                options=[
                    ("grpc.max_receive_message_length", _MAX_MESSAGE),
                    ("grpc.max_send_message_length", _MAX_MESSAGE),
                    # A new channel must really reconnect: with the process-wide subchannel
                    # pool it would inherit the old connection's back-off.
                    ("grpc.use_local_subchannel_pool", 1),
                ],
            )
            self._runtime = pb_grpc.RuntimeServiceStub(self._channel)
            self._images = pb_grpc.ImageServiceStub(self._channel)
            self._generation += 1
        return self._generation, self._runtime, self._images

    def _reconnect(self, generation: int) -> None:
        """Replace the channel that failed (unless a concurrent call already did)."""
        if generation != self._generation or self._channel is None:
            return
        until = trio.current_time() + self.long_call_timeout + 1.0
        self._retired.append((until, self._channel))
        self._channel = self._runtime = self._images = None

    async def aclose(self) -> None:
        self._closed = True
        channels = [ch for _, ch in self._retired]
        if self._channel is not None:
            channels.append(self._channel)
        self._channel = self._runtime = self._images = None
        self._retired = []
        for ch in channels:
            ch.close()
        await trio.lowlevel.checkpoint()

    async def __aenter__(self) -> CriRuntime:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ the call path

    async def _call(
        self,
        method: str,
        request: Any,
        *,
        image: bool = False,
        deadline: float | None = None,
        idempotent: bool = False,
        gone_ok: bool = False,
    ) -> Any:
        """Run one unary RPC in a worker thread; map its errors; retry idempotent calls."""
        timeout = self.call_timeout if deadline is None else deadline
        attempt = 0
        while True:
            generation, runtime, images = self._stubs()
            fn: Callable[..., Any] = getattr(images if image else runtime, method)
            try:
                return await trio.to_thread.run_sync(
                    functools.partial(fn, request, timeout=timeout), limiter=self._limiter
                )
            except grpc.RpcError as exc:
                code, details = _status(exc)
                if code == grpc.StatusCode.NOT_FOUND and gone_ok:
                    return None
                if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                    self._reconnect(generation)
                    if idempotent and attempt < self.retries:
                        await trio.sleep(self.retry_backoff * 2**attempt)
                        attempt += 1
                        continue
                raise self._error(method, code, details) from None

    def _error(self, method: str, code: grpc.StatusCode | None, details: str) -> CriError:
        if code == grpc.StatusCode.NOT_FOUND:
            return NotFound(details or f"{method}: not found")
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
            return Unavailable(
                f"container runtime at {self.socket_path} unavailable ({method}): {details}; "
                "is containerd running?"
            )
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return DeadlineExceeded(details or f"{method}: deadline exceeded")
        name = code.name if code is not None else "UNKNOWN"
        return RuntimeFailure(details or f"{method} failed with {name}")

    # ------------------------------------------------------------------ runtime

    async def version(self) -> RuntimeVersion:
        r = await self._call("Version", pb.VersionRequest(version=CRI_API_VERSION), idempotent=True)
        return RuntimeVersion(
            version=r.version,
            runtime_name=r.runtime_name,
            runtime_version=r.runtime_version,
            runtime_api_version=r.runtime_api_version,
        )

    async def status(self) -> RuntimeStatus:
        r = await self._call("Status", pb.StatusRequest(), idempotent=True)
        return RuntimeStatus(
            conditions=tuple(
                RuntimeCondition(type=c.type, status=c.status, reason=c.reason, message=c.message)
                for c in r.status.conditions
            )
        )

    async def update_runtime_config(self, pod_cidr: str) -> None:
        request = pb.UpdateRuntimeConfigRequest(
            runtime_config=pb.RuntimeConfig(network_config=pb.NetworkConfig(pod_cidr=pod_cidr))
        )
        await self._call("UpdateRuntimeConfig", request, idempotent=True)

    # ------------------------------------------------------------------ sandboxes

    async def run_pod_sandbox(self, config: PodSandboxConfig, runtime_handler: str = "") -> str:
        r = await self._call(
            "RunPodSandbox",
            pb.RunPodSandboxRequest(
                config=sandbox_config_to_pb(config), runtime_handler=runtime_handler
            ),
            deadline=max(self.call_timeout, 60.0),  # CNI setup can be slow on a small device
        )
        return str(r.pod_sandbox_id)

    async def stop_pod_sandbox(self, sandbox_id: str) -> None:
        await self._call(
            "StopPodSandbox",
            pb.StopPodSandboxRequest(pod_sandbox_id=sandbox_id),
            deadline=max(self.call_timeout, 60.0),
            idempotent=True,
            gone_ok=True,
        )

    async def remove_pod_sandbox(self, sandbox_id: str) -> None:
        await self._call(
            "RemovePodSandbox",
            pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id),
            deadline=max(self.call_timeout, 60.0),
            idempotent=True,
            gone_ok=True,
        )

    async def pod_sandbox_status(self, sandbox_id: str) -> SandboxStatus:
        r = await self._call(
            "PodSandboxStatus",
            pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id),
            idempotent=True,
        )
        return sandbox_status_from_pb(r.status)

    async def list_pod_sandbox(
        self,
        *,
        sandbox_id: str | None = None,
        state: SandboxState | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> list[PodSandbox]:
        f = pb.PodSandboxFilter(id=sandbox_id or "", label_selector=dict(labels or {}))
        if state is not None:
            f.state.state = pb.PodSandboxState.Name(int(state))
        r = await self._call("ListPodSandbox", pb.ListPodSandboxRequest(filter=f), idempotent=True)
        return [pod_sandbox_from_pb(s) for s in r.items]

    # ------------------------------------------------------------------ containers

    async def create_container(
        self, sandbox_id: str, config: ContainerConfig, sandbox_config: PodSandboxConfig
    ) -> str:
        r = await self._call(
            "CreateContainer",
            pb.CreateContainerRequest(
                pod_sandbox_id=sandbox_id,
                config=container_config_to_pb(config, sandbox_config),
                sandbox_config=sandbox_config_to_pb(sandbox_config),
            ),
            deadline=max(self.call_timeout, 30.0),
        )
        return str(r.container_id)

    async def start_container(self, container_id: str) -> None:
        await self._call(
            "StartContainer",
            pb.StartContainerRequest(container_id=container_id),
            deadline=max(self.call_timeout, 30.0),
        )

    async def stop_container(self, container_id: str, grace_period: int) -> None:
        await self._call(
            "StopContainer",
            pb.StopContainerRequest(container_id=container_id, timeout=max(0, int(grace_period))),
            deadline=max(0, grace_period) + self.call_timeout,
            idempotent=True,
            gone_ok=True,
        )

    async def remove_container(self, container_id: str) -> None:
        await self._call(
            "RemoveContainer",
            pb.RemoveContainerRequest(container_id=container_id),
            idempotent=True,
            gone_ok=True,
        )

    async def container_status(self, container_id: str) -> ContainerStatus:
        r = await self._call(
            "ContainerStatus",
            pb.ContainerStatusRequest(container_id=container_id),
            idempotent=True,
        )
        return container_status_from_pb(r.status)

    async def list_containers(
        self,
        *,
        container_id: str | None = None,
        sandbox_id: str | None = None,
        state: ContainerState | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> list[Container]:
        f = pb.ContainerFilter(
            id=container_id or "",
            pod_sandbox_id=sandbox_id or "",
            label_selector=dict(labels or {}),
        )
        if state is not None:
            f.state.state = pb.ContainerState.Name(int(state))
        r = await self._call("ListContainers", pb.ListContainersRequest(filter=f), idempotent=True)
        return [container_from_pb(c) for c in r.containers]

    async def exec_sync(
        self, container_id: str, cmd: Sequence[str], timeout_seconds: float = 0
    ) -> ExecResult:
        if timeout_seconds > 0:
            seconds = max(1, math.ceil(timeout_seconds))
            deadline = seconds + self.call_timeout
        else:
            seconds, deadline = 0, self.long_call_timeout
        r = await self._call(
            "ExecSync",
            pb.ExecSyncRequest(container_id=container_id, cmd=list(cmd), timeout=seconds),
            deadline=deadline,
        )
        return ExecResult(stdout=bytes(r.stdout), stderr=bytes(r.stderr), exit_code=r.exit_code)

    async def update_container_resources(self, container_id: str, resources: Resources) -> None:
        await self._call(
            "UpdateContainerResources",
            pb.UpdateContainerResourcesRequest(
                container_id=container_id, linux=resources_to_pb(resources)
            ),
            idempotent=True,
        )

    # ------------------------------------------------------------------ images

    async def image_status(self, image: str) -> ImageInfo | None:
        r = await self._call(
            "ImageStatus",
            pb.ImageStatusRequest(image=pb.ImageSpec(image=image)),
            image=True,
            idempotent=True,
        )
        return image_from_pb(r.image) if r.HasField("image") else None

    async def pull_image(self, image: str) -> str:
        r = await self._call(
            "PullImage",
            pb.PullImageRequest(image=pb.ImageSpec(image=image)),
            image=True,
            deadline=self.long_call_timeout,
        )
        return str(r.image_ref)

    async def list_images(self) -> list[ImageInfo]:
        r = await self._call("ListImages", pb.ListImagesRequest(), image=True, idempotent=True)
        return [image_from_pb(i) for i in r.images]


def _status(exc: grpc.RpcError) -> tuple[grpc.StatusCode | None, str]:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return code, str(details or "")


# ---------------------------------------------------------------------- conversions

_PROTOCOLS: Final = {"TCP": pb.TCP, "UDP": pb.UDP, "SCTP": pb.SCTP}


def _namespaces(host_network: bool) -> Any:
    # As the kubelet: network per pod (or the node's), a PID namespace per container, shared IPC.
    return pb.NamespaceOption(
        network=pb.NODE if host_network else pb.POD, pid=pb.CONTAINER, ipc=pb.POD
    )


def sandbox_config_to_pb(c: PodSandboxConfig) -> Any:
    msg = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(
            name=c.name, uid=c.uid, namespace=c.namespace, attempt=c.attempt
        ),
        hostname="" if c.host_network else c.hostname,
        log_directory=c.log_directory,
        port_mappings=[
            pb.PortMapping(
                protocol=_PROTOCOLS.get(p.protocol.upper(), pb.TCP),
                container_port=p.container_port,
                host_port=p.host_port,
                host_ip=p.host_ip,
            )
            for p in c.port_mappings
        ],
        labels=dict(c.labels),
        annotations=dict(c.annotations),
        linux=pb.LinuxPodSandboxConfig(
            cgroup_parent=c.cgroup_parent,
            security_context=pb.LinuxSandboxSecurityContext(
                namespace_options=_namespaces(c.host_network)
            ),
        ),
    )
    if c.dns is not None:
        msg.dns_config.CopyFrom(
            pb.DNSConfig(
                servers=list(c.dns.servers),
                searches=list(c.dns.searches),
                options=list(c.dns.options),
            )
        )
    return msg


def resources_to_pb(r: Resources) -> Any:
    return pb.LinuxContainerResources(
        cpu_period=r.cpu_period,
        cpu_quota=r.cpu_quota,
        cpu_shares=r.cpu_shares,
        memory_limit_in_bytes=r.memory_limit_in_bytes,
        oom_score_adj=r.oom_score_adj,
        cpuset_cpus=r.cpuset_cpus,
        cpuset_mems=r.cpuset_mems,
    )


def container_config_to_pb(c: ContainerConfig, sandbox: PodSandboxConfig) -> Any:
    linux = pb.LinuxContainerConfig(
        security_context=pb.LinuxContainerSecurityContext(
            namespace_options=_namespaces(sandbox.host_network)
        )
    )
    if c.resources is not None:
        linux.resources.CopyFrom(resources_to_pb(c.resources))
    return pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name=c.name, attempt=c.attempt),
        image=pb.ImageSpec(image=c.image),
        command=list(c.command),
        args=list(c.args),
        working_dir=c.working_dir,
        envs=[pb.KeyValue(key=k, value=v) for k, v in c.envs.items()],
        mounts=[
            pb.Mount(container_path=m.container_path, host_path=m.host_path, readonly=m.readonly)
            for m in c.mounts
        ],
        labels=dict(c.labels),
        annotations=dict(c.annotations),
        log_path=c.log_path,
        stdin=c.stdin,
        tty=c.tty,
        linux=linux,
    )


def sandbox_status_from_pb(s: Any) -> SandboxStatus:
    return SandboxStatus(
        id=s.id,
        name=s.metadata.name,
        namespace=s.metadata.namespace,
        uid=s.metadata.uid,
        attempt=s.metadata.attempt,
        state=SandboxState(s.state),
        created_at=s.created_at,
        ip=s.network.ip,
        additional_ips=tuple(p.ip for p in s.network.additional_ips),
        host_network=s.linux.namespaces.options.network == pb.NODE,
        labels=dict(s.labels),
        annotations=dict(s.annotations),
    )


def pod_sandbox_from_pb(s: Any) -> PodSandbox:
    return PodSandbox(
        id=s.id,
        name=s.metadata.name,
        namespace=s.metadata.namespace,
        uid=s.metadata.uid,
        attempt=s.metadata.attempt,
        state=SandboxState(s.state),
        created_at=s.created_at,
        labels=dict(s.labels),
        annotations=dict(s.annotations),
    )


def _container_state(value: int) -> ContainerState:
    try:
        return ContainerState(value)
    except ValueError:
        return ContainerState.UNKNOWN


def container_status_from_pb(s: Any) -> ContainerStatus:
    return ContainerStatus(
        id=s.id,
        name=s.metadata.name,
        attempt=s.metadata.attempt,
        state=_container_state(s.state),
        created_at=s.created_at,
        started_at=s.started_at,
        finished_at=s.finished_at,
        exit_code=s.exit_code,
        reason=s.reason,
        message=s.message,
        image=s.image.image,
        image_ref=s.image_ref,
        log_path=s.log_path,
        labels=dict(s.labels),
        annotations=dict(s.annotations),
    )


def container_from_pb(c: Any) -> Container:
    return Container(
        id=c.id,
        sandbox_id=c.pod_sandbox_id,
        name=c.metadata.name,
        attempt=c.metadata.attempt,
        image=c.image.image,
        image_ref=c.image_ref,
        state=_container_state(c.state),
        created_at=c.created_at,
        labels=dict(c.labels),
        annotations=dict(c.annotations),
    )


def image_from_pb(i: Any) -> ImageInfo:
    return ImageInfo(
        id=i.id, repo_tags=tuple(i.repo_tags), repo_digests=tuple(i.repo_digests), size=i.size
    )
