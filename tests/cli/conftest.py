"""The kubectl-like commands run against the real API server, in process.

`api` starts `orchestrator.testing.apiserver.api_server` (one Raft member on a temporary store,
HTTPS on loopback, no controllers: nothing but the test writes) and wraps the network with a
`Recorder`, so a test can say both what a command printed and what it sent. `run(*argv)` parses
`argv` with the `orchestrator` parser and runs the command in process with the server's admin
kubeconfig.
"""

from __future__ import annotations

import io
import json
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from orchestrator.cli import kube
from orchestrator.cli.main import _build_parser
from orchestrator.testing.apiserver import Harness, api_server

Obj = dict[str, Any]
Run = Callable[..., Awaitable[tuple[int, str, str]]]

PLURALS = {
    "Pod": "pods",
    "Event": "events",
    "Namespace": "namespaces",
    "Deployment": "deployments",
    "ReplicaSet": "replicasets",
}
CLUSTER_SCOPED = {"Namespace"}


class Recorder(httpx.AsyncBaseTransport):
    """The network to the server, recording every request. `tables=False` plays a server that
    does not serve Tables: the `as=Table` Accept is replaced by plain JSON before it is sent."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.requests: list[httpx.Request] = []
        self.tables = True
        # Awaited before a watch request is sent: what happens between a list and its watch.
        self.before_watch: Callable[[httpx.Request], Awaitable[None]] | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if not self.tables and "as=Table" in request.headers.get("accept", ""):
            request.headers["accept"] = "application/json"
        self.requests.append(request)
        if self.before_watch is not None and request.url.params.get("watch") == "true":
            await self.before_watch(request)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        """Kept open: every command's client closes its transport on exit; the fixture closes
        the inner one at the end of the test."""

    def bodies(self, method: str) -> list[tuple[httpx.Request, Any]]:
        """The requests of one method, each with its JSON body (None if it had none)."""
        return [
            (r, json.loads(r.content) if r.content else None)
            for r in self.requests
            if r.method == method
        ]


def path_of(obj: Obj, *, named: bool = False) -> str:
    """The collection URL of `obj` (with `named`, the object's own URL)."""
    group_version = obj["apiVersion"]
    prefix = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    meta = obj["metadata"]
    ns = "" if obj["kind"] in CLUSTER_SCOPED else f"/namespaces/{meta.get('namespace', 'default')}"
    url = f"{prefix}{ns}/{PLURALS[obj['kind']]}"
    return f"{url}/{meta['name']}" if named else url


class CliApi:
    """The running server (`h`), the recorded network (`net`) and helpers to seed objects."""

    def __init__(self, h: Harness, net: Recorder) -> None:
        self.h = h
        self.net = net

    @property
    def requests(self) -> list[httpx.Request]:
        return self.net.requests

    def bodies(self, method: str) -> list[tuple[httpx.Request, Any]]:
        return self.net.bodies(method)

    async def add(self, obj: Obj) -> Obj:
        """Create `obj` as the admin (its namespace first, if missing); returns what was stored."""
        ns = obj["metadata"].get("namespace", "default")
        if obj["kind"] not in CLUSTER_SCOPED and ns != "default":
            r = await self.h.client.post("/api/v1/namespaces", json={"metadata": {"name": ns}})
            assert r.status_code in (201, 409), r.text
        r = await self.h.client.post(path_of(obj), json=obj)
        assert r.status_code == 201, r.text
        out: Obj = r.json()
        return out

    async def find(self, obj: Obj) -> Obj:
        r = await self.h.client.get(path_of(obj, named=True))
        assert r.status_code == 200, r.text
        out: Obj = r.json()
        return out

    async def patch_status(self, obj: Obj, status: Obj) -> Obj:
        """Merge-patch the status subresource (no controllers run: tests play them)."""
        r = await self.h.client.patch(
            path_of(obj, named=True) + "/status",
            json={"status": status},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert r.status_code == 200, r.text
        out: Obj = r.json()
        return out


@pytest.fixture
async def api() -> AsyncIterator[CliApi]:
    async with api_server(controllers=False) as h:
        ctx = ssl.create_default_context(cadata=h.ca_pem.decode())
        net = Recorder(httpx.AsyncHTTPTransport(verify=ctx))
        yield CliApi(h, net)
        await net.inner.aclose()


@pytest.fixture
def run(api: CliApi) -> Run:
    async def go(
        *argv: str, kubeconfig: Path | None = None, out: io.StringIO | None = None
    ) -> tuple[int, str, str]:
        """`kubeconfig`: instead of the admin's; `out`: print there (to read it while the
        command runs)."""
        cfg = kubeconfig or api.h.kubeconfig
        args = _build_parser().parse_args([*argv, "--kubeconfig", str(cfg)])
        out, err = out or io.StringIO(), io.StringIO()
        with trio.fail_after(20):
            rc = await kube.run(args, out=out, err=err, transport=api.net)
        return rc, out.getvalue(), err.getvalue()

    return go
