"""The network lab itself (`orchestrator.testing.netlab`), against the product as it is: two
devices with their own containerd and agent join the server in its namespace; pods run on both
devices and get distinct IPs from their device's bridge; nothing in the lab routes anywhere
(no default route in any namespace); the stub upstream DNS answers its one name; a lab that
fails to start tears itself down.

Marked slow (real processes, ~20 s for the shared lab); skipped with the reason when the lab
cannot run here, failed instead under ORCH_REQUIRE_CONTAINERD=1.
"""

from __future__ import annotations

import ipaddress
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from netlabfix import fetch, open_lab, pod, require_lab, wait_running, web_command

from orchestrator.testing.netlab import (
    EXTERNAL_ADDRESS,
    EXTERNAL_NAME,
    UPSTREAM_DNS_ADDRESS,
    LabError,
    NetLab,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetLab]:
    with open_lab(tmp_path_factory.mktemp("lab"), 2) as lab:
        yield lab


def test_devices_join_as_nodes_with_their_lan_addresses(lab: NetLab) -> None:
    nodes = lab.nodes_ready()
    assert nodes is not None
    for d in lab.devices:
        addresses = nodes[d.node_name]["status"]["addresses"]
        assert {"type": "InternalIP", "address": d.address} in addresses


def test_pods_run_on_both_devices_with_distinct_ips(lab: NetLab) -> None:
    lab.apply(
        *(
            pod(f"h{d.index}", d.node_name, labels={"app": "harness"}, command=web_command())
            for d in lab.devices
        )
    )
    pods = wait_running(lab, "default", "app=harness", len(lab.devices))
    ips = {name: p["status"]["podIP"] for name, p in pods.items()}
    assert len(set(ips.values())) == len(ips), ips
    for d in lab.devices:
        name = f"h{d.index}"
        assert pods[name]["spec"]["nodeName"] == d.node_name
        # The pod answers from inside itself and from its own device (over the pod bridge).
        assert fetch(lab, name, "http://127.0.0.1:8080/") == (0, name)
        r = lab.exec(d, ["timeout", "5", "busybox", "wget", "-qO-", f"http://{ips[name]}:8080/"])
        assert (r.returncode, r.stdout.strip()) == (0, name), r


def test_no_namespace_routes_out_of_the_lab(lab: NetLab) -> None:
    for ns in lab.namespaces:
        routes = lab.netns_exec(ns, ["ip", "-4", "route", "show", "default"], check=True)
        assert routes.stdout.strip() == "", f"{ns} has a default route: {routes.stdout}"
    # An address outside the LAN is unreachable from a device: it fails closed.
    r = lab.exec(1, ["timeout", "5", "busybox", "wget", "-qO-", "http://198.51.100.1/"])
    assert r.returncode != 0


def test_stub_upstream_dns_answers_its_name_only(lab: NetLab) -> None:
    r = lab.exec(1, ["timeout", "5", "busybox", "nslookup", EXTERNAL_NAME, UPSTREAM_DNS_ADDRESS])
    assert r.returncode == 0, r
    assert EXTERNAL_ADDRESS in r.stdout
    r = lab.exec(
        1, ["timeout", "5", "busybox", "nslookup", "nope.example.org", UPSTREAM_DNS_ADDRESS]
    )
    assert r.returncode != 0
    assert EXTERNAL_ADDRESS not in r.stdout


def test_a_lab_that_fails_to_start_leaves_nothing(tmp_path: Path) -> None:
    require_lab()
    lab = NetLab(tmp_path / "bad", 1, server_args=["--no-such-flag"])
    with pytest.raises(LabError, match="server exited"):
        lab.start()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert lab.id not in listed
    assert lab.devices[0].containerd is None  # the server failed before any device started
    assert ipaddress.IPv4Address(lab.devices[0].address) in ipaddress.IPv4Network("192.0.2.0/24")
