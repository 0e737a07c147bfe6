"""Servers join with `--server URL --token TOKEN`, through an existing server's Kubernetes API.

Pure: which client addresses a joining server tries, the members answer, the record format.
In-process (one server): `GET /orchestrator/v1/members` is for holders of the cluster token
and admins; `member_endpoints` checks the CA pin before sending the token, and says clearly
when the token is wrong or no server answers. Command line: `--server` and `--join` exclude
each other. Real processes (slow): servers join through a URL with the K10 server token and
with the plain cluster token (through a follower, past a dead URL) and become voters; a wrong
pin or token is refused, the server exits 1 and its data dir joins fine afterwards.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from apiharness import Harness, api_server
from cluster import CLUSTER_TOKEN, REPO_ROOT, Cluster, free_ports

from orchestrator import config
from orchestrator.cli.main import _build_parser, main
from orchestrator.cluster import join as serverjoin
from orchestrator.cluster.join import JoinFailed, member_endpoints, usable_addresses
from orchestrator.cluster.members import (
    KEY_PREFIX,
    client_address,
    decode_record,
    encode_record,
    member_items,
)
from orchestrator.security.jointoken import ca_sha256, format_token, parse_token

MEMBERS = "/orchestrator/v1/members"
CLUSTER = "t"  # the harness server's cluster token


# --- pure ---------------------------------------------------------------------------------------
def test_usable_addresses() -> None:
    items: list[dict[str, Any]] = [
        {"id": 2, "clientAddress": "10.0.0.2:7101"},
        {"id": 1, "clientAddress": "127.0.0.1:7101"},
        {"id": 3, "clientAddress": None},  # recorded nothing yet
        {"id": 4, "clientAddress": "no-port"},
        {"id": 5, "clientAddress": "10.0.0.2:7101"},  # a duplicate
        {"id": 6, "clientAddress": "[::1]:7101"},
    ]
    # Through a remote URL, loopback addresses would name the joining device itself.
    assert usable_addresses("https://10.0.0.1:6443", items) == ["10.0.0.2:7101"]
    assert usable_addresses("https://127.0.0.1:6443", items) == [
        "10.0.0.2:7101",
        "127.0.0.1:7101",
        "[::1]:7101",
    ]
    assert usable_addresses("https://localhost:6443/", items)[1] == "127.0.0.1:7101"
    assert usable_addresses("https://10.0.0.1:6443", []) == []


def test_member_items_put_the_leader_first() -> None:
    items = member_items({1, 3}, {7}, 3, {1: "a:1", 3: "c:3"})
    assert items == [
        {"id": 3, "clientAddress": "c:3", "voter": True, "leader": True},
        {"id": 1, "clientAddress": "a:1", "voter": True, "leader": False},
        {"id": 7, "clientAddress": None, "voter": False, "leader": False},
    ]
    assert [i["id"] for i in member_items({2, 1}, set(), 0, {})] == [1, 2]


def test_client_address_and_records() -> None:
    assert client_address("10.0.0.5:7101", 7101, "10.0.0.9") == "10.0.0.5:7101"
    assert client_address("0.0.0.0:7101", 7101, "10.0.0.9") == "10.0.0.9:7101"
    assert client_address("127.0.0.1:0", 40123, "10.0.0.9") == "127.0.0.1:40123"
    assert client_address("[::]:7101", 7101, "fd00::5") == "[fd00::5]:7101"
    assert decode_record(encode_record("10.0.0.5:7101")) == "10.0.0.5:7101"
    for junk in (b"", b"not json", b"[]", b'{"clientAddress": 5}'):
        assert decode_record(junk) is None


# --- command line -------------------------------------------------------------------------------
def parse(argv: list[str], env: dict[str, str] | None = None) -> Any:
    return config.parse_args(_build_parser(), argv, environ=env or {})


def test_server_flag_like_the_agents(tmp_path: Path) -> None:
    """Repeatable, comma-separated, config key `server` and ORCHESTRATOR_SERVER, as `agent`."""
    a, b = "https://10.0.0.1:6443", "https://10.0.0.2:6443"
    d = ["server", "--data-dir", str(tmp_path)]
    assert parse([*d, "--server", f"{a},{b}"]).server == [a, b]
    assert parse([*d, "--server", a, "--server", b]).server == [a, b]
    assert parse(d, {"ORCHESTRATOR_SERVER": f"{b},{a}"}).server == [b, a]
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"server: [{a}]\n")
    assert parse([*d, "--config", str(cfg)]).server == [a]
    assert parse(d).server == []


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--join", "127.0.0.1:7101", "--server", "https://127.0.0.1:6443", "--token", "t"],
            "not both",
        ),
        (["--server", "https://127.0.0.1:6443"], "--server URL needs --token"),
        (["--server", "127.0.0.1:7101", "--token", "t"], "is not a URL like https://HOST:6443"),
    ],
)
def test_server_flag_usage_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: list[str], message: str
) -> None:
    monkeypatch.delenv("ORCHESTRATOR_TOKEN", raising=False)
    data = tmp_path / "d"
    with pytest.raises(SystemExit) as exc:
        main(["server", "--data-dir", str(data), "--listen", "none", *extra])
    assert message in str(exc.value.code)
    assert not data.exists()  # refused before anything was written


# --- one server in process ----------------------------------------------------------------------
@pytest.fixture
async def h() -> Any:
    async with api_server(controllers=False) as harness:
        yield harness


def _client(h: Harness, token: str | None) -> httpx.AsyncClient:
    import ssl

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(
        base_url=h.url,
        headers=headers,
        verify=ssl.create_default_context(cadata=h.ca_pem.decode()),
        timeout=10,
    )


def _own_address(h: Harness) -> str:
    return f"127.0.0.1:{h.server.service.port}"


async def test_members_endpoint_is_for_the_cluster_token_and_admins(h: Harness) -> None:
    async with _client(h, CLUSTER) as server:
        r = await server.get(MEMBERS)
    assert r.status_code == 200, r.text
    assert r.json()["items"] == [
        {"id": 1, "clientAddress": _own_address(h), "voter": True, "leader": True}
    ]
    assert (await h.client.get(MEMBERS)).status_code == 200  # an admin
    async with _client(h, None) as anonymous:
        assert (await anonymous.get(MEMBERS)).status_code == 401
    async with _client(h, "orch-wrong") as wrong:
        r = await wrong.get(MEMBERS)
    assert r.status_code == 401
    assert "wrong cluster token" in r.json()["message"]
    r = await h.client.post("/orchestrator/v1/tokens", json={})
    bootstrap = parse_token(r.json()["token"]).credentials
    async with _client(h, bootstrap) as agent:  # an agent's join token is no server's
        assert (await agent.get(MEMBERS)).status_code == 403
    # the server records its address in the store for the other members to list it
    with trio.fail_after(10):
        while True:
            kv = await h.server.store.get(KEY_PREFIX + "1")
            if kv is not None:
                break
            await trio.sleep(0.02)  # poll (deadline above)
    assert decode_record(kv.value) == _own_address(h)


async def test_member_endpoints_checks_the_pin_first(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    pin = ca_sha256(h.ca_pem)
    assert await member_endpoints([h.url], CLUSTER, pin, wait=10) == [_own_address(h)]
    assert await member_endpoints([h.url + "/"], CLUSTER, "", wait=10) == [_own_address(h)]

    asked: list[str] = []
    real = serverjoin.request_members

    async def spy(url: str, verify: Any, token: str) -> httpx.Response:
        asked.append(token)
        return await real(url, verify, token)

    monkeypatch.setattr(serverjoin, "request_members", spy)
    other = hashlib.sha256(b"another CA").hexdigest()
    with pytest.raises(JoinFailed, match="does not match the token's pin"):
        await member_endpoints([h.url], CLUSTER, other, wait=10)
    assert asked == []  # the token was not sent
    with pytest.raises(JoinFailed, match=r"refused the token \(401\).*DATA_DIR/server-token"):
        await member_endpoints([h.url], "orch-wrong", pin, wait=10)
    assert asked == ["orch-wrong"]


async def test_member_endpoints_skips_and_reports_unreachable_servers(h: Harness) -> None:
    (port,) = free_ports(1)
    dead = f"https://127.0.0.1:{port}"
    pin = ca_sha256(h.ca_pem)
    assert await member_endpoints([dead, h.url], CLUSTER, pin, wait=10) == [_own_address(h)]
    with pytest.raises(JoinFailed, match=rf"no server to join through answered.*{dead}"):
        await member_endpoints([dead], CLUSTER, pin, wait=0.5)
    with pytest.raises(JoinFailed, match="no server to join through"):
        await member_endpoints([], CLUSTER, pin)


# --- real processes -----------------------------------------------------------------------------
class ApiJoinCluster(Cluster):  # type: ignore[misc]  # tests/ is untyped for mypy
    """Servers with flags in `via` start with them instead of the bare `--join`."""

    via: dict[int, list[str]]

    def argv(self, i: int) -> list[str]:
        argv: list[str] = super().argv(i)
        extra = getattr(self, "via", {}).get(i)
        if extra is not None:
            at = argv.index("--join")
            argv[at : at + 1] = extra
        return argv


def api_url(cluster: Cluster, i: int) -> str:
    return f"https://{cluster.servers[i].api_addr}"


async def voters(cluster: Cluster, i: int) -> list[int]:
    st: dict[str, Any] | None = await cluster.status(i)
    return [] if st is None else list(st["voters"])


async def wait_voter(cluster: Cluster, i: int) -> None:
    nid = cluster.node_id(i)

    async def promoted() -> bool | None:
        return nid in await voters(cluster, 0) or None

    await cluster.wait_until(promoted, within=40, what=f"node {nid} promoted")


@pytest.mark.slow
async def test_servers_join_through_an_api_url(tmp_path: Path) -> None:
    with trio.fail_after(120), ApiJoinCluster(tmp_path, 1) as cluster:
        cluster.via = {}
        cluster.start()
        await cluster.wait_leader()
        await cluster.wait_api(0)
        server_token = (cluster.servers[0].data_dir / "server-token").read_text().strip()
        assert parse_token(server_token).pin is not None

        # With the K10 server token: CA pinned, TLS verified, then the store join.
        second = cluster.add_server(start=False)
        cluster.via[second] = ["--server", api_url(cluster, 0), "--token", server_token]
        cluster.start_server(second)
        await wait_voter(cluster, second)
        await cluster.wait_api(second)  # it serves the same cluster: same CA and token
        token_file = cluster.servers[second].data_dir / "server-token"
        assert token_file.read_text().strip() == server_token

        # With the plain cluster token, through the second server (a follower: it lists the
        # leader's address too), after a URL nothing answers on.
        (dead,) = free_ports(1)
        third = cluster.add_server(start=False)
        urls = f"https://127.0.0.1:{dead},{api_url(cluster, second)}"
        cluster.via[third] = ["--server", urls, "--token", CLUSTER_TOKEN]
        cluster.start_server(third)
        await wait_voter(cluster, third)
        assert sorted(await voters(cluster, 0)) == [cluster.node_id(i) for i in range(3)]
        assert "--server" not in " ".join(cluster.argv(0))


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    env.pop("ORCHESTRATOR_TOKEN", None)
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", "--log-format", "text", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


@pytest.mark.slow
async def test_wrong_pin_or_token_is_refused_and_the_data_dir_can_join_later(
    tmp_path: Path,
) -> None:
    with trio.fail_after(150), ApiJoinCluster(tmp_path, 1) as cluster:
        cluster.via = {}
        cluster.start()
        await cluster.wait_leader()
        await cluster.wait_api(0)
        server_token = (cluster.servers[0].data_dir / "server-token").read_text().strip()
        pin = parse_token(server_token).pin
        assert pin is not None
        url = api_url(cluster, 0)
        i = cluster.add_server(start=False)
        s = cluster.servers[i]

        def join(token: str) -> subprocess.CompletedProcess[str]:
            return cli(
                *("server", "--data-dir", str(s.data_dir), "--node-id", str(s.node_id)),
                *("--peer-listen", s.peer_addr, "--client-listen", s.endpoint),
                *("--listen", "none", "--server", url, "--token", token),
            )

        cases = [
            (format_token("0" * 64, CLUSTER_TOKEN), "does not match the token's pin"),
            (format_token(pin, "orch-wrong"), "refused the token (401)"),
            ("orch-wrong", "refused the token (401)"),
        ]
        for token, message in cases:
            res = await trio.to_thread.run_sync(join, token)
            assert res.returncode == 1, res.stderr[-2000:]
            assert message in res.stderr, res.stderr[-2000:]
            assert "Traceback" not in res.stderr
            status = await cluster.status(0)
            assert status is not None
            assert status["voters"] == [1]
            assert status["learners"] == []

        # Not half-joined: the same data dir joins with the right token.
        cluster.via[i] = ["--server", url, "--token", server_token]
        cluster.start_server(i)
        await wait_voter(cluster, i)
