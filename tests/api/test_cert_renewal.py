"""Certificate renewal while running (`security.renewal`) and `orchestrator certs check|rotate`.

The decision is pure and tested as a table; the loop's timing with trio's MockClock and a fake
leaf; the real thing with an in-process server whose serving certificate is moved into its
renewal window by the loop's injected wall clock (new TLS connections see a new serial, the CA
and the kubeconfig stay, an open connection keeps working), and `certs rotate` against a stopped
data dir, an in-process server and (slow) a real server process.
"""

from __future__ import annotations

import datetime as dt
import os
import ssl
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import trio
import trio.testing
from api.apiharness import api_server, peer_certificate, read_kubeconfig
from cryptography import x509

from orchestrator.agent.logs import EndpointTLS
from orchestrator.agent.service import AgentConfig
from orchestrator.apiserver.logproxy import kubelet_client_cert, kubelet_client_paths
from orchestrator.cli import certs as certs_cli
from orchestrator.cli.main import _build_parser
from orchestrator.metrics import REGISTRY
from orchestrator.security.pki import ensure_pki, write_pair
from orchestrator.security.renewal import (
    Action,
    CertRenewer,
    Leaf,
    Observation,
    RenewalConfig,
    decide,
    read_pair,
)
from orchestrator.security.tls import ReloadableContext, server_ssl_context

T = TypeVar("T")
REPO_ROOT = Path(__file__).resolve().parents[2]
T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
DAY = dt.timedelta(days=1)
WINDOW = 120 * DAY
FAST = {"check_interval": 0.2, "watch_interval": 0.05, "retry_interval": 0.2}


# ------------------------------------------------------------------------------ the decision
def obs(fp: str | None, days_left: float | None) -> Observation:
    return Observation(fp, None if days_left is None else T0 + days_left * DAY)


@pytest.mark.parametrize(
    ("observed", "loaded", "check_due", "action"),
    [
        (obs("a", 300), "a", True, Action.KEEP),  # fresh and loaded
        (obs("a", 300), None, False, Action.RELOAD),  # consumers not built from it yet
        (obs("b", 300), "a", False, Action.RELOAD),  # replaced on disk (certs rotate)
        (obs("a", 100), "a", True, Action.RENEW),  # inside the window, on a check
        (obs("a", 100), "a", False, Action.KEEP),  # ... but only on a check
        (obs("b", 100), "a", False, Action.RELOAD),
        (obs("a", -1), "a", True, Action.RENEW),  # expired
        (obs("a", 120), "a", True, Action.RENEW),  # exactly at the window's edge
        (obs("a", 120.01), "a", True, Action.KEEP),
        (obs(None, 300), "a", True, Action.RENEW),  # missing or not a pair
        (obs(None, 300), "a", False, Action.KEEP),  # waits for the check
        (obs(None, None), None, False, Action.KEEP),
    ],
)
def test_decide(observed: Observation, loaded: str | None, check_due: bool, action: Action) -> None:
    assert decide(observed, loaded, T0, WINDOW, check_due=check_due) is action


def test_read_pair(tmp_path: Path) -> None:
    pki = ensure_pki(tmp_path, [])
    good = read_pair(pki.serving_cert_path, pki.serving_key_path)
    assert good.fingerprint is not None
    assert good.serial == pki.serving_cert.serial_number
    assert good.not_after == pki.serving_cert.not_valid_after_utc
    assert read_pair(pki.serving_cert_path, pki.serving_key_path) == good  # stable

    _, client_key = kubelet_client_cert(pki)
    mismatched = read_pair(pki.serving_cert_path, client_key)
    assert mismatched.fingerprint is None
    assert "is not the key of" in mismatched.problem
    missing = read_pair(tmp_path / "nope.crt", tmp_path / "nope.key")
    assert missing.fingerprint is None
    assert "nope.crt" in missing.problem


def test_reloadable_context_keeps_the_old_context_when_a_build_fails(tmp_path: Path) -> None:
    pki = ensure_pki(tmp_path, [])
    ctx = ReloadableContext(lambda: server_ssl_context(pki))
    first = ctx.current
    _, client_key = kubelet_client_cert(pki)
    cert_pem = pki.serving_cert_path.read_bytes()
    write_pair(pki.serving_cert_path, pki.serving_key_path, cert_pem, client_key.read_bytes())

    async def reload() -> None:
        with pytest.raises(ssl.SSLError):
            await ctx.reload()

    trio.run(reload)
    assert ctx.current is first
    assert ctx.reloads == 0


# ------------------------------------------------------------------------------ the loop
class Wall:
    """The renewal loop's wall clock, moved by hand."""

    def __init__(self, now: dt.datetime) -> None:
        self.now = now

    def __call__(self) -> dt.datetime:
        return self.now


class FakeLeaf(Leaf):
    """A pair in memory: `replace_on_disk` is another process's rotation; `fail` makes the
    issuer fail (an unreachable server)."""

    def __init__(self, wall: Wall) -> None:
        super().__init__("fake", Path("fake.crt"), Path("fake.key"), self._issue, WINDOW)
        self.wall = wall
        self.serial = 1
        self.fail = False
        self.issued = 0
        self.observation = self._make()

    def _make(self) -> Observation:
        return Observation(f"fp{self.serial}", self.wall() + 365 * DAY, self.serial)

    def replace_on_disk(self) -> None:
        self.serial += 1
        self.observation = self._make()

    async def observe(self) -> Observation:
        return self.observation

    async def _issue(self) -> None:
        if self.fail:
            raise OSError("connection refused")
        self.issued += 1
        self.replace_on_disk()


async def test_renewer_checks_renews_retries_and_reloads(
    autojump_clock: trio.testing.MockClock,
) -> None:
    wall = Wall(T0)
    leaf = FakeLeaf(wall)
    loaded: list[int] = []
    broken = [False]

    async def consumer() -> None:
        if broken[0]:
            broken[0] = False
            raise ssl.SSLError("a torn pair")
        loaded.append(leaf.observation.serial)

    config = RenewalConfig(check_interval=100, watch_interval=1, retry_interval=10, now=wall)
    renewer = CertRenewer(config)
    renewer.add(leaf)
    renewer.on_reload("fake", consumer)
    with trio.fail_after(1000):
        async with trio.open_nursery() as nursery:
            await nursery.start(renewer.run)
            await trio.sleep(0.5)  # the first tick (t=0): loaded, nothing to renew
            assert loaded == [1]
            assert leaf.issued == 0

            leaf.replace_on_disk()  # `certs rotate` from another process
            await trio.sleep(1)  # t=1.5: picked up by the next tick, not renewed
            assert loaded == [1, 2]
            assert leaf.issued == 0

            wall.now = T0 + 300 * DAY  # 65 days left: inside the window
            await trio.sleep(50)  # t=51.5: the next check is at t=100
            assert leaf.issued == 0
            await trio.sleep(50)  # t=101.5: renewed at the check, then reloaded
            assert leaf.issued == 1
            assert loaded == [1, 2, 3]

            leaf.fail = True  # the server is unreachable: retried every retry_interval
            wall.now += 300 * DAY
            await trio.sleep(100)  # t=201.5
            assert renewer.statistics()["fake"]["failures"] == 1
            await trio.sleep(10)  # t=211.5
            assert renewer.statistics()["fake"]["failures"] == 2
            assert loaded == [1, 2, 3]  # the old pair serves on

            leaf.fail = False
            broken[0] = True  # the first rebuild fails: retried on the next tick
            await trio.sleep(9)  # t=220.5: renewed at t=220, its reload failed
            assert leaf.issued == 2
            assert loaded == [1, 2, 3]
            assert not renewer.statistics()["fake"]["loaded"]
            await trio.sleep(1)  # t=221.5
            assert loaded == [1, 2, 3, 4]
            assert renewer.statistics()["fake"] | {"not_after": None} == {
                "serial": 4,
                "not_after": None,
                "loaded": True,
                "renewals": 2,
                "failures": 2,
            }

            late = []  # a consumer registered later is brought up to date on the next tick

            async def latecomer() -> None:
                late.append(leaf.observation.serial)

            renewer.on_reload("fake", latecomer)
            await trio.sleep(1)
            assert late == [4]
            assert leaf.issued == 2
            nursery.cancel_scope.cancel()


# ------------------------------------------------------------------------------ a real server
class ShiftedWall:
    """Real time plus `offset`: moves the loop's judgement of expiry, not the certificates'."""

    def __init__(self) -> None:
        self.offset = dt.timedelta(0)

    def __call__(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC) + self.offset


async def poll(fn: Callable[[], Awaitable[T | None]], what: str, within: float = 20.0) -> T:
    with trio.move_on_after(within):
        while True:
            value = await fn()
            if value:
                return value
            await trio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def file_serial(path: Path) -> int:
    return x509.load_pem_x509_certificate(path.read_bytes()).serial_number


def sans(cert: x509.Certificate) -> set[str]:
    ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(v) for v in ext.get_values_for_type(x509.IPAddress)} | set(
        ext.get_values_for_type(x509.DNSName)
    )


async def kubeconfig_works(path: Path) -> bool:
    """A fresh client (new connection) from the kubeconfig the server wrote at start."""
    url, token, ca = read_kubeconfig(path)
    verify = ssl.create_default_context(cadata=ca.decode())
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, verify=verify, headers=headers) as client:
        r = await client.get("/api/v1/namespaces/default")
    return r.status_code == 200


async def http_over(stream: trio.SSLStream[trio.SocketStream], path: str) -> bytes:
    """One keep-alive request on an open connection: its status line (the body is read)."""
    await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(4096)
        assert chunk, "the connection was closed"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    length = next(
        int(v) for k, _, v in (x.partition(b":") for x in lines) if k.lower() == b"content-length"
    )
    while len(body) < length:
        chunk = await stream.receive_some(4096)
        assert chunk, "the connection was closed"
        body += chunk
    return lines[0]


def metric(name: str, cert: str) -> float | None:
    prefix = f'{name}{{cert="{cert}"}} '
    for line in REGISTRY.render().splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    return None


async def test_server_renews_its_certificates_while_running(tmp_path: Path) -> None:
    wall = ShiftedWall()
    renewal = RenewalConfig(now=wall, **FAST)
    agent = AgentConfig(runtime="simulated", node_name="edge-1", kubelet_port=0)
    with trio.fail_after(90):
        async with api_server(tmp_path / "d", agent=agent, cert_renewal=renewal) as h:
            assert h.server.api is not None
            api, pki_dir = h.server.api, h.data_dir / "pki"
            assert api.pki is not None
            ca_before = (pki_dir / "ca.crt").read_bytes()
            client_pair = kubelet_client_paths(api.pki)
            old = await peer_certificate(api.port, h.ca_pem)
            old_client = file_serial(client_pair[0])

            async def agent_port() -> int | None:
                r = await h.client.get("/api/v1/nodes/edge-1")
                if r.status_code != 200:
                    return None
                endpoints = (r.json().get("status") or {}).get("daemonEndpoints") or {}
                port = (endpoints.get("kubeletEndpoint") or {}).get("Port")
                return int(port) if port else None

            log_port = await poll(agent_port, "the embedded agent's log port")
            endpoint_old = await peer_certificate(log_port, h.ca_pem, client_pair)
            # The embedded agent's own certificate (the node's identity), not the API server's.
            agent_cert = h.data_dir / "agent" / "kubelet.crt"
            assert endpoint_old.serial_number == file_serial(agent_cert)
            assert endpoint_old.serial_number != old.serial_number
            cn = endpoint_old.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
            assert cn[0].value == "system:node:edge-1"

            ctx = ssl.create_default_context(cadata=h.ca_pem.decode())
            before = await trio.open_ssl_over_tcp_stream("127.0.0.1", api.port, ssl_context=ctx)
            async with before:
                assert await http_over(before, "/healthz") == b"HTTP/1.1 200 OK"

                wall.offset = dt.timedelta(days=300)  # 65 days left: inside the 120-day window

                async def renewed() -> x509.Certificate | None:
                    cert = await peer_certificate(api.port, h.ca_pem)
                    return cert if cert.serial_number != old.serial_number else None

                await poll(renewed, "a renewed serving certificate")

                async def both_renewed() -> bool:
                    stats = api.certs.statistics().values()
                    return all(s["renewals"] >= 1 for s in stats)

                await poll(both_renewed, "the kubelet-client certificate's renewal too")
                wall.offset = dt.timedelta(0)  # stop renewing; let the loop settle

                async def settled() -> x509.Certificate | None:
                    cert = await peer_certificate(api.port, h.ca_pem)
                    on_disk = file_serial(pki_dir / "apiserver.crt")
                    return cert if cert.serial_number == on_disk else None

                new = await poll(settled, "the listener to serve the file's certificate")
                # The connection opened before the renewal still works, with its old cert.
                assert await http_over(before, "/healthz") == b"HTTP/1.1 200 OK"
                old_der = before.getpeercert(binary_form=True)
                assert old_der is not None
                assert x509.load_der_x509_certificate(old_der).serial_number == old.serial_number

            assert (pki_dir / "ca.crt").read_bytes() == ca_before  # the CA is unchanged
            assert new.issuer == old.issuer
            assert sans(new) == sans(old)
            assert new.not_valid_after_utc >= old.not_valid_after_utc
            assert await kubeconfig_works(h.kubeconfig)

            # The embedded agent's certificate is renewed too, and its log endpoint serves it.
            async def endpoint_renewed() -> bool:
                cert = await peer_certificate(log_port, h.ca_pem, client_pair)
                on_disk = file_serial(agent_cert)
                return cert.serial_number == on_disk != endpoint_old.serial_number

            await poll(endpoint_renewed, "the log endpoint to serve the renewed certificate")
            # The log proxy's client certificate was renewed and reloaded.
            assert file_serial(client_pair[0]) != old_client
            stats = await poll(
                lambda: _loaded_stats(api.certs), "the kubelet-client certificate to be loaded"
            )
            assert stats["apiserver-kubelet-client"]["renewals"] >= 1
            expires = metric("certificate_expiration_timestamp_seconds", "apiserver")
            on_disk = x509.load_pem_x509_certificate((pki_dir / "apiserver.crt").read_bytes())
            assert expires == on_disk.not_valid_after_utc.timestamp()
            assert metric("certificate_expiration_timestamp_seconds", "ca") is not None


async def _loaded_stats(renewer: CertRenewer) -> dict[str, dict[str, Any]] | None:
    stats = renewer.statistics()
    return stats if all(s["loaded"] for s in stats.values()) else None


# ------------------------------------------------------------------------------ certs rotate
def run_cli(argv: list[str]) -> int:
    args = _build_parser().parse_args(argv)
    return certs_cli.main(args)


def test_certs_rotate_and_check_on_a_stopped_data_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "server"
    pki = ensure_pki(data, ["10.0.0.7", "edge.example"])
    kubelet_client_cert(pki)
    ca = (data / "pki" / "ca.crt").read_bytes()
    serving_key = pki.serving_key_path.read_bytes()
    old_client = file_serial(kubelet_client_paths(pki)[0])

    assert run_cli(["certs", "rotate", "--data-dir", str(data)]) == 0
    out = capsys.readouterr().out
    assert "pki/apiserver.crt: renewed" in out
    assert "pki/apiserver-kubelet-client.crt: renewed" in out
    assert (data / "pki" / "ca.crt").read_bytes() == ca
    assert pki.serving_key_path.read_bytes() != serving_key  # a fresh key
    new = x509.load_pem_x509_certificate(pki.serving_cert_path.read_bytes())
    assert new.serial_number != pki.serving_cert.serial_number
    assert sans(new) == sans(pki.serving_cert)  # the same names, though it knew no flags
    assert file_serial(kubelet_client_paths(pki)[0]) != old_client
    # A server starting with the same SANs keeps the rotated certificate.
    again = ensure_pki(data, ["10.0.0.7", "edge.example"])
    assert again.serving_cert.serial_number == new.serial_number

    assert run_cli(["certs", "check", "--data-dir", str(data)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["CERTIFICATE", "SUBJECT", "EXPIRES", "DAYS", "LEFT", "STATUS"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["pki/ca.crt"][1:] == ["CN=orchestrator-ca", rows["pki/ca.crt"][2], "3649", "ok"]
    assert rows["pki/apiserver.crt"][1] == "CN=orchestrator-apiserver"
    assert rows["pki/apiserver.crt"][3:] == ["364", "ok"]
    assert rows["pki/apiserver-kubelet-client.crt"][3:] == ["364", "ok"]


def test_certs_rotate_covers_the_embedded_agents_certificate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "server"
    pki = ensure_pki(data, [])
    tls = EndpointTLS.issue(pki, "edge-1", ["10.0.0.7"], data / "agent")
    old = x509.load_pem_x509_certificate(tls.cert_path.read_bytes())
    old_key = tls.key_path.read_bytes()
    assert run_cli(["certs", "rotate", "--data-dir", str(data)]) == 0
    assert "agent/kubelet.crt: renewed" in capsys.readouterr().out
    new = x509.load_pem_x509_certificate(tls.cert_path.read_bytes())
    assert new.serial_number != old.serial_number
    assert tls.key_path.read_bytes() != old_key
    assert new.subject == old.subject  # CN=system:node:edge-1
    assert sans(new) == sans(old)
    rows = {r.name: r.status for r in certs_cli.check_rows(data)}
    assert rows["agent/kubelet.crt"] == "ok"


def test_certs_check_statuses(tmp_path: Path) -> None:
    pki = ensure_pki(tmp_path, [], now=dt.datetime.now(dt.UTC) - 300 * DAY)
    other = ensure_pki(tmp_path / "other", [])
    kubelet_client_cert(other)  # signed by another CA
    for src in kubelet_client_paths(other):
        (pki.dir / src.name).write_bytes(src.read_bytes())
    rows = {r.name: r.status for r in certs_cli.check_rows(tmp_path)}
    assert rows == {
        "pki/ca.crt": "ok",
        "pki/apiserver.crt": "renewal due",
        "pki/apiserver-kubelet-client.crt": "not signed by the cluster CA",
    }
    later = dt.datetime.now(dt.UTC) + 400 * DAY
    assert certs_cli.check_rows(tmp_path, now=later)[1].status == "expired"


def test_certs_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["certs", "check", "--data-dir", str(tmp_path / "nope")]) == 1
    assert capsys.readouterr().err == (
        f"error: {tmp_path / 'nope'}: no such directory (give a server's or an agent's "
        "--data-dir)\n"
    )
    assert run_cli(["certs", "rotate", "--data-dir", str(tmp_path)]) == 1
    assert "error: no certificates in" in capsys.readouterr().err
    ensure_pki(tmp_path, [])
    (tmp_path / "pki" / "ca.key").unlink()
    assert run_cli(["certs", "rotate", "--data-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ")
    assert "no ca.key" in err
    assert "\n" not in err[:-1]
    with pytest.raises(SystemExit):  # argparse: --data-dir is required
        _build_parser().parse_args(["certs", "rotate"])


async def test_certs_rotate_reaches_a_running_server(tmp_path: Path) -> None:
    renewal = RenewalConfig(watch_interval=0.05)  # expiry is not the reason here
    with trio.fail_after(60):
        async with api_server(tmp_path / "d", controllers=False, cert_renewal=renewal) as h:
            assert h.server.api is not None
            port = h.server.api.port
            old = await peer_certificate(port, h.ca_pem)
            ca = (h.data_dir / "pki" / "ca.crt").read_bytes()
            argv = ["certs", "rotate", "--data-dir", str(h.data_dir)]
            assert await trio.to_thread.run_sync(run_cli, argv) == 0
            rotated = file_serial(h.data_dir / "pki" / "apiserver.crt")
            assert rotated != old.serial_number

            async def served() -> bool:
                return (await peer_certificate(port, h.ca_pem)).serial_number == rotated

            await poll(served, "the rotated certificate to be served")
            assert (h.data_dir / "pki" / "ca.crt").read_bytes() == ca
            assert await kubeconfig_works(h.kubeconfig)
            assert h.server.api.certs.statistics()["apiserver"]["renewals"] == 0


@pytest.mark.slow
async def test_certs_rotate_command_against_a_server_process(tmp_path: Path) -> None:
    """The real command against a real server with the default intervals (files checked
    every 5 s)."""
    from cluster import Cluster

    cluster = Cluster(tmp_path / "servers", 1, api=True, agent=False)
    with trio.fail_after(90), cluster:
        cluster.start()
        await cluster.wait_leader()
        kubeconfig = await cluster.wait_api(0)
        _, _, ca = read_kubeconfig(kubeconfig)
        port = cluster.servers[0].api_port
        data = cluster.servers[0].data_dir

        async def up() -> x509.Certificate | None:
            try:
                return await peer_certificate(port, ca)
            except OSError:
                return None

        old = await poll(up, "the API's TLS listener")
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
        res = await trio.to_thread.run_sync(
            lambda: subprocess.run(
                [sys.executable, "-m", "orchestrator", "certs", "rotate", "--data-dir", str(data)],
                capture_output=True,
                text=True,
                env=env,
                timeout=60,
            )
        )
        assert res.returncode == 0, res.stderr
        assert "pki/apiserver.crt: renewed" in res.stdout
        rotated = file_serial(data / "pki" / "apiserver.crt")
        assert rotated != old.serial_number

        async def served() -> bool:
            cluster.check_alive()
            return (await peer_certificate(port, ca)).serial_number == rotated

        await poll(served, "the server process to serve the rotated certificate", within=30)
        assert await kubeconfig_works(kubeconfig)
