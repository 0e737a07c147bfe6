"""SchedulerCache: assumed pods count at once, confirm/forget/expire, never overcommitting while
the watch lags; node and pod events in any order."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from schedfixtures import bound, cache_with, node, pod

from orchestrator.scheduler import NodeInfo, PodInfo, SchedulerCache, schedule_one

Obj = dict[str, Any]


def totals(info: NodeInfo) -> tuple[int, int, int, int, int]:
    return info.cpu, info.memory, info.nonzero_cpu, info.nonzero_memory, info.pod_count


def recomputed(info: NodeInfo) -> tuple[int, int, int, int, int]:
    pods = list(info.pods.values())
    return (
        sum(p.cpu for p in pods),
        sum(p.memory for p in pods),
        sum(p.nonzero_cpu for p in pods),
        sum(p.nonzero_memory for p in pods),
        len(pods),
    )


def node_of(cache: SchedulerCache, name: str) -> NodeInfo:
    info = cache.get_node(name)
    assert info is not None
    return info


def test_assume_counts_at_once_and_blocks_the_next_pod() -> None:
    cache = cache_with(node("n", cpu="1"))
    rng = random.Random(0)
    first = pod("a", cpu="600m")
    decision = schedule_one(first, cache, rng, 0.0)
    assert decision.node == "n"
    cache.assume(first, "n", 0.0)
    assert node_of(cache, "n").cpu == 600
    assert cache.is_assumed(first)
    second = schedule_one(pod("b", cpu="600m"), cache, rng, 0.1)
    assert second.node is None
    assert second.message == "0/1 nodes are available: 1 Insufficient cpu."


def test_confirm_does_not_double_count() -> None:
    cache = cache_with(node("n"))
    p = pod("a", cpu="100m")
    cache.assume(p, "n", 0.0)
    cache.add_pod(bound(p, "n"))
    assert not cache.is_assumed(p)
    assert totals(node_of(cache, "n"))[:1] == (100,)
    assert cache.statistics().pods == 1
    cache.update_pod(bound(p, "n"))  # later status updates too
    assert node_of(cache, "n").pod_count == 1
    assert cache.expire(1e9) == []  # confirmed pods never expire
    assert node_of(cache, "n").cpu == 100


def test_status_updates_of_a_counted_pod_recount_only_a_changed_owner() -> None:
    cache = cache_with(node("n"))
    p = bound(pod("a", cpu="100m", owner="web"), "n", phase="Pending")
    cache.add_pod(p)
    n = node_of(cache, "n")
    version = n.version
    running = {**p, "status": {"phase": "Running", "podIP": "10.0.0.1"}}
    cache.update_pod(running)  # the same pod on the same node: nothing to recount
    assert n.version == version
    assert n.pods["uid-default-a"].pod is running
    assert (n.cpu, n.pod_count, n.owners) == (100, 1, {"rs-web": 1})
    adopted = pod("a", cpu="100m", owner="api")  # another controller took it over
    cache.update_pod(bound(adopted, "n"))
    assert n.owners == {"rs-api": 1}
    assert (n.cpu, n.pod_count) == (100, 1)


def test_confirm_on_another_node_moves_the_pod() -> None:
    cache = cache_with(node("a"), node("b"))
    p = pod("p", cpu="100m", owner="web")
    cache.assume(p, "a", 0.0)
    cache.confirm(bound(p, "b"))
    assert totals(node_of(cache, "a")) == (0, 0, 0, 0, 0)
    assert node_of(cache, "b").cpu == 100
    assert node_of(cache, "b").owners == {"rs-web": 1}
    assert node_of(cache, "a").owners == {}
    assert cache.node_of(p) == "b"


def test_forget_releases_resources() -> None:
    cache = cache_with(node("n", cpu="1"))
    p = pod("a", cpu="1", host_ports=[80], owner="web")
    cache.assume(PodInfo.from_pod(p), "n", 0.0)
    cache.forget(p)
    info = node_of(cache, "n")
    assert totals(info) == (0, 0, 0, 0, 0)
    assert info.ports == {}
    assert info.owners == {}
    assert schedule_one(pod("b", cpu="1", host_ports=[80]), cache, random.Random(0), 0).node == "n"


def test_forget_ignores_pods_not_assumed() -> None:
    cache = cache_with(node("n"))
    p = pod("a", cpu="100m")
    cache.add_pod(bound(p, "n"))
    cache.forget(p)
    assert node_of(cache, "n").cpu == 100


def test_assumed_pod_expires_after_ttl_unless_confirmed() -> None:
    cache = SchedulerCache(assumed_ttl=30.0)
    cache.add_node(node("n"))
    p = pod("a", cpu="100m")
    cache.assume(p, "n", 10.0)
    assert cache.expire(39.9) == []
    assert node_of(cache, "n").cpu == 100
    assert cache.expire(40.0) == [PodInfo.from_pod(p).key]
    assert node_of(cache, "n").cpu == 0
    assert cache.statistics().assumed == 0


def test_finish_binding_rearms_the_deadline() -> None:
    cache = SchedulerCache(assumed_ttl=30.0)
    cache.add_node(node("n"))
    p = pod("a", cpu="100m")
    cache.assume(p, "n", 0.0)
    cache.finish_binding(p, 25.0)
    assert cache.expire(40.0) == []
    assert cache.expire(55.0) != []


def test_expired_then_confirmed_pod_is_counted_again() -> None:
    cache = cache_with(node("n"))
    p = pod("a", cpu="100m")
    cache.assume(p, "n", 0.0)
    cache.expire(100.0)
    cache.add_pod(bound(p, "n"))
    assert node_of(cache, "n").cpu == 100


def test_schedule_one_expires_assumptions() -> None:
    cache = cache_with(node("n", cpu="1"))
    cache.assume(pod("a", cpu="1"), "n", 0.0)
    assert schedule_one(pod("b", cpu="1"), cache, random.Random(0), 1.0).node is None
    assert schedule_one(pod("b", cpu="1"), cache, random.Random(0), 31.0).node == "n"


def test_pending_update_keeps_the_assumption() -> None:
    cache = cache_with(node("n"))
    p = pod("a", cpu="100m")
    cache.assume(p, "n", 0.0)
    cache.update_pod(p)  # e.g. an older watch event of the pod still pending
    assert cache.is_assumed(p)
    assert node_of(cache, "n").cpu == 100


def test_assume_errors() -> None:
    cache = cache_with(node("n"))
    p = pod("a")
    cache.assume(p, "n", 0.0)
    with pytest.raises(ValueError, match="already in the scheduler cache"):
        cache.assume(p, "n", 0.0)
    with pytest.raises(ValueError, match="no node gone"):
        cache.assume(pod("b"), "gone", 0.0)


def test_remove_and_terminal_pods_release_resources() -> None:
    cache = cache_with(node("n"))
    a, b = pod("a", cpu="100m"), pod("b", cpu="200m")
    cache.add_pod(bound(a, "n"))
    cache.add_pod(bound(b, "n"))
    cache.remove_pod(a)
    assert node_of(cache, "n").cpu == 200
    cache.update_pod(bound(b, "n", phase="Succeeded"))
    assert totals(node_of(cache, "n")) == (0, 0, 0, 0, 0)
    cache.remove_pod(b)  # the delete after completion: a no-op
    cache.remove_pod(a)
    assert cache.statistics().pods == 0


def test_assumed_pod_deleted_is_released() -> None:
    cache = cache_with(node("n"))
    p = pod("a", cpu="100m")
    cache.assume(p, "n", 0.0)
    cache.remove_pod(p)
    assert not cache.is_assumed(p)
    assert node_of(cache, "n").cpu == 0
    assert cache.expire(1e9) == []


def test_pod_before_node_and_node_removal() -> None:
    cache = SchedulerCache()
    p = pod("a", cpu="100m")
    cache.add_pod(bound(p, "late"))
    assert cache.nodes() == []
    assert cache.get_node("late") is None
    cache.add_node(node("late"))
    assert node_of(cache, "late").cpu == 100
    cache.remove_node("late")
    assert cache.nodes() == []
    cache.add_node(node("late"))  # back, with its pod still counted
    assert node_of(cache, "late").cpu == 100
    cache.remove_node(node("late"))
    cache.remove_pod(p)
    cache.add_node(node("late"))
    assert node_of(cache, "late").cpu == 0
    cache.remove_node("never-seen")


def test_update_node_reports_relevant_changes_only() -> None:
    cache = SchedulerCache()
    n = node("n")
    assert cache.add_node(n)
    heartbeat = node("n")
    heartbeat["status"]["conditions"][0]["lastHeartbeatTime"] = "2024-01-01T00:00:10Z"
    assert not cache.update_node(heartbeat)
    assert cache.update_node(node("n", cpu="8"))
    assert cache.update_node(node("n", cpu="8", labels={"a": "b"}))
    assert cache.update_node(node("n", cpu="8", labels={"a": "b"}, unschedulable=True))
    assert cache.update_node(node("n", cpu="8", labels={"a": "b"}, unschedulable=True,
                                  ready=False))  # fmt: skip
    with pytest.raises(ValueError, match=r"metadata\.name"):
        cache.add_node({"metadata": {}})


def test_node_order_is_insertion_order() -> None:
    cache = cache_with(node("c"), node("a"), node("b"))
    assert [n.name for n in cache.nodes()] == ["c", "a", "b"]
    cache.update_node(node("a", cpu="8"))
    assert [n.name for n in cache.nodes()] == ["c", "a", "b"]


# --- the property: a lagging watch never leads to overcommitment ---------------------------------

OPS = st.lists(
    st.tuples(
        st.sampled_from(["schedule", "deliver", "fail_bind", "delete", "tick"]),
        st.integers(min_value=0, max_value=1000),
    ),
    max_size=80,
)


@settings(max_examples=150, deadline=None)
@given(ops=OPS, seed=st.integers(0, 2**16))
def test_never_overcommits_while_the_watch_lags(ops: list[tuple[str, int]], seed: int) -> None:
    # The TTL is for watch events that never come; here every binding is eventually seen or
    # fails, however late, so the TTL is out of reach (an assumption that expires and then shows
    # up *can* overcommit: that is the price of not pinning resources forever).
    cache = SchedulerCache(assumed_ttl=1e9)
    for i in range(3):
        cache.add_node(node(f"n{i}", cpu="1", memory="1Gi", pods="4"))
    rng = random.Random(seed)
    in_flight: list[tuple[Obj, str]] = []  # bound by the API, not yet seen by the watch
    live: list[Obj] = []
    now = 0.0
    for step, (op, arg) in enumerate(ops):
        if op == "schedule":
            p = pod(f"p{step}", cpu=f"{100 + arg % 400}m", memory=f"{64 + arg % 256}Mi",
                    owner=f"o{arg % 3}")  # fmt: skip
            decision = schedule_one(p, cache, rng, now)
            if decision.node is not None:
                cache.assume(decision.pod or p, decision.node, now)
                in_flight.append((p, decision.node))
        elif op == "deliver" and in_flight:
            p, name = in_flight.pop(arg % len(in_flight))
            cache.add_pod(bound(p, name))
            live.append(bound(p, name))
        elif op == "fail_bind" and in_flight:
            p, _ = in_flight.pop(arg % len(in_flight))
            cache.forget(p)
        elif op == "delete" and live:
            cache.remove_pod(live.pop(arg % len(live)))
        elif op == "tick":
            now += arg / 100
            if in_flight:
                cache.finish_binding(in_flight[0][0], now)
        for info in cache.nodes():
            assert info.cpu <= info.alloc_cpu
            assert info.memory <= info.alloc_memory
            assert info.pod_count <= info.alloc_pods
            assert totals(info) == recomputed(info)
            assert sum(info.owners.values()) == info.pod_count
    stats = cache.statistics()
    assert stats.assumed <= len(in_flight)
    assert stats.pods == len(live) + stats.assumed
