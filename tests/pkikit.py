"""Certificates for tests of the mutually authenticated store ports (peer and client).

`server_pki(dir, node_id)` lays out what a server has in `DATA_DIR/pki` (the token-derived CA,
the peer certificate, the admin certificate) without starting one; `peer_tls` and
`service_tls` build the contexts a server would use from it, `client_context` the one a client
presents with any certificate/key (or none). Deriving a CA costs an scrypt (~50 ms), so tests
share one per token.
"""

from __future__ import annotations

import ssl
from functools import cache
from pathlib import Path

from orchestrator.raft.transport import PeerTLS
from orchestrator.security.peercerts import (
    PeerPki,
    client_port_identity,
    derive_ca,
    ensure_admin_cert,
    ensure_cluster_ca,
    ensure_peer_cert,
    peer_client_context,
    peer_server_context,
    server_node_id,
)
from orchestrator.security.pki import Pki, cert_to_pem, issue_client_cert, key_to_pem, load_ca
from orchestrator.store.client import client_context as _client_context
from orchestrator.store.service import ServiceTLS

TOKEN = "test-cluster-token-0123456789"
OTHER_TOKEN = "another-cluster-token-9876543210"


@cache
def _ca_pems(token: str) -> tuple[bytes, bytes]:
    cert, key = derive_ca(token)
    return cert_to_pem(cert), key_to_pem(key)


def server_pki(data_dir: Path, node_id: int, token: str = TOKEN) -> PeerPki:
    """A server's `pki/` under data_dir: the token's CA, peer.crt for node_id, admin.crt."""
    p = PeerPki.of(data_dir)
    if not p.ca_cert.exists():
        crt, key = _ca_pems(token)
        p.dir.mkdir(parents=True, exist_ok=True)
        p.ca_key.write_bytes(key)
        p.ca_cert.write_bytes(crt)
    ensure_cluster_ca(data_dir, token)  # a no-op now; checks the pair is complete
    ensure_peer_cert(data_dir, node_id, ["127.0.0.1"])
    ensure_admin_cert(data_dir)
    return p


def issue(data_dir: Path, name: str, cn: str, orgs: list[str]) -> tuple[Path, Path]:
    """A client certificate (CN, O) from data_dir's CA, written as `pki/<name>.crt|key`."""
    p = PeerPki.of(data_dir)
    ca_cert, ca_key = load_ca(p.dir)
    # issue_client_cert needs a Pki; the serving certificate is not used for it.
    crt, key = issue_client_cert(Pki(p.dir, ca_cert, ca_key, ca_cert), cn, orgs)
    cert_path, key_path = p.dir / f"{name}.crt", p.dir / f"{name}.key"
    cert_path.write_bytes(crt)
    key_path.write_bytes(key)
    return cert_path, key_path


def agent_cert(data_dir: Path, name: str = "edge-1") -> tuple[Path, Path]:
    """A node agent's client certificate (CN system:node:<name>, O system:nodes), signed by
    data_dir's CA: what every joined device holds."""
    return issue(data_dir, "agent", f"system:node:{name}", ["system:nodes"])


def peer_tls(data_dir: Path) -> PeerTLS:
    server, client = peer_server_context(data_dir), peer_client_context(data_dir)
    return PeerTLS(lambda: server, lambda: client, server_node_id)


def service_tls(data_dir: Path) -> ServiceTLS:
    ctx = peer_server_context(data_dir)
    return ServiceTLS(lambda: ctx, client_port_identity)


def client_context(data_dir: Path, cert: Path | None, key: Path | None) -> ssl.SSLContext:
    """A client context trusting data_dir's CA, presenting cert/key (or no certificate)."""
    ca = PeerPki.of(data_dir).ca_cert.read_bytes()
    if cert is None or key is None:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=ca.decode())
        ctx.check_hostname = False
        return ctx
    return _client_context(ca, str(cert), str(key))


__all__ = [
    "OTHER_TOKEN",
    "TOKEN",
    "agent_cert",
    "client_context",
    "issue",
    "peer_tls",
    "server_pki",
    "service_tls",
]
