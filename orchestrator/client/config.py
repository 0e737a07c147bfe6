"""Kubeconfig loading: which file, which context, and what it says about server and credentials.

Which file, in kubectl's order (`clientcmd` loading rules):

1. the explicit path (`--kubeconfig`), which must exist;
2. else `$KUBECONFIG`, a `os.pathsep`-separated list of files merged entry by entry, the first
   file that names a cluster/user/context (or sets `current-context`) winning; missing files
   are skipped;
3. else `~/.kube/config`.

There is deliberately no fallback to a server's data directory: `orchestrator server --data-dir
DIR` writes `DIR/kubeconfig.yaml`, and the user points at it with `--kubeconfig` or
`KUBECONFIG`, exactly as with kubectl, so both tools always talk to the same cluster.

Relative file references inside a kubeconfig (`certificate-authority`, `client-certificate`,
`client-key`, `tokenFile`) are resolved against the directory of the file that defined them.
Inline `*-data` fields are base64 PEM and win over file references. The result is a plain
frozen `ClientConfig`; nothing here does network I/O.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = ["ClientConfig", "ConfigError", "default_kubeconfig_paths", "load_kubeconfig"]


class ConfigError(Exception):
    """The kubeconfig is missing, unreadable or does not say how to reach a server."""


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """Everything `RestClient` needs to reach and authenticate to one API server."""

    server: str  # "https://127.0.0.1:6443", no trailing slash
    ca_pem: bytes | None = None  # trust only this CA (None: system roots, unless insecure)
    token: str | None = None  # bearer token
    cert_pem: bytes | None = None  # client certificate (with key_pem)
    key_pem: bytes | None = None
    insecure: bool = False  # insecure-skip-tls-verify
    namespace: str = "default"  # the context's namespace: the default for namespaced requests
    tls_server_name: str | None = None


def default_kubeconfig_paths(explicit: str | os.PathLike[str] | None = None) -> list[Path]:
    """The files to merge, in precedence order (see the module docstring)."""
    if explicit:
        return [Path(explicit)]
    env = os.environ.get("KUBECONFIG", "")
    if env.strip():
        return [Path(p).expanduser() for p in env.split(os.pathsep) if p.strip()]
    return [Path.home() / ".kube" / "config"]


def _read(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read kubeconfig {path}: {exc.strerror or exc}") from exc
    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"kubeconfig {path} is not valid YAML: {exc}") from exc
    if not isinstance(doc, dict):
        raise ConfigError(f"kubeconfig {path} is not a mapping")
    return doc


_Named = dict[str, tuple[dict[str, Any], Path]]


def _named(entries: Any, key: str, base: Path, into: _Named) -> None:
    for e in entries or []:
        if isinstance(e, dict) and isinstance(e.get("name"), str) and e["name"] not in into:
            into[e["name"]] = (e.get(key) or {}, base)


def _pem(entry: dict[str, Any], base: Path, field: str, what: str) -> bytes | None:
    data = entry.get(f"{field}-data")
    if data:
        try:
            return base64.b64decode(data, validate=False)
        except ValueError as exc:
            raise ConfigError(f"{what}: {field}-data is not base64") from exc
    ref = entry.get(field)
    if ref:
        p = Path(ref).expanduser()
        p = p if p.is_absolute() else base / p
        try:
            return p.read_bytes()
        except OSError as exc:
            raise ConfigError(f"{what}: cannot read {field} {p}: {exc.strerror or exc}") from exc
    return None


def load_kubeconfig(
    path: str | os.PathLike[str] | None = None,
    context: str | None = None,
    *,
    namespace: str | None = None,
) -> ClientConfig:
    """Load the kubeconfig (kubectl's file order) and resolve `context` (default: current).

    `namespace` overrides the context's namespace (the `-n` flag). Raises `ConfigError` with a
    message that says which file or entry is wrong.
    """
    paths = default_kubeconfig_paths(path)
    clusters: dict[str, tuple[dict[str, Any], Path]] = {}
    users: dict[str, tuple[dict[str, Any], Path]] = {}
    contexts: dict[str, tuple[dict[str, Any], Path]] = {}
    current: str | None = None
    found = False
    for p in paths:
        if not p.exists():
            if path:
                raise ConfigError(f"kubeconfig {p} does not exist")
            continue
        found = True
        doc = _read(p)
        base = p.parent
        _named(doc.get("clusters"), "cluster", base, clusters)
        _named(doc.get("users"), "user", base, users)
        _named(doc.get("contexts"), "context", base, contexts)
        if current is None and doc.get("current-context"):
            current = str(doc["current-context"])
    if not found:
        where = ", ".join(str(p) for p in paths)
        raise ConfigError(
            f"no kubeconfig found (looked at {where}); pass --kubeconfig DATA_DIR/kubeconfig.yaml "
            "or set KUBECONFIG"
        )
    name = context or current
    if not name:
        if len(contexts) == 1:
            name = next(iter(contexts))
        else:
            raise ConfigError("the kubeconfig has no current-context; pass --context NAME")
    if name not in contexts:
        raise ConfigError(f'context "{name}" not found in the kubeconfig')
    ctx, _ = contexts[name]
    cluster_name = ctx.get("cluster")
    if cluster_name not in clusters:
        raise ConfigError(f'context "{name}": cluster "{cluster_name}" not found in the kubeconfig')
    cluster, cbase = clusters[cluster_name]
    server = str(cluster.get("server") or "").rstrip("/")
    if not server:
        raise ConfigError(f'cluster "{cluster_name}" has no server')
    user: dict[str, Any] = {}
    ubase = cbase
    user_name = ctx.get("user")
    if user_name:
        if user_name not in users:
            raise ConfigError(f'context "{name}": user "{user_name}" not found in the kubeconfig')
        user, ubase = users[user_name]
    token = user.get("token")
    if not token and user.get("tokenFile"):
        tf = Path(user["tokenFile"]).expanduser()
        tf = tf if tf.is_absolute() else ubase / tf
        try:
            token = tf.read_text().strip()
        except OSError as exc:
            raise ConfigError(f'user "{user_name}": cannot read tokenFile {tf}') from exc
    what_c = f'cluster "{cluster_name}"'
    what_u = f'user "{user_name}"'
    return ClientConfig(
        server=server,
        ca_pem=_pem(cluster, cbase, "certificate-authority", what_c),
        token=str(token) if token else None,
        cert_pem=_pem(user, ubase, "client-certificate", what_u),
        key_pem=_pem(user, ubase, "client-key", what_u),
        insecure=bool(cluster.get("insecure-skip-tls-verify", False)),
        namespace=namespace or ctx.get("namespace") or "default",
        tls_server_name=cluster.get("tls-server-name"),
    )
