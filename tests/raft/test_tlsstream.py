"""`TLSStream`: the thin TLS stream of the peer and client ports, over an in-memory transport.

What it promises beyond "it is TLS": a read returns every record already received (not one
record per call), a write is one transport send, a failed handshake tells the other side why,
and its errors read as trio.SSLStream's (a clean close is EOF, a bare TCP EOF is broken).
"""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
import trio
import trio.testing
from pkikit import client_context, server_pki

from orchestrator.raft.tlsstream import TLSStream, tls_alert, tls_reason
from orchestrator.security.peercerts import peer_server_context


class _Counting(trio.abc.Stream):
    """A transport stream that counts its sends."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self.sends = 0

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.sends += 1
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


def _contexts(tmp_path: Path, *, client_cert: bool = True) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    p = server_pki(tmp_path, 1)
    if client_cert:
        client = client_context(tmp_path, p.admin_cert, p.admin_key)
    else:
        client = client_context(tmp_path, None, None)
    return peer_server_context(tmp_path), client


async def _pair(
    tmp_path: Path, **kw: bool
) -> tuple[TLSStream, TLSStream, _Counting, trio.abc.Stream, trio.abc.Stream]:
    server_ctx, client_ctx = _contexts(tmp_path, **kw)
    a, b = trio.testing.memory_stream_pair()
    counting = _Counting(a)
    client = TLSStream(counting, client_ctx, server_side=False)
    server = TLSStream(b, server_ctx, server_side=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.do_handshake)
        nursery.start_soon(server.do_handshake)
    return client, server, counting, a, b


async def test_a_read_returns_every_record_received_and_a_write_is_one_send(
    tmp_path: Path,
) -> None:
    with trio.fail_after(10):
        client, server, counting, _, _ = await _pair(tmp_path)
        assert server.peer_certificate() is not None
        assert client.peer_certificate_fields() is not None
        payload = bytes(range(256)) * 400  # 100 KiB: seven TLS records
        sends = counting.sends
        await client.send_all(payload)
        assert counting.sends == sends + 1
        got = await server.receive_some()
        assert len(got) > 16384  # more than one record per read
        while len(got) < len(payload):
            got += await server.receive_some()
        assert got == payload


async def test_max_bytes_is_respected_and_the_rest_comes_next(tmp_path: Path) -> None:
    with trio.fail_after(10):
        client, server, _, _, _ = await _pair(tmp_path)
        await client.send_all(b"x" * 50_000)
        first = await server.receive_some(1000)
        assert first == b"x" * 1000
        rest = b""
        while len(rest) < 49_000:
            rest += await server.receive_some()
        assert rest == b"x" * 49_000


async def test_a_clean_close_is_eof_and_a_bare_eof_is_broken(tmp_path: Path) -> None:
    with trio.fail_after(10):
        client, server, _, _, _ = await _pair(tmp_path)
        await client.send_all(b"bye")
        await client.aclose()
        assert await server.receive_some() == b"bye"
        assert await server.receive_some() == b""

        client, server, _, a, _ = await _pair(tmp_path / "2")
        await a.aclose()  # the TCP connection ends without close_notify: a crash
        with pytest.raises(trio.BrokenResourceError) as info:
            await server.receive_some()
        assert tls_alert(info.value) is None  # gone, not refusing


async def test_a_refused_handshake_tells_the_other_side_why(tmp_path: Path) -> None:
    server_ctx, client_ctx = _contexts(tmp_path, client_cert=False)
    a, b = trio.testing.memory_stream_pair()
    client = TLSStream(a, client_ctx, server_side=False)
    server = TLSStream(b, server_ctx, server_side=True)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.do_handshake)  # TLS 1.3: the client finishes first
            with pytest.raises(trio.BrokenResourceError) as refused:
                await server.do_handshake()
        assert "CERTIFICATE" in tls_reason(refused.value)
        with pytest.raises(trio.BrokenResourceError) as told:
            await client.receive_some()
        alert = tls_alert(told.value)
        assert alert is not None
        assert "CERTIFICATE_REQUIRED" in alert


async def test_use_before_the_handshake_is_a_bug(tmp_path: Path) -> None:
    server_ctx, _ = _contexts(tmp_path)
    a, _ = trio.testing.memory_stream_pair()
    with pytest.raises(RuntimeError):
        await TLSStream(a, server_ctx, server_side=True).receive_some()


async def test_send_nowait_writes_at_once_and_backlogs_what_the_kernel_refuses(
    tmp_path: Path,
) -> None:
    """Over a socket: a small write goes to the kernel with no yield; a write larger than the
    socket's buffer leaves a backlog, which `flush` (or the next `send_all`) sends first, in
    order. Not over anything else, nor while a backlog waits."""
    server_ctx, client_ctx = _contexts(tmp_path)
    with trio.fail_after(10):
        a, b = trio.socket.socketpair()
        client = TLSStream(trio.SocketStream(a), client_ctx, server_side=False)
        server = TLSStream(trio.SocketStream(b), server_ctx, server_side=True)
        async with client, server:
            await _send_nowait_over(client, server)

        memory, _, _, _, _ = await _pair(tmp_path / "m")
        assert not memory.send_nowait(b"x")  # not a socket: the caller's writer sends it


async def _send_nowait_over(client: TLSStream, server: TLSStream) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.do_handshake)
        nursery.start_soon(server.do_handshake)
    assert client.send_nowait(b"hello")
    assert not client.backlogged
    assert await server.receive_some() == b"hello"

    big = bytes(range(256)) * 16384  # 4 MiB: more than a socket buffer takes at once
    assert client.send_nowait(big)
    assert client.backlogged
    assert not client.send_nowait(b"x")  # nothing overtakes the backlog

    got = bytearray()

    async def read(n: int) -> None:
        while len(got) < n:
            got.extend(await server.receive_some())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read, len(big) + 3)
        await client.flush()
        assert not client.backlogged
        await client.send_all(b"end")
    assert bytes(got) == big + b"end"
