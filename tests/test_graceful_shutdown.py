"""SIGTERM drains instead of cancelling (`orchestrator.server`, module doc).

In process: a draining API fails /readyz, ends its watches cleanly and refuses new connections;
a draining client port ends its watches with "canceled" (the client resumes elsewhere), answers
what it has read and refuses new connections.

A real server process (slow): SIGTERM while writers create ConfigMaps in a loop through the
Kubernetes API and one create is held half-sent. STOPPING=1 comes, the watch open at SIGTERM
ends, new connections are refused while the held request keeps the drain open, the held request
then completes (201), the process exits 0, and after a restart every ConfigMap acknowledged with
a 2xx is there; every request either got an answer or a connection error, none hung.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import httpx
import msgpack
import pytest
import trio
from api.apiharness import api_server, read_kubeconfig
from cluster import HOST, Cluster

from orchestrator.apiserver.app import ApiApp
from orchestrator.raft.framing import FrameDecoder, encode_frame
from orchestrator.raft.node import NodeConfig
from orchestrator.server import Server, ServerOptions

CONFIGMAPS = "/api/v1/namespaces/default/configmaps"


async def _refused(host: str, port: int) -> bool:
    try:
        stream = await trio.open_tcp_stream(host, port)
    except OSError:
        return True
    await stream.aclose()
    return False


async def _wait_refused(host: str, port: int) -> None:
    """Polls (the caller bounds it): the listener closes soon after the drain starts."""
    while True:
        if await _refused(host, port):
            return
        await trio.sleep(0.02)


# ---------------------------------------------------------------------------------- in process
async def test_readyz_fails_once_draining() -> None:
    app = ApiApp(cast(Any, None), None)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def readyz() -> tuple[int, bytes]:
        sent.clear()
        await app({"type": "http", "path": "/readyz", "method": "GET"}, receive, send)
        return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])

    assert await readyz() == (200, b"ok")
    app.draining.set()
    code, body = await readyz()
    assert code == 500
    assert b"shutting down" in body


async def test_api_drain_ends_watches_and_refuses_new_connections() -> None:
    with trio.fail_after(60):
        async with api_server(controllers=False) as h:
            api = h.server.api
            assert api is not None
            ended = trio.Event()
            lines: list[bytes] = []

            async def watch(task_status: trio.TaskStatus[None]) -> None:
                params = {"watch": "true"}
                async with h.client.stream("GET", CONFIGMAPS, params=params) as r:
                    assert r.status_code == 200
                    task_status.started()
                    async for line in r.aiter_lines():  # a clean end: no exception
                        lines.append(line.encode())
                ended.set()

            async with trio.open_nursery() as nursery:
                await nursery.start(watch)
                await h.server.drain()
                await ended.wait()
            assert lines == []  # nothing was written; the stream just ended
            assert await _refused(HOST, api.port)
            assert api.draining.is_set()


@asynccontextmanager
async def _store_only_server(root: Path) -> AsyncIterator[Server]:
    node = NodeConfig(
        node_id=1,
        data_dir=root,
        peer_listen="127.0.0.1:0",
        founders={1: "127.0.0.1:0"},
        tick_interval=0.01,
    )
    server = Server(ServerOptions(node, "127.0.0.1:0", token="t"))
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        yield server
        nursery.cancel_scope.cancel()


async def _frames(stream: trio.abc.Stream, decoder: FrameDecoder) -> list[list[Any]]:
    """The next frames (at least one); [] once the server closed the connection."""
    while True:
        data = await stream.receive_some(65536)
        if not data:
            return []
        frames = decoder.receive_data(data)
        if frames:
            return [msgpack.unpackb(f) for f in frames]


async def test_client_port_drain_cancels_watches_answers_requests_and_closes(
    tmp_path: Path,
) -> None:
    with trio.fail_after(30):
        async with _store_only_server(tmp_path) as server:
            port = server.service.port
            from orchestrator.store.client import ClientTLS

            tls = ClientTLS.from_data_dir(tmp_path).context()  # the admin cert the server wrote
            sock = await trio.open_tcp_stream(HOST, port)
            stream = trio.SSLStream(sock, tls, server_hostname=None)
            decoder = FrameDecoder(1 << 20)
            async with stream:
                # Elected and serving: a write answers "ok" (the store retries while electing).
                await stream.send_all(encode_frame(msgpack.packb([1, "put", ["k", b"v"]])))
                assert await _frames(stream, decoder) == [[1, "ok", True]]
                await stream.send_all(encode_frame(msgpack.packb([2, "watch", ["", 0, False]])))
                await stream.send_all(encode_frame(msgpack.packb([3, "put", ["k", b"w"]])))
                seen: set[tuple[int, str]] = set()
                while {(2, "watch"), (3, "ok")} - seen:  # the watch runs, the write is answered
                    seen |= {(f[0], f[1]) for f in await _frames(stream, decoder)}
                await server.service.drain()
                answers: list[list[Any]] = []
                while frames := await _frames(stream, decoder):
                    answers += frames
                canceled = [a for a in answers if a[1] == "canceled"]
                assert canceled == [[2, "canceled", ["server shutting down", 0]]]
            assert await _refused(HOST, port)


# ---------------------------------------------------------------------------------- a process
WRITERS = 6
ACKED_BEFORE_SIGTERM = 30  # creates acknowledged before the signal, so writes are in flight
HELD = "held"  # the ConfigMap whose create is held half-sent across the SIGTERM


def _configmap(name: str) -> bytes:
    return json.dumps({"metadata": {"name": name}, "data": {"k": "v" * 64}}).encode()


class Outcomes:
    """What each create got: a 2xx, another HTTP status, or a connection error (by type)."""

    def __init__(self) -> None:
        self.acked: set[str] = set()
        self.other_status: list[tuple[str, int, str]] = []
        self.errors: list[tuple[str, str]] = []
        self.first_ack = trio.Event()


async def _writer(
    k: int, url: str, verify: ssl.SSLContext, token: str, out: Outcomes, enough: trio.Event
) -> None:
    """Create ConfigMaps in a loop until a request fails to connect (the server drains)."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(verify=verify, headers=headers, timeout=30) as client:
        n = 0
        while True:
            name = f"w{k}-{n}"
            n += 1
            try:
                r = await client.post(url + CONFIGMAPS, content=_configmap(name))
            except httpx.TimeoutException as exc:  # a hung request: the test fails on it
                out.errors.append((name, f"timeout: {exc!r}"))
                return
            except httpx.TransportError as exc:  # refused, reset, closed: a clean end
                out.errors.append((name, type(exc).__name__))
                return
            if 200 <= r.status_code < 300:
                out.acked.add(name)
                if len(out.acked) >= ACKED_BEFORE_SIGTERM:
                    enough.set()
            else:
                out.other_status.append((name, r.status_code, r.text[:200]))


async def _held_request(url: str, verify: ssl.SSLContext, token: str) -> trio.SSLStream[Any]:
    """A create whose headers and half of whose body are sent: in progress until completed."""
    port = int(url.rsplit(":", 1)[1])
    tcp = await trio.open_tcp_stream(HOST, port)
    stream = trio.SSLStream(tcp, verify, server_hostname=HOST, https_compatible=True)
    body = _configmap(HELD)
    head = (
        f"POST {CONFIGMAPS} HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    await stream.send_all(head + body[: len(body) // 2])
    return stream


async def _complete_held(stream: trio.SSLStream[Any]) -> bytes:
    body = _configmap(HELD)
    await stream.send_all(body[len(body) // 2 :])
    response = b""
    while b"\r\n\r\n" not in response:
        data = await stream.receive_some(65536)
        assert data, f"the held request got no answer: {response!r}"
        response += data
    return response.split(b"\r\n", 1)[0]


async def _recv_until(sock: trio.socket.SocketType, messages: list[str], prefix: str) -> None:
    while True:
        msg = (await sock.recv(4096)).decode()
        messages.append(msg)
        if msg.startswith(prefix):
            return


@pytest.mark.slow
# A create cut off mid-request leaves httpx's request body generator unexhausted (httpx#3686).
@pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning")
async def test_sigterm_drains_in_flight_writes_then_exits_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = tempfile.mkdtemp(prefix="drn", dir="/tmp")  # AF_UNIX paths are short
    notify_path = os.path.join(d, "notify")
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    await sock.bind(notify_path)
    monkeypatch.setenv("NOTIFY_SOCKET", notify_path)  # the cluster's processes inherit it
    # A long drain bound: the held request, not the bound, decides when the drain ends.
    cluster = Cluster(tmp_path, size=1, api=True, extra_args=["--drain-timeout", "30s"])
    messages: list[str] = []
    try:
        with trio.fail_after(120), cluster:
            cluster.start()
            s = cluster.servers[0]
            assert s.proc is not None
            with trio.fail_after(60):  # READY=1: the signal handlers are in place
                await _recv_until(sock, messages, "READY=1")
            url, token, ca = read_kubeconfig(s.kubeconfig)
            verify = ssl.create_default_context(cadata=ca.decode())
            headers = {"Authorization": f"Bearer {token}"}
            out = Outcomes()
            enough = trio.Event()
            watch_ended = trio.Event()
            async with (
                httpx.AsyncClient(verify=verify, headers=headers, timeout=30) as client,
                trio.open_nursery() as nursery,
            ):

                async def watch(task_status: trio.TaskStatus[None]) -> None:
                    params = {"watch": "true", "resourceVersion": "0"}
                    async with client.stream("GET", url + CONFIGMAPS, params=params) as r:
                        assert r.status_code == 200
                        task_status.started()
                        async for _ in r.aiter_lines():  # ends cleanly, without an error
                            pass
                    watch_ended.set()

                while True:  # the namespace is created just after the API starts
                    r = await client.get(url + "/api/v1/namespaces/default")
                    if r.status_code == 200:
                        break
                    await trio.sleep(0.05)
                await nursery.start(watch)
                held = await _held_request(url, verify, token)
                for k in range(WRITERS):
                    nursery.start_soon(_writer, k, url, verify, token, out, enough)
                await enough.wait()

                s.expected_exit = True
                s.proc.send_signal(signal.SIGTERM)
                await _recv_until(sock, messages, "STOPPING=1")
                await watch_ended.wait()  # the watch does not hold the drain up
                await _wait_refused(HOST, s.api_port)  # no new connections...
                await _wait_refused(HOST, s.client_port)
                assert s.proc.poll() is None  # ...while the held request keeps it draining
                status_line = await _complete_held(held)
                await held.aclose()
                # the writers end when a request cannot connect; none may hang (fail_after)
            assert status_line.startswith(b"HTTP/1.1 201"), status_line
            out.acked.add(HELD)
            assert await trio.to_thread.run_sync(s.proc.wait, abandon_on_cancel=True) == 0
            s.exit_codes.append(0)
            assert len(out.errors) == WRITERS  # each writer ended on a connection error
            assert not [e for e in out.errors if e[1].startswith("timeout")], out.errors
            assert out.other_status == []
            log = cluster.log_text(0)
            assert "received SIGTERM: shutting down" in log
            assert "drained" in log

            monkeypatch.delenv("NOTIFY_SOCKET")
            cluster.restart(0)
            async with httpx.AsyncClient(verify=verify, headers=headers, timeout=30) as client:
                while True:
                    cluster.check_alive()
                    try:
                        r = await client.get(url + CONFIGMAPS)
                        if r.status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    await trio.sleep(0.1)
                stored = {item["metadata"]["name"] for item in r.json()["items"]}
            assert out.acked <= stored, sorted(out.acked - stored)  # nothing acknowledged lost
    finally:
        sock.close()
        shutil.rmtree(d, ignore_errors=True)
    assert len([m for m in messages if m.startswith("STOPPING=1")]) == 1
