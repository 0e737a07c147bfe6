"""Tests for the Raft peer transport on real TCP (127.0.0.1, ephemeral ports) and for the
deterministic FaultInjector.

Conditions are awaited on channels or polled with a deadline; nothing sleeps for a fixed time and
hopes. Reconnect backoff is shortened so reconnect scenarios take milliseconds.
"""

from __future__ import annotations

import itertools
import logging
import random
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import msgpack
import pytest
import trio

from orchestrator.raft import peerinbound
from orchestrator.raft.codec import encode_message
from orchestrator.raft.framing import encode_frame
from orchestrator.raft.transport import PeerTransport
from orchestrator.raft.types import Entry, Message, MsgType, NodeId
from orchestrator.testing.faults import FaultInjector

LOCAL = "127.0.0.1"
FAST = (0.005, 0.02)  # reconnect backoff for tests


def make_msg(frm: NodeId, to: NodeId, term: int = 1, data: bytes = b"") -> Message:
    entries = [Entry(term=term, index=1, data=data)] if data else []
    return Message(MsgType.APP, to=to, frm=frm, term=term, entries=entries)


def transport(
    node_id: NodeId, peers: dict[NodeId, tuple[str, int]] | None = None, port: int = 0, **kw: object
) -> PeerTransport:
    kw.setdefault("reconnect_backoff", FAST)
    kw.setdefault("rng", random.Random(node_id))
    # Most tests here tell only the sending side about its peer: the receiver admits callers it
    # does not know (as a joining server does). Admission itself: tests/raft/test_peer_tls.py.
    kw.setdefault("admit_unknown", True)
    return PeerTransport(node_id, (LOCAL, port), dict(peers or {}), **kw)  # type: ignore[arg-type]


@asynccontextmanager
async def running(*transports: PeerTransport) -> AsyncIterator[trio.Nursery]:
    async with trio.open_nursery() as nursery:
        for t in transports:
            await nursery.start(t.run)
        yield nursery
        nursery.cancel_scope.cancel()


async def eventually(predicate: Callable[[], bool]) -> None:
    """Poll until predicate holds; the caller's fail_after bounds the wait."""
    for _ in itertools.count():
        if predicate():
            return
        await trio.sleep(0.002)


async def send_until_received(src: PeerTransport, dst: PeerTransport, msg: Message) -> Message:
    """Resend msg until dst gets it: for when the first copies may die with a connection.
    Anything else arriving meanwhile (late copies of earlier resends) is skipped."""
    while True:
        src.send(msg)
        with trio.move_on_after(0.02):
            while (got := await dst.inbound.receive()) != msg:
                pass
            return got


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOCAL, 0))
        port: int = s.getsockname()[1]
        return port


def hello(node_id: NodeId, port: int = 9) -> bytes:
    return encode_frame(msgpack.packb({"id": node_id, "addr": [LOCAL, port]}))


def frame_of(msg: Message) -> bytes:
    return encode_frame(encode_message(msg))


async def expect_closed(stream: trio.SocketStream) -> None:
    try:
        data = await stream.receive_some(1024)
    except trio.BrokenResourceError:  # closed with our bytes unread: RST instead of FIN
        return
    assert data == b""


def warnings_about(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "orchestrator.raft.transport"
        and r.levelno >= logging.WARNING
        and text in r.getMessage()
    ]


# ---------------------------------------------------------------------------- real transports


async def test_two_transports_exchange_messages_both_ways() -> None:
    with trio.fail_after(10):
        a, b = transport(1), transport(2)
        async with running(a, b):
            assert a.port != 0
            assert b.port != 0
            a.set_peer(2, (LOCAL, b.port))
            b.set_peer(1, (LOCAL, a.port))
            for term in range(1, 51):
                a.send(make_msg(1, 2, term, data=b"a%d" % term))
                b.send(make_msg(2, 1, term))
            # One connection per direction, no faults: everything arrives, in order.
            assert [(await b.inbound.receive()).term for _ in range(50)] == list(range(1, 51))
            assert [(await a.inbound.receive()).term for _ in range(50)] == list(range(1, 51))
            # `sent` is counted when send_all returns, which may be after the peer has read it.
            await eventually(lambda: a.statistics().sent == b.statistics().sent == 50)
            sa, sb = a.statistics(), b.statistics()
            assert (sa.received, sb.received, sb.sent) == (50, 50, 50)
            assert sa.connected_peers == frozenset({2})
            assert sb.connected_peers == frozenset({1})
            assert sa.dropped_queue_full == sa.dropped_bad_frame == sa.dropped_send_failed == 0


async def test_message_contents_survive_the_wire() -> None:
    with trio.fail_after(10):
        a, b = transport(1), transport(2)
        async with running(a, b):
            a.set_peer(2, (LOCAL, b.port))
            msg = Message(
                MsgType.APP,
                to=2,
                frm=1,
                term=7,
                log_term=6,
                index=41,
                entries=[Entry(7, 42, data=b"\x00" * 5000)],
                commit=40,
                context=b"ctx",
            )
            a.send(msg)
            assert await b.inbound.receive() == msg


async def test_new_member_is_learned_from_its_hello() -> None:
    with trio.fail_after(10):
        a, b = transport(1), transport(2)
        async with running(a, b):
            a.set_peer(2, (LOCAL, b.port))  # b has never heard of node 1
            a.send(make_msg(1, 2))
            await b.inbound.receive()
            assert b.peer_addresses() == {1: (LOCAL, a.port)}
            b.send(make_msg(2, 1, term=5))
            assert (await a.inbound.receive()).term == 5


async def test_peer_that_starts_later_is_reached_after_reconnect() -> None:
    with trio.fail_after(10):
        port = free_port()
        a = transport(1, {2: (LOCAL, port)})
        b = transport(2, port=port)
        async with running(a) as nursery:
            a.send(make_msg(1, 2, term=3))  # queued while nobody listens
            await eventually(lambda: a.statistics().reconnects >= 2)
            assert a.statistics().connected_peers == frozenset()
            await nursery.start(b.run)
            assert (await b.inbound.receive()).term == 3
            assert a.statistics().connected_peers == frozenset({2})


async def test_restart_of_the_receiving_side_is_survived() -> None:
    with trio.fail_after(10):
        port = free_port()
        a = transport(1, {2: (LOCAL, port)})
        async with running(a):
            b = transport(2, port=port)
            async with running(b):
                assert (await send_until_received(a, b, make_msg(1, 2, term=1))).term == 1
            assert b.statistics().received >= 1
            b2 = transport(2, port=port)
            async with running(b2):
                assert (await send_until_received(a, b2, make_msg(1, 2, term=2))).term == 2
            assert a.statistics().reconnects >= 1


async def test_a_peer_that_goes_away_is_reported_after_its_messages() -> None:
    """Its connections close (both directions), then connects are refused: each is reported,
    after every message it sent before going was counted as received."""
    with trio.fail_after(10):
        reports: list[tuple[NodeId, int]] = []
        a = transport(1, on_peer_down=lambda p: reports.append((p, a.statistics().received)))
        b = transport(2)
        async with running(a):
            async with running(b):
                a.set_peer(2, (LOCAL, b.port))
                b.set_peer(1, (LOCAL, a.port))
                await send_until_received(a, b, make_msg(1, 2))
                for term in range(1, 4):
                    b.send(make_msg(2, 1, term))
                assert [(await a.inbound.receive()).term for _ in range(3)] == [1, 2, 3]
                assert reports == []
            # b's process is gone: its sockets are closed; a's reconnects are refused.
            await eventually(lambda: len(reports) >= 3)
            assert {p for p, _ in reports} == {2}
            assert all(received == 3 for _, received in reports)


async def test_our_own_closes_are_not_reported() -> None:
    with trio.fail_after(10):
        reports: list[NodeId] = []
        a = transport(1, on_peer_down=reports.append)
        b = transport(2)
        async with running(b):
            async with running(a):
                a.set_peer(2, (LOCAL, b.port))
                b.set_peer(1, (LOCAL, a.port))
                await send_until_received(a, b, make_msg(1, 2))
                await send_until_received(b, a, make_msg(2, 1))
                a.remove_peer(2)  # our outbound connection is dropped
                await eventually(lambda: not a.statistics().connected_peers)
            # a stopped: it closed everything itself (b hears of it: a went away).
            await eventually(lambda: not b.statistics().connected_peers)
        assert reports == []


async def test_cancellation_closes_the_listener() -> None:
    with trio.fail_after(10):
        a = transport(1, {2: (LOCAL, free_port())})
        async with running(a):
            port = a.port
            stream = await trio.open_tcp_stream(LOCAL, port)
            await stream.aclose()
        with pytest.raises(OSError, match="all attempts to connect"):
            await trio.open_tcp_stream(LOCAL, port)
        assert a.statistics().connected_peers == frozenset()


async def test_set_peer_readdresses_and_remove_peer_forgets() -> None:
    with trio.fail_after(10):
        a, b = transport(1, {2: (LOCAL, free_port())}), transport(2)
        async with running(a, b):
            a.send(make_msg(1, 2, term=1))  # stuck: wrong address
            a.set_peer(2, (LOCAL, b.port))
            assert (await b.inbound.receive()).term == 1
            a.remove_peer(2)
            await eventually(lambda: not a.statistics().connected_peers)
            a.send(make_msg(1, 2, term=2))
            assert a.statistics().dropped_unknown_peer == 1
            # A removed member saying hello again is refused, and not re-learned.
            b.set_peer(1, (LOCAL, a.port))
            b.send(make_msg(2, 1, term=3))
            await eventually(lambda: a.statistics().refused >= 1 and b.statistics().refused >= 1)
            assert a.statistics().received == 0
            assert a.peer_addresses() == {}


def test_send_drops_when_the_queue_is_full_or_the_peer_is_unknown() -> None:
    a = transport(1, {2: (LOCAL, 9)}, queue_size=4)
    for term in range(10):
        a.send(make_msg(1, 2, term))
    a.send(make_msg(1, 3))
    stats = a.statistics()
    assert stats.dropped_queue_full == 6
    assert stats.dropped_unknown_peer == 1


async def test_full_inbound_drops_instead_of_blocking() -> None:
    with trio.fail_after(10):
        a, b = transport(1), transport(2, queue_size=3)
        async with running(a, b):
            a.set_peer(2, (LOCAL, b.port))
            for term in range(10):
                a.send(make_msg(1, 2, term))
            await eventually(lambda: b.statistics().dropped_inbound_full == 7)
            assert b.statistics().received == 3
            assert [(await b.inbound.receive()).term for _ in range(3)] == [0, 1, 2]


# ---------------------------------------------------------------------------- hostile peers


async def test_garbage_hello_closes_the_connection(caplog: pytest.LogCaptureFixture) -> None:
    with trio.fail_after(10):
        b = transport(2)
        async with running(b):
            for junk in (
                encode_frame(b"\xc1garbage"),
                encode_frame(msgpack.packb([1, 2])),
                hello(2),
                b"\xde\xad\xbe\xef" * 100,
            ):
                stream = await trio.open_tcp_stream(LOCAL, b.port)
                await stream.send_all(junk)
                await expect_closed(stream)
                await stream.aclose()
            assert len(warnings_about(caplog, "bad hello")) == 3
            assert len(warnings_about(caplog, "exceeds the limit")) == 1
            assert b.statistics().dropped_bad_frame == 4
            await _still_delivers(b)


async def test_oversized_frame_closes_the_connection(caplog: pytest.LogCaptureFixture) -> None:
    with trio.fail_after(10):
        b = transport(2, max_frame=2048)
        async with running(b):
            stream = await trio.open_tcp_stream(LOCAL, b.port)
            await stream.send_all(hello(7) + frame_of(make_msg(7, 2, term=1)))
            assert (await b.inbound.receive()).term == 1
            await stream.send_all(b"\x00\x00\x08\x01")  # announces 2049 bytes: never sent
            await expect_closed(stream)
            await stream.aclose()
            assert warnings_about(caplog, "exceeds the limit")
            assert b.statistics().dropped_bad_frame == 1
            await _still_delivers(b)


async def test_undecodable_frames_are_dropped_and_the_connection_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with trio.fail_after(10):
        b = transport(2)
        async with running(b):
            unknown_type = msgpack.packb(
                [99, 2, 7, 1, 0, 0, [], 0, False, 0, None, b""], use_bin_type=True
            )
            stream = await trio.open_tcp_stream(LOCAL, b.port)
            await stream.send_all(
                hello(7)
                + encode_frame(unknown_type)
                + encode_frame(b"\xc1")
                + encode_frame(b"")
                + frame_of(make_msg(7, 2, term=4))
            )
            assert (await b.inbound.receive()).term == 4
            assert warnings_about(caplog, "unknown message type 99")
            assert len(warnings_about(caplog, "undecodable")) == 3
            assert b.statistics().dropped_bad_frame == 3
            await stream.aclose()


async def test_misrouted_messages_are_dropped(caplog: pytest.LogCaptureFixture) -> None:
    with trio.fail_after(10):
        b = transport(2)
        async with running(b):
            stream = await trio.open_tcp_stream(LOCAL, b.port)
            await stream.send_all(
                hello(7)
                + frame_of(make_msg(8, 2, term=1))  # not who it said it was
                + frame_of(make_msg(7, 3, term=2))  # not for us
                + frame_of(make_msg(7, 2, term=3))
            )
            assert (await b.inbound.receive()).term == 3
            assert len(warnings_about(caplog, "on the connection of peer 7")) == 2
            stats = b.statistics()
            assert (stats.dropped_misrouted, stats.received) == (2, 1)
            await stream.aclose()


async def test_silent_connection_is_closed_after_the_hello_timeout(
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(peerinbound, "HELLO_TIMEOUT", 0.05)
    with trio.fail_after(10):
        b = transport(2)
        async with running(b):
            stream = await trio.open_tcp_stream(LOCAL, b.port)
            await stream.send_all(hello(7)[:3])  # a partial hello does not buy more time
            await expect_closed(stream)
            await stream.aclose()
            assert warnings_about(caplog, "no hello")
            await _still_delivers(b)


async def _still_delivers(b: PeerTransport) -> None:
    a = transport(1, {2: (LOCAL, b.port)})
    async with running(a):
        a.send(make_msg(1, 2, term=99))
        assert (await b.inbound.receive()).term == 99


# ---------------------------------------------------------------------------- fault injection


def _plans(seed: int, n: int = 300) -> list[list[float]]:
    faults = FaultInjector(random.Random(seed))
    faults.drop_rate, faults.dup_rate, faults.delay = 0.2, 0.3, (0.01, 0.5)
    return [faults.plan(make_msg(1, 2, term)) for term in range(n)]


def test_fault_plans_are_deterministic_for_a_seed() -> None:
    assert _plans(42) == _plans(42)
    assert _plans(42) != _plans(43)
    plans = _plans(42)
    counts = {k: sum(len(p) == k for p in plans) for k in (0, 1, 2)}
    assert all(counts.values())  # drops, singles and duplicates all happen
    assert all(0.01 <= d <= 0.5 for p in plans for d in p)


def test_fault_rates_at_the_extremes() -> None:
    faults = FaultInjector(random.Random(1))
    assert faults.plan(make_msg(1, 2)) == [0.0]
    faults.drop_rate = 1.0
    assert all(faults.plan(make_msg(1, 2)) == [] for _ in range(50))
    faults.drop_rate, faults.dup_rate = 0.0, 1.0
    assert all(faults.plan(make_msg(1, 2)) == [0.0, 0.0] for _ in range(50))


def test_partition_isolate_and_heal() -> None:
    faults = FaultInjector(random.Random(1))
    faults.partition({1, 2}, {3})
    assert faults.plan(make_msg(1, 2)) == [0.0]
    assert faults.plan(make_msg(2, 1)) == [0.0]
    assert faults.plan(make_msg(1, 3)) == []
    assert faults.plan(make_msg(3, 2)) == []
    assert faults.plan(make_msg(4, 1)) == []  # in no group: cut off
    faults.isolate(2)
    assert faults.plan(make_msg(1, 2)) == []
    faults.drop_rate, faults.dup_rate, faults.delay = 0.5, 0.5, (1.0, 2.0)
    faults.heal()
    assert (faults.drop_rate, faults.dup_rate, faults.delay) == (0.0, 0.0, (0.0, 0.0))
    assert all(faults.plan(make_msg(f, t)) == [0.0] for f in (1, 2, 3, 4) for t in (1, 2, 3))


def test_fault_settings_are_validated() -> None:
    faults = FaultInjector(random.Random(1))
    with pytest.raises(ValueError, match="drop_rate"):
        faults.drop_rate = 1.5
    with pytest.raises(ValueError, match="dup_rate"):
        faults.dup_rate = -0.1
    with pytest.raises(ValueError, match="delay"):
        faults.delay = (0.2, 0.1)


async def test_partitioned_messages_never_arrive_and_heal_restores_flow() -> None:
    with trio.fail_after(10):
        faults = FaultInjector(random.Random(7))
        a, b = transport(1, faults=faults), transport(2, faults=faults)
        async with running(a, b):
            a.set_peer(2, (LOCAL, b.port))
            faults.partition({1}, {2})
            a.send(make_msg(1, 2, term=1))
            faults.heal()
            faults.isolate(1)
            a.send(make_msg(1, 2, term=2))
            faults.heal()
            a.send(make_msg(1, 2, term=3))
            # Same connection, in order: had 1 or 2 got through they would come first.
            assert (await b.inbound.receive()).term == 3
            assert a.statistics().dropped_faults == 2


async def test_injected_delay_and_duplication_deliver_every_copy() -> None:
    with trio.fail_after(10):
        faults = FaultInjector(random.Random(7))
        faults.dup_rate, faults.delay = 1.0, (0.001, 0.03)
        a, b = transport(1, faults=faults), transport(2)
        async with running(a, b):
            a.set_peer(2, (LOCAL, b.port))
            for term in range(20):
                a.send(make_msg(1, 2, term))
            terms = sorted([(await b.inbound.receive()).term for _ in range(40)])
            assert terms == sorted(list(range(20)) * 2)
