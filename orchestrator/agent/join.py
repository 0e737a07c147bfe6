"""Joining an agent with a join token: check the CA pin, trade the token for node credentials.

`orchestrator agent --server https://HOST:6443 --token K10<ca sha256>::<id>.<secret> --data-dir D`:

1. The agent fetches the cluster CA from the anonymous `GET /orchestrator/v1/ca` without
   trusting it (TLS not verified, no credential in the request) and compares its SHA-256 with
   the token's pin. A mismatch stops here: nothing was sent.
2. From then on TLS is verified against that CA (the server must hold a certificate it
   signed). The agent sends only `<id>.<secret>` (the pin is not a credential) to
   `POST /orchestrator/v1/join {nodeName}`, and receives a node token (`system:node:<name>`,
   group `system:nodes`) that the server created for it. 401: the token is wrong, expired or
   revoked; 409: another identity owns the node name. With `serving_addresses` the request
   also carries the public half of a key pair made here (`servingcert`), and the answer a
   CA-signed serving certificate for the agent's log endpoint, stored as
   `D/kubelet.crt` + `D/kubelet.key` (0600).
3. It writes `D/node-kubeconfig.yaml` (server, CA, node token; mode 0600) and runs as the node.
   Later starts use that file and skip 1-2 (the join token may have expired by then), unless
   it was written for another node name.

With several servers (`--server` repeated or comma-separated, plus those the agent learnt
earlier, see `apiservers`), steps 1-2 go through the first one that answers: a server that
cannot be reached is skipped; any answer (a pin mismatch, a refused token) is final.

A bare `<id>.<secret>` is accepted too, but then the CA must come from `--ca-file` (the agent
never trusts a server it cannot verify). A pinned token whose credential is not a join token
(e.g. `K10<pin>::<node token>`) is used as is, after the pin check.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import trio
import yaml

from orchestrator.agent import servingcert
from orchestrator.agent.servingcert import ServingKey
from orchestrator.client.config import ClientConfig, load_kubeconfig
from orchestrator.security.jointoken import (
    BOOTSTRAP_RE,
    JoinToken,
    PinMismatch,
    check_pin,
    parse_token,
)
from orchestrator.security.kubeconfig import write_kubeconfig
from orchestrator.security.tokens import NODE_PREFIX

log = logging.getLogger(__name__)

CREDENTIALS_FILE = "node-kubeconfig.yaml"
CA_PATH = "/orchestrator/v1/ca"
JOIN_PATH = "/orchestrator/v1/join"
TIMEOUT = 15.0


class JoinError(Exception):
    """Joining failed; the message says why and what to do."""


class JoinUnreachable(JoinError):
    """The server could not be reached (another one may be)."""


def is_join_token(text: str) -> bool:
    """A CA-pinned token (`K10...::...`) or a bare bootstrap token `<id>.<secret>`."""
    try:
        token = parse_token(text)
    except ValueError:
        return text.startswith("K10")  # malformed K10: let `join_config` say what is wrong
    return token.pin is not None or BOOTSTRAP_RE.match(token.credentials) is not None


def response_message(response: httpx.Response) -> str:
    """The message of an error answer (a metav1.Status's), else its text."""
    try:
        doc: Any = response.json()
        return str(doc.get("message") or response.text)
    except ValueError:
        return response.text.strip() or response.reason_phrase


async def fetch_ca(server: str) -> bytes:
    """The CA certificate (PEM) the server publishes — NOT verified: check it against a pin."""
    try:
        async with httpx.AsyncClient(verify=False, timeout=TIMEOUT) as client:
            response = await client.get(server + CA_PATH)
    except httpx.TransportError as exc:
        raise JoinUnreachable(f"cannot reach {server} to fetch its CA: {exc}") from exc
    if response.status_code != 200:
        raise JoinError(f"{server} did not serve its CA ({response.status_code})")
    return response.content


async def request_node_token(
    server: str,
    ca_pem: bytes | None,
    credentials: str,
    node_name: str,
    serving: dict[str, Any] | None = None,
) -> tuple[str, bytes | None]:
    """Trade a join token for a node token (`POST /orchestrator/v1/join`), and with `serving`
    (`ServingKey.request`) a serving certificate (PEM; None if the server sent none)."""
    verify: ssl.SSLContext | bool = True
    if ca_pem is not None:
        verify = ssl.create_default_context(cadata=ca_pem.decode("ascii", "replace"))
    try:
        async with httpx.AsyncClient(verify=verify, timeout=TIMEOUT) as client:
            response = await client.post(
                server + JOIN_PATH,
                json={"nodeName": node_name, **(serving or {})},
                headers={"Authorization": f"Bearer {credentials}"},
            )
    except httpx.TransportError as exc:
        raise JoinUnreachable(f"cannot join through {server}: {exc}") from exc
    if response.status_code == 401:
        raise JoinError(
            f"{server} refused the join token: it is wrong, expired or revoked "
            f"(create a new one with `orchestrator token create`): {response_message(response)}"
        )
    if response.status_code != 201:
        raise JoinError(f"join refused ({response.status_code}): {response_message(response)}")
    doc = response.json()
    token = doc.get("token")
    if not isinstance(token, str) or not token:
        raise JoinError("the server's join answer carries no node token")
    cert = doc.get("servingCertificate")
    return token, cert.encode("ascii") if isinstance(cert, str) and cert else None


def stored_config(data_dir: Path, node_name: str, server: str | None) -> ClientConfig | None:
    """The node credentials saved by an earlier join as `node_name`, if any."""
    path = data_dir / CREDENTIALS_FILE
    if not path.exists():
        return None
    try:
        doc = yaml.safe_load(path.read_text()) or {}
        users = [u.get("name") for u in doc.get("users") or []]
    except (OSError, yaml.YAMLError, AttributeError) as exc:
        log.warning("ignoring %s: %s", path, exc)
        return None
    if users != [NODE_PREFIX + node_name]:
        log.warning(
            "%s holds credentials of %s, not of node %s: joining again", path, users, node_name
        )
        return None
    cfg = load_kubeconfig(path)
    if server:
        return ClientConfig(server=server, ca_pem=cfg.ca_pem, token=cfg.token)
    return cfg


async def join_config(
    server: str | Sequence[str],
    token_text: str,
    data_dir: Path,
    node_name: str,
    ca_pem: bytes | None = None,
    serving_addresses: list[str] | None = None,
) -> ClientConfig:
    """How this agent reaches and authenticates to the server (module doc); `server`: one URL
    or several to try in order; `ca_pem`: the CA from `--ca-file`, needed only for a token
    that pins none; `serving_addresses`: ask for a log endpoint certificate with these SANs
    while joining. The config names the server it joined through (or the first one)."""
    servers = [u.rstrip("/") for u in ([server] if isinstance(server, str) else server)]
    if not servers:
        raise JoinError("no server to join through: give --server")
    saved = stored_config(data_dir, node_name, servers[0])
    if saved is not None:
        log.info("using the node credentials in %s", data_dir / CREDENTIALS_FILE)
        return saved
    try:
        token = parse_token(token_text)
    except ValueError as exc:
        raise JoinError(str(exc)) from None
    failures: list[str] = []
    for url in servers:
        try:
            return await _join_through(url, token, data_dir, node_name, ca_pem, serving_addresses)
        except JoinUnreachable as exc:
            if len(servers) > 1:
                log.warning("%s; trying the next server", exc)
            failures.append(str(exc))
    raise JoinUnreachable("; ".join(failures))


async def _join_through(
    server: str,
    token: JoinToken,
    data_dir: Path,
    node_name: str,
    ca_pem: bytes | None,
    serving_addresses: list[str] | None,
) -> ClientConfig:
    """Steps 1-3 of the module doc through `server`."""
    if token.pin is not None:
        ca: bytes | None = await fetch_ca(server)
        try:
            check_pin(ca or b"", token.pin)
        except PinMismatch as exc:
            raise JoinError(str(exc)) from None
    elif ca_pem is not None:
        ca = ca_pem
    elif server.startswith("https:"):
        raise JoinError(
            "this token does not pin the cluster CA: use the K10... form from "
            "`orchestrator token create`, or give the CA with --ca-file"
        )
    else:
        ca = None
    if BOOTSTRAP_RE.match(token.credentials) is None:
        return ClientConfig(server=server, ca_pem=ca, token=token.credentials)
    key = None
    if serving_addresses and ca is not None:
        key = await trio.to_thread.run_sync(ServingKey.generate)
    serving = key.request(serving_addresses or []) if key is not None else None
    node_token, cert = await request_node_token(server, ca, token.credentials, node_name, serving)
    if key is not None and cert is not None:
        await trio.to_thread.run_sync(servingcert.store, data_dir, key, cert)
    await trio.to_thread.run_sync(
        partial(
            write_kubeconfig,
            data_dir / CREDENTIALS_FILE,
            server,
            ca,
            NODE_PREFIX + node_name,
            token=node_token,
        )
    )
    log.info("joined as node %s; credentials in %s", node_name, data_dir / CREDENTIALS_FILE)
    return ClientConfig(server=server, ca_pem=ca, token=node_token)
