"""Authentication: who is making this request (a bearer token, or a client certificate).

Order: an `Authorization: Bearer` header is checked against the token store and decides alone (a
wrong token is a 401 even if a certificate is also presented: the client is misconfigured and
should hear so); without one, a client certificate issued by the cluster CA names the user
(CN) and groups (O), as in Kubernetes. Otherwise the request is anonymous (`None`); the app
answers 401 except on the anonymous paths (`ANONYMOUS_PATHS`).

Invariants: every returned user has the group `system:authenticated`; a certificate counts only
if the cluster CA signed it, it is inside its validity window, and it allows client auth (the
serving certificate therefore cannot be used to log in).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from orchestrator.security.pki import signed_by
from orchestrator.security.tokens import TokenEntry

AUTHENTICATED = "system:authenticated"
ANONYMOUS_PATHS = frozenset({"/healthz", "/livez", "/readyz", "/version"})

Headers = Iterable[tuple[bytes, bytes]] | Mapping[str, str] | Mapping[bytes, bytes]


@dataclass(frozen=True, slots=True)
class User:
    name: str
    groups: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.groups, tuple):
            object.__setattr__(self, "groups", tuple(self.groups))

    def in_group(self, group: str) -> bool:
        return group in self.groups


def authenticated_user(name: str, groups: Iterable[str]) -> User:
    """The user `name` with `groups` (deduplicated, order kept) and `system:authenticated`,
    which every authenticated user has (module doc): for whoever turns a verified credential,
    such as a join token, into a user."""
    gs = list(dict.fromkeys(groups))
    if AUTHENTICATED not in gs:
        gs.append(AUTHENTICATED)
    return User(name, tuple(gs))


def _authorization(headers: Headers) -> str | None:
    items: Iterable[tuple[str | bytes, str | bytes]]
    items = headers.items() if isinstance(headers, Mapping) else headers
    for k, v in items:
        key = k.decode("latin-1") if isinstance(k, bytes) else k
        if key.lower() == "authorization":
            return v.decode("latin-1") if isinstance(v, bytes) else v
    return None


def bearer_token(headers: Headers) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, if there is one."""
    value = _authorization(headers)
    if value is None:
        return None
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def user_from_certificate(
    der: bytes, ca_cert: x509.Certificate, now: dt.datetime | None = None
) -> User | None:
    """CN/O of a client certificate the CA signed and that is valid now; else None."""
    try:
        cert = x509.load_der_x509_certificate(der)
    except ValueError:
        return None
    now = now or dt.datetime.now(dt.UTC)
    if not signed_by(cert, ca_cert):
        return None
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        return None
    try:
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        eku = None
    if eku is not None and ExtendedKeyUsageOID.CLIENT_AUTH not in eku:
        return None
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not cns:
        return None
    name = cns[0].value
    if not isinstance(name, str) or not name:
        return None
    groups = [str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    return authenticated_user(name, groups)


class TokenLookup(Protocol):
    """A token table: `TokenStore` (a file) or `ClusterTokens` (the replicated store)."""

    def lookup(self, token: str) -> TokenEntry | None: ...


class Authenticator:
    """Bearer token, else client certificate, else None."""

    def __init__(
        self,
        tokens: TokenLookup,
        ca_cert: x509.Certificate,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.tokens = tokens
        self.ca_cert = ca_cert
        self.clock = clock

    def authenticate(self, headers: Headers, client_cert_der: bytes | None) -> User | None:
        if _authorization(headers) is not None:
            token = bearer_token(headers)
            entry = self.tokens.lookup(token) if token else None
            return authenticated_user(entry.name, entry.groups) if entry else None
        if client_cert_der:
            now = dt.datetime.fromtimestamp(self.clock(), dt.UTC)
            return user_from_certificate(client_cert_der, self.ca_cert, now)
        return None
