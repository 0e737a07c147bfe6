"""schedule_one: filter → score → select, failure messages, sampling and rotation, spreading,
seeded tie-breaks, and the property that a chosen node passes every filter."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from schedfixtures import bound, cache_with, expr, node, pod, preferred, required, taint

from orchestrator.scheduler import (
    DEFAULT_FRAMEWORK,
    Framework,
    NodeFilter,
    NodeInfo,
    PodInfo,
    SchedulerCache,
    check_node,
    failure_message,
    num_feasible_nodes_to_find,
    schedule_one,
)

Obj = dict[str, Any]


def place(cache: SchedulerCache, p: Obj, rng: random.Random, now: float = 0.0) -> str | None:
    decision = schedule_one(p, cache, rng, now)
    if decision.node is not None:
        cache.assume(decision.pod or p, decision.node, now)
    return decision.node


# --- decisions and messages -------------------------------------------------------------------


def test_single_feasible_node_is_chosen() -> None:
    cache = cache_with(node("small", cpu="1"), node("big", cpu="8"))
    decision = schedule_one(pod("p", cpu="2"), cache, random.Random(0), 0.0)
    assert decision.node == "big"
    assert decision.reasons == {"small": ("Insufficient cpu",)}
    assert decision.message == "Successfully assigned default/p to big"


def test_failure_message_counts_and_sorts_reasons() -> None:
    cache = cache_with(
        node("a", cpu="1"),
        node("b", labels={"zone": "x"}),
        node("c", labels={"zone": "y"}),
    )
    p = pod("p", cpu="2", node_selector={"zone": "z"})
    decision = schedule_one(p, cache, random.Random(0), 0.0)
    assert decision.node is None
    # "a" fails affinity first (filters run in order; fit comes last).
    assert decision.message == (
        "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."
    )
    p = pod("p", cpu="2")
    cache = cache_with(node("a", cpu="1"), node("b", cpu="1", memory="1Mi"), node("c", ready=False))
    decision = schedule_one(pod("p", cpu="2", memory="2Mi"), cache, random.Random(0), 0.0)
    assert decision.message == (
        "0/3 nodes are available: 1 Insufficient memory, 1 node(s) were not ready, "
        "2 Insufficient cpu."
    )


def test_failure_message_edge_cases() -> None:
    assert failure_message(0, {}) == "no nodes available to schedule pods"
    assert failure_message(2, {}) == "0/2 nodes are available:"
    decision = schedule_one(pod("p"), SchedulerCache(), random.Random(0), 0.0)
    assert decision.node is None
    assert decision.message == "no nodes available to schedule pods"


def test_filters_report_the_first_failing_plugin_per_node() -> None:
    n = node("n", cpu="1", ready=False, unschedulable=True, taints=[taint("t")])
    decision = schedule_one(pod("p", cpu="2"), cache_with(n), random.Random(0), 0.0)
    assert decision.reasons == {"n": ("node(s) were not ready",)}
    n = node("n", cpu="1", unschedulable=True, taints=[taint("t")])
    decision = schedule_one(pod("p", cpu="2"), cache_with(n), random.Random(0), 0.0)
    assert decision.reasons == {"n": ("node(s) were unschedulable",)}
    n = node("n", cpu="1", taints=[taint("t", "v")])
    decision = schedule_one(pod("p", cpu="2"), cache_with(n), random.Random(0), 0.0)
    assert decision.reasons == {"n": ("node(s) had untolerated taint {t: v}",)}


def test_invalid_pod_is_a_decision_with_an_error() -> None:
    bad = pod("p")
    bad["spec"]["containers"][0]["resources"] = {"requests": {"memory": "12 GB"}}
    decision = schedule_one(bad, cache_with(node("n")), random.Random(0), 0.0)
    assert decision.node is None
    assert decision.error is not None
    assert "spec.containers[0].resources.requests.memory" in decision.message
    assert "'12 GB'" in decision.message


# --- scoring steers the choice ----------------------------------------------------------------


def test_least_allocated_node_wins() -> None:
    cache = cache_with(node("busy"), node("idle"))
    cache.add_pod(bound(pod("x", cpu="3", memory="6Gi"), "busy"))
    assert schedule_one(pod("p", cpu="100m", memory="100Mi"), cache, random.Random(0), 0).node == (
        "idle"
    )


def test_preferred_affinity_wins_over_emptiness() -> None:
    cache = cache_with(node("ssd", labels={"disk": "ssd"}), node("hdd"))
    cache.add_pod(bound(pod("x", cpu="2", memory="4Gi"), "ssd"))
    p = pod("p", cpu="100m", affinity=preferred((50, [expr("disk", "In", "ssd")])))
    assert schedule_one(p, cache, random.Random(0), 0).node == "ssd"


def test_prefer_no_schedule_taint_is_avoided() -> None:
    cache = cache_with(node("a", taints=[taint("meh", "1", "PreferNoSchedule")]), node("b"))
    for seed in range(20):
        assert schedule_one(pod("p"), cache, random.Random(seed), 0).node == "b"


def test_same_owner_pods_spread_across_nodes() -> None:
    cache = cache_with(node("a"), node("b"), node("c"))
    rng = random.Random(7)
    where = Counter(place(cache, pod(f"w{i}", cpu="10m", owner="web"), rng) for i in range(9))
    assert where == {"a": 3, "b": 3, "c": 3}


def test_spreading_is_per_owner() -> None:
    cache = cache_with(node("a"), node("b"))
    for i in range(4):  # another deployment fills "a" a little
        cache.add_pod(bound(pod(f"o{i}", cpu="10m", owner="other"), "a"))
    rng = random.Random(1)
    where = Counter(place(cache, pod(f"w{i}", cpu="10m", owner="web"), rng) for i in range(6))
    assert where["a"] >= 2
    assert where["b"] >= 2


def test_spreading_across_zones() -> None:
    zone = "topology.kubernetes.io/zone"
    for seed in range(10):
        cache = cache_with(
            node("a1", labels={zone: "a"}),
            node("a2", labels={zone: "a"}),
            node("a3", labels={zone: "a"}),
            node("b1", labels={zone: "b"}),
        )
        rng = random.Random(seed)
        where = [place(cache, pod(f"w{i}", cpu="10m", owner="web"), rng) for i in range(2)]
        # The second replica goes to the other zone, although zone "a" has more empty nodes.
        assert sorted(n[0] for n in where if n) == ["a", "b"]


# --- tie-breaks --------------------------------------------------------------------------------


def choices(seed: int, count: int = 30) -> list[str | None]:
    cache = cache_with(*(node(f"n{i}") for i in range(5)))
    rng = random.Random(seed)
    return [schedule_one(pod(f"p{i}"), cache, rng, 0.0).node for i in range(count)]


def test_ties_are_broken_deterministically_with_a_seed() -> None:
    assert choices(42) == choices(42)
    assert choices(42) != choices(43)


def test_ties_are_broken_uniformly() -> None:
    picks = Counter(n for seed in range(20) for n in choices(seed))
    assert set(picks) == {f"n{i}" for i in range(5)}
    assert min(picks.values()) > 80  # 600 picks over 5 nodes: ~120 each


# --- sampling and rotation ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nodes", "percentage", "wanted"),
    [
        (0, None, 0),
        (1, None, 1),
        (99, None, 99),
        (100, None, 100),
        (200, None, 100),  # 49 % = 98 → at least 100
        (1000, None, 420),  # 50 - 8 = 42 %
        (5000, None, 500),  # 10 %
        (10000, None, 500),  # 5 % floor
        (1000, 10, 100),
        (1000, 100, 1000),
        (50, 10, 50),
    ],
)
def test_num_feasible_nodes_to_find(nodes: int, percentage: int | None, wanted: int) -> None:
    assert num_feasible_nodes_to_find(nodes, percentage) == wanted


def test_large_clusters_sample_and_rotate() -> None:
    cache = cache_with(*(node(f"n{i:03d}") for i in range(1000)))
    rng = random.Random(0)
    d = schedule_one(pod("p"), cache, rng, 0.0)
    assert d.node is not None
    assert int(d.node[1:]) < 420  # only the first 420 nodes were looked at
    assert cache.next_start_index == 420
    d = schedule_one(pod("q"), cache, rng, 0.0)
    assert d.node is not None
    assert 420 <= int(d.node[1:]) < 840
    assert cache.next_start_index == 840
    d = schedule_one(pod("r"), cache, rng, 0.0)
    assert d.node is not None
    assert int(d.node[1:]) >= 840 or int(d.node[1:]) < 260  # wraps around
    assert cache.next_start_index == 260


def test_sampling_keeps_looking_past_infeasible_nodes() -> None:
    nodes = [node(f"n{i:03d}", cpu="1" if i < 900 else "8") for i in range(1000)]
    cache = cache_with(*nodes)
    d = schedule_one(pod("p", cpu="4"), cache, random.Random(0), 0.0)
    assert d.node is not None
    assert int(d.node[1:]) >= 900
    assert len(d.reasons) == 900
    assert cache.next_start_index == 0  # visited everything


def test_custom_plugins_follow_the_protocols() -> None:
    @dataclass(frozen=True)
    class OnlyEven:
        name: str = "OnlyEven"

        def prepare(self, pod: PodInfo) -> NodeFilter:
            def run(nodes: list[NodeInfo], reasons: dict[str, tuple[str, ...]]) -> list[NodeInfo]:
                for n in nodes:
                    if int(n.name[1:]) % 2:
                        reasons[n.name] = ("node(s) were odd",)
                return [n for n in nodes if not int(n.name[1:]) % 2]

            return run

        def cache_key(self, pod: PodInfo) -> Hashable:
            return ()  # a node's verdict depends on the node only

    @dataclass(frozen=True)
    class Highest:
        name: str = "Highest"

        def cache_key(self, pod: PodInfo) -> Hashable:
            return ()  # per node, whatever the pod

        def score(self, pod: PodInfo, nodes: Sequence[NodeInfo]) -> list[int] | None:
            return [int(n.name[1:]) * 10 for n in nodes]

    fw = Framework(filters=[OnlyEven()], scores=[(Highest(), 1)])
    cache = cache_with(*(node(f"n{i}") for i in range(6)))
    d = fw.schedule_one(pod("p"), cache, random.Random(0), 0.0)
    assert d.node == "n4"
    assert d.message == "Successfully assigned default/p to n4"
    assert failure_message(6, d.reasons) == "0/6 nodes are available: 3 node(s) were odd."


# --- the property: a decision never violates a filter ------------------------------------------

LABEL_KEYS = ["zone", "disk", "gpu"]
LABEL_VALUES = ["a", "b", "1", "8"]
label_maps = st.dictionaries(st.sampled_from(LABEL_KEYS), st.sampled_from(LABEL_VALUES), max_size=3)
taints = st.lists(
    st.builds(
        taint,
        st.sampled_from(["dedicated", "gpu", "node.kubernetes.io/not-ready"]),
        st.sampled_from(["", "x"]),
        st.sampled_from(["NoSchedule", "NoExecute", "PreferNoSchedule"]),
    ),
    max_size=2,
)
cpus = st.sampled_from(["0", "100m", "500m", "1", "2", "4"])
mems = st.sampled_from(["0", "64Mi", "512Mi", "1Gi", "4Gi"])
port_choices: list[int | tuple[int, str, str]] = [80, 443, (53, "UDP", ""), (80, "TCP", "10.0.0.1")]
ports = st.lists(st.sampled_from(port_choices), max_size=2)
tolerations = st.lists(
    st.fixed_dictionaries(
        {
            "key": st.sampled_from(["", "dedicated", "gpu", "node.kubernetes.io/not-ready",
                                    "node.kubernetes.io/unschedulable"]),
            "operator": st.sampled_from(["Exists", "Equal"]),
            "value": st.sampled_from(["", "x"]),
            "effect": st.sampled_from(["", "NoSchedule", "NoExecute"]),
        }
    ),
    max_size=2,
)  # fmt: skip
expressions = st.lists(
    st.builds(
        expr,
        st.sampled_from(LABEL_KEYS),
        st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]),
        st.sampled_from(LABEL_VALUES),
    ),
    min_size=1,
    max_size=2,
)


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[Obj], list[Obj], Obj]:
    count = draw(st.integers(1, 6))
    nodes = [
        node(
            f"n{i}",
            cpu=draw(cpus),
            memory=draw(mems),
            pods=draw(st.sampled_from(["1", "2", "110"])),
            labels=draw(label_maps),
            taints=draw(st.one_of(st.just([]), taints)),
            ready=draw(st.sampled_from([True, True, True, False])),
            unschedulable=draw(st.sampled_from([False, False, False, True])),
        )
        for i in range(count)
    ]
    existing = [
        bound(
            pod(f"e{j}", cpu=draw(cpus), memory=draw(mems), host_ports=draw(ports),
                owner=draw(st.sampled_from([None, "web"]))),
            f"n{draw(st.integers(0, count - 1))}",
        )
        for j in range(draw(st.integers(0, 8)))
    ]  # fmt: skip
    affinity = draw(st.one_of(st.none(), st.none(), st.lists(expressions, min_size=1, max_size=2)))
    candidate = pod(
        "p",
        cpu=draw(cpus),
        memory=draw(mems),
        node_name=draw(st.sampled_from([None, None, "n0", "n1"])),
        node_selector=draw(st.one_of(st.none(), st.none(), label_maps)),
        affinity=required(*affinity) if affinity else None,
        tolerations=draw(tolerations),
        host_ports=draw(st.one_of(st.just([]), ports)),
        owner=draw(st.sampled_from([None, "web"])),
    )
    return nodes, existing, candidate


# An independent oracle, straight from the API objects (the generated pods are simple: one
# container, requests only), so a bug in PodInfo/NodeInfo cannot hide itself.

UNITS: dict[str, Fraction] = {"m": Fraction(1, 1000), "Mi": Fraction(2**20), "Gi": Fraction(2**30)}


def amount(q: str) -> Fraction:
    for suffix in ("Mi", "Gi", "m"):
        if q.endswith(suffix):
            return Fraction(q[: -len(suffix)]) * UNITS[suffix]
    return Fraction(q)


def requests(p: Obj) -> dict[str, Fraction]:
    reqs = p["spec"]["containers"][0].get("resources", {}).get("requests", {})
    return {k: amount(v) for k, v in reqs.items()}


def tolerated(tols: list[Obj], t: Obj) -> bool:
    for tol in tols:
        if tol.get("effect") and tol["effect"] != t["effect"]:
            continue
        if tol.get("key") and tol["key"] != t["key"]:
            continue
        if tol.get("operator") == "Exists" or tol.get("value", "") == t.get("value", ""):
            return True
    return False


def expression_matches(e: Obj, labels: dict[str, str]) -> bool:
    key, op, values = e["key"], e["operator"], e.get("values", [])
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if key not in labels or not labels[key].isdigit() or not values[0].isdigit():
        return False
    return int(labels[key]) > int(values[0]) if op == "Gt" else int(labels[key]) < int(values[0])


def host_ports(p: Obj) -> list[tuple[str, str, int]]:
    return [
        (port.get("hostIP", "0.0.0.0"), port.get("protocol", "TCP"), port["hostPort"])
        for port in p["spec"]["containers"][0].get("ports", [])
    ]


def violations(n: Obj, on_node: list[Obj], p: Obj) -> list[str]:
    out = []
    spec, labels = n["spec"], n["metadata"]["labels"]
    tols = p["spec"].get("tolerations", [])
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])
    not_ready_taint = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
    if not ready and not tolerated(tols, not_ready_taint):
        out.append("ready")
    cordon_taint = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
    if spec.get("unschedulable") and not tolerated(tols, cordon_taint):
        out.append("cordon")
    if p["spec"].get("nodeName") not in (None, n["metadata"]["name"]):
        out.append("name")
    for t in spec.get("taints", []):
        if t["effect"] != "PreferNoSchedule" and not tolerated(tols, t):
            out.append("taint")
    for k, v in p["spec"].get("nodeSelector", {}).items():
        if labels.get(k) != v:
            out.append("selector")
    terms = (p["spec"].get("affinity") or {}).get("nodeAffinity", {})
    terms = terms.get("requiredDuringSchedulingIgnoredDuringExecution", {})
    if terms and not any(
        all(expression_matches(e, labels) for e in term["matchExpressions"])
        for term in terms["nodeSelectorTerms"]
    ):
        out.append("affinity")
    used = [hp for other in on_node for hp in host_ports(other)]
    for ip, proto, port in host_ports(p):
        for uip, uproto, uport in used:
            if ((proto, port) == (uproto, uport) and "0.0.0.0" in (ip, uip)) or (
                ip,
                proto,
                port,
            ) == (uip, uproto, uport):
                out.append("port")
    alloc = n["status"]["allocatable"]
    if len(on_node) + 1 > int(alloc["pods"]):
        out.append("pods")
    want = requests(p)
    for resource in ("cpu", "memory"):
        have = sum((requests(o).get(resource, Fraction(0)) for o in on_node), Fraction(0))
        if want.get(resource) and want[resource] > amount(alloc[resource]) - have:
            out.append(resource)
    return out


@settings(max_examples=400, deadline=None)
@given(cluster=clusters(), seed=st.integers(0, 2**16))
def test_decision_never_violates_a_filter(
    cluster: tuple[list[Obj], list[Obj], Obj], seed: int
) -> None:
    nodes, existing, candidate = cluster
    cache = cache_with(*nodes)
    for e in existing:
        cache.add_pod(e)
    decision = schedule_one(candidate, cache, random.Random(seed), 0.0)
    bad = {
        n["metadata"]["name"]: violations(
            n, [e for e in existing if e["spec"]["nodeName"] == n["metadata"]["name"]], candidate
        )
        for n in nodes
    }
    if decision.node is not None:
        assert bad[decision.node] == []
    else:
        assert all(bad.values())  # no feasible node was missed
    assert set(decision.reasons) == {name for name, why in bad.items() if why}
    # And the framework agrees with its own plugins, reason by reason.
    info = PodInfo.from_pod(candidate)
    for n in cache.nodes():
        first = next((r for f in DEFAULT_FRAMEWORK.filters if (r := check_node(f, info, n))), ())
        assert decision.reasons.get(n.name, ()) == first
