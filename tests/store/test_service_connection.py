"""The client port's per-connection bound on requests in flight: requests read together are
taken without a yield each while the connection is under the bound, and wait for a slot once it
is at the bound; every request is answered either way."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio
from storekit import lone_store

from orchestrator.raft.framing import FrameDecoder, encode_frame
from orchestrator.store import service
from orchestrator.store.service import ClientService


@asynccontextmanager
async def lone_service(tmp_path: Path) -> AsyncIterator[ClientService]:
    """A one-server store that leads, with its client port on loopback; cancelled on exit."""
    async with lone_store(tmp_path) as store, trio.open_nursery() as nursery:
        svc = ClientService(store, "127.0.0.1:0")
        await nursery.start(svc.run)
        yield svc
        nursery.cancel_scope.cancel()


async def _pipeline(port: int, requests: list[list[Any]]) -> dict[int, tuple[str, Any]]:
    """Send every request in one write, then read an answer to each: {request id: (status,
    value)}."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(b"".join(encode_frame(msgpack.packb(r)) for r in requests))
        decoder = FrameDecoder()
        answers: dict[int, tuple[str, Any]] = {}
        with trio.fail_after(10):
            while len(answers) < len(requests):
                data = await stream.receive_some(65536)
                assert data, "the server closed the connection"
                for frame in decoder.receive_data(data):
                    rid, status, value = msgpack.unpackb(frame)
                    answers[rid] = (status, value)
        return answers


def _count_awaited_acquires(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    calls: list[object] = []
    real = trio.CapacityLimiter.acquire_on_behalf_of

    async def counting(self: trio.CapacityLimiter, borrower: object) -> None:
        calls.append(borrower)
        await real(self, borrower)

    monkeypatch.setattr(trio.CapacityLimiter, "acquire_on_behalf_of", counting)
    return calls


async def test_requests_under_the_bound_take_their_slot_without_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    awaited = _count_awaited_acquires(monkeypatch)
    async with lone_service(tmp_path) as svc:
        requests = [[i, "put", [f"/k{i}", b"v%d" % i]] for i in range(50)]
        requests.append([50, "get", ["/k7"]])  # not a fast-path write: a task of its own
        answers = await _pipeline(svc.port, requests)
        assert answers == {**{i: ("ok", True) for i in range(50)}, 50: ("ok", b"v7")}
        assert awaited == []  # no request waited (nor yielded) for its slot


async def test_requests_over_the_bound_wait_for_a_slot_and_are_all_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service, "MAX_IN_FLIGHT_PER_CONN", 2)
    awaited = _count_awaited_acquires(monkeypatch)
    async with lone_service(tmp_path) as svc:
        requests = [[i, "put", [f"/k{i}", b"v"]] for i in range(20)]
        answers = await _pipeline(svc.port, requests)
        assert answers == {i: ("ok", True) for i in range(20)}
        assert awaited  # the bound held: later requests waited for earlier ones
        assert await svc.store.current_revision() == 21
