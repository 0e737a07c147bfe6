"""A joined agent's log endpoint certificate (`agent.servingcert`) renewed while the agent runs,
through the API server's node-certificate endpoint (the path a later start takes), as
`orchestrator agent` wires it: `servingcert.leaf` in a `CertRenewer`, the endpoint's
`reload_tls` as consumer. Also `orchestrator certs rotate --data-dir AGENT_DIR`, and a server
that cannot be reached (the old pair serves on; retried)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import trio
from api.apiharness import api_server, peer_certificate
from cryptography import x509

from orchestrator.agent import servingcert
from orchestrator.agent.join import join_config
from orchestrator.agent.logs import EndpointTLS, LogEndpoint
from orchestrator.apiserver.logproxy import kubelet_client_cert, kubelet_client_paths
from orchestrator.cli import certs as certs_cli
from orchestrator.cli.main import _build_parser
from orchestrator.client.config import ClientConfig
from orchestrator.security.pki import ensure_pki
from orchestrator.security.renewal import CertRenewer, RenewalConfig

FAST = {"check_interval": 0.2, "watch_interval": 0.05, "retry_interval": 0.2}


class ShiftedWall:
    """Real time plus `offset`: moves the loop's judgement of expiry, not the certificates'."""

    def __init__(self) -> None:
        self.offset = dt.timedelta(0)

    def __call__(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC) + self.offset


def no_pods(namespace: str, name: str) -> Any:
    return None


def file_serial(path: Path) -> int:
    return x509.load_pem_x509_certificate(path.read_bytes()).serial_number


async def wait_for(predicate: Any, what: str, within: float = 20.0) -> Any:
    with trio.move_on_after(within):
        while True:
            value = await predicate()
            if value:
                return value
            await trio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


async def test_joined_agent_renews_its_serving_certificate_while_running(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with api_server(tmp_path / "server", controllers=False) as h:
            assert h.server.api is not None
            assert h.server.api.pki is not None
            r = await h.client.post("/orchestrator/v1/tokens", json={"ttlSeconds": 600})
            assert r.status_code == 201, r.text
            data = tmp_path / "agent"
            addresses = ["edge-1", "127.0.0.1"]
            cfg = await join_config(
                h.url, r.json()["token"], data, "edge-1", serving_addresses=addresses
            )
            assert cfg.ca_pem is not None
            ca_pem = cfg.ca_pem
            cert_path, key_path = servingcert.paths(data)
            client_pair = kubelet_client_paths(h.server.api.pki)  # the API server's identity

            wall = ShiftedWall()
            tls = EndpointTLS(cert_path, key_path, ca_pem)
            endpoint = LogEndpoint(data, no_pods, tls=tls, host="127.0.0.1", port=0)
            renewer = CertRenewer(RenewalConfig(now=wall, **FAST))
            renewer.add(servingcert.leaf(cfg, data, addresses))
            async with trio.open_nursery() as nursery:
                port = await nursery.start(endpoint.run)
                renewer.on_reload(servingcert.LEAF, endpoint.reload_tls)
                await nursery.start(renewer.run)
                old = await peer_certificate(port, ca_pem, client_pair)
                old_key = key_path.read_bytes()

                wall.offset = dt.timedelta(days=340)  # 25 days left: inside the 30-day window

                async def renewed() -> bool:
                    cert = await peer_certificate(port, ca_pem, client_pair)
                    return cert.serial_number != old.serial_number

                await wait_for(renewed, "the endpoint to serve a renewed certificate")
                wall.offset = dt.timedelta(0)

                async def settled() -> x509.Certificate | None:
                    cert = await peer_certificate(port, ca_pem, client_pair)
                    return cert if cert.serial_number == file_serial(cert_path) else None

                new = await wait_for(settled, "the endpoint to serve the file's certificate")
                assert new.subject.rfc4514_string() == "CN=system:node:edge-1"
                assert new.issuer == x509.load_pem_x509_certificate(ca_pem).subject
                assert servingcert.check(data, ca_pem, addresses)  # covers the node's names
                assert key_path.read_bytes() != old_key  # a fresh key, made here
                assert renewer.statistics()[servingcert.LEAF]["renewals"] >= 1

                # `certs rotate` on the agent's data dir: its node credentials ask the server.
                before = file_serial(cert_path)
                argv = ["certs", "rotate", "--data-dir", str(data)]
                args = _build_parser().parse_args(argv)
                assert await trio.to_thread.run_sync(certs_cli.main, args) == 0
                rotated = file_serial(cert_path)
                assert rotated != before

                async def rotated_served() -> bool:
                    cert = await peer_certificate(port, ca_pem, client_pair)
                    return cert.serial_number == rotated

                await wait_for(rotated_served, "the endpoint to serve the rotated certificate")
                rows = certs_cli.check_rows(data)
                assert [(r.name, r.subject, r.status) for r in rows] == [
                    ("kubelet.crt", "CN=system:node:edge-1", "ok")
                ]
                nursery.cancel_scope.cancel()


async def test_unreachable_server_keeps_the_old_pair_and_retries(tmp_path: Path) -> None:
    pki = ensure_pki(tmp_path / "server", [])
    data = tmp_path / "agent"
    tls = EndpointTLS.issue(pki, "edge-1", ["127.0.0.1"], data)
    pair = (tls.cert_path.read_bytes(), tls.key_path.read_bytes())
    cfg = ClientConfig(server="https://127.0.0.1:1", ca_pem=pki.ca_pem, token="t")
    wall = ShiftedWall()
    wall.offset = dt.timedelta(days=340)
    renewer = CertRenewer(RenewalConfig(now=wall, **FAST))
    renewer.add(servingcert.leaf(cfg, data, ["edge-1", "127.0.0.1"]))
    endpoint = LogEndpoint(data, no_pods, tls=tls, host="127.0.0.1", port=0)
    client_pair = kubelet_client_cert(pki)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(endpoint.run)
            renewer.on_reload(servingcert.LEAF, endpoint.reload_tls)
            await nursery.start(renewer.run)

            async def retried() -> bool:
                return bool(renewer.statistics()[servingcert.LEAF]["failures"] >= 2)

            await wait_for(retried, "two failed renewals")
            assert (tls.cert_path.read_bytes(), tls.key_path.read_bytes()) == pair
            served = await peer_certificate(port, pki.ca_pem, client_pair)
            assert served.serial_number == file_serial(tls.cert_path)  # still serving
            nursery.cancel_scope.cancel()
