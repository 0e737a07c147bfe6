"""`StoreClient`'s connection writer: the requests made together go out in one write; a request
whose frame never went out is retried (it certainly had no effect); a request given up before
its turn is not sent."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
import trio
import trio.testing

from orchestrator.raft.framing import FrameDecoder, encode_frame
from orchestrator.store import client as client_module
from orchestrator.store.client import _NOT_SENT, StoreClient, _Conn


async def _answer_everything(stream: trio.SocketStream, seen: list[list[Any]]) -> None:
    """A stand-in server: answers every request "ok" with its op name."""
    decoder = FrameDecoder()
    async with stream:
        while data := await stream.receive_some(65536):
            out = []
            for frame in decoder.receive_data(data):
                rid, op, args = msgpack.unpackb(frame)
                seen.append([op, *args])
                out.append(encode_frame(msgpack.packb([rid, "ok", op])))
            await stream.send_all(b"".join(out))


async def test_requests_made_together_go_out_in_one_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[list[Any]] = []
    writes: list[trio.SocketStream] = []
    real = trio.SocketStream.send_all

    async def counting(self: trio.SocketStream, data: bytes | bytearray | memoryview) -> None:
        writes.append(self)
        await real(self, data)

    async with trio.open_nursery() as servers:
        listeners = await servers.start(trio.serve_tcp, _answer_everything_with(seen), 0)
        port = listeners[0].socket.getsockname()[1]
        async with StoreClient([f"127.0.0.1:{port}"]) as kv:
            assert await kv.call("get", "first") == "get"  # connected
            monkeypatch.setattr(trio.SocketStream, "send_all", counting)
            results: dict[int, Any] = {}

            async def put(i: int) -> None:
                results[i] = await kv.call("put", f"/k{i}", b"v")

            with trio.fail_after(10):
                async with trio.open_nursery() as tasks:
                    for i in range(20):
                        tasks.start_soon(put, i)
            assert results == {i: "put" for i in range(20)}
            ours = kv._conns[f"127.0.0.1:{port}"].stream
            assert [w for w in writes if w is ours] == [ours]  # all twenty frames in one write
            assert sorted(s[1] for s in seen[1:]) == sorted(f"/k{i}" for i in range(20))
        servers.cancel_scope.cancel()


def _answer_everything_with(seen: list[list[Any]]) -> Any:
    async def handler(stream: trio.SocketStream) -> None:
        await _answer_everything(stream, seen)

    return handler


async def test_frames_not_sent_when_the_connection_ends_are_answered_not_sent() -> None:
    ours, theirs = trio.testing.memory_stream_pair()
    conn = _Conn(ours)  # type: ignore[arg-type]  # a memory stream is a stream all the same
    slot: tuple[trio.Event, list[Any]] = (trio.Event(), [])
    conn.pending[7] = slot
    conn.send(7, b"frame")  # queued; no writer runs
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.reader)
        await theirs.aclose()  # the server went away
    assert slot[0].is_set()
    assert slot[1] == [_NOT_SENT]
    with pytest.raises(OSError, match="closed"):
        conn.send(8, b"later")  # closed: nothing is queued any more


async def test_a_request_given_up_before_its_turn_is_not_sent() -> None:
    ours, theirs = trio.testing.memory_stream_pair()
    conn = _Conn(ours)  # type: ignore[arg-type]
    conn.pending[1] = (trio.Event(), [])
    conn.pending[2] = (trio.Event(), [])
    conn.send(1, b"one")
    conn.send(2, b"two")
    del conn.pending[1]  # its caller was cancelled meanwhile
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.writer)
        with trio.fail_after(10):
            assert await theirs.receive_some(100) == b"two"
        nursery.cancel_scope.cancel()


async def test_a_call_whose_frame_was_not_sent_is_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first connection ends before the writer sends anything: the call gets OSError from
    that attempt (nothing sent) and `call` tries again, on a new connection."""
    seen: list[list[Any]] = []
    real_writer = _Conn.writer
    first = [True]

    async def writer(self: _Conn) -> None:
        if first[0]:
            first[0] = False
            await self.stream.aclose()  # dies before writing: the reader ends, queue unsent
            return
        await real_writer(self)

    monkeypatch.setattr(client_module._Conn, "writer", writer)
    async with trio.open_nursery() as servers:
        listeners = await servers.start(trio.serve_tcp, _answer_everything_with(seen), 0)
        port = listeners[0].socket.getsockname()[1]
        async with StoreClient([f"127.0.0.1:{port}"], retry_delay=0.001) as kv:
            with trio.fail_after(10):
                assert await kv.call("put", "/k", b"v") == "put"
        assert seen == [["put", "/k", b"v"]]  # sent once
        servers.cancel_scope.cancel()
