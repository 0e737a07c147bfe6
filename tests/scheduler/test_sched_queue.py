"""SchedulingQueue: priority then FIFO, backoff 1 s doubling to 10 s, unschedulable pods moved
back on cluster events or after 5 minutes, in-flight bookkeeping."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from schedfixtures import pod

from orchestrator.scheduler import QueueStatistics, SchedulingQueue

Obj = dict[str, Any]


def name(p: Mapping[str, Any] | None) -> str | None:
    return None if p is None else p["metadata"]["name"]


def drain(q: SchedulingQueue, now: float) -> list[str | None]:
    out = []
    while (p := q.pop(now)) is not None:
        out.append(name(p))
        q.done(p)
    return out


def test_fifo_within_a_priority() -> None:
    q = SchedulingQueue()
    for n in "abc":
        q.add(pod(n), 0.0)
    assert drain(q, 0.0) == ["a", "b", "c"]
    assert len(q) == 0


def test_higher_priority_first() -> None:
    q = SchedulingQueue()
    q.add(pod("low", priority=-5), 0.0)
    q.add(pod("mid1"), 0.0)
    q.add(pod("high", priority=1000), 0.0)
    q.add(pod("mid2", priority=0), 0.0)
    assert drain(q, 0.0) == ["high", "mid1", "mid2", "low"]


def test_priority_change_while_active_reorders() -> None:
    q = SchedulingQueue()
    q.add(pod("a"), 0.0)
    q.add(pod("b"), 0.0)
    q.add(pod("b", priority=10), 0.0)
    assert drain(q, 0.0) == ["b", "a"]


def test_adding_twice_keeps_one_entry_with_the_latest_object() -> None:
    q = SchedulingQueue()
    q.add(pod("a"), 0.0)
    newer = pod("a")
    newer["metadata"]["labels"] = {"v": "2"}
    q.add(newer, 0.0)
    assert len(q) == 1
    assert q.pop(0.0) is newer
    assert q.pop(0.0) is None


@pytest.mark.parametrize(
    ("attempts", "seconds"), [(0, 1), (1, 1), (2, 2), (3, 4), (4, 8), (5, 10), (6, 10), (50, 10)]
)
def test_backoff_duration(attempts: int, seconds: float) -> None:
    assert SchedulingQueue().backoff_duration(attempts) == seconds


def test_backoff_doubles_per_attempt() -> None:
    q = SchedulingQueue()
    q.add(pod("a"), 0.0)
    now = 0.0
    waits = []
    for _ in range(6):
        p = q.pop(now)
        assert name(p) == "a"
        assert p is not None
        q.add_backoff(p, now)
        deadline = q.next_deadline()
        assert deadline is not None
        assert q.pop(deadline - 0.001) is None
        waits.append(deadline - now)
        now = deadline
    assert waits == [1, 2, 4, 8, 10, 10]
    assert q.attempts(pod("a")) == 6


def test_backoff_pods_go_behind_active_ones() -> None:
    q = SchedulingQueue()
    q.add(pod("a"), 0.0)
    p = q.pop(0.0)
    assert p is not None
    q.add_backoff(p, 0.0)
    q.add(pod("b"), 0.5)
    assert drain(q, 5.0) == ["b", "a"]


def test_unschedulable_waits_for_an_event() -> None:
    q = SchedulingQueue()
    q.add(pod("a"), 0.0)
    p = q.pop(0.0)
    assert p is not None
    q.add_unschedulable(p, 0.0)
    assert q.statistics() == QueueStatistics(active=0, backoff=0, unschedulable=1, in_flight=0)
    assert q.pop(100.0) is None  # no event, not yet 5 minutes
    assert q.move_all_to_active_or_backoff(100.0, "NodeAdd") == 1
    assert name(q.pop(100.0)) == "a"


def test_event_during_backoff_moves_to_backoff_not_active() -> None:
    q = SchedulingQueue()
    q.add(pod("a"), 0.0)
    for now in (0.0, 1.0, 3.0):  # three attempts: the third backs off 4 s
        p = q.pop(now)
        assert p is not None
        q.add_unschedulable(p, now)
        q.move_all_to_active_or_backoff(now + 0.5)
        q.flush(now + 0.5)
    assert q.statistics().backoff == 1
    assert q.pop(6.9) is None
    assert name(q.pop(7.0)) == "a"


def test_unschedulable_flushed_after_five_minutes() -> None:
    q = SchedulingQueue()
    for n in ("a", "b"):
        q.add(pod(n), 0.0)
    a, b = q.pop(0.0), q.pop(0.0)
    assert a is not None
    assert b is not None
    q.add_unschedulable(a, 0.0)
    q.add_unschedulable(b, 60.0)
    assert q.next_deadline() == 300.0
    assert q.pop(299.9) is None
    assert name(q.pop(300.0)) == "a"
    assert q.pop(300.0) is None
    assert q.next_deadline() == 360.0
    assert name(q.pop(360.0)) == "b"


def test_event_while_in_flight_sends_the_failed_pod_to_backoff() -> None:
    q = SchedulingQueue()
    q.add(pod("a"), 0.0)
    p = q.pop(0.0)
    assert p is not None
    q.move_all_to_active_or_backoff(0.1, "NodeAdd")  # a node arrived while we were deciding
    q.add_unschedulable(p, 0.2)
    assert q.statistics().backoff == 1
    assert name(q.pop(1.2)) == "a"


def test_event_before_pop_does_not_count() -> None:
    q = SchedulingQueue()
    q.move_all_to_active_or_backoff(0.0)
    q.add(pod("a"), 0.0)
    p = q.pop(0.0)
    assert p is not None
    q.add_unschedulable(p, 0.0)
    assert q.statistics().unschedulable == 1


def test_spec_change_wakes_an_unschedulable_pod_status_change_does_not() -> None:
    q = SchedulingQueue()
    q.add(pod("a", cpu="2"), 0.0)
    p = q.pop(0.0)
    assert p is not None
    q.add_unschedulable(p, 0.0)
    status_only = pod("a", cpu="2")
    status_only["status"] = {"phase": "Pending", "conditions": [{"type": "PodScheduled"}]}
    q.add(status_only, 5.0)
    assert q.statistics().unschedulable == 1
    q.add(pod("a", cpu="1"), 5.0)
    assert q.statistics().active == 1
    assert q.pop(5.0) is not None


def test_delete_removes_from_every_place() -> None:
    q = SchedulingQueue()
    for n in "abc":
        q.add(pod(n), 0.0)
    q.delete(pod("b"))
    a = q.pop(0.0)
    assert a is not None
    q.add_backoff(a, 0.0)
    q.delete(a)
    c = q.pop(0.0)
    assert name(c) == "c"
    assert c is not None
    q.add_unschedulable(c, 0.0)
    q.delete(c)
    q.delete(pod("never"))
    assert len(q) == 0
    assert q.statistics() == QueueStatistics(0, 0, 0, 0)
    assert q.pop(1000.0) is None
    assert q.next_deadline() is None


def test_deleted_while_in_flight_is_dropped_when_reported() -> None:
    q = SchedulingQueue()
    q.add(pod("a"), 0.0)
    p = q.pop(0.0)
    assert p is not None
    q.delete(p)
    assert p in q  # still in flight
    q.add_unschedulable(p, 0.0)
    assert p not in q
    assert len(q) == 0


def test_done_and_double_reports() -> None:
    q = SchedulingQueue()
    q.add(pod("a"), 0.0)
    p = q.pop(0.0)
    assert p is not None
    q.add_backoff(p, 0.0)
    q.add_backoff(p, 0.0)  # reported twice: ignored
    q.done(p)  # not in flight: ignored
    assert q.statistics() == QueueStatistics(0, 1, 0, 0)
    p = q.pop(1.0)
    assert p is not None
    q.done(p)
    assert len(q) == 0
    assert q.attempts(p) == 0


def test_update_while_in_flight_is_kept_for_the_next_attempt() -> None:
    q = SchedulingQueue()
    q.add(pod("a"), 0.0)
    p = q.pop(0.0)
    assert p is not None
    newer = pod("a", cpu="1")
    q.add(newer, 0.0)
    q.add_backoff(p, 0.0)
    assert q.pop(1.0) is newer


def test_report_for_unknown_pod_starts_tracking_it() -> None:
    q = SchedulingQueue()
    q.add_backoff(pod("stray"), 0.0)
    assert q.statistics().backoff == 1
    assert name(q.pop(1.0)) == "stray"
    assert "uid-default-stray" in q
    assert 42 not in q


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["add", "pop", "fail", "unsched", "done", "delete", "event", "tick"]),
            st.integers(0, 7),
        ),
        max_size=60,
    )
)
def test_every_pod_is_in_exactly_one_place(ops: list[tuple[str, int]]) -> None:
    q = SchedulingQueue()
    now = 0.0
    known: set[str] = set()
    in_flight: list[Mapping[str, Any]] = []
    for op, arg in ops:
        p = pod(f"p{arg}")
        if op == "add":
            q.add(p, now)
            known.add(name(p) or "")
        elif op == "pop":
            got = q.pop(now)
            if got is not None:
                assert got not in in_flight
                in_flight.append(got)
        elif op in ("fail", "unsched", "done") and in_flight:
            got = in_flight.pop(arg % len(in_flight))
            if op == "fail":
                q.add_backoff(got, now)
            elif op == "unsched":
                q.add_unschedulable(got, now)
            else:
                q.done(got)
                known.discard(name(got) or "")
        elif op == "delete":
            q.delete(p)
            if p not in q:
                known.discard(name(p) or "")
        elif op == "event":
            q.move_all_to_active_or_backoff(now)
        elif op == "tick":
            now += arg * 10
        stats = q.statistics()
        assert stats.in_flight == len(in_flight)
        assert stats.active + stats.backoff + stats.unschedulable + stats.in_flight == len(q)
        assert all(x >= 0 for x in (stats.active, stats.backoff, stats.unschedulable))
    # Eventually every pod not in flight comes out again, and nothing else does.
    while in_flight:
        q.add_backoff(in_flight.pop(), now)
    out = set()
    while (got := q.pop(now + 1000)) is not None:
        out.add(name(got))
        q.done(got)
    assert len(q) == 0
    assert out <= {f"p{i}" for i in range(8)}
