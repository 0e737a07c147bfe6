"""Join tokens: the cluster-wide token table, `/orchestrator/v1/` endpoints, CA-pinned joining.

In-process (one server): create -> list -> an agent joins with the K10 token (pin checked,
node credentials stored 0600, reused on restart) -> revoke -> a new join is denied (401); a
wrong pin is refused before anything is sent; expired tokens are refused; node names belong
to the identity that joined them; only admins manage tokens. Real processes (3 servers, slow):
`orchestrator token create` through one server, join through another, revoke through the
third, and the join and the token are denied everywhere; a server joining with a wrong pin
exits before sending its token.
"""

from __future__ import annotations

import hashlib
import os
import ssl
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from apiharness import Harness, api_server
from cluster import CLUSTER_TOKEN, REPO_ROOT, Cluster

from orchestrator.agent import join as agent_join
from orchestrator.agent.join import CREDENTIALS_FILE, JoinError, is_join_token, join_config
from orchestrator.kube.errors import ApiError
from orchestrator.security.clustertokens import ClusterTokens
from orchestrator.security.jointoken import (
    PinMismatch,
    ca_sha256,
    check_pin,
    format_token,
    parse_token,
)

TOKENS = "/orchestrator/v1/tokens"


@pytest.fixture
async def h() -> Any:
    async with api_server(controllers=False) as harness:
        yield harness


def client_for(h: Harness, token: str | None) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(
        base_url=h.url,
        headers=headers,
        verify=ssl.create_default_context(cadata=h.ca_pem.decode()),
        timeout=10,
    )


async def create(h: Harness, **body: object) -> dict[str, object]:
    r = await h.client.post(TOKENS, json=body)
    assert r.status_code == 201, r.text
    doc: dict[str, object] = r.json()
    return doc


# --- pure ---------------------------------------------------------------------------------------
def test_token_forms() -> None:
    pin = "ab" * 32
    t = parse_token(f"K10{pin}::abcdef.0123456789abcdef")
    assert (t.pin, t.credentials, t.bootstrap_id) == (pin, "abcdef.0123456789abcdef", "abcdef")
    assert str(t) == format_token(pin, "abcdef.0123456789abcdef")
    assert parse_token(f"K10sha256:{pin.upper()}::x").pin == pin
    bare = parse_token("abcdef.0123456789abcdef")
    assert bare.pin is None
    assert bare.bootstrap_id == "abcdef"
    assert parse_token("orch-123").bootstrap_id is None
    with pytest.raises(ValueError, match="64 hex"):
        parse_token("K10nothex::abcdef.0123456789abcdef")
    assert is_join_token(f"K10{pin}::whatever")
    assert is_join_token("abcdef.0123456789abcdef")
    assert not is_join_token("some-node-token")


async def test_pin_matches_the_ca_der(h: Harness) -> None:
    assert h.server.api is not None
    assert h.server.api.pki is not None
    assert "sha256:" + ca_sha256(h.ca_pem) == h.server.api.pki.ca_hash()
    check_pin(h.ca_pem, ca_sha256(h.ca_pem))
    with pytest.raises(PinMismatch):
        check_pin(h.ca_pem, "0" * 64)


# --- the whole flow on one server ---------------------------------------------------------------
async def test_create_list_join_revoke(h: Harness, tmp_path: Path) -> None:
    doc = await create(h, ttlSeconds=3600, description="edge site 7")
    token = str(doc["token"])
    parsed = parse_token(token)
    assert parsed.pin == ca_sha256(h.ca_pem)
    assert parsed.bootstrap_id == doc["id"]

    r = await h.client.get(TOKENS)
    assert r.status_code == 200
    rows = {row["id"]: row for row in r.json()["items"]}
    row = rows[str(doc["id"])]
    assert row["description"] == "edge site 7"
    assert row["groups"] == ["system:bootstrappers"]
    assert 3500 < row["ttlSeconds"] <= 3600
    assert parsed.credentials not in r.text
    assert "sha256" not in r.text

    # An agent joins: pin checked, node credentials stored (0600), then it acts as the node.
    cfg = await join_config(h.url, token, tmp_path / "a1", "edge-1")
    creds = tmp_path / "a1" / CREDENTIALS_FILE
    assert stat.S_IMODE(os.stat(creds).st_mode) == 0o600
    assert cfg.token
    assert cfg.token != parsed.credentials
    assert cfg.ca_pem == h.ca_pem
    async with client_for(h, cfg.token) as node:
        r = await node.get("/api/v1/nodes")
        assert r.status_code == 200, r.text
        r = await node.get(TOKENS)
        assert r.status_code == 403  # a node does not manage tokens
    # A restart reuses the stored credentials (even with a bogus token on the command line).
    again = await join_config(
        h.url, "K10" + "0" * 64 + "::abcdef.0123456789abcdef", tmp_path / "a1", "edge-1"
    )
    assert again.token == cfg.token

    # Revoke: the next join with the token is denied; the node's own credentials stay.
    r = await h.client.delete(f"{TOKENS}/{doc['id']}")
    assert r.status_code == 200, r.text
    assert (await h.client.delete(f"{TOKENS}/{doc['id']}")).status_code == 404
    with pytest.raises(JoinError, match="wrong, expired or revoked"):
        await join_config(h.url, token, tmp_path / "a2", "edge-2")
    async with client_for(h, parsed.credentials) as boot:
        r = await boot.post("/orchestrator/v1/join", json={"nodeName": "edge-3"})
        assert r.status_code == 401
    async with client_for(h, cfg.token) as node:
        assert (await node.get("/api/v1/nodes")).status_code == 200
    # Revoking the node's user revokes its credentials.
    assert (await h.client.delete(f"{TOKENS}/system:node:edge-1")).status_code == 200
    async with client_for(h, cfg.token) as node:
        assert (await node.get("/api/v1/nodes")).status_code == 401


async def test_wrong_pin_is_refused_before_sending(
    h: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = await create(h)
    creds = parse_token(str(doc["token"])).credentials
    sent: list[str] = []

    async def spy(*args: object) -> str:
        sent.append("join")
        return "x"

    monkeypatch.setattr(agent_join, "request_node_token", spy)
    wrong = format_token(hashlib.sha256(b"another CA").hexdigest(), creds)
    with pytest.raises(JoinError, match="does not match the token's pin"):
        await join_config(h.url, wrong, tmp_path / "a", "edge-1")
    assert sent == []
    assert not (tmp_path / "a" / CREDENTIALS_FILE).exists()
    # The CA endpoint is anonymous; a bare token needs the CA from elsewhere.
    async with httpx.AsyncClient(verify=False) as anon:
        r = await anon.get(h.url + "/orchestrator/v1/ca")
        assert r.status_code == 200
        assert r.content == h.ca_pem
        assert (await anon.get(h.url + TOKENS)).status_code == 401
    with pytest.raises(JoinError, match="does not pin"):
        await join_config(h.url, creds, tmp_path / "b", "edge-1")


async def test_expired_token_is_denied(h: Harness, tmp_path: Path) -> None:
    doc = await create(h, ttlSeconds=60)
    tokens = h.server.api.tokens if h.server.api else None
    assert tokens is not None
    tokens.clock = lambda: time.time() + 120
    try:
        with pytest.raises(JoinError, match="wrong, expired or revoked"):
            await join_config(h.url, str(doc["token"]), tmp_path / "a", "edge-1")
        r = await h.client.get(TOKENS)
        row = next(x for x in r.json()["items"] if x["id"] == doc["id"])
        assert row["ttlSeconds"] == 0
    finally:
        tokens.clock = time.time
    never = await create(h, ttlSeconds=0)
    assert never["expires"] is None


async def test_node_names_belong_to_who_joined_them(h: Harness, tmp_path: Path) -> None:
    a, b = await create(h), await create(h)
    await join_config(h.url, str(a["token"]), tmp_path / "a", "edge-1")
    with pytest.raises(JoinError, match="taken"):
        await join_config(h.url, str(b["token"]), tmp_path / "b", "edge-1")
    # The same identity may join it again (the agent lost its data): a new node token.
    await join_config(h.url, str(a["token"]), tmp_path / "a2", "edge-1")
    r = await h.client.post(TOKENS, json={"groups": ["system:masters"]})
    assert r.status_code == 400  # join tokens never carry other groups


async def test_stale_cache_refuses_tokens(h: Harness) -> None:
    """A server that cannot prove its token cache current answers 503, never a stale yes."""
    assert h.server.api is not None
    assert h.server.api.tokens is not None
    tokens: ClusterTokens = h.server.api.tokens
    assert tokens.fresh()
    real = tokens.monotonic
    tokens.monotonic = lambda: real() + tokens.max_stale + 5
    try:
        with pytest.raises(ApiError) as err:
            tokens.lookup("anything")
        assert err.value.code == 503
    finally:
        tokens.monotonic = real


# --- three server processes ---------------------------------------------------------------------
def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


@pytest.mark.slow
async def test_revoke_holds_on_every_server(tmp_path: Path) -> None:
    with trio.fail_after(120), Cluster(tmp_path, 3) as cluster:
        cluster.start()
        await cluster.wait_leader()
        for i in range(3):
            await cluster.wait_api(i)
        urls = [f"https://127.0.0.1:{s.api_port}" for s in cluster.servers]
        dirs = [str(s.data_dir) for s in cluster.servers]

        made = await trio.to_thread.run_sync(cli, "token", "create", "--data-dir", dirs[0])
        assert made.returncode == 0, made.stderr
        token = made.stdout.strip().splitlines()[-1]
        parsed = parse_token(token)
        listed = await trio.to_thread.run_sync(cli, "token", "list", "--data-dir", dirs[2])
        assert parsed.bootstrap_id
        assert parsed.bootstrap_id in listed.stdout
        assert parsed.credentials not in listed.stdout

        await join_config(urls[1], token, tmp_path / "agent1", "edge-1")
        gone = await trio.to_thread.run_sync(
            cli, "token", "revoke", str(parsed.bootstrap_id), "--data-dir", dirs[2]
        )
        assert gone.returncode == 0, gone.stderr
        with pytest.raises(JoinError, match="wrong, expired or revoked"):
            await join_config(urls[1], token, tmp_path / "agent2", "edge-2")
        # Plain authentication (the watched cache) follows on every server at once.
        ca = (cluster.servers[0].data_dir / "pki" / "ca.crt").read_bytes()
        verify = ssl.create_default_context(cadata=ca.decode())
        headers = {"Authorization": f"Bearer {parsed.credentials}"}
        async with httpx.AsyncClient(verify=verify, headers=headers, timeout=10) as boot:
            for u in urls:
                codes = []
                for _ in range(100):  # within 5 s; in practice the first answer
                    codes.append((await boot.get(u + "/api")).status_code)
                    if codes[-1] == 401:
                        break
                    await trio.sleep(0.05)
                assert codes[-1] == 401, codes

        # A server joining with a token whose pin is not the cluster's CA exits, token unsent.
        i = cluster.add_server(start=False)
        wrong = format_token("0" * 64, CLUSTER_TOKEN)
        s = cluster.servers[i]
        res = await trio.to_thread.run_sync(
            cli,
            "server",
            "--data-dir",
            str(s.data_dir),
            "--peer-listen",
            s.peer_addr,
            "--client-listen",
            s.endpoint,
            "--listen",
            "none",
            "--join",
            cluster.endpoint(0),
            "--token",
            wrong,
        )
        assert res.returncode == 1, res.stderr[-2000:]
        assert "does not match the token's pin" in res.stderr
        status = await cluster.status(0)
        assert status is not None
        assert len(status["voters"]) + len(status["learners"]) == 3


async def test_joined_agents_get_serving_certificates(h: Harness, tmp_path: Path) -> None:
    """The join answer signs the agent's own public key; the node renews with its credentials,
    for its own name only; `ensure_serving_cert` reuses a good pair and renews an expiring one."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    from orchestrator.agent import servingcert
    from orchestrator.agent.servingcert import ServingKey, ensure_serving_cert

    doc = await create(h)
    data = tmp_path / "a"
    addresses = ["edge-1", "10.1.2.3"]
    cfg = await join_config(h.url, str(doc["token"]), data, "edge-1", serving_addresses=addresses)
    cert_path, key_path = servingcert.paths(data)
    assert stat.S_IMODE(os.stat(key_path).st_mode) == 0o600
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    assert cert.subject.rfc4514_string() == "CN=system:node:edge-1"
    assert servingcert.check(data, h.ca_pem, addresses)
    assert not servingcert.check(data, h.ca_pem, ["10.9.9.9"])  # not covered: re-request
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert dt.timedelta(days=364) < lifetime < dt.timedelta(days=366)

    # Reuse while valid; renew when within 30 days of expiry.
    assert await ensure_serving_cert(cfg, data, addresses) == (cert_path, key_path)
    assert cert_path.read_bytes() == cert.public_bytes(serialization.Encoding.PEM)
    soon = dt.datetime.now(dt.UTC) + dt.timedelta(days=340)
    assert not servingcert.check(data, h.ca_pem, addresses, now=soon)
    old_key = key_path.read_bytes()
    servingcert.store(data, ServingKey(old_key, ""), b"garbage")  # an unusable pair
    assert await ensure_serving_cert(cfg, data, addresses) == (cert_path, key_path)
    assert key_path.read_bytes() != old_key
    assert servingcert.check(data, h.ca_pem, addresses)

    key = ServingKey.generate()
    async with client_for(h, cfg.token) as node:
        r = await node.post("/orchestrator/v1/node-certificate", json=key.request(["10.0.0.1"]))
        assert r.status_code == 201, r.text
        issued = x509.load_pem_x509_certificate(r.json()["servingCertificate"].encode())
        assert issued.subject.rfc4514_string() == "CN=system:node:edge-1"
        r = await node.post("/orchestrator/v1/node-certificate", json={"servingKey": "nope"})
        assert r.status_code == 400
        r = await node.post("/orchestrator/v1/node-certificate", json=key.request(["not a name!"]))
        assert r.status_code == 400
    parsed = parse_token(str((await create(h))["token"]))
    async with client_for(h, parsed.credentials) as boot:  # not a node
        r = await boot.post("/orchestrator/v1/node-certificate", json=key.request([]))
        assert r.status_code == 403
    r = await h.client.post("/orchestrator/v1/node-certificate", json=key.request([]))
    assert r.status_code == 403  # an admin is no node either
