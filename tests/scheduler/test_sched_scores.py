"""Each score plugin on its own: raw formula, normalisation to 0..100, skipping."""

from __future__ import annotations

from typing import Any

from schedfixtures import expr, node, node_info, pod, preferred, taint

from orchestrator.scheduler import NodeInfo, PodInfo
from orchestrator.scheduler.plugins import (
    BalancedAllocation,
    LeastAllocated,
    NodeAffinityScore,
    OwnerSpread,
    TaintTolerationScore,
)


def infos(*nodes: dict[str, Any]) -> list[NodeInfo]:
    return [node_info(n) for n in nodes]


def test_least_allocated_prefers_the_emptier_node() -> None:
    empty = node_info(node("empty", cpu="4", memory="4Gi"))
    half = node_info(node("half", cpu="4", memory="4Gi"), pod("a", cpu="2", memory="2Gi"))
    p = PodInfo.from_pod(pod("p", cpu="1", memory="1Gi"))
    # empty: cpu (4-1)/4 = 75, memory 75 → 75; half: (4-3)/4 = 25 both → 25.
    assert LeastAllocated().score(p, [empty, half]) == [75, 25]


def test_least_allocated_counts_missing_requests_as_defaults() -> None:
    n = node_info(node("n", cpu="1", memory="1000Mi"))
    p = PodInfo.from_pod(pod("p"))  # counts as 100m and 200Mi
    assert LeastAllocated().score(p, [n]) == [(90 + 80) // 2]


def test_least_allocated_zero_for_missing_or_exceeded_resources() -> None:
    no_cpu = node_info(node("n", cpu=None, memory="1Gi"))
    p = PodInfo.from_pod(pod("p", cpu="1", memory="512Mi"))
    assert LeastAllocated().score(p, [no_cpu]) == [(0 + 50) // 2]
    small = node_info(node("s", cpu="500m", memory="256Mi"))
    assert LeastAllocated().score(p, [small]) == [0]


def test_balanced_allocation() -> None:
    n = node_info(node("n", cpu="4", memory="4Gi"))
    even = PodInfo.from_pod(pod("p", cpu="2", memory="2Gi"))
    assert BalancedAllocation().score(even, [n]) == [100]
    skewed = PodInfo.from_pod(pod("p", cpu="4", memory="0"))
    # fractions 1.0 and 0.0 → std 0.5 → 50.
    assert BalancedAllocation().score(skewed, [n]) == [50]
    over = PodInfo.from_pod(pod("p", cpu="8", memory="2Gi"))
    # cpu fraction capped at 1 → |1 - 0.5| / 2 = 0.25 → 75.
    assert BalancedAllocation().score(over, [n]) == [75]
    lacking = node_info(node("m", cpu=None))
    assert BalancedAllocation().score(even, [lacking]) == [100]


def test_balanced_allocation_skips_best_effort_pods() -> None:
    assert BalancedAllocation().score(PodInfo.from_pod(pod("p")), infos(node("n"))) is None


def test_node_affinity_score_sums_weights_and_normalises() -> None:
    nodes = infos(
        node("both", labels={"disk": "ssd", "zone": "a"}),
        node("ssd", labels={"disk": "ssd"}),
        node("zone", labels={"zone": "a"}),
        node("none"),
    )
    aff = preferred((30, [expr("disk", "In", "ssd")]), (10, [expr("zone", "In", "a")]))
    p = PodInfo.from_pod(pod("p", affinity=aff))
    assert NodeAffinityScore().score(p, nodes) == [100, 75, 25, 0]


def test_node_affinity_score_skips_without_preferences_or_differences() -> None:
    nodes = infos(node("a"), node("b"))
    assert NodeAffinityScore().score(PodInfo.from_pod(pod("p")), nodes) is None
    aff = preferred((5, [expr("disk", "In", "ssd")]))
    assert NodeAffinityScore().score(PodInfo.from_pod(pod("p", affinity=aff)), nodes) is None
    zero = preferred((0, [expr("disk", "DoesNotExist")]))
    assert PodInfo.from_pod(pod("p", affinity=zero)).preferred == ()


TWO_SOFT = [taint("a", "1", "PreferNoSchedule"), taint("b", "2", "PreferNoSchedule")]


def test_taint_toleration_score_prefers_fewer_untolerated_soft_taints() -> None:
    nodes = infos(
        node("clean"),
        node("one", taints=[taint("a", "1", "PreferNoSchedule")]),
        node("two", taints=TWO_SOFT),
        node("hard", taints=[taint("c", "3", "NoSchedule")]),
    )
    assert TaintTolerationScore().score(PodInfo.from_pod(pod("p")), nodes) == [100, 50, 0, 100]
    tolerant = pod("p", tolerations=[{"key": "b", "operator": "Exists"}])
    assert TaintTolerationScore().score(PodInfo.from_pod(tolerant), nodes) == [100, 0, 0, 100]
    noschedule_only = pod("p", tolerations=[{"key": "a", "operator": "Exists",
                                             "effect": "NoSchedule"}])  # fmt: skip
    assert TaintTolerationScore().score(PodInfo.from_pod(noschedule_only), nodes) == [
        100, 50, 0, 100,
    ]  # fmt: skip


def test_taint_toleration_score_skips_untainted_clusters() -> None:
    assert TaintTolerationScore().score(PodInfo.from_pod(pod("p")), infos(node("a"))) is None
    everything = pod("p", tolerations=[{"operator": "Exists"}])
    nodes = infos(node("a", taints=[taint("a", "1", "PreferNoSchedule")]), node("b"))
    assert TaintTolerationScore().score(PodInfo.from_pod(everything), nodes) is None


def test_owner_spread_by_node() -> None:
    a = node_info(node("a"), pod("w1", owner="web"), pod("w2", owner="web"))
    b = node_info(node("b"), pod("w3", owner="web"), pod("x", owner="other"))
    c = node_info(node("c"), pod("y", owner="other"))
    p = PodInfo.from_pod(pod("p", owner="web"))
    assert OwnerSpread().score(p, [a, b, c]) == [0, 50, 100]
    assert OwnerSpread().score(PodInfo.from_pod(pod("p")), [a, b, c]) is None
    assert OwnerSpread().score(PodInfo.from_pod(pod("p", owner="new")), [a, b, c]) is None


def test_owner_spread_by_zone() -> None:
    zone = "topology.kubernetes.io/zone"
    a1 = node_info(node("a1", labels={zone: "a"}), pod("w1", owner="web"))
    a2 = node_info(node("a2", labels={zone: "a"}))
    b1 = node_info(node("b1", labels={zone: "b"}))
    p = PodInfo.from_pod(pod("p", owner="web"))
    # node part (1/3): a1 0, a2 100, b1 100; zone part (2/3): zone a 0, zone b 100.
    assert OwnerSpread().score(p, [a1, a2, b1]) == [0, 33, 100]


def test_owner_spread_counts_only_controller_references() -> None:
    p = pod("p")
    p["metadata"]["ownerReferences"] = [{"kind": "ConfigMap", "name": "c", "uid": "u"}]
    assert PodInfo.from_pod(p).owner is None
