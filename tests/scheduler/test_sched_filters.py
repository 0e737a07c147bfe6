"""Each filter plugin on its own, through `check_node` (one pod, one node), and PodInfo parsing."""

from __future__ import annotations

from typing import Any

import pytest
from schedfixtures import bound, expr, node, node_info, pod, required, taint

from orchestrator.scheduler import PodInfo, check_node
from orchestrator.scheduler.plugins import (
    NodeAffinity,
    NodeName,
    NodePorts,
    NodeReady,
    NodeResourcesFit,
    NodeUnschedulable,
    TaintToleration,
)

Obj = dict[str, Any]


def reasons(plugin: Any, p: Obj, n: Obj, *on_node: Obj) -> tuple[str, ...]:
    return check_node(plugin, PodInfo.from_pod(p), node_info(n, *on_node))


# --- NodeReady / NodeUnschedulable / NodeName ----------------------------------------------------


def test_ready_node_passes_not_ready_fails() -> None:
    assert reasons(NodeReady(), pod("p"), node("n")) == ()
    assert reasons(NodeReady(), pod("p"), node("n", ready=False)) == ("node(s) were not ready",)
    assert reasons(NodeReady(), pod("p"), node("n", ready=None)) == ("node(s) were not ready",)


def test_not_ready_noexecute_toleration_is_not_enough_but_noschedule_is() -> None:
    default = [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                "effect": "NoExecute", "tolerationSeconds": 300}]  # fmt: skip
    assert reasons(NodeReady(), pod("p", tolerations=default), node("n", ready=False)) != ()
    daemon = [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
               "effect": "NoSchedule"}]  # fmt: skip
    assert reasons(NodeReady(), pod("p", tolerations=daemon), node("n", ready=False)) == ()
    everything = [{"operator": "Exists"}]
    assert reasons(NodeReady(), pod("p", tolerations=everything), node("n", ready=False)) == ()


def test_cordoned_node_fails_unless_tolerated() -> None:
    assert reasons(NodeUnschedulable(), pod("p"), node("n")) == ()
    assert reasons(NodeUnschedulable(), pod("p"), node("n", unschedulable=True)) == (
        "node(s) were unschedulable",
    )
    tol = [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists",
            "effect": "NoSchedule"}]  # fmt: skip
    assert (
        reasons(NodeUnschedulable(), pod("p", tolerations=tol), node("n", unschedulable=True)) == ()
    )


def test_node_name() -> None:
    assert reasons(NodeName(), pod("p"), node("a")) == ()
    assert reasons(NodeName(), pod("p", node_name="a"), node("a")) == ()
    assert reasons(NodeName(), pod("p", node_name="a"), node("b")) == (
        "node(s) didn't match the requested node name",
    )


# --- TaintToleration ------------------------------------------------------------------------------


def tol(key: str = "", op: str = "", value: str = "", effect: str = "") -> Obj:
    return {k: v for k, v in (("key", key), ("operator", op), ("value", value),
                              ("effect", effect)) if v}  # fmt: skip


@pytest.mark.parametrize(
    ("toleration", "tolerated"),
    [
        (tol("gpu", "Equal", "yes", "NoSchedule"), True),
        (tol("gpu", "", "yes", "NoSchedule"), True),  # operator defaults to Equal
        (tol("gpu", "Equal", "no", "NoSchedule"), False),
        (tol("gpu", "Equal", "yes", "NoExecute"), False),
        (tol("gpu", "Equal", "yes"), True),  # empty effect matches every effect
        (tol("gpu", "Exists"), True),
        (tol("gpu", "Exists", effect="NoExecute"), False),
        (tol("other", "Exists"), False),
        (tol("", "Exists"), True),  # empty key with Exists tolerates everything
        (tol("", "Equal", "yes"), True),  # empty key matches any key; value still compared
        (tol("", "Equal", "no"), False),
        (tol("gpu", "Lt", "yes"), False),  # unknown operator
    ],
)
def test_toleration_matching(toleration: Obj, tolerated: bool) -> None:
    n = node("n", taints=[taint("gpu", "yes", "NoSchedule")])
    got = reasons(TaintToleration(), pod("p", tolerations=[toleration]), n)
    assert got == (() if tolerated else ("node(s) had untolerated taint {gpu: yes}",))


def test_taint_effects() -> None:
    assert reasons(TaintToleration(), pod("p"), node("n")) == ()
    noexec = node("n", taints=[taint("dead", effect="NoExecute")])
    assert reasons(TaintToleration(), pod("p"), noexec) == (
        "node(s) had untolerated taint {dead: }",
    )
    soft = node("n", taints=[taint("meh", "x", "PreferNoSchedule")])
    assert reasons(TaintToleration(), pod("p"), soft) == ()  # a preference, not a filter


def test_first_untolerated_taint_is_reported() -> None:
    n = node("n", taints=[taint("a", "1"), taint("b", "2"), taint("c", "3")])
    p = pod("p", tolerations=[tol("a", "Exists")])
    assert reasons(TaintToleration(), p, n) == ("node(s) had untolerated taint {b: 2}",)
    p = pod("p", tolerations=[tol("a", "Exists"), tol("b", "Exists"), tol("c", "Exists")])
    assert reasons(TaintToleration(), p, n) == ()


# --- NodeAffinity ---------------------------------------------------------------------------------

LABELS = {"zone": "a", "disk": "ssd", "cores": "8"}


@pytest.mark.parametrize(
    ("requirement", "matches"),
    [
        (expr("zone", "In", "a", "b"), True),
        (expr("zone", "In", "b"), False),
        (expr("missing", "In", "a"), False),
        (expr("zone", "NotIn", "b"), True),
        (expr("zone", "NotIn", "a"), False),
        (expr("missing", "NotIn", "a"), True),
        (expr("disk", "Exists"), True),
        (expr("missing", "Exists"), False),
        (expr("disk", "DoesNotExist"), False),
        (expr("missing", "DoesNotExist"), True),
        (expr("cores", "Gt", "4"), True),
        (expr("cores", "Gt", "8"), False),
        (expr("cores", "Lt", "16"), True),
        (expr("cores", "Lt", "8"), False),
        (expr("zone", "Gt", "1"), False),  # label not an integer
        (expr("missing", "Lt", "100"), False),
        (expr("cores", "Gt", "x"), False),  # invalid value: never matches
        (expr("cores", "Gt", "1", "2"), False),  # Gt takes exactly one value
        (expr("zone", "Like", "a"), False),  # unknown operator
    ],
)
def test_match_expressions(requirement: Obj, matches: bool) -> None:
    n = node("n", labels=LABELS)
    got = reasons(NodeAffinity(), pod("p", affinity=required([requirement])), n)
    assert got == (() if matches else ("node(s) didn't match Pod's node affinity/selector",))


def test_node_selector_is_a_subset_match() -> None:
    n = node("n", labels=LABELS)
    assert reasons(NodeAffinity(), pod("p", node_selector={"zone": "a"}), n) == ()
    assert reasons(NodeAffinity(), pod("p", node_selector={"zone": "a", "disk": "ssd"}), n) == ()
    assert reasons(NodeAffinity(), pod("p", node_selector={"zone": "b"}), n) != ()
    assert reasons(NodeAffinity(), pod("p", node_selector={"gpu": "yes"}), n) != ()


def test_terms_are_ored_and_requirements_anded() -> None:
    n = node("n", labels=LABELS)
    both = [expr("zone", "In", "a"), expr("disk", "In", "hdd")]
    assert reasons(NodeAffinity(), pod("p", affinity=required(both)), n) != ()
    either = required([expr("zone", "In", "b")], [expr("disk", "In", "ssd")])
    assert reasons(NodeAffinity(), pod("p", affinity=either), n) == ()


def test_selector_and_affinity_must_both_match() -> None:
    n = node("n", labels=LABELS)
    p = pod("p", node_selector={"zone": "a"}, affinity=required([expr("disk", "In", "hdd")]))
    assert reasons(NodeAffinity(), p, n) != ()


def test_empty_terms_match_nothing() -> None:
    n = node("n", labels=LABELS)
    assert reasons(NodeAffinity(), pod("p", affinity=required([])), n) != ()
    no_terms: Obj = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}
    assert reasons(NodeAffinity(), pod("p", affinity=no_terms), n) != ()


def test_match_fields_on_node_name() -> None:
    a = node("a", labels=LABELS)
    by_name = required(fields=[{"key": "metadata.name", "operator": "In", "values": ["a"]}])
    assert reasons(NodeAffinity(), pod("p", affinity=by_name), a) == ()
    assert reasons(NodeAffinity(), pod("p", affinity=by_name), node("b")) != ()
    not_a = required(fields=[{"key": "metadata.name", "operator": "NotIn", "values": ["a"]}])
    assert reasons(NodeAffinity(), pod("p", affinity=not_a), a) != ()
    other = required(fields=[{"key": "metadata.uid", "operator": "In", "values": ["a"]}])
    assert reasons(NodeAffinity(), pod("p", affinity=other), a) != ()


def test_no_affinity_means_no_check() -> None:
    assert NodeAffinity().prepare(PodInfo.from_pod(pod("p"))) is None


# --- NodePorts ------------------------------------------------------------------------------------

CONFLICT = ("node(s) didn't have free ports for the requested pod ports",)


@pytest.mark.parametrize(
    ("used", "wanted", "conflict"),
    [
        ((80, "TCP", ""), (80, "TCP", ""), True),
        ((80, "TCP", ""), (81, "TCP", ""), False),
        ((80, "TCP", ""), (80, "UDP", ""), False),
        ((80, "TCP", "10.0.0.1"), (80, "TCP", "10.0.0.2"), False),
        ((80, "TCP", "10.0.0.1"), (80, "TCP", "10.0.0.1"), True),
        ((80, "TCP", "10.0.0.1"), (80, "TCP", ""), True),  # 0.0.0.0 clashes with any address
        ((80, "TCP", ""), (80, "TCP", "10.0.0.1"), True),
        ((80, "TCP", "0.0.0.0"), (80, "TCP", "10.0.0.1"), True),
        ((53, "UDP", ""), (53, "UDP", ""), True),
        ((53, "SCTP", ""), (53, "UDP", ""), False),
    ],
)
def test_host_port_conflicts(
    used: tuple[int, str, str], wanted: tuple[int, str, str], conflict: bool
) -> None:
    other = bound(pod("other", host_ports=[used]), "n")
    got = reasons(NodePorts(), pod("p", host_ports=[wanted]), node("n"), other)
    assert got == (CONFLICT if conflict else ())


def test_ports_free_again_after_pod_removed() -> None:
    other = pod("other", host_ports=[8080])
    info = node_info(node("n"), other)
    p = PodInfo.from_pod(pod("p", host_ports=[8080]))
    assert check_node(NodePorts(), p, info) == CONFLICT
    info.remove_pod(PodInfo.from_pod(other).key)
    assert check_node(NodePorts(), p, info) == ()
    assert info.ports == {}


def test_pod_without_host_ports_skips() -> None:
    no_host = pod("p")
    no_host["spec"]["containers"][0]["ports"] = [{"containerPort": 80}]
    assert NodePorts().prepare(PodInfo.from_pod(no_host)) is None


# --- NodeResourcesFit -----------------------------------------------------------------------------


def test_fits_exactly_and_one_milli_over_fails() -> None:
    n = node("n", cpu="1", memory="1Gi")
    assert reasons(NodeResourcesFit(), pod("p", cpu="1", memory="1Gi"), n) == ()
    assert reasons(NodeResourcesFit(), pod("p", cpu="1001m", memory="1Gi"), n) == (
        "Insufficient cpu",
    )
    assert reasons(NodeResourcesFit(), pod("p", cpu="1", memory="1025Mi"), n) == (
        "Insufficient memory",
    )
    assert reasons(NodeResourcesFit(), pod("p", cpu="2", memory="2Gi"), n) == (
        "Insufficient cpu",
        "Insufficient memory",
    )


def test_fit_counts_pods_already_on_the_node() -> None:
    n = node("n", cpu="1", memory="1Gi")
    on = [pod("a", cpu="600m", memory="100Mi")]
    assert reasons(NodeResourcesFit(), pod("p", cpu="400m", memory="1Mi"), n, *on) == ()
    assert reasons(NodeResourcesFit(), pod("p", cpu="401m", memory="1Mi"), n, *on) == (
        "Insufficient cpu",
    )


def test_too_many_pods() -> None:
    n = node("n", pods="2")
    on = [pod("a"), pod("b")]
    assert reasons(NodeResourcesFit(), pod("p"), n, on[0]) == ()
    assert reasons(NodeResourcesFit(), pod("p", cpu="1m", memory="1"), n, *on) == ("Too many pods",)
    assert reasons(NodeResourcesFit(), pod("p", cpu="5", memory="1"), n, *on) == (
        "Too many pods",
        "Insufficient cpu",
    )
    assert reasons(NodeResourcesFit(), pod("p"), node("n", pods=None)) == ("Too many pods",)


def test_zero_request_fits_even_an_overcommitted_node() -> None:
    n = node("n", cpu="1", memory="1Gi")
    hog = pod("hog", cpu="2", memory="2Gi")
    assert reasons(NodeResourcesFit(), pod("p"), n, hog) == ()
    assert reasons(NodeResourcesFit(), pod("p", memory="1Mi"), n, hog) == ("Insufficient memory",)


def test_ephemeral_and_extended_resources() -> None:
    n = node("n", extra={"ephemeral-storage": "10Gi", "example.com/gpu": "2"})
    ok = pod("p", requests={"ephemeral-storage": "10Gi", "example.com/gpu": "2"})
    assert reasons(NodeResourcesFit(), ok, n) == ()
    big = pod("p", requests={"ephemeral-storage": "11Gi", "example.com/gpu": "3"})
    assert reasons(NodeResourcesFit(), big, n) == (
        "Insufficient ephemeral-storage",
        "Insufficient example.com/gpu",
    )
    assert reasons(NodeResourcesFit(), pod("p", requests={"example.com/fpga": "1"}), n) == (
        "Insufficient example.com/fpga",
    )
    on = [pod("a", requests={"example.com/gpu": "1"})]
    assert reasons(NodeResourcesFit(), pod("p", requests={"example.com/gpu": "2"}), n, *on) == (
        "Insufficient example.com/gpu",
    )


def test_node_allocatable_falls_back_to_capacity_and_tolerates_garbage() -> None:
    n = node("n")
    n["status"] = {"capacity": {"cpu": "2", "memory": "1Gi", "pods": "10"}}
    assert reasons(NodeResourcesFit(), pod("p", cpu="2", memory="1Gi"), n) == ()
    n["status"] = {"allocatable": {"cpu": "lots", "memory": "1Gi", "pods": "10"}}
    assert reasons(NodeResourcesFit(), pod("p", cpu="1m"), n) == ("Insufficient cpu",)


# --- PodInfo: effective requests ----------------------------------------------------------------


def requests_of(spec: Obj) -> tuple[int, int, int, int]:
    info = PodInfo.from_pod({"metadata": {"name": "p"}, "spec": spec})
    return info.cpu, info.memory, info.nonzero_cpu, info.nonzero_memory


def c(cpu: str | None = None, memory: str | None = None, **extra: Any) -> Obj:
    reqs = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    return {"name": "x", "resources": {"requests": reqs}, **extra}


MI = 2**20
DEFAULT_MEM = 200 * MI


def test_containers_are_summed() -> None:
    assert requests_of({"containers": [c("100m", "1Mi"), c("200m", "2Mi")]}) == (
        300, 3 * MI, 300, 3 * MI,
    )  # fmt: skip


def test_missing_requests_count_as_defaults_for_scoring_only() -> None:
    assert requests_of({"containers": [c(), c("200m")]}) == (
        200, 0, 300, 2 * DEFAULT_MEM,
    )  # fmt: skip
    assert requests_of({"containers": [c("0", "0")]}) == (0, 0, 0, 0)


def test_limits_stand_in_for_missing_requests() -> None:
    container = {"name": "x", "resources": {"limits": {"cpu": "1", "memory": "1Gi"},
                                            "requests": {"cpu": "500m"}}}  # fmt: skip
    assert requests_of({"containers": [container]}) == (500, 2**30, 500, 2**30)


def test_init_containers_take_the_maximum() -> None:
    spec = {"containers": [c("100m", "1Mi")], "initContainers": [c("1", "1Mi"), c("50m", "8Mi")]}
    assert requests_of(spec)[:2] == (1000, 8 * MI)


def test_sidecars_add_up_and_run_alongside_later_init_containers() -> None:
    spec = {
        "containers": [c("100m", "1Mi")],
        "initContainers": [c("200m", "2Mi", restartPolicy="Always"), c("1", "1Mi")],
    }
    # Steady state: 100m + 200m; during the second init container: 200m + 1000m.
    assert requests_of(spec)[:2] == (1200, 3 * MI)


def test_overhead_is_added() -> None:
    spec = {"containers": [c("100m", "1Mi")], "overhead": {"cpu": "50m", "memory": "1Mi"}}
    assert requests_of(spec) == (150, 2 * MI, 150, 2 * MI)


def test_invalid_quantity_names_the_field() -> None:
    bad = pod("p")
    bad["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "lots"}}
    with pytest.raises(ValueError, match=r"default/p: spec.containers\[0\].resources.requests.cpu"):
        PodInfo.from_pod(bad)
    assert PodInfo.from_pod(bad, strict=False).cpu == 0
    negative = pod("p", cpu="-1")
    with pytest.raises(ValueError, match="negative"):
        PodInfo.from_pod(negative)


def test_pod_facts() -> None:
    p = pod("p", namespace="ns", owner="web", priority=7, host_ports=[80], uid="u1")
    info = PodInfo.from_pod(p)
    assert (info.key, info.namespace, info.name, info.owner, info.priority) == (
        "u1", "ns", "p", "rs-web", 7,
    )  # fmt: skip
    assert info.host_ports == (("0.0.0.0", "TCP", 80),)
    assert info.best_effort
    no_uid = pod("q", namespace="ns")
    del no_uid["metadata"]["uid"]
    assert PodInfo.from_pod(no_uid).key == "ns/q"
