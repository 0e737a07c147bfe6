"""An in-process server (single Raft member, real SQLite, real hypercorn on loopback) for API
tests, and an httpx client logged in as admin through the kubeconfig the server wrote."""

from __future__ import annotations

import base64
import ssl
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import trio
import yaml
from cryptography import x509

from orchestrator.agent.service import AgentConfig
from orchestrator.api.apiserver import ApiOptions
from orchestrator.api.auth.renewal import RenewalConfig
from orchestrator.raft.node import NodeConfig
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
