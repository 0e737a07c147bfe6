"""The client port of a Raft server: framed msgpack requests against the replicated KV store.

This is the interface the tests, the benchmark and the `orchestrator kv|member|status` commands
use until the Kubernetes API server (a later layer) takes over. Wire format, one frame each
(see `framing`):

    request:  [request_id, op, [args...]]
    response: [request_id, status, value]

status is "ok" (value = result), "not_leader" (value = [leader_id, leader_peer_addr] or nil),
"lost" (the write was not committed), "unavailable" (value = reason; e.g. no leader yet),
"timeout" (no quorum answered within the request timeout: a write's outcome is unknown),
or "error" (value = message for a bad request). Requests on one connection are served
concurrently and answered in completion order.

Invariants: a bad frame or an unknown op is answered with "error" (or, for an unreadable frame,
the connection is closed) and changes nothing; "ok" for a write means it is committed and
applied on this server.
"""

from __future__ import annotations

import logging
from contextlib import suppress
from typing import Any

import msgpack
import trio

from .framing import FrameDecoder, FramingError, encode_frame
from .kv import KVStateMachine, encode_cas, encode_delete, encode_put
from .node import (
    Busy,
    InvalidRequest,
    NotLeader,
    OutcomeUnknown,
    ProposalLost,
    RaftNode,
    ReadAborted,
    add_learner_change,
    parse_addr,
    promote_change,
    remove_change,
)

log = logging.getLogger("orchestrator.raft.service")

MAX_CLIENT_FRAME = 4 << 20
MAX_IN_FLIGHT_PER_CONN = 1024


class BadRequest(ValueError):
    pass


def _str(v: Any, what: str) -> str:
    if not isinstance(v, str) or not v:
        raise BadRequest(f"{what} must be a non-empty string")
    return v


def _bytes(v: Any, what: str) -> bytes:
    if not isinstance(v, bytes):
        raise BadRequest(f"{what} must be bytes")
    return v


def _int(v: Any, what: str) -> int:
    if type(v) is not int or v < 1:
        raise BadRequest(f"{what} must be a positive integer")
    return v


class ClientService:
    def __init__(self, node: RaftNode, listen: str, *, request_timeout: float = 5.0) -> None:
        self.request_timeout = request_timeout  # bounds a request when there is no quorum
        self.node = node
        self.listen = listen
        self.port = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        host, port = parse_addr(self.listen)
        listeners = await trio.open_tcp_listeners(port, host=host)
        self.port = listeners[0].socket.getsockname()[1]
        log.info("node %d serving clients on %s:%d", self.node.id, host, self.port)
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._serve, listeners)
            task_status.started()

    async def _serve(self, stream: trio.SocketStream) -> None:
        decoder = FrameDecoder(MAX_CLIENT_FRAME)
        # Each request task holds a clone of the send side; the writer stops once the reader
        # and every request task have closed theirs, so no answer is cut off.
        send_q, recv_q = trio.open_memory_channel[bytes](MAX_IN_FLIGHT_PER_CONN)
        limiter = trio.CapacityLimiter(MAX_IN_FLIGHT_PER_CONN)
        try:
            async with stream, trio.open_nursery() as nursery:
                nursery.start_soon(self._writer, stream, recv_q)
                async with send_q:
                    while True:
                        data = await stream.receive_some(65536)
                        if not data:
                            break
                        for frame in decoder.receive_data(data):
                            await limiter.acquire_on_behalf_of(frame)
                            nursery.start_soon(self._handle, frame, send_q.clone(), limiter)
        except* (OSError, trio.BrokenResourceError, trio.ClosedResourceError, FramingError) as eg:
            log.debug("client connection closed: %s", eg.exceptions[0])
        except* Exception:
            # A bug in serving one connection must not take the server down.
            log.exception("error while serving a client connection")

    async def _writer(self, stream: trio.SocketStream, q: trio.MemoryReceiveChannel[bytes]) -> None:
        async with q:
            async for frame in q:
                batch = [frame]
                while True:
                    try:
                        batch.append(q.receive_nowait())
                    except trio.WouldBlock:
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
                with trio.fail_after(self.request_timeout):
                    status, value = "ok", await self._dispatch(op, args)
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

    async def _dispatch(self, op: Any, args: list[Any]) -> Any:
        node = self.node
        if op == "put":
            return await node.propose(encode_put(_str(args[0], "key"), _bytes(args[1], "value")))
        if op == "cas":
            expected = None if args[1] is None else _bytes(args[1], "expected")
            return await node.propose(
                encode_cas(_str(args[0], "key"), expected, _bytes(args[2], "value"))
            )
        if op == "delete":
            return await node.propose(encode_delete(_str(args[0], "key")))
        if op == "get":
            key = _str(args[0], "key")
            if len(args) < 2 or args[1]:  # linearizable unless the caller accepts stale reads
                await node.read_barrier()
            sm = node.sm
            assert isinstance(sm, KVStateMachine)
            return await node.read_state_machine(sm.get, key)
        if op == "status":
            return node.status()
        if op == "add_learner":
            addr = _str(args[1], "address")
            try:
                parse_addr(addr)
            except ValueError as exc:
                raise BadRequest(str(exc)) from exc
            await node.change_membership(add_learner_change(_int(args[0], "node id"), addr))
            return True
        if op == "promote":
            nid = _int(args[0], "node id")
            if nid not in node.core.conf.learners:
                raise BadRequest(f"node {nid} is not a learner: add it with add_learner first")
            await node.change_membership(promote_change(nid))
            return True
        if op == "remove":
            await node.change_membership(remove_change(_int(args[0], "node id")))
            return True
        if op == "transfer":
            await node.transfer_leadership(_int(args[0], "node id"))
            return True
        raise BadRequest(f"unknown op {op!r}")
