"""The `RuntimeService` boundary: what the node agent may ask of a container runtime.

Theory of operation
-------------------
The agent drives a runtime the way the kubelet drives CRI `runtime.v1`: a pod is a *sandbox*
(network namespace, cgroup parent, a pause process) that holds *containers*. The agent creates
and destroys them with imperative calls and learns what actually runs by *relisting*
(`list_pod_sandbox`, `list_containers`, then the `*_status` calls); there are no events, the
periodic relist is the source of truth.

This module holds only the contract: plain frozen dataclasses (no protobuf types cross it), the
`RuntimeService` protocol and the error classes. Two implementations exist:

- `orchestrator.cri.containerd.CriRuntime`: a gRPC client for containerd's CRI plugin;
- `orchestrator.cri.simulated.SimulatedRuntime`: containers that "run" in memory, for the
  benchmark harness and fast tests.

Both pass the same conformance suite (`tests/cri/conformance.py`), which is the executable form of
the semantics written below.

Semantics every implementation keeps
------------------------------------
- Ids are opaque strings chosen by the runtime.
- Timestamps (`created_at`, `started_at`, `finished_at`) are integer **nanoseconds** since the Unix
  epoch, 0 meaning "not yet" (as in CRI).
- Teardown is idempotent: `stop_pod_sandbox`, `remove_pod_sandbox`, `stop_container` and
  `remove_container` of an id the runtime does not know (never existed, or already removed)
  succeed silently. `stop_pod_sandbox` stops every container in the sandbox;
  `remove_pod_sandbox` removes them.
- Every other call about an unknown id raises `NotFound`.
- `image_status` of an image the runtime does not have returns `None` (not an error).
- `exec_sync` returns a non-zero exit code as data (`ExecResult.exit_code`), not as an error; a
  command that outlives its `timeout_seconds` raises `DeadlineExceeded`.
- A runtime that cannot be reached raises `Unavailable`; the caller decides whether to retry.
  Anything else the runtime refuses raises `RuntimeFailure` carrying the runtime's own text (for
  example the reason a container could not be created: the agent shows it as
  `CreateContainerError`).
- Host-network sandboxes get no IP (`SandboxStatus.ip == ""`): the agent reports the node's
  address. Pod-network sandboxes need the runtime's `NetworkReady` condition.
- Container log files use the CRI format, one record per line:
  `<RFC3339Nano timestamp> <stdout|stderr> <F|P> <text>` at
  `sandbox.log_directory / container.log_path`.

Simulated networks
------------------
A runtime whose pods live in no real network (the simulated one: its pod IPs are made up and may
be real hosts on the user's LAN) also implements `SimulatedNetwork.probe_network`: the agent's
prober asks it instead of dialling, so a simulated pod never causes a packet. The prober finds the
capability with `simulated_network(runtime)`; containerd's runtime does not have it (its pods'
probes go over the real network, as the kubelet's do).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, cast

__all__ = [
    "NETWORK_READY",
    "RUNTIME_READY",
    "Container",
    "ContainerConfig",
    "ContainerState",
    "ContainerStatus",
    "CriError",
    "DNSConfig",
    "DeadlineExceeded",
    "ExecResult",
    "ImageInfo",
    "Mount",
    "NetworkAnswer",
    "NetworkProbe",
    "NotFound",
    "PodSandbox",
    "PodSandboxConfig",
    "PortMapping",
    "Resources",
    "RuntimeCondition",
    "RuntimeFailure",
    "RuntimeService",
    "RuntimeStatus",
    "RuntimeVersion",
    "SandboxState",
    "SandboxStatus",
    "SimulatedNetwork",
    "Unavailable",
    "simulated_network",
]


# --------------------------------------------------------------------------- errors


class CriError(RuntimeError):
    """Base of every error a `RuntimeService` raises."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFound(CriError):
    """The sandbox, container or image named in the call does not exist."""


class Unavailable(CriError):
    """The runtime cannot be reached (not started, restarting, socket gone). Retry later."""


class DeadlineExceeded(CriError):
    """The call (or the exec'd command) did not finish within its deadline."""


class RuntimeFailure(CriError):
    """The runtime refused or failed the call; `message` is the runtime's own explanation."""


# --------------------------------------------------------------------------- enums

RUNTIME_READY = "RuntimeReady"
"""Condition type: the runtime can run sandboxes and containers."""
NETWORK_READY = "NetworkReady"
"""Condition type: pod networking (CNI) is configured; pod-network sandboxes need it."""


class SandboxState(enum.IntEnum):
    """Values as CRI `PodSandboxState`."""

    READY = 0
    NOTREADY = 1


class ContainerState(enum.IntEnum):
    """Values as CRI `ContainerState`."""

    CREATED = 0
    RUNNING = 1
    EXITED = 2
    UNKNOWN = 3


# --------------------------------------------------------------------------- runtime


@dataclass(frozen=True)
class RuntimeVersion:
    version: str  # the CRI API version the runtime speaks to us with, e.g. "0.1.0"
    runtime_name: str  # e.g. "containerd"
    runtime_version: str  # e.g. "1.6.20~ds1"
    runtime_api_version: str  # e.g. "v1"


@dataclass(frozen=True)
class RuntimeCondition:
    type: str  # RUNTIME_READY, NETWORK_READY, ...
    status: bool
    reason: str = ""
    message: str = ""


@dataclass(frozen=True)
class RuntimeStatus:
    conditions: tuple[RuntimeCondition, ...]

    def condition(self, type_: str) -> RuntimeCondition | None:
        for c in self.conditions:
            if c.type == type_:
                return c
        return None

    @property
    def runtime_ready(self) -> bool:
        c = self.condition(RUNTIME_READY)
        return c is not None and c.status

    @property
    def network_ready(self) -> bool:
        c = self.condition(NETWORK_READY)
        return c is not None and c.status


# --------------------------------------------------------------------------- sandboxes


@dataclass(frozen=True)
class PortMapping:
    container_port: int
    host_port: int = 0
    protocol: str = "TCP"  # "TCP", "UDP" or "SCTP"
    host_ip: str = ""


@dataclass(frozen=True)
class DNSConfig:
    servers: tuple[str, ...] = ()
    searches: tuple[str, ...] = ()
    options: tuple[str, ...] = ()


@dataclass(frozen=True)
class PodSandboxConfig:
    """What the agent asks for when it starts a pod's sandbox.

    `(name, namespace, uid, attempt)` must be unique among existing sandboxes: bump `attempt` to
    re-create a sandbox before the old one is removed. `hostname` must be empty when
    `host_network` is set (the host's UTS namespace is shared). `log_directory` is where the
    containers' log files go (absolute); without it their output is discarded. The same value
    must be passed as `sandbox_config` to every `create_container` in this sandbox.
    """

    name: str
    namespace: str
    uid: str
    attempt: int = 0
    hostname: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    log_directory: str = ""
    host_network: bool = False
    port_mappings: tuple[PortMapping, ...] = ()
    dns: DNSConfig | None = None
    cgroup_parent: str = ""


@dataclass(frozen=True)
class PodSandbox:
    """One entry of `list_pod_sandbox`."""

    id: str
    name: str
    namespace: str
    uid: str
    attempt: int
    state: SandboxState
    created_at: int
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SandboxStatus:
    id: str
    name: str
    namespace: str
    uid: str
    attempt: int
    state: SandboxState
    created_at: int
    ip: str = ""  # "" for host-network sandboxes
    additional_ips: tuple[str, ...] = ()
    host_network: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


# --------------------------------------------------------------------------- containers


@dataclass(frozen=True)
class Mount:
    host_path: str
    container_path: str
    readonly: bool = False


@dataclass(frozen=True)
class Resources:
    """Linux resources of a container (0 / "" = unset). CPU in cgroup v1 units."""

    cpu_shares: int = 0
    cpu_quota: int = 0
    cpu_period: int = 0
    memory_limit_in_bytes: int = 0
    oom_score_adj: int = 0
    cpuset_cpus: str = ""
    cpuset_mems: str = ""


@dataclass(frozen=True)
class ContainerConfig:
    """What the agent asks for when it creates a container.

    `image` must be fully qualified (`localhost/busybox:1`, `docker.io/library/nginx:1.25`) or an
    image id. `log_path` is relative to the sandbox's `log_directory`. `command` replaces the
    image's entrypoint, `args` its cmd (as in a Kubernetes container spec).
    """

    name: str
    image: str
    attempt: int = 0
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    working_dir: str = ""
    envs: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    log_path: str = ""
    resources: Resources | None = None
    stdin: bool = False
    tty: bool = False


@dataclass(frozen=True)
class Container:
    """One entry of `list_containers`."""

    id: str
    sandbox_id: str
    name: str
    attempt: int
    image: str
    image_ref: str
    state: ContainerState
    created_at: int
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ContainerStatus:
    """`reason` is the runtime's word for an exit: "Completed" (code 0), "Error", "OOMKilled"."""

    id: str
    name: str
    attempt: int
    state: ContainerState
    created_at: int
    started_at: int = 0
    finished_at: int = 0
    exit_code: int = 0
    reason: str = ""
    message: str = ""
    image: str = ""
    image_ref: str = ""
    log_path: str = ""  # absolute: the sandbox's log_directory joined with the config's log_path
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ExecResult:
    stdout: bytes
    stderr: bytes
    exit_code: int


# --------------------------------------------------------------------------- images


@dataclass(frozen=True)
class ImageInfo:
    id: str  # e.g. "sha256:…"
    repo_tags: tuple[str, ...] = ()
    repo_digests: tuple[str, ...] = ()
    size: int = 0


# --------------------------------------------------------------------------- the protocol


class RuntimeService(Protocol):
    """A container runtime as the node agent sees it. All methods may block (they are async).

    Callers own timeouts (`trio.fail_after`); implementations additionally bound each call with
    their own configured deadline so that a wedged runtime cannot hang the agent.
    """

    async def version(self) -> RuntimeVersion: ...

    async def status(self) -> RuntimeStatus: ...

    async def update_runtime_config(self, pod_cidr: str) -> None:
        """Tell the runtime the node's podCIDR (CRI `UpdateRuntimeConfig`), as the kubelet
        does once the Node has one; "" changes nothing."""
        ...

    # sandboxes

    async def run_pod_sandbox(self, config: PodSandboxConfig, runtime_handler: str = "") -> str:
        """Create and start a sandbox; returns its id. Raises RuntimeFailure if it cannot."""
        ...

    async def stop_pod_sandbox(self, sandbox_id: str) -> None:
        """Stop the sandbox and all its containers. Unknown id: success."""
        ...

    async def remove_pod_sandbox(self, sandbox_id: str) -> None:
        """Remove the sandbox and all its containers (stopping them first). Unknown id: success."""
        ...

    async def pod_sandbox_status(self, sandbox_id: str) -> SandboxStatus:
        """Raises NotFound for an unknown id."""
        ...

    async def list_pod_sandbox(
        self,
        *,
        sandbox_id: str | None = None,
        state: SandboxState | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> list[PodSandbox]:
        """Sandboxes matching every given filter (`labels`: all pairs must match)."""
        ...

    # containers

    async def create_container(
        self, sandbox_id: str, config: ContainerConfig, sandbox_config: PodSandboxConfig
    ) -> str:
        """Create (not start) a container in the sandbox; returns its id.

        Raises NotFound if the sandbox is unknown, RuntimeFailure (the text is the reason for a
        CreateContainerError) if the runtime refuses, e.g. for a missing image.
        """
        ...

    async def start_container(self, container_id: str) -> None: ...

    async def stop_container(self, container_id: str, grace_period: int) -> None:
        """SIGTERM, wait `grace_period` seconds, then SIGKILL (0: kill now).

        Unknown id or already exited: success.
        """
        ...

    async def remove_container(self, container_id: str) -> None:
        """Remove the container (killing it if it runs). Unknown id: success."""
        ...

    async def container_status(self, container_id: str) -> ContainerStatus:
        """Raises NotFound for an unknown id."""
        ...

    async def list_containers(
        self,
        *,
        container_id: str | None = None,
        sandbox_id: str | None = None,
        state: ContainerState | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> list[Container]:
        """Containers matching every given filter (`labels`: all pairs must match)."""
        ...

    async def exec_sync(
        self, container_id: str, cmd: Sequence[str], timeout_seconds: float = 0
    ) -> ExecResult:
        """Run `cmd` in the running container and collect its output.

        `timeout_seconds` is enforced by the runtime (0 = no limit; rounded up to whole
        seconds); past it DeadlineExceeded. A non-zero exit is `ExecResult.exit_code`, not an error.
        """
        ...

    async def update_container_resources(self, container_id: str, resources: Resources) -> None: ...

    # images

    async def image_status(self, image: str) -> ImageInfo | None:
        """None if the runtime does not have the image."""
        ...

    async def pull_image(self, image: str) -> str:
        """Pull the image; returns its reference (an image id or digest)."""
        ...

    async def list_images(self) -> list[ImageInfo]: ...

    # lifecycle

    async def aclose(self) -> None:
        """Release connections. Idempotent; the runtime's containers keep running."""
        ...


# ---------------------------------------------------------------------- simulated networks


@dataclass(frozen=True, slots=True)
class NetworkProbe:
    """One connection a probe of container `container_id` would open: `protocol` "http" (a GET
    of `path`) or "tcp" (a connect) to `host:port`. `own_address`: `host` is the pod's own
    address (the probe names no other host)."""

    container_id: str
    protocol: str
    host: str
    port: int
    own_address: bool = True
    path: str = "/"


@dataclass(frozen=True, slots=True)
class NetworkAnswer:
    """What the simulated network answers: `connected` False is a refused connection;
    `status`/`body` are the HTTP response of an "http" probe that connected."""

    connected: bool
    status: int = 0
    body: bytes = b""


class SimulatedNetwork(Protocol):
    """The capability of a runtime whose pods live in no real network (module doc)."""

    async def probe_network(self, probe: NetworkProbe) -> NetworkAnswer: ...


def simulated_network(runtime: object) -> SimulatedNetwork | None:
    """`runtime` when it answers probes itself (it has `probe_network`), else None. Works through
    wrappers that forward attributes (`observability.TimedRuntime`)."""
    hook = getattr(runtime, "probe_network", None)
    return cast(SimulatedNetwork, runtime) if callable(hook) else None
