"""Join tokens that pin the cluster CA, k3s style: `K10<sha256 of the CA certificate>::<creds>`.

Forms (pure parsing; nothing here does network I/O except `verify_bundle_pin`):

    K10<64 hex>::<id>.<secret>   a bootstrap token (id 6, secret 16 chars of [a-z0-9]) with the
                                 SHA-256 (hex) of the cluster CA certificate in DER — what
                                 `orchestrator token create` prints, for agents
    <id>.<secret>                the same token without the pin (kubeadm's form; the joining
                                 device must then be given the CA some other way)
    K10<64 hex>::<cluster token> a server's join token (the cluster token, pinned); the secret
                                 part is what the store's `join` op and the shared bundle use

The pin is not a credential: a joining device computes the SHA-256 of the CA it was shown and
compares it with the pin BEFORE sending any credential; only the `<creds>` part is ever sent
(as a Bearer token, or to the store's join op). `ca_sha256` accepts PEM or DER.

Servers (`--join URL --token K10...`): `verify_bundle_pin` reads the cluster's shared bundle
through the member's client port (no credential is sent for that), decrypts it with the
cluster token (the bundle is authenticated encryption: a stranger cannot forge one) and checks
its CA against the pin before the join request carries the token. With `--server URL` a server
first checks the pin like an agent, on the CA its API serves (`orchestrator.cluster.join`).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
import string
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import serialization

PREFIX = "K10"
SEPARATOR = "::"
BOOTSTRAP_RE = re.compile(r"^([a-z0-9]{6})\.([a-z0-9]{16})$")
_PIN_RE = re.compile(r"^[0-9a-f]{64}$")
_ALNUM = string.ascii_lowercase + string.digits

log = logging.getLogger(__name__)


class PinMismatch(PermissionError):
    """The CA the server showed is not the one the token pins: nothing was sent."""


@dataclass(frozen=True, slots=True)
class JoinToken:
    pin: str | None  # hex SHA-256 of the CA certificate (DER), lower case; None: not pinned
    credentials: str  # what is sent: `<id>.<secret>`, a node token, or the cluster token

    @property
    def bootstrap_id(self) -> str | None:
        m = BOOTSTRAP_RE.match(self.credentials)
        return m.group(1) if m else None

    def __str__(self) -> str:
        return format_token(self.pin, self.credentials) if self.pin else self.credentials


def parse_token(text: str) -> JoinToken:
    """`K10<pin>::<creds>` or bare `<creds>`. ValueError for a malformed K10 token."""
    text = text.strip()
    if not text.startswith(PREFIX) or SEPARATOR not in text:
        if not text:
            raise ValueError("empty token")
        return JoinToken(None, text)
    pin, _, creds = text[len(PREFIX) :].partition(SEPARATOR)
    pin = pin.lower()
    if pin.startswith("sha256:"):
        pin = pin[len("sha256:") :]
    if not _PIN_RE.match(pin):
        raise ValueError("malformed K10 token: the CA hash must be 64 hex digits")
    if not creds:
        raise ValueError("malformed K10 token: nothing after '::'")
    return JoinToken(pin, creds)


def format_token(pin: str, credentials: str) -> str:
    pin = pin.removeprefix("sha256:")
    return f"{PREFIX}{pin}{SEPARATOR}{credentials}"


def new_bootstrap_token() -> tuple[str, str]:
    """A fresh `(id, "<id>.<secret>")` (6 + 16 characters of [a-z0-9])."""
    token_id = "".join(secrets.choice(_ALNUM) for _ in range(6))
    return token_id, f"{token_id}.{''.join(secrets.choice(_ALNUM) for _ in range(16))}"


def ca_sha256(ca: bytes) -> str:
    """Hex SHA-256 of the (first) CA certificate's DER, from PEM or DER bytes."""
    if b"-----BEGIN" in ca:
        cert = x509.load_pem_x509_certificate(ca)
        ca = cert.public_bytes(serialization.Encoding.DER)
    return hashlib.sha256(ca).hexdigest()


def check_pin(ca: bytes, pin: str) -> None:
    """Raise `PinMismatch` unless the certificate `ca` (PEM or DER) hashes to `pin`."""
    try:
        got = ca_sha256(ca)
    except ValueError as exc:
        raise PinMismatch(f"the server sent no valid CA certificate ({exc})") from None
    if not hmac.compare_digest(got, pin.removeprefix("sha256:").lower()):
        raise PinMismatch(
            f"the server's CA (sha256:{got}) does not match the token's pin "
            f"(sha256:{pin}); nothing was sent to it"
        )


async def verify_bundle_pin(
    get: Callable[[str], Awaitable[bytes | None]],
    cluster_token: str,
    pin: str,
    *,
    wait: float = 30.0,
    interval: float = 1.0,
) -> None:
    """Check the CA in the cluster's shared bundle (read with `get(key)`, retried on connection
    errors and while no bundle is published, for up to `wait` seconds) against `pin`."""
    import trio

    from orchestrator.security.shared import KEY, unseal
    from orchestrator.store.client import ClientError

    sealed: bytes | None = None
    with trio.move_on_after(wait):
        while True:
            try:
                sealed = await get(KEY)
            except (ConnectionError, ClientError) as exc:
                log.warning("reading the cluster's CA to check the pin failed (%s); retrying", exc)
            if sealed is not None:
                break
            await trio.sleep(interval)
    if sealed is None:
        raise PinMismatch(
            "cannot check the token's CA pin: the cluster has published no CA (its servers "
            "serve no API?); the token was not sent"
        )
    try:
        bundle = unseal(sealed, cluster_token)
    except PermissionError:
        raise PinMismatch(
            "the cluster's shared credentials cannot be decrypted with this token: wrong token, "
            "or not the cluster you meant; the token was not sent"
        ) from None
    check_pin(bundle.ca_crt, pin)
