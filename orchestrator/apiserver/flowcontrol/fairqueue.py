"""Priority levels with fair queuing: the pure core of API Priority and Fairness (APF).

Theory of operation
-------------------
The server has `total` seats (its concurrency limit, `--max-requests-inflight`). They are
divided among priority levels by shares, as kube-apiserver does:

    nominal(L)    = ceil(seats * shares(L) / sum(shares))      its own seats
    guaranteed(L) = nominal(L) - round(nominal(L) * lendable%(L) / 100)
    total         = sum(nominal)

A request of level L and width w (seats it occupies, 1 for almost everything) may *execute*
when it fits:

    in_use(L) + w <= guaranteed(L)                               always fits, or
    sum over K != L of max(in_use(K), guaranteed(K)) + in_use(L) + w <= total

so a level may borrow every seat nobody else has a guarantee on, and the guaranteed seats of
an idle level are never lent: `sum(max(in_use, guaranteed)) <= total` holds at every step
(`check_invariants`). This is simpler than kube-apiserver's periodic re-division of lendable
seats by demand, and keeps its promise: a level's guaranteed seats are there the moment it
needs them, whatever the other levels do. The `exempt` level never waits and is not counted.

A request that does not fit waits in its level, in one of `queues` FIFO queues chosen by
shuffle sharding: the flow (the user, or user and namespace) is hashed to a hand of
`hand_size` queues and its first waiting request joins the shortest of them, so flows rarely
share a queue. Unlike kube-apiserver, a flow's later requests join the queue its earlier ones
still wait in (a flow spreads over its whole hand there, taking up to `hand_size` turns per
round against one for a light flow); here a backlogged flow holds one queue, so each gets an
equal share of turns. When seats free up, each level hands
them to its queues in virtual-time order (start-time fair queuing, as APF's
`nextDispatchR`): the queue with the smallest `next_r` goes first; dispatching charges it
`width * service_estimate` seat-seconds, and finishing corrects the charge to the seat-seconds
actually used, so a flow of slow requests gets fewer dispatches than a flow of fast ones. A
queue that starts waiting begins at the level's virtual clock (the start tag of the last
dispatch), so an idle flow earns no credit to burst with later. Freed seats go first to the
levels under their nominal seats (owed what they lent), then to the borrowers, each in
configuration order.

Refusals (the request is told to retry later, a 429): `queue-full` (the chosen queue holds
`queue_length_limit` requests), `concurrency-limit` (a level without queues has no seat),
`time-out` (waited `queue_wait` seconds; `expire`), `cancelled` (the caller gave up:
`withdraw`). Unbounded waits (`bounded=False`, the in-process clients whose callers own their
timeouts) skip the length limit and the deadline.

Fast path: `try_dispatch` is a few integer comparisons and no allocation beyond the ticket —
no hashing, no queue, no clock — for a level nobody waits in. Time is passed in (`now`), the
core never reads a clock, sleeps or does I/O; every sequence is reproducible in a unit test.

Invariants: a ticket is in exactly one state; every seat taken by a dispatch is returned by
exactly one `finish`; a queued ticket leaves its queue by dispatch, `withdraw` or `expire`,
never twice; `in_use(L)` is the sum of the widths of L's executing tickets.
"""

from __future__ import annotations

import enum
import hashlib
import math
from collections import deque
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CoreConfig",
    "FairQueues",
    "LevelConfig",
    "LevelStatistics",
    "Ticket",
    "TicketState",
    "deal",
]


class TicketState(enum.Enum):
    QUEUED = "queued"
    EXECUTING = "executing"
    FINISHED = "finished"
    REJECTED = "rejected"  # refused at the door: `reason` says why
    WITHDRAWN = "withdrawn"  # left its queue before being dispatched: `reason` says why


@dataclass(frozen=True, slots=True)
class LevelConfig:
    """One priority level (kube-apiserver's PriorityLevelConfiguration, limited kind)."""

    name: str
    shares: int = 1  # nominal concurrency shares
    lendable_percent: int = 0  # of its nominal seats others may borrow while it is idle
    queues: int = 64  # 0: no queuing, a request without a seat is refused at once
    hand_size: int = 6
    queue_length_limit: int = 50
    exempt: bool = False  # never waits, never counted

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a priority level needs a name")
        if self.shares < 0 or (not self.exempt and self.shares < 1):
            raise ValueError(f"priority level {self.name}: shares must be >= 1, got {self.shares}")
        if not 0 <= self.lendable_percent <= 100:
            raise ValueError(
                f"priority level {self.name}: lendable_percent must be 0..100, "
                f"got {self.lendable_percent}"
            )
        if self.queues < 0 or self.queue_length_limit < 1:
            raise ValueError(
                f"priority level {self.name}: queues must be >= 0 and queue_length_limit >= 1"
            )
        if self.queues and not 1 <= self.hand_size <= min(self.queues, 16):
            raise ValueError(
                f"priority level {self.name}: hand_size must be 1..min(queues, 16), "
                f"got {self.hand_size}"
            )


@dataclass(frozen=True, slots=True)
class CoreConfig:
    seats: int  # the server's concurrency limit
    levels: tuple[LevelConfig, ...]
    queue_wait: float = 15.0  # seconds a bounded request may wait for a seat
    service_estimate: float = 0.005  # seconds: the charge at dispatch, corrected at finish

    def __post_init__(self) -> None:
        if self.seats < 1:
            raise ValueError(f"the concurrency limit must be >= 1 seat, got {self.seats}")
        names = [lv.name for lv in self.levels]
        if len(set(names)) != len(names):
            raise ValueError(f"priority level names must be unique: {names}")
        if not any(not lv.exempt for lv in self.levels):
            raise ValueError("at least one priority level must not be exempt")
        if not self.queue_wait > 0 or not self.service_estimate > 0:
            raise ValueError("queue_wait and service_estimate must be > 0 seconds")


class Ticket:
    """One request's passage: created by `try_dispatch` or `enqueue`, ended by `finish`,
    `withdraw` or `expire`. `data` belongs to the driver (its wake-up event, its metrics)."""

    __slots__ = (
        "data",
        "deadline",
        "dispatched_at",
        "enqueued_at",
        "flow",
        "level",
        "queue",
        "reason",
        "state",
        "width",
    )

    def __init__(self, level: int, width: int, state: TicketState) -> None:
        self.level = level
        self.width = width
        self.state = state
        self.reason = ""
        self.flow = ""
        self.queue: _Queue | None = None
        self.enqueued_at = 0.0
        self.dispatched_at = 0.0
        self.deadline = math.inf
        self.data: Any = None

    @property
    def queued(self) -> bool:
        return self.state is TicketState.QUEUED

    @property
    def executing(self) -> bool:
        return self.state is TicketState.EXECUTING

    def __repr__(self) -> str:
        return f"Ticket(level={self.level}, width={self.width}, {self.state.value} {self.reason})"


class _Queue:
    __slots__ = ("executing", "index", "next_r", "requests", "turn", "waiting_seats")

    def __init__(self, index: int) -> None:
        self.index = index
        self.requests: deque[Ticket] = deque()
        self.executing = 0  # seats held by tickets dispatched from this queue
        self.waiting_seats = 0  # sum of the widths of `requests`
        self.next_r = 0.0  # virtual time (seat-seconds) of this queue's next dispatch
        self.turn = 0  # the level's dispatch count at this queue's last dispatch (ties)


class _Level:
    __slots__ = (
        "config",
        "flows",
        "guaranteed",
        "in_use",
        "index",
        "max_width",
        "nominal",
        "queues",
        "vclock",
        "waiting",
    )

    def __init__(self, index: int, config: LevelConfig, nominal: int) -> None:
        self.index = index
        self.config = config
        self.nominal = nominal
        lent = math.floor(nominal * config.lendable_percent / 100 + 0.5)
        self.guaranteed = nominal - lent
        self.in_use = 0  # seats of executing tickets
        self.waiting = 0  # queued tickets
        self.queues: dict[int, _Queue] = {}  # created on first use
        # flow -> (its queue, its queued tickets) for the flows with queued tickets
        self.flows: dict[str, tuple[_Queue, int]] = {}
        self.vclock = 0.0  # start tag of the last dispatch
        self.max_width = 1  # seats a request of this level may take (set by `FairQueues`)


@dataclass(frozen=True, slots=True)
class LevelStatistics:
    name: str
    nominal: int
    guaranteed: int
    in_use: int
    waiting: int


def deal(hash_value: int, deck: int, hand: int) -> list[int]:
    """`hand` distinct cards of `range(deck)` picked by `hash_value` (APF's shuffle sharding
    dealer): each card is the hash modulo the cards left, skipping those already dealt."""
    cards: list[int] = []
    for i in range(hand):
        left = deck - i
        card = hash_value % left
        hash_value //= left
        for taken in sorted(cards):
            if card >= taken:
                card += 1
        cards.append(card)
    return cards


def _flow_hash(flow: str) -> int:
    # Deterministic across processes (str.__hash__ is salted), 64 bits: enough for 16 of 128.
    return int.from_bytes(hashlib.blake2b(flow.encode(), digest_size=8).digest(), "big")


class FairQueues:
    """The levels, their queues and the seat accounting (module doc)."""

    def __init__(self, config: CoreConfig) -> None:
        self.config = config
        counted = [lv for lv in config.levels if not lv.exempt]
        shares = sum(lv.shares for lv in counted)
        self.levels = [
            _Level(i, lv, 0 if lv.exempt else max(1, math.ceil(config.seats * lv.shares / shares)))
            for i, lv in enumerate(config.levels)
        ]
        self.total = sum(lv.nominal for lv in self.levels)
        self._index = {lv.config.name: lv.index for lv in self.levels}
        # sum over counted levels of max(in_use, guaranteed): at most `total`.
        self._occupied = sum(lv.guaranteed for lv in self.levels if not lv.config.exempt)
        self._waiting_levels: set[int] = set()  # levels with queued tickets
        self._turns = 0  # dispatches from a queue so far
        for lv in self.levels:
            others = sum(k.guaranteed for k in self.levels if k is not lv and not k.config.exempt)
            lv.max_width = self.total if lv.config.exempt else max(1, self.total - others)

    @property
    def has_waiting(self) -> bool:
        """Whether any ticket waits (if not, a `finish` dispatches nothing)."""
        return bool(self._waiting_levels)

    def level_index(self, name: str) -> int:
        try:
            return self._index[name]
        except KeyError:
            raise ValueError(f"no priority level {name!r}") from None

    # ---- admission ---------------------------------------------------------------------------

    def _width(self, level: _Level, width: int) -> int:
        # Never wider than the level could ever get, or it would wait forever.
        return 1 if width < 1 else min(width, level.max_width)

    def _fits(self, level: _Level, width: int) -> bool:
        use = level.in_use + width
        if use <= level.guaranteed or level.config.exempt:
            return True
        return self._occupied - max(level.in_use, level.guaranteed) + use <= self.total

    def _start(self, level: _Level, ticket: Ticket) -> None:
        if not level.config.exempt:
            before = max(level.in_use, level.guaranteed)
            level.in_use += ticket.width
            self._occupied += max(level.in_use, level.guaranteed) - before
        else:
            level.in_use += ticket.width
        ticket.state = TicketState.EXECUTING

    def try_dispatch(self, level_index: int, width: int = 1) -> Ticket | None:
        """The fast path: an executing ticket if the request fits and nobody of its level
        waits (it must not overtake them), else None (then `enqueue`)."""
        level = self.levels[level_index]
        if level.waiting:
            return None
        width = self._width(level, width)
        if not self._fits(level, width):
            return None
        ticket = Ticket(level_index, width, TicketState.EXECUTING)
        self._start(level, ticket)
        return ticket

    def enqueue(
        self, level_index: int, flow: str, width: int, now: float, *, bounded: bool = True
    ) -> Ticket:
        """Queue the request of `flow` (or refuse it: state REJECTED with the reason); it may
        be dispatched at once (EXECUTING). `bounded`: subject to the queue length limit and
        `queue_wait`; unbounded waits end only by dispatch or `withdraw`."""
        level = self.levels[level_index]
        width = self._width(level, width)
        ticket = Ticket(level_index, width, TicketState.QUEUED)
        if level.config.exempt or (not level.waiting and self._fits(level, width)):
            self._start(level, ticket)
            return ticket
        cfg = level.config
        if cfg.queues == 0:
            ticket.state, ticket.reason = TicketState.REJECTED, "concurrency-limit"
            return ticket
        held = level.flows.get(flow)
        queue = held[0] if held is not None else self._choose_queue(level, flow)
        if bounded and len(queue.requests) >= cfg.queue_length_limit:
            ticket.state, ticket.reason = TicketState.REJECTED, "queue-full"
            return ticket
        if not queue.requests and not queue.executing:
            queue.next_r = max(queue.next_r, level.vclock)
        ticket.queue = queue
        ticket.flow = flow
        level.flows[flow] = (queue, held[1] + 1 if held is not None else 1)
        ticket.enqueued_at = now
        ticket.deadline = now + self.config.queue_wait if bounded else math.inf
        queue.requests.append(ticket)
        queue.waiting_seats += width
        level.waiting += 1
        # Nothing to dispatch now: the ticket waits because its level's queue heads do not
        # fit, and only a `finish` or a `withdraw` changes that.
        self._waiting_levels.add(level_index)
        return ticket

    def _choose_queue(self, level: _Level, flow: str) -> _Queue:
        cfg = level.config
        best: _Queue | None = None
        best_len = 0
        for index in deal(_flow_hash(flow), cfg.queues, cfg.hand_size):
            queue = level.queues.get(index)
            if queue is None:
                queue = level.queues[index] = _Queue(index)
            length = queue.waiting_seats + queue.executing
            if best is None or length < best_len:
                best, best_len = queue, length
        assert best is not None
        return best

    # ---- dispatch ----------------------------------------------------------------------------

    @staticmethod
    def _unqueued(level: _Level, ticket: Ticket) -> None:
        level.waiting -= 1
        queue, count = level.flows[ticket.flow]
        if count == 1:
            del level.flows[ticket.flow]
        else:
            level.flows[ticket.flow] = (queue, count - 1)

    def _dispatch_level(self, level: _Level, now: float, out: list[Ticket]) -> None:
        """Dispatch `level`'s queued tickets in virtual-time order while they fit."""
        while level.waiting:
            queue = min(
                (q for q in level.queues.values() if q.requests),
                # Ties (requests that took no time at all) go round-robin.
                key=lambda q: (q.next_r, q.turn, q.index),
            )
            head = queue.requests[0]
            if not self._fits(level, head.width):
                return
            queue.requests.popleft()
            queue.waiting_seats -= head.width
            self._unqueued(level, head)
            level.vclock = max(level.vclock, queue.next_r)
            queue.next_r += head.width * self.config.service_estimate
            queue.executing += head.width
            self._turns += 1
            queue.turn = self._turns
            head.dispatched_at = now
            self._start(level, head)
            out.append(head)
        self._waiting_levels.discard(level.index)

    def _dispatch(self, now: float) -> list[Ticket]:
        out: list[Ticket] = []
        if not self._waiting_levels:
            return out
        # Owed levels (under their nominal seats) before the borrowers, each in config order.
        for owed in (True, False):
            for index in sorted(self._waiting_levels):
                level = self.levels[index]
                if (level.in_use < level.nominal) == owed:
                    self._dispatch_level(level, now, out)
        return out

    def finish(self, ticket: Ticket, now: float) -> list[Ticket]:
        """Return an executing ticket's seats; the tickets dispatched into them."""
        if ticket.state is not TicketState.EXECUTING:
            raise ValueError(f"finish of a ticket that is not executing: {ticket!r}")
        ticket.state = TicketState.FINISHED
        level = self.levels[ticket.level]
        if level.config.exempt:
            level.in_use -= ticket.width
            return []
        before = max(level.in_use, level.guaranteed)
        level.in_use -= ticket.width
        self._occupied += max(level.in_use, level.guaranteed) - before
        queue = ticket.queue
        if queue is not None:
            queue.executing -= ticket.width
            used = max(0.0, now - ticket.dispatched_at)
            queue.next_r += ticket.width * (used - self.config.service_estimate)
            ticket.queue = None
        return self._dispatch(now)

    def withdraw(self, ticket: Ticket, now: float, reason: str = "cancelled") -> list[Ticket]:
        """Take a queued ticket out of its queue (its caller gave up); the tickets this lets
        through (a wide head that did not fit may have gone). Anything else: no-op."""
        if ticket.state is not TicketState.QUEUED or ticket.queue is None:
            return []
        ticket.queue.requests.remove(ticket)
        ticket.queue.waiting_seats -= ticket.width
        ticket.queue = None
        ticket.state, ticket.reason = TicketState.WITHDRAWN, reason
        level = self.levels[ticket.level]
        self._unqueued(level, ticket)
        if not level.waiting:
            self._waiting_levels.discard(level.index)
        return self._dispatch(now)

    def expire(self, now: float) -> tuple[list[Ticket], list[Ticket]]:
        """Withdraw (reason `time-out`) every queued ticket whose deadline passed; returns
        (expired, dispatched)."""
        expired: list[Ticket] = []
        for index in sorted(self._waiting_levels):
            for queue in self.levels[index].queues.values():
                expired += [t for t in queue.requests if t.deadline <= now]
        dispatched: list[Ticket] = []
        for ticket in expired:
            dispatched += self.withdraw(ticket, now, "time-out")
        return expired, dispatched

    # ---- observation -------------------------------------------------------------------------

    def statistics(self, level_index: int) -> LevelStatistics:
        lv = self.levels[level_index]
        return LevelStatistics(lv.config.name, lv.nominal, lv.guaranteed, lv.in_use, lv.waiting)

    def check_invariants(self) -> None:
        """Assert the accounting (tests call it after every step)."""
        occupied = 0
        for lv in self.levels:
            queued = sum(len(q.requests) for q in lv.queues.values())
            assert queued == lv.waiting, (lv.config.name, queued, lv.waiting)
            assert (lv.index in self._waiting_levels) == (lv.waiting > 0), lv.config.name
            assert lv.in_use >= 0, lv.config.name
            assert all(q.executing >= 0 for q in lv.queues.values()), lv.config.name
            assert sum(q.executing for q in lv.queues.values()) <= lv.in_use, lv.config.name
            flows: dict[str, int] = {}
            for q in lv.queues.values():
                assert all(t.state is TicketState.QUEUED and t.queue is q for t in q.requests)
                assert q.waiting_seats == sum(t.width for t in q.requests), lv.config.name
                for t in q.requests:
                    assert lv.flows[t.flow][0] is q, (lv.config.name, t.flow)
                    flows[t.flow] = flows.get(t.flow, 0) + 1
            assert flows == {f: n for f, (_q, n) in lv.flows.items()}, lv.config.name
            if not lv.config.exempt:
                occupied += max(lv.in_use, lv.guaranteed)
        assert occupied == self._occupied, (occupied, self._occupied)
        assert occupied <= self.total, (occupied, self.total)
