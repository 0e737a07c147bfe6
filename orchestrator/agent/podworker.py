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

Back-off: `agent.backoff` (CrashLoopBackOff, ImagePullBackOff, as the kubelet's).

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

Where the parts live: the pure status (`pod_status`, `PodView`) in `agent.podstatus`; the
sandbox and container configuration, environment and images in `agent.podspec`; volumes in
`agent.volumes`; one container's configuration and its stop (preStop hook) in
`agent.containers`; the pod's probes (`PodProbes`) in `agent.podprobes`; what the agent hands
every worker (`WorkerContext`, `WorkerOptions`) in `agent.podcontext`; this module keeps the
worker's loop and its actions.
"""

from __future__ import annotations

import logging
import math
import shutil
import time
from pathlib import Path

import trio

from orchestrator.agent.backoff import Backoff, go_duration
from orchestrator.agent.containers import container_config, stop_container
from orchestrator.agent.podcontext import (
    API_TIMEOUT,
    RUNTIME_TIMEOUT,
    WorkerContext,
    WorkerOptions,
)
from orchestrator.agent.podprobes import PodProbes
from orchestrator.agent.podspec import (
    LABEL_CONTAINER_NAME,
    LABEL_POD_UID,
    ContainerWaiting,
    ensure_image,
    meta_of,
    pod_dir,
    sandbox_config,
    spec_of,
)
from orchestrator.agent.podstatus import TERMINAL, PodView, StatusInputs, init_progress, pod_status
from orchestrator.agent.volumes import mkdirs
from orchestrator.client.resource import PODS
from orchestrator.cri.runtime import (
    ContainerConfig,
    ContainerState,
    ContainerStatus,
    CriError,
    NotFound,
    PodSandbox,
    PodSandboxConfig,
    RuntimeFailure,
    SandboxState,
)
from orchestrator.kube.errors import ApiError
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.columns import now_rfc3339
from orchestrator.observability import POD_START_DURATION

__all__ = ["PodWorker", "WorkerContext", "WorkerOptions"]

log = logging.getLogger(__name__)

DEFAULT_GRACE = 30
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


def _key(pod: Obj) -> str:
    m = meta_of(pod)
    return f"{m.get('namespace', '')}/{m.get('name', '')}"


# ---------------------------------------------------------------------------------- the worker
class PodWorker:
    """The worker of one pod UID (module doc). `update`/`mark_removed`/`poke` are sync and
    never block; `run` returns once the pod is terminated and forgotten."""

    def __init__(self, ctx: WorkerContext, pod: Obj) -> None:
        self.ctx = ctx
        self.pod = pod
        self.uid = str(meta_of(pod).get("uid", ""))
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
        self.probes = PodProbes(ctx, self._event, self.poke)
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
        return self.removed or bool(meta_of(self.pod).get("deletionTimestamp"))

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
            self.probes.cancel(set())
            await self._report(view)
            return math.inf
        acted, next_due = await self._converge(view)
        if next_due is not None:
            wake_at = min(wake_at, next_due)
        if acted:
            view = await self.observe()
        self.probes.sync(self.pod, view, self._nursery)
        phase = await self._report(view)
        if phase in TERMINAL:
            await self._stop_sandboxes(view, remove=False)
            self.probes.cancel(set())
            return math.inf
        return wake_at

    async def _converge(self, view: PodView) -> tuple[bool, float | None]:
        """Do one round of actions; (whether anything was done, the next timer due)."""
        pod, spec = self.pod, spec_of(self.pod)
        policy = spec.get("restartPolicy") or "Always"
        sandbox = view.ready_sandbox
        if sandbox is None:
            return await self._ensure_sandbox(view), trio.current_time() + 1.0
        sb_config = sandbox_config(
            pod,
            sandbox.attempt,
            node=self.ctx.node_name,
            data_dir=self.ctx.data_dir,
            dns=self.ctx.dns,
        )
        due: list[float] = []
        acted = False
        # liveness/startup failures: stop the container; it restarts per restartPolicy below
        for cs in view.all():
            if cs.id in self.probes.kill and cs.state == ContainerState.RUNNING:
                grace = int(spec.get("terminationGracePeriodSeconds") or DEFAULT_GRACE)
                with trio.fail_after(grace + RUNTIME_TIMEOUT):
                    await self.ctx.runtime.stop_container(cs.id, grace)
                acted = True
        self.probes.kill.clear()
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
        host_network = bool(spec_of(pod).get("hostNetwork"))
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
        config = sandbox_config(
            pod, attempt, node=self.ctx.node_name, data_dir=self.ctx.data_dir, dns=self.ctx.dns
        )
        try:
            await trio.to_thread.run_sync(mkdirs, Path(config.log_directory))
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
                m = meta_of(self.pod)
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
            image_ref = await ensure_image(self.ctx, self.pod, c)
            attempt = self._max_attempt.get(name, -1) + 1
            config = await container_config(self.ctx, self.pod, c, kind, attempt, view.pod_ip)
        except ContainerWaiting as w:
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

    # ------------------------------------------------------------------ status
    async def _report(self, view: PodView) -> str:
        """Write the status if it changed; returns the phase."""
        inputs = StatusInputs(
            host_ip=self.ctx.host_ip,
            runtime_name=self.ctx.runtime_name,
            start_time=self._start_time,
            waiting=self.waiting,
            probes=self.probes.states(),
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
        m = meta_of(self.pod)
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
        m, spec = meta_of(self.pod), spec_of(self.pod)
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
                    *(spec_of(self.pod).get("initContainers") or []),
                    *(spec_of(self.pod).get("containers") or []),
                ]
            }
            self.probes.cancel(set())
            running = [cs for cs in view.all() if cs.state == ContainerState.RUNNING]
            if running:
                self._event(
                    "Normal",
                    "Killing",
                    "Stopping containers: " + ", ".join(cs.name for cs in running),
                )
            async with trio.open_nursery() as nursery:
                for cs in running:
                    nursery.start_soon(
                        stop_container,
                        self.ctx.runtime,
                        cs,
                        specs.get(cs.name),
                        deadline,
                        self._event,
                    )
            await self._stop_sandboxes(view, remove=True)
            await trio.to_thread.run_sync(shutil.rmtree, pod_dir(self.ctx.data_dir, self.pod), True)
            self._stopped = True
        m = meta_of(self.pod)
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

    # ------------------------------------------------------------------ events
    def _event(self, type_: str, reason: str, message: str) -> None:
        self.ctx.events.record(self.pod, type_, reason, message)
