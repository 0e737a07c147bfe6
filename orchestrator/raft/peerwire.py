"""The peer port's wire and the transport's public types (`raft.transport` is the transport).

Job: what both directions of a peer connection share, without I/O: the hello a connecting side
sends (`encode_hello` / `parse_hello`), the refusal frame an accepting side sends before it
closes (`encode_refusal` / `refusal_reason`), how to read a failed connect (`connect_refused`)
and a remote address (`remote_name`), the timeouts and sizes, and the types callers use:
`Address`, `PeerTLS` (the port's TLS contexts and identity check), `Faults` (the fault hook)
and `TransportStatistics`. The protocol itself is described in `raft.transport`.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import msgpack
import trio

from orchestrator.raft.framing import FrameDecoder, encode_frame
from orchestrator.raft.types import Message, NodeId

__all__ = [
    "CONNECT_TIMEOUT",
    "CONN_ERRORS",
    "HELLO_MAX",
    "HELLO_TIMEOUT",
    "RECV_SIZE",
    "REFUSAL_SEND_TIMEOUT",
    "WILDCARD_HOSTS",
    "Address",
    "Faults",
    "PeerTLS",
    "TransportStatistics",
    "connect_refused",
    "encode_hello",
    "encode_refusal",
    "parse_hello",
    "refusal_reason",
    "remote_name",
]

Address = tuple[str, int]

HELLO_MAX = 1024  # a hello is tiny; this keeps an unauthenticated peer from making us buffer much
HELLO_TIMEOUT = 5.0  # an accepted connection that does not say hello by then is closed
CONNECT_TIMEOUT = 5.0  # bounds a connect to a black-holed address (the OS default is minutes)
RECV_SIZE = 64 * 1024
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})
REFUSAL_SEND_TIMEOUT = 1.0  # a refusal frame is a courtesy: never wait long for it

CONN_ERRORS = (OSError, trio.BrokenResourceError, trio.ClosedResourceError)


@dataclass(frozen=True, slots=True)
class PeerTLS:
    """The peer port's TLS: `server()` and `client()` return the CURRENT context for a new
    accepted or outgoing connection (a renewed certificate is used from then on, open
    connections keep theirs); `identify(der)` is the node id that a verified peer certificate
    (DER, None if none) names, or a short reason why it names none."""

    server: Callable[[], ssl.SSLContext]
    client: Callable[[], ssl.SSLContext]
    identify: Callable[[bytes | None], int | str]


class Faults(Protocol):
    """The fault hook `send` consults (`orchestrator.testing.faults.FaultInjector` is the one
    the tests and `--enable-fault-injection` use): `plan(msg)` gives the delays (seconds) after
    which copies of msg are delivered, [] to drop it. The control methods are what the client
    port's "faults" op calls."""

    def plan(self, msg: Message) -> list[float]: ...

    def partition(self, *groups: set[NodeId]) -> None: ...

    def isolate(self, node_id: NodeId) -> None: ...

    def heal(self) -> None: ...


@dataclass(frozen=True, slots=True)
class TransportStatistics:
    """Counters since the transport was created (message counts unless noted)."""

    sent: int  # handed to the kernel on an outbound connection
    received: int  # delivered to `inbound`
    dropped_queue_full: int  # a peer's outbound queue (or the delay queue) was full
    dropped_bad_frame: int  # undecodable/oversize frames and bad hellos, in or out
    dropped_unknown_peer: int  # sent to a node id we have no address for
    reconnects: int  # outbound connection attempts after the first, over all peers
    connected_peers: frozenset[NodeId]  # peers with an established outbound connection now
    dropped_faults: int = 0  # dropped by the fault hook (`Faults`)
    dropped_misrouted: int = 0  # inbound with the wrong `to`, or `frm` != hello id
    dropped_inbound_full: int = 0  # `inbound` was full (or closed by its reader)
    dropped_send_failed: int = 0  # taken from a queue but lost with a broken connection
    refused: int = 0  # connections (either direction) closed by TLS or admission (module doc)


def encode_hello(node_id: NodeId, addr: Address) -> bytes:
    """The hello frame: who is calling, and where it listens."""
    return encode_frame(msgpack.packb({"id": node_id, "addr": [addr[0], addr[1]]}))


def encode_refusal(why: str) -> bytes:
    """The refusal frame an accepting side writes before it closes (reason cut to 200 chars)."""
    return encode_frame(msgpack.packb({"refused": why[:200]}))


def parse_hello(payload: bytes) -> tuple[NodeId, Address] | str:
    """The (id, address) a hello announces, or why it is not a valid hello."""
    try:
        obj: Any = msgpack.unpackb(payload, raw=False)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        return f"not msgpack: {exc}"
    if not isinstance(obj, dict):
        return "not a map"
    node_id, addr = obj.get("id"), obj.get("addr")
    if type(node_id) is not int or node_id < 1:
        return f"bad id {node_id!r}"
    if not isinstance(addr, list) or len(addr) != 2:
        return f"bad addr {addr!r}"
    host, port = addr
    if not isinstance(host, str) or type(port) is not int or not 0 < port < 65536:
        return f"bad addr {addr!r}"
    return node_id, (host, port)


def refusal_reason(data: bytes | bytearray) -> str:
    """The reason in a refusal frame (module doc), or a description of unexpected bytes."""
    try:
        payload = FrameDecoder(HELLO_MAX).receive_data(data)
        obj: Any = msgpack.unpackb(payload[0], raw=False) if payload else None
    except Exception:  # whatever it wrote, it is not talking Raft to us
        obj = None
    if isinstance(obj, dict) and isinstance(obj.get("refused"), str):
        return str(obj["refused"])
    return "it wrote on our outbound connection"


def connect_refused(exc: OSError) -> bool:
    """Whether a connect failed because nothing listens there (trio's happy eyeballs raises an
    OSError whose cause chain holds the per-address errors)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError):
            return True
        if isinstance(seen, BaseExceptionGroup):
            return any(isinstance(e, OSError) and connect_refused(e) for e in seen.exceptions)
        seen = seen.__cause__ or seen.__context__
    return False


def remote_name(stream: trio.SocketStream) -> str:
    try:
        name = stream.socket.getpeername()
    except OSError:
        return "<unknown>"
    if isinstance(name, tuple) and len(name) >= 2:
        host = f"[{name[0]}]" if ":" in str(name[0]) else str(name[0])
        return f"{host}:{name[1]}"
    return str(name)
