"""`controllers.slicecore`: the pure EndpointSlice plan. Unit cases (conditions, hostnames,
named ports, placeholder, mirroring) and Hypothesis properties over random pods and random
starting slices: after applying a plan, the slices hold exactly the wanted endpoints, each once,
at most `MAX_PER_SLICE` per slice, one port set per slice, and planning again writes nothing;
endpoints that did not change never move."""

from __future__ import annotations

import copy
import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.controllers.slicecore import (
    CONTROLLER_NAME,
    MIRROR_NAME,
    Plan,
    desired_slices,
    endpoints_groups,
    mirrored_slices,
    plan,
    pod_groups,
    slice_port_key,
)
from orchestrator.kube.schema.discovery_v1 import (
    LABEL_MANAGED_BY,
    LABEL_SERVICE_NAME,
    default_endpoint_slice,
    validate_endpoint_slice,
)

Obj = dict[str, Any]
NS = "shop"


def pod(
    name: str,
    ip: str | None,
    ready: bool = True,
    *,
    labels: Obj | None = None,
    port: int = 8080,
    **extra: Any,
) -> Obj:
    status: Obj = {
        "phase": extra.pop("phase", "Running"),
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    if ip:
        status["podIP"] = ip
    meta: Obj = {
        "name": name,
        "namespace": NS,
        "uid": f"u-{name}",
        "labels": labels if labels is not None else {"app": "web"},
    }
    if extra.pop("deleting", False):
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "c", "ports": [{"name": "http", "containerPort": port}]}],
            **extra,
        },
        "status": status,
    }


def service(**spec: Any) -> Obj:
    return {
        "metadata": {"name": "web", "namespace": NS, "uid": "svc-uid", "labels": {"tier": "f"}},
        "spec": {
            "selector": {"app": "web"},
            "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}],
            **spec,
        },
    }


_names = itertools.count()


def apply(existing: list[Obj], p: Plan) -> list[Obj]:
    """What the API server holds after the plan's writes (names for generateName)."""
    by_name = {s["metadata"]["name"]: s for s in existing}
    for s in p.delete:
        del by_name[s["metadata"]["name"]]
    for s in p.update:
        assert s["metadata"]["name"] in by_name
        by_name[s["metadata"]["name"]] = copy.deepcopy(s)
    for s in p.create:
        body = copy.deepcopy(s)
        body["metadata"]["name"] = body["metadata"].pop("generateName") + f"x{next(_names)}"
        default_endpoint_slice(body)
        assert validate_endpoint_slice(body, None) == []
        by_name[body["metadata"]["name"]] = body
    return list(by_name.values())


def test_conditions_hostname_and_owner() -> None:
    svc = service()
    pods = [
        pod("a", "10.42.0.2"),
        pod("b", "10.42.0.3", ready=False),
        pod("c", "10.42.0.4", deleting=True),
        pod("d", "10.42.0.5", hostname="d", subdomain="web"),
        pod("e", "10.42.0.6", hostname="e", subdomain="other"),
        pod("no-ip", None),
        pod("done", "10.42.0.7", phase="Succeeded"),
        pod("db", "10.42.0.8", labels={"app": "db"}),
        pod("v6", "fd00::1"),
    ]
    p = desired_slices(svc, pods, [])
    (body,) = p.create
    assert not p.update
    assert not p.delete
    assert body["metadata"]["generateName"] == "web-"
    assert body["metadata"]["labels"] == {
        "tier": "f",
        LABEL_SERVICE_NAME: "web",
        LABEL_MANAGED_BY: CONTROLLER_NAME,
    }
    assert body["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "name": "web",
            "uid": "svc-uid",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert body["addressType"] == "IPv4"
    assert body["ports"] == [{"name": "http", "port": 8080, "protocol": "TCP"}]
    eps = {e["targetRef"]["name"]: e for e in body["endpoints"]}
    assert sorted(eps) == ["a", "b", "c", "d", "e"]
    assert eps["a"] == {
        "addresses": ["10.42.0.2"],
        "conditions": {"ready": True, "serving": True, "terminating": False},
        "targetRef": {"kind": "Pod", "namespace": NS, "name": "a", "uid": "u-a"},
        "nodeName": "n1",
    }
    assert eps["b"]["conditions"] == {"ready": False, "serving": False, "terminating": False}
    assert eps["c"]["conditions"] == {"ready": False, "serving": True, "terminating": True}
    assert eps["d"]["hostname"] == "d"
    assert "hostname" not in eps["e"]
    # publishNotReadyAddresses: every endpoint is ready (terminating ones too, as upstream)
    (body,) = desired_slices(service(publishNotReadyAddresses=True), pods, []).create
    assert all(e["conditions"]["ready"] for e in body["endpoints"])


def test_ipv6_service_takes_ipv6_addresses() -> None:
    svc = service(ipFamilies=["IPv6"])
    (body,) = desired_slices(svc, [pod("a", "10.42.0.2"), pod("b", "fd00::2")], []).create
    assert body["addressType"] == "IPv6"
    assert [e["addresses"] for e in body["endpoints"]] == [["fd00::2"]]


def test_one_slice_per_port_set_and_unresolved_ports() -> None:
    svc = service(
        ports=[
            {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"},
            {"name": "m", "port": 9, "targetPort": 9090, "protocol": "TCP", "appProtocol": "h2c"},
        ]
    )
    bare = pod("bare", "10.42.0.9")
    bare["spec"]["containers"][0]["ports"] = []
    pods = [pod("a", "10.42.0.2"), pod("b", "10.42.0.3", port=8081), bare]
    p = desired_slices(svc, pods, [])
    got = sorted(
        ([(q["name"], q["port"]) for q in s["ports"]], [e["addresses"][0] for e in s["endpoints"]])
        for s in p.create
    )
    assert got == [
        ([("http", 8080), ("m", 9090)], ["10.42.0.2"]),
        ([("http", 8081), ("m", 9090)], ["10.42.0.3"]),
        ([("m", 9090)], ["10.42.0.9"]),
    ]
    m_port = next(q for q in p.create[0]["ports"] if q["name"] == "m")
    assert m_port["appProtocol"] == "h2c"


def test_placeholder_when_no_endpoints_and_unchanged_writes_nothing() -> None:
    svc = service()
    p = desired_slices(svc, [], [])
    (body,) = p.create
    assert body["endpoints"] == []
    assert body["ports"] == []
    slices = apply([], p)
    assert desired_slices(svc, [], slices).empty
    # endpoints appear: the placeholder is deleted (a new port set) and a real slice created
    slices = apply(slices, desired_slices(svc, [pod("a", "10.42.0.2")], slices))
    assert [len(s["endpoints"]) for s in slices] == [1]
    assert desired_slices(svc, [pod("a", "10.42.0.2")], slices).empty
    # and go again: back to one placeholder
    slices = apply(slices, desired_slices(svc, [], slices))
    assert [(s["endpoints"], s["ports"]) for s in slices] == [([], [])]


def test_foreign_slices_are_never_touched() -> None:
    svc = service()
    foreign = {
        "metadata": {
            "name": "web-hand",
            "namespace": NS,
            "labels": {LABEL_SERVICE_NAME: "web", LABEL_MANAGED_BY: "someone"},
        },
        "addressType": "IPv4",
        "endpoints": [],
        "ports": [],
    }
    p = desired_slices(svc, [pod("a", "10.42.0.2")], [foreign])
    assert foreign not in p.delete
    assert foreign not in p.update
    assert len(p.create) == 1


def test_labels_and_owner_are_repaired() -> None:
    svc = service()
    slices = apply([], desired_slices(svc, [pod("a", "10.42.0.2")], []))
    slices[0]["metadata"]["labels"]["extra"] = "x"
    (fixed,) = desired_slices(svc, [pod("a", "10.42.0.2")], slices).update
    assert "extra" not in fixed["metadata"]["labels"]
    headless = service(clusterIP="None")
    (fixed,) = desired_slices(headless, [pod("a", "10.42.0.2")], slices).update
    assert fixed["metadata"]["labels"]["service.kubernetes.io/headless"] == ""


def test_mirroring_endpoints() -> None:
    svc = {"metadata": {"name": "kubernetes", "namespace": "default", "uid": "k"}, "spec": {}}
    ep = {
        "metadata": {"name": "kubernetes", "namespace": "default"},
        "subsets": [
            {
                "addresses": [{"ip": "192.0.2.1"}, {"ip": "192.0.2.2", "nodeName": "s2"}],
                "notReadyAddresses": [{"ip": "192.0.2.3"}, {"ip": "fd00::1"}],
                "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}],
            }
        ],
    }
    p = mirrored_slices(svc, ep, [])
    (body,) = p.create
    assert body["metadata"]["labels"][LABEL_MANAGED_BY] == MIRROR_NAME
    assert body["ports"] == [{"name": "https", "port": 6443, "protocol": "TCP"}]
    assert [(e["addresses"][0], e["conditions"]["ready"]) for e in body["endpoints"]] == [
        ("192.0.2.1", True),
        ("192.0.2.2", True),
        ("192.0.2.3", False),
    ]
    slices = apply([], p)
    assert mirrored_slices(svc, ep, slices).empty
    # no endpoints left: mirrored slices go, no placeholder
    assert mirrored_slices(svc, {"subsets": []}, slices).delete == slices
    assert endpoints_groups({"subsets": [{"addresses": [{"ip": "junk"}]}]}, "IPv4") == {}


def test_a_full_slice_spills_into_new_ones() -> None:
    svc = service()
    pods = [pod(f"p{i}", f"10.42.{i // 200}.{i % 200 + 1}") for i in range(250)]
    slices = apply([], desired_slices(svc, pods, []))
    assert sorted(len(s["endpoints"]) for s in slices) == [50, 100, 100]
    assert desired_slices(svc, pods, slices).empty
    # one pod turns unready: exactly one slice is rewritten
    pods[7] = pod("p7", pods[7]["status"]["podIP"], ready=False)
    p = desired_slices(svc, pods, slices)
    assert len(p.update) == 1
    assert not p.create
    assert not p.delete


# ------------------------------------------------------------------------------ properties
pod_st = st.builds(
    lambda i, ready, deleting, port, labelled: pod(
        f"p{i}",
        f"10.42.0.{i + 1}",
        ready=ready,
        deleting=deleting,
        port=port,
        labels={"app": "web" if labelled else "db"},
    ),
    st.integers(0, 250),
    st.booleans(),
    st.booleans(),
    st.sampled_from([8080, 8081]),
    st.booleans(),
)
pods_st = st.lists(pod_st, max_size=40).map(
    lambda ps: list({p["metadata"]["name"]: p for p in ps}.values())
)


def check(svc: Obj, pods: list[Obj], slices: list[Obj], max_per: int) -> None:
    wanted = {(k, e["addresses"][0]): e for k, eps in pod_groups(svc, pods).items() for e in eps}
    seen: dict[Any, Obj] = {}
    for s in slices:
        assert len(s["endpoints"]) <= max_per
        key = slice_port_key(s)
        for e in s["endpoints"]:
            ident = (key, e["addresses"][0])
            assert ident not in seen, "an endpoint in two slices"
            seen[ident] = e
    assert seen == wanted
    if not wanted:
        assert len(slices) == 1
        assert slices[0]["endpoints"] == []


@settings(max_examples=60, deadline=None)
@given(st.lists(pods_st, min_size=1, max_size=5), st.sampled_from([1, 3, 100]))
def test_plans_converge_in_one_step_and_are_stable(rounds: list[list[Obj]], max_per: int) -> None:
    svc = service()
    slices: list[Obj] = []
    for pods in rounds:
        before = {
            (slice_port_key(s), e["addresses"][0]): (s["metadata"]["name"], e)
            for s in slices
            for e in s["endpoints"]
        }
        p = plan(svc, pod_groups(svc, pods), slices, CONTROLLER_NAME, "IPv4", max_per_slice=max_per)
        slices = apply(slices, p)
        check(svc, pods, slices, max_per)
        again = plan(
            svc, pod_groups(svc, pods), slices, CONTROLLER_NAME, "IPv4", max_per_slice=max_per
        )
        assert again.empty, "an unchanged result must write nothing"
        # an endpoint that did not change stays in its slice
        for s in slices:
            for e in s["endpoints"]:
                old = before.get((slice_port_key(s), e["addresses"][0]))
                if (
                    old is not None
                    and old[1] == e
                    and old[0] in {x["metadata"]["name"] for x in slices}
                ):
                    assert old[0] == s["metadata"]["name"]


@settings(max_examples=60, deadline=None)
@given(pods_st, st.lists(st.sampled_from([1, 2, 3]), max_size=6))
def test_any_starting_slices_are_repaired(pods: list[Obj], junk_sizes: list[int]) -> None:
    """Slices in a bad state (duplicates, too full, stale port sets) end right in one plan."""
    svc = service()
    slices: list[Obj] = []
    all_eps = [e for eps in pod_groups(svc, pods).values() for e in eps]
    for i, n in enumerate(junk_sizes):
        slices.append(
            {
                "metadata": {
                    "name": f"web-junk{i}",
                    "namespace": NS,
                    "labels": {LABEL_SERVICE_NAME: "web", LABEL_MANAGED_BY: CONTROLLER_NAME},
                },
                "addressType": "IPv4",
                "endpoints": all_eps[: n * 2],
                "ports": [{"name": "http", "port": 8080 + i % 3, "protocol": "TCP"}],
            }
        )
    p = plan(svc, pod_groups(svc, pods), slices, CONTROLLER_NAME, "IPv4", max_per_slice=3)
    slices = apply(slices, p)
    check(svc, pods, slices, 3)
    assert plan(svc, pod_groups(svc, pods), slices, CONTROLLER_NAME, "IPv4", max_per_slice=3).empty
