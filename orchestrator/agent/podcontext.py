"""What the agent hands every pod worker: `WorkerContext` (the runtime, the API client, the local
store, ConfigMap/Secret lookups, events, probes) and `WorkerOptions` (back-off and retry
timings), with the small protocols of those parts. No logic lives here."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from orchestrator.agent.localstore import LocalStore
from orchestrator.agent.net.clusterview import ClusterView, SnapshotView
from orchestrator.agent.net.poddns import PodDNS
from orchestrator.controllers.runtime.client import Client
from orchestrator.cri.runtime import RuntimeService
from orchestrator.kube.objects import Obj

__all__ = [
    "API_TIMEOUT",
    "RUNTIME_TIMEOUT",
    "EventSink",
    "ObjectSource",
    "ProbesFactory",
    "WorkerContext",
    "WorkerOptions",
]

RUNTIME_TIMEOUT = 60.0  # bound on one runtime call made by a worker (the runtime has its own)
API_TIMEOUT = 10.0  # bound on one API call made by a worker


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
    # Services for the pods' Service env vars (the agent's Service cache; empty until wired)
    cluster: ClusterView = field(default_factory=SnapshotView)
    dns: PodDNS | None = None  # pods' resolv.conf; None: the runtime's default
