"""A real API server in this process, for tests: `async with api_server() as h:`.

It is the whole server, not a fake: one Raft member on a temporary SQLite store, the API on a
loopback port (HTTPS by default, with the cluster's own CA), the controllers (unless
`controllers=False`) and, when asked, the embedded node agent. Nothing is mocked, so a test sees
the real validation, defaulting, merge and resourceVersion behaviour.

What a test gets (`Harness`):

* `client`: an `httpx.AsyncClient` on the server's URL, logged in as the cluster admin (the bearer
  token and CA come from the `kubeconfig.yaml` the server writes, as a user's would);
* `kubeconfig`: that file, for anything that reads a kubeconfig (`orchestrator.client`,
  the CLI, a user's controller run as in production);
* `api` and `ADMIN`: the in-process `Api` and the admin user, for the in-process controller
  client (`InProcessClient(h.api, ADMIN)`), which skips HTTP;
* `server`: the `orchestrator.server.Server` itself (its store, its Raft node).

Invariants: the server is started and answers for the `default` namespace before the body runs;
it is cancelled, and its temporary directory removed, when the body leaves. Every wait has a
deadline (`trio.fail_after`), so a server that does not come up fails the test instead of
hanging it.
"""

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

from orchestrator.agent.service import AgentConfig
from orchestrator.apiserver.flowcontrol import FlowControlConfig
from orchestrator.apiserver.resources import Api
from orchestrator.apiserver.server import ApiOptions
from orchestrator.controllers.runtime import ControllerOptions
from orchestrator.network.settings import NetworkSettings
from orchestrator.raft.node import NodeConfig
from orchestrator.security.authn import User
from orchestrator.security.renewal import RenewalConfig
from orchestrator.server import Server, ServerOptions

__all__ = ["ADMIN", "Harness", "api_server", "read_kubeconfig"]

ADMIN = User("admin", ("system:masters", "system:authenticated"))
"""A cluster admin (group `system:masters`: every verb) for the in-process API's calls."""


@dataclass
class Harness:
    """A running in-process server (`api_server`) and an admin HTTP client on it."""

    server: Server
    data_dir: Path
    url: str
    token: str
    ca_pem: bytes
    client: httpx.AsyncClient

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig the server wrote (server URL, CA, token)."""
        return self.data_dir / "kubeconfig.yaml"

    @property
    def api(self) -> Api:
        """The in-process API (for `InProcessClient(h.api, ADMIN)`)."""
        assert self.server.api is not None, "the server runs no API"
        return self.server.api.api

    async def wait_namespace(self, name: str, within: float = 30.0) -> None:
        """Until namespace `name` exists: the server creates its system namespaces
        (`kube-system`, `kube-node-lease`, ...) just after it starts; simulated nodes need
        `kube-node-lease` for their Leases."""
        with trio.fail_after(within):
            url = f"/api/v1/namespaces/{name}"
            while (await self.client.get(url)).status_code != 200:  # noqa: ASYNC110  (polling)
                await trio.sleep(0.02)

    async def wait_ready(self, within: float = 30.0) -> None:
        """Until the API answers for the `default` namespace (within `within` seconds)."""
        with trio.fail_after(within):
            while True:
                r = await self.client.get("/api/v1/namespaces/default")
                if r.status_code == 200:
                    return
                await trio.sleep(0.02)


def read_kubeconfig(path: Path) -> tuple[str, str, bytes]:
    """The server URL, bearer token and CA (PEM; empty if none) of a kubeconfig's first entries."""
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
    flowcontrol: FlowControlConfig | None = None,
    controller_options: ControllerOptions | None = None,
    network: NetworkSettings | None = None,
) -> AsyncIterator[Harness]:
    """Run a single-member server for the body of the `async with`.

    `data_dir`: keep its data there (default: a temporary directory); `tls`: serve HTTPS;
    `controllers`: run the controllers (off, nothing but the test writes); `agent`: run the
    server's embedded node agent (its data in `<data_dir>/agent`); `cert_renewal`: the
    certificate renewal loop's intervals and wall clock; `flowcontrol`: the overload gate's
    seats and levels (default: the server's); `controller_options`: the built-in
    controllers' settings (the node monitor's grace period, ...); `network`: the cluster's
    address plan (default: k3s's)."""
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
                flowcontrol=flowcontrol or FlowControlConfig(),
            ),
            controllers=controllers,
            controller_options=controller_options or ControllerOptions(),
            agent=agent,
            network=network or NetworkSettings.create(),
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
