"""The certificates the store's own ports authenticate with: the cluster CA derived from the
cluster token, each server's peer certificate, the admin client certificate; and the TLS
contexts and identity checks of the Raft peer port and the store client port.

Trust root. The cluster token already is a cluster's master secret: it decrypts the shared
bundle that holds the CA key (`shared`) and admits joining servers. So a NEW cluster's CA key is
derived from it (`derive_ca_key`: scrypt, then reduced to a P-256 scalar) and its certificate is
built deterministically (fixed subject, serial derived from the key, fixed validity,
deterministic ECDSA): every founder of an `--initial-cluster` started with the same token has
the same CA before Raft can talk, byte for byte, and a `--join HOST:PORT --token T` joiner
derives it too. An existing `pki/ca.crt` is never replaced (`ensure_cluster_ca`): an upgraded
site keeps its random CA, which every one of its API servers already shares through the bundle.
Because anyone holding the CA certificate (public) could brute-force a weak token offline, a
multi-founder cluster refuses tokens shorter than `MIN_FOUNDER_TOKEN` characters.

Files in `DATA_DIR/pki/` (PEM, written atomically under the pair's `pki.pair_lock`):

* `peer.crt`/`peer.key`: this server's peer certificate, EC P-256, 1 year, EKU serverAuth and
  clientAuth, CN `system:orchestrator:server:<node id>`, O `system:orchestrator:servers`, SANs
  `pki.default_sans()` plus the hosts of the peer, advertised and client addresses. It is both
  the Raft peer port's certificate (either direction) and the server's client certificate on
  other servers' client ports (joining). Re-issued at start when missing, of another node, of
  another CA, with other SANs or expiring within `RENEW_BEFORE`; renewed while running by the
  `CertRenewer` (leaf `peer`) and by `orchestrator certs rotate`.
* `admin.crt`/`admin.key`: the CLI's client certificate (CN `admin`, O `system:masters`,
  clientAuth), issued at start when missing, of another CA or expiring (leaf `admin`).

Who may connect (checked after the handshake, which already requires a certificate signed by
the cluster CA, TLS 1.3 only): on the peer port, only server certificates, whose node id the
transport then matches against the hello and its current members (`raft.transport`); on the
client port, server certificates and admin certificates (`client_port_identity`). A node
agent's certificate (O `system:nodes`) is signed by the same CA and refused by both. Host names
are not checked (`check_hostname` off): identity is the node id in the certificate, not an
address, so servers behind NAT or renumbered keep working.

Blocking file I/O and CPU (scrypt takes ~50 ms): start-up and CLI code; async callers run it in
a worker thread.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from orchestrator.security.pki import (
    LEAF_DAYS,
    RENEW_BEFORE,
    PkiError,
    atomic_write,
    ca_certificate,
    cert_sans,
    cert_to_pem,
    default_sans,
    general_name,
    issue_leaf,
    key_to_pem,
    load_ca,
    new_ca,
    pair_lock,
    san_key,
    signed_by,
    write_pair,
    x509_name,
)

__all__ = [
    "ADMIN_CN",
    "ADMIN_GROUP",
    "MIN_FOUNDER_TOKEN",
    "SERVERS_GROUP",
    "PeerPki",
    "ca_fingerprint",
    "client_port_identity",
    "derive_ca",
    "ensure_admin_cert",
    "ensure_cluster_ca",
    "ensure_peer_cert",
    "peer_client_context",
    "peer_hosts",
    "peer_server_context",
    "prepare",
    "server_node_id",
    "store_server_context",
]

CA_SALT = b"orchestrator-ca-v1"
# scrypt cost: ~16 MiB and ~50 ms once per start; together with MIN_FOUNDER_TOKEN it makes an
# offline guess of the token from the public CA certificate expensive.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
# Why a minimum: the derived CA's public key is a function of the token, so a short token could
# be found by trying candidates offline against any copy of `ca.crt` (which is public: agents
# fetch it anonymously). 16 characters of a generated token are far out of reach.
MIN_FOUNDER_TOKEN = 16
_CA_NOT_BEFORE = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
_CA_NOT_AFTER = dt.datetime(2055, 1, 1, tzinfo=dt.UTC)
_P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551

SERVERS_GROUP = "system:orchestrator:servers"
SERVER_CN_PREFIX = "system:orchestrator:server:"
ADMIN_CN = "admin"
ADMIN_GROUP = "system:masters"
PEER_LEAF = "peer"
ADMIN_LEAF = "admin"
_WILDCARDS = frozenset({"", "0.0.0.0", "::", "[::]"})


def derive_ca_key(token: str) -> ec.EllipticCurvePrivateKey:
    """The CA's EC P-256 key for a cluster token (module doc): scrypt, reduced mod the order."""
    raw = hashlib.scrypt(
        token.encode(), salt=CA_SALT, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, maxmem=64 << 20, dklen=32
    )
    # Reduced into [1, order - 1]: 0 is not a key; the bias of a 256-bit value mod a 256-bit
    # order is negligible.
    scalar = int.from_bytes(raw, "big") % (_P256_ORDER - 1) + 1
    return ec.derive_private_key(scalar, ec.SECP256R1())


def derive_ca(token: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """The CA certificate and key a new cluster with this token has: the same bytes wherever
    it is computed (deterministic serial, validity and signature)."""
    key = derive_ca_key(token)
    spki = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    serial = int.from_bytes(hashlib.sha256(spki).digest()[:16], "big") >> 1 or 1
    cert = ca_certificate(key, serial, _CA_NOT_BEFORE, _CA_NOT_AFTER, deterministic=True)
    return cert, key


def check_founder_token(token: str, founders: int) -> None:
    """ValueError when a multi-founder cluster's token is too weak to derive its CA from."""
    if founders > 1 and len(token) < MIN_FOUNDER_TOKEN:
        raise ValueError(
            f"the cluster token is {len(token)} characters; a multi-server cluster needs at "
            f"least {MIN_FOUNDER_TOKEN} (its CA is derived from it): omit --token on the first "
            "server to have one generated, or give a longer one"
        )


def ensure_cluster_ca(data_dir: Path, token: str) -> bool:
    """Write the token-derived CA into `DATA_DIR/pki` unless a CA is there already (never
    replaced: module doc); without a token (in-process test servers) a random one. Returns
    whether it was written. Blocking."""
    pki_dir = Path(data_dir) / "pki"
    crt, key_path = pki_dir / "ca.crt", pki_dir / "ca.key"
    if crt.exists() or key_path.exists():
        if not (crt.exists() and key_path.exists()):
            raise PkiError(
                f"{pki_dir}: found only one of ca.crt and ca.key; restore the other "
                "(a new CA would invalidate every issued certificate)"
            )
        return False
    pki_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    cert, key = derive_ca(token) if token else new_ca(_now())
    atomic_write(key_path, key_to_pem(key), 0o600)
    atomic_write(crt, cert_to_pem(cert), 0o644)
    return True


def prepare(data_dir: Path, token: str, node_id: int, addresses: list[str]) -> None:
    """What a server needs before its store starts (module doc): the CA (kept, or derived from
    the token), its peer certificate for the hosts of `addresses`, the admin certificate.
    Blocking (an scrypt the first time)."""
    ensure_cluster_ca(data_dir, token)
    ensure_peer_cert(data_dir, node_id, peer_hosts(addresses))
    ensure_admin_cert(data_dir)


def ca_fingerprint(ca_pem: bytes) -> str:
    """Hex SHA-256 of a CA certificate's DER (the pin of K10 tokens; the CLI shows 12 digits)."""
    cert = x509.load_pem_x509_certificate(ca_pem)
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


@dataclass(frozen=True)
class PeerPki:
    """Paths of a server's store credentials in `DATA_DIR/pki`."""

    dir: Path

    @classmethod
    def of(cls, data_dir: str | os.PathLike[str]) -> PeerPki:
        return cls(Path(data_dir) / "pki")

    @property
    def ca_cert(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def peer_cert(self) -> Path:
        return self.dir / "peer.crt"

    @property
    def peer_key(self) -> Path:
        return self.dir / "peer.key"

    @property
    def admin_cert(self) -> Path:
        return self.dir / "admin.crt"

    @property
    def admin_key(self) -> Path:
        return self.dir / "admin.key"


def _load_ca(p: PeerPki) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    return load_ca(p.dir)


def peer_hosts(addresses: list[str]) -> list[str]:
    """The hosts of HOST:PORT addresses worth naming in a certificate (no wildcards)."""
    out: list[str] = []
    for address in addresses:
        if not address:
            continue
        host = address.rsplit(":", 1)[0] if ":" in address else address
        host = host.strip("[]")
        if host not in _WILDCARDS:
            out.append(host)
    return out


def _peer_names(hosts: list[str]) -> list[x509.GeneralName]:
    return [general_name(s) for s in dict.fromkeys([*default_sans(), *hosts]) if s]


def _issue(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    subject: x509.Name,
    usages: list[x509.ObjectIdentifier],
    now: dt.datetime,
    sans: list[x509.GeneralName] | None,
) -> tuple[bytes, bytes]:
    cert, key = issue_leaf(ca_cert, ca_key, subject, usages, now, LEAF_DAYS, sans)
    return cert_to_pem(cert), key_to_pem(key)


def _current(cert_path: Path, key_path: Path) -> x509.Certificate | None:
    with pair_lock(cert_path):
        if not (cert_path.exists() and key_path.exists()):
            return None
        try:
            return x509.load_pem_x509_certificate(cert_path.read_bytes())
        except ValueError:
            return None


def _fresh(cert: x509.Certificate, ca_cert: x509.Certificate, now: dt.datetime) -> bool:
    return (
        signed_by(cert, ca_cert)
        and cert.not_valid_before_utc <= now
        and cert.not_valid_after_utc - RENEW_BEFORE > now
    )


def peer_subject(node_id: int) -> x509.Name:
    return x509_name(f"{SERVER_CN_PREFIX}{node_id}", [SERVERS_GROUP])


def issue_peer_cert(
    data_dir: str | os.PathLike[str],
    node_id: int,
    hosts: list[str] | None,
    *,
    now: dt.datetime | None = None,
) -> None:
    """Issue `peer.crt`/`peer.key` now (a fresh key) for `hosts` plus the default SANs; with
    `hosts=None` for exactly the SANs of the current certificate (`certs rotate`, which does
    not know the server's flags). Blocking."""
    p = PeerPki.of(data_dir)
    ca_cert, ca_key = _load_ca(p)
    if hosts is None:
        current = _current(p.peer_cert, p.peer_key)
        names = (cert_sans(current) if current is not None else []) or _peer_names([])
    else:
        names = _peer_names(hosts)
    usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    cert, key = _issue(ca_cert, ca_key, peer_subject(node_id), usages, now or _now(), names)
    write_pair(p.peer_cert, p.peer_key, cert, key)


def ensure_peer_cert(
    data_dir: str | os.PathLike[str],
    node_id: int,
    hosts: list[str],
    *,
    now: dt.datetime | None = None,
) -> bool:
    """(Re)issue the peer certificate unless the current one is this node's, signed by the
    current CA, for exactly these SANs and not expiring soon. Returns whether it issued."""
    now = now or _now()
    p = PeerPki.of(data_dir)
    ca_cert, _ = _load_ca(p)
    cert = _current(p.peer_cert, p.peer_key)
    if (
        cert is not None
        and _fresh(cert, ca_cert, now)
        and cert.subject == peer_subject(node_id)
        and san_key(cert_sans(cert)) == san_key(_peer_names(hosts))
    ):
        return False
    issue_peer_cert(data_dir, node_id, hosts, now=now)
    return True


def issue_admin_cert(data_dir: str | os.PathLike[str], *, now: dt.datetime | None = None) -> None:
    """Issue `admin.crt`/`admin.key` now (CN admin, O system:masters, clientAuth). Blocking."""
    p = PeerPki.of(data_dir)
    ca_cert, ca_key = _load_ca(p)
    subject = x509_name(ADMIN_CN, [ADMIN_GROUP])
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    cert, key = _issue(ca_cert, ca_key, subject, usages, now or _now(), None)
    write_pair(p.admin_cert, p.admin_key, cert, key)


def ensure_admin_cert(data_dir: str | os.PathLike[str], *, now: dt.datetime | None = None) -> bool:
    """Issue the admin client certificate when missing, of another CA or expiring soon."""
    now = now or _now()
    p = PeerPki.of(data_dir)
    ca_cert, _ = _load_ca(p)
    cert = _current(p.admin_cert, p.admin_key)
    if cert is not None and _fresh(cert, ca_cert, now):
        return False
    issue_admin_cert(data_dir, now=now)
    return True


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# ---------------------------------------------------------------------------- TLS contexts


def _base(purpose: ssl.Purpose, ca_pem: bytes, cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(purpose, cadata=ca_pem.decode("ascii"))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.options |= ssl.OP_NO_COMPRESSION
    # Identity is the node id or group in the certificate, not a host name (module doc).
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    with pair_lock(cert):
        ctx.load_cert_chain(certfile=str(cert), keyfile=str(key))
    return ctx


def peer_server_context(data_dir: str | os.PathLike[str]) -> ssl.SSLContext:
    """The accepting side of the peer port: the peer certificate, client certificates required."""
    p = PeerPki.of(data_dir)
    ctx = _base(ssl.Purpose.CLIENT_AUTH, p.ca_cert.read_bytes(), p.peer_cert, p.peer_key)
    ctx.num_tickets = 0  # no session resumption: every connection shows its certificate
    return ctx


def peer_client_context(data_dir: str | os.PathLike[str]) -> ssl.SSLContext:
    """The connecting side of the peer port (and a server's own client-port connections, when
    it joins): the peer certificate as the client certificate, the server's one verified."""
    p = PeerPki.of(data_dir)
    return _base(ssl.Purpose.SERVER_AUTH, p.ca_cert.read_bytes(), p.peer_cert, p.peer_key)


def store_server_context(data_dir: str | os.PathLike[str]) -> ssl.SSLContext:
    """The client port: served with the peer certificate, client certificates required (which
    ones are allowed: `client_port_identity`)."""
    return peer_server_context(data_dir)


# ---------------------------------------------------------------------------- identities


def _subject(der: bytes | None) -> tuple[str, frozenset[str]] | None:
    if not der:
        return None
    try:
        subject = x509.load_der_x509_certificate(der).subject
    except ValueError:
        return None
    cns = subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    orgs = subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    if len(cns) != 1:
        return None
    return str(cns[0].value), frozenset(str(o.value) for o in orgs)


def server_node_id(der: bytes | None) -> int | str:
    """The node id a verified certificate (DER) names, if it is a server's peer certificate;
    else a short reason why it is not one."""
    subject = _subject(der)
    if subject is None:
        return "no certificate"
    cn, orgs = subject
    if SERVERS_GROUP not in orgs or not cn.startswith(SERVER_CN_PREFIX):
        return f"{cn!r} is not a server certificate"
    tail = cn[len(SERVER_CN_PREFIX) :]
    if not tail.isdigit() or int(tail) < 1:
        return f"{cn!r} names no node id"
    return int(tail)


def client_port_identity(der: bytes | None) -> str | None:
    """Who a verified certificate (DER) is on the client port: "server N" or "admin"; None
    when it may not connect (an agent's certificate, any other user's)."""
    subject = _subject(der)
    if subject is None:
        return None
    cn, orgs = subject
    nid = server_node_id(der)
    if isinstance(nid, int):
        return f"server {nid}"
    if ADMIN_GROUP in orgs:
        return cn or "admin"
    return None
