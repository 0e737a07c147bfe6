"""The API tests' harness: `orchestrator.testing.apiserver` (an in-process server, single Raft
member, real SQLite, real hypercorn on loopback, and an httpx client logged in as admin through
the kubeconfig the server wrote), re-exported for the tests, plus what only these tests need.

`live_server()` runs one in its own thread (its own trio loop) for synchronous tests
(Hypothesis drives those): a blocking client, and the store read through `trio.from_thread`.
`peer_certificate()` reads the certificate a TLS port serves."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import trio
from cryptography import x509

from orchestrator.testing.apiserver import Harness, api_server, read_kubeconfig

__all__ = ["Harness", "Live", "api_server", "live_server", "peer_certificate", "read_kubeconfig"]


async def peer_certificate(
    port: int, ca_pem: bytes, client_pair: tuple[Path, Path] | None = None
) -> x509.Certificate:
    """The certificate a NEW TLS connection to 127.0.0.1:`port` is served, verified against
    `ca_pem`; `client_pair` (cert, key files) for endpoints that require one."""
    ctx = ssl.create_default_context(cadata=ca_pem.decode())
    if client_pair is not None:
        ctx.load_cert_chain(*client_pair)
    with trio.fail_after(10):
        stream = await trio.open_ssl_over_tcp_stream("127.0.0.1", port, ssl_context=ctx)
        async with stream:
            await stream.do_handshake()
            der = stream.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


class Live:
    """A server running in its own thread (`live_server`), its trio token and a blocking
    client logged in as admin."""

    def __init__(self, harness: Harness, token: trio.lowlevel.TrioToken, http: httpx.Client):
        self.harness, self.token, self.http = harness, token, http

    def __repr__(self) -> str:  # Hypothesis prints it with every falsifying example
        return f"Live({self.harness.url})"

    def revision(self) -> int:
        store = self.harness.server.store
        return int(trio.from_thread.run(store.current_revision, trio_token=self.token))

    def snapshot(self, prefix: str = "/registry/") -> tuple[int, dict[str, tuple[int, bytes]]]:
        """The store revision and every key under `prefix` with its mod_revision and the exact
        bytes stored: what a refused request must leave as it was."""
        store = self.harness.server.store

        async def read() -> tuple[int, dict[str, tuple[int, bytes]]]:
            out: dict[str, tuple[int, bytes]] = {}
            token: str | None = None
            while True:
                page = await store.list(prefix, continue_token=token)
                for kv in page.kvs:
                    out[kv.key] = (kv.mod_revision, kv.value)
                token = page.continue_token
                if token is None:
                    return page.revision, out

        return trio.from_thread.run(read, trio_token=self.token)


@contextmanager
def live_server(*, controllers: bool = False) -> Iterator[Live]:
    """`api_server` in a thread of its own, for synchronous tests; no controllers by default,
    so that nothing but the test writes (a refused request must leave the store alone)."""
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        async with api_server(controllers=controllers) as h:
            box["harness"], box["token"] = h, trio.lowlevel.current_trio_token()
            box["stop"] = trio.Event()
            ready.set()
            await box["stop"].wait()

    def run() -> None:
        try:
            trio.run(main)
        except BaseException as exc:  # handed to the test thread below
            box["error"] = exc
            ready.set()

    thread = threading.Thread(target=run, name="live-api-server", daemon=True)
    thread.start()
    assert ready.wait(60), "the in-process server did not start within 60 s"
    if "error" in box:
        raise box["error"]
    h: Harness = box["harness"]
    verify = ssl.create_default_context(cadata=h.ca_pem.decode())
    with httpx.Client(
        base_url=h.url, headers={"Authorization": f"Bearer {h.token}"}, verify=verify, timeout=30
    ) as http:
        live = Live(h, box["token"], http)
        try:
            yield live
        finally:
            trio.from_thread.run_sync(box["stop"].set, trio_token=live.token)
            thread.join(30)
    if "error" in box:
        raise box["error"]
