"""The node DNS server (`agent.net.dnsserver`) for real on 127.0.0.1: cluster names over UDP and
TCP, forwarding to a stub upstream on another loopback port (cache, truncation and TCP fallback,
negative caching, failures), malformed packets, snapshot changes."""

from __future__ import annotations

import ipaddress
import socket
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field

import dns.asyncbackend
import dns.asyncquery
import dns.flags
import dns.message
import dns.opcode
import dns.rcode
import dns.rrset
import pytest
import trio

from orchestrator.agent.net.clusterview import SnapshotView
from orchestrator.agent.net.dnsanswer import Zone
from orchestrator.agent.net.dnsserver import DnsServer, Forwarder, upstreams_from
from orchestrator.agent.net.poddns import ResolvConf
from orchestrator.kube.objects import Obj

BACKEND = dns.asyncbackend.get_backend("trio")
ZONE = Zone("cluster.local", (ipaddress.ip_network("10.43.0.0/16"),), dns_ip="10.43.0.10")
WEB = {
    "kind": "Service",
    "metadata": {"namespace": "shop", "name": "web"},
    "spec": {"clusterIP": "10.43.0.20", "ports": [{"name": "http", "port": 80}]},
}
EXT = {
    "kind": "Service",
    "metadata": {"namespace": "shop", "name": "ext"},
    "spec": {"type": "ExternalName", "externalName": "example.com"},
}


@dataclass
class Stub:
    """An upstream DNS server on loopback: fixed answers, counts what it is asked."""

    port: int = 0
    asked: list[str] = field(default_factory=list)

    def respond(self, wire: bytes, tcp: bool) -> bytes:
        q = dns.message.from_wire(wire)
        name = q.question[0].name.to_text().lower()
        self.asked.append(f"{'tcp' if tcp else 'udp'} {name}")
        resp = dns.message.make_response(q)
        resp.flags |= dns.flags.RA
        if name == "example.com.":
            resp.answer.append(dns.rrset.from_text(q.question[0].name, 60, "IN", "A", "192.0.2.1"))
        elif name == "big.example.":
            if not tcp:
                resp.flags |= dns.flags.TC
            else:
                addrs = [f"192.0.2.{i}" for i in range(1, 80)]
                resp.answer.append(
                    dns.rrset.from_text_list(q.question[0].name, 60, "IN", "A", addrs)
                )
        else:
            resp.set_rcode(dns.rcode.NXDOMAIN)
            resp.authority.append(
                dns.rrset.from_text("example.", 300, "IN", "SOA", "ns. host. 1 1 1 1 30")
            )
        return resp.to_wire(max_size=65535)

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        udp = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
        with udp:
            await udp.bind(("127.0.0.1", 0))
            self.port = udp.getsockname()[1]
            listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.serve_listeners, self._tcp, listeners)
                task_status.started(self.port)
                while True:
                    data, addr = await udp.recvfrom(65535)
                    await udp.sendto(self.respond(data, False), addr)

    async def _tcp(self, stream: trio.SocketStream) -> None:
        data = b""
        while len(data) < 2 or len(data) < 2 + struct.unpack("!H", data[:2])[0]:
            chunk = await stream.receive_some()
            if not chunk:
                return
            data += chunk
        out = self.respond(data[2:], True)
        await stream.send_all(struct.pack("!H", len(out)) + out)


@dataclass
class Setup:
    server: DnsServer
    stub: Stub
    view: SnapshotView
    port: int


@pytest.fixture
async def setup(nursery: trio.Nursery) -> Setup:
    stub = Stub()
    await nursery.start(stub.run)
    view = SnapshotView([WEB, EXT], [])
    server = DnsServer(view, ZONE, Forwarder([("127.0.0.1", stub.port)], timeout=1.0), port=0)
    _, port = await nursery.start(server.run)
    return Setup(server, stub, view, port)


async def udp(port: int, name: str, rdtype: str = "A", **kw: object) -> dns.message.Message:
    q = dns.message.make_query(name, rdtype, **kw)  # type: ignore[arg-type]
    with trio.fail_after(5):
        return await dns.asyncquery.udp(q, "127.0.0.1", port=port, backend=BACKEND, timeout=5)


async def tcp(port: int, name: str, rdtype: str = "A") -> dns.message.Message:
    q = dns.message.make_query(name, rdtype)
    with trio.fail_after(5):
        return await dns.asyncquery.tcp(q, "127.0.0.1", port=port, backend=BACKEND, timeout=5)


def addresses(resp: dns.message.Message) -> list[str]:
    return sorted(r.to_text() for rrset in resp.answer for r in rrset)


async def test_cluster_names_over_udp_and_tcp(setup: Setup) -> None:
    for ask in (udp, tcp):
        resp = await ask(setup.port, "web.shop.svc.cluster.local")
        assert addresses(resp) == ["10.43.0.20"]
        assert resp.flags & dns.flags.AA
    resp = await udp(setup.port, "nope.shop.svc.cluster.local")
    assert resp.rcode() == dns.rcode.NXDOMAIN
    assert setup.stub.asked == []  # nothing of ours goes upstream
    again = await udp(setup.port, "WEB.shop.svc.cluster.local")  # from the memo, its spelling
    assert again.answer[0].name.to_text() == "WEB.shop.svc.cluster.local."
    assert setup.server.stats.cache_hits >= 1


async def test_forwarding_and_cache(setup: Setup) -> None:
    resp = await udp(setup.port, "example.com")
    assert addresses(resp) == ["192.0.2.1"]
    assert not resp.flags & dns.flags.AA
    resp2 = await udp(setup.port, "EXAMPLE.com")
    assert addresses(resp2) == ["192.0.2.1"]
    assert resp2.question[0].name.to_text() == "EXAMPLE.com."
    assert 55 <= resp2.answer[0].ttl <= 60
    assert setup.stub.asked == ["udp example.com."]  # the second came from the cache
    assert setup.server.stats.cache_hits == 1
    resp3 = await udp(setup.port, "example.com", use_edns=0)  # another key: EDNS
    assert resp3.edns == 0
    assert len(setup.stub.asked) == 2


async def test_negative_answers_are_cached(setup: Setup) -> None:
    for _ in range(3):
        resp = await udp(setup.port, "missing.example")
        assert resp.rcode() == dns.rcode.NXDOMAIN
    assert setup.stub.asked == ["udp missing.example."]


async def test_truncation_and_tcp_fallback(setup: Setup) -> None:
    resp = await udp(setup.port, "big.example")
    assert resp.flags & dns.flags.TC  # too big for 512 bytes: the client must use TCP
    assert resp.answer == []
    assert setup.stub.asked == ["udp big.example.", "tcp big.example."]  # we fell back
    full = await tcp(setup.port, "big.example")
    assert len(addresses(full)) == 79
    assert len(setup.stub.asked) == 2  # cached
    edns = await udp(setup.port, "big.example", use_edns=0, payload=4096)
    assert len(addresses(edns)) == 79


async def test_external_name_is_followed_upstream(setup: Setup) -> None:
    resp = await udp(setup.port, "ext.shop.svc.cluster.local")
    assert [rrset.rdtype for rrset in resp.answer] == [dns.rdatatype.CNAME, dns.rdatatype.A]
    assert addresses(resp) == ["192.0.2.1", "example.com."]


async def test_upstream_down_is_servfail_and_cluster_names_still_answer(
    nursery: trio.Nursery,
) -> None:
    dead = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    dead.bind(("127.0.0.1", 0))
    dead_port = dead.getsockname()[1]
    dead.close()  # nothing listens there now: refused at once
    server = DnsServer(
        SnapshotView([WEB], []), ZONE, Forwarder([("127.0.0.1", dead_port)], 0.5), port=0
    )
    _, port = await nursery.start(server.run)
    resp = await udp(port, "example.com")
    assert resp.rcode() == dns.rcode.SERVFAIL
    assert server.stats.forward_failures == 1
    assert addresses(await udp(port, "web.shop.svc.cluster.local")) == ["10.43.0.20"]
    again = await udp(port, "example.com")  # SERVFAIL is not cached: asked again
    assert again.rcode() == dns.rcode.SERVFAIL
    assert server.stats.forward_failures == 2


async def test_no_upstreams_is_servfail(nursery: trio.Nursery) -> None:
    server = DnsServer(SnapshotView(), ZONE, Forwarder([]), port=0)
    _, port = await nursery.start(server.run)
    assert (await udp(port, "example.com")).rcode() == dns.rcode.SERVFAIL


async def test_malformed_packets(setup: Setup) -> None:
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    with sock:
        await sock.connect(("127.0.0.1", setup.port))
        await sock.send(b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07exa")  # cut short
        with trio.fail_after(5):
            reply = await sock.recv(512)
        assert reply[:2] == b"\x12\x34"
        assert reply[3] & 0x0F == dns.rcode.FORMERR
        assert reply[2] & 0x80  # a response
        for junk in (b"", b"\x00", b"\xff" * 5):
            await sock.send(junk)  # too short for a header: dropped
        await sock.send(dns.message.make_response(dns.message.make_query("x.", "A")).to_wire())
    # the server is still there
    assert addresses(await udp(setup.port, "web.shop.svc.cluster.local")) == ["10.43.0.20"]
    assert setup.server.stats.malformed >= 1


async def test_odd_but_wellformed_queries(setup: Setup) -> None:
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    with sock:
        await sock.connect(("127.0.0.1", setup.port))
        empty = dns.message.Message(id=7)  # no question at all
        await sock.send(empty.to_wire())
        with trio.fail_after(5):
            reply = dns.message.from_wire(await sock.recv(512))
        assert reply.id == 7
        assert reply.rcode() == dns.rcode.FORMERR
        two = dns.message.make_query("example.com", "A")
        two.question.append(dns.message.make_query("example.org", "A").question[0])
        await sock.send(two.to_wire())
        with trio.fail_after(5):
            reply = dns.message.from_wire(await sock.recv(512))
        assert reply.rcode() == dns.rcode.FORMERR
        notify = dns.message.make_query("cluster.local", "SOA")
        notify.set_opcode(dns.opcode.NOTIFY)
        await sock.send(notify.to_wire())
        with trio.fail_after(5):
            reply = dns.message.from_wire(await sock.recv(512))
        assert reply.rcode() == dns.rcode.NOTIMP
    assert setup.stub.asked == []
    assert addresses(await udp(setup.port, "web.shop.svc.cluster.local")) == ["10.43.0.20"]


class BrokenView(SnapshotView):
    """A view whose snapshot fails while `broken` (a bug in the Service cache)."""

    broken = False

    def services(self) -> Mapping[tuple[str, str], Obj]:
        if self.broken:
            raise RuntimeError("cache bug")
        return super().services()


async def test_a_failing_view_does_not_stop_the_server(nursery: trio.Nursery) -> None:
    view = BrokenView([WEB])
    server = DnsServer(view, ZONE, Forwarder([]), port=0)
    _, port = await nursery.start(server.run)
    view.broken = True
    view.apply(EXT)  # a new generation: the index is rebuilt, and that fails
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    with sock:
        await sock.connect(("127.0.0.1", port))
        await sock.send(dns.message.make_query("web.shop.svc.cluster.local", "A").to_wire())
        with trio.fail_after(5):  # dropped, not answered
            while server.stats.dropped < 1:  # noqa: ASYNC110 - polling a counter, no event
                await trio.sleep(0.01)
    view.broken = False
    assert addresses(await udp(port, "web.shop.svc.cluster.local")) == ["10.43.0.20"]


async def test_malformed_over_tcp(setup: Setup) -> None:
    with trio.fail_after(5):
        stream = await trio.open_tcp_stream("127.0.0.1", setup.port)
        async with stream:
            junk = b"\xab\xcd\x01\x00\x00\x05" + b"\x00" * 6  # 5 questions, none there
            await stream.send_all(struct.pack("!H", len(junk)) + junk)
            data = await stream.receive_some()
            assert data[2:4] == b"\xab\xcd"  # FORMERR with the packet's ID
            assert data[5] & 0x0F == dns.rcode.FORMERR
    assert addresses(await tcp(setup.port, "web.shop.svc.cluster.local")) == ["10.43.0.20"]


async def test_snapshot_changes_are_served(setup: Setup) -> None:
    assert (await udp(setup.port, "api.shop.svc.cluster.local")).rcode() == dns.rcode.NXDOMAIN
    setup.view.apply(
        {
            "kind": "Service",
            "metadata": {"namespace": "shop", "name": "api"},
            "spec": {"clusterIP": "10.43.0.30"},
        }
    )
    assert addresses(await udp(setup.port, "api.shop.svc.cluster.local")) == ["10.43.0.30"]
    setup.view.delete(WEB)
    assert (await udp(setup.port, "web.shop.svc.cluster.local")).rcode() == dns.rcode.NXDOMAIN


def test_upstreams_from_resolv_conf() -> None:
    resolv = ResolvConf(("127.0.0.53", "10.43.0.10", "bogus", "192.0.2.1", "192.0.2.1"))
    assert upstreams_from(resolv, ("10.43.0.10", 53)) == [("127.0.0.53", 53), ("192.0.2.1", 53)]
    assert upstreams_from(resolv, ("127.0.0.1", 5353)) == [
        ("127.0.0.53", 53),
        ("10.43.0.10", 53),
        ("192.0.2.1", 53),
    ]
