"""`apiserver.servicefields` (pure): what an update of a Service keeps, drops and assigns."""

from __future__ import annotations

import random
from typing import Any

import pytest

from orchestrator.apiserver.allockeys import ip_key, port_key
from orchestrator.apiserver.servicefields import Assigner, carry_over
from orchestrator.kube.errors import ApiError
from orchestrator.kube.jsonvalue import copy_json
from orchestrator.network.settings import NetworkSettings

Obj = dict[str, Any]


def svc(**spec: Any) -> Obj:
    spec.setdefault("ports", [{"name": "http", "port": 80, "protocol": "TCP"}])
    return {"metadata": {"name": "s", "namespace": "default", "uid": "u"}, "spec": spec}


STORED = svc(
    type="NodePort",
    clusterIP="10.43.5.5",
    clusterIPs=["10.43.5.5"],
    ipFamilies=["IPv4"],
    ipFamilyPolicy="SingleStack",
    ports=[{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080}],
)


def test_carry_over_keeps_what_the_body_left_out_and_never_modifies_its_inputs() -> None:
    body = svc(type="NodePort", ports=[{"name": "http", "port": 8080, "protocol": "TCP"}])
    before_body, before_stored = copy_json(body), copy_json(STORED)
    out = carry_over(body, STORED)
    assert out["spec"]["clusterIP"] == "10.43.5.5"
    assert out["spec"]["ipFamilyPolicy"] == "SingleStack"
    assert out["spec"]["ports"][0]["nodePort"] == 30080  # matched by name, port changed
    assert (body, STORED) == (before_body, before_stored)
    same = copy_json(STORED)
    assert carry_over(same, STORED) is same  # nothing to carry: the same object


def test_carry_over_drops_type_dependent_fields() -> None:
    out = carry_over(svc(type="ClusterIP", ports=STORED["spec"]["ports"]), STORED)
    assert "nodePort" not in out["spec"]["ports"][0]
    out = carry_over(svc(type="ExternalName", externalName="a.b", clusterIP="10.43.5.5"), STORED)
    assert "clusterIP" not in out["spec"]
    assert "ipFamilies" not in out["spec"]
    # a node port the body chose anew for a ClusterIP type is left for validation to refuse
    ports = [{"name": "http", "port": 80, "nodePort": 31000}]
    assert carry_over(svc(type="ClusterIP", ports=ports), STORED)["spec"]["ports"] == ports


def assigner(seed: int = 0) -> Assigner:
    return Assigner(NetworkSettings.create(), random.Random(seed))


def test_assign_fills_and_reports_its_own_picks() -> None:
    a = assigner()
    out, picked = a.assign(svc(type="LoadBalancer"), None)
    spec = out["spec"]
    assert picked == {ip_key(spec["clusterIP"]), port_key(spec["ports"][0]["nodePort"])}
    # what the old object holds is kept and not picked again
    again, picked2 = a.assign(out, out)
    assert again == out
    assert picked2 == frozenset()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"clusterIPs": ["10.43.0.7", "fd00::7"]}, "single-stack"),
        ({"ipFamilyPolicy": "RequireDualStack"}, "not configured for dual-stack"),
        ({"ipFamilies": ["IPv6"]}, "IPv4 only"),
        ({"clusterIP": "10.43.0.7", "clusterIPs": ["10.43.0.8"]}, "must match"),
        ({"clusterIP": "fd00::1"}, "not in the valid range"),
        ({"type": "ExternalName", "clusterIP": "10.43.0.7"}, "may not be set for ExternalName"),
        (
            {
                "type": "NodePort",
                "ports": [{"port": 1, "nodePort": 30001}, {"port": 2, "nodePort": 30001}],
            },
            "Duplicate value",
        ),
    ],
)
def test_assign_refusals(spec: Obj, message: str) -> None:
    with pytest.raises(ApiError) as err:
        assigner().assign(svc(**spec), None)
    assert err.value.code == 422
    assert message in err.value.message


def test_prefer_dual_stack_on_a_single_stack_cluster() -> None:
    out, _ = assigner().assign(
        svc(ipFamilyPolicy="PreferDualStack", ipFamilies=["IPv4", "IPv6"]), None
    )
    assert out["spec"]["ipFamilies"] == ["IPv4"]
    assert out["spec"]["ipFamilyPolicy"] == "PreferDualStack"


def test_full_ranges_mark_the_view_stale() -> None:
    settings = NetworkSettings.create(service_cidr="10.43.0.0/29", cluster_dns="10.43.0.6")
    a = Assigner(settings, random.Random(0))
    for _ in range(4):  # .2 .3 .4 .5 (.1 and .6 reserved)
        a.assign(svc(), None)
    with pytest.raises(ApiError, match="range is full"):
        a.assign(svc(), None)
    assert a.stale
