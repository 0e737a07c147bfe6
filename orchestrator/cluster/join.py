"""A server joins a cluster through an existing server's Kubernetes API URL, k3s style.

    orchestrator server --server https://10.0.0.1:6443 [--server URL ...] --token TOKEN ...

TOKEN is the cluster token, best in its CA-pinned form `K10<CA sha256>::<cluster token>` (each
server keeps it in `DATA_DIR/server-token`). Through each URL in turn (one that cannot be
reached is skipped; any answer is final, as for agents in `agent.join`; while none can be
reached, rounds are retried for up to `wait` seconds):

1. With a pinned token, the CA is fetched from the anonymous `GET /orchestrator/v1/ca` without
   trusting it and its SHA-256 compared with the pin (`agent.join.fetch_ca`,
   `jointoken.check_pin`): a mismatch stops here, nothing was sent. From then on TLS is
   verified against that CA. A plain cluster token pins nothing, so, as with `--join`, there
   is nothing to check: TLS is not verified (a warning says so).
2. `GET /orchestrator/v1/members` with `Authorization: Bearer <cluster token>` (the pin is not
   a credential and is never sent) answers the members' ids and store client addresses
   (`cluster.members`); 401 or 403: the token is not this cluster's.
3. `GET /orchestrator/v1/bundle` with the same credential (only when this server has no CA
   yet: its first start): the cluster's sealed credentials bundle, which the server unseals
   with the token and whose CA it adopts (`Server._prepare_pki`), so that its peer certificate
   is signed by the cluster's CA before its peer port talks to anyone.
4. `usable_addresses` keeps the addresses this server can use (loopback ones only through a
   loopback URL: elsewhere they would name the joining device itself) and the store join
   (`Server._join_endpoints`) tries them in turn: it follows the redirect to the leader among
   them and, with a pin, also checks the cluster's shared bundle against it before the token
   goes out on the client port.

Nothing here writes to the data directory. A refused join leaves the directory without any
membership (not half-joined): the same command with the right token or URL joins it.

httpx is imported only when a server joins this way (its first start), not by a running server.
"""

from __future__ import annotations

import ipaddress
import logging
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import trio

from orchestrator.raft.node import parse_addr

if TYPE_CHECKING:
    import httpx

__all__ = [
    "BUNDLE_PATH",
    "MEMBERS_PATH",
    "JoinFailed",
    "JoinInfo",
    "join_info",
    "member_endpoints",
    "request_members",
    "usable_addresses",
]

log = logging.getLogger(__name__)

MEMBERS_PATH = "/orchestrator/v1/members"
BUNDLE_PATH = "/orchestrator/v1/bundle"
TIMEOUT = 15.0  # seconds one HTTP request may take
RETRY_INITIAL = 0.5  # seconds between rounds while no server can be reached (doubling)
RETRY_MAX = 5.0


class JoinFailed(Exception):
    """Joining through `--server` failed; the message says why and what to do."""


class _Unreachable(JoinFailed):
    """This URL could not be reached (another one may be)."""


@dataclass(frozen=True)
class JoinInfo:
    """What a server learnt through one API URL: the members' client addresses and, when
    asked for, the cluster's sealed bundle."""

    url: str
    endpoints: list[str]
    bundle: bytes | None = None


def _is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def usable_addresses(url: str, items: Sequence[Mapping[str, Any]]) -> list[str]:
    """The client addresses (HOST:PORT) of a members answer worth trying from here, in the
    answer's order, without duplicates: well-formed ones, and loopback ones only when `url`
    names a loopback host too."""
    local = _is_loopback(urlsplit(url).hostname or "")
    out: dict[str, None] = {}
    for item in items:
        address = item.get("clientAddress") if isinstance(item, Mapping) else None
        if not isinstance(address, str):
            continue
        try:
            host, _ = parse_addr(address)
        except ValueError:
            continue
        if local or not _is_loopback(host):
            out[address] = None
    return list(out)


def _loopback_hint(url: str, items: Sequence[Mapping[str, Any]]) -> str:
    listed = [str(i.get("clientAddress")) for i in items if i.get("clientAddress")]
    if not listed:
        return f"{url} lists no member with a client address yet; retry in a few seconds"
    return (
        f"the members' client ports ({', '.join(listed)}) are not reachable from this device: "
        "start the servers with --client-listen on an address other devices reach (e.g. "
        "0.0.0.0:7101), or join with --join HOST:PORT"
    )


async def request_members(url: str, verify: ssl.SSLContext | bool, token: str) -> httpx.Response:
    """`GET /orchestrator/v1/members` with the cluster token (step 2 of the module doc)."""
    import httpx

    try:
        async with httpx.AsyncClient(verify=verify, timeout=TIMEOUT) as client:
            return await client.get(
                url + MEMBERS_PATH, headers={"Authorization": f"Bearer {token}"}
            )
    except httpx.TransportError as exc:
        raise _Unreachable(f"cannot reach {url}: {exc or type(exc).__name__}") from exc


async def _bundle_through(url: str, verify: ssl.SSLContext | bool, token: str) -> bytes:
    """Step 3 of the module doc."""
    import httpx

    from orchestrator.agent.join import response_message

    try:
        async with httpx.AsyncClient(verify=verify, timeout=TIMEOUT) as client:
            response = await client.get(
                url + BUNDLE_PATH, headers={"Authorization": f"Bearer {token}"}
            )
    except httpx.TransportError as exc:
        raise _Unreachable(f"cannot reach {url}: {exc or type(exc).__name__}") from exc
    if response.status_code == 503:
        raise _Unreachable(f"{url} is unavailable (503): {response_message(response)}")
    if response.status_code != 200:
        raise JoinFailed(
            f"{url} did not hand out the cluster's credentials ({response.status_code}): "
            f"{response_message(response)}"
        )
    return response.content


async def _members_through(url: str, token: str, pin: str, bundle: bool = False) -> JoinInfo:
    """Steps 1-4 of the module doc through `url` (3 only with `bundle`)."""
    from orchestrator.agent.join import JoinError, JoinUnreachable, fetch_ca, response_message
    from orchestrator.security.jointoken import PinMismatch, check_pin

    verify: ssl.SSLContext | bool = False
    if pin:
        try:
            ca = await fetch_ca(url)
        except JoinUnreachable as exc:
            raise _Unreachable(str(exc)) from None
        except JoinError as exc:
            raise JoinFailed(f"{exc}; is {url} the API of a server of this cluster?") from None
        try:
            check_pin(ca, pin)
        except PinMismatch as exc:
            raise JoinFailed(f"{url}: {exc}") from None
        verify = ssl.create_default_context(cadata=ca.decode("ascii", "replace"))
    elif url.startswith("https:"):
        log.warning(
            "the token pins no CA, so %s is not verified (as with --join): prefer the K10... "
            "token in a server's DATA_DIR/server-token",
            url,
        )
    response = await request_members(url, verify, token)
    code = response.status_code
    if code in (401, 403):
        message = response_message(response)
        if "server-token" not in message:
            message += (
                "; a server joins with the cluster's token: the K10... token in a server's "
                "DATA_DIR/server-token"
            )
        raise JoinFailed(f"{url} refused the token ({code}): {message}")
    if code == 404:
        raise JoinFailed(
            f"{url} does not list its members (404): is it an orchestrator server's API? "
            "(an older server: join with --join HOST:PORT, its client address)"
        )
    if code == 503:  # no quorum right now, or stopping: maybe another server, or later
        raise _Unreachable(f"{url} is unavailable (503): {response_message(response)}")
    if code != 200:
        raise JoinFailed(f"{url} answered {code}: {response_message(response)}")
    try:
        items = response.json().get("items")
    except (ValueError, AttributeError):
        items = None
    if not isinstance(items, list):
        raise JoinFailed(f"{url} answered no member list")
    addresses = usable_addresses(url, items)
    if not addresses:
        raise JoinFailed(_loopback_hint(url, [i for i in items if isinstance(i, Mapping)]))
    log.info("joining through %s: members' client addresses %s", url, ", ".join(addresses))
    sealed = await _bundle_through(url, verify, token) if bundle else None
    return JoinInfo(url, addresses, sealed)


async def member_endpoints(
    urls: Sequence[str], token: str, pin: str = "", *, wait: float = 60.0
) -> list[str]:
    """The client addresses to join through, learnt through the first of `urls` that answers
    (module doc); `token`: the cluster token (without the pin), `pin`: the CA's hex SHA-256 or
    "". Raises `JoinFailed` (a refusal at once; unreachable servers after `wait` seconds)."""
    return (await join_info(urls, token, pin, wait=wait)).endpoints


async def join_info(
    urls: Sequence[str], token: str, pin: str = "", *, wait: float = 60.0, bundle: bool = False
) -> JoinInfo:
    """`member_endpoints`, and with `bundle` also the cluster's sealed bundle (step 3)."""
    if not urls:
        raise JoinFailed("no server to join through: give --server URL")
    failures: list[str] = []
    delay = RETRY_INITIAL
    with trio.move_on_after(wait):
        while True:
            failures = []
            for url in urls:
                try:
                    return await _members_through(url.rstrip("/"), token, pin, bundle)
                except _Unreachable as exc:
                    failures.append(str(exc))
            log.warning("no server to join through answered (%s); retrying", "; ".join(failures))
            await trio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX)
    raise JoinFailed(
        f"no server to join through answered within {wait:g}s: "
        + ("; ".join(failures) or "no answer")
        + " (is --server the URL of a running server's API, its --listen address?)"
    )
