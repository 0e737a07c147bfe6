"""Cluster-wide credentials shared by every server through the replicated store.

Every server of a cluster must serve with a certificate from the same CA and accept the same
tokens, so a kubeconfig works against any of them. The first server to start publishes a bundle
(CA certificate and key, the token table, the admin token) under one store key; every other
server adopts it before its API listens. The bundle is encrypted with a key derived from the
cluster join token (HKDF-SHA256 -> Fernet), as k3s keeps its bootstrap data in its datastore:
the store's files and snapshots alone do not give away the CA key.

Invariants: the bundle is written once (a create: concurrent first starts race, one wins and
the others adopt the winner's); a server whose token cannot decrypt the bundle refuses to start
rather than split the cluster into two CAs. The bundle's token table is only the start-up
table: each API server copies it into the cluster-wide table (`clustertokens`, one store key
per token, migrated once per cluster) and authenticates from there, so tokens added or revoked
later hold on every server; the `tokens.yaml` adopted here is not consulted afterwards.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgpack
import trio
from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from orchestrator.security.pki import atomic_write
from orchestrator.security.tokens import TokenStore
from orchestrator.store import types as st
from orchestrator.store.api import Store

log = logging.getLogger(__name__)

KEY = "/orchestrator/bootstrap"
RETRY = 1.0  # seconds between attempts while the store has no quorum yet


@dataclass(frozen=True)
class Bundle:
    ca_crt: bytes
    ca_key: bytes
    tokens: bytes  # the token table file (hashes only)
    admin_token: str


def _fernet(cluster_token: str) -> Fernet:
    key = HKDF(
        algorithm=hashes.SHA256(), length=32, salt=b"orchestrator-bootstrap", info=b"v1"
    ).derive(cluster_token.encode())
    return Fernet(base64.urlsafe_b64encode(key))


def seal(bundle: Bundle, cluster_token: str) -> bytes:
    raw = msgpack.packb([bundle.ca_crt, bundle.ca_key, bundle.tokens, bundle.admin_token])
    return _fernet(cluster_token).encrypt(raw)


def unseal(data: bytes, cluster_token: str) -> Bundle:
    try:
        raw = _fernet(cluster_token).decrypt(data)
    except InvalidToken:
        raise PermissionError(
            "this server's cluster token cannot decrypt the cluster's credentials: start it "
            "with the cluster's token (--token)"
        ) from None
    ca_crt, ca_key, tokens, admin = msgpack.unpackb(raw)
    return Bundle(ca_crt, ca_key, tokens, admin)


def _write_if_changed(path: Path, data: bytes, mode: int) -> None:
    if not path.exists() or path.read_bytes() != data:
        atomic_write(path, data, mode)


def adopt(bundle: Bundle, data_dir: Path) -> None:
    pki = data_dir / "pki"
    pki.mkdir(parents=True, exist_ok=True, mode=0o700)
    _write_if_changed(pki / "ca.key", bundle.ca_key, 0o600)
    _write_if_changed(pki / "ca.crt", bundle.ca_crt, 0o644)
    _write_if_changed(data_dir / "tokens.yaml", bundle.tokens, 0o600)


async def shared_credentials(
    store: Store, data_dir: Path, cluster_token: str, make_local: Callable[[], Bundle]
) -> Bundle:
    """The cluster's bundle, written to DATA_DIR; published from `make_local()` if none yet."""
    while True:
        try:
            kv = await store.get(KEY)
            if kv is not None:
                bundle = unseal(kv.value, cluster_token)
                adopt(bundle, data_dir)
                return bundle
            local = make_local()
            await store.create(KEY, seal(local, cluster_token))
            log.info("published the cluster CA and tokens for the other servers")
            return local
        except st.KeyExists:
            continue  # another server published first: adopt theirs
        except (st.NoQuorum, st.Unavailable) as exc:
            log.info("waiting for the store to share credentials: %s", exc)
            await trio.sleep(RETRY)


def local_bundle(data_dir: Path, tokens: TokenStore, admin_token: str) -> Bundle:
    pki = data_dir / "pki"
    tokens.save()
    return Bundle(
        (pki / "ca.crt").read_bytes(),
        (pki / "ca.key").read_bytes(),
        tokens.path.read_bytes(),
        admin_token,
    )
