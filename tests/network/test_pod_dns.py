"""Pods' resolv.conf (`agent.net.poddns`): every dnsPolicy, hostNetwork, dnsConfig merging and
the kubelet's limits; the node's resolv.conf parsed."""

from __future__ import annotations

import pytest

from orchestrator.agent.net.poddns import (
    MAX_SEARCH_CHARS,
    PodDNS,
    ResolvConf,
    parse_resolv_conf,
    pod_dns_config,
)
from orchestrator.cri.runtime import DNSConfig
from orchestrator.kube.objects import Obj

HOST = ResolvConf(("192.0.2.53", "192.0.2.54"), ("corp.example", "example"), ("edns0",))
NODE = PodDNS(("10.43.0.10",), "cluster.local", HOST)
CLUSTER_SEARCH = ("shop.svc.cluster.local", "svc.cluster.local", "cluster.local")


def pod(ns: str = "shop", **spec: object) -> Obj:
    return {"metadata": {"namespace": ns, "name": "p"}, "spec": spec}


def test_cluster_first_is_the_default() -> None:
    for p in (pod(), pod(dnsPolicy="ClusterFirst")):
        out = pod_dns_config(p, NODE)
        assert out.config == DNSConfig(
            ("10.43.0.10",), (*CLUSTER_SEARCH, "corp.example", "example"), ("ndots:5",)
        )
        assert out.warnings == ()


def test_cluster_first_with_host_network_falls_back_to_default() -> None:
    out = pod_dns_config(pod(hostNetwork=True), NODE)
    assert out.config == DNSConfig(HOST.nameservers, HOST.searches, HOST.options)


def test_cluster_first_with_host_net() -> None:
    for host_network in (True, False):
        p = pod(dnsPolicy="ClusterFirstWithHostNet", hostNetwork=host_network)
        assert pod_dns_config(p, NODE).config.servers == ("10.43.0.10",)


def test_default_is_the_nodes_resolv_conf() -> None:
    out = pod_dns_config(pod(dnsPolicy="Default"), NODE)
    assert out.config == DNSConfig(HOST.nameservers, HOST.searches, HOST.options)


def test_none_is_only_dns_config() -> None:
    p = pod(
        dnsPolicy="None",
        dnsConfig={
            "nameservers": ["1.1.1.1"],
            "searches": ["a.example."],
            "options": [{"name": "ndots", "value": "2"}, {"name": "edns0"}],
        },
    )
    out = pod_dns_config(p, NODE)
    assert out.config == DNSConfig(("1.1.1.1",), ("a.example",), ("ndots:2", "edns0"))
    assert pod_dns_config(pod(dnsPolicy="None"), NODE).config == DNSConfig()


def test_no_cluster_dns_falls_back_to_default_with_a_warning() -> None:
    out = pod_dns_config(pod(), PodDNS((), "cluster.local", HOST))
    assert out.config.servers == HOST.nameservers
    assert "no --cluster-dns" in out.warnings[0]


def test_dns_config_is_merged() -> None:
    p = pod(
        dnsConfig={
            "nameservers": ["10.43.0.10", "1.1.1.1"],  # a duplicate is dropped
            "searches": ["extra.example", "svc.cluster.local"],
            "options": [
                {"name": "ndots", "value": "1"},  # replaces ndots:5
                {"name": "single-request-reopen"},
                {"value": "ignored without a name"},
            ],
        }
    )
    out = pod_dns_config(p, NODE)
    assert out.config == DNSConfig(
        ("10.43.0.10", "1.1.1.1"),
        (*CLUSTER_SEARCH, "corp.example", "example", "extra.example"),
        ("ndots:1", "single-request-reopen"),
    )


def test_limits_on_nameservers() -> None:
    p = pod(dnsConfig={"nameservers": ["1.1.1.1", "8.8.8.8", "9.9.9.9"]})
    out = pod_dns_config(p, NODE)
    assert out.config.servers == ("10.43.0.10", "1.1.1.1", "8.8.8.8")
    assert "nameserver limits" in out.warnings[0]


def test_limits_on_search_domains() -> None:
    many = [f"d{i}.example" for i in range(40)]
    out = pod_dns_config(pod(dnsPolicy="None", dnsConfig={"searches": many}), NODE)
    assert out.config.searches == tuple(many[:32])
    assert "search line limits" in out.warnings[0]
    long = [("x" * 63 + f".d{i}.example") for i in range(32)]
    out = pod_dns_config(pod(dnsPolicy="None", dnsConfig={"searches": long}), NODE)
    assert len(" ".join(out.config.searches)) <= MAX_SEARCH_CHARS
    assert out.config.searches == tuple(long[: len(out.config.searches)])
    assert len(out.config.searches) < 32


def test_other_domain_and_namespace() -> None:
    node = PodDNS(("10.96.0.10",), "edge.internal.", ResolvConf())
    out = pod_dns_config(pod("kube-system"), node)
    assert out.config.searches == (
        "kube-system.svc.edge.internal",
        "svc.edge.internal",
        "edge.internal",
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "# generated\nnameserver 192.0.2.1\nnameserver 192.0.2.2 ; x\n"
            "search a.example b.example.\noptions ndots:2 timeout:1\noptions ndots:3\n",
            ResolvConf(
                ("192.0.2.1", "192.0.2.2"), ("a.example", "b.example"), ("ndots:3", "timeout:1")
            ),
        ),
        ("domain x.example\nsearch y.example\n", ResolvConf((), ("y.example",), ())),
        ("search y.example\ndomain x.example\n", ResolvConf((), ("x.example",), ())),
        ("nameserver\nbogus line\n\n", ResolvConf()),
        ("nameserver 127.0.0.53\nsearch .\n", ResolvConf(("127.0.0.53",), (), ())),
    ],
)
def test_parse_resolv_conf(text: str, expected: ResolvConf) -> None:
    assert parse_resolv_conf(text) == expected
