"""The overload gate's trio driver (`apiserver.flowcontrol.FlowControl`) on a MockClock: the
fast path, fair wake-ups, 429 with Retry-After on a full queue and after the queue wait,
unbounded in-process waits, seats returned on every path (an error, a cancellation while
queued, a cancellation just after being dispatched), and the metrics."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from orchestrator.apiserver.flowcontrol import FlowControl, FlowControlConfig, LevelConfig
from orchestrator.kube.errors import ApiError, retry_after
from orchestrator.metrics import Registry
from orchestrator.security.authn import User

ADMIN = User("admin", ("system:masters",))
ALICE = User("alice", ("system:authenticated",))
NODE = User("system:node:n1", ("system:nodes",))
# Two seats in all: one for the admins' level, one for the nodes'; none lendable.
LEVELS = (
    LevelConfig("exempt", 0, exempt=True, queues=0),
    LevelConfig("node-high", 1, 0, queues=4, hand_size=1, queue_length_limit=5),
    LevelConfig("workload-high", 1, 0, queues=1, hand_size=1, queue_length_limit=2),
)


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


def gate(reg: Registry, **kw: object) -> FlowControl:
    config = FlowControlConfig(
        max_requests_inflight=2,
        levels=LEVELS,
        queue_wait=kw.pop("queue_wait", 5.0),  # type: ignore[arg-type]  # a float, in tests
        retry_after=3,
    )
    return FlowControl(config, registry=reg)


def metric(reg: Registry, prefix: str) -> float:
    return sum(
        float(line.split()[-1]) for line in reg.render().splitlines() if line.startswith(prefix)
    )


async def hold(g: FlowControl, user: User, release: trio.Event, done: list[str], tag: str) -> None:
    async with g.seat(user, "", "pods", "ns", bounded=False):
        done.append(tag)
        await release.wait()


async def test_a_full_level_queues_then_wakes_in_order(autojump_clock: object) -> None:
    reg = Registry()
    g = gate(reg)
    release = [trio.Event() for _ in range(3)]
    done: list[str] = []
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(hold, g, ADMIN, release[i], done, f"a{i}")
                await trio.testing.wait_all_tasks_blocked()
            assert done == ["a0"]
            assert g.statistics()["workload-high"].waiting == 2
            # The node level is untouched by the admins' backlog.
            async with g.seat(NODE, "coordination.k8s.io", "leases"):
                pass
            release[0].set()
            await trio.testing.wait_all_tasks_blocked()
            assert done == ["a0", "a1"]
            release[1].set()
            release[2].set()
    assert {s.in_use for s in g.statistics().values()} == {0}
    lv = 'priority_level="workload-high",flow_schema="workload-high"'
    assert metric(reg, f"apiserver_flowcontrol_dispatched_requests_total{{{lv}}}") == 3
    assert metric(reg, f"apiserver_flowcontrol_current_executing_requests{{{lv}}}") == 0
    assert metric(reg, f"apiserver_flowcontrol_current_inqueue_requests{{{lv}}}") == 0
    assert metric(reg, f'apiserver_flowcontrol_request_wait_duration_seconds_count{{{lv},execute="true"}}') == 3  # fmt: skip  # noqa: E501


async def test_full_queue_and_queue_wait_give_429_with_retry_after(autojump_clock: object) -> None:
    reg = Registry()
    g = gate(reg, queue_wait=5.0)
    release = trio.Event()
    done: list[str] = []
    refusals: list[tuple[str, ApiError]] = []

    async def bounded(tag: str) -> None:
        try:
            async with g.seat(ADMIN, "", "pods"):
                done.append(tag)
        except ApiError as exc:
            refusals.append((tag, exc))

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hold, g, ADMIN, release, done, "holder")
            await trio.testing.wait_all_tasks_blocked()
            for tag in ("q1", "q2", "full"):
                nursery.start_soon(bounded, tag)
                await trio.testing.wait_all_tasks_blocked()
            assert [t for t, _ in refusals] == ["full"]  # the queue holds 2
            start = trio.current_time()
            await trio.sleep(10)  # past the queue wait: both refused
            assert sorted(t for t, _ in refusals) == ["full", "q1", "q2"]
            assert trio.current_time() - start >= 5.0
            release.set()
    for _, exc in refusals:
        assert exc.code == 429
        assert exc.reason == "TooManyRequests"
        assert retry_after(exc) == 3.0
        assert exc.headers == {"Retry-After": "3"}
        assert exc.status()["details"] == {"retryAfterSeconds": 3}
    lv = 'priority_level="workload-high",flow_schema="workload-high"'
    assert metric(reg, f'apiserver_flowcontrol_rejected_requests_total{{{lv},reason="queue-full"}}') == 1  # fmt: skip  # noqa: E501
    assert metric(reg, f'apiserver_flowcontrol_rejected_requests_total{{{lv},reason="time-out"}}') == 2  # fmt: skip  # noqa: E501
    assert g.statistics()["workload-high"].in_use == 0
    assert g.statistics()["workload-high"].waiting == 0


async def test_unbounded_waits_are_never_refused(autojump_clock: object) -> None:
    g = gate(Registry())
    release = trio.Event()
    done: list[str] = []
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            for i in range(10):  # far past the queue length limit of 2
                nursery.start_soon(hold, g, ADMIN, release, done, f"w{i}")
            await trio.sleep(100)  # far past the queue wait
            assert len(done) == 1
            release.set()
    assert len(done) == 10


async def test_seats_come_back_on_errors_and_cancellations(autojump_clock: object) -> None:
    reg = Registry()
    g = gate(reg)
    with pytest.raises(RuntimeError):
        async with g.seat(ADMIN, "", "pods"):
            raise RuntimeError("the request failed")
    assert g.statistics()["workload-high"].in_use == 0

    release = trio.Event()
    done: list[str] = []
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hold, g, ADMIN, release, done, "holder")
            await trio.testing.wait_all_tasks_blocked()
            # Cancelled while queued: it leaves its queue.
            never_scope = trio.CancelScope()

            async def never() -> None:
                with never_scope:
                    await hold(g, ADMIN, trio.Event(), done, "never")

            nursery.start_soon(never)
            await trio.testing.wait_all_tasks_blocked()
            assert g.statistics()["workload-high"].waiting == 1
            never_scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert g.statistics()["workload-high"].waiting == 0
            waiter_scope = trio.CancelScope()

            async def cancelled_after_dispatch() -> None:
                with waiter_scope:
                    async with g.seat(ADMIN, "", "pods", bounded=False):
                        done.append("unreachable")

            nursery.start_soon(cancelled_after_dispatch)
            await trio.testing.wait_all_tasks_blocked()
            # Dispatch the waiter (the holder leaves) and cancel it before it runs again.
            release.set()
            waiter_scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    stats = g.statistics()["workload-high"]
    assert (stats.in_use, stats.waiting) == (0, 0)
    assert "unreachable" not in done
    assert "never" not in done
    lv = 'priority_level="workload-high",flow_schema="workload-high"'
    assert metric(reg, f'apiserver_flowcontrol_rejected_requests_total{{{lv},reason="cancelled"}}') >= 1  # fmt: skip  # noqa: E501
    assert metric(reg, f"apiserver_flowcontrol_current_executing_requests{{{lv}}}") == 0
    assert metric(reg, f"apiserver_flowcontrol_current_inqueue_requests{{{lv}}}") == 0


async def test_a_disabled_gate_takes_nothing(autojump_clock: object) -> None:
    g = FlowControl(FlowControlConfig(max_requests_inflight=0), registry=Registry())
    async with g.seat(ADMIN, "", "pods"), g.seat(ADMIN, "", "pods"):
        pass
    assert not g.enabled


async def test_levels_missing_from_the_configuration_fall_to_the_last() -> None:
    g = gate(Registry())
    async with g.seat(ALICE, "", "pods"):  # global-default is not configured
        assert g.statistics()["workload-high"].in_use == 1
    assert g.route(NODE, "", "nodes").level == "node-high"


def test_configuration_errors_are_clear() -> None:
    with pytest.raises(ValueError, match="max_requests_inflight"):
        FlowControlConfig(max_requests_inflight=-1)
    with pytest.raises(ValueError, match="retry_after"):
        FlowControlConfig(retry_after=0)


def test_the_cli_default_is_the_gate_default() -> None:
    from orchestrator.apiserver.flowcontrol import DEFAULT_MAX_REQUESTS_INFLIGHT
    from orchestrator.cli import server

    assert server.DEFAULT_MAX_REQUESTS_INFLIGHT == DEFAULT_MAX_REQUESTS_INFLIGHT
