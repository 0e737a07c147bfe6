"""Bearer tokens: who they belong to, kept as SHA-256 hashes in `DATA_DIR/tokens.yaml` (mode 0600).

Kinds of token (all are `Authorization: Bearer <token>`):

    admin       user system:admin, group system:masters; made on first start, returned once
                so the caller can write it into the admin kubeconfig
    node        user system:node:<name>, group system:nodes
    component   user system:kube-controller-manager etc., group system:controllers
    bootstrap   `[a-z0-9]{6}.[a-z0-9]{16}`, user system:bootstrap:<id>, group
                system:bootstrappers, with an expiry (default 24 h, as kubeadm and k3s)
    other       `add(name, groups)`

Invariants: the file holds only hashes, never a token; `lookup` compares the presented token's
hash with every stored hash using `hmac.compare_digest` and does not stop at the first match, so
its time does not depend on which entry matches; an expired token never authenticates.
Re-adding a name (other than a bootstrap token) replaces its previous token (rotation).

Blocking file I/O on writes (startup and CLI paths); `lookup` never touches the disk.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import string
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from orchestrator.security.pki import atomic_write

ADMIN_USER = "system:admin"
MASTERS = "system:masters"
NODES = "system:nodes"
CONTROLLERS = "system:controllers"
BOOTSTRAPPERS = "system:bootstrappers"
NODE_PREFIX = "system:node:"
BOOTSTRAP_PREFIX = "system:bootstrap:"
BOOTSTRAP_TTL = 24 * 3600.0
BOOTSTRAP_RE = re.compile(r"^([a-z0-9]{6})\.([a-z0-9]{16})$")
_ALNUM = string.ascii_lowercase + string.digits


@dataclass(frozen=True, slots=True)
class TokenEntry:
    name: str  # the user name the token authenticates as
    groups: tuple[str, ...]
    sha256: str  # hex digest of the token
    expires: float | None = None  # epoch seconds
    bootstrap_id: str | None = None
    description: str = ""
    owner: str = ""  # for a node token: the identity that joined the node (name ownership)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "groups": list(self.groups),
            "sha256": self.sha256,
        }
        if self.expires is not None:
            out["expires"] = self.expires
        if self.bootstrap_id is not None:
            out["bootstrapID"] = self.bootstrap_id
        if self.description:
            out["description"] = self.description
        if self.owner:
            out["owner"] = self.owner
        return out

    @staticmethod
    def from_dict(d: dict[str, Any]) -> TokenEntry:
        expires = d.get("expires")
        return TokenEntry(
            name=str(d["name"]),
            groups=tuple(str(g) for g in d.get("groups") or ()),
            sha256=str(d["sha256"]),
            expires=float(expires) if expires is not None else None,
            bootstrap_id=d.get("bootstrapID"),
            description=str(d.get("description") or ""),
            owner=str(d.get("owner") or ""),
        )


def token_hash(token: str) -> str:
    """Hex SHA-256 of a token: what is stored instead of it."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def _random(n: int) -> str:
    return "".join(secrets.choice(_ALNUM) for _ in range(n))


@dataclass
class TokenStore:
    """The token table, loaded from and saved to `path`. Construct with `TokenStore.open`."""

    path: Path
    entries: list[TokenEntry] = field(default_factory=list)
    clock: Callable[[], float] = time.time

    @classmethod
    def open(
        cls, data_dir: str | os.PathLike[str], clock: Callable[[], float] = time.time
    ) -> TokenStore:
        path = Path(data_dir) / "tokens.yaml"
        entries: list[TokenEntry] = []
        if path.exists():
            doc = yaml.safe_load(path.read_text()) or {}
            entries = [TokenEntry.from_dict(d) for d in doc.get("tokens") or []]
        return cls(path, entries, clock)

    def save(self) -> None:
        doc = {"tokens": [e.to_dict() for e in self.entries]}
        atomic_write(self.path, yaml.safe_dump(doc, sort_keys=False).encode(), 0o600)

    # ------------------------------------------------------------------ adding
    def _put(self, entry: TokenEntry, *, replace: bool) -> None:
        if replace:
            self.entries = [
                e for e in self.entries if e.name != entry.name or e.bootstrap_id is not None
            ]
        self.entries.append(entry)
        self.save()

    def add(
        self, name: str, groups: list[str] | tuple[str, ...] = (), *, ttl: float | None = None
    ) -> str:
        """A new token for user `name` in `groups` (replacing that user's previous token)."""
        if not name:
            raise ValueError("a token needs a user name")
        token = secrets.token_urlsafe(32)
        expires = self.clock() + ttl if ttl is not None else None
        self._put(TokenEntry(name, tuple(groups), token_hash(token), expires), replace=True)
        return token

    def ensure_admin(self) -> str | None:
        """On first start, the admin token (write it into the kubeconfig); later, None."""
        if any(MASTERS in e.groups and e.name == ADMIN_USER for e in self.entries):
            return None
        return self.add(ADMIN_USER, [MASTERS])

    def add_node(self, node_name: str) -> str:
        return self.add(NODE_PREFIX + node_name, [NODES])

    def add_component(self, user: str, groups: list[str] | tuple[str, ...] = (CONTROLLERS,)) -> str:
        """A token for a control-plane component, e.g. `system:kube-controller-manager`."""
        if not user.startswith("system:"):
            raise ValueError(f"component user {user!r} must start with 'system:'")
        return self.add(user, groups)

    def create_bootstrap_token(self, ttl: float = BOOTSTRAP_TTL) -> str:
        """A kubeadm-style join token `abcdef.0123456789abcdef`, valid for `ttl` seconds."""
        ids = {e.bootstrap_id for e in self.entries}
        token_id = _random(6)
        while token_id in ids:
            token_id = _random(6)
        token = f"{token_id}.{_random(16)}"
        entry = TokenEntry(
            BOOTSTRAP_PREFIX + token_id,
            (BOOTSTRAPPERS,),
            token_hash(token),
            self.clock() + ttl,
            token_id,
        )
        self._put(entry, replace=False)
        return token

    # ------------------------------------------------------------------ removing
    def revoke(self, name: str) -> bool:
        """Forget every token of user `name` (or of bootstrap token id `name`)."""
        before = len(self.entries)
        self.entries = [e for e in self.entries if name not in (e.name, e.bootstrap_id)]
        if len(self.entries) != before:
            self.save()
            return True
        return False

    def prune_expired(self) -> int:
        now = self.clock()
        keep = [e for e in self.entries if e.expires is None or e.expires > now]
        dropped = len(self.entries) - len(keep)
        if dropped:
            self.entries = keep
            self.save()
        return dropped

    # ------------------------------------------------------------------ lookup
    def lookup(self, token: str) -> TokenEntry | None:
        """The entry whose token this is, if it exists and has not expired."""
        digest = token_hash(token).encode()
        found: TokenEntry | None = None
        for e in self.entries:
            if hmac.compare_digest(digest, e.sha256.encode()) and found is None:
                found = e
        if found is None or (found.expires is not None and found.expires <= self.clock()):
            return None
        return found
