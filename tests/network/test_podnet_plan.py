"""The pod network's pure parts: Node parsing, the route planner and its diff, the CNI
conflist and the masquerade rules."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.agent.net.cniconf import CONFLIST_NAME, conflist, render, write_conflist
from orchestrator.agent.net.masq import CHAIN, MasqueradeError, apply_masquerade, masquerade_rules
from orchestrator.agent.net.routeplan import (
    ANN_BACKEND_DATA,
    ANN_PUBLIC_IP,
    VXLAN_DEVICE,
    Fdb,
    Neighbour,
    NetState,
    NodeNet,
    NodeNetError,
    Route,
    backend_annotations,
    diff,
    node_net,
    plan,
    reusable_mac,
    vtep_mac,
)

CLUSTER = ipaddress.ip_network("10.42.0.0/16")


def node(name: str, cidr: str | None, ip: str | None, annotations: dict[str, str] | None = None):
    return {
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {"podCIDR": cidr} if cidr else {},
        "status": {"addresses": [{"type": "InternalIP", "address": ip}] if ip else []},
    }


def nn(i: int, mac: str = "") -> NodeNet:
    return NodeNet(f"n{i}", f"10.42.{i}.0/24", f"192.0.2.{10 + i}", f"192.0.2.{10 + i}", mac)


def test_node_net_reads_the_flannel_annotations() -> None:
    ann = backend_annotations("vxlan", "198.51.100.7", "AA:BB:CC:DD:EE:01")
    got = node_net(node("a", "10.42.3.0/24", "192.0.2.3", ann))
    assert got == NodeNet("a", "10.42.3.0/24", "192.0.2.3", "198.51.100.7", "aa:bb:cc:dd:ee:01")
    assert json.loads(ann[ANN_BACKEND_DATA]) == {"VNI": 1, "VtepMAC": "AA:BB:CC:DD:EE:01"}
    assert NodeNet.from_json(got.to_json()) == got


def test_node_net_waits_for_a_pod_cidr_and_an_address() -> None:
    assert node_net(node("a", None, "192.0.2.3")) is None
    assert node_net(node("a", "10.42.3.0/24", None)) is None


@pytest.mark.parametrize(
    ("cidr", "ip", "ann", "field"),
    [
        ("10.42.3.1/24", "192.0.2.3", {}, "podCIDR"),
        ("10.42.3.0/24", "nope", {}, "InternalIP"),
        ("10.42.3.0/24", "192.0.2.3", {ANN_PUBLIC_IP: "x"}, ANN_PUBLIC_IP),
        ("10.42.3.0/24", "192.0.2.3", {ANN_BACKEND_DATA: "{"}, ANN_BACKEND_DATA),
        ("10.42.3.0/24", "192.0.2.3", {ANN_BACKEND_DATA: '{"VtepMAC":"zz"}'}, "VtepMAC"),
    ],
)
def test_node_net_names_the_bad_field(cidr: str, ip: str, ann: dict[str, str], field: str) -> None:
    with pytest.raises(NodeNetError, match=field):
        node_net(node("a", cidr, ip, ann))


def test_a_published_vtep_mac_is_reused_only_when_the_kernel_takes_it() -> None:
    data = json.dumps({"VNI": 1, "VtepMAC": "0A:58:0A:2A:00:01"})
    assert vtep_mac({ANN_BACKEND_DATA: data}, "a") == "0a:58:0a:2a:00:01"
    assert vtep_mac({}, "a") == ""
    assert vtep_mac({ANN_BACKEND_DATA: json.dumps([1])}, "a") == ""
    with pytest.raises(NodeNetError, match=r"node a: .*not JSON"):
        vtep_mac({ANN_BACKEND_DATA: "{"}, "a")
    assert reusable_mac("0a:58:0a:2a:00:01")
    assert reusable_mac("02:AA:BB:CC:DD:EE")
    assert not reusable_mac("01:00:5e:00:00:01")  # multicast: the kernel refuses it
    assert not reusable_mac("ff:ff:ff:ff:ff:ff")
    assert not reusable_mac("00:00:00:00:00:00")
    assert not reusable_mac("0a:58")
    assert not reusable_mac("")


def test_host_gw_routes_via_the_other_nodes() -> None:
    p = plan("host-gw", "n0", [nn(0), nn(1), nn(2)], CLUSTER)
    assert p.state == NetState(
        frozenset({Route("10.42.1.0/24", "192.0.2.11"), Route("10.42.2.0/24", "192.0.2.12")})
    )


def test_vxlan_is_flannels_scheme() -> None:
    p = plan("vxlan", "n0", [nn(0, "02:00:00:00:00:00"), nn(1, "02:00:00:00:00:01")], CLUSTER)
    assert p.state.routes == {Route("10.42.1.0/24", "10.42.1.0", VXLAN_DEVICE)}
    assert p.state.neighbours == {Neighbour("10.42.1.0", "02:00:00:00:00:01")}
    assert p.state.fdb == {Fdb("02:00:00:00:00:01", "192.0.2.11")}


def test_vxlan_skips_a_node_without_a_mac_and_none_does_nothing() -> None:
    p = plan("vxlan", "n0", [nn(0, "02:00:00:00:00:00"), nn(1)], CLUSTER)
    assert p.state == NetState()
    assert "VtepMAC" in p.problems[0]
    assert plan("none", "n0", [nn(0), nn(1)], CLUSTER).state == NetState()
    with pytest.raises(ValueError, match="backend"):
        plan("flannel", "n0", [], CLUSTER)


def test_overlapping_or_foreign_pod_cidrs_are_skipped() -> None:
    clash = NodeNet("n9", "10.42.1.0/25", "192.0.2.99", "192.0.2.99")
    outside = NodeNet("n8", "10.99.0.0/24", "192.0.2.98", "192.0.2.98")
    mine = NodeNet("n7", "10.42.0.128/25", "192.0.2.97", "192.0.2.97")
    p = plan("host-gw", "n0", [nn(0), nn(1), clash, outside, mine], CLUSTER)
    assert p.state.routes == {Route("10.42.1.0/24", "192.0.2.11")}
    assert len(p.problems) == 3


@settings(max_examples=200, deadline=None)
@given(
    st.sets(st.integers(0, 20)),
    st.sets(st.integers(0, 20)),
    st.sampled_from(["host-gw", "vxlan"]),
)
def test_diff_turns_any_state_into_any_other(before: set[int], after: set[int], be: str) -> None:
    """Applying the diff to what is programmed gives exactly the plan, from any start."""

    def state(ids: set[int]) -> NetState:
        return plan(be, "self", [nn(i, f"02:00:00:00:00:{i:02x}") for i in ids], CLUSTER).state

    current, desired = state(before), state(after)
    ch = diff(desired, current)
    routes = (current.routes - set(ch.del_routes)) | set(ch.add_routes)
    neighbours = (current.neighbours - set(ch.del_neighbours)) | set(ch.add_neighbours)
    fdb = (current.fdb - set(ch.del_fdb)) | set(ch.add_fdb)
    assert NetState(frozenset(routes), frozenset(neighbours), frozenset(fdb)) == desired
    assert bool(ch) == (current != desired)
    assert not set(ch.add_routes) & current.routes


def test_conflist_is_bridge_host_local_and_portmap() -> None:
    conf = conflist("10.42.5.0/24", ipam_data_dir="/var/lib/agent/cni", mtu=1450)
    bridge, portmap = conf["plugins"]
    assert bridge["type"] == "bridge"
    assert bridge["bridge"] == "cni0"
    assert bridge["isGateway"]
    assert bridge["hairpinMode"]
    assert not bridge["ipMasq"]
    assert bridge["mtu"] == 1450
    assert bridge["ipam"] == {
        "type": "host-local",
        "ranges": [[{"subnet": "10.42.5.0/24", "gateway": "10.42.5.1"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "/var/lib/agent/cni",
    }
    assert portmap == {"type": "portmap", "capabilities": {"portMappings": True}}
    for bad in ("10.42.5.1/24", "10.42.5.0/31", "nope"):
        with pytest.raises(ValueError, match=r"10\.42|nope|network|small"):
            conflist(bad)


def test_write_conflist_is_atomic_and_only_on_change(tmp_path: Path) -> None:
    text = render(conflist("10.42.5.0/24"))
    assert write_conflist(tmp_path / "net.d", text)
    assert not write_conflist(tmp_path / "net.d", text)
    assert (tmp_path / "net.d" / CONFLIST_NAME).read_text() == text
    assert write_conflist(tmp_path / "net.d", render(conflist("10.42.6.0/24")))
    assert sorted(p.name for p in (tmp_path / "net.d").iterdir()) == [CONFLIST_NAME]


def test_masquerade_rules() -> None:
    rules = masquerade_rules(CLUSTER, add_jump=False)
    assert rules.splitlines()[:2] == ["*nat", f":{CHAIN} - [0:0]"]
    assert f"-A {CHAIN} -s 10.42.0.0/16 -d 10.42.0.0/16 " in rules
    assert "-j MASQUERADE" in rules
    assert "POSTROUTING 1" not in rules
    assert rules.endswith("COMMIT\n")
    assert "-I POSTROUTING 1 -m comment" in masquerade_rules(CLUSTER, add_jump=True)


async def test_a_missing_iptables_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """No iptables (or no `ip`): MasqueradeError, which PodNetwork logs and retries."""
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(MasqueradeError, match="cannot run"):
        await apply_masquerade(CLUSTER, netns="t19pn-never-made")
