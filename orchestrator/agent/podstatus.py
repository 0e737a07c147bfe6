"""The status the agent reports for a pod, computed purely from the pod and what the runtime
has for it (`PodView`): container statuses (state, lastState, restartCount, readiness from the
probes), the phase (kubelet's getPhase), the conditions (Initialized, Ready, ContainersReady,
PodScheduled, keeping lastTransitionTime while a status does not change), IPs and start time.

Invariant: a terminal phase (Succeeded, Failed), once reported, stays.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from orchestrator.agent.podspec import spec_of
from orchestrator.cri.runtime import ContainerState, ContainerStatus, PodSandbox, SandboxState
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.columns import now_rfc3339

__all__ = ["TERMINAL", "PodView", "StatusInputs", "init_progress", "pod_phase", "pod_status"]

TERMINAL = frozenset({"Succeeded", "Failed"})


def _ns_time(ns: int) -> str:
    return now_rfc3339(ns / 1e9)


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
    spec = spec_of(pod)
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
    policy = spec_of(pod).get("restartPolicy") or "Always"
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
    spec = spec_of(pod)
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
