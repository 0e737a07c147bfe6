"""The client port of a server: framed msgpack requests against the replicated store.

This is the interface the tests, the benchmarks and the `orchestrator kv|member|status`
commands use (the Kubernetes API server, a later layer, calls the `Store` in-process). Wire
format, one frame each (see `raft.framing`):

    request:  [request_id, op, [args...]]
    response: [request_id, status, value]

status is "ok" (value = result), "not_leader" (value = [leader_id, leader_peer_addr] or nil),
"lost" (the write was not committed), "unavailable" (value = reason: retry), "timeout" (no
quorum answered in time: a write's outcome is unknown), "error" (a bad request), or a store
error code ("exists", "not_found", "conflict", "compacted", "too_large", "no_space", ...;
value = [message, current kv or compact revision]). A watch answers many times with status
"watch" (value = [events, revision, progress]) until one final "canceled" (value = [reason,
compact_revision]). A backup answers many times with status "chunk" (value = up to
BACKUP_CHUNK bytes of the store's SQLite image, in order) and then "ok" (value = metadata:
revision, applied_index, image_bytes, image_sha256, ...). A KeyValue travels as [key, value,
create_revision, mod_revision, version]; an Event as [type, kv, prev_kv].

Stopping (`drain`, the server's SIGTERM): the listener closes (new connections are refused),
every watch ends with "canceled" (reason "server shutting down": `StoreClient` resumes it on
another server), every connection stops reading requests, answers the ones it has read and
closes. The caller bounds the wait (a backup may stream for long).

Authentication: a server's client port runs mutual TLS (`ServiceTLS`: TLS 1.3, client
certificate required and verified against the cluster CA by the handshake); after the handshake
`ServiceTLS.identify` must accept the certificate (a server's peer certificate or an admin's,
`security.peercerts.client_port_identity`). A server certificate whose node id is not a
member (a server that is joining, or one that was removed) may only `join` (which also needs
the cluster token) and read the sealed credentials bundle (`clientwire.JOINER_KEYS`): a
removed member's certificate reads no key of the store. A refused connection gets one answer frame
`[nil, "refused", reason]` and is closed, before any request is read; refusals are logged once
per remote host and reason. Without `tls` (in-process tests and benchmarks only) the port is
plain TCP and unauthenticated. The TLS layer is `raft.tlsstream.TLSStream`: each read of a
connection decrypts every request received so far (`_READ_SIZE` per socket read), and the
answers gathered by the connection's writer go out as one encrypted send; an answer to a
fast-path write that finds the writer idle is sent at once from the task that resolved it (the
Raft loop), without waking the writer (`TLSStream.send_nowait`).

Invariants: a bad frame or an unknown op is answered with "error" (or, for an unreadable frame,
the connection is closed) and changes nothing; "ok" for a write means it is committed and
applied on this server; nothing a client sends can stop the server; a request read before a
drain is answered unless the drain's bound runs out.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import ssl
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import partial
from typing import Any

import msgpack
import trio

from orchestrator.raft.framing import FrameDecoder, FramingError, encode_frame
from orchestrator.raft.membership import add_learner_change, promote_change, remove_change
from orchestrator.raft.node import (
    Busy,
    InvalidRequest,
    NotLeader,
    OutcomeUnknown,
    ProposalLost,
    RaftNode,
    ReadAborted,
    parse_addr,
)
from orchestrator.raft.tlsstream import TLSStream, tls_reason
from orchestrator.store.clientwire import (
    BadRequest,
    bytes_arg,
    error_value,
    event_wire,
    joiner_may,
    joining_server,
    kv_wire,
    nonneg_arg,
    positive_arg,
    refusal,
    text_arg,
)
from orchestrator.store.mvcc_sql import SCHEMA_VERSION
from orchestrator.store.raftstore import RaftStore
from orchestrator.store.types import (
    Compare,
    CompareTarget,
    KeyNotFound,
    StoreError,
    TxnOp,
    encode_create,
    encode_put,
)
from orchestrator.store.watch import Watcher

log = logging.getLogger("orchestrator.store.service")

MAX_CLIENT_FRAME = 4 << 20
BACKUP_CHUNK = 1 << 20  # bytes of store image per "chunk" frame (clients read 64 MiB frames)
STORE_OPS = frozenset(
    {"put", "cas", "delete", "get", "create", "update", "kv", "range", "revision"}
)
MAX_IN_FLIGHT_PER_CONN = 1024
HANDSHAKE_TIMEOUT = 10.0  # an accepted connection that has not completed TLS by then is closed
_READ_SIZE = 256 * 1024  # bytes per read: fewer, larger reads under load (TLS or not)
_REFUSALS_REMEMBERED = 1024


@dataclass(frozen=True)
class ServiceTLS:
    """The client port's TLS: `context()` the CURRENT server context for a new connection (a
    renewed certificate is used from then on); `identify(der)` who a verified client
    certificate (DER) is, or None to refuse it."""

    context: Callable[[], ssl.SSLContext]
    identify: Callable[[bytes | None], str | None]


class ClientService:
    def __init__(
        self,
        store: RaftStore,
        listen: str,
        *,
        token: str = "",
        request_timeout: float = 10.0,
        tls: ServiceTLS | None = None,
    ) -> None:
        self.token = token  # a joining server must present it
        self.tls = tls
        self.refused = 0  # connections refused by TLS or by identity
        self._refusals_logged: set[tuple[str, str]] = set()
        # Bounds a request when there is no quorum (the store gives up earlier, with NoQuorum).
        self.request_timeout = request_timeout
        self.store = store
        self.node: RaftNode = store.node
        self.listen = listen
        self.port = 0
        self.draining = trio.Event()  # set by `drain`
        self._drained = trio.Event()  # the listener is closed and every connection finished
        self._stoppable: set[trio.CancelScope] = set()  # connection readers and watches

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled, or until drained (then it returns: module doc)."""
        host, port = parse_addr(self.listen)
        listeners = await trio.open_tcp_listeners(port, host=host)
        self.port = listeners[0].socket.getsockname()[1]
        log.info("node %d serving clients on %s:%d", self.node.id, host, self.port)
        try:
            async with trio.open_nursery() as connections:
                async with trio.open_nursery() as accepting:
                    await accepting.start(
                        partial(
                            trio.serve_listeners,
                            self._serve,
                            listeners,
                            handler_nursery=connections,
                        )
                    )
                    task_status.started()
                    await self.draining.wait()
                    accepting.cancel_scope.cancel()  # closes the listeners
                log.info("node %d: client port closed, finishing the requests read", self.node.id)
        finally:
            self._drained.set()

    async def drain(self) -> None:
        """Stop serving gracefully (module doc); returns once every connection is closed.
        Callers bound it."""
        self.draining.set()
        for scope in list(self._stoppable):
            scope.cancel()
        await self._drained.wait()

    @contextmanager
    def _until_drained(self) -> Iterator[trio.CancelScope]:
        """A cancel scope that `drain` cancels (at once if the drain has begun)."""
        with trio.CancelScope() as scope:
            if self.draining.is_set():
                scope.cancel()
            self._stoppable.add(scope)
            try:
                yield scope
            finally:
                self._stoppable.discard(scope)

    async def _serve(self, sock: trio.SocketStream) -> None:
        if self.tls is None:
            await self._serve_stream(sock)
            return
        stream = TLSStream(sock, self.tls.context(), server_side=True, receive_size=_READ_SIZE)
        why = ""
        joiner = False
        try:
            with trio.move_on_after(HANDSHAKE_TIMEOUT) as handshake:
                await stream.do_handshake()  # a failure sends the alert saying why
            if handshake.cancelled_caught:
                why = "TLS handshake timed out"
            else:
                identity = self.tls.identify(stream.peer_certificate())
                if identity is None:
                    why = "this certificate may not use the client port (servers and admins only)"
                    with trio.move_on_after(1.0), suppress(trio.BrokenResourceError):
                        await stream.send_all(encode_frame(msgpack.packb([None, "refused", why])))
                else:
                    joiner = joining_server(identity, self.node.is_member)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            why = f"TLS handshake failed: {tls_reason(exc)}"
        if why:
            self._refuse(sock, why)
            await trio.aclose_forcefully(stream)
            return
        await self._serve_stream(stream, joiner=joiner)

    def _refuse(self, sock: trio.SocketStream, why: str) -> None:
        """Count a refused connection; log it once per remote host and reason."""
        self.refused += 1
        try:
            host = str(sock.socket.getpeername()[0])
        except OSError:
            host = "?"
        key = (host, why)
        level = logging.DEBUG if key in self._refusals_logged else logging.WARNING
        if len(self._refusals_logged) >= _REFUSALS_REMEMBERED:
            self._refusals_logged.clear()
        self._refusals_logged.add(key)
        log.log(level, "node %d: refused client connection from %s: %s", self.node.id, host, why)

    async def _serve_stream(self, stream: trio.abc.Stream, *, joiner: bool = False) -> None:
        """Serve one connection; a `joiner`'s requests other than `_joiner_may` are refused."""
        decoder = FrameDecoder(MAX_CLIENT_FRAME)
        # Each request task holds a clone of the send side; the writer stops once the reader
        # and every request task have closed theirs, so no answer is cut off.
        send_q, recv_q = trio.open_memory_channel[bytes](MAX_IN_FLIGHT_PER_CONN)
        limiter = trio.CapacityLimiter(MAX_IN_FLIGHT_PER_CONN)
        now = self._sender_now(stream, recv_q)
        try:
            async with stream, trio.open_nursery() as nursery:
                nursery.start_soon(self._writer, stream, recv_q)
                # Draining stops the reading; the requests read are answered, then it closes.
                async with send_q:
                    with self._until_drained():
                        while True:
                            data = await stream.receive_some(_READ_SIZE)
                            if not data:
                                break
                            for frame in decoder.receive_data(data):
                                if joiner and not joiner_may(frame):
                                    await send_q.send(refusal(frame))
                                    continue
                                # Awaiting only when the connection is at its bound: the await
                                # is a yield to the scheduler, a task switch per request.
                                try:
                                    limiter.acquire_on_behalf_of_nowait(frame)
                                except trio.WouldBlock:
                                    await limiter.acquire_on_behalf_of(frame)
                                if not self._fast_write(frame, send_q, limiter, nursery, now):
                                    nursery.start_soon(self._handle, frame, send_q.clone(), limiter)
        except* (OSError, trio.BrokenResourceError, trio.ClosedResourceError, FramingError) as eg:
            log.debug("client connection closed: %s", eg.exceptions[0])
        except* Exception:
            # A bug in serving one connection must not take the server down.
            log.exception("error while serving a client connection")

    @staticmethod
    def _sender_now(
        stream: trio.abc.Stream, recv_q: trio.MemoryReceiveChannel[bytes]
    ) -> Callable[[bytes], bytes | None]:
        """A function that sends an answer at once from the caller's task when the connection's
        writer is idle (waiting on an empty queue; TLS only), instead of waking the writer.
        It returns what the caller must still queue for the writer: None (nothing), the answer
        (not sent), or b"" (sent, but the kernel took only part: the writer, woken by it, sends
        the rest, as `TLSStream.send_all` flushes first)."""
        if not isinstance(stream, TLSStream):
            return lambda answer: answer

        def now(answer: bytes) -> bytes | None:
            st = recv_q.statistics()
            if st.current_buffer_used or not st.tasks_waiting_receive:
                return answer
            try:
                if not stream.send_nowait(answer):
                    return answer
            except trio.BrokenResourceError:
                return None  # the connection is gone, and the answer with it (the reader ends)
            return b"" if stream.backlogged else None

        return now

    def _fast_write(
        self,
        frame: bytes,
        send_q: trio.MemorySendChannel[bytes],
        limiter: trio.CapacityLimiter,
        nursery: trio.Nursery,
        send_now: Callable[[bytes], bytes | None],
    ) -> bool:
        """Serve a well-formed put/update/create without a task: the answer is sent from the
        write's callback (one of the larger per-write costs on the leader was the task and its
        wake-up). Anything else, and any attempt that must be retried, goes the usual way
        (`_handle`); returns False when the frame is not for this path."""
        try:
            req = msgpack.unpackb(frame)
        except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError):
            return False
        if not isinstance(req, list) or len(req) != 3 or not isinstance(req[2], list):
            return False
        rid, op, args = req
        guard: Any = None
        if op in ("put", "create") and len(args) == 2:
            key, value = args
        elif op == "update" and len(args) in (2, 3):
            key, value = args[0], args[1]
            guard = args[2] if len(args) == 3 else None
            if guard is not None and (type(guard) is not int or guard < 0):
                return False
        else:
            return False
        if not isinstance(key, str) or not isinstance(value, bytes):
            return False
        q = send_q.clone()

        def done(result: Any, error: BaseException | None) -> None:
            out: Any
            if isinstance(error, NotLeader | Busy | ReadAborted | ProposalLost):
                # Certainly not applied: the usual path retries within its own bound.
                nursery.start_soon(self._handle, frame, q, limiter)
                return
            if isinstance(error, StoreError):
                status, out = error.code, error_value(error)
            elif error is not None:
                status, out = "error", str(error)
            else:
                status, out = "ok", True if op == "put" else kv_wire(result.kv)
            queued = send_now(encode_frame(msgpack.packb([rid, status, out])))
            if queued is not None:
                with suppress(trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                    q.send_nowait(queued)
            q.close()
            limiter.release_on_behalf_of(frame)

        data = encode_create(key, value) if op == "create" else encode_put(key, value, guard)
        self.store.submit_write(data, done)
        return True

    async def _writer(self, stream: trio.abc.Stream, q: trio.MemoryReceiveChannel[bytes]) -> None:
        async with q:
            async for frame in q:
                batch = [frame]
                while True:
                    try:
                        batch.append(q.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):  # the last answer is in
                        break
                await stream.send_all(b"".join(batch))

    async def _handle(
        self, frame: bytes, q: trio.MemorySendChannel[bytes], limiter: trio.CapacityLimiter
    ) -> None:
        rid: Any = None
        try:
            try:
                req = msgpack.unpackb(frame)
                if not isinstance(req, list) or len(req) != 3 or not isinstance(req[2], list):
                    raise BadRequest("a request is [id, op, [args]]")
                rid, op, args = req
                if op == "watch":
                    await self._watch(rid, args, q)
                    return
                if op == "backup":
                    await self._backup(rid, q)
                    return
                if op in STORE_OPS:  # the store bounds these itself (NoQuorum)
                    status, value = "ok", await self._dispatch(op, args)
                else:
                    with trio.fail_after(self.request_timeout):
                        status, value = "ok", await self._dispatch(op, args)
            except StoreError as exc:
                status, value = exc.code, error_value(exc)
            except BadRequest as exc:
                status, value = "error", str(exc)
            except (IndexError, TypeError):
                status, value = "error", f"wrong arguments for {req[1]!r}"

            except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError) as exc:
                status, value = "error", f"malformed request: {exc}"
            except NotLeader as exc:
                status = "not_leader"
                value = [exc.leader, exc.leader_addr] if exc.leader else None
            except ProposalLost as exc:
                status, value = "lost", str(exc)
            except trio.TooSlowError:
                # Writes: proposed but not seen committed in time; the outcome is unknown.
                status = "timeout"
                value = f"no quorum: no answer within {self.request_timeout:g}s (outcome unknown)"
            except (ReadAborted, Busy) as exc:
                status, value = "unavailable", str(exc)
            except InvalidRequest as exc:
                status, value = "error", str(exc)
            except OutcomeUnknown as exc:
                status, value = "timeout", str(exc)
            # If the client went away or stopped reading, the answer is its loss.
            with suppress(trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                q.send_nowait(encode_frame(msgpack.packb([rid, status, value])))
        finally:
            q.close()
            limiter.release_on_behalf_of(frame)

    def _faults(self, args: list[Any]) -> bool:
        """Test hook (server started with --enable-fault-injection): this server's outbound
        peer traffic obeys a partition; e.g. isolate the leader by telling every server."""
        faults = self.node.cfg.faults
        if faults is None:
            raise BadRequest("fault injection is disabled on this server")
        action = args[0] if args else None
        if action == "heal":
            faults.heal()
        elif action == "isolate":
            faults.isolate(positive_arg(args[1], "node id"))
        elif action == "partition":
            groups = args[1]
            if not isinstance(groups, list) or not all(isinstance(g, list) for g in groups):
                raise BadRequest("partition takes a list of lists of node ids")
            faults.partition(*({positive_arg(n, "node id") for n in g} for g in groups))
        else:
            raise BadRequest(f"unknown fault action {action!r}")
        return True

    async def _watch(self, rid: Any, args: list[Any], q: trio.MemorySendChannel[bytes]) -> None:
        prefix = args[0] if args else ""
        if not isinstance(prefix, str):
            raise BadRequest("prefix must be a string")
        start = args[1] if len(args) > 1 else 0
        if type(start) is not int or start < 0:
            raise BadRequest("start revision must be a non-negative integer")
        progress = bool(args[2]) if len(args) > 2 else False
        async with self.store.watch(prefix, start, progress_notify=progress) as watcher:
            with self._until_drained() as stopping:
                await self._stream_watch(rid, watcher, q)
        if stopping.cancelled_caught:  # the client resumes on another server
            frame = encode_frame(msgpack.packb([rid, "canceled", ["server shutting down", 0]]))
            with suppress(trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                q.send_nowait(frame)

    async def _stream_watch(
        self, rid: Any, watcher: Watcher, q: trio.MemorySendChannel[bytes]
    ) -> None:
        """Until the watch is canceled, or the client does not keep up (both end it)."""
        async for resp in watcher:
            if resp.canceled:
                q.send_nowait(
                    encode_frame(
                        msgpack.packb(
                            [rid, "canceled", [resp.cancel_reason, resp.compact_revision]]
                        )
                    )
                )
                return
            frame = encode_frame(
                msgpack.packb(
                    [
                        rid,
                        "watch",
                        [[event_wire(e) for e in resp.events], resp.revision, resp.progress],
                    ]
                )
            )
            try:
                q.send_nowait(frame)
            except trio.WouldBlock:
                # The client does not read its answers: end the watch, it must re-list.
                q.send_nowait(
                    encode_frame(msgpack.packb([rid, "canceled", ["client too slow", 0]]))
                )
                return

    async def _backup(self, rid: Any, q: trio.MemorySendChannel[bytes]) -> None:
        """Stream a consistent image of the store: a ReadIndex barrier (so the image holds
        every write acknowledged before the request), then `MVCCStore.snapshot()` on its
        database thread (checkpointed and serialized at exactly the applied index), sent as
        "chunk" frames of BACKUP_CHUNK bytes and a final "ok" with the metadata (revision,
        applied index, size, SHA-256). A client that stops reading slows the stream down."""
        await self.store.current_revision(linearizable=True)  # NoQuorum after quorum_timeout
        mvcc = self.store.mvcc

        def take() -> tuple[int, bytes, int, int]:
            index, image = mvcc.snapshot()
            return index, image, mvcc.revision(), mvcc.compact_revision()

        index, image, revision, compact = await self.node.read_state_machine(take)
        node = self.node
        conf = node.conf()
        meta = {
            "revision": revision,
            "compact_revision": compact,
            "applied_index": index,
            "raft_term": node.term_at(index) or node.leadership()[1],
            "schema_version": SCHEMA_VERSION,
            "source_node": self.node.id,
            "voters": sorted(conf.voters),
            "learners": sorted(conf.learners),
            "image_bytes": len(image),
            "image_sha256": hashlib.sha256(image).hexdigest(),
        }
        log.info(
            "node %d: backup at revision %d (index %d, %d bytes)",
            self.node.id,
            revision,
            index,
            len(image),
        )
        view = memoryview(image)
        try:
            for at in range(0, len(image), BACKUP_CHUNK):
                chunk = bytes(view[at : at + BACKUP_CHUNK])
                await q.send(encode_frame(msgpack.packb([rid, "chunk", chunk])))
            await q.send(encode_frame(msgpack.packb([rid, "ok", meta])))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            log.info("node %d: backup client went away", self.node.id)

    async def _dispatch(self, op: Any, args: list[Any]) -> Any:
        store, node = self.store, self.node
        # Key-value operations (compatible with the first client of this port).
        if op == "put":
            await store.update(text_arg(args[0], "key"), bytes_arg(args[1], "value"))
            return True
        if op == "cas":
            key = text_arg(args[0], "key")
            expected = None if args[1] is None else bytes_arg(args[1], "expected")
            new = bytes_arg(args[2], "value")
            if expected is None:
                compare = Compare(key, CompareTarget.CREATE, "=", 0)
            else:
                compare = Compare(key, CompareTarget.VALUE, "=", expected)
            return (await store.txn([compare], [TxnOp(key, new)], [])).succeeded
        if op == "delete":
            try:
                await store.delete(text_arg(args[0], "key"))
            except KeyNotFound:
                return False
            return True
        if op == "get":
            linearizable = len(args) < 2 or bool(args[1])
            kv = await store.get(text_arg(args[0], "key"), linearizable=linearizable)
            return None if kv is None else kv.value
        # The store's own operations.
        if op == "create":
            return kv_wire(
                await store.create(text_arg(args[0], "key"), bytes_arg(args[1], "value"))
            )
        if op == "update":
            guard = None if len(args) < 3 or args[2] is None else nonneg_arg(args[2], "revision")
            kv = await store.update(
                text_arg(args[0], "key"), bytes_arg(args[1], "value"), expected_mod_revision=guard
            )
            return kv_wire(kv)
        if op == "kv":
            kv = await store.get(
                text_arg(args[0], "key"),
                revision=nonneg_arg(args[1], "revision"),
                linearizable=bool(args[2]),
            )
            return kv_wire(kv)
        if op == "range":
            prefix = args[0]
            if not isinstance(prefix, str):
                raise BadRequest("prefix must be a string")
            token = args[2]
            if token is not None and not isinstance(token, str):
                raise BadRequest("continue token must be a string")
            res = await store.list(
                prefix,
                limit=nonneg_arg(args[1], "limit"),
                continue_token=token,
                revision=nonneg_arg(args[3], "revision"),
                linearizable=bool(args[4]),
            )
            return [
                [kv_wire(kv) for kv in res.kvs],
                res.revision,
                res.continue_token,
                res.remaining,
            ]
        if op == "compact":
            await store.compact(positive_arg(args[0], "revision"))
            return True
        if op == "revision":
            return await store.current_revision(linearizable=bool(args[0]) if args else True)
        if op == "join":
            token, nid, addr = (
                args[0],
                positive_arg(args[1], "node id"),
                text_arg(args[2], "address"),
            )
            if (
                not self.token
                or not isinstance(token, str)
                or not hmac.compare_digest(token.encode(), self.token.encode())
            ):
                raise BadRequest("join refused: wrong token")
            try:
                parse_addr(addr)
            except ValueError as exc:
                raise BadRequest(str(exc)) from exc
            if nid in node.conf().members():
                return True  # already a member (a retried join)
            await node.change_membership(add_learner_change(nid, addr, auto_promote=True))
            return True
        if op == "faults":
            return self._faults(args)
        if op == "status":
            st = node.status().to_wire()
            ss = await store.status()
            st.update(
                revision=ss.revision,
                compact_revision=ss.compact_revision,
                db_bytes=ss.db_bytes,
                wal_bytes=ss.wal_bytes,
                keys=ss.keys,
                raft_db_bytes=st["db_bytes"],
                quota_bytes=ss.quota_bytes,
            )
            return st
        if op == "add_learner":
            addr = text_arg(args[1], "address")
            try:
                parse_addr(addr)
            except ValueError as exc:
                raise BadRequest(str(exc)) from exc
            await node.change_membership(add_learner_change(positive_arg(args[0], "node id"), addr))
            return True
        if op == "promote":
            nid = positive_arg(args[0], "node id")
            if nid not in node.conf().learners:
                raise BadRequest(f"node {nid} is not a learner: add it with add_learner first")
            await node.change_membership(promote_change(nid))
            return True
        if op == "remove":
            await node.change_membership(remove_change(positive_arg(args[0], "node id")))
            return True
        if op == "transfer":
            await node.transfer_leadership(positive_arg(args[0], "node id"))
            return True
        raise BadRequest(f"unknown op {op!r}")
