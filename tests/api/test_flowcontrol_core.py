"""The pure core of API Priority and Fairness (`apiserver.flowcontrol.fairqueue`) under
adversarial arrivals: one flow flooding, many flows, bursts, a saturated level beside an idle
one, every refusal, and seats returned on every path. No I/O, no clock: `now` is passed in.
Seeded random schedules check the accounting after every step (`check_invariants`) and that
nothing is ever stuck once the seats free up."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest

from orchestrator.apiserver.flowcontrol import DEFAULT_LEVELS, LevelConfig, classify
from orchestrator.apiserver.flowcontrol.fairqueue import (
    CoreConfig,
    FairQueues,
    Ticket,
    TicketState,
    deal,
)
from orchestrator.security.authn import User

BULK = LevelConfig("bulk", 1, 0, queues=8, hand_size=2, queue_length_limit=1000)
LEASES = LevelConfig("leases", 1, 0, queues=4, hand_size=1, queue_length_limit=1000)


def core(seats: int = 2, *levels: LevelConfig, queue_wait: float = 15.0) -> FairQueues:
    return FairQueues(CoreConfig(seats, levels or (BULK, LEASES), queue_wait=queue_wait))


def admit(q: FairQueues, level: int, flow: str, now: float = 0.0, width: int = 1) -> Ticket:
    ticket = q.try_dispatch(level, width) or q.enqueue(level, flow, width, now)
    q.check_invariants()
    return ticket


def finish(q: FairQueues, ticket: Ticket, now: float = 0.0) -> list[Ticket]:
    out = q.finish(ticket, now)
    q.check_invariants()
    return out


def test_seats_are_divided_by_shares_with_guarantees() -> None:
    q = FairQueues(CoreConfig(100, DEFAULT_LEVELS))
    stats = {lv.config.name: q.statistics(lv.index) for lv in q.levels}
    assert stats["exempt"].nominal == 0
    assert stats["leader-election"].nominal == 5
    assert stats["leader-election"].guaranteed == 5
    assert stats["node-high"].nominal == 17
    assert stats["node-high"].guaranteed == 13
    assert stats["workload-low"].nominal == 42
    assert stats["workload-low"].guaranteed == 4
    assert q.total == sum(s.nominal for s in stats.values())


def test_deal_is_a_bijection_onto_distinct_hands() -> None:
    for deck, hand in ((6, 3), (5, 5), (8, 2), (4, 1)):
        count = 1
        for i in range(hand):
            count *= deck - i
        hands = {tuple(deal(h, deck, hand)) for h in range(count)}
        assert len(hands) == count  # every ordered hand exactly once
        assert all(len(set(x)) == hand and all(0 <= c < deck for c in x) for x in hands)


def test_fast_path_until_full_then_queue_then_dispatch_in_order() -> None:
    q = core(4)  # bulk 2 seats, leases 2; each guaranteed its own (lendable 0)
    a, b = admit(q, 0, "u"), admit(q, 0, "u")
    assert a.executing
    assert b.executing
    assert q.try_dispatch(0) is None  # the leases' guaranteed seats are not lent
    c = admit(q, 0, "u", 1.0)
    assert c.queued
    d = admit(q, 0, "u", 2.0)
    assert finish(q, a, 3.0) == [c]
    assert c.executing
    assert finish(q, b, 3.0) == [d]
    assert finish(q, c) == []
    assert finish(q, d) == []
    assert q.statistics(0).in_use == 0


def test_a_level_under_its_guarantee_never_waits_for_a_saturated_one() -> None:
    # Bulk floods its level; the lease level's seats stay free and are taken at once.
    q = core(4)
    held = [admit(q, 0, f"bulk{i}") for i in range(50)]
    assert sum(t.executing for t in held) == 2
    lease = admit(q, 1, "node-1")
    assert lease.executing
    lease2 = admit(q, 1, "node-2")
    assert lease2.executing
    finish(q, lease)
    finish(q, lease2)


def test_borrowing_takes_only_unguaranteed_seats_and_returns_them() -> None:
    lend = LevelConfig("bulk", 1, 100, queues=4, hand_size=2)  # lends all its seats
    keep = LevelConfig("leases", 1, 50, queues=4, hand_size=2)  # keeps half of its
    q = core(8, lend, keep)  # 4 + 4 nominal; leases guaranteed 2
    bulk = [admit(q, 0, "b") for i in range(10)]
    running = [t for t in bulk if t.executing]
    assert len(running) == 6  # its 4 + the 2 lendable lease seats; 2 stay guaranteed
    leases = [admit(q, 1, "n"), admit(q, 1, "n")]
    assert all(t.executing for t in leases)
    third = admit(q, 1, "n")
    assert third.queued  # over its guarantee, and the pool is full
    # The first seat returned goes to the level that is owed (under its nominal) first.
    assert finish(q, running[0]) == [third]


def test_one_flooding_flow_cannot_starve_another() -> None:
    q = core(2)  # bulk: 1 seat
    first = admit(q, 0, "flood")
    flood = [admit(q, 0, "flood", now=0.0) for _ in range(100)]
    late = admit(q, 0, "polite", now=1.0)
    assert late.queued
    # Within two dispatches the polite flow's turn, though 100 flood requests queued first;
    # then the flood has the seat to itself again.
    running, order = first, []
    for i in range(12):
        running = finish(q, running, 2.0 + i)[0]
        order.append(running)
    assert late in order[:2]
    assert all(t in flood for t in order if t is not late)


@pytest.mark.parametrize("flows", [2, 3, 7, 16])
def test_many_flows_share_the_seats_evenly(flows: int) -> None:
    q = core(2, LevelConfig("bulk", 1, 0, queues=64, hand_size=8, queue_length_limit=10_000))
    rng = random.Random(flows)
    owner: dict[int, str] = {}
    first = admit(q, 0, "warm")
    for _i in range(200 * flows):  # every flow queues a deep backlog, interleaved at random
        f = f"flow{rng.randrange(flows)}"
        owner[id(admit(q, 0, f, now=0.0))] = f
    served: Counter[str] = Counter()
    running = first
    now = 1.0
    for _ in range(50 * flows):  # equal service times: the turns must be equal
        nxt = finish(q, running, now)
        now += 0.005
        running = nxt[0]
        served[owner[id(running)]] += 1
    counts = [served[f"flow{i}"] for i in range(flows)]
    assert max(counts) - min(counts) <= 2, counts


def test_a_flow_of_slow_requests_gets_fewer_turns() -> None:
    q = core(2, LevelConfig("bulk", 1, 0, queues=64, hand_size=4, queue_length_limit=10_000))
    owner: dict[int, str] = {}
    first = admit(q, 0, "x")
    for _i in range(400):
        for f in ("slow", "fast"):
            owner[id(admit(q, 0, f))] = f
    served: Counter[str] = Counter()
    running, now = first, 1.0
    for _ in range(200):
        nxt = finish(q, running, now)
        running = nxt[0]
        served[owner[id(running)]] += 1
        running.dispatched_at = now
        now += 0.1 if owner[id(running)] == "slow" else 0.01  # its service time
    assert served["fast"] > 5 * served["slow"], served


def test_bursts_are_served_in_arrival_order_within_a_flow() -> None:
    q = core(2)
    first = admit(q, 0, "u")
    burst = [admit(q, 0, "u", now=float(i)) for i in range(20)]
    other = [admit(q, 0, "v", now=20.0 + i) for i in range(5)]
    running, order = first, []
    for _ in range(25):
        running = finish(q, running)[0]
        order.append(running)
    # A backlogged flow keeps one queue: its requests go in arrival order, the flows alternate.
    assert [t for t in order if t in burst] == burst
    assert [t for t in order if t in other] == other
    assert set(map(id, order[:10])) >= set(map(id, other[:4]))


def test_refusals_queue_full_concurrency_limit_and_time_out() -> None:
    tiny = LevelConfig("bulk", 1, 0, queues=1, hand_size=1, queue_length_limit=2)
    none = LevelConfig("leases", 1, 0, queues=0)
    q = core(2, tiny, none, queue_wait=5.0)
    holder = admit(q, 0, "u")
    a, b = admit(q, 0, "u", 0.0), admit(q, 0, "u", 1.0)
    full = admit(q, 0, "u", 1.0)
    assert full.state is TicketState.REJECTED
    assert full.reason == "queue-full"
    unbounded = q.enqueue(0, "u", 1, 1.0, bounded=False)  # never refused for length
    assert unbounded.queued
    lease = admit(q, 1, "n")
    refused = admit(q, 1, "n")
    assert refused.state is TicketState.REJECTED
    assert refused.reason == "concurrency-limit"
    expired, dispatched = q.expire(5.5)
    q.check_invariants()
    assert expired == [a]
    assert dispatched == []
    assert a.reason == "time-out"
    expired, _ = q.expire(100.0)
    assert expired == [b]  # the unbounded one never expires
    assert finish(q, holder) == [unbounded]
    finish(q, unbounded)
    finish(q, lease)
    assert all(q.statistics(i).in_use == 0 and q.statistics(i).waiting == 0 for i in (0, 1))


def test_withdraw_removes_a_queued_ticket_once() -> None:
    q = core(2)
    holder = admit(q, 0, "u")
    waiting = admit(q, 0, "u")
    assert q.withdraw(waiting, 1.0, "cancelled") == []
    q.check_invariants()
    assert waiting.state is TicketState.WITHDRAWN
    assert waiting.reason == "cancelled"
    assert q.withdraw(waiting, 1.0) == []  # a no-op the second time
    assert finish(q, holder) == []  # nothing left to dispatch
    with pytest.raises(ValueError, match="not executing"):
        q.finish(holder, 0.0)


def test_a_wide_head_blocks_until_it_fits_then_a_withdraw_unblocks() -> None:
    q = core(8, LevelConfig("bulk", 1, 0, queues=1, hand_size=1), LEASES)
    small = [admit(q, 0, "u") for _ in range(3)]
    wide = admit(q, 0, "u", width=3)
    narrow = admit(q, 0, "u")
    assert wide.queued
    assert narrow.queued
    assert finish(q, small[0]) == []  # 2 free of the 3 it needs: still waits (no overtaking)
    assert q.withdraw(wide, 1.0) == [narrow]
    for t in (small[1], small[2], narrow):
        finish(q, t)


def test_exempt_never_waits_and_is_not_counted() -> None:
    q = core(2, LevelConfig("exempt", 0, exempt=True, queues=0), BULK)
    held = [admit(q, 0, "apiserver") for _ in range(1000)]
    assert all(t.executing for t in held)
    assert admit(q, 1, "u").executing  # the counted seats are untouched
    for t in held:
        finish(q, t)


def test_configuration_errors_are_clear() -> None:
    with pytest.raises(ValueError, match="shares"):
        LevelConfig("x", 0)
    with pytest.raises(ValueError, match="hand_size"):
        LevelConfig("x", 1, queues=4, hand_size=5)
    with pytest.raises(ValueError, match="unique"):
        CoreConfig(10, (BULK, BULK))
    with pytest.raises(ValueError, match=">= 1 seat"):
        CoreConfig(0, (BULK,))
    with pytest.raises(ValueError, match="no priority level"):
        core().level_index("nope")


@pytest.mark.parametrize("seed", range(40))
def test_random_schedules_keep_the_accounting_and_never_get_stuck(seed: int) -> None:
    rng = random.Random(seed)
    levels = (
        LevelConfig("exempt", 0, exempt=True, queues=0),
        LevelConfig(
            "a",
            rng.randint(1, 5),
            rng.choice((0, 50, 100)),
            queues=4,
            hand_size=2,
            queue_length_limit=rng.randint(1, 6),
        ),
        LevelConfig("b", rng.randint(1, 5), rng.choice((0, 25, 90)), queues=8, hand_size=3),
        LevelConfig("c", rng.randint(1, 5), 0, queues=0),
    )
    q = FairQueues(CoreConfig(rng.randint(1, 12), levels, queue_wait=rng.choice((0.5, 3.0))))
    executing: list[Ticket] = []
    queued: list[Ticket] = []
    now = 0.0
    for _ in range(400):
        now += rng.random() * 0.3
        op = rng.random()
        if op < 0.5:
            level = rng.randrange(len(levels))
            width = rng.choice((1, 1, 1, 2, 5))
            flow = f"f{rng.randrange(6)}"
            t = q.try_dispatch(level, width) or q.enqueue(
                level, flow, width, now, bounded=rng.random() < 0.7
            )
            (executing if t.executing else queued if t.queued else []).append(t)
        elif op < 0.8 and executing:
            t = executing.pop(rng.randrange(len(executing)))
            executing += q.finish(t, now)
        elif op < 0.9 and queued:
            executing += q.withdraw(rng.choice(queued), now)
        else:
            executing += q.expire(now)[1]
        queued = [t for t in queued if t.queued]
        q.check_invariants()
        assert all(t.executing for t in executing)
    # Drain: finishing everything dispatches every waiter still queued (no one is stuck).
    for _ in itertools.count():
        if not executing:
            break
        executing += q.finish(executing.pop(0), now)
        q.check_invariants()
    assert not [t for t in queued if t.queued]
    assert all(q.statistics(i).in_use == 0 for i in range(len(levels)))


def test_classification_follows_the_flow_schemas() -> None:
    node = User("system:node:n1", ("system:nodes", "system:authenticated"))
    assert classify(node, "coordination.k8s.io", "leases").level == "node-high"
    assert classify(node, "", "nodes").level == "node-high"
    assert classify(node, "", "pods").level == "system"
    kcm = User("system:kube-controller-manager", ("system:authenticated",))
    assert classify(kcm, "apps", "replicasets").schema == "system-controllers"
    assert classify(kcm, "coordination.k8s.io", "leases").level == "leader-election"
    ks = User("system:serviceaccount:kube-system:foo", ("system:serviceaccounts",))
    assert classify(ks, "", "pods").level == "system"
    sa = User("system:serviceaccount:app:bot", ("system:serviceaccounts",))
    route = classify(sa, "", "pods")
    assert route.level == "workload-low"
    assert route.by_namespace
    admin = User("admin", ("system:masters", "system:authenticated"))
    assert classify(admin, "", "pods").level == "workload-high"  # not exempt: see classify
    assert classify(User("system:apiserver", ("system:masters",)), "", "pods").level == "exempt"
    assert classify(User("alice", ("system:authenticated",)), "", "pods").level == (
        "global-default"
    )
