"""An in-process server (single Raft member, real SQLite, real hypercorn on loopback) for API
tests, and an httpx client logged in as admin through the kubeconfig the server wrote.

`live_server()` runs one in its own thread (its own trio loop) for synchronous tests
(Hypothesis drives those): a blocking client, and the store read through `trio.from_thread`."""

from __future__ import annotations

import base64
import ssl
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import trio
import yaml
from cryptography import x509

from orchestrator.agent.service import AgentConfig
from orchestrator.apiserver.server import ApiOptions
from orchestrator.raft.node import NodeConfig
from orchestrator.security.renewal import RenewalConfig
from orchestrator.server import Server, ServerOptions


@dataclass
class Harness:
    server: Server
    data_dir: Path
    url: str
    token: str
    ca_pem: bytes
    client: httpx.AsyncClient

    @property
    def kubeconfig(self) -> Path:
        return self.data_dir / "kubeconfig.yaml"

    async def wait_ready(self, within: float = 30.0) -> None:
        with trio.fail_after(within):
            while True:
                r = await self.client.get("/api/v1/namespaces/default")
                if r.status_code == 200:
                    return
                await trio.sleep(0.02)


def read_kubeconfig(path: Path) -> tuple[str, str, bytes]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    cluster = doc["clusters"][0]["cluster"]
    ca = (
        base64.b64decode(cluster.get("certificate-authority-data", ""))
        if cluster.get("certificate-authority-data")
        else b""
    )
    return cluster["server"], doc["users"][0]["user"].get("token", ""), ca


@asynccontextmanager
async def api_server(
    data_dir: Path | None = None,
    *,
    tls: bool = True,
    controllers: bool = True,
    agent: AgentConfig | None = None,
    cert_renewal: RenewalConfig | None = None,
) -> AsyncIterator[Harness]:
    """`agent`: run the server's embedded node agent (its data in `<data_dir>/agent`);
    `cert_renewal`: the certificate renewal loop's intervals and wall clock."""
    with tempfile.TemporaryDirectory() as tmp:
        root = data_dir or Path(tmp)
        node = NodeConfig(
            node_id=1,
            data_dir=root,
            peer_listen="127.0.0.1:0",
            founders={1: "127.0.0.1:0"},
            tick_interval=0.01,
        )
        opts = ServerOptions(
            node,
            "127.0.0.1:0",
            token="t",
            api=ApiOptions(
                root,
                "127.0.0.1:0",
                tls=tls,
                cluster_token="t",
                node_name=agent.node_name if agent else "",
                cert_renewal=cert_renewal or RenewalConfig(),
            ),
            controllers=controllers,
            agent=agent,
        )
        server = Server(opts)
        async with trio.open_nursery() as nursery:
            with trio.fail_after(30):
                await nursery.start(server.run)
            url, token, ca = read_kubeconfig(root / "kubeconfig.yaml")
            verify: ssl.SSLContext | bool = False
            if url.startswith("https"):
                verify = ssl.create_default_context(cadata=ca.decode())
            async with httpx.AsyncClient(
                base_url=url,
                headers={"Authorization": f"Bearer {token}"},
                verify=verify,
                timeout=30,
            ) as client:
                h = Harness(server, root, url, token, ca, client)
                await h.wait_ready()
                yield h
            nursery.cancel_scope.cancel()


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
