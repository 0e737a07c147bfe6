"""`ControllerManager`: runs the controllers on the Raft leader only, fenced to its term.

Theory of operation
-------------------
The manager watches this server's Raft role (`RaftNode.leadership()` and
`wait_role_change()`; any object with those two methods will do, see `Leadership`). When the
server becomes leader in term T it opens a nursery and, in it, builds a fresh world for that
term: an `InProcessClient` whose writes are fenced to T, an `InformerFactory`, an
`EventRecorder`, and the controllers returned by `controllers_factory(ctx)`
(`orchestrator.assembly.default_controllers` in the server). It starts the
informers, the recorder and every controller. When the role or term changes in any way, the
nursery is cancelled: informers, queues and workers stop; nothing survives into the next term
(caches are rebuilt from a LIST, as a newly elected kube-controller-manager does).

Fencing (orchestrator/store/fencing.py has the full argument): every write the controllers make
carries T. Cancellation takes effect at the controllers' next checkpoint, but a write already
on its way cannot land under another leader: the Raft driver appends a fenced write only while
this server leads term T, never forwards it, and an entry of term T appended after a later
leader's election can never commit. So "only the leader runs controllers" holds for their
effects, not just their scheduling: a deposed leader's writes fail (503 ServiceUnavailable,
"fenced") instead of racing the new leader's controllers.

A controller that raises takes the whole term's nursery down; the manager logs it and, if this
server still leads the same term, rebuilds everything after `RESTART_DELAY` (a bug in one
controller must not stop the API server). Metric: `leader_election_master_status{name}` is 1
while this manager runs controllers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import trio

from orchestrator.apiserver.resources import Api
from orchestrator.controllers.runtime.events import EventRecorder
from orchestrator.controllers.runtime.informer import InformerFactory
from orchestrator.controllers.runtime.inprocess import InProcessClient
from orchestrator.controllers.runtime.intern import Interner
from orchestrator.metrics import REGISTRY, Registry
from orchestrator.network.settings import NetworkSettings
from orchestrator.security.authn import User

if TYPE_CHECKING:
    from orchestrator.apiserver.resources import Api

__all__ = [
    "CONTROLLER_MANAGER_USER",
    "Component",
    "ControllerContext",
    "ControllerManager",
    "ControllerOptions",
    "ControllersFactory",
    "Leadership",
]

log = logging.getLogger(__name__)

CONTROLLER_MANAGER_USER = User(
    "system:kube-controller-manager", ("system:controllers", "system:authenticated")
)
COMPONENT = "controller-manager"
RESTART_DELAY = 1.0


class Leadership(Protocol):
    """What the manager needs to know about this server's Raft role (RaftNode has it)."""

    def leadership(self) -> tuple[bool, int]:
        """(this server leads, the current term)."""
        ...

    async def wait_role_change(self) -> None:
        """Return after the next change of role, leader or term."""
        ...


class AlwaysLeader:
    """For a manager without Raft (tests, an `Api` on its own): leads term 0 forever, and the
    writes are not fenced."""

    def leadership(self) -> tuple[bool, int]:
        return True, 0

    async def wait_role_change(self) -> None:
        await trio.sleep_forever()


@dataclass(frozen=True)
class ControllerOptions:
    """Settings of the built-in controllers that users tune (server flags)."""

    # Heartbeat silence before a node is Ready=Unknown and its pods start to be evicted
    # (--node-monitor-grace-period; shorter suits small edge sites on a reliable LAN).
    node_monitor_grace_period: float = 40.0
    node_monitor_period: float = 5.0
    # The cluster's address plan (--cluster-cidr, --service-cidr, ...): the node IPAM
    # controller cuts podCIDRs from it.
    network: NetworkSettings = field(default_factory=NetworkSettings.create)


@dataclass
class ControllerContext:
    """What a controllers factory builds controllers from, for one term of leadership."""

    client: InProcessClient  # writes fenced to `term`
    informers: InformerFactory
    events: EventRecorder
    term: int
    metrics: Registry
    options: ControllerOptions = field(default_factory=ControllerOptions)


class Component(Protocol):
    """What the manager runs for a term: a `Controller`, or any long-lived component with the
    same `run` contract (the scheduler): started in the term's nursery, stopped by cancellation."""

    async def run(self, *, task_status: trio.TaskStatus[None] = ...) -> None: ...


ControllersFactory = Callable[[ControllerContext], Sequence[Component]]


class ControllerManager:
    """Runs `controllers_factory(ctx)`'s controllers while this server leads (see module doc).

    `api`: the API the controllers' in-process client calls. `leadership`: the server's Raft
    node (the controllers' writes are then fenced to the term they run for); without it,
    `AlwaysLeader` and no fencing (tests, an `Api` on its own)."""

    def __init__(
        self,
        api: Api,
        controllers_factory: ControllersFactory,
        *,
        leadership: Leadership | None = None,
        user: User = CONTROLLER_MANAGER_USER,
        host: str = "",
        metrics: Registry = REGISTRY,
        resync: float | None = None,
        options: ControllerOptions | None = None,
    ) -> None:
        self.options = options or ControllerOptions()
        self.api = api
        self._fence = leadership is not None
        self.leadership: Leadership = AlwaysLeader() if leadership is None else leadership
        self.factory = controllers_factory
        self.user = user
        self.host = host
        self.metrics = metrics
        self.resync = resync
        self.term: int | None = None  # the term controllers run for, None when not running
        self.terms_led: list[int] = []
        self.controllers: list[Component] = []
        # The running controllers' shared informers (None when not running), for in-process
        # observers such as `orchestrator bench` that want the same view without a watch.
        self.informers: InformerFactory | None = None
        self._status = metrics.gauge(
            "leader_election_master_status",
            "1 while this process is the leader and runs the controllers",
            ["name"],
        ).labels(COMPONENT)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Follow leadership until cancelled; `started` at once (controllers start later)."""
        task_status.started()
        leadership = self.leadership
        while True:
            leads, term = leadership.leadership()
            if not leads:
                await leadership.wait_role_change()
                continue
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._lead_term, term)
                # No checkpoint between reading the role and waiting: no change is missed.
                while leadership.leadership() == (True, term):
                    await leadership.wait_role_change()
                log.info("controller manager: leadership of term %d lost: stopping", term)
                nursery.cancel_scope.cancel()

    async def _lead_term(self, term: int) -> None:
        while True:
            try:
                await self._run_controllers(term)
                return
            except Exception:
                log.exception("controller manager: a controller failed in term %d", term)
            await trio.sleep(RESTART_DELAY)

    async def _run_controllers(self, term: int) -> None:
        client = InProcessClient(
            self.api, self.user, field_manager=COMPONENT, fence_term=term if self._fence else None
        )
        informers = InformerFactory(  # no managedFields (read by none); sibling pods share
            client, resync=self.resync, metrics=self.metrics, transform=Interner().transform
        )
        events = EventRecorder(client, COMPONENT, self.host, metrics=self.metrics)
        ctx = ControllerContext(client, informers, events, term, self.metrics, self.options)
        controllers = list(self.factory(ctx))
        self.controllers = controllers
        self.informers = informers
        self.term = term
        self.terms_led.append(term)
        self._status.set(1)
        log.info(
            "controller manager: leader in term %d: starting %d controllers", term, len(controllers)
        )
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(events.run)
                informers.start(nursery)
                for c in controllers:
                    nursery.start_soon(c.run)
                informers.start(nursery)  # informers a controller asked for while starting
        finally:
            self.term = None
            self.controllers = []
            self.informers = None
            self._status.set(0)
