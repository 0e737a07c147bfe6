"""Several API servers: `EndpointSet` (pure selection), `urls_from_endpoints`, and `RestClient`
failing over between servers (httpx.MockTransport: no network, no sleeps)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from orchestrator.client import PODS, ApiConnectionError, ApiException, ClientConfig, RestClient
from orchestrator.client.endpoints import EndpointSet, split_servers, urls_from_endpoints

A, B, C = "https://10.0.0.1:6443", "https://10.0.0.2:6443", "https://10.0.0.3:6443"


# ---- EndpointSet: pure ------------------------------------------------------------------------


def test_split_servers_normalizes_and_deduplicates() -> None:
    assert split_servers([f"{A}/, {B}", "", f" {A}", f"{C},"]) == [A, B, C]


def test_needs_a_server() -> None:
    with pytest.raises(ValueError, match="at least one"):
        EndpointSet([" ", ""])


def test_sticky_while_it_works() -> None:
    eps = EndpointSet([A, B, C])
    assert [eps.pick(now) for now in (0.0, 1.0, 2.0)] == [A, A, A]
    eps.succeeded(A)
    assert eps.pick(3.0) == A


def test_failure_moves_to_the_next_in_order_and_cools_down() -> None:
    eps = EndpointSet([A, B, C], backoff_initial=1.0, backoff_max=8.0)
    eps.failed(A, now=10.0)
    assert eps.pick(10.0) == B
    assert eps.current == B
    # A's cool-down ended, but the client stays on B (sticky) while B works
    assert eps.pick(20.0) == B
    eps.failed(B, now=20.0)
    assert eps.pick(20.0) == C  # cyclically after B
    eps.failed(C, now=20.0)
    assert eps.pick(20.0) == A  # A cooled down long ago
    assert eps.healthy(A, 20.0)
    assert not eps.healthy(B, 20.5)


def test_backoff_doubles_per_consecutive_failure_up_to_the_max() -> None:
    eps = EndpointSet([A, B], backoff_initial=1.0, backoff_max=4.0)
    for now, cool in ((0.0, 1.0), (10.0, 2.0), (20.0, 4.0), (30.0, 4.0)):
        eps.failed(A, now)
        assert not eps.healthy(A, now + cool - 0.01)
        assert eps.healthy(A, now + cool)
    eps.succeeded(A)  # an answer forgets the failures
    eps.failed(A, 100.0)
    assert eps.healthy(A, 101.0)


def test_all_cooling_down_picks_the_one_ready_first() -> None:
    eps = EndpointSet([A, B, C], backoff_initial=1.0, backoff_max=30.0)
    eps.failed(A, 0.0)
    eps.failed(A, 0.0)  # A: until 2.0
    eps.failed(B, 0.5)  # B: until 1.5
    eps.failed(C, 0.2)  # C: until 1.2
    assert eps.pick(0.6) == C
    eps.failed(C, 0.6)
    eps.failed(C, 0.6)  # C: until 2.6
    assert eps.pick(0.7) == B


def test_success_of_a_server_we_left_does_not_pull_us_back() -> None:
    eps = EndpointSet([A, B])
    eps.failed(A, 0.0)
    assert eps.pick(0.0) == B
    eps.succeeded(A)  # e.g. a late answer on a stream still open to A
    assert eps.pick(0.1) == B


def test_update_keeps_seeds_and_current_and_drops_forgotten_health() -> None:
    eps = EndpointSet([A], learnt=[B])
    assert eps.urls == [A, B]
    assert eps.update([A, B, C])  # A is a seed too: listed once
    assert eps.urls == [A, B, C]
    assert eps.learnt == [A, B, C]
    assert not eps.update([f"{A}/", B, C])  # the same list
    eps.failed(C, 0.0)
    assert eps.pick(0.0) == A
    eps.failed(A, 0.0)
    assert eps.pick(0.0) == B
    assert eps.update([C])  # B is no longer published: the current moves to the first known
    assert eps.urls == [A, C]
    assert eps.current == A
    assert eps.healthy(B, 0.0)  # forgotten, not cooling down


def test_unknown_url_failures_are_ignored() -> None:
    eps = EndpointSet([A])
    eps.failed("https://elsewhere:1", 0.0)
    assert eps.pick(0.0) == A


def test_urls_from_endpoints() -> None:
    ep: dict[str, Any] = {
        "subsets": [
            {
                "addresses": [{"ip": "10.0.0.1"}, {"ip": "fd00::2"}],
                "notReadyAddresses": [{"ip": "10.0.0.9"}],
                "ports": [{"name": "https", "port": 6443}],
            },
            {"addresses": [{"ip": "127.0.0.1"}], "ports": [{"name": "http", "port": 8080}]},
            {"addresses": [{"ip": "10.0.0.1"}], "ports": [{"name": "https", "port": 6443}]},
            {"addresses": [{"ip": "10.0.0.4"}]},  # no port: skipped
            "junk",
        ]
    }
    assert urls_from_endpoints(ep) == [
        "https://10.0.0.1:6443",
        "https://[fd00::2]:6443",
        "http://127.0.0.1:8080",
    ]
    assert urls_from_endpoints({}) == []
    assert urls_from_endpoints({"subsets": None}) == []


# ---- RestClient over several servers ----------------------------------------------------------


class Servers:
    """A fake network: each server (by URL) answers, refuses, or fails as told."""

    def __init__(self) -> None:
        self.refusing: set[str] = set()
        self.unavailable: set[str] = set()
        self.resetting: set[str] = set()
        self.seen: list[str] = []
        self.watch_streams: dict[str, trio.MemoryReceiveChannel[bytes]] = {}
        self.watch_send: dict[str, trio.MemorySendChannel[bytes]] = {}

    def handler(self, request: httpx.Request) -> httpx.Response:
        base = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        self.seen.append(base)
        if base in self.refusing:
            raise httpx.ConnectError("connection refused", request=request)
        if base in self.resetting:
            raise httpx.ReadError("connection reset", request=request)
        if base in self.unavailable:
            status = {"kind": "Status", "code": 503, "reason": "ServiceUnavailable"}
            return httpx.Response(503, json={**status, "message": "no quorum"})
        if request.url.params.get("watch") == "true":
            return httpx.Response(200, stream=_Stream(self._stream(base)))
        return httpx.Response(200, json={"kind": "PodList", "items": [], "server": base})

    def _stream(self, base: str) -> trio.MemoryReceiveChannel[bytes]:
        send, receive = trio.open_memory_channel[bytes](10)
        self.watch_send[base] = send
        return receive


class _Stream(httpx.AsyncByteStream):
    def __init__(self, receive: trio.MemoryReceiveChannel[bytes]) -> None:
        self.receive = receive

    async def __aiter__(self) -> Any:
        async for chunk in self.receive:
            yield chunk

    async def aclose(self) -> None:
        await self.receive.aclose()


def client(net: Servers, eps: EndpointSet) -> RestClient:
    cfg = ClientConfig(server=eps.urls[0], token="t")
    return RestClient(cfg, transport=httpx.MockTransport(net.handler), endpoints=eps)


async def test_a_refused_request_goes_to_the_next_server_at_once() -> None:
    net, eps = Servers(), EndpointSet([A, B, C])
    net.refusing = {A, B}
    with trio.fail_after(5):
        async with client(net, eps) as rest:
            doc = await rest.list(PODS, "default")
            assert doc["server"] == C
            assert net.seen == [A, B, C]
            assert eps.current == C
            await rest.list(PODS, "default")  # sticky
            assert net.seen[-1] == C


async def test_every_server_refusing_raises_naming_the_last_one() -> None:
    net, eps = Servers(), EndpointSet([A, B])
    net.refusing = {A, B}
    with trio.fail_after(5):
        async with client(net, eps) as rest:
            with pytest.raises(ApiConnectionError, match=r"10\.0\.0\.2"):
                await rest.list(PODS, "default")
    assert net.seen == [A, B]  # each tried once


async def test_reset_and_503_are_raised_and_the_next_request_moves_on() -> None:
    net, eps = Servers(), EndpointSet([A, B, C])
    net.resetting = {A}
    net.unavailable = {B}
    with trio.fail_after(5):
        async with client(net, eps) as rest:
            with pytest.raises(ApiConnectionError):
                await rest.list(PODS, "default")  # maybe sent: not retried here
            with pytest.raises(ApiException) as info:
                await rest.list(PODS, "default")
            assert info.value.code == 503
            assert (await rest.list(PODS, "default"))["server"] == C
    assert net.seen == [A, B, C]


# Streams left before their end: httpx's nested async generators warn at GC (encode/httpx#3686).
LEFT_EARLY = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@LEFT_EARLY
async def test_a_stream_on_a_failed_server_ends_so_the_watch_moves() -> None:
    net, eps = Servers(), EndpointSet([A, B])
    with trio.fail_after(5):
        async with client(net, eps) as rest:
            events: list[str] = []
            async with rest.watch(PODS, "default") as stream:
                net.watch_send[A].send_nowait(
                    json.dumps({"type": "ADDED", "object": {"metadata": {"name": "p"}}}).encode()
                    + b"\n"
                )
                async for _etype, obj in stream:
                    events.append(obj["metadata"]["name"])
                    break
            assert events == ["p"]

            ended: list[Exception] = []

            async def watch_on_a() -> None:
                try:
                    async with rest.watch(PODS, "default") as stream:
                        async for _ in stream:
                            pass
                except ApiConnectionError as exc:
                    ended.append(exc)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch_on_a)
                await trio.testing.wait_all_tasks_blocked()
                net.resetting = {A}  # A went silent: a plain request finds out
                with pytest.raises(ApiConnectionError):
                    await rest.list(PODS, "default")
            assert len(ended) == 1
            assert "streams are closed" in str(ended[0])
            # the next watch opens on B
            async with rest.watch(PODS, "default"):
                assert net.seen[-1] == B


async def test_a_single_server_client_is_unchanged() -> None:
    net = Servers()
    net.refusing = {A}
    cfg = ClientConfig(server=A, token="t")
    with trio.fail_after(5):
        async with RestClient(cfg, transport=httpx.MockTransport(net.handler)) as rest:
            with pytest.raises(ApiConnectionError, match=r"10\.0\.0\.1"):
                await rest.list(PODS, "default")
    assert net.seen == [A]
