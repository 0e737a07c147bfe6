"""The cluster's PKI in `DATA_DIR/pki/`: one CA, the API server's serving certificate, client certs.

Files (PEM): `ca.crt`, `ca.key` (EC P-256, 10 years), `apiserver.crt`, `apiserver.key` (EC P-256,
1 year, signed by the CA, SANs = localhost, the host name, 127.0.0.1, ::1 plus what the caller
asks for). Client certificates follow Kubernetes: CN = user name, O = groups.

Invariants: the CA is created once and never replaced by this module (a new CA would orphan
every issued client certificate and kubeconfig); the serving certificate is re-issued when the
requested SANs differ from its SANs, when it was not signed by the current CA, or when it expires
within `RENEW_BEFORE` (k3s renews leaves 120 days ahead), and on demand (`renew_serving_cert`:
the running server's renewal loop, `orchestrator certs rotate`). Every file is written
atomically (temporary file, fsync, rename, fsync of the directory); keys with mode 0600. A
certificate/key pair is written and read under its `pair_lock` (an flock beside it), so another
process (`certs rotate` while the server runs) never makes anyone read a new key with an old
certificate.

The building blocks (`new_key`, `new_ca`, `load_ca`, `x509_name`, `general_name`, `cert_sans`,
`san_key`, `cert_to_pem`, `key_to_pem`) are public because `peercerts` issues the peer port's
certificates from its own cluster CA with them.

This is startup/CLI code: it does blocking file I/O; async callers run it in a worker thread.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import ipaddress
import os
import socket
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
LEAF_DAYS = 365
RENEW_BEFORE = dt.timedelta(days=120)
CA_COMMON_NAME = "orchestrator-ca"
SERVING_COMMON_NAME = "orchestrator-apiserver"

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def atomic_write(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Replace `path` with `data` so readers see the old or the new file, never a torn one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # the umask must not widen or narrow what we asked for
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


@contextlib.contextmanager
def pair_lock(cert_path: Path, *, exclusive: bool = False) -> Iterator[None]:
    """Hold the lock of the certificate/key pair whose certificate is `cert_path` (blocking):
    `exclusive` to write the pair, shared to read it. The lock is an flock on
    `.<name>.lock` beside the certificate, so it also holds between processes. A reader that
    cannot create the lock file (no directory yet, read-only) reads without it."""
    cert_path = Path(cert_path)
    lock_path = cert_path.with_name(f".{cert_path.name}.lock")
    if exclusive:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        if exclusive:
            raise
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # releases the lock


def write_pair(cert_path: Path, key_path: Path, cert_pem: bytes, key_pem: bytes) -> None:
    """Replace a certificate and its key (key first, 0600; certificate 0644) under the pair's
    lock. Blocking I/O."""
    with pair_lock(cert_path, exclusive=True):
        atomic_write(key_path, key_pem, 0o600)
        atomic_write(cert_path, cert_pem, 0o644)


class PkiError(ValueError):
    """A data directory's PKI is missing or unusable; the message says which file and why."""


@dataclass(frozen=True)
class Pki:
    """The loaded PKI. `ca_key` is private to this process; nothing serialises it but `ca.key`."""

    dir: Path
    ca_cert: x509.Certificate
    ca_key: ec.EllipticCurvePrivateKey
    serving_cert: x509.Certificate

    @property
    def ca_cert_path(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def serving_cert_path(self) -> Path:
        return self.dir / "apiserver.crt"

    @property
    def serving_key_path(self) -> Path:
        return self.dir / "apiserver.key"

    @property
    def ca_pem(self) -> bytes:
        return self.ca_cert.public_bytes(serialization.Encoding.PEM)

    def ca_hash(self) -> str:
        """`sha256:<hex>` of the CA certificate (DER), for CA-pinned join tokens."""
        der = self.ca_cert.public_bytes(serialization.Encoding.DER)
        return "sha256:" + hashlib.sha256(der).hexdigest()


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def key_to_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def cert_to_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def x509_name(common_name: str, organizations: list[str] | tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


def new_ca(now: dt.datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = new_key()
    cert = ca_certificate(
        key,
        x509.random_serial_number(),
        now - dt.timedelta(minutes=5),
        now + dt.timedelta(days=CA_DAYS),
    )
    return cert, key


def ca_certificate(
    key: ec.EllipticCurvePrivateKey,
    serial: int,
    not_before: dt.datetime,
    not_after: dt.datetime,
    *,
    deterministic: bool = False,
) -> x509.Certificate:
    """The self-signed CA certificate of `key`. `deterministic`: an RFC 6979 signature, so the
    same inputs give the same bytes (the token-derived CA, `security.peercerts`)."""
    name = x509_name(CA_COMMON_NAME)
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256(), ecdsa_deterministic=deterministic)
    )


def issue_leaf(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    subject: x509.Name,
    usage: x509.ObjectIdentifier | Sequence[x509.ObjectIdentifier],
    now: dt.datetime,
    days: int,
    sans: list[x509.GeneralName] | None = None,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A leaf signed by the CA for a fresh key (returned with it)."""
    key = new_key()
    cert = _leaf_for(ca_cert, ca_key, key.public_key(), subject, usage, now, days, sans)
    return cert, key


def _leaf_for(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    public_key: ec.EllipticCurvePublicKey,
    subject: x509.Name,
    usage: x509.ObjectIdentifier | Sequence[x509.ObjectIdentifier],
    now: dt.datetime,
    days: int,
    sans: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    """A leaf signed by the CA for `public_key`, for one extended key usage or several."""
    usages = [usage] if isinstance(usage, x509.ObjectIdentifier) else list(usage)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(min(now + dt.timedelta(days=days), ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def general_name(san: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(san))
    except ValueError:
        return x509.DNSName(san.lower())


def default_sans() -> list[str]:
    """What every serving certificate covers: localhost, this host's name, both loopbacks."""
    out = ["localhost", "127.0.0.1", "::1"]
    host = socket.gethostname()
    if host:
        out.append(host)
    return out


def san_key(names: list[x509.GeneralName]) -> frozenset[str]:
    out: set[str] = set()
    for n in names:
        if isinstance(n, x509.IPAddress):
            out.add(f"ip:{n.value}")
        elif isinstance(n, x509.DNSName):
            out.add(f"dns:{n.value.lower()}")
    return frozenset(out)


def cert_sans(cert: x509.Certificate) -> list[x509.GeneralName]:
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    return list(ext.value)


def signed_by(cert: x509.Certificate, ca_cert: x509.Certificate) -> bool:
    """True if `ca_cert` issued `cert` (names and signature)."""
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _serving_ok(
    cert: x509.Certificate, ca_cert: x509.Certificate, wanted: frozenset[str], now: dt.datetime
) -> bool:
    return (
        signed_by(cert, ca_cert)
        and san_key(cert_sans(cert)) == wanted
        and cert.not_valid_after_utc - RENEW_BEFORE > now
        and cert.not_valid_before_utc <= now
    )


def ensure_pki(
    data_dir: str | os.PathLike[str], sans: list[str], *, now: dt.datetime | None = None
) -> Pki:
    """Load `DATA_DIR/pki`, creating the CA on first start and (re)issuing the serving cert.

    `sans` are extra IP addresses or DNS names for the serving certificate, on top of
    `default_sans()`. The CA is never regenerated; a missing CA key next to an existing CA
    certificate is an error (someone removed it: restore it rather than split the cluster).
    """
    now = now or _now()
    pki_dir = Path(data_dir) / "pki"
    pki_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    ca_crt, ca_key_path = pki_dir / "ca.crt", pki_dir / "ca.key"
    if ca_crt.exists() or ca_key_path.exists():
        if not (ca_crt.exists() and ca_key_path.exists()):
            raise RuntimeError(
                f"{pki_dir}: found only one of ca.crt and ca.key; restore the other "
                "(a new CA would invalidate every issued certificate)"
            )
        ca_cert, ca_key = load_ca(pki_dir)
    else:
        ca_cert, ca_key = new_ca(now)
        atomic_write(ca_key_path, key_to_pem(ca_key), 0o600)
        atomic_write(ca_crt, cert_to_pem(ca_cert), 0o644)

    wanted_names = _serving_names(sans)
    wanted = san_key(wanted_names)
    crt_path, key_path = pki_dir / "apiserver.crt", pki_dir / "apiserver.key"
    with pair_lock(crt_path, exclusive=True):
        serving: x509.Certificate | None = None
        if crt_path.exists() and key_path.exists():
            serving = x509.load_pem_x509_certificate(crt_path.read_bytes())
            if not _serving_ok(serving, ca_cert, wanted, now):
                serving = None
        if serving is None:
            serving, key = _serving_leaf(ca_cert, ca_key, wanted_names, now)
            atomic_write(key_path, key_to_pem(key), 0o600)
            atomic_write(crt_path, cert_to_pem(serving), 0o644)
    return Pki(pki_dir, ca_cert, ca_key, serving)


def _serving_names(sans: list[str]) -> list[x509.GeneralName]:
    return [general_name(s) for s in dict.fromkeys([*default_sans(), *sans]) if s]


def _serving_leaf(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    names: list[x509.GeneralName],
    now: dt.datetime,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    return issue_leaf(
        ca_cert,
        ca_key,
        x509_name(SERVING_COMMON_NAME),
        ExtendedKeyUsageOID.SERVER_AUTH,
        now,
        LEAF_DAYS,
        names,
    )


def load_ca(pki_dir: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    ca_crt, ca_key_path = pki_dir / "ca.crt", pki_dir / "ca.key"
    try:
        ca_cert = x509.load_pem_x509_certificate(ca_crt.read_bytes())
    except ValueError as exc:
        raise PkiError(f"{ca_crt}: not a PEM certificate ({exc})") from None
    try:
        loaded = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
    except (ValueError, TypeError) as exc:
        raise PkiError(f"{ca_key_path}: not an unencrypted PEM private key ({exc})") from None
    if not isinstance(loaded, ec.EllipticCurvePrivateKey):
        raise PkiError(f"{ca_key_path}: expected an EC private key")
    return ca_cert, loaded


def load_pki(data_dir: str | os.PathLike[str]) -> Pki:
    """The PKI of an existing data dir, creating nothing (for `orchestrator certs`); PkiError
    when the CA or the serving certificate is missing or unreadable."""
    pki_dir = Path(data_dir) / "pki"
    missing = [n for n in ("ca.crt", "apiserver.crt") if not (pki_dir / n).is_file()]
    if missing:
        raise PkiError(
            f"{pki_dir}: no {' or '.join(missing)} (is {data_dir} the --data-dir of a server "
            "that has started once with the API on?)"
        )
    if not (pki_dir / "ca.key").is_file():
        raise PkiError(
            f"{pki_dir}: no ca.key, so no certificate can be issued; restore it from a backup "
            "or another server's DATA_DIR/pki/ (a new CA would invalidate every kubeconfig)"
        )
    ca_cert, ca_key = load_ca(pki_dir)
    try:  # a certificate file is replaced atomically: no need for the pair's lock
        serving = x509.load_pem_x509_certificate((pki_dir / "apiserver.crt").read_bytes())
    except ValueError as exc:
        raise PkiError(f"{pki_dir / 'apiserver.crt'}: not a PEM certificate ({exc})") from None
    return Pki(pki_dir, ca_cert, ca_key, serving)


def renew_serving_cert(
    pki: Pki, sans: list[str] | None = None, *, now: dt.datetime | None = None
) -> x509.Certificate:
    """Re-issue `apiserver.crt`/`apiserver.key` now (a fresh key, 1 year) under the same CA,
    for `default_sans()` plus `sans`, or with `sans=None` for exactly the SANs of the current
    certificate (what `certs rotate` uses: it does not know the server's flags). Blocking I/O."""
    now = now or _now()
    crt_path, key_path = pki.serving_cert_path, pki.serving_key_path
    with pair_lock(crt_path, exclusive=True):
        if sans is not None:
            names = _serving_names(sans)
        else:
            try:
                names = cert_sans(x509.load_pem_x509_certificate(crt_path.read_bytes()))
            except (OSError, ValueError):
                names = []
            names = names or _serving_names([])
        cert, key = _serving_leaf(pki.ca_cert, pki.ca_key, names, now)
        atomic_write(key_path, key_to_pem(key), 0o600)
        atomic_write(crt_path, cert_to_pem(cert), 0o644)
    return cert


def issue_client_cert(
    pki: Pki,
    common_name: str,
    organizations: list[str] | tuple[str, ...] = (),
    *,
    days: int = LEAF_DAYS,
    now: dt.datetime | None = None,
) -> tuple[bytes, bytes]:
    """A client certificate (CN = user, O = groups) and its key, both PEM. Nothing is stored."""
    cert, key = issue_leaf(
        pki.ca_cert,
        pki.ca_key,
        x509_name(common_name, organizations),
        ExtendedKeyUsageOID.CLIENT_AUTH,
        now or _now(),
        days,
    )
    return cert_to_pem(cert), key_to_pem(key)


def issue_serving_cert(
    pki: Pki,
    common_name: str,
    sans: list[str],
    *,
    days: int = LEAF_DAYS,
    now: dt.datetime | None = None,
) -> tuple[bytes, bytes]:
    """A server certificate for another component (a node agent's log endpoint) and its key,
    both PEM, for `default_sans()` plus `sans` (IP addresses or DNS names). Nothing is stored."""
    names = [general_name(s) for s in dict.fromkeys([*default_sans(), *sans]) if s]
    cert, key = issue_leaf(
        pki.ca_cert,
        pki.ca_key,
        x509_name(common_name),
        ExtendedKeyUsageOID.SERVER_AUTH,
        now or _now(),
        days,
        names,
    )
    return cert_to_pem(cert), key_to_pem(key)


MAX_SANS = 32


def sign_serving_key(
    pki: Pki,
    common_name: str,
    public_key_pem: bytes,
    sans: list[str],
    *,
    days: int = LEAF_DAYS,
    now: dt.datetime | None = None,
) -> bytes:
    """A server certificate (PEM) for a key generated elsewhere — a joined node agent's, whose
    private key never leaves its device. `public_key_pem`: an EC P-256 public key (PEM, SPKI)
    or a CSR (PEM; its signature is checked, its subject and extensions are ignored). SANs are
    exactly `sans` (IP addresses or DNS names), none of this host's. ValueError when the key or
    a SAN is unusable."""
    public_key: object
    if b"CERTIFICATE REQUEST" in public_key_pem:
        csr = x509.load_pem_x509_csr(public_key_pem)
        if not csr.is_signature_valid:
            raise ValueError("the CSR's signature does not verify")
        public_key = csr.public_key()
    else:
        public_key = serialization.load_pem_public_key(public_key_pem)
    if not isinstance(public_key, ec.EllipticCurvePublicKey) or not isinstance(
        public_key.curve, ec.SECP256R1
    ):
        raise ValueError("the key must be an EC P-256 public key")
    names = list(dict.fromkeys(s for s in sans if s))
    if not names or len(names) > MAX_SANS:
        raise ValueError(f"give 1 to {MAX_SANS} subject alternative names")
    cert = _leaf_for(
        pki.ca_cert,
        pki.ca_key,
        public_key,
        x509_name(common_name),
        ExtendedKeyUsageOID.SERVER_AUTH,
        now or _now(),
        days,
        [general_name(s) for s in names],
    )
    return cert_to_pem(cert)
