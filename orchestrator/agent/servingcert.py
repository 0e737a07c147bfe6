"""The serving certificate of a joined agent's log endpoint: key made here, certificate from the CA.

A standalone agent does not hold the cluster CA key, so it cannot issue itself the certificate
its HTTPS log endpoint (`logs.LogEndpoint`) needs and the API server's log proxy verifies. So:

* it generates an EC P-256 key pair locally — the private key never leaves the device — and
  sends the public key (PEM) with its node name's addresses (node IP(s) and name) to the server:
  with the join request (`POST /orchestrator/v1/join {nodeName, servingKey, addresses}`), or
  later with its node credentials (`POST /orchestrator/v1/node-certificate {servingKey,
  addresses}`, allowed to `system:node:<name>` for its own name only);
* the server answers a certificate signed by the cluster CA (1 year, SANs = node name +
  addresses), stored as `DATA_DIR/kubelet.crt` beside `kubelet.key` (0600; written first, so a
  crash in between leaves a mismatched pair, which `usable` rejects and the next start replaces);
* later starts reuse the pair while it is signed by the cluster CA, matches, covers the node's
  addresses and has more than `RENEW_BEFORE` left; else they ask for a new one. When that fails
  (server unreachable) a still-valid old certificate is used anyway;
* while the agent runs, `leaf` makes the pair a renewed leaf (`security.renewal`): within
  `RENEW_BEFORE` of expiry it asks again the same way (`renew`: a new key, node-certificate),
  retrying while the server is unreachable, and the log endpoint serves the new pair without a
  restart; a pair replaced on disk (`orchestrator certs rotate --data-dir`) is picked up too.

The pair is written and read under `pki.pair_lock`, so a reader never sees a new key with an
old certificate.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import logging
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import trio
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from orchestrator.client.config import ClientConfig
from orchestrator.security.pki import pair_lock, signed_by, write_pair
from orchestrator.security.renewal import Leaf

log = logging.getLogger(__name__)

CERT_FILE = "kubelet.crt"
KEY_FILE = "kubelet.key"
NODE_CERT_PATH = "/orchestrator/v1/node-certificate"
RENEW_BEFORE = dt.timedelta(days=30)
LEAF = "kubelet"  # its name for the renewal loop and the expiry metric


@dataclass(frozen=True)
class ServingKey:
    """A fresh key pair: `private_pem` stays here, `public_pem` goes to the server."""

    private_pem: bytes
    public_pem: str

    @classmethod
    def generate(cls) -> ServingKey:
        key = ec.generate_private_key(ec.SECP256R1())
        private = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        public = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        return cls(private, public.decode("ascii"))

    def request(self, addresses: list[str]) -> dict[str, Any]:
        """The request body fields for the server."""
        return {"servingKey": self.public_pem, "addresses": list(addresses)}


def paths(data_dir: Path) -> tuple[Path, Path]:
    """(certificate, key) paths in the agent's data dir."""
    return Path(data_dir) / CERT_FILE, Path(data_dir) / KEY_FILE


def store(data_dir: Path, key: ServingKey, cert_pem: bytes) -> tuple[Path, Path]:
    """Write key (0600) then certificate (blocking I/O); returns their paths."""
    cert_path, key_path = paths(data_dir)
    write_pair(cert_path, key_path, cert_pem, key.private_pem)
    return cert_path, key_path


def _sans(cert: x509.Certificate) -> set[str]:
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    names = {str(ip) for ip in ext.get_values_for_type(x509.IPAddress)}
    return names | {d.lower() for d in ext.get_values_for_type(x509.DNSName)}


def _normal(address: str) -> str:
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return address.lower()


def check(
    data_dir: Path,
    ca_pem: bytes,
    addresses: list[str],
    *,
    renew_before: dt.timedelta = RENEW_BEFORE,
    now: dt.datetime | None = None,
) -> bool:
    """Whether the stored pair can serve: present, matching, signed by the CA, covering
    `addresses` and valid for more than `renew_before` (0: merely not expired). Blocking I/O."""
    cert_path, key_path = paths(data_dir)
    try:
        with pair_lock(cert_path):
            cert_pem, key_pem = cert_path.read_bytes(), key_path.read_bytes()
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
        ca = x509.load_pem_x509_certificate(ca_pem)
    except (OSError, ValueError) as exc:
        if cert_path.exists() or key_path.exists():
            log.warning("serving certificate in %s unusable: %s", data_dir, exc)
        return False
    public = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    if public != cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ):
        return False
    if not signed_by(cert, ca):
        return False
    if not {_normal(a) for a in addresses if a} <= _sans(cert):
        return False
    now = now or dt.datetime.now(dt.UTC)
    return cert.not_valid_after_utc - renew_before > now


def node_addresses(node_name: str, node_ip: str) -> list[str]:
    """The SANs an agent asks for: its node name and InternalIP (the address the API server's
    log proxy dials; the default is the host's outbound address, as the Node reports)."""
    from orchestrator.agent.node import default_ip

    return list(dict.fromkeys([node_name, node_ip or default_ip()]))


async def request_certificate(cfg: ClientConfig, key: ServingKey, addresses: list[str]) -> bytes:
    """A new certificate for `key` with the node credentials in `cfg` (node-certificate)."""
    from orchestrator.client.rest import RestClient

    async with RestClient(cfg, user_agent="orchestrator-agent") as rest:
        doc = await rest.request("POST", NODE_CERT_PATH, body=key.request(addresses))
    cert = doc.get("servingCertificate") if isinstance(doc, dict) else None
    if not isinstance(cert, str) or "BEGIN CERTIFICATE" not in cert:
        raise ValueError("the server's answer carries no serving certificate")
    return cert.encode("ascii")


async def renew(cfg: ClientConfig, data_dir: Path, addresses: list[str]) -> tuple[Path, Path]:
    """A new key and certificate now (node-certificate, with the node credentials in `cfg`),
    stored; raises when the server refuses or cannot be reached (the old pair stays)."""
    key = await trio.to_thread.run_sync(ServingKey.generate)
    cert_pem = await request_certificate(cfg, key, addresses)
    return await trio.to_thread.run_sync(store, data_dir, key, cert_pem)


def leaf(cfg: ClientConfig, data_dir: Path, addresses: list[str]) -> Leaf:
    """The pair as a leaf of the agent's renewal loop (module doc)."""
    cert_path, key_path = paths(data_dir)
    issue = partial(renew, cfg, Path(data_dir), list(addresses))
    return Leaf(LEAF, cert_path, key_path, issue, renew_before=RENEW_BEFORE)


async def ensure_serving_cert(
    cfg: ClientConfig, data_dir: Path, addresses: list[str]
) -> tuple[Path, Path] | None:
    """(certificate, key) paths for the log endpoint, renewed when needed (module doc); None
    when there is none to serve with (no CA known, or none could be obtained)."""
    from orchestrator.client.protocol import ApiConnectionError, ApiException

    if cfg.ca_pem is None:
        log.warning("no cluster CA known: the log endpoint is not served")
        return None
    ca_pem = cfg.ca_pem
    if await trio.to_thread.run_sync(lambda: check(data_dir, ca_pem, addresses)):
        return paths(data_dir)
    try:
        stored = await renew(cfg, data_dir, addresses)
    except (ApiException, ApiConnectionError, ValueError, OSError) as exc:
        still_valid = await trio.to_thread.run_sync(
            lambda: check(data_dir, ca_pem, addresses, renew_before=dt.timedelta(0))
        )
        log.warning(
            "could not get a serving certificate for the log endpoint: %s%s",
            exc,
            " (using the current one meanwhile)" if still_valid else "",
        )
        return paths(data_dir) if still_valid else None
    log.info("new serving certificate for the log endpoint (SANs %s)", ", ".join(addresses))
    return stored
