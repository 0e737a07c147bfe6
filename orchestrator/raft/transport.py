"""Peer transport between Raft servers: framed msgpack messages over mutual TLS (or plain TCP).

Code map: this module is `PeerTransport` (its public API and the sending side: per-peer
queues, connections, batching); `raft.peerinbound` serves accepted connections (its base class
`InboundPeers`); `raft.peerwire` holds the hello and refusal frames, the timeouts and the
public types (`Address`, `PeerTLS`, `Faults`, `TransportStatistics`, re-exported here);
`raft.tlsstream` is the TLS layer. The fault injector of the tests is `testing.faults`.

Job: carry `Message`s from the local Raft driver to other servers and back. Raft tolerates loss,
duplication and reordering, so this transport is deliberately lossy: it never blocks its caller
and never buffers without bound; it drops (and counts) instead.

Wire protocol (per connection, one direction only):
- With `tls` (every server: `PeerTLS`, contexts from `security.peercerts`), each TCP connection
  starts with a TLS 1.3 handshake in which BOTH sides present a certificate signed by the
  cluster CA. The connecting side then checks that the accepting side's certificate names the
  node id it meant to reach (`PeerTLS.identify`); the accepting side, that the connecting
  side's certificate is a server's. Without `tls` (in-process tests and benches only) the
  connection is plain TCP and the hello alone says who is calling.
- The connecting side sends frames (see `framing`): first a hello frame, the msgpack map
  `{"id": <its node id>, "addr": [<host>, <port>]}`, then one `codec.encode_message` per frame.
- The accepting side reads the hello, then messages. It writes at most once: a refusal frame
  `{"refused": <reason>}` just before it closes a connection it does not admit, so the other
  side can tell a refusal from a dead peer. Each server therefore keeps one outbound connection
  per peer (for its own sends) and accepts one from each peer.

Admission (the accepting side; a refused connection is closed, counted in
`statistics().refused` and logged once per caller and reason, not once per reconnect):
- with `tls`, the certificate's node id must equal the hello's id;
- the id must be a current peer (`set_peer`; `remove_peer` also closes its open connections),
  or, while `admit_unknown` is set (a joining server that does not know the membership yet:
  the leader that adds it calls first), any id not explicitly removed; such a peer is learned
  from its hello. The Raft driver clears `admit_unknown` once it knows the membership.

Invariants:
- `send` is synchronous and O(1) apart from fault planning: it routes by `msg.to` into that
  peer's bounded queue, or drops. Unknown peers, full queues and injected faults are counted in
  `statistics()`. `send_now` is `send` for a batch, except that the messages for a peer whose
  writer is idle are encoded and written (TLS only) from the caller's task without blocking;
  they stay in order with the queue's (only an empty queue is bypassed), and a write that
  fails is the writer's to report, as if it had failed there.
- Everything reaching `inbound` was decoded by `decode_message`, is addressed to this node and
  comes from the node id that the connection announced in its hello. With `on_message` the
  messages go to that callback instead (called from the connection's task, no task in between:
  one task switch less per message batch, which the Raft driver takes); it returns False to
  refuse one (its queue is full), which is then dropped and counted like a full `inbound`.
  Nothing a peer sends can crash `run`: per-connection errors (OSError, broken/closed
  streams, FramingError, CodecError) are contained in that connection's task and logged;
  `trio.Cancelled` is never swallowed.
- Memory is bounded: at most `queue_size` messages per peer queue, `queue_size` delayed messages,
  `queue_size` undelivered inbound messages, and about `max_frame` bytes per inbound connection.
- All tasks live in the nursery opened by `run`; cancelling `run` stops them and closes every
  socket. The transport may be run again after `run` returns (not concurrently).
- `on_peer_down(peer)` is called when the peer's side ended a connection (EOF or reset, on
  either direction, after its hello) or refused one at the TCP level: signs that its process is
  gone, which a kernel gives at once for a killed process. Never for our own closes
  (cancellation, address changes, bad frames), timeouts, a black-holed address, a failed TLS
  handshake, a certificate either side does not accept, or a refusal frame: those say the peer
  is alive but will not talk to us. It is called after every message
  that connection delivered went into `inbound` (`statistics().received` counts them).
- Fault injection happens on the sending side only (`Faults.plan`; the test kit's
  `testing.faults.FaultInjector`), so one injector can be shared by every transport of a test
  cluster.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import random
from collections import deque
from collections.abc import Callable

import trio

from orchestrator.raft.codec import encode_message
from orchestrator.raft.framing import MAX_FRAME, encode_frame
from orchestrator.raft.peerinbound import InboundConn, InboundPeers
from orchestrator.raft.peerwire import (
    CONN_ERRORS,
    CONNECT_TIMEOUT,
    RECV_SIZE,
    Address,
    Faults,
    PeerTLS,
    TransportStatistics,
    connect_refused,
    encode_hello,
    refusal_reason,
)
from orchestrator.raft.tlsstream import TLSStream, tls_alert, tls_reason
from orchestrator.raft.types import Message, NodeId

__all__ = [
    "Address",
    "Faults",
    "PeerTLS",
    "PeerTransport",
    "TransportStatistics",
]

log = logging.getLogger("orchestrator.raft.transport")


class _Peer:
    """Per-peer sending state. The queue outlives connections; the scopes do not."""

    __slots__ = (
        "addr",
        "conn_scope",
        "connected",
        "idle",
        "node_id",
        "nonempty",
        "queue",
        "scope",
        "send_error",
        "wake",
    )

    def __init__(self, node_id: NodeId, addr: Address) -> None:
        self.node_id = node_id
        self.addr = addr
        self.queue: deque[Message] = deque()
        self.nonempty = trio.Event()  # set when queue gets an item; replaced by the sender
        self.wake = trio.Event()  # set when the address changes, to cut a backoff sleep short
        self.scope: trio.CancelScope | None = None  # the sender task; None if not running
        self.conn_scope: trio.CancelScope | None = None  # the current connection attempt
        self.connected = False
        # The connection's TLS stream while its writer waits with nothing queued and has not
        # been woken: `send_now` may write to it from the caller's task. None otherwise.
        self.idle: TLSStream | None = None
        self.send_error: BaseException | None = None  # a `send_now` write failed: the writer ends


class PeerTransport(InboundPeers):
    """TCP transport for one Raft server. See the module docstring for the protocol."""

    def __init__(
        self,
        node_id: NodeId,
        listen: Address,
        peers: dict[NodeId, Address],
        *,
        faults: Faults | None = None,
        max_frame: int = MAX_FRAME,
        queue_size: int = 4096,
        reconnect_backoff: tuple[float, float] = (0.05, 2.0),
        rng: random.Random | None = None,
        on_peer_down: Callable[[NodeId], None] | None = None,
        tls: PeerTLS | None = None,
        admit_unknown: bool = False,
        on_message: Callable[[Message], bool] | None = None,
    ) -> None:
        if node_id < 1:
            raise ValueError("node ids start at 1")
        if queue_size < 1:
            raise ValueError("queue_size must be at least 1")
        if not 0.0 < reconnect_backoff[0] <= reconnect_backoff[1]:
            raise ValueError("reconnect_backoff must satisfy 0 < min <= max")
        self.node_id = node_id
        self.listen = listen
        self.port = listen[1]  # the bound port once `run` has started (useful with port 0)
        self.faults = faults
        self.max_frame = max_frame
        self.queue_size = queue_size
        self.reconnect_backoff = reconnect_backoff
        self._rng = rng if rng is not None else random.Random()
        self.on_peer_down = on_peer_down
        self.on_message = on_message
        self.tls = tls
        self.admit_unknown = admit_unknown  # admission rule: module doc

        self._peers: dict[NodeId, _Peer] = {}
        self._inbound_conns: dict[NodeId, set[InboundConn]] = {}  # admitted, open
        # Explicitly removed members are not re-learned from their hellos: a removed server that
        # is still running must not sneak back into our address book.
        self._removed: set[NodeId] = set()

        self._inbound_send: trio.MemorySendChannel[Message]
        self.inbound: trio.MemoryReceiveChannel[Message]
        self._inbound_send, self.inbound = trio.open_memory_channel[Message](queue_size)

        # Delayed (fault-injected) messages: (due time, tie-breaker, message), one pump task.
        self._delayed: list[tuple[float, int, Message]] = []
        self._delay_seq = itertools.count()
        self._delay_wakeup = trio.Event()

        self._nursery: trio.Nursery | None = None
        self._running = False
        self._hello = b""

        self._sent = 0
        self._received = 0
        self._dropped_queue_full = 0
        self._dropped_bad_frame = 0
        self._dropped_unknown_peer = 0
        self._reconnects = 0
        self._dropped_faults = 0
        self._dropped_misrouted = 0
        self._dropped_inbound_full = 0
        self._dropped_send_failed = 0
        self._refused = 0
        self._refusals_logged: set[tuple[str, str]] = set()

        for peer_id, addr in peers.items():
            self.set_peer(peer_id, addr)

    # ------------------------------------------------------------------ public API

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen, connect to peers and move messages until cancelled."""
        if self._running:
            raise RuntimeError("transport is already running")
        self._running = True
        try:
            host = self.listen[0] or None
            listeners = await trio.open_tcp_listeners(self.listen[1], host=host)
            try:
                self.port = listeners[0].socket.getsockname()[1]
                self._hello = encode_hello(self.node_id, (self.listen[0], self.port))
                async with trio.open_nursery() as nursery:
                    await nursery.start(trio.serve_listeners, self._handle_inbound, listeners)
                    self._nursery = nursery
                    nursery.start_soon(self._pump_delayed)
                    for peer in self._peers.values():
                        self._start_sender(peer)
                    log.info("node %d listening on %s:%d", self.node_id, self.listen[0], self.port)
                    task_status.started()
            finally:
                # serve_listeners closes them too, but not if we fail before it starts.
                for listener in listeners:
                    listener.socket.close()
        finally:
            self._nursery = None
            self._running = False
            for peer in self._peers.values():
                peer.scope = None
                peer.conn_scope = None
                peer.connected = False

    def send(self, msg: Message) -> None:
        """Queue msg for `msg.to`; never blocks. Drops (and counts) instead of waiting."""
        if msg.to not in self._peers:
            self._dropped_unknown_peer += 1
            log.debug("dropping %s to unknown peer %d", msg.type.name, msg.to)
            return
        if self.faults is None:
            self._route(msg)
            return
        delays = self.faults.plan(msg)
        if not delays:
            self._dropped_faults += 1
            return
        for delay in delays:
            if delay <= 0.0:
                self._route(msg)
            else:
                self._schedule(delay, msg)

    def send_now(self, messages: list[Message]) -> None:
        """`send` each message; to a peer whose connection is idle (its writer waiting with an
        empty queue) the messages are written at once, from the caller's task, as one TLS
        write: no writer task is woken (a lone write's messages cost a task switch and a yield
        each that way). Never blocks: what the kernel does not take at once is left to the
        writer."""
        if self.faults is not None:
            for m in messages:
                self.send(m)
            return
        ready: list[_Peer] = []
        for m in messages:
            peer = self._peers.get(m.to)
            if peer is None or peer.idle is None:
                self.send(m)
                continue
            if len(peer.queue) >= self.queue_size:
                self._dropped_queue_full += 1
                continue
            if not peer.queue:
                ready.append(peer)
            peer.queue.append(m)
        for peer in ready:
            self._write_now(peer)

    def set_peer(self, node_id: NodeId, addr: Address) -> None:
        """Add a peer, or change its address (its connection is re-established at once)."""
        if node_id == self.node_id:
            raise ValueError("a transport does not connect to itself")
        addr = (str(addr[0]), int(addr[1]))
        self._removed.discard(node_id)
        peer = self._peers.get(node_id)
        if peer is None:
            peer = self._peers[node_id] = _Peer(node_id, addr)
            if self._nursery is not None:
                self._start_sender(peer)
        elif peer.addr != addr:
            peer.addr = addr
            if peer.conn_scope is not None:
                peer.conn_scope.cancel()
            peer.wake.set()

    def remove_peer(self, node_id: NodeId) -> None:
        """Forget a peer: stop its sender and drop whatever was queued for it."""
        self._removed.add(node_id)
        for conn in self._inbound_conns.pop(node_id, ()):
            conn.scope.cancel()  # a removed member's open connection is not admitted any more
        peer = self._peers.pop(node_id, None)
        if peer is None:
            return
        if peer.scope is not None:
            peer.scope.cancel()
        self._dropped_unknown_peer += len(peer.queue)
        peer.queue.clear()

    def peer_addresses(self) -> dict[NodeId, Address]:
        return {peer_id: peer.addr for peer_id, peer in self._peers.items()}

    def statistics(self) -> TransportStatistics:
        return TransportStatistics(
            sent=self._sent,
            received=self._received,
            dropped_queue_full=self._dropped_queue_full,
            dropped_bad_frame=self._dropped_bad_frame,
            dropped_unknown_peer=self._dropped_unknown_peer,
            reconnects=self._reconnects,
            connected_peers=frozenset(p.node_id for p in self._peers.values() if p.connected),
            dropped_faults=self._dropped_faults,
            dropped_misrouted=self._dropped_misrouted,
            dropped_inbound_full=self._dropped_inbound_full,
            dropped_send_failed=self._dropped_send_failed,
            refused=self._refused,
        )

    # ------------------------------------------------------------------ outbound

    def _route(self, msg: Message) -> None:
        peer = self._peers.get(msg.to)
        if peer is None:  # removed while the message was delayed
            self._dropped_unknown_peer += 1
            return
        if len(peer.queue) >= self.queue_size:
            self._dropped_queue_full += 1
            log.debug("queue to peer %d full; dropping %s", msg.to, msg.type.name)
            return
        peer.queue.append(msg)
        peer.nonempty.set()
        peer.idle = None  # the writer is woken: it writes from now on

    def _write_now(self, peer: _Peer) -> None:
        """Write `peer`'s queue to its idle connection from this task (`send_now`)."""
        stream = peer.idle
        assert stream is not None
        batch = list(peer.queue)
        data, count = self._encode_batch(batch)
        try:
            written = stream.send_nowait(data) if count else True
        except CONN_ERRORS as exc:
            self._dropped_send_failed += count
            peer.queue.clear()
            peer.send_error = exc
            peer.nonempty.set()  # the writer reports the lost connection and ends it
            peer.idle = None
            return
        if not written:  # busy after all (a read is answering a TLS key update): the writer
            peer.nonempty.set()
            peer.idle = None
            return
        peer.queue.clear()
        self._sent += count
        if stream.backlogged:  # the kernel took only part of it: the writer sends the rest
            peer.nonempty.set()
            peer.idle = None

    def _schedule(self, delay: float, msg: Message) -> None:
        if len(self._delayed) >= self.queue_size:
            self._dropped_queue_full += 1
            return
        seq = next(self._delay_seq)
        heapq.heappush(self._delayed, (trio.current_time() + delay, seq, msg))
        if self._delayed[0][1] == seq:  # new earliest deadline: the pump must re-arm its timer
            self._delay_wakeup.set()

    async def _pump_delayed(self) -> None:
        while True:
            now = trio.current_time()
            while self._delayed and self._delayed[0][0] <= now:
                self._route(heapq.heappop(self._delayed)[2])
            self._delay_wakeup = trio.Event()
            with trio.move_on_at(self._delayed[0][0] if self._delayed else math.inf):
                await self._delay_wakeup.wait()

    def _start_sender(self, peer: _Peer) -> None:
        assert self._nursery is not None
        peer.scope = trio.CancelScope()
        self._nursery.start_soon(self._run_sender, peer, peer.scope)

    def _backoff(self, failures: int) -> float:
        lo, hi = self.reconnect_backoff
        ceiling = min(hi, lo * 2.0 ** min(failures, 32))
        # Jitter keeps a cluster that lost a peer from reconnecting to it in lock step.
        return max(lo, self._rng.uniform(ceiling / 2.0, ceiling))

    async def _run_sender(self, peer: _Peer, scope: trio.CancelScope) -> None:
        with scope:
            failures = 0
            first = True
            while True:
                if not first:
                    self._reconnects += 1
                first = False
                addr = peer.addr
                peer.wake = trio.Event()
                if await self._connect_and_send(peer, addr, failures):
                    failures = 0
                else:
                    failures += 1
                if peer.addr != addr:
                    continue  # re-addressed: no reason to wait before trying the new address
                with trio.move_on_after(self._backoff(failures)):
                    await peer.wake.wait()

    async def _connect_and_send(self, peer: _Peer, addr: Address, failures: int) -> bool:
        """One connection's lifetime. Returns whether it got as far as sending the hello."""
        # Repeated failures to reach a down peer are expected; only the first one is news.
        level = logging.INFO if failures == 0 else logging.DEBUG
        established = False
        stream: trio.SocketStream
        secured: trio.abc.Stream
        scope = peer.conn_scope = trio.CancelScope()
        try:
            with scope:
                try:
                    with trio.move_on_after(CONNECT_TIMEOUT) as connect_scope:
                        stream = await trio.open_tcp_stream(*addr)
                except OSError as exc:
                    if connect_refused(exc):
                        self._peer_down(peer.node_id)
                    log.log(
                        level,
                        "node %d: cannot connect to peer %d at %s:%d: %s",
                        self.node_id,
                        peer.node_id,
                        addr[0],
                        addr[1],
                        exc,
                    )
                    return False
                if connect_scope.cancelled_caught:
                    log.log(
                        level,
                        "node %d: connecting to peer %d at %s:%d timed out",
                        self.node_id,
                        peer.node_id,
                        addr[0],
                        addr[1],
                    )
                    return False
                async with stream:
                    secured = stream
                    if self.tls is not None:
                        tls_stream = await self._secure_outbound(peer, stream, addr)
                        if tls_stream is None:
                            return False
                        secured = tls_stream
                    try:
                        await secured.send_all(self._hello)
                    except CONN_ERRORS as exc:
                        log.log(
                            level,
                            "node %d: hello to peer %d failed: %s",
                            self.node_id,
                            peer.node_id,
                            exc,
                        )
                        return False
                    established = peer.connected = True
                    log.info(
                        "node %d: connected to peer %d at %s:%d",
                        self.node_id,
                        peer.node_id,
                        addr[0],
                        addr[1],
                    )
                    try:
                        async with trio.open_nursery() as nursery:
                            nursery.start_soon(
                                self._watch_outbound, peer, secured, nursery.cancel_scope
                            )
                            await self._write_loop(peer, secured)
                            nursery.cancel_scope.cancel()
                    finally:
                        peer.connected = False
            return established  # also reached when set_peer cancelled the attempt
        finally:
            if peer.conn_scope is scope:
                peer.conn_scope = None

    async def _secure_outbound(
        self, peer: _Peer, stream: trio.SocketStream, addr: Address
    ) -> TLSStream | None:
        """The TLS handshake of an outbound connection and the check that the certificate is
        the peer's we meant to reach; None (logged, counted, not a peer-down) if either fails."""
        assert self.tls is not None
        secured = TLSStream(stream, self.tls.client(), server_side=False)
        why = ""
        with trio.move_on_after(CONNECT_TIMEOUT) as handshake:
            try:
                await secured.do_handshake()
            except CONN_ERRORS as exc:
                why = f"TLS handshake failed: {tls_reason(exc)}"
        if handshake.cancelled_caught:
            why = "TLS handshake timed out"
        if not why:
            ident = self.tls.identify(secured.peer_certificate())
            if ident == peer.node_id:
                return secured
            why = (
                f"its certificate is node {ident}'s"
                if isinstance(ident, int)
                else f"its certificate is refused: {ident}"
            )
        self._refused += 1
        self._log_refusal(
            f"peer {peer.node_id}",
            why,
            "node %d: not talking to peer %d at %s:%d: %s",
            self.node_id,
            peer.node_id,
            addr[0],
            addr[1],
            why,
        )
        return None

    async def _write_loop(self, peer: _Peer, stream: trio.abc.Stream) -> None:
        """Write queued messages until the connection fails (then return) or is cancelled.
        While it waits with nothing queued, `send_now` may write to a TLS stream directly."""
        direct = stream if isinstance(stream, TLSStream) else None
        peer.send_error = None
        while True:
            while not peer.queue:
                if peer.send_error is not None:
                    self._lost_while_sending(peer, peer.send_error)
                    return
                if direct is not None and direct.backlogged:
                    try:
                        await direct.flush()
                    except CONN_ERRORS as exc:
                        self._lost_while_sending(peer, exc)
                        return
                    continue
                peer.nonempty = trio.Event()
                peer.idle = direct
                try:
                    await peer.nonempty.wait()
                finally:
                    peer.idle = None
            # Batching: everything queued goes out in one send_all, i.e. few syscalls under load.
            batch = list(peer.queue)
            peer.queue.clear()
            data, count = self._encode_batch(batch)
            if not count:
                continue
            written = False
            try:
                await stream.send_all(data)
                written = True
            except CONN_ERRORS as exc:
                self._lost_while_sending(peer, exc)
                return
            finally:
                if written:
                    self._sent += count
                else:  # includes cancellation: the batch is gone either way
                    self._dropped_send_failed += count

    def _lost_while_sending(self, peer: _Peer, exc: BaseException) -> None:
        log.info(
            "node %d: connection to peer %d lost while sending: %s",
            self.node_id,
            peer.node_id,
            exc,
        )
        # Not for our own close, nor for a TLS alert (alive, but refusing our certificate).
        if not isinstance(exc, trio.ClosedResourceError) and tls_alert(exc) is None:
            self._peer_down(peer.node_id)

    def _encode_batch(self, batch: list[Message]) -> tuple[bytes, int]:
        frames: list[bytes] = []
        for msg in batch:
            try:
                payload = encode_message(msg)
            except (TypeError, ValueError, OverflowError) as exc:  # a bug upstream, not the peer's
                log.error("node %d: cannot encode %r: %s", self.node_id, msg, exc)
                self._dropped_bad_frame += 1
                continue
            if len(payload) > self.max_frame:  # the peer would close the connection on it
                log.warning(
                    "node %d: dropping %s to %d: %d bytes exceeds max_frame %d",
                    self.node_id,
                    msg.type.name,
                    msg.to,
                    len(payload),
                    self.max_frame,
                )
                self._dropped_bad_frame += 1
                continue
            frames.append(encode_frame(payload))
        return b"".join(frames), len(frames)

    async def _watch_outbound(
        self, peer: _Peer, stream: trio.abc.Stream, conn: trio.CancelScope
    ) -> None:
        # The accepting side only writes to refuse, so any read completing means the connection
        # is over. Noticing that now (rather than on the next failed write) lets us reconnect
        # before the next message, so a restarted peer loses at most what was in flight.
        try:
            data = await stream.receive_some(RECV_SIZE)
        except CONN_ERRORS as exc:
            if (
                tls_alert(exc) is not None
            ):  # it alerted: alive, but it does not accept our certificate
                self._refused += 1
                why = f"it refused our certificate: {tls_reason(exc)}"
                self._log_refusal(
                    f"peer {peer.node_id}",
                    why,
                    "node %d: peer %d: %s",
                    self.node_id,
                    peer.node_id,
                    why,
                )
            else:
                log.info("node %d: connection to peer %d lost: %s", self.node_id, peer.node_id, exc)
                if not isinstance(exc, trio.ClosedResourceError):  # that one we closed
                    self._peer_down(peer.node_id)
        else:
            if data:
                self._refused += 1
                why = refusal_reason(data)
                self._log_refusal(
                    f"peer {peer.node_id}",
                    why,
                    "node %d: peer %d refused our connection (%s); reconnecting later",
                    self.node_id,
                    peer.node_id,
                    why,
                )
            else:
                log.info("node %d: peer %d closed the connection", self.node_id, peer.node_id)
                self._peer_down(peer.node_id)
        conn.cancel()
