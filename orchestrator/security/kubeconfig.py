"""Writing kubeconfig files that unmodified kubectl accepts, and reading them back.

`write_kubeconfig` produces the standard shape (`apiVersion: v1`, `kind: Config`, one cluster
with base64 `certificate-authority-data`, one user with a `token` or `client-certificate-data` +
`client-key-data`, one context, `current-context`), atomically with mode 0600 since it holds a
credential. Reading is the client's job: `load_kubeconfig` here is `orchestrator.client.config`'s
loader (kubectl's merge rules, file references relative to the kubeconfig, `*-data` fields), so
there is one kubeconfig reader in the tree. Resolving `KUBECONFIG` is that loader's business when
no path is given.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import yaml

from orchestrator.client.config import ClientConfig, load_kubeconfig
from orchestrator.security.pki import atomic_write

__all__ = ["ClientConfig", "kubeconfig_dict", "load_kubeconfig", "write_kubeconfig"]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def kubeconfig_dict(
    server_url: str,
    ca_pem: bytes | None,
    user: str,
    token: str | None = None,
    client_cert: bytes | None = None,
    client_key: bytes | None = None,
    context_name: str = "orchestrator",
    namespace: str | None = None,
) -> dict[str, Any]:
    """The kubeconfig document (see `write_kubeconfig`)."""
    if (client_cert is None) != (client_key is None):
        raise ValueError("client_cert and client_key go together")
    cluster: dict[str, Any] = {"server": server_url}
    if ca_pem is not None:
        cluster["certificate-authority-data"] = _b64(ca_pem)
    creds: dict[str, Any] = {}
    if token is not None:
        creds["token"] = token
    if client_cert is not None and client_key is not None:
        creds["client-certificate-data"] = _b64(client_cert)
        creds["client-key-data"] = _b64(client_key)
    context: dict[str, Any] = {"cluster": context_name, "user": user}
    if namespace:
        context["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [{"name": context_name, "cluster": cluster}],
        "users": [{"name": user, "user": creds}],
        "contexts": [{"name": context_name, "context": context}],
        "current-context": context_name,
    }


def write_kubeconfig(
    path: str | os.PathLike[str],
    server_url: str,
    ca_pem: bytes | None,
    user: str,
    token: str | None = None,
    client_cert: bytes | None = None,
    client_key: bytes | None = None,
    context_name: str = "orchestrator",
    namespace: str | None = None,
) -> None:
    """Write a one-cluster, one-user kubeconfig to `path` (atomic, mode 0600).

    The cluster and context are both called `context_name`; the user entry is called `user`.
    Blocking file I/O (startup/CLI).
    """
    doc = kubeconfig_dict(
        server_url, ca_pem, user, token, client_cert, client_key, context_name, namespace
    )
    atomic_write(Path(path), yaml.safe_dump(doc, sort_keys=False).encode(), 0o600)
