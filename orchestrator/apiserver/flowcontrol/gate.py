"""`FlowControl`: the gate every API request passes, HTTP or in process — the trio driver of
the pure `fairqueue` core with the `classify` policy.

    async with gate.seat(user, group, resource, namespace):
        ...  # the request, holding its seat

Entering classifies the request (cached per user and resource) and takes a seat: at once when
its level has one free and nobody of its level waits (the fast path: no clock, no hashing, no
checkpoint of its own — the request it guards checkpoints), else it waits in its flow's queue
on a `trio.Event` set by whichever request's exit dispatches it. A bounded wait (HTTP) is
refused with a 429 `TooManyRequests` Status and `Retry-After` when its queue is full or after
`queue_wait` seconds; an unbounded one (the in-process clients: controllers, the scheduler,
the embedded agent, whose callers own their timeouts) waits until dispatched or cancelled.
Leaving returns the seat, on every path: success, error, cancellation; a waiter cancelled
while queued leaves its queue, and one cancelled just after being dispatched returns the seat.

Metrics (kube-apiserver's names, in `REGISTRY` unless given):
`apiserver_flowcontrol_rejected_requests_total{priority_level,flow_schema,reason}`,
`apiserver_flowcontrol_dispatched_requests_total{priority_level,flow_schema}`,
`apiserver_flowcontrol_current_inqueue_requests{priority_level,flow_schema}`,
`apiserver_flowcontrol_current_executing_requests{priority_level,flow_schema}`,
`apiserver_flowcontrol_current_executing_seats{priority_level}`,
`apiserver_flowcontrol_nominal_limit_seats{priority_level}`,
`apiserver_flowcontrol_request_wait_duration_seconds{priority_level,flow_schema,execute}`
(every request, 0 on the fast path; `execute` false for the refused).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from types import TracebackType

import trio

from orchestrator.apiserver.flowcontrol.classify import DEFAULT_LEVELS, Route, classify
from orchestrator.apiserver.flowcontrol.fairqueue import (
    CoreConfig,
    FairQueues,
    LevelConfig,
    LevelStatistics,
    Ticket,
    TicketState,
)
from orchestrator.kube import errors
from orchestrator.metrics import REGISTRY, CounterChild, GaugeChild, HistogramChild, Registry
from orchestrator.security.authn import User

__all__ = ["DEFAULT_MAX_REQUESTS_INFLIGHT", "FlowControl", "FlowControlConfig"]

# kube-apiserver's 400 + 200 (APF divides their sum). Seats mostly wait on Raft, not on the
# CPU: the controllers alone keep ~320 requests in flight while `bench reconcile` creates 3,000
# pods (the ReplicaSet's slow-start batches, the scheduler's binds), and the Raft batches they
# make are what keeps the CPU per write low: 100 seats cost that bench a third of its pods/s.
# What protects the leases is each level's guaranteed seats, not a small total.
DEFAULT_MAX_REQUESTS_INFLIGHT = 600
WAIT_BUCKETS = (0.0, 0.005, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0)
_CACHE_LIMIT = 4096  # classified (user, group, resource) kept; cleared when full


@dataclass(frozen=True, slots=True)
class FlowControlConfig:
    """`max_requests_inflight`: the seats of all levels (0: no gate at all). `queue_wait`:
    seconds a bounded request may wait. `retry_after`: seconds a refusal asks to wait.
    `levels`: the priority levels (`classify.DEFAULT_LEVELS`); a level `classify` names but
    `levels` lacks is replaced by the last non-exempt level of `levels`."""

    max_requests_inflight: int = DEFAULT_MAX_REQUESTS_INFLIGHT
    queue_wait: float = 15.0
    retry_after: int = 1
    levels: tuple[LevelConfig, ...] = DEFAULT_LEVELS

    def __post_init__(self) -> None:
        if self.max_requests_inflight < 0:
            raise ValueError(
                f"max_requests_inflight must be >= 0 (0: unlimited), "
                f"got {self.max_requests_inflight}"
            )
        if self.retry_after < 1:
            raise ValueError(f"retry_after must be >= 1 second, got {self.retry_after}")


class _Metrics:
    def __init__(self, registry: Registry) -> None:
        labels = ["priority_level", "flow_schema"]
        self.rejected = registry.counter(
            "apiserver_flowcontrol_rejected_requests_total",
            "Number of requests rejected by API Priority and Fairness",
            [*labels, "reason"],
        )
        self.dispatched = registry.counter(
            "apiserver_flowcontrol_dispatched_requests_total",
            "Number of requests executed by API Priority and Fairness",
            labels,
        )
        self.inqueue = registry.gauge(
            "apiserver_flowcontrol_current_inqueue_requests",
            "Number of requests currently pending in queues of API Priority and Fairness",
            labels,
        )
        self.executing = registry.gauge(
            "apiserver_flowcontrol_current_executing_requests",
            "Number of requests in initial (for a WATCH) or any (otherwise) execution stage "
            "in API Priority and Fairness",
            labels,
        )
        self.seats = registry.gauge(
            "apiserver_flowcontrol_current_executing_seats",
            "Concurrency (number of seats) occupied by the currently executing requests",
            ["priority_level"],
        )
        self.nominal = registry.gauge(
            "apiserver_flowcontrol_nominal_limit_seats",
            "Nominal number of execution seats configured for each priority level",
            ["priority_level"],
        )
        self.wait = registry.histogram(
            "apiserver_flowcontrol_request_wait_duration_seconds",
            "Length of time a request spent waiting in its queue",
            [*labels, "execute"],
            WAIT_BUCKETS,
        )


class _Class:
    """A classified (user, group, resource): its level and the metric children it touches."""

    __slots__ = (
        "by_namespace",
        "dispatched",
        "executing",
        "inqueue",
        "level",
        "level_name",
        "schema",
        "waited",
    )

    def __init__(self, route: Route, level: int, metrics: _Metrics) -> None:
        self.schema = route.schema
        self.level_name = route.level
        self.level = level
        self.by_namespace = route.by_namespace
        names = (route.level, route.schema)
        self.dispatched: CounterChild = metrics.dispatched.labels(*names)
        self.inqueue: GaugeChild = metrics.inqueue.labels(*names)
        self.executing: GaugeChild = metrics.executing.labels(*names)
        self.waited: HistogramChild = metrics.wait.labels(*names, "true")


class FlowControl:
    """The gate (module doc). One per `Api`; the HTTP app and the in-process clients share it."""

    def __init__(
        self,
        config: FlowControlConfig | None = None,
        *,
        registry: Registry = REGISTRY,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self.config = config = config or FlowControlConfig()
        self.enabled = config.max_requests_inflight > 0
        self._clock = clock
        self._core = FairQueues(
            CoreConfig(
                max(1, config.max_requests_inflight), config.levels, queue_wait=config.queue_wait
            )
        )
        self._metrics = _Metrics(registry)
        self._classes: dict[tuple[User, str, str], _Class] = {}
        core = self._core
        # A configuration without some level of `classify`'s sends its requests to the last
        # counted level (the catch-all: `global-default` in the default configuration).
        self._level_of = {lv.config.name: lv.index for lv in core.levels}
        self._catch_all = [lv.index for lv in core.levels if not lv.config.exempt][-1]
        for lv in core.levels:
            name = lv.config.name
            self._metrics.nominal.labels(name).set(lv.nominal)
            self._metrics.seats.labels(name).set_function(
                partial(_in_use, weakref.ref(core), lv.index)
            )
        self._disabled = _NoSeat()

    def statistics(self) -> dict[str, LevelStatistics]:
        """Per priority level: nominal and guaranteed seats, seats in use, requests waiting."""
        return {lv.config.name: self._core.statistics(lv.index) for lv in self._core.levels}

    def route(self, user: User, group: str, resource: str) -> Route:
        """The flow schema and priority level of a request (for logs and tests)."""
        return classify(user, group, resource)

    def _classify(self, user: User, group: str, resource: str) -> _Class:
        key = (user, group, resource)
        cls = self._classes.get(key)
        if cls is None:
            if len(self._classes) >= _CACHE_LIMIT:
                self._classes.clear()
            route = classify(user, group, resource)
            level = self._level_of.get(route.level, self._catch_all)
            cls = _Class(route, level, self._metrics)
            self._classes[key] = cls
        return cls

    def seat(
        self, user: User, group: str, resource: str, namespace: str = "", *, bounded: bool = True
    ) -> _Seat | _NoSeat:
        """An async context manager holding a seat for one request (module doc)."""
        if not self.enabled:
            return self._disabled
        return _Seat(self, self._classify(user, group, resource), user, namespace, bounded)

    # ---- the slow path -----------------------------------------------------------------------

    async def _wait(self, cls: _Class, user: User, namespace: str, bounded: bool) -> Ticket:
        core = self._core
        flow = f"{user.name}/{namespace}" if cls.by_namespace else user.name
        now = self._clock()
        ticket = core.enqueue(cls.level, flow, 1, now, bounded=bounded)
        if ticket.state is TicketState.EXECUTING:
            self._started(ticket, cls, 0.0)
            return ticket
        if ticket.state is TicketState.REJECTED:
            raise self._refuse(cls, ticket.reason, 0.0)
        ticket.data = (trio.Event(), cls)
        cls.inqueue.inc()
        try:
            with trio.move_on_at(ticket.deadline):  # inf: unbounded
                await ticket.data[0].wait()
        except BaseException:
            if ticket.queued:  # cancelled while waiting
                cls.inqueue.dec()
                self._wake(core.withdraw(ticket, self._clock(), "cancelled"))
                self._count_refusal(cls, "cancelled", self._clock() - now)
            elif ticket.executing:  # dispatched, then cancelled before it could run
                self.finish(ticket, cls)
            raise
        if ticket.queued:  # waited too long
            cls.inqueue.dec()
            self._wake(core.withdraw(ticket, self._clock(), "time-out"))
            raise self._refuse(cls, "time-out", self._clock() - now)
        return ticket

    def _started(self, ticket: Ticket, cls: _Class, waited: float) -> None:
        cls.dispatched.inc()
        cls.executing.inc()
        cls.waited.observe(waited)

    def _wake(self, dispatched: list[Ticket]) -> None:
        now = -1.0
        for ticket in dispatched:
            if ticket.data is None:  # dispatched at enqueue: its caller counts it
                continue
            event, cls = ticket.data
            cls.inqueue.dec()
            if now < 0:
                now = self._clock()
            self._started(ticket, cls, now - ticket.enqueued_at)
            event.set()

    def _count_refusal(self, cls: _Class, reason: str, waited: float) -> None:
        self._metrics.rejected.labels(cls.level_name, cls.schema, reason).inc()
        self._metrics.wait.labels(cls.level_name, cls.schema, "false").observe(waited)

    def _refuse(self, cls: _Class, reason: str, waited: float) -> errors.ApiError:
        self._count_refusal(cls, reason, waited)
        return errors.too_many_requests(
            self.config.retry_after,
            f"Too many requests, please try again later (priority level {cls.level_name}: "
            f"{reason}).",
        )

    def finish(self, ticket: Ticket, cls: _Class) -> None:
        cls.executing.dec()
        core = self._core
        if ticket.queue is None and not core.has_waiting:  # fast path: nobody to wake
            core.finish(ticket, 0.0)
            return
        self._wake(core.finish(ticket, self._clock()))


def _in_use(core_ref: weakref.ref[FairQueues], level: int) -> float:
    # A weak reference: the registry outlives the gates of finished servers (tests).
    core = core_ref()
    return 0.0 if core is None else float(core.statistics(level).in_use)


class _Seat:
    """`FlowControl.seat`'s context manager (one per request)."""

    __slots__ = ("_bounded", "_cls", "_gate", "_namespace", "_ticket", "_user")

    def __init__(
        self, gate: FlowControl, cls: _Class, user: User, namespace: str, bounded: bool
    ) -> None:
        self._gate = gate
        self._cls = cls
        self._user = user
        self._namespace = namespace
        self._bounded = bounded
        self._ticket: Ticket | None = None

    async def __aenter__(self) -> None:
        gate, cls = self._gate, self._cls
        ticket = gate._core.try_dispatch(cls.level)
        if ticket is None:
            ticket = await gate._wait(cls, self._user, self._namespace, self._bounded)
        else:
            gate._started(ticket, cls, 0.0)
        self._ticket = ticket

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        ticket, self._ticket = self._ticket, None
        if ticket is not None:
            self._gate.finish(ticket, self._cls)


class _NoSeat:
    """The gate switched off (`max_requests_inflight` 0): nothing to take or return."""

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None
