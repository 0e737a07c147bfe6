"""Issue 19, the pod network across devices, with each flannel backend (`--flannel-backend
vxlan` and `host-gw`; one lab per backend, shared by the module's tests):

* every Node gets its own /24 `spec.podCIDR` from the cluster CIDR 10.42.0.0/16, and flannel's
  annotations (backend type, public IP = the device's address, VNI 1 and a VTEP MAC for vxlan);
* pods take their IPs from their node's podCIDR (the agent's conflist in `--cni-conf-dir`);
* a pod on device A reaches a pod on device B by IP, both ways, over the backend's routes
  (host-gw: via the other device's address; vxlan: through `flannel.1`);
* a deleted Node's route (and vxlan FDB and neighbour entries) disappear from the other device
  (last: it takes device 2 away for good).

Needs: N1 (podCIDRs), N3 (agent CNI conflist, routes, `--flannel-backend`). Marked slow;
skipped with the reason when the lab cannot run here, failed under ORCH_REQUIRE_CONTAINERD=1.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterator
from typing import Any

import pytest
from netlabfix import HTTP_PORT, fetch, open_lab, pod, wait_running, web_command

from orchestrator.testing.netlab import NetLab

pytestmark = pytest.mark.slow

CLUSTER_CIDR = ipaddress.IPv4Network("10.42.0.0/16")
ANNOTATION = "flannel.alpha.coreos.com/"


@pytest.fixture(scope="module", params=["vxlan", "host-gw"])
def lab(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NetLab]:
    backend = request.param
    with open_lab(tmp_path_factory.mktemp(f"lab-{backend}"), 2, flannel_backend=backend) as lab:
        yield lab


def pod_cidrs(lab: NetLab) -> dict[str, ipaddress.IPv4Network]:
    def all_assigned() -> dict[str, ipaddress.IPv4Network] | None:
        nodes = lab.kubectl_json("get", "nodes")["items"]
        cidrs = {n["metadata"]["name"]: (n.get("spec") or {}).get("podCIDR") for n in nodes}
        if len(cidrs) < len(lab.devices) or not all(cidrs.values()):
            return None
        return {name: ipaddress.IPv4Network(c) for name, c in cidrs.items()}

    return lab.wait_for(all_assigned, "a podCIDR on every Node", 30)


def test_nodes_get_disjoint_pod_cidrs_and_flannel_annotations(lab: NetLab) -> None:
    cidrs = pod_cidrs(lab)
    for cidr in cidrs.values():
        assert cidr.subnet_of(CLUSTER_CIDR), cidrs
        assert cidr.prefixlen == 24, cidrs
    nets = list(cidrs.values())
    assert not any(a.overlaps(b) for i, a in enumerate(nets) for b in nets[i + 1 :]), cidrs

    def annotated() -> dict[str, dict[str, str]] | None:
        nodes = lab.kubectl_json("get", "nodes")["items"]
        notes = {n["metadata"]["name"]: n["metadata"].get("annotations") or {} for n in nodes}
        ok = all(ANNOTATION + "backend-type" in notes.get(d.node_name, {}) for d in lab.devices)
        return notes if ok else None

    notes = lab.wait_for(annotated, "flannel annotations on every Node", 30)
    for d in lab.devices:
        mine = notes[d.node_name]
        assert mine[ANNOTATION + "backend-type"] == lab.flannel_backend
        assert mine[ANNOTATION + "public-ip"] == d.address
        if lab.flannel_backend == "vxlan":
            data = json.loads(mine[ANNOTATION + "backend-data"])
            assert data["VNI"] == 1
            assert len(data["VtepMAC"].split(":")) == 6


def start_pods(lab: NetLab) -> dict[str, dict[str, Any]]:
    lab.apply(
        *(
            pod(f"p{d.index}", d.node_name, labels={"app": "podnet"}, command=web_command())
            for d in lab.devices
        )
    )
    return wait_running(lab, "default", "app=podnet", len(lab.devices))


def test_pod_ips_come_from_their_nodes_pod_cidr(lab: NetLab) -> None:
    cidrs = pod_cidrs(lab)
    for name, p in start_pods(lab).items():
        ip = ipaddress.IPv4Address(p["status"]["podIP"])
        assert ip in cidrs[p["spec"]["nodeName"]], (name, ip, cidrs)


def test_pod_on_one_device_reaches_a_pod_on_the_other_by_ip(lab: NetLab) -> None:
    pods = start_pods(lab)
    ips = {name: p["status"]["podIP"] for name, p in pods.items()}
    for src in pods:
        for dst, ip in ips.items():
            if src == dst:
                continue
            url = f"http://{ip}:{HTTP_PORT}/"

            # The routes follow the Nodes within seconds; then every request gets through.
            def reached(src: str = src, url: str = url) -> bool:
                return fetch(lab, src, url)[0] == 0

            lab.wait_for(reached, f"{src} reaching {dst} at {ip}", 30)
            assert fetch(lab, src, url) == (0, dst)


def test_routes_to_the_other_devices_follow_the_backend(lab: NetLab) -> None:
    cidrs = pod_cidrs(lab)
    for d in lab.devices:
        routes = lab.exec(d, ["ip", "-4", "route", "show"], check=True).stdout
        for other in lab.devices:
            if other is d:
                continue
            [line] = [r for r in routes.splitlines() if r.startswith(str(cidrs[other.node_name]))]
            if lab.flannel_backend == "host-gw":
                assert f"via {other.address}" in line, routes
            else:
                assert "dev flannel.1" in line, routes


def vxlan_entries(lab: NetLab, device: int, mac: str) -> dict[str, list[str]]:
    """The lines of `bridge fdb` and `ip neigh` on the device's flannel.1 that name `mac`."""
    fdb = lab.exec(device, ["bridge", "fdb", "show", "dev", "flannel.1"]).stdout
    neigh = lab.exec(device, ["ip", "-4", "neigh", "show", "dev", "flannel.1"]).stdout
    return {
        "fdb": [line for line in fdb.splitlines() if mac.lower() in line.lower()],
        "neigh": [line for line in neigh.splitlines() if mac.lower() in line.lower()],
    }


def cidr_routes(lab: NetLab, device: int, cidr: ipaddress.IPv4Network) -> list[str]:
    routes = lab.exec(device, ["ip", "-4", "route", "show"], check=True).stdout
    return [r for r in routes.splitlines() if r.split()[:1] == [str(cidr)]]


def test_a_deleted_nodes_routes_disappear_from_the_other_devices(lab: NetLab) -> None:
    """Last in the module: device 2 goes away for good (its agent stopped, so it cannot register
    again) and its Node is deleted; device 1 drops the route to its podCIDR (and for vxlan the
    FDB and neighbour entries of its VTEP) within seconds."""
    cidr = pod_cidrs(lab)["edge-2"]
    mac = ""
    if lab.flannel_backend == "vxlan":
        notes = lab.kubectl_json("get", "node", "edge-2")["metadata"]["annotations"]
        mac = json.loads(notes[ANNOTATION + "backend-data"])["VtepMAC"]
    lab.wait_for(lambda: cidr_routes(lab, 1, cidr), f"edge-1's route to {cidr}", 30)
    if mac:
        entries = lab.wait_for(
            lambda: (e := vxlan_entries(lab, 1, mac))["fdb"] and e["neigh"] and e,
            f"edge-1's FDB and neighbour entries for edge-2's VTEP {mac}",
            30,
        )
        assert any(lab.devices[1].address in line for line in entries["fdb"]), entries
    lab.stop_agent(2)
    lab.kubectl("delete", "node", "edge-2", "--wait=false")

    def gone() -> bool:
        left = cidr_routes(lab, 1, cidr)
        if mac:
            e = vxlan_entries(lab, 1, mac)
            left += e["fdb"] + e["neigh"]
        return not left

    lab.wait_for(gone, f"edge-2's route{'/FDB/neighbour' if mac else ''} gone from edge-1", 30)
