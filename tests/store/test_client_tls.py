"""Mutual TLS on the store's client port (`store.service.ServiceTLS`, `StoreClient(tls=...)`).

Allowed: an admin certificate and a member's peer certificate of the cluster CA. Refused, with
nothing applied: no certificate, another CA's certificate, a node agent's certificate (same CA).
A server certificate of a non-member (joining, or removed) may only join and read the sealed
credentials bundle.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from pkikit import OTHER_TOKEN, agent_cert, client_context, server_pki, service_tls
from storekit import lone_store

from orchestrator.security.shared import KEY as JOINER_KEY
from orchestrator.store.client import RequestFailed, StoreClient, TLSRefused
from orchestrator.store.service import ClientService


async def _serve(tmp_path: Path, who: str) -> tuple[str, Exception | None, int]:
    """Start a lone store with a TLS client port; connect as `who`; put a key. Returns the
    value read back by an admin afterwards, the error the client got, and the refusals."""
    d = tmp_path / "server"
    p = server_pki(d, 1)
    if who == "admin":
        ctx = client_context(d, p.admin_cert, p.admin_key)
    elif who == "server":  # the lone store's member is node 1
        ctx = client_context(d, p.peer_cert, p.peer_key)
    elif who == "no certificate":
        ctx = client_context(d, None, None)
    elif who == "another CA":
        other = server_pki(tmp_path / "other", 1, OTHER_TOKEN)
        ctx = client_context(d, other.admin_cert, other.admin_key)
    else:
        ctx = client_context(d, *agent_cert(d))
    admin = client_context(d, p.admin_cert, p.admin_key)
    async with lone_store(tmp_path / "db") as store, trio.open_nursery() as nursery:
        service = ClientService(store, "127.0.0.1:0", tls=service_tls(d))
        await nursery.start(service.run)
        endpoint = f"127.0.0.1:{service.port}"
        error: Exception | None = None
        with trio.fail_after(10):
            try:
                async with StoreClient([endpoint], tls=ctx) as kv:
                    await kv.put("k", who.encode())
            except TLSRefused as exc:
                error = exc
            async with StoreClient([endpoint], tls=admin) as kv:
                value = await kv.get("k")
        nursery.cancel_scope.cancel()
    return (value or b"").decode(), error, service.refused


@pytest.mark.parametrize("who", ["admin", "server"])
async def test_admins_and_servers_may_use_the_client_port(tmp_path: Path, who: str) -> None:
    value, error, refused = await _serve(tmp_path, who)
    assert (value, error, refused) == (who, None, 0)


@pytest.mark.parametrize("who", ["no certificate", "another CA", "agent"])
async def test_others_are_refused_and_change_nothing(tmp_path: Path, who: str) -> None:
    value, error, refused = await _serve(tmp_path, who)
    assert value == ""
    assert isinstance(error, TLSRefused), error
    assert refused == 1
    if who == "agent":  # CA-signed: refused after the handshake, with the reason
        assert "servers and admins only" in str(error)


async def test_a_non_member_server_may_only_join(tmp_path: Path) -> None:
    d = tmp_path / "server"
    p = server_pki(d, 1)
    stranger = server_pki(tmp_path / "removed", 7)  # same CA; node 7 is no member
    admin = client_context(d, p.admin_cert, p.admin_key)
    async with lone_store(tmp_path / "db") as store, trio.open_nursery() as nursery:
        service = ClientService(store, "127.0.0.1:0", tls=service_tls(d))
        await nursery.start(service.run)
        endpoint = f"127.0.0.1:{service.port}"
        with trio.fail_after(10):
            async with StoreClient([endpoint], tls=admin) as kv:
                await kv.put("secret", b"s3cret")
            ctx = client_context(d, stranger.peer_cert, stranger.peer_key)
            async with StoreClient([endpoint], tls=ctx) as kv:
                assert await kv.get(JOINER_KEY) is None  # what a joiner checks the pin with
                for attempt in (kv.get("secret"), kv.put("secret", b"mine")):
                    with pytest.raises(RequestFailed, match="may only join"):
                        await attempt
            async with StoreClient([endpoint], tls=admin) as kv:
                assert await kv.get("secret") == b"s3cret"
        nursery.cancel_scope.cancel()


async def test_the_client_refuses_a_server_of_another_ca(tmp_path: Path) -> None:
    d, other = tmp_path / "server", tmp_path / "other"
    server_pki(d, 1)
    o = server_pki(other, 1, OTHER_TOKEN)
    async with lone_store(tmp_path / "db") as store, trio.open_nursery() as nursery:
        service = ClientService(store, "127.0.0.1:0", tls=service_tls(d))
        await nursery.start(service.run)
        ctx = client_context(other, o.admin_cert, o.admin_key)  # trusts only the other CA
        with trio.fail_after(10), pytest.raises(TLSRefused, match="CERTIFICATE_VERIFY_FAILED"):
            async with StoreClient([f"127.0.0.1:{service.port}"], tls=ctx) as kv:
                await kv.put("k", b"v")
        nursery.cancel_scope.cancel()
