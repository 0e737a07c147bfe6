"""Mutual TLS and admission on the Raft peer port (`raft.transport` with `PeerTLS`).

Who may speak Raft to a server: only a current member, proven by a peer certificate signed by
the cluster CA whose node id matches the hello. Refused: no certificate, another CA's, a node
agent's (same CA), a server certificate announcing another id, a removed member's. A refusal is
not a peer-down signal. Real TLS over loopback; conditions are polled under `fail_after`.
"""

from __future__ import annotations

import itertools
import random
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import msgpack
import pytest
import trio
from pkikit import OTHER_TOKEN, agent_cert, client_context, peer_tls, server_pki

from orchestrator.raft.framing import FrameDecoder, encode_frame
from orchestrator.raft.transport import PeerTransport
from orchestrator.raft.types import Message, MsgType, NodeId
from orchestrator.security.peercerts import derive_ca, server_node_id

LOCAL = "127.0.0.1"
FAST = (0.005, 0.02)


def msg(frm: NodeId, to: NodeId, term: int = 1) -> Message:
    return Message(MsgType.HEARTBEAT, to=to, frm=frm, term=term)


def node(tmp_path: Path, nid: NodeId, token: str | None = None, **kw: object) -> PeerTransport:
    d = tmp_path / f"n{nid}"
    if token is None:
        server_pki(d, nid)
    else:
        server_pki(d, nid, token)
    kw.setdefault("reconnect_backoff", FAST)
    return PeerTransport(
        nid,
        (LOCAL, 0),
        {},
        rng=random.Random(nid),
        tls=peer_tls(d),
        **kw,  # type: ignore[arg-type]
    )


@asynccontextmanager
async def running(*transports: PeerTransport) -> AsyncIterator[None]:
    async with trio.open_nursery() as nursery:
        for t in transports:
            await nursery.start(t.run)
        yield
        nursery.cancel_scope.cancel()


async def eventually(predicate: Callable[[], bool]) -> None:
    for _ in itertools.count():
        if predicate():
            return
        await trio.sleep(0.005)


async def dial(port: int, ctx: ssl.SSLContext, hello_id: int) -> tuple[str, bytes]:
    """Connect as a peer would with `ctx`, say hello as `hello_id`, send one heartbeat to node
    1; returns how it ended ("refused": TLS alert or refusal frame, "eof", "open") and what
    the server wrote."""
    from orchestrator.raft.codec import encode_message

    sock = await trio.open_tcp_stream(LOCAL, port)
    stream = trio.SSLStream(sock, ctx, server_hostname=None)
    async with stream:
        try:
            await stream.do_handshake()
            hello = msgpack.packb({"id": hello_id, "addr": [LOCAL, 1]})
            await stream.send_all(
                encode_frame(hello) + encode_frame(encode_message(msg(hello_id, 1)))
            )
            with trio.move_on_after(2):
                data = await stream.receive_some(65536)
                return ("refused" if data else "eof"), bytes(data)
            return "open", b""
        except trio.BrokenResourceError:
            return "refused", b""


def refusal(data: bytes) -> str:
    frames = FrameDecoder(1024).receive_data(data)
    return str(msgpack.unpackb(frames[0])["refused"]) if frames else ""


async def test_members_talk_over_mutual_tls(tmp_path: Path) -> None:
    with trio.fail_after(20):
        a, b = node(tmp_path, 1), node(tmp_path, 2)
        async with running(a, b):
            a.set_peer(2, (LOCAL, b.port))
            b.set_peer(1, (LOCAL, a.port))
            a.send(msg(1, 2, term=4))
            assert (await b.inbound.receive()).term == 4
            b.send(msg(2, 1, term=5))
            assert (await a.inbound.receive()).term == 5
            assert a.statistics().refused == b.statistics().refused == 0


async def test_send_now_writes_to_an_idle_connection_in_order(tmp_path: Path) -> None:
    """`send_now` writes from the caller's task when the peer's writer is idle, and keeps the
    order with what goes through the writer's queue."""
    with trio.fail_after(20):
        a, b = node(tmp_path, 1), node(tmp_path, 2)
        async with running(a, b):
            a.set_peer(2, (LOCAL, b.port))
            b.set_peer(1, (LOCAL, a.port))
            a.send(msg(1, 2, term=1))
            assert (await b.inbound.receive()).term == 1
            await eventually(lambda: a._peers[2].idle is not None)
            a.send_now([msg(1, 2, term=2), msg(1, 2, term=3)])
            assert not a._peers[2].queue  # written, not queued
            assert a.statistics().sent == 3
            a.send(msg(1, 2, term=4))  # wakes the writer: the next batch is queued behind it
            a.send_now([msg(1, 2, term=5)])
            assert a._peers[2].idle is None
            assert [(await b.inbound.receive()).term for _ in range(4)] == [2, 3, 4, 5]


@pytest.mark.parametrize("who", ["no certificate", "another CA", "agent", "other node's id"])
async def test_the_peer_port_refuses(tmp_path: Path, who: str) -> None:
    with trio.fail_after(20):
        a = node(tmp_path, 1)
        a.set_peer(2, (LOCAL, 1))  # node 2 is a member
        d1 = tmp_path / "n1"
        if who == "no certificate":
            ctx = client_context(d1, None, None)
        elif who == "another CA":
            other = server_pki(tmp_path / "other", 2, OTHER_TOKEN)
            ctx = client_context(d1, other.peer_cert, other.peer_key)
        elif who == "agent":
            ctx = client_context(d1, *agent_cert(d1))
        else:  # a member's certificate (node 3) announcing member 2
            p3 = server_pki(tmp_path / "n3", 3)
            a.set_peer(3, (LOCAL, 1))
            ctx = client_context(d1, p3.peer_cert, p3.peer_key)
        async with running(a):
            how, data = await dial(a.port, ctx, hello_id=2)
            assert how == "refused"
            if who in ("agent", "other node's id"):  # CA-signed: refused with a reason
                assert "server certificate" in refusal(data) or "announces" in refusal(data)
            await eventually(lambda: a.statistics().refused == 1)
            assert a.statistics().received == 0


async def test_a_removed_members_certificate_is_refused(tmp_path: Path) -> None:
    with trio.fail_after(20):
        a, b = node(tmp_path, 1), node(tmp_path, 2)
        async with running(a, b):
            a.set_peer(2, (LOCAL, b.port))
            b.set_peer(1, (LOCAL, a.port))
            b.send(msg(2, 1, term=1))
            assert (await a.inbound.receive()).term == 1
            a.remove_peer(2)  # its open connection is closed, new ones refused
            await eventually(lambda: a.statistics().refused >= 1)
            b.send(msg(2, 1, term=2))
            await eventually(lambda: b.statistics().refused >= 1)
            assert a.statistics().received == 1
            # The same certificate over a fresh connection: refused with the reason.
            d2 = tmp_path / "n2"
            ctx = client_context(d2, d2 / "pki" / "peer.crt", d2 / "pki" / "peer.key")
            how, data = await dial(a.port, ctx, hello_id=2)
            assert how == "refused"
            assert "removed" in refusal(data)


async def test_a_non_member_is_refused_unless_joining(tmp_path: Path) -> None:
    with trio.fail_after(20):
        a, b, c = node(tmp_path, 1), node(tmp_path, 2, admit_unknown=True), node(tmp_path, 3)
        async with running(a, b, c):
            # b (joining, knows no membership) admits node 1 and learns it from its hello ...
            a.set_peer(2, (LOCAL, b.port))
            a.send(msg(1, 2, term=3))
            assert (await b.inbound.receive()).term == 3
            assert b.peer_addresses() == {1: (LOCAL, a.port)}
            # ... while c, which knows its members (none), refuses node 2 until it is one.
            b.set_peer(3, (LOCAL, c.port))
            b.send(msg(2, 3, term=4))
            await eventually(lambda: c.statistics().refused >= 1)
            c.set_peer(2, (LOCAL, b.port))
            while c.statistics().received == 0:
                b.send(msg(2, 3, term=5))
                await trio.sleep(0.01)
            assert (await c.inbound.receive()).term == 5


async def test_the_caller_checks_whom_it_reached(tmp_path: Path) -> None:
    """A server listening where we expect node 2 but holding node 3's certificate is not
    talked to (and that is no peer-down either)."""
    with trio.fail_after(20):
        a, c = node(tmp_path, 1), node(tmp_path, 3, admit_unknown=True)
        down: list[NodeId] = []
        a.on_peer_down = down.append
        async with running(a, c):
            a.set_peer(2, (LOCAL, c.port))
            a.send(msg(1, 2))
            await eventually(lambda: a.statistics().refused >= 1)
            assert c.statistics().received == 0
            assert down == []


def test_the_derived_ca_is_the_same_everywhere_and_depends_on_the_token() -> None:
    c1, k1 = derive_ca("token-aaaaaaaaaaaaaaaa")
    c2, k2 = derive_ca("token-aaaaaaaaaaaaaaaa")
    c3, _ = derive_ca("token-bbbbbbbbbbbbbbbb")
    assert c1 == c2  # byte-identical (deterministic ECDSA)
    assert k1.private_numbers() == k2.private_numbers()
    assert c1.public_key() != c3.public_key()


def test_server_node_id_reads_only_server_certificates(tmp_path: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    p = server_pki(tmp_path / "s", 7)
    der = x509.load_pem_x509_certificate(p.peer_cert.read_bytes()).public_bytes(
        serialization.Encoding.DER
    )
    assert server_node_id(der) == 7
    admin = x509.load_pem_x509_certificate(p.admin_cert.read_bytes())
    assert isinstance(server_node_id(admin.public_bytes(serialization.Encoding.DER)), str)
    assert server_node_id(None) == "no certificate"
