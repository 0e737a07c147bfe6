"""Service allocation through the real API against a model (Hypothesis state machine): random
creates (every type, headless, user-chosen addresses and node ports from a small pool so they
collide), type changes and deletes. After every step: no address or node port is held twice,
user choices are honoured or refused with Kubernetes' message exactly when the model says they
are taken, and the store's allocation keys are exactly those the Services hold (releases
included)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from apiharness import Live, live_server
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from orchestrator.apiserver.allockeys import IP_PREFIX, PORT_PREFIX, held_keys

NS = "alloc-model"
SVC = f"/api/v1/namespaces/{NS}/services"
NAMES = [f"s{i}" for i in range(5)]
TYPES = ["ClusterIP", "NodePort", "LoadBalancer", "ExternalName", "Headless"]
IPS = [None, "10.43.0.20", "10.43.0.21"]
NODE_PORTS = [None, 30000, 30001]
STRATEGIC = {"Content-Type": "application/strategic-merge-patch+json"}

_live: Live | None = None


@pytest.fixture(scope="module", autouse=True)
def live() -> Iterator[Live]:
    global _live
    with live_server() as server:
        r = server.http.post("/api/v1/namespaces", json={"metadata": {"name": NS}})
        assert r.status_code == 201, r.text
        _live = server
        yield server
        _live = None


def body(name: str, kind: str, ip: str | None, node_port: int | None) -> dict[str, Any]:
    port: dict[str, Any] = {"port": 80}
    spec: dict[str, Any] = {"type": kind, "ports": [port]}
    if kind == "Headless":
        spec["type"] = "ClusterIP"
        spec["clusterIP"] = "None"
    elif kind == "ExternalName":
        spec["externalName"] = "example.org"
    elif ip:
        spec["clusterIP"] = ip
    if node_port and kind in ("NodePort", "LoadBalancer"):
        port["nodePort"] = node_port
    return {"metadata": {"name": name}, "spec": spec}


class ServiceAllocation(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        assert _live is not None
        self.live = _live
        self.http = _live.http
        self.model: dict[str, dict[str, Any]] = {}  # name -> the Service as the API returned it

    def _ips(self) -> set[str]:
        return {
            s["spec"]["clusterIP"]
            for s in self.model.values()
            if s["spec"].get("clusterIP") not in (None, "None")
        }

    def _ports(self) -> set[int]:
        return {
            p["nodePort"]
            for s in self.model.values()
            for p in s["spec"]["ports"]
            if "nodePort" in p
        }

    @rule(
        name=st.sampled_from(NAMES),
        kind=st.sampled_from(TYPES),
        ip=st.sampled_from(IPS),
        node_port=st.sampled_from(NODE_PORTS),
    )
    def create(self, name: str, kind: str, ip: str | None, node_port: int | None) -> None:
        r = self.http.post(SVC, json=body(name, kind, ip, node_port))
        if name in self.model:
            assert r.status_code == 409, r.text
            return
        wants_ip = ip is not None and kind in ("ClusterIP", "NodePort", "LoadBalancer")
        wants_port = node_port is not None and kind in ("NodePort", "LoadBalancer")
        if wants_ip and ip in self._ips():
            assert r.status_code == 422, r.text
            assert "provided IP is already allocated" in r.text
            return
        if wants_port and node_port in self._ports():
            assert r.status_code == 422, r.text
            assert "provided port is already allocated" in r.text
            return
        assert r.status_code == 201, r.text
        svc = r.json()
        spec = svc["spec"]
        if wants_ip:
            assert spec["clusterIP"] == ip
        if wants_port:
            assert spec["ports"][0]["nodePort"] == node_port
        self.model[name] = svc

    @rule(name=st.sampled_from(NAMES), kind=st.sampled_from(["ClusterIP", "NodePort"]))
    def change_type(self, name: str, kind: str) -> None:
        if name not in self.model:
            return
        old = self.model[name]["spec"]
        if old.get("clusterIP") == "None" and kind == "NodePort":
            return  # headless cannot be a NodePort (tested elsewhere)
        patch: dict[str, Any] = {"spec": {"type": kind}}
        if old["type"] == "ExternalName":
            patch["spec"]["externalName"] = None
        r = self.http.patch(f"{SVC}/{name}", json=patch, headers=STRATEGIC)
        assert r.status_code == 200, r.text
        spec = r.json()["spec"]
        if old.get("clusterIP") not in (None, "None") and old["type"] != "ExternalName":
            assert spec["clusterIP"] == old["clusterIP"]  # immutable, kept
        assert ("nodePort" in spec["ports"][0]) == (kind == "NodePort")
        self.model[name] = r.json()

    @rule(name=st.sampled_from(NAMES))
    def delete(self, name: str) -> None:
        r = self.http.delete(f"{SVC}/{name}")
        assert r.status_code == (200 if name in self.model else 404), r.text
        self.model.pop(name, None)

    @invariant()
    def store_matches_the_services(self) -> None:
        items = self.http.get(SVC).json()["items"]
        assert {s["metadata"]["name"]: s["spec"] for s in items} == {
            n: s["spec"] for n, s in self.model.items()
        }
        ips = [
            s["spec"]["clusterIP"]
            for s in items
            if s["spec"].get("clusterIP") not in (None, "None")
        ]
        ports = [p["nodePort"] for s in items for p in s["spec"]["ports"] if "nodePort" in p]
        assert len(ips) == len(set(ips))
        assert len(ports) == len(set(ports))
        _, ip_keys = self.live.snapshot(IP_PREFIX)
        _, port_keys = self.live.snapshot(PORT_PREFIX)
        # the server's own default/kubernetes holds the service CIDR's first address
        r = self.http.get("/api/v1/namespaces/default/services/kubernetes")
        own = set(held_keys(r.json())) if r.status_code == 200 else set()
        assert set(ip_keys) | set(port_keys) == own | {k for s in items for k in held_keys(s)}

    def teardown(self) -> None:
        for name in list(self.model):
            self.http.delete(f"{SVC}/{name}")


TestServiceAllocation = ServiceAllocation.TestCase
TestServiceAllocation.settings = settings(
    max_examples=20,
    stateful_step_count=12,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
