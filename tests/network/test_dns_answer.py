"""The cluster DNS resolver (`agent.net.dnsanswer`): every record type, headless services and
endpoint hostnames, pod names, PTR, NXDOMAIN/NODATA with the SOA, case and trailing dots, and
the names it leaves to the forwarder."""

from __future__ import annotations

import ipaddress

import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype
import dns.reversename
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.agent.net.clusterview import SnapshotView
from orchestrator.agent.net.dnsanswer import ClusterRecords, Zone, dashed_name
from orchestrator.kube.objects import Obj

ZONE = Zone(
    "cluster.local",
    (ipaddress.ip_network("10.43.0.0/16"), ipaddress.ip_network("10.42.0.0/16")),
    dns_ip="10.43.0.10",
)


def svc(ns: str, name: str, **spec: object) -> Obj:
    return {"kind": "Service", "metadata": {"namespace": ns, "name": name}, "spec": spec}


def eps(
    ns: str, service: str, name: str, endpoints: list[Obj], ports: list[Obj], family: str = "IPv4"
) -> Obj:
    return {
        "kind": "EndpointSlice",
        "metadata": {
            "namespace": ns,
            "name": name,
            "labels": {"kubernetes.io/service-name": service},
        },
        "addressType": family,
        "endpoints": endpoints,
        "ports": ports,
    }


SERVICES = [
    svc("default", "kubernetes", clusterIP="10.43.0.1", ports=[{"name": "https", "port": 443}]),
    svc(
        "shop",
        "web",
        clusterIP="10.43.0.20",
        clusterIPs=["10.43.0.20", "fd00::20"],
        ports=[
            {"name": "http", "port": 80, "protocol": "TCP"},
            {"name": "dns", "port": 53, "protocol": "UDP"},
            {"port": 9000},
        ],
    ),
    svc("shop", "db", clusterIP="None", ports=[{"name": "pg", "port": 5432}]),
    svc("shop", "all", clusterIP="None", publishNotReadyAddresses=True),
    svc("shop", "ext", type="ExternalName", externalName="db.example.com"),
    svc("shop", "alias", type="ExternalName", externalName="web.shop.svc.cluster.local"),
    svc("shop", "pending", type="ClusterIP"),
]
SLICES = [
    eps(
        "shop",
        "db",
        "db-abc",
        [
            {"addresses": ["10.42.1.5"], "hostname": "db-0", "conditions": {"ready": True}},
            {"addresses": ["10.42.2.6"], "hostname": "db-1"},  # nil ready = ready
            {"addresses": ["10.42.3.7"]},  # no hostname: the dashed address
            {"addresses": ["10.42.4.8"], "hostname": "db-3", "conditions": {"ready": False}},
        ],
        [{"name": "pg", "port": 5432, "protocol": "TCP"}],
    ),
    eps(
        "shop",
        "all",
        "all-x",
        [{"addresses": ["10.42.9.9"], "conditions": {"ready": False}}],
        [],
    ),
]


@pytest.fixture
def records() -> ClusterRecords:
    view = SnapshotView(SERVICES, SLICES)
    return ClusterRecords.build(view.services(), view.endpoint_slices(), ZONE, serial=7)


def ask(records: ClusterRecords, name: str, rdtype: str = "A") -> dns.message.Message:
    resp = records.answer(dns.message.make_query(name, rdtype))
    assert resp is not None, f"{name} {rdtype} was not answered locally"
    return resp


def answers(resp: dns.message.Message, rdtype: str | None = None) -> list[str]:
    out = []
    for rrset in resp.answer:
        if rdtype is None or rrset.rdtype == dns.rdatatype.from_text(rdtype):
            out.extend(r.to_text() for r in rrset)
    return sorted(out)


def assert_soa(resp: dns.message.Message, zone: str = "cluster.local.") -> None:
    assert [str(r.name) for r in resp.authority] == [zone]
    soa = resp.authority[0]
    assert soa.rdtype == dns.rdatatype.SOA
    assert soa.ttl == 5
    assert soa[0].minimum == 5
    assert str(soa[0].mname) == "ns.dns.cluster.local."


def test_clusterip_service_a(records: ClusterRecords) -> None:
    resp = ask(records, "web.shop.svc.cluster.local")
    assert resp.rcode() == dns.rcode.NOERROR
    assert resp.flags & dns.flags.AA
    assert answers(resp) == ["10.43.0.20"]
    assert all(r.ttl == 5 for r in resp.answer)


def test_dual_stack_service_aaaa(records: ClusterRecords) -> None:
    assert answers(ask(records, "web.shop.svc.cluster.local", "AAAA")) == ["fd00::20"]


def test_wrong_type_is_nodata_with_soa(records: ClusterRecords) -> None:
    resp = ask(records, "kubernetes.default.svc.cluster.local", "AAAA")
    assert resp.rcode() == dns.rcode.NOERROR
    assert resp.answer == []
    assert_soa(resp)
    resp = ask(records, "kubernetes.default.svc.cluster.local", "TXT")
    assert resp.rcode() == dns.rcode.NOERROR
    assert resp.answer == []


def test_unknown_names_are_nxdomain_with_soa(records: ClusterRecords) -> None:
    for name in (
        "nope.shop.svc.cluster.local",
        "web.nons.svc.cluster.local",
        "x.web.shop.svc.cluster.local",  # not headless: no endpoint names
        "db-3.db.shop.svc.cluster.local",  # not ready
        "foo.cluster.local",
        "a.b.c.d.e.cluster.local",
    ):
        resp = ask(records, name)
        assert resp.rcode() == dns.rcode.NXDOMAIN, name
        assert resp.answer == []
        assert_soa(resp)


def test_empty_non_terminals_exist(records: ClusterRecords) -> None:
    for name in ("svc.cluster.local", "shop.svc.cluster.local", "pod.cluster.local"):
        resp = ask(records, name)
        assert resp.rcode() == dns.rcode.NOERROR, name
        assert resp.answer == []
        assert_soa(resp)


def test_case_insensitive_and_trailing_dot(records: ClusterRecords) -> None:
    resp = ask(records, "WeB.ShOp.SVC.Cluster.Local.")
    assert answers(resp) == ["10.43.0.20"]
    assert resp.answer[0].name.to_text() == "WeB.ShOp.SVC.Cluster.Local."  # echoes the question
    assert answers(ask(records, "web.shop.svc.cluster.local.")) == ["10.43.0.20"]


def test_headless_service_a_lists_ready_endpoints(records: ClusterRecords) -> None:
    assert answers(ask(records, "db.shop.svc.cluster.local")) == [
        "10.42.1.5",
        "10.42.2.6",
        "10.42.3.7",
    ]


def test_publish_not_ready_addresses(records: ClusterRecords) -> None:
    assert answers(ask(records, "all.shop.svc.cluster.local")) == ["10.42.9.9"]


def test_endpoint_hostnames_and_dashed_names(records: ClusterRecords) -> None:
    assert answers(ask(records, "db-0.db.shop.svc.cluster.local")) == ["10.42.1.5"]
    assert answers(ask(records, "DB-1.db.shop.svc.cluster.local")) == ["10.42.2.6"]
    assert answers(ask(records, "10-42-3-7.db.shop.svc.cluster.local")) == ["10.42.3.7"]


def test_external_name_is_a_cname_for_every_type(records: ClusterRecords) -> None:
    for rdtype in ("A", "AAAA", "CNAME", "TXT"):
        resp = ask(records, "ext.shop.svc.cluster.local", rdtype)
        assert resp.rcode() == dns.rcode.NOERROR
        assert answers(resp, "CNAME") == ["db.example.com."]


def test_external_name_inside_the_domain_is_followed(records: ClusterRecords) -> None:
    resp = ask(records, "alias.shop.svc.cluster.local")
    assert answers(resp, "CNAME") == ["web.shop.svc.cluster.local."]
    assert answers(resp, "A") == ["10.43.0.20"]


def test_named_port_srv(records: ClusterRecords) -> None:
    resp = ask(records, "_http._tcp.web.shop.svc.cluster.local", "SRV")
    assert answers(resp) == ["0 100 80 web.shop.svc.cluster.local."]
    assert [r.to_text() for rr in resp.additional for r in rr] == ["10.43.0.20", "fd00::20"]
    resp = ask(records, "_dns._udp.web.shop.svc.cluster.local", "SRV")
    assert answers(resp) == ["0 100 53 web.shop.svc.cluster.local."]
    # the wrong protocol or an unknown port name does not exist
    assert ask(records, "_dns._tcp.web.shop.svc.cluster.local", "SRV").rcode() == (
        dns.rcode.NXDOMAIN
    )
    assert ask(records, "_x._tcp.web.shop.svc.cluster.local", "SRV").rcode() == (dns.rcode.NXDOMAIN)
    # the port's own name exists without an address
    resp = ask(records, "_http._tcp.web.shop.svc.cluster.local", "A")
    assert resp.rcode() == dns.rcode.NOERROR
    assert resp.answer == []


def test_plain_service_srv_lists_every_port(records: ClusterRecords) -> None:
    resp = ask(records, "web.shop.svc.cluster.local", "SRV")
    assert answers(resp) == [
        "0 33 53 web.shop.svc.cluster.local.",
        "0 33 80 web.shop.svc.cluster.local.",
        "0 33 9000 web.shop.svc.cluster.local.",
    ]


def test_headless_srv_targets_endpoints_with_glue(records: ClusterRecords) -> None:
    resp = ask(records, "_pg._tcp.db.shop.svc.cluster.local", "SRV")
    assert answers(resp) == [
        "0 33 5432 10-42-3-7.db.shop.svc.cluster.local.",
        "0 33 5432 db-0.db.shop.svc.cluster.local.",
        "0 33 5432 db-1.db.shop.svc.cluster.local.",
    ]
    glue = sorted(f"{rr.name} {r}" for rr in resp.additional for r in rr)
    assert glue == [
        "10-42-3-7.db.shop.svc.cluster.local. 10.42.3.7",
        "db-0.db.shop.svc.cluster.local. 10.42.1.5",
        "db-1.db.shop.svc.cluster.local. 10.42.2.6",
    ]


def test_pod_names(records: ClusterRecords) -> None:
    assert answers(ask(records, "10-42-1-9.shop.pod.cluster.local")) == ["10.42.1.9"]
    assert answers(ask(records, "fd00--9.any.pod.cluster.local", "AAAA")) == ["fd00::9"]
    resp = ask(records, "10-42-1-9.shop.pod.cluster.local", "AAAA")
    assert resp.rcode() == dns.rcode.NOERROR
    assert resp.answer == []
    for bad in ("not-an-ip.shop.pod.cluster.local", "10-42-1-999.shop.pod.cluster.local"):
        assert ask(records, bad).rcode() == dns.rcode.NXDOMAIN


def test_ptr_for_cluster_ips_and_headless_endpoints(records: ClusterRecords) -> None:
    resp = ask(records, "1.0.43.10.in-addr.arpa", "PTR")
    assert answers(resp) == ["kubernetes.default.svc.cluster.local."]
    assert answers(ask(records, "20.0.43.10.in-addr.arpa.", "PTR")) == [
        "web.shop.svc.cluster.local."
    ]
    assert answers(ask(records, "5.1.42.10.in-addr.arpa", "PTR")) == [
        "db-0.db.shop.svc.cluster.local."
    ]
    assert answers(ask(records, "7.3.42.10.in-addr.arpa", "PTR")) == [
        "10-42-3-7.db.shop.svc.cluster.local."
    ]
    v6 = dns.reversename.from_address("fd00::20").to_text()
    assert answers(ask(records, v6, "PTR")) == ["web.shop.svc.cluster.local."]


def test_unknown_address_in_our_ranges_is_nxdomain(records: ClusterRecords) -> None:
    resp = ask(records, "99.99.43.10.in-addr.arpa", "PTR")
    assert resp.rcode() == dns.rcode.NXDOMAIN
    assert_soa(resp, "43.10.in-addr.arpa.")
    resp = ask(records, "1.0.43.10.in-addr.arpa", "A")
    assert resp.rcode() == dns.rcode.NOERROR
    assert resp.answer == []


@pytest.mark.parametrize(
    ("name", "rdtype"),
    [
        ("example.com", "A"),
        ("cluster.local.example.com", "A"),
        ("local", "SOA"),
        ("8.8.8.8.in-addr.arpa", "PTR"),
        ("1.0.44.10.in-addr.arpa", "PTR"),
        ("in-addr.arpa", "SOA"),
    ],
)
def test_other_names_are_forwarded(records: ClusterRecords, name: str, rdtype: str) -> None:
    assert records.answer(dns.message.make_query(name, rdtype)) is None


def test_apex_soa_and_ns(records: ClusterRecords) -> None:
    resp = ask(records, "cluster.local", "SOA")
    assert resp.answer[0].rdtype == dns.rdatatype.SOA
    assert resp.answer[0][0].serial == 7
    assert answers(ask(records, "cluster.local", "NS")) == ["ns.dns.cluster.local."]
    assert answers(ask(records, "ns.dns.cluster.local")) == ["10.43.0.10"]


def test_unallocated_service_exists_without_records(records: ClusterRecords) -> None:
    resp = ask(records, "pending.shop.svc.cluster.local")
    assert resp.rcode() == dns.rcode.NOERROR
    assert resp.answer == []


def test_bad_objects_are_skipped() -> None:
    view = SnapshotView(
        [
            svc("shop", "bad_name", clusterIP="10.43.0.5"),
            svc("shop", "ok", clusterIP="not-an-ip", ports=[{"name": "x", "port": 99999}]),
            {"kind": "Service", "metadata": {}, "spec": None},
        ],
        [],
    )
    rec = ClusterRecords.build(view.services(), view.endpoint_slices(), ZONE)
    resp = ask(rec, "ok.shop.svc.cluster.local")
    assert resp.rcode() == dns.rcode.NOERROR
    assert resp.answer == []
    assert ask(rec, "_x._tcp.ok.shop.svc.cluster.local", "SRV").rcode() == dns.rcode.NXDOMAIN


def test_other_class_in_domain_is_refused(records: ClusterRecords) -> None:
    q = dns.message.make_query("web.shop.svc.cluster.local", "A", "CH")
    resp = records.answer(q)
    assert resp is not None
    assert resp.rcode() == dns.rcode.REFUSED


def test_other_domain() -> None:
    zone = Zone("edge.internal", ZONE.networks)
    view = SnapshotView(SERVICES, SLICES)
    rec = ClusterRecords.build(view.services(), view.endpoint_slices(), zone)
    assert answers(ask(rec, "web.shop.svc.edge.internal")) == ["10.43.0.20"]
    assert rec.answer(dns.message.make_query("web.shop.svc.cluster.local", "A")) is None


@pytest.mark.parametrize(
    ("address", "label"),
    [("10.1.2.3", "10-1-2-3"), ("fd00::1", "fd00--1"), ("::1", "0--1"), ("fd00::", "fd00--0")],
)
def test_dashed_names(address: str, label: str) -> None:
    assert dashed_name(address) == label


def test_snapshot_view_tracks_changes() -> None:
    view = SnapshotView()
    g0 = view.generation
    view.apply(SERVICES[1])
    view.apply(SLICES[0])
    assert view.generation > g0
    assert list(view.services()) == [("shop", "web")]
    assert list(view.endpoint_slices()) == [("shop", "db")]
    before = view.services()
    view.delete(SERVICES[1])
    view.delete(SLICES[0])
    assert ("shop", "web") in before  # the old mapping is untouched
    assert not view.services()
    assert not view.endpoint_slices()
    with pytest.raises(ValueError, match="not 'Pod'"):
        view.apply({"kind": "Pod"})


_LABEL = st.from_regex(r"[a-z]([a-z0-9-]{0,8}[a-z0-9])?", fullmatch=True)


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(
        st.tuples(_LABEL, _LABEL),
        st.integers(min_value=2, max_value=65000),
        min_size=1,
        max_size=15,
    )
)
def test_every_service_resolves_both_ways(services: dict[tuple[str, str], int]) -> None:
    """Against a model: each Service's name gives its ClusterIP (any case), its ClusterIP's
    PTR gives its name, and a name of no Service is NXDOMAIN."""
    objs = [
        svc(ns, name, clusterIP=str(ipaddress.ip_address("10.43.0.0") + n))
        for (ns, name), n in services.items()
    ]
    view = SnapshotView(objs, [])
    rec = ClusterRecords.build(view.services(), view.endpoint_slices(), ZONE)
    by_ip: dict[str, set[str]] = {}
    for (ns, name), n in services.items():
        ip = str(ipaddress.ip_address("10.43.0.0") + n)
        by_ip.setdefault(ip, set()).add(f"{name}.{ns}.svc.cluster.local.")
        assert answers(ask(rec, f"{name}.{ns}.svc.cluster.local".upper())) == [ip]
        nx = ask(rec, f"{name}x.{ns}.svc.cluster.local")
        assert nx.rcode() == (
            dns.rcode.NOERROR if (ns, name + "x") in services else dns.rcode.NXDOMAIN
        )
    for ip, names in by_ip.items():
        ptr = ask(rec, dns.reversename.from_address(ip).to_text(), "PTR")
        assert set(answers(ptr)) == names
