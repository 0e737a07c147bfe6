"""The agent's Node: registration from host facts, status on change, Lease heartbeats.

Theory of operation
-------------------
`host_facts()` reads the machine once (CPU count, MemTotal from /proc/meminfo, hostname,
architecture, kernel, OS image, machine and boot ids, an InternalIP). `NodeReporter` turns them
and the runtime's `version()`/`status()` into a Node (pure `node_object`/`node_status`) and keeps
it current, as the kubelet does (KEP-589):

* **Registration.** Create the Node (labels `kubernetes.io/hostname`, `kubernetes.io/os=linux`,
  `kubernetes.io/arch`, plus the user's), capacity = allocatable (cpu, memory, pods 110),
  addresses (InternalIP, Hostname), nodeInfo (runtime version `<name>://<version>`),
  `daemonEndpoints.kubeletEndpoint.Port` = the agent's log endpoint port. A Node that already
  exists (a restarted agent) gets our labels merged in and its status re-posted. Then create or
  take over the Lease `kube-node-lease/<name>` (owned by the Node, so it goes with it).
* **Lease.** Renewed every `renew_interval` (10 s) with a duration of `lease_duration` (40 s):
  this is the frequent heartbeat the node lifecycle controller watches. A failed renewal is
  retried sooner (from `LEASE_RETRY_INITIAL`, doubling up to `renew_interval`), as the
  kubelet's lease controller does: with several API servers the retry goes to another one, so
  losing a server costs one attempt, not a whole interval. A 429 (the server's overload gate;
  leases have their own priority level, so it should not happen) waits at least its
  Retry-After, still within `renew_interval`, and does not count as a lost connection.
* **Status.** Computed every `status_interval` (10 s); PATCHed (status subresource) only when
  something other than heartbeat times changed, and at least every `report_interval` (5 min).
  Ready is True (reason KubeletReady) when the runtime reports RuntimeReady, else False
  (KubeletNotReady with the runtime's reason). A condition keeps its lastTransitionTime while
  its status stays the same.

Nothing here blocks the pods: registration is retried with backoff in its own task while the
pod workers run from the local store (edge autonomy), and a failed heartbeat is logged and
retried at the next tick. `connected` tells whether the last write to the server worked.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import platform
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import trio

from orchestrator.client.resource import LEASES, NODES
from orchestrator.controllers.runtime import Client
from orchestrator.cri.runtime import CriError, RuntimeService, RuntimeStatus, RuntimeVersion
from orchestrator.kube.errors import ApiError, retry_after
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.columns import now_rfc3339

__all__ = [
    "AGENT_VERSION",
    "NODE_LEASE_NAMESPACE",
    "HostFacts",
    "NodeReporter",
    "host_facts",
    "node_labels",
    "node_status",
]

log = logging.getLogger(__name__)


NODE_LEASE_NAMESPACE = "kube-node-lease"
AGENT_VERSION = "v1.32.0-orchestrator"
MAX_PODS = 110
REGISTER_BACKOFF_MAX = 10.0
LEASE_RETRY_INITIAL = 0.5  # seconds before retrying a failed Lease renewal (then doubling)
_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def micro_time(now: float) -> str:
    whole = math.floor(now)
    micros = min(int((now - whole) * 1_000_000), 999_999)
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(whole))}.{micros:06d}Z"


def lease_object(node: str, node_uid: str, duration: int, now: float) -> Obj:
    """The node's heartbeat Lease in kube-node-lease, owned by its Node when the uid is known."""
    meta: Obj = {"name": node, "namespace": NODE_LEASE_NAMESPACE}
    if node_uid:
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}
        ]
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": meta,
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": duration,
            "renewTime": micro_time(now),
        },
    }


# ---------------------------------------------------------------------------------- host facts
@dataclass(frozen=True, slots=True)
class HostFacts:
    hostname: str
    internal_ip: str
    cpus: int
    memory_bytes: int
    arch: str  # GOARCH spelling: amd64, arm64, arm, ...
    kernel: str
    os_image: str
    machine_id: str
    boot_id: str
    system_uuid: str = ""


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def meminfo_total(text: str) -> int:
    """MemTotal in bytes from /proc/meminfo text (0 if absent)."""
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                scale = 1024 if len(parts) < 3 or parts[2].lower() == "kb" else 1
                return int(parts[1]) * scale
    return 0


def _os_image() -> str:
    for line in _read("/etc/os-release").splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip().strip('"')
    return platform.system()


def default_ip(target: str = "10.255.255.255") -> str:
    """The source address the host would use to reach `target` (no packet is sent)."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((target, 1))
        ip = str(s.getsockname()[0])
        if ip and ip != "0.0.0.0":
            return ip
    return "127.0.0.1"


def host_facts(*, node_ip: str = "", hostname: str = "") -> HostFacts:
    """This machine's facts (blocking reads of small /proc and /etc files: call at start-up)."""
    machine = platform.machine().lower()
    name = hostname or socket.gethostname().lower()
    machine_id = _read("/etc/machine-id").strip()
    return HostFacts(
        hostname=name,
        internal_ip=node_ip or default_ip(),
        cpus=os.cpu_count() or 1,
        memory_bytes=meminfo_total(_read("/proc/meminfo")),
        arch=_ARCH.get(machine, machine or "unknown"),
        kernel=platform.release(),
        os_image=_os_image(),
        machine_id=machine_id or hashlib.sha256(name.encode()).hexdigest()[:32],
        boot_id=_read("/proc/sys/kernel/random/boot_id").strip(),
        system_uuid=_read("/sys/class/dmi/id/product_uuid").strip(),
    )


# ---------------------------------------------------------------------------------- pure objects
def node_labels(name: str, facts: HostFacts, extra: Mapping[str, str]) -> dict[str, str]:
    return {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": facts.arch,
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": facts.arch,
        **extra,
    }


def _ready_condition(runtime: RuntimeStatus | None) -> tuple[str, str, str]:
    if runtime is None:
        return "False", "KubeletNotReady", "container runtime status check failed: unreachable"
    if runtime.runtime_ready:
        return "True", "KubeletReady", "kubelet is posting ready status"
    cond = next((c for c in runtime.conditions if c.type == "RuntimeReady"), None)
    why = f"{cond.reason}: {cond.message}" if cond and (cond.reason or cond.message) else "down"
    return "False", "KubeletNotReady", f"container runtime is not ready: {why}"


def node_status(
    facts: HostFacts,
    name: str,
    *,
    now: float,
    version: RuntimeVersion | None,
    runtime: RuntimeStatus | None,
    kubelet_port: int,
    max_pods: int = MAX_PODS,
    previous: Obj | None = None,
) -> Obj:
    """The Node status to report. `previous`: the last reported status, whose conditions keep
    their lastTransitionTime while their status is unchanged."""
    stamp = now_rfc3339(now)
    before = {
        c.get("type"): c for c in (previous or {}).get("conditions") or [] if isinstance(c, dict)
    }

    def cond(type_: str, status: str, reason: str, message: str) -> Obj:
        old = before.get(type_) or {}
        changed = old.get("status") != status
        return {
            "type": type_,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": stamp if changed else old.get("lastTransitionTime", stamp),
        }

    resources = {
        "cpu": str(facts.cpus),
        "memory": f"{facts.memory_bytes // 1024}Ki",
        "pods": str(max_pods),
    }
    ready = _ready_condition(runtime)
    runtime_version = (
        f"{version.runtime_name}://{version.runtime_version}" if version else "unknown://"
    )
    return {
        "capacity": dict(resources),
        "allocatable": dict(resources),
        "conditions": [
            cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "sufficient memory"),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "no disk pressure"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID", "sufficient PID available"),
            cond("Ready", *ready),
        ],
        "addresses": [
            {"type": "InternalIP", "address": facts.internal_ip},
            {"type": "Hostname", "address": facts.hostname},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
        "nodeInfo": {
            "machineID": facts.machine_id,
            "systemUUID": facts.system_uuid or facts.machine_id,
            "bootID": facts.boot_id,
            "kernelVersion": facts.kernel,
            "osImage": facts.os_image,
            "containerRuntimeVersion": runtime_version,
            "kubeletVersion": AGENT_VERSION,
            "kubeProxyVersion": AGENT_VERSION,
            "operatingSystem": "linux",
            "architecture": facts.arch,
        },
    }


def _without_heartbeats(status: Obj) -> Obj:
    out = dict(status)
    out["conditions"] = [
        {k: v for k, v in c.items() if k != "lastHeartbeatTime"}
        for c in status.get("conditions") or []
    ]
    return out


# ---------------------------------------------------------------------------------- reporter
@dataclass
class NodeReporterOptions:
    labels: Mapping[str, str] = field(default_factory=dict)
    kubelet_port: int = 10250
    max_pods: int = MAX_PODS
    lease_duration: int = 40
    renew_interval: float = 10.0
    status_interval: float = 10.0
    report_interval: float = 300.0


class NodeReporter:
    """Registers node `name` and keeps its Lease and status current (module doc)."""

    def __init__(
        self,
        client: Client,
        name: str,
        runtime: RuntimeService,
        facts: HostFacts,
        options: NodeReporterOptions | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.name = name
        self.runtime = runtime
        self.facts = facts
        self.opts = options or NodeReporterOptions()
        self.clock = clock
        self.uid = ""
        self.registered = trio.Event()
        self.connected = False
        self._reported: Obj | None = None  # last status written
        self._reported_at = -math.inf  # trio time of that write
        self._version: RuntimeVersion | None = None

    async def _runtime_state(self) -> tuple[RuntimeVersion | None, RuntimeStatus | None]:
        try:
            with trio.fail_after(10):
                if self._version is None:
                    self._version = await self.runtime.version()
                return self._version, await self.runtime.status()
        except (CriError, trio.TooSlowError) as exc:
            log.warning("node %s: container runtime status: %s", self.name, exc)
            return self._version, None

    async def current_status(self) -> Obj:
        version, status = await self._runtime_state()
        return node_status(
            self.facts,
            self.name,
            now=self.clock(),
            version=version,
            runtime=status,
            kubelet_port=self.opts.kubelet_port,
            max_pods=self.opts.max_pods,
            previous=self._reported,
        )

    def _lease(self, now: float) -> Obj:
        return lease_object(self.name, self.uid, self.opts.lease_duration, now)

    async def register_once(self) -> None:
        status = await self.current_status()
        labels = node_labels(self.name, self.facts, self.opts.labels)
        node: Obj = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": labels},
            "spec": {},
            "status": status,
        }
        try:
            created = await self.client.create(NODES, node)  # a Node keeps status on create
        except ApiError as exc:
            if exc.code != 409:
                raise
            await self.client.patch(NODES, self.name, {"metadata": {"labels": labels}})
            created = await self.client.patch(
                NODES, self.name, {"status": status}, subresource="status"
            )
        self.uid = str((created.get("metadata") or {}).get("uid") or "")
        self._reported, self._reported_at = status, trio.current_time()
        await self.renew_lease()
        self.connected = True
        self.registered.set()

    async def renew_lease(self) -> None:
        now = self.clock()
        lease = self._lease(now)
        patch = {"spec": {"renewTime": lease["spec"]["renewTime"], "holderIdentity": self.name}}
        try:
            await self.client.patch(LEASES, self.name, patch, NODE_LEASE_NAMESPACE)
        except ApiError as exc:
            if exc.code != 404:
                raise
            await self.client.create(LEASES, lease, NODE_LEASE_NAMESPACE)

    async def report_status(self, *, force: bool = False) -> bool:
        """Post the status if it changed (or `force`, or the report interval passed)."""
        status = await self.current_status()
        due = trio.current_time() - self._reported_at >= self.opts.report_interval
        if (
            not force
            and not due
            and self._reported is not None
            and _without_heartbeats(status) == _without_heartbeats(self._reported)
        ):
            return False
        await self.client.patch(NODES, self.name, {"status": status}, subresource="status")
        self._reported, self._reported_at = status, trio.current_time()
        return True

    async def _register(self) -> None:
        delay = 0.2
        while True:
            try:
                await self.register_once()
                log.info("node %s registered", self.name)
                return
            except ApiError as exc:
                self.connected = False
                log.info("node %s: registration failed: %s; retrying", self.name, exc)
            await trio.sleep(delay)
            delay = min(delay * 2, REGISTER_BACKOFF_MAX)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Register (retrying), then heartbeat until cancelled. `started` at once: the agent
        never waits for the server."""
        task_status.started()
        await self._register()
        next_lease = trio.current_time() + self.opts.renew_interval
        next_status = trio.current_time() + self.opts.status_interval
        retry = LEASE_RETRY_INITIAL
        while True:
            await trio.sleep_until(min(next_lease, next_status))
            now = trio.current_time()
            if now >= next_lease:
                next_lease = now + self.opts.renew_interval
                try:
                    await self.renew_lease()
                    retry = LEASE_RETRY_INITIAL
                    if not self.connected:  # back from a partition: say so at once
                        self.connected = True
                        await self.report_status(force=True)
                except ApiError as exc:
                    # A 429 is a busy server, not a partition: no forced status report
                    # (more load) when it answers again; wait at least its Retry-After.
                    self.connected = self.connected and exc.code == 429
                    log.warning("node %s: lease renewal failed: %s", self.name, exc)
                    wait = max(retry, retry_after(exc) or 0.0)
                    next_lease = trio.current_time() + min(wait, self.opts.renew_interval)
                    retry = min(retry * 2, self.opts.renew_interval)
            if now >= next_status:
                next_status = now + self.opts.status_interval
                try:
                    await self.report_status()
                except ApiError as exc:
                    self.connected = False
                    log.warning("node %s: status report failed: %s", self.name, exc)
