"""The probes of one pod's running containers, kept by the pod's worker (`agent.podworker`).

`PodProbes.sync(pod, view, nursery)` starts a `ProbesFactory` product (`agent.probes`'
`ContainerProbes`) for every running container that configures a probe and has none yet, in the
worker's nursery, and cancels those of containers no longer running. A published result becomes
an event (Unhealthy, and Killing for a liveness or startup failure, whose container id goes
into `kill` for the worker's next sync to stop) and wakes the worker. `states()` gives the
worker's status computation each container's (ready, started).

Invariants: at most one set of probes per container id; a container's probes are cancelled as
soon as a sync no longer sees it running; the result callback never blocks (it records and
wakes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from orchestrator.agent.podcontext import WorkerContext
from orchestrator.agent.podspec import spec_of
from orchestrator.agent.podstatus import PodView
from orchestrator.cri.runtime import ContainerState
from orchestrator.kube.objects import Obj

__all__ = ["PodProbes"]


class PodProbes:
    """The probes of one pod (module doc). `event(type, reason, message)` records an event on the
    pod; `wake()` wakes its worker."""

    def __init__(
        self,
        ctx: WorkerContext,
        event: Callable[[str, str, str], None],
        wake: Callable[[], None],
    ) -> None:
        self.ctx = ctx
        self._event = event
        self._wake = wake
        self._probes: dict[str, tuple[trio.CancelScope, Any]] = {}  # cid -> scope, probes
        self.kill: set[str] = set()  # container ids to restart (liveness/startup failed)

    def sync(self, pod: Obj, view: PodView, nursery: trio.Nursery | None) -> None:
        running = {cs.id: cs for cs in view.all() if cs.state == ContainerState.RUNNING}
        self.cancel(set(running))
        factory = self.ctx.probes
        if factory is None or nursery is None:
            return
        specs = {str(c.get("name", "")): c for c in spec_of(pod).get("containers") or []}
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
                pod_ip=self.ctx.host_ip if spec_of(pod).get("hostNetwork") else view.pod_ip,
                host_ip=self.ctx.host_ip,
                started_ago=max(0.0, self.ctx.clock() - started),
                on_result=self._on_probe,
            )
            scope = trio.CancelScope()
            self._probes[cid] = (scope, probes)
            nursery.start_soon(self._run_probes, scope, probes)

    @staticmethod
    async def _run_probes(scope: trio.CancelScope, probes: Any) -> None:
        with scope:
            await probes.run()
            await trio.sleep_forever()  # keep the results readable until the container stops

    def cancel(self, keep: set[str]) -> None:
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
                self.kill.add(cid)
        self._wake()

    def states(self) -> dict[str, tuple[bool, bool]]:
        out = {}
        for cid, (_, probes) in self._probes.items():
            out[cid] = (
                bool(getattr(probes, "ready", True)),
                bool(getattr(probes, "started", True)),
            )
        return out
