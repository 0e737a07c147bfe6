"""Authentication and authorization over real HTTPS: 401/403 as Status objects, anonymous probes,
bearer tokens for admin, viewer and node identities, client certificates, node restriction."""

from __future__ import annotations

import ssl
import tempfile
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from apiharness import Harness, api_server

from orchestrator.security.pki import ensure_pki, issue_client_cert


@pytest.fixture
async def h() -> Any:
    async with api_server() as harness:
        yield harness


def client_for(
    h: Harness, token: str | None = None, cert: tuple[str, str] | None = None
) -> httpx.AsyncClient:
    ctx = ssl.create_default_context(cadata=h.ca_pem.decode())
    if cert is not None:
        ctx.load_cert_chain(*cert)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(base_url=h.url, headers=headers, verify=ctx, timeout=10)


def assert_status(r: httpx.Response, code: int, reason: str) -> dict[str, Any]:
    assert r.status_code == code, r.text
    body: dict[str, Any] = r.json()
    assert (body["kind"], body["status"], body["code"], body["reason"]) == (
        "Status",
        "Failure",
        code,
        reason,
    )
    return body


async def test_probes_are_anonymous_and_everything_else_needs_credentials(h: Harness) -> None:
    async with client_for(h) as anon:
        for path in ("/healthz", "/livez", "/readyz"):
            assert (await anon.get(path)).status_code == 200
        assert (await anon.get("/version")).json()["major"] == "1"
        assert_status(await anon.get("/api/v1/namespaces"), 401, "Unauthorized")
        assert_status(await anon.get("/apis"), 401, "Unauthorized")
    async with client_for(h, "not-a-token") as wrong:
        assert_status(await wrong.get("/api/v1/pods"), 401, "Unauthorized")


async def test_viewer_reads_but_cannot_write_or_read_secrets(h: Harness) -> None:
    assert h.server.api is not None
    assert h.server.api.tokens is not None
    token = await h.server.api.tokens.add("ann", ["system:viewers"])
    async with client_for(h, token) as viewer:
        assert (await viewer.get("/api/v1/namespaces/default/configmaps")).status_code == 200
        body = assert_status(
            await viewer.post(
                "/api/v1/namespaces/default/configmaps", json={"metadata": {"name": "x"}}
            ),
            403,
            "Forbidden",
        )
        assert 'User "ann" cannot create resource "configmaps"' in body["message"]
        assert_status(await viewer.get("/api/v1/namespaces/default/secrets"), 403, "Forbidden")
    assert (await h.client.get("/api/v1/namespaces/default/configmaps/x")).status_code == 404


async def test_client_certificate_signed_by_the_cluster_ca_logs_in(h: Harness) -> None:
    assert h.server.api is not None
    assert h.server.api.pki is not None
    cert, key = issue_client_cert(h.server.api.pki, "carol", ["system:masters"])
    with tempfile.TemporaryDirectory() as tmp:
        cert_path, key_path = trio.Path(tmp, "c.crt"), trio.Path(tmp, "c.key")
        await cert_path.write_bytes(cert)
        await key_path.write_bytes(key)
        async with client_for(h, cert=(str(cert_path), str(key_path))) as carol:
            r = await carol.post(
                "/api/v1/namespaces/default/configmaps",
                json={"metadata": {"name": "by-cert"}, "data": {"a": "1"}},
            )
            assert r.status_code == 201, r.text
            (entry,) = r.json()["metadata"]["managedFields"]
            assert (entry["manager"], entry["operation"]) == ("python-httpx", "Update")


async def test_nodes_write_only_their_own_objects(h: Harness) -> None:
    assert h.server.api is not None
    assert h.server.api.tokens is not None
    token = await h.server.api.tokens.add_node("edge-1")
    pod = {
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    other = {**pod, "metadata": {"name": "q"}}
    for p in (pod, other):
        r = await h.client.post("/api/v1/namespaces/default/pods", json=p)
        assert r.status_code == 201, r.text
    r = await h.client.post(
        "/api/v1/namespaces/default/pods/p/binding",
        json={
            "kind": "Binding",
            "apiVersion": "v1",
            "metadata": {"name": "p"},
            "target": {"kind": "Node", "name": "edge-1"},
        },
    )
    assert r.status_code == 201, r.text
    async with client_for(h, token) as node:
        r = await node.post("/api/v1/nodes", json={"metadata": {"name": "edge-1"}})
        assert r.status_code == 201, r.text
        assert_status(
            await node.post("/api/v1/nodes", json={"metadata": {"name": "edge-2"}}),
            403,
            "Forbidden",
        )
        status = {"status": {"phase": "Running"}}
        r = await node.patch(
            "/api/v1/namespaces/default/pods/p/status",
            json=status,
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert r.status_code == 200, r.text
        assert r.json()["status"]["phase"] == "Running"
        assert_status(
            await node.patch(
                "/api/v1/namespaces/default/pods/q/status",
                json=status,
                headers={"Content-Type": "application/merge-patch+json"},
            ),
            403,
            "Forbidden",
        )
    # Binding twice is a conflict.
    r = await h.client.post(
        "/api/v1/namespaces/default/pods/p/binding",
        json={"target": {"kind": "Node", "name": "edge-2"}},
    )
    assert_status(r, 409, "Conflict")


# --- the API listener's rows of the listener matrix (issue 16) ------------------------------
async def _write_pair(tmp: str, name: str, pair: tuple[bytes, bytes]) -> tuple[str, str]:
    cert_path, key_path = trio.Path(tmp, f"{name}.crt"), trio.Path(tmp, f"{name}.key")
    await cert_path.write_bytes(pair[0])
    await key_path.write_bytes(pair[1])
    return str(cert_path), str(key_path)


async def test_api_listener_matrix(h: Harness) -> None:
    """Over the real HTTPS listener: no credential -> 401 Status; a client certificate from
    another CA -> refused (at the handshake, or 401); a node's certificate -> 403 Status on
    what a node may not do, and it works where a node may."""
    assert h.server.api is not None
    assert h.server.api.pki is not None
    with tempfile.TemporaryDirectory() as tmp:
        async with client_for(h) as anonymous:
            for method, path in [
                ("GET", "/api/v1/namespaces"),
                ("GET", "/api/v1/namespaces/default/secrets"),
                ("POST", "/api/v1/namespaces/default/configmaps"),
                ("GET", "/apis"),
                ("GET", "/metrics"),
            ]:
                body = b'{"metadata":{"name":"x"}}' if method == "POST" else None
                r = await anonymous.request(
                    method, path, content=body, headers={"content-type": "application/json"}
                )
                assert_status(r, 401, "Unauthorized")

        other = ensure_pki(Path(tmp) / "other-ca", [])
        foreign = await _write_pair(
            tmp, "foreign", issue_client_cert(other, "mallory", ["system:masters"])
        )
        async with client_for(h, cert=foreign) as mallory:
            try:
                r = await mallory.get("/api/v1/namespaces/default/secrets")
            except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError):
                pass  # refused at the handshake: the certificate is not the cluster CA's
            else:
                assert_status(r, 401, "Unauthorized")

        node = await _write_pair(
            tmp,
            "node",
            issue_client_cert(h.server.api.pki, "system:node:edge-1", ["system:nodes"]),
        )
        async with client_for(h, cert=node) as agent:
            r = await agent.post("/api/v1/nodes", json={"metadata": {"name": "edge-1"}})
            assert r.status_code == 201, r.text  # its own Node: allowed
            for method, path, body in [
                ("POST", "/api/v1/nodes", {"metadata": {"name": "edge-2"}}),
                ("POST", "/api/v1/namespaces", {"metadata": {"name": "mine"}}),
                ("DELETE", "/api/v1/namespaces/default", None),
                ("POST", "/api/v1/namespaces/default/secrets", {"metadata": {"name": "s"}}),
                ("DELETE", "/apis/apps/v1/namespaces/default/deployments", None),
                (
                    "POST",
                    "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                    {"metadata": {"name": "things.example.com"}},
                ),
            ]:
                r = await agent.request(method, path, json=body)
                assert_status(r, 403, "Forbidden")
