"""The accepting side of the peer port: TLS check, hello, admission, delivery to `inbound`.

Job: the half of `raft.transport.PeerTransport` that serves accepted connections, kept in its
own module as the base class `InboundPeers` (the transport is its only subclass; the state it
reads is the transport's, declared below). Protocol, admission rule and invariants: the
`raft.transport` module docstring. Each accepted connection is one `InboundConn` in one task
of the transport's nursery; nothing it receives can end that nursery.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import math
from collections.abc import Callable, Mapping

import trio

from orchestrator.raft.codec import CodecError, decode_message
from orchestrator.raft.framing import FrameDecoder, FramingError
from orchestrator.raft.peerwire import (
    CONN_ERRORS,
    HELLO_MAX,
    HELLO_TIMEOUT,
    RECV_SIZE,
    REFUSAL_SEND_TIMEOUT,
    WILDCARD_HOSTS,
    Address,
    PeerTLS,
    encode_refusal,
    parse_hello,
    remote_name,
)
from orchestrator.raft.tlsstream import TLSStream, tls_reason
from orchestrator.raft.types import Message, NodeId

__all__ = ["InboundConn", "InboundPeers"]

log = logging.getLogger("orchestrator.raft.transport")

_LOUD_COMPLAINTS = 5  # per inbound connection; after that a misbehaving peer only logs at DEBUG
_REFUSAL_MEMORY = 1024  # (caller, reason) pairs remembered to log each refusal once


class InboundConn:
    """Per accepted connection: who it claims to be, and how much it has misbehaved."""

    __slots__ = ("cert_id", "complaints", "peer_id", "remote", "scope")

    def __init__(self, remote: str, scope: trio.CancelScope) -> None:
        self.remote = remote
        self.peer_id: NodeId | None = None
        self.cert_id: NodeId | None = None  # the node id its certificate names (with TLS)
        self.complaints = 0
        self.scope = scope  # cancelled when its peer is removed


class InboundPeers(abc.ABC):
    """Serving accepted peer connections, and the bookkeeping both directions share (refusal
    logging, `on_peer_down`). Mixed into `PeerTransport`, which owns the state below."""

    node_id: NodeId
    max_frame: int
    tls: PeerTLS | None
    admit_unknown: bool
    on_peer_down: Callable[[NodeId], None] | None
    on_message: Callable[[Message], bool] | None
    _peers: Mapping[NodeId, object]
    _inbound_conns: dict[NodeId, set[InboundConn]]
    _removed: set[NodeId]
    _inbound_send: trio.MemorySendChannel[Message]
    _received: int
    _dropped_bad_frame: int
    _dropped_misrouted: int
    _dropped_inbound_full: int
    _refused: int
    _refusals_logged: set[tuple[str, str]]

    @abc.abstractmethod
    def set_peer(self, node_id: NodeId, addr: Address) -> None:
        """Learn (or update) a peer's address: a hello from an admitted caller tells it."""

    def _log_refusal(self, who: str, why: str, fmt: str, *args: object) -> None:
        """Log a refusal at WARNING once per (who, why), later ones at DEBUG."""
        key = (who, why)
        if key in self._refusals_logged:
            log.debug(fmt, *args)
            return
        if len(self._refusals_logged) >= _REFUSAL_MEMORY:
            self._refusals_logged.clear()
        self._refusals_logged.add(key)
        log.warning(fmt, *args)

    def _peer_down(self, peer_id: NodeId) -> None:
        if self.on_peer_down is None:
            return
        try:
            self.on_peer_down(peer_id)
        except Exception:  # the driver's bug must not take the connection's task down
            log.exception("node %d: error in on_peer_down(%d)", self.node_id, peer_id)

    async def _handle_inbound(self, stream: trio.SocketStream) -> None:
        with trio.CancelScope() as scope:
            conn = InboundConn(remote_name(stream), scope)
            try:
                async with stream:
                    if self.tls is None:
                        await self._serve_inbound(stream, conn)
                        return
                    secured = TLSStream(stream, self.tls.server(), server_side=True)
                    async with secured:
                        if await self._secure_inbound(secured, conn):
                            await self._serve_inbound(secured, conn)
            except CONN_ERRORS as exc:
                log.info(
                    "node %d: inbound connection from %s failed: %s",
                    self.node_id,
                    conn.remote,
                    exc,
                )
                if conn.peer_id is not None and not isinstance(exc, trio.ClosedResourceError):
                    self._peer_down(conn.peer_id)
            finally:
                if conn.peer_id is not None:
                    conns = self._inbound_conns.get(conn.peer_id)
                    if conns is not None:
                        conns.discard(conn)
                        if not conns:
                            del self._inbound_conns[conn.peer_id]

    async def _secure_inbound(self, stream: TLSStream, conn: InboundConn) -> bool:
        """The TLS handshake of an accepted connection (bounded by HELLO_TIMEOUT) and the check
        that the caller presented a server's certificate. False: refused (logged, counted)."""
        assert self.tls is not None
        why = ""
        with trio.move_on_after(HELLO_TIMEOUT) as handshake:
            try:
                await stream.do_handshake()
            except CONN_ERRORS as exc:  # no certificate, another CA's, not TLS at all...
                why = f"TLS handshake failed: {tls_reason(exc)}"
        if handshake.cancelled_caught:
            why = "TLS handshake timed out"
        handshake_done = not why
        if handshake_done:
            ident = self.tls.identify(stream.peer_certificate())
            if isinstance(ident, int):
                conn.cert_id = ident
                return True
            why = ident
        self._refused += 1
        host = conn.remote.rsplit(":", 1)[0]
        self._log_refusal(
            host,
            why,
            "node %d: refused peer connection from %s: %s",
            self.node_id,
            conn.remote,
            why,
        )
        if handshake_done:  # a CA-signed certificate, but not a server's: say so
            await self._send_refusal(stream, why)
        # (a failed handshake already sent the TLS alert saying why: `TLSStream.do_handshake`)
        return False

    async def _send_refusal(self, stream: trio.abc.Stream, why: str) -> None:
        """The refusal frame (module doc): best effort, briefly."""
        with trio.move_on_after(REFUSAL_SEND_TIMEOUT):
            with contextlib.suppress(*CONN_ERRORS):
                await stream.send_all(encode_refusal(why))

    async def _serve_inbound(self, stream: trio.abc.Stream, conn: InboundConn) -> None:
        decoder = FrameDecoder(min(HELLO_MAX, self.max_frame))
        hello_deadline = trio.CancelScope(deadline=trio.current_time() + HELLO_TIMEOUT)
        with hello_deadline:
            while True:
                data = await stream.receive_some(RECV_SIZE)
                if not data:
                    log.debug("node %d: %s closed its connection", self.node_id, conn.remote)
                    if conn.peer_id is not None:
                        self._peer_down(conn.peer_id)
                    return
                try:
                    decoder.feed(data)
                    while (payload := decoder.next_frame()) is not None:
                        if conn.peer_id is None:
                            refusal = self._accept_hello(payload, conn)
                            if refusal is not None:
                                if refusal:
                                    await self._send_refusal(stream, refusal)
                                return
                            hello_deadline.deadline = math.inf
                            decoder.max_frame = self.max_frame
                        else:
                            self._deliver(payload, conn)
                except FramingError as exc:  # the stream is desynchronised: give up on it
                    self._dropped_bad_frame += 1
                    log.warning(
                        "node %d: closing connection from %s (peer %s): %s",
                        self.node_id,
                        conn.remote,
                        conn.peer_id,
                        exc,
                    )
                    return
        if hello_deadline.cancelled_caught:
            self._dropped_bad_frame += 1
            log.warning(
                "node %d: no hello from %s within %.1fs; closing",
                self.node_id,
                conn.remote,
                HELLO_TIMEOUT,
            )

    def _accept_hello(self, payload: bytes, conn: InboundConn) -> str | None:
        """Admit a connection by its hello (module doc): None if admitted, else why not ("" for
        a malformed hello: no refusal frame for those, the caller is no peer of ours)."""
        hello = parse_hello(payload)
        if isinstance(hello, str) or hello[0] == self.node_id:
            why = hello if isinstance(hello, str) else "it claims our own node id"
            self._dropped_bad_frame += 1
            log.warning("node %d: bad hello from %s (%s); closing", self.node_id, conn.remote, why)
            return ""
        peer_id, (host, port) = hello
        refusal = ""
        if conn.cert_id is not None and conn.cert_id != peer_id:
            refusal = f"the certificate of node {conn.cert_id} announces node {peer_id}"
        elif peer_id in self._removed:
            refusal = f"node {peer_id} was removed from the cluster"
        elif peer_id not in self._peers and not self.admit_unknown:
            refusal = f"node {peer_id} is not a member of this server's cluster"
        if refusal:
            self._refused += 1
            self._log_refusal(
                f"node {peer_id}",
                refusal,
                "node %d: refused peer connection from %s: %s",
                self.node_id,
                conn.remote,
                refusal,
            )
            return refusal
        conn.peer_id = peer_id
        self._inbound_conns.setdefault(peer_id, set()).add(conn)
        if host in WILDCARD_HOSTS:  # it listens everywhere; the address it came from will do
            host = conn.remote.rsplit(":", 1)[0].strip("[]")
        if peer_id not in self._peers:
            log.info(
                "node %d: learned address %s:%d of peer %d from its hello",
                self.node_id,
                host,
                port,
                peer_id,
            )
            self.set_peer(peer_id, (host, port))
        log.debug(
            "node %d: inbound connection from peer %d (%s)", self.node_id, peer_id, conn.remote
        )
        return None

    def _deliver(self, payload: bytes, conn: InboundConn) -> None:
        try:
            msg = decode_message(payload)
        except CodecError as exc:
            self._dropped_bad_frame += 1
            self._complain(conn, "dropping undecodable frame: %s", exc)
            return
        if msg.to != self.node_id or msg.frm != conn.peer_id:
            self._dropped_misrouted += 1
            self._complain(
                conn,
                "dropping %s from %d to %d on the connection of peer %s",
                msg.type.name,
                msg.frm,
                msg.to,
                conn.peer_id,
            )
            return
        if self.on_message is not None:
            try:
                taken = self.on_message(msg)
            except Exception:  # the driver's bug must not take the connection's task down
                log.exception("node %d: error in on_message(%s)", self.node_id, msg.type.name)
                taken = False
            if taken:
                self._received += 1
            else:
                self._dropped_inbound_full += 1
            return
        try:
            self._inbound_send.send_nowait(msg)
        except trio.WouldBlock:
            # The driver is behind; blocking here would let a flood stall Raft's event loop.
            self._dropped_inbound_full += 1
            log.debug("node %d: inbound queue full; dropping %s", self.node_id, msg.type.name)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._dropped_inbound_full += 1
        else:
            self._received += 1

    def _complain(self, conn: InboundConn, fmt: str, *args: object) -> None:
        conn.complaints += 1
        level = logging.WARNING if conn.complaints <= _LOUD_COMPLAINTS else logging.DEBUG
        log.log(
            level,
            "node %d: from %s (peer %s): " + fmt,
            self.node_id,
            conn.remote,
            conn.peer_id,
            *args,
        )
