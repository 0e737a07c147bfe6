"""The agent's node DNS set-up (`agent.net.nodedns`) and its flags: resolv.conf reading,
`--dns-listen`, the server kept running (and its failures not fatal), the `orch-dns` interface
(inside a network namespace made for the test)."""

from __future__ import annotations

import argparse
import ipaddress
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import dns.asyncbackend
import dns.asyncquery
import dns.message
import pytest
import trio

from orchestrator.agent.net import nodedns
from orchestrator.agent.net.clusterview import SnapshotView
from orchestrator.agent.net.nodedns import (
    NodeDnsOptions,
    load_pod_dns,
    node_dns_options,
    parse_listen,
    read_resolv_conf,
    run_node_dns,
)
from orchestrator.agent.net.poddns import PodDNS, ResolvConf
from orchestrator.agent.service import add_parser

ROOT = Path(__file__).resolve().parents[2]
WEB = {
    "kind": "Service",
    "metadata": {"namespace": "shop", "name": "web"},
    "spec": {"clusterIP": "10.43.0.20"},
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:5353", ("127.0.0.1", 5353)),
        ("[::1]:53", ("::1", 53)),
        ("0.0.0.0:0", ("0.0.0.0", 0)),
    ],
)
def test_parse_listen(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text", ["127.0.0.1", "localhost:53", "127.0.0.1:99999", ":53", "x:y"])
def test_parse_listen_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="--dns-listen"):
        parse_listen(text)


def test_load_pod_dns(tmp_path: Path) -> None:
    conf = tmp_path / "resolv.conf"
    conf.write_text("nameserver 192.0.2.1\nsearch corp\n")
    dns_ = load_pod_dns("10.43.0.10, 10.43.0.11", "Cluster.Local.", conf)
    assert dns_ == PodDNS(
        ("10.43.0.10", "10.43.0.11"), "cluster.local", ResolvConf(("192.0.2.1",), ("corp",), ())
    )
    assert load_pod_dns("", "cluster.local", conf).cluster_dns == ()
    with pytest.raises(ValueError, match="--cluster-dns 'nope'"):
        load_pod_dns("nope", "cluster.local", conf)


def test_missing_resolv_conf_is_empty(tmp_path: Path) -> None:
    assert read_resolv_conf(tmp_path / "absent") == ResolvConf()


def test_systemd_resolved_stub_is_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stub, real = tmp_path / "resolv.conf", tmp_path / "real.conf"
    stub.write_text("nameserver 127.0.0.53\nsearch corp\n")
    real.write_text("nameserver 192.0.2.1\nsearch corp\n")
    monkeypatch.setattr(nodedns, "DEFAULT_RESOLV_CONF", stub)
    monkeypatch.setattr(nodedns, "SYSTEMD_RESOLV_CONF", real)
    assert read_resolv_conf(stub).nameservers == ("192.0.2.1",)
    other = tmp_path / "given.conf"  # a file given explicitly is taken as it is
    other.write_text("nameserver 127.0.0.53\n")
    assert read_resolv_conf(other).nameservers == ("127.0.0.53",)
    real.unlink()
    assert read_resolv_conf(stub).nameservers == ("127.0.0.53",)


async def test_run_node_dns_serves(nursery: trio.Nursery) -> None:
    view = SnapshotView([WEB])
    opts = NodeDnsOptions(
        PodDNS(("10.43.0.10",), "cluster.local", ResolvConf()),
        listen=("127.0.0.1", 0),
        networks=(ipaddress.ip_network("10.43.0.0/16"),),
    )
    bound = await nursery.start(run_node_dns, view, opts)
    assert bound is not None
    q = dns.message.make_query("web.shop.svc.cluster.local", "A")
    backend = dns.asyncbackend.get_backend("trio")
    with trio.fail_after(5):
        resp = await dns.asyncquery.udp(q, bound[0], port=bound[1], backend=backend, timeout=5)
    assert [r.to_text() for r in resp.answer[0]] == ["10.43.0.20"]
    with trio.fail_after(5):
        ptr = await dns.asyncquery.udp(
            dns.message.make_query("20.0.43.10.in-addr.arpa", "PTR"),
            bound[0],
            port=bound[1],
            backend=backend,
            timeout=5,
        )
    assert [r.to_text() for r in ptr.answer[0]] == ["web.shop.svc.cluster.local."]


async def test_port_taken_is_not_fatal(nursery: trio.Nursery) -> None:
    taken = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    taken.bind(("127.0.0.1", 0))
    try:
        opts = NodeDnsOptions(PodDNS(("10.43.0.10",)), listen=taken.getsockname())
        assert await nursery.start(run_node_dns, SnapshotView(), opts) is None  # retries
    finally:
        taken.close()
    nursery.cancel_scope.cancel()


async def test_no_cluster_dns_runs_no_server(nursery: trio.Nursery) -> None:
    assert await nursery.start(run_node_dns, SnapshotView(), NodeDnsOptions(PodDNS())) is None


def _agent_args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    return parser.parse_args(["agent", "--data-dir", "/tmp/x", *extra])


def test_agent_flags(tmp_path: Path) -> None:
    conf = tmp_path / "resolv.conf"
    conf.write_text("nameserver 192.0.2.1\n")
    args = _agent_args("--resolv-conf", str(conf))
    pod_dns, server = node_dns_options(args, "simulated")
    assert pod_dns.cluster_dns == ("10.43.0.10",)
    assert pod_dns.cluster_domain == "cluster.local"
    assert pod_dns.host.nameservers == ("192.0.2.1",)
    assert server is None  # simulated runtime, no --dns-listen: no server
    _, server = node_dns_options(args, "containerd")
    assert server is not None
    assert server.listen is None  # the cluster DNS address on orch-dns
    args = _agent_args(
        "--cluster-dns",
        "10.96.0.10",
        "--cluster-domain",
        "edge.internal",
        "--dns-listen",
        "127.0.0.1:5353",
        "--resolv-conf",
        str(conf),
    )
    pod_dns, server = node_dns_options(args, "simulated")
    assert server is not None
    assert server.listen == ("127.0.0.1", 5353)
    assert pod_dns.cluster_dns == ("10.96.0.10",)
    with pytest.raises(ValueError, match="--dns-listen"):
        node_dns_options(_agent_args("--dns-listen", "nonsense"), "simulated")


def _can_unshare() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-n", "true"], check=False).returncode == 0


@pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare -n")
def test_dns_interface_in_a_private_namespace() -> None:
    """In a network namespace of its own (never the host's): the address gets on `orch-dns`
    (or `lo` without dummy links), twice without error."""
    code = (
        "from orchestrator.agent.net.nodedns import ensure_dns_interface as e\n"
        "a = e('10.43.0.10'); b = e('10.43.0.10'); print(a, b)\n"
        "import subprocess\n"
        "print(subprocess.run(['ip', '-o', 'addr', 'show', 'dev', a], capture_output=True,"
        " text=True, check=True).stdout)\n"
    )
    out = subprocess.run(
        ["unshare", "-n", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    ).stdout
    link = out.split()[0]
    assert link in ("orch-dns", "lo")
    assert "10.43.0.10/32" in out
    assert out.count("10.43.0.10/32") == 1  # idempotent
