"""One worker per pod: drives the runtime towards the pod's spec and reports its status.

Theory of operation
-------------------
A `PodWorker` is one trio task per pod UID (kubelet's pod_workers), started in the agent's
nursery. It holds the latest pod object and sleeps until *woken*: by a new pod object (watch or
local store), by the agent's relist noticing that this pod's sandboxes/containers changed, by a
probe result, or by a timer (a back-off expiring, the periodic resync). Each wake runs `_sync`,
which is **level-based**: it lists what the runtime has for this UID (labels), computes what is
missing, does it, and reports.

Sync, in kubelet order (SyncPod):

1. **Terminating** (deletionTimestamp set, or the pod is gone from the API): run preStop exec
   hooks, stop containers with the grace period (deletionGracePeriodSeconds, else
   terminationGracePeriodSeconds), stop and remove the sandboxes, remove the pod directory, then
   delete the pod with grace 0 and a UID precondition (the API server keeps a bound pod until its
   node says so) and forget it locally. While the server is unreachable the deletion is retried.
2. **Finished** (phase Succeeded/Failed): the sandbox is stopped, containers are kept for their
   status; nothing restarts.
3. **Sandbox**: one READY sandbox per pod; a dead one is removed and re-created with the next
   attempt (containers then start again). Host network when `spec.hostNetwork`; otherwise the
   runtime must say NetworkReady first (a POD-network sandbox without CNI leaks, see
   cri-containerd.md pitfall 6). `log_directory` = `{data_dir}/pods/{ns}_{name}_{uid}`.
4. **Init containers** one at a time in order; each must exit 0 before the next starts; a
   failure restarts it with back-off unless restartPolicy is Never (then the pod Fails).
5. **Containers**: created and started (image pulled per imagePullPolicy, config built from
   command/args/env/envFrom/volumes/resources); an exited one restarts per restartPolicy
   (Always; OnFailure on a non-zero exit; Never) after CrashLoopBackOff.
6. **Status**: computed by the pure `pod_status` and written (merge patch of the status
   subresource) only when it differs from the last one written.

Back-off (`Backoff`, pure, as the kubelet's flowcontrol.Backoff keyed by container): the first
restart is immediate and arms 10 s; while `now - finishedAt < delay` the container waits with
reason CrashLoopBackOff and message `back-off 10s restarting failed container=...`; each
restart after that doubles the delay up to 300 s; an entry idle for more than 10 min (the
container ran that long) starts again at 10 s. Image pulls and create errors back off the same
way (ImagePullBackOff).

Errors never crash the worker: a spec the runtime rejects is a waiting reason
(CreateContainerError with the runtime's message, CreateContainerConfigError for a missing
ConfigMap/Secret key, ErrImagePull/ErrImageNeverPull/ImagePullBackOff) plus a Warning event; a
runtime that is unavailable or an API write that fails is retried at the next wake.

Invariants: the attempt of a new container is one more than the highest attempt of that name
seen (so restartCount survives an agent restart; containerd reserves names by attempt); at most
two containers per name are kept (current and previous, for lastState); every sandbox and
container carries `LABEL_AGENT`/`LABEL_POD_UID` so the agent's relist can find strays; the same
`PodSandboxConfig` (a pure function of the pod and the attempt) is passed to every
`create_container` of a sandbox.

Log layout (shared with `agent/logs.py`): `{data_dir}/pods/{namespace}_{name}_{uid}/` is the
sandbox's `log_directory`; a container logs to `{container_name}/{attempt}.log` under it.
Volumes live in `.../volumes/<plugin>/<volume>` under the same directory.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import math
import os
import re
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import trio

from orchestrator.agent.localstore import LocalStore
from orchestrator.client.resource import PODS
from orchestrator.controllers.runtime import Client
from orchestrator.cri.runtime import (
    ContainerConfig,
    ContainerState,
    ContainerStatus,
    CriError,
    Mount,
    NotFound,
    PodSandbox,
    PodSandboxConfig,
    PortMapping,
    Resources,
    RuntimeFailure,
    RuntimeService,
    SandboxState,
)
from orchestrator.kube.errors import ApiError
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.columns import now_rfc3339
from orchestrator.observability import POD_START_DURATION
from orchestrator.scheduler.quantity import parse_cpu_milli, parse_value

__all__ = [
    "LABEL_AGENT",
    "LABEL_CONTAINER_KIND",
    "LABEL_CONTAINER_NAME",
    "LABEL_POD_NAME",
    "LABEL_POD_NAMESPACE",
    "LABEL_POD_UID",
    "Backoff",
    "PodView",
    "PodWorker",
    "WorkerContext",
    "WorkerOptions",
    "go_duration",
    "linux_resources",
    "pod_dir",
    "pod_status",
    "sandbox_config",
]

log = logging.getLogger(__name__)


LABEL_AGENT = "orchestrator.io/agent"
LABEL_POD_UID = "io.kubernetes.pod.uid"
LABEL_POD_NAME = "io.kubernetes.pod.name"
LABEL_POD_NAMESPACE = "io.kubernetes.pod.namespace"
LABEL_CONTAINER_NAME = "io.kubernetes.container.name"
LABEL_CONTAINER_KIND = "orchestrator.io/container-kind"  # "init" or "regular"

TERMINAL = frozenset({"Succeeded", "Failed"})
DEFAULT_GRACE = 30
RUNTIME_TIMEOUT = 60.0  # bound on one runtime call made by a worker (the runtime has its own)
API_TIMEOUT = 10.0  # bound on one API call made by a worker
_WAITING_RETRY = frozenset(
    {
        "CreateContainerError",
        "CreateContainerConfigError",
        "ErrImagePull",
        "ErrImageNeverPull",
        "ImagePullBackOff",
        "RunContainerError",
        "InvalidImageName",
    }
)


# ---------------------------------------------------------------------------------- helpers
def _meta(obj: Obj) -> Obj:
    m = obj.get("metadata")
    return m if isinstance(m, dict) else {}


def _spec(obj: Obj) -> Obj:
    s = obj.get("spec")
    return s if isinstance(s, dict) else {}


def _ns_time(ns: int) -> str:
    return now_rfc3339(ns / 1e9)


def go_duration(seconds: float) -> str:
    """Go's time.Duration text for the values back-offs take: 10s, 2m40s, 5m0s, 100ms."""
    if seconds < 1:
        ms = round(seconds * 1000)
        return f"{ms}ms"
    whole = round(seconds, 3)
    minutes, secs = divmod(whole, 60)
    hours, minutes = divmod(int(minutes), 60)
    sec_text = f"{secs:g}s"
    if hours:
        return f"{hours}h{minutes}m{sec_text}"
    if minutes:
        return f"{minutes}m{sec_text}"
    return sec_text


def pod_dir(data_dir: Path, pod: Obj) -> Path:
    """`{data_dir}/pods/{namespace}_{name}_{uid}`: log directory and volumes of the pod."""
    m = _meta(pod)
    return data_dir / "pods" / f"{m.get('namespace', '')}_{m.get('name', '')}_{m.get('uid', '')}"


def _key(pod: Obj) -> str:
    m = _meta(pod)
    return f"{m.get('namespace', '')}/{m.get('name', '')}"


# ---------------------------------------------------------------------------------- back-off
@dataclass(slots=True)
class _Entry:
    delay: float
    last: float  # event time of the last `next`


class Backoff:
    """kubelet's per-key exponential back-off (flowcontrol.Backoff), pure: times are passed in.

    `in_backoff_since(key, event, now)`: is `now` still within the delay after `event` (e.g. the
    container's finishedAt)? `next(key, event)`: arm the next delay (initial, or double up to
    `maximum`; back to initial when the entry has been idle for more than `reset`)."""

    def __init__(self, initial: float, maximum: float, reset: float) -> None:
        self.initial, self.maximum, self.reset = initial, maximum, reset
        self._entries: dict[str, _Entry] = {}

    def get(self, key: str) -> float:
        e = self._entries.get(key)
        return e.delay if e else 0.0

    def in_backoff_since(self, key: str, event: float, now: float) -> bool:
        e = self._entries.get(key)
        if e is None or event - e.last > self.reset:
            return False
        return now - event < e.delay

    def next(self, key: str, event: float) -> float:
        e = self._entries.get(key)
        if e is None or event - e.last > self.reset:
            e = self._entries[key] = _Entry(self.initial, event)
        else:
            e.delay, e.last = min(e.delay * 2, self.maximum), event
        return e.delay

    def forget(self, key: str) -> None:
        self._entries.pop(key, None)


# ---------------------------------------------------------------------------------- runtime view
@dataclass
class PodView:
    """What the runtime has for one pod UID."""

    sandboxes: list[PodSandbox] = field(default_factory=list)
    containers: dict[str, list[ContainerStatus]] = field(
        default_factory=dict
    )  # by name, by attempt
    pod_ip: str = ""

    @property
    def ready_sandbox(self) -> PodSandbox | None:
        ready = [s for s in self.sandboxes if s.state == SandboxState.READY]
        return max(ready, key=lambda s: (s.attempt, s.created_at)) if ready else None

    def latest(self, name: str) -> ContainerStatus | None:
        hist = self.containers.get(name)
        return hist[-1] if hist else None

    def previous(self, name: str) -> ContainerStatus | None:
        hist = self.containers.get(name)
        return hist[-2] if hist and len(hist) > 1 else None

    def all(self) -> Iterable[ContainerStatus]:
        for hist in self.containers.values():
            yield from hist


# ---------------------------------------------------------------------------------- pure config
def sandbox_config(pod: Obj, attempt: int, *, node: str, data_dir: Path) -> PodSandboxConfig:
    """The sandbox config for `pod` (pure: the same pod and attempt give the same config)."""
    m, spec = _meta(pod), _spec(pod)
    host_network = bool(spec.get("hostNetwork"))
    labels = {str(k): str(v) for k, v in (m.get("labels") or {}).items()}
    labels.update(
        {
            LABEL_AGENT: node,
            LABEL_POD_UID: str(m.get("uid", "")),
            LABEL_POD_NAME: str(m.get("name", "")),
            LABEL_POD_NAMESPACE: str(m.get("namespace", "")),
        }
    )
    ports: list[PortMapping] = []
    for c in spec.get("containers") or []:
        for p in c.get("ports") or []:
            if p.get("hostPort"):
                ports.append(
                    PortMapping(
                        container_port=int(p.get("containerPort") or 0),
                        host_port=int(p["hostPort"]),
                        protocol=str(p.get("protocol") or "TCP"),
                        host_ip=str(p.get("hostIP") or ""),
                    )
                )
    hostname = "" if host_network else str(spec.get("hostname") or m.get("name", ""))[:63]
    return PodSandboxConfig(
        name=str(m.get("name", "")),
        namespace=str(m.get("namespace", "")),
        uid=str(m.get("uid", "")),
        attempt=attempt,
        hostname=hostname,
        labels=labels,
        annotations={str(k): str(v) for k, v in (m.get("annotations") or {}).items()},
        log_directory=str(pod_dir(data_dir, pod).absolute()),
        host_network=host_network,
        port_mappings=tuple(ports),
    )


def linux_resources(container: Obj) -> Resources | None:
    """CRI linux resources (cgroup v1 units) from a container's requests and limits."""
    res = container.get("resources") or {}
    requests, limits = res.get("requests") or {}, res.get("limits") or {}
    if not requests and not limits:
        return Resources(cpu_shares=2)  # BestEffort: the minimum share, as the kubelet
    cpu_request = requests.get("cpu", limits.get("cpu"))
    shares = 2
    if cpu_request is not None:
        shares = max(2, parse_cpu_milli(cpu_request) * 1024 // 1000)
    quota = period = 0
    if limits.get("cpu") is not None:
        period = 100_000
        quota = max(1000, parse_cpu_milli(limits["cpu"]) * period // 1000)
    memory = parse_value(limits["memory"]) if limits.get("memory") is not None else 0
    return Resources(
        cpu_shares=shares, cpu_quota=quota, cpu_period=period, memory_limit_in_bytes=memory
    )


_VAR_RE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion: defined variables are replaced, `$$` escapes a `$`,
    undefined references stay as written."""

    def repl(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)

    return _VAR_RE.sub(repl, text)


def _subscript(path: str, prefix: str) -> str | None:
    m = re.fullmatch(re.escape(prefix) + r"\['(.+)'\]", path)
    return m.group(1) if m else None


def field_ref(pod: Obj, path: str, *, pod_ip: str, host_ip: str) -> str:
    """The value of a downward-API fieldRef; raises ValueError for an unsupported path."""
    m, spec = _meta(pod), _spec(pod)
    simple = {
        "metadata.name": m.get("name"),
        "metadata.namespace": m.get("namespace"),
        "metadata.uid": m.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
        "status.hostIP": host_ip,
        "status.hostIPs": host_ip,
    }
    if path in simple:
        return str(simple[path] or "")
    for prefix, source in (("metadata.labels", "labels"), ("metadata.annotations", "annotations")):
        key = _subscript(path, prefix)
        if key is not None:
            return str((m.get(source) or {}).get(key, ""))
    raise ValueError(f"unsupported fieldRef fieldPath {path!r}")


def referenced_objects(pod: Obj) -> set[tuple[str, str]]:
    """(kind, name) of every ConfigMap and Secret the pod uses (env, envFrom, volumes)."""
    out: set[tuple[str, str]] = set()
    spec = _spec(pod)
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        for e in c.get("env") or []:
            vf = e.get("valueFrom") or {}
            if (vf.get("configMapKeyRef") or {}).get("name"):
                out.add(("ConfigMap", vf["configMapKeyRef"]["name"]))
            if (vf.get("secretKeyRef") or {}).get("name"):
                out.add(("Secret", vf["secretKeyRef"]["name"]))
        for ef in c.get("envFrom") or []:
            if (ef.get("configMapRef") or {}).get("name"):
                out.add(("ConfigMap", ef["configMapRef"]["name"]))
            if (ef.get("secretRef") or {}).get("name"):
                out.add(("Secret", ef["secretRef"]["name"]))
    for v in spec.get("volumes") or []:
        if (v.get("configMap") or {}).get("name"):
            out.add(("ConfigMap", v["configMap"]["name"]))
        if (v.get("secret") or {}).get("secretName"):
            out.add(("Secret", v["secret"]["secretName"]))
    return out


def _object_data(kind: str, obj: Obj) -> dict[str, bytes]:
    """A ConfigMap's data/binaryData or a Secret's (base64-decoded) data, as bytes."""
    out: dict[str, bytes] = {}
    if kind == "Secret":
        for k, v in (obj.get("data") or {}).items():
            out[str(k)] = base64.b64decode(str(v))
        for k, v in (obj.get("stringData") or {}).items():
            out[str(k)] = str(v).encode()
        return out
    for k, v in (obj.get("data") or {}).items():
        out[str(k)] = str(v).encode()
    for k, v in (obj.get("binaryData") or {}).items():
        out[str(k)] = base64.b64decode(str(v))
    return out


# ---------------------------------------------------------------------------------- status
def _terminated(cs: ContainerStatus, runtime_name: str) -> Obj:
    reason = cs.reason or ("Completed" if cs.exit_code == 0 else "Error")
    out: Obj = {
        "exitCode": cs.exit_code,
        "reason": reason,
        "startedAt": _ns_time(cs.started_at) if cs.started_at else None,
        "finishedAt": _ns_time(cs.finished_at) if cs.finished_at else None,
        "containerID": f"{runtime_name}://{cs.id}",
    }
    if cs.message:
        out["message"] = cs.message
    return out


@dataclass
class StatusInputs:
    """What `pod_status` needs besides the pod and the runtime view."""

    host_ip: str
    runtime_name: str
    start_time: str
    waiting: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    probes: Mapping[str, tuple[bool, bool]] = field(default_factory=dict)  # cid -> ready, started
    previous: Obj | None = None  # the last status written (for lastTransitionTime)
    now: float = 0.0


def _container_statuses(
    specs: list[Obj], view: PodView, inp: StatusInputs, *, pending_reason: str
) -> list[Obj]:
    out = []
    for c in specs:
        name = str(c.get("name", ""))
        latest, prev = view.latest(name), view.previous(name)
        waiting = inp.waiting.get(name)
        state: Obj
        last: Obj = {}
        ready = started = False
        cid = ""
        if latest is None:
            reason, message = waiting or (pending_reason, "")
            state = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
        else:
            cid = latest.id
            if latest.state == ContainerState.RUNNING:
                state = {"running": {"startedAt": _ns_time(latest.started_at or latest.created_at)}}
                ready, started = inp.probes.get(latest.id, (True, True))
                if prev is not None and prev.state == ContainerState.EXITED:
                    last = {"terminated": _terminated(prev, inp.runtime_name)}
            elif latest.state == ContainerState.EXITED:
                if waiting is not None:
                    reason, message = waiting
                    state = {"waiting": {"reason": reason, "message": message}}
                    last = {"terminated": _terminated(latest, inp.runtime_name)}
                else:
                    state = {"terminated": _terminated(latest, inp.runtime_name)}
                    if prev is not None and prev.state == ContainerState.EXITED:
                        last = {"terminated": _terminated(prev, inp.runtime_name)}
            else:
                reason, message = waiting or ("ContainerCreating", "")
                state = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
                if prev is not None and prev.state == ContainerState.EXITED:
                    last = {"terminated": _terminated(prev, inp.runtime_name)}
        status: Obj = {
            "name": name,
            "state": state,
            "lastState": last,
            "ready": ready,
            "started": started,
            "restartCount": max(0, latest.attempt) if latest else 0,
            "image": str(c.get("image", "")),
            "imageID": (latest.image_ref if latest else "") or "",
        }
        if cid:
            status["containerID"] = f"{inp.runtime_name}://{cid}"
        out.append(status)
    return out


def init_progress(pod: Obj, view: PodView) -> tuple[bool, bool, list[str]]:
    """(initialized, an init container failed last, names of init containers not done)."""
    spec = _spec(pod)
    pending: list[str] = []
    failed = False
    for c in spec.get("initContainers") or []:
        latest = view.latest(str(c.get("name", "")))
        if latest is not None and latest.state == ContainerState.EXITED:
            if latest.exit_code == 0:
                continue
            failed = True
        pending.append(str(c.get("name", "")))
    started_main = any(view.latest(str(c.get("name", ""))) for c in spec.get("containers") or [])
    return (not pending) or started_main, failed, pending


def pod_phase(
    pod: Obj, view: PodView, statuses: list[Obj], init_failed: bool, initialized: bool
) -> str:
    """kubelet's getPhase over the computed container statuses."""
    policy = _spec(pod).get("restartPolicy") or "Always"
    if init_failed and policy == "Never":
        return "Failed"
    if not initialized:
        return "Pending"
    running = waiting = stopped = succeeded = 0
    for s in statuses:
        state = s["state"]
        if "running" in state:
            running += 1
        elif "terminated" in state:
            stopped += 1
            if state["terminated"].get("exitCode") == 0:
                succeeded += 1
        elif "terminated" in (s.get("lastState") or {}):
            stopped += 1
        else:
            waiting += 1
    if waiting:
        return "Pending"
    if running:
        return "Running"
    if stopped:
        if policy == "Always":
            return "Running"
        if stopped == succeeded:
            return "Succeeded"
        if policy == "Never":
            return "Failed"
        return "Running"
    return "Pending"


def pod_status(pod: Obj, view: PodView, inp: StatusInputs) -> Obj:
    """The status the agent reports for `pod` (pure). A terminal phase, once reported, stays."""
    spec = _spec(pod)
    initialized, init_failed, init_pending = init_progress(pod, view)
    init_statuses = _container_statuses(
        list(spec.get("initContainers") or []), view, inp, pending_reason="PodInitializing"
    )
    statuses = _container_statuses(
        list(spec.get("containers") or []),
        view,
        inp,
        pending_reason="ContainerCreating" if initialized else "PodInitializing",
    )
    phase = pod_phase(pod, view, statuses, init_failed, initialized)
    before = inp.previous or {}
    if before.get("phase") in TERMINAL:
        phase = str(before["phase"])
    old_conditions = {
        c.get("type"): c for c in before.get("conditions") or [] if isinstance(c, dict)
    }
    stamp = now_rfc3339(inp.now)

    def cond(type_: str, ok: bool, reason: str = "", message: str = "") -> Obj:
        status = "True" if ok else "False"
        old = old_conditions.get(type_) or {}
        out: Obj = {
            "type": type_,
            "status": status,
            "lastProbeTime": None,
            "lastTransitionTime": old.get("lastTransitionTime", stamp)
            if old.get("status") == status
            else stamp,
        }
        if not ok and reason:
            out["reason"] = reason
        if not ok and message:
            out["message"] = message
        return out

    unready = [s["name"] for s in statuses if not s["ready"]]
    terminal = phase in TERMINAL
    if terminal:
        ready_reason, ready_message = "PodCompleted", ""
    else:
        ready_reason = "ContainersNotReady"
        ready_message = f"containers with unready status: [{' '.join(unready)}]"
    all_ready = not unready and not terminal
    conditions = [
        cond(
            "Initialized",
            initialized,
            "ContainersNotInitialized",
            f"containers with incomplete status: [{' '.join(init_pending)}]",
        ),
        cond("Ready", all_ready, ready_reason, ready_message),
        cond("ContainersReady", all_ready, ready_reason, ready_message),
        cond("PodScheduled", True),
    ]
    if terminal and initialized:
        conditions[0] = cond("Initialized", True)
    status: Obj = {
        "phase": phase,
        "conditions": conditions,
        "hostIP": inp.host_ip,
        "hostIPs": [{"ip": inp.host_ip}],
        "startTime": inp.start_time,
        "containerStatuses": statuses,
    }
    pod_ip = inp.host_ip if spec.get("hostNetwork") else view.pod_ip
    if not pod_ip:
        pod_ip = str((before or {}).get("podIP") or "")
    if pod_ip:
        status["podIP"] = pod_ip
        status["podIPs"] = [{"ip": pod_ip}]
    if init_statuses:
        status["initContainerStatuses"] = init_statuses
    return status


# ---------------------------------------------------------------------------------- context
class EventSink(Protocol):
    def record(self, obj: Obj, type: str, reason: str, message: str) -> None: ...


class ObjectSource(Protocol):
    async def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        """The ConfigMap/Secret, or None if it does not exist (or is unknown offline)."""
        ...


class ProbesFactory(Protocol):
    def __call__(
        self,
        container: Obj,
        container_id: str,
        *,
        pod_ip: str,
        host_ip: str,
        started_ago: float,
        on_result: Callable[[Any], None],
    ) -> Any: ...


@dataclass
class WorkerOptions:
    backoff_initial: float = 10.0  # CrashLoopBackOff and image pull back-off
    backoff_max: float = 300.0
    backoff_reset: float = (
        600.0  # an entry idle this long (container ran 10 min) restarts at initial
    )
    resync_interval: float = 10.0  # a worker re-syncs at least this often
    error_retry: float = 2.0  # after a failed API write or runtime call
    pull_timeout: float = 600.0


@dataclass
class WorkerContext:
    """What the agent gives every worker."""

    runtime: RuntimeService
    client: Client
    store: LocalStore
    objects: ObjectSource
    events: EventSink
    node_name: str
    host_ip: str
    data_dir: Path
    options: WorkerOptions = field(default_factory=WorkerOptions)
    clock: Callable[[], float] = time.time
    runtime_name: str = "containerd"
    node_cpus: int = 1
    node_memory: int = 0
    probes: ProbesFactory | None = None
    connected: Callable[[], bool] = lambda: True  # False: skip API writes (retried on reconnect)


class _Waiting(Exception):
    """A container cannot be started now: its waiting reason and message."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


# ---------------------------------------------------------------------------------- the worker
class PodWorker:
    """The worker of one pod UID (module doc). `update`/`mark_removed`/`poke` are sync and
    never block; `run` returns once the pod is terminated and forgotten."""

    def __init__(self, ctx: WorkerContext, pod: Obj) -> None:
        self.ctx = ctx
        self.pod = pod
        self.uid = str(_meta(pod).get("uid", ""))
        self.key = _key(pod)
        self.removed = False  # gone from the API (deleted, or absent from a relist)
        self.finished = trio.Event()
        self.syncs = 0
        self._wake = trio.Event()
        opts = ctx.options
        self.crash = Backoff(opts.backoff_initial, opts.backoff_max, opts.backoff_reset)
        self.retry = Backoff(opts.backoff_initial, opts.backoff_max, opts.backoff_reset)
        self.waiting: dict[str, tuple[str, str]] = {}
        self._retry_at: dict[str, float] = {}  # container name -> trio time of the next try
        self._status_cache: dict[str, ContainerStatus] = {}
        self._sandbox_ips: dict[str, str] = {}
        self._max_attempt: dict[str, int] = {}
        self._sandbox_attempt = -1
        self._reported: Obj | None = None
        self.last_status: Obj | None = None  # the last status computed (written or not)
        self._reported_phase = str((pod.get("status") or {}).get("phase") or "")
        self._seen = time.monotonic()  # agent_pod_start_duration_seconds starts here
        self._stopped = False
        self._start_time = str((pod.get("status") or {}).get("startTime") or "")
        self._probes: dict[str, tuple[trio.CancelScope, Any]] = {}  # cid -> scope, probes
        self._kill: set[str] = set()  # container ids to restart (liveness/startup failed)
        self._nursery: trio.Nursery | None = None

    # ------------------------------------------------------------------ inputs
    def update(self, pod: Obj) -> None:
        self.pod = pod
        self._wake.set()

    def mark_removed(self) -> None:
        self.removed = True
        self._wake.set()

    def poke(self) -> None:
        self._wake.set()

    def force_report(self) -> None:
        """Write the status at the next sync even if it did not change (after a reconnect)."""
        self._reported = None
        self._wake.set()

    @property
    def terminating(self) -> bool:
        return self.removed or bool(_meta(self.pod).get("deletionTimestamp"))

    # ------------------------------------------------------------------ loop
    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            while True:
                self._wake = trio.Event()
                try:
                    wake_at = await self._sync()
                except CriError as exc:
                    log.warning("pod %s: runtime: %s; retrying", self.key, exc)
                    wake_at = trio.current_time() + self.ctx.options.error_retry
                except trio.TooSlowError:
                    log.warning("pod %s: a runtime or API call timed out; retrying", self.key)
                    wake_at = trio.current_time() + self.ctx.options.error_retry
                self.syncs += 1
                if wake_at is None:
                    break
                with trio.move_on_at(wake_at):
                    await self._wake.wait()
            nursery.cancel_scope.cancel()
        self.finished.set()

    # ------------------------------------------------------------------ observing
    async def observe(self) -> PodView:
        rt = self.ctx.runtime
        labels = {LABEL_POD_UID: self.uid}
        with trio.fail_after(RUNTIME_TIMEOUT):
            sandboxes = await rt.list_pod_sandbox(labels=labels)
            listed = await rt.list_containers(labels=labels)
        view = PodView(sandboxes=sorted(sandboxes, key=lambda s: (s.attempt, s.created_at)))
        live_ids = set()
        for c in listed:
            live_ids.add(c.id)
            cached = self._status_cache.get(c.id)
            if cached is None or cached.state != c.state or c.state != ContainerState.EXITED:
                try:
                    with trio.fail_after(RUNTIME_TIMEOUT):
                        cached = await rt.container_status(c.id)
                except NotFound:
                    continue
                self._status_cache[c.id] = cached
            name = c.labels.get(LABEL_CONTAINER_NAME, c.name)
            view.containers.setdefault(name, []).append(cached)
            self._max_attempt[name] = max(self._max_attempt.get(name, -1), cached.attempt)
        for gone in set(self._status_cache) - live_ids:
            del self._status_cache[gone]
        for hist in view.containers.values():
            hist.sort(key=lambda s: (s.attempt, s.created_at))
        sb = view.ready_sandbox
        if sb is not None:
            ip = self._sandbox_ips.get(sb.id)
            if ip is None:
                with trio.fail_after(RUNTIME_TIMEOUT):
                    ip = (await rt.pod_sandbox_status(sb.id)).ip
                self._sandbox_ips[sb.id] = ip
            view.pod_ip = ip
        for s in sandboxes:
            self._sandbox_attempt = max(self._sandbox_attempt, s.attempt)
        return view

    # ------------------------------------------------------------------ sync
    async def _sync(self) -> float | None:
        view = await self.observe()
        if self.terminating:
            return await self._terminate(view)
        now_t = trio.current_time()
        wake_at = now_t + self.ctx.options.resync_interval
        if not self._start_time:
            self._start_time = now_rfc3339(self.ctx.clock())
        if self._reported_phase in TERMINAL:
            await self._stop_sandboxes(view, remove=False)
            self._cancel_probes(set())
            await self._report(view)
            return math.inf
        acted, next_due = await self._converge(view)
        if next_due is not None:
            wake_at = min(wake_at, next_due)
        if acted:
            view = await self.observe()
        self._sync_probes(view)
        phase = await self._report(view)
        if phase in TERMINAL:
            await self._stop_sandboxes(view, remove=False)
            self._cancel_probes(set())
            return math.inf
        return wake_at

    async def _converge(self, view: PodView) -> tuple[bool, float | None]:
        """Do one round of actions; (whether anything was done, the next timer due)."""
        pod, spec = self.pod, _spec(self.pod)
        policy = spec.get("restartPolicy") or "Always"
        sandbox = view.ready_sandbox
        if sandbox is None:
            return await self._ensure_sandbox(view), trio.current_time() + 1.0
        sb_config = sandbox_config(
            pod, sandbox.attempt, node=self.ctx.node_name, data_dir=self.ctx.data_dir
        )
        due: list[float] = []
        acted = False
        # liveness/startup failures: stop the container; it restarts per restartPolicy below
        for cs in view.all():
            if cs.id in self._kill and cs.state == ContainerState.RUNNING:
                grace = int(spec.get("terminationGracePeriodSeconds") or DEFAULT_GRACE)
                with trio.fail_after(grace + RUNTIME_TIMEOUT):
                    await self.ctx.runtime.stop_container(cs.id, grace)
                acted = True
        self._kill.clear()
        if acted:
            return True, trio.current_time()
        # init containers, in order
        initialized, _, _ = init_progress(pod, view)
        if not initialized:
            for c in spec.get("initContainers") or []:
                name = str(c.get("name", ""))
                latest = view.latest(name)
                if latest is not None and latest.state == ContainerState.EXITED:
                    if latest.exit_code == 0:
                        continue
                    if policy == "Never":
                        return acted, None  # the pod failed (pod_phase says so)
                    started, when = await self._restart(c, "init", latest, view, sandbox, sb_config)
                elif latest is None:
                    started, when = await self._create_and_start(
                        c, "init", view, sandbox, sb_config
                    )
                else:
                    if latest.state == ContainerState.CREATED:
                        started, when = await self._start_created(latest)
                    else:
                        started, when = False, None
                acted = acted or started
                if when is not None:
                    due.append(when)
                break  # one init container at a time
            return acted, min(due) if due else None
        for c in spec.get("containers") or []:
            name = str(c.get("name", ""))
            latest = view.latest(name)
            when = None
            started = False
            if latest is None:
                started, when = await self._create_and_start(c, "regular", view, sandbox, sb_config)
            elif latest.state == ContainerState.EXITED:
                if policy == "Always" or (policy == "OnFailure" and latest.exit_code != 0):
                    started, when = await self._restart(
                        c, "regular", latest, view, sandbox, sb_config
                    )
            elif latest.state == ContainerState.CREATED:
                started, when = await self._start_created(latest)
            acted = acted or started
            if when is not None:
                due.append(when)
        return acted, min(due) if due else None

    # ------------------------------------------------------------------ sandbox
    async def _ensure_sandbox(self, view: PodView) -> bool:
        rt, pod = self.ctx.runtime, self.pod
        host_network = bool(_spec(pod).get("hostNetwork"))
        if not host_network:
            with trio.fail_after(RUNTIME_TIMEOUT):
                st = await rt.status()
            if not st.network_ready:
                cond = st.condition("NetworkReady")
                why = f"{cond.reason}: {cond.message}" if cond else "no NetworkReady condition"
                self._event(
                    "Warning",
                    "NetworkNotReady",
                    f"network is not ready: container runtime network not ready: {why}",
                )
                return False
        if view.sandboxes:  # dead sandboxes: remove them (and their containers) first
            if any(view.all()):
                self._event(
                    "Normal",
                    "SandboxChanged",
                    "Pod sandbox changed, it will be killed and re-created.",
                )
            await self._stop_sandboxes(view, remove=True)
        attempt = self._sandbox_attempt + 1
        config = sandbox_config(pod, attempt, node=self.ctx.node_name, data_dir=self.ctx.data_dir)
        try:
            await trio.to_thread.run_sync(_mkdirs, Path(config.log_directory))
            with trio.fail_after(RUNTIME_TIMEOUT):
                await rt.run_pod_sandbox(config)
        except RuntimeFailure as exc:
            self._event(
                "Warning",
                "FailedCreatePodSandBox",
                f"Failed to create pod sandbox: {exc.message}",
            )
            return False
        self._sandbox_attempt = attempt
        return True

    async def _stop_sandboxes(self, view: PodView, *, remove: bool) -> None:
        rt = self.ctx.runtime
        for sb in view.sandboxes:
            with trio.fail_after(RUNTIME_TIMEOUT):
                if sb.state == SandboxState.READY:
                    await rt.stop_pod_sandbox(sb.id)
                if remove:
                    await rt.remove_pod_sandbox(sb.id)

    # ------------------------------------------------------------------ containers
    async def _restart(
        self,
        c: Obj,
        kind: str,
        latest: ContainerStatus,
        view: PodView,
        sandbox: PodSandbox,
        sb_config: PodSandboxConfig,
    ) -> tuple[bool, float | None]:
        name = str(c.get("name", ""))
        finished = latest.finished_at / 1e9 if latest.finished_at else self.ctx.clock()
        now = self.ctx.clock()
        if name not in self.waiting or self.waiting[name][0] == "CrashLoopBackOff":
            if self.crash.in_backoff_since(name, finished, now):
                delay = self.crash.get(name)
                m = _meta(self.pod)
                self.waiting[name] = (
                    "CrashLoopBackOff",
                    f"back-off {go_duration(delay)} restarting failed container={name} "
                    f"pod={m.get('name', '')}_{m.get('namespace', '')}({self.uid})",
                )
                return False, trio.current_time() + max(0.0, finished + delay - now)
            self.crash.next(name, finished)
            self.waiting.pop(name, None)
        return await self._create_and_start(c, kind, view, sandbox, sb_config)

    async def _start_created(self, cs: ContainerStatus) -> tuple[bool, float | None]:
        try:
            with trio.fail_after(RUNTIME_TIMEOUT):
                await self.ctx.runtime.start_container(cs.id)
        except RuntimeFailure as exc:
            self._fail(cs.name, "RunContainerError", exc.message)
            with trio.fail_after(RUNTIME_TIMEOUT):
                await self.ctx.runtime.remove_container(cs.id)
            return False, self._retry_at.get(cs.name)
        return True, None

    def _fail(self, name: str, reason: str, message: str) -> None:
        """Record a waiting reason for container `name`, with a retry after a back-off."""
        first = self.waiting.get(name, ("", ""))[0] != reason
        self.waiting[name] = (reason, message)
        delay = self.retry.next(f"retry/{name}", self.ctx.clock())
        self._retry_at[name] = trio.current_time() + delay
        if first or reason != "ImagePullBackOff":
            self._event("Warning", "Failed", f"Error: {reason}: {message}" if first else message)

    async def _create_and_start(
        self, c: Obj, kind: str, view: PodView, sandbox: PodSandbox, sb_config: PodSandboxConfig
    ) -> tuple[bool, float | None]:
        name = str(c.get("name", ""))
        reason = self.waiting.get(name, ("", ""))[0]
        if reason in _WAITING_RETRY:
            at = self._retry_at.get(name, 0.0)
            if trio.current_time() < at:
                if reason == "ErrImagePull":
                    self.waiting[name] = (
                        "ImagePullBackOff",
                        f'Back-off pulling image "{c.get("image", "")}"',
                    )
                return False, at
        rt = self.ctx.runtime
        try:
            image_ref = await self._ensure_image(c)
            attempt = self._max_attempt.get(name, -1) + 1
            config = await self._container_config(c, kind, attempt, view.pod_ip)
        except _Waiting as w:
            self._fail(name, w.reason, w.message)
            return False, self._retry_at[name]
        config = ContainerConfig(**{**config.__dict__, "image": image_ref or config.image})
        try:
            with trio.fail_after(RUNTIME_TIMEOUT):
                cid = await rt.create_container(sandbox.id, config, sb_config)
        except NotFound:
            return False, trio.current_time()  # the sandbox went away: the next sync makes one
        except RuntimeFailure as exc:
            self._fail(name, "CreateContainerError", exc.message)
            return False, self._retry_at[name]
        self._max_attempt[name] = attempt
        self._event("Normal", "Created", f"Created container {name}")
        try:
            with trio.fail_after(RUNTIME_TIMEOUT):
                await rt.start_container(cid)
        except RuntimeFailure as exc:
            self._fail(name, "RunContainerError", exc.message)
            return True, self._retry_at[name]
        self._event("Normal", "Started", f"Started container {name}")
        self.waiting.pop(name, None)
        self.retry.forget(f"retry/{name}")
        self._retry_at.pop(name, None)
        # keep the current and the previous container of this name; older ones go
        for old in view.containers.get(name, [])[:-1]:
            if old.state == ContainerState.EXITED:
                with trio.fail_after(RUNTIME_TIMEOUT):
                    await rt.remove_container(old.id)
        return True, None

    async def _ensure_image(self, c: Obj) -> str:
        image = str(c.get("image") or "")
        if not image:
            raise _Waiting("InvalidImageName", "the container has no image")
        policy = c.get("imagePullPolicy") or (
            "Always"
            if ":" not in image.rsplit("/", 1)[-1] or image.endswith(":latest")
            else "IfNotPresent"
        )
        rt = self.ctx.runtime
        with trio.fail_after(RUNTIME_TIMEOUT):
            present = await rt.image_status(image)
        if policy == "Never":
            if present is None:
                raise _Waiting(
                    "ErrImageNeverPull",
                    f'Container image "{image}" is not present with pull policy of Never',
                )
            return present.id
        if policy == "IfNotPresent" and present is not None:
            return present.id
        self._event("Normal", "Pulling", f'Pulling image "{image}"')
        try:
            with trio.fail_after(self.ctx.options.pull_timeout):
                ref = await rt.pull_image(image)
        except (CriError, trio.TooSlowError) as exc:
            why = exc.message if isinstance(exc, CriError) else "timed out"
            if present is not None:  # offline with the image at hand: run what we have
                self._event(
                    "Warning",
                    "Failed",
                    f'Failed to pull image "{image}": {why}; using the image present on the node',
                )
                return present.id
            raise _Waiting(
                "ErrImagePull",
                f'failed to pull image "{image}": {why} (the image is not on this node and could '
                "not be pulled: is the registry reachable? import it with "
                "`ctr -n k8s.io images import`, or set imagePullPolicy)",
            ) from None
        self._event("Normal", "Pulled", f'Successfully pulled image "{image}"')
        return ref or image

    async def _container_config(
        self, c: Obj, kind: str, attempt: int, pod_ip: str
    ) -> ContainerConfig:
        pod = self.pod
        m = _meta(pod)
        name = str(c.get("name", ""))
        env = await self._env(c, pod_ip)
        mounts = await self._mounts(c)
        labels = {
            LABEL_AGENT: self.ctx.node_name,
            LABEL_POD_UID: self.uid,
            LABEL_POD_NAME: str(m.get("name", "")),
            LABEL_POD_NAMESPACE: str(m.get("namespace", "")),
            LABEL_CONTAINER_NAME: name,
            LABEL_CONTAINER_KIND: kind,
        }
        try:
            resources = linux_resources(c)
        except ValueError as exc:
            raise _Waiting("CreateContainerConfigError", f"invalid resources: {exc}") from None
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

    async def _object(self, kind: str, name: str, optional: bool) -> Obj | None:
        ns = str(_meta(self.pod).get("namespace", ""))
        obj = await self.ctx.objects.get(kind, ns, name)
        if obj is None and not optional:
            raise _Waiting("CreateContainerConfigError", f'{kind.lower()} "{name}" not found')
        return obj

    async def _env(self, c: Obj, pod_ip: str) -> dict[str, str]:
        env: dict[str, str] = {}
        host_ip = self.ctx.host_ip
        if _spec(self.pod).get("hostNetwork"):
            pod_ip = host_ip
        for ef in c.get("envFrom") or []:
            prefix = str(ef.get("prefix") or "")
            for kind, ref_key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
                ref = ef.get(ref_key)
                if not isinstance(ref, dict):
                    continue
                obj = await self._object(kind, str(ref.get("name", "")), bool(ref.get("optional")))
                if obj is not None:
                    for k, v in _object_data(kind, obj).items():
                        env[prefix + k] = v.decode("utf-8", "replace")
        for e in c.get("env") or []:
            name = str(e.get("name", ""))
            vf = e.get("valueFrom")
            if not isinstance(vf, dict):
                env[name] = expand(str(e.get("value") or ""), env)
                continue
            for kind, ref_key in (("ConfigMap", "configMapKeyRef"), ("Secret", "secretKeyRef")):
                ref = vf.get(ref_key)
                if not isinstance(ref, dict):
                    continue
                optional = bool(ref.get("optional"))
                obj = await self._object(kind, str(ref.get("name", "")), optional)
                key = str(ref.get("key", ""))
                data = _object_data(kind, obj) if obj is not None else {}
                if key in data:
                    env[name] = data[key].decode("utf-8", "replace")
                elif not optional:
                    raise _Waiting(
                        "CreateContainerConfigError",
                        f"couldn't find key {key} in {kind} "
                        f"{_meta(self.pod).get('namespace', '')}/{ref.get('name', '')}",
                    )
            if isinstance(vf.get("fieldRef"), dict):
                path = str(vf["fieldRef"].get("fieldPath", ""))
                try:
                    env[name] = field_ref(self.pod, path, pod_ip=pod_ip, host_ip=host_ip)
                except ValueError as exc:
                    raise _Waiting("CreateContainerConfigError", str(exc)) from None
            if isinstance(vf.get("resourceFieldRef"), dict):
                env[name] = self._resource_field(c, vf["resourceFieldRef"])
        return env

    def _resource_field(self, c: Obj, ref: Obj) -> str:
        resource = str(ref.get("resource", ""))
        res = c.get("resources") or {}
        section, _, what = resource.partition(".")
        value = (res.get(section) or {}).get(what)
        try:
            if what == "cpu":
                milli = parse_cpu_milli(value) if value is not None else self.ctx.node_cpus * 1000
                divisor = parse_cpu_milli(ref.get("divisor") or "1")
                return str(max(1, math.ceil(milli / max(1, divisor))))
            amount = parse_value(value) if value is not None else self.ctx.node_memory
            return str(math.ceil(amount / max(1, parse_value(ref.get("divisor") or "1"))))
        except ValueError as exc:
            raise _Waiting("CreateContainerConfigError", f"resourceFieldRef: {exc}") from None

    # ------------------------------------------------------------------ volumes
    async def _volume_paths(self) -> dict[str, tuple[Path, bool]]:
        """Materialise the pod's volumes; volume name -> (host path, read-only)."""
        base = pod_dir(self.ctx.data_dir, self.pod) / "volumes"
        out: dict[str, tuple[Path, bool]] = {}
        for v in _spec(self.pod).get("volumes") or []:
            name = str(v.get("name", ""))
            if isinstance(v.get("emptyDir"), dict):
                path = base / "kubernetes.io~empty-dir" / name
                await trio.to_thread.run_sync(_mkdirs, path)
                out[name] = (path, False)
            elif isinstance(v.get("hostPath"), dict):
                hp = v["hostPath"]
                path = Path(str(hp.get("path", "")))
                err = await trio.to_thread.run_sync(_host_path, path, str(hp.get("type") or ""))
                if err:
                    raise _Waiting("CreateContainerConfigError", f'volume "{name}": {err}')
                out[name] = (path, False)
            elif isinstance(v.get("configMap"), dict) or isinstance(v.get("secret"), dict):
                is_secret = isinstance(v.get("secret"), dict)
                src = v["secret"] if is_secret else v["configMap"]
                kind = "Secret" if is_secret else "ConfigMap"
                ref = str(src.get("secretName" if is_secret else "name", ""))
                plugin = "kubernetes.io~secret" if is_secret else "kubernetes.io~configmap"
                obj = await self._object(kind, ref, bool(src.get("optional")))
                data = _object_data(kind, obj) if obj is not None else {}
                files = _projection(data, src, kind, ref)
                path = base / plugin / name
                await trio.to_thread.run_sync(_write_files, path, files)
                out[name] = (path, True)
            else:
                kinds = [k for k in v if k != "name"]
                raise _Waiting(
                    "CreateContainerConfigError",
                    f'volume "{name}": unsupported volume type {", ".join(kinds) or "(none)"} '
                    "(this agent supports emptyDir, hostPath, configMap and secret)",
                )
        return out

    async def _mounts(self, c: Obj) -> list[Mount]:
        if not c.get("volumeMounts"):
            return []
        volumes = await self._volume_paths()
        mounts = []
        for vm in c.get("volumeMounts") or []:
            vname = str(vm.get("name", ""))
            if vname not in volumes:
                raise _Waiting("CreateContainerConfigError", f'volume "{vname}" is not defined')
            path, readonly = volumes[vname]
            sub = str(vm.get("subPath") or "")
            if sub:
                if sub.startswith("/") or ".." in Path(sub).parts:
                    raise _Waiting("CreateContainerConfigError", f"invalid subPath {sub!r}")
                path = path / sub
                if not readonly:
                    await trio.to_thread.run_sync(_mkdirs, path)
            mounts.append(
                Mount(
                    host_path=str(path.absolute()),
                    container_path=str(vm.get("mountPath", "")),
                    readonly=readonly or bool(vm.get("readOnly")),
                )
            )
        return mounts

    # ------------------------------------------------------------------ probes
    def _sync_probes(self, view: PodView) -> None:
        running = {cs.id: cs for cs in view.all() if cs.state == ContainerState.RUNNING}
        self._cancel_probes(set(running))
        factory = self.ctx.probes
        if factory is None or self._nursery is None:
            return
        specs = {str(c.get("name", "")): c for c in _spec(self.pod).get("containers") or []}
        for cid, cs in running.items():
            c = specs.get(cs.name)
            if cid in self._probes or c is None:
                continue
            if not any(c.get(k) for k in ("livenessProbe", "readinessProbe", "startupProbe")):
                continue
            started = (cs.started_at or cs.created_at) / 1e9
            probes = factory(
                c,
                cid,
                pod_ip=self.ctx.host_ip if _spec(self.pod).get("hostNetwork") else view.pod_ip,
                host_ip=self.ctx.host_ip,
                started_ago=max(0.0, self.ctx.clock() - started),
                on_result=self._on_probe,
            )
            scope = trio.CancelScope()
            self._probes[cid] = (scope, probes)
            self._nursery.start_soon(self._run_probes, scope, probes)

    @staticmethod
    async def _run_probes(scope: trio.CancelScope, probes: Any) -> None:
        with scope:
            await probes.run()
            await trio.sleep_forever()  # keep the results readable until the container stops

    def _cancel_probes(self, keep: set[str]) -> None:
        for cid in list(self._probes):
            if cid not in keep:
                self._probes.pop(cid)[0].cancel()

    def _on_probe(self, event: Any) -> None:
        kind = str(getattr(getattr(event, "kind", ""), "value", getattr(event, "kind", "")))
        result = str(getattr(getattr(event, "result", ""), "value", getattr(event, "result", "")))
        name = str(getattr(event, "container", ""))
        cid = str(getattr(event, "container_id", ""))
        message = str(getattr(event, "message", ""))
        if result == "Failure":
            self._event("Warning", "Unhealthy", f"{kind.capitalize()} probe failed: {message}")
            if kind in ("liveness", "startup"):
                self._event(
                    "Normal",
                    "Killing",
                    f"Container {name} failed {kind} probe, will be restarted",
                )
                self._kill.add(cid)
        self._wake.set()

    def _probe_states(self) -> dict[str, tuple[bool, bool]]:
        out = {}
        for cid, (_, probes) in self._probes.items():
            out[cid] = (
                bool(getattr(probes, "ready", True)),
                bool(getattr(probes, "started", True)),
            )
        return out

    # ------------------------------------------------------------------ status
    async def _report(self, view: PodView) -> str:
        """Write the status if it changed; returns the phase."""
        inputs = StatusInputs(
            host_ip=self.ctx.host_ip,
            runtime_name=self.ctx.runtime_name,
            start_time=self._start_time,
            waiting=self.waiting,
            probes=self._probe_states(),
            previous=self._reported or (self.pod.get("status") or None),
            now=self.ctx.clock(),
        )
        status = pod_status(self.pod, view, inputs)
        self.last_status = status
        phase = str(status["phase"])
        if status == self._reported:
            return phase
        body: Obj = {"status": status}
        if self._reported is not None:  # fields that went away are removed (merge patch null)
            for k in self._reported:
                if k not in status:
                    status_patch = body["status"]
                    status_patch[k] = None
        m = _meta(self.pod)
        if phase != self._reported_phase:
            if phase == "Running" and self._reported_phase in ("", "Pending"):
                POD_START_DURATION.observe(time.monotonic() - self._seen)
            # keep the local copy's phase current: a finished pod must not run again after an
            # offline reboot
            self._reported_phase = phase
            local = {**self.pod, "status": {**(self.pod.get("status") or {}), **status}}
            await self.ctx.store.put_pod(local)
        if not self.ctx.connected():
            return phase  # offline: the agent re-reports every pod when it reconnects
        try:
            with trio.fail_after(API_TIMEOUT):
                await self.ctx.client.patch(
                    PODS,
                    str(m.get("name", "")),
                    body,
                    str(m.get("namespace", "")),
                    subresource="status",
                )
        except (ApiError, trio.TooSlowError) as exc:
            if isinstance(exc, ApiError) and exc.code == 404:
                self.removed = True
                self._wake.set()
            else:
                log.info("pod %s: status not written (%s); will retry", self.key, exc)
            return phase
        self._reported = {k: v for k, v in status.items() if v is not None}
        return phase

    # ------------------------------------------------------------------ termination
    def _grace(self) -> int:
        m, spec = _meta(self.pod), _spec(self.pod)
        grace = m.get("deletionGracePeriodSeconds")
        if grace is None:
            grace = spec.get("terminationGracePeriodSeconds")
        return max(0, int(grace if grace is not None else DEFAULT_GRACE))

    async def _terminate(self, view: PodView) -> float | None:
        if not self._stopped:
            grace = self._grace()
            deadline = trio.current_time() + grace
            specs = {
                str(c.get("name", "")): c
                for c in [
                    *(_spec(self.pod).get("initContainers") or []),
                    *(_spec(self.pod).get("containers") or []),
                ]
            }
            self._cancel_probes(set())
            running = [cs for cs in view.all() if cs.state == ContainerState.RUNNING]
            if running:
                self._event(
                    "Normal",
                    "Killing",
                    "Stopping containers: " + ", ".join(cs.name for cs in running),
                )
            async with trio.open_nursery() as nursery:
                for cs in running:
                    nursery.start_soon(self._kill_container, cs, specs.get(cs.name), deadline)
            await self._stop_sandboxes(view, remove=True)
            await trio.to_thread.run_sync(shutil.rmtree, pod_dir(self.ctx.data_dir, self.pod), True)
            self._stopped = True
        m = _meta(self.pod)
        if m.get("deletionTimestamp") and not self.removed:
            try:
                with trio.fail_after(API_TIMEOUT):
                    await self.ctx.client.delete(
                        PODS,
                        str(m.get("name", "")),
                        str(m.get("namespace", "")),
                        grace_period_seconds=0,
                        preconditions={"uid": self.uid},
                    )
            except (ApiError, trio.TooSlowError) as exc:
                if not isinstance(exc, ApiError) or exc.code not in (404, 409):
                    log.info("pod %s: deletion not confirmed (%s); will retry", self.key, exc)
                    return trio.current_time() + self.ctx.options.error_retry
        await self.ctx.store.delete_pod(self.uid)
        return None

    async def _kill_container(self, cs: ContainerStatus, spec: Obj | None, deadline: float) -> None:
        rt = self.ctx.runtime
        pre_stop = ((spec or {}).get("lifecycle") or {}).get("preStop") or {}
        command = (pre_stop.get("exec") or {}).get("command")
        if command:
            left = deadline - trio.current_time()
            with trio.move_on_after(max(0.0, left)):
                try:
                    res = await rt.exec_sync(cs.id, [str(x) for x in command], max(1.0, left))
                    if res.exit_code != 0:
                        self._event(
                            "Warning",
                            "FailedPreStopHook",
                            f"PreStopHook failed: exit code {res.exit_code}: "
                            + (res.stdout + res.stderr).decode("utf-8", "replace").strip(),
                        )
                except CriError as exc:
                    self._event("Warning", "FailedPreStopHook", f"PreStopHook failed: {exc}")
        left = max(0, math.ceil(deadline - trio.current_time()))
        with trio.fail_after(left + RUNTIME_TIMEOUT):
            await rt.stop_container(cs.id, left)

    # ------------------------------------------------------------------ events
    def _event(self, type_: str, reason: str, message: str) -> None:
        self.ctx.events.record(self.pod, type_, reason, message)


# ---------------------------------------------------------------------------------- file helpers
def _mkdirs(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)


def _host_path(path: Path, type_: str) -> str:
    """Prepare or check a hostPath volume; an error text, or ""."""
    if type_ == "DirectoryOrCreate":
        path.mkdir(parents=True, exist_ok=True)
        os.chmod(path, 0o755)
    elif type_ == "FileOrCreate":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(exist_ok=True)
    elif type_ == "Directory" and not path.is_dir():
        return f"hostPath type check failed: {path} is not a directory"
    elif type_ == "File" and not path.is_file():
        return f"hostPath type check failed: {path} is not a file"
    elif type_ == "Socket" and not path.is_socket():
        return f"hostPath type check failed: {path} is not a socket file"
    return ""


def _projection(
    data: Mapping[str, bytes], src: Obj, kind: str, ref: str
) -> dict[str, tuple[bytes, int]]:
    """Files of a configMap/secret volume: relative path -> (content, mode)."""
    raw_mode = src.get("defaultMode")
    default_mode = int(raw_mode) if raw_mode is not None else 0o644
    items = src.get("items")
    if not items:
        return {k: (v, default_mode) for k, v in data.items()}
    out = {}
    for item in items:
        key = str(item.get("key", ""))
        if key not in data:
            if src.get("optional"):
                continue
            raise _Waiting("CreateContainerConfigError", f"couldn't find key {key} in {kind} {ref}")
        rel = str(item.get("path") or key)
        if rel.startswith("/") or ".." in Path(rel).parts:
            raise _Waiting("CreateContainerConfigError", f"invalid item path {rel!r}")
        mode = item.get("mode")
        out[rel] = (data[key], int(mode) if mode is not None else default_mode)
    return out


def _write_files(path: Path, files: Mapping[str, tuple[bytes, int]]) -> None:
    """Make `path` hold exactly `files` (atomically per file; stale files removed)."""
    path.mkdir(parents=True, exist_ok=True)
    wanted = {path / rel for rel in files}
    for rel, (content, mode) in files.items():
        target = path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_bytes(content)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    for existing in path.rglob("*"):
        if existing.is_file() and existing not in wanted:
            with contextlib.suppress(OSError):
                existing.unlink()
