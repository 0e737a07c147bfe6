"""TLS serving: the server certificate verifies against the cluster CA, and the app sees the
client certificate (or its absence) in `scope["extensions"]["tls"]`; plain HTTP works too."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from cryptography import x509
from cryptography.x509.oid import NameOID

from orchestrator.security import (
    client_cert_der,
    ensure_pki,
    issue_client_cert,
    serve,
    server_ssl_context,
)
from orchestrator.security.pki import Pki
from orchestrator.security.tls import Receive, Scope, Send


async def echo_app(scope: Scope, receive: Receive, send: Send) -> None:
    """Says what it was told about the connection."""
    if scope["type"] != "http":
        return
    der = client_cert_der(scope)
    cn = None
    if der is not None:
        cert = x509.load_der_x509_certificate(der)
        cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    body = {
        "scheme": scope["scheme"],
        "has_tls_extension": "tls" in (scope.get("extensions") or {}),
        "cn": cn,
        "path": scope["path"],
    }
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": json.dumps(body).encode()})


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return ensure_pki(tmp_path, [])


def client_context(pki: Pki, tmp_path: Path, cert: tuple[bytes, bytes] | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=pki.ca_pem.decode())
    if cert is not None:
        (tmp_path / "client.crt").write_bytes(cert[0])
        (tmp_path / "client.key").write_bytes(cert[1])
        ctx.load_cert_chain(tmp_path / "client.crt", tmp_path / "client.key")
    return ctx


@pytest.fixture
async def tls_port(pki: Pki) -> AsyncIterator[int]:
    async with trio.open_nursery() as nursery:
        port: int = await nursery.start(
            lambda task_status: serve(
                echo_app, port=0, ssl_context=server_ssl_context(pki), task_status=task_status
            )
        )
        yield port
        nursery.cancel_scope.cancel()


async def get(url: str, verify: ssl.SSLContext | bool) -> dict[str, Any]:
    with trio.fail_after(10):
        async with httpx.AsyncClient(verify=verify) as client:
            resp = await client.get(url)
            resp.raise_for_status()
            result: dict[str, Any] = resp.json()
            return result


async def test_tls_without_client_cert(pki: Pki, tls_port: int, tmp_path: Path) -> None:
    ctx = client_context(pki, tmp_path, None)
    body = await get(f"https://127.0.0.1:{tls_port}/healthz", ctx)
    assert body == {"scheme": "https", "has_tls_extension": True, "cn": None, "path": "/healthz"}
    body = await get(f"https://localhost:{tls_port}/x", ctx)  # DNS SAN as well as IP SAN
    assert body["path"] == "/x"


async def test_tls_with_client_cert(pki: Pki, tls_port: int, tmp_path: Path) -> None:
    ctx = client_context(pki, tmp_path, issue_client_cert(pki, "alice", ["devs"]))
    with trio.fail_after(10):
        async with httpx.AsyncClient(verify=ctx) as client:
            for path in ("/a", "/b"):  # both requests on one kept-alive connection
                body = (await client.get(f"https://127.0.0.1:{tls_port}{path}")).json()
                assert body == {
                    "scheme": "https",
                    "has_tls_extension": True,
                    "cn": "alice",
                    "path": path,
                }


async def test_foreign_client_cert_fails_the_handshake(
    pki: Pki, tls_port: int, tmp_path: Path
) -> None:
    other = ensure_pki(tmp_path / "other", [])
    ctx = client_context(pki, tmp_path, issue_client_cert(other, "mallory", ["system:masters"]))
    with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
        await get(f"https://127.0.0.1:{tls_port}/", ctx)
    # The server is still fine afterwards.
    body = await get(f"https://127.0.0.1:{tls_port}/", client_context(pki, tmp_path, None))
    assert body["cn"] is None


async def test_server_cert_is_not_trusted_without_the_ca(tls_port: int) -> None:
    with pytest.raises(httpx.ConnectError):
        await get(f"https://127.0.0.1:{tls_port}/", ssl.create_default_context())


async def test_plain_http() -> None:
    async with trio.open_nursery() as nursery:
        port: int = await nursery.start(
            lambda task_status: serve(echo_app, port=0, task_status=task_status)
        )
        body = await get(f"http://127.0.0.1:{port}/p", False)
        assert body == {"scheme": "http", "has_tls_extension": False, "cn": None, "path": "/p"}
        nursery.cancel_scope.cancel()


async def test_http2_when_asked(pki: Pki, tmp_path: Path) -> None:
    ctx = client_context(pki, tmp_path, issue_client_cert(pki, "bob", []))
    async with trio.open_nursery() as nursery:
        port: int = await nursery.start(
            lambda task_status: serve(
                echo_app,
                port=0,
                ssl_context=server_ssl_context(pki, http2=True),
                task_status=task_status,
            )
        )
        with trio.fail_after(10):
            async with httpx.AsyncClient(verify=ctx, http2=True) as client:
                resp = await client.get(f"https://127.0.0.1:{port}/h2")
        assert resp.http_version == "HTTP/2"
        assert resp.json()["cn"] == "bob"
        nursery.cancel_scope.cancel()
