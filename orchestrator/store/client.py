"""Client for the Raft servers' client port (see `service`): finds the leader and retries.

    async with StoreClient(["127.0.0.1:7101", ...]) as kv:
        await kv.put("k", b"v")
        value = await kv.get("k")

Many requests may be in flight at once on one connection per server; the requests made while a
write to it is under way go out together in the next one (a writer task per connection).
Invariants: a write is only retried automatically when it certainly did not take effect (refused
by a non-leader, reported lost, or never sent); if the connection breaks after a write was sent,
`Indeterminate` is raised, because the write may or may not have been committed. Callers own
timeouts (`trio.fail_after`).

TLS: servers require mutual TLS on the client port (`security.peercerts`). Give `tls`, either
an `ssl.SSLContext` or a `ClientTLS` (paths of the cluster CA and a client certificate: an
admin's, `ClientTLS.from_data_dir`, or a server's peer certificate). The server's certificate
is verified against the CA and must be a server certificate (O system:orchestrator:servers);
host names are not checked (servers are identified by certificate, not address). A server
that refuses our certificate makes the request fail at once with `TLSRefused` (nothing was
applied), not retry: that is a configuration error, not an outage (also when the refusal
arrives before the request went out). Without `tls` the client speaks plain TCP (in-process
tests, whose servers run without TLS). The TLS layer is `raft.tlsstream.TLSStream`.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import trio

from orchestrator.raft.framing import FrameDecoder, encode_frame
from orchestrator.raft.node import parse_addr
from orchestrator.raft.tlsstream import TLSStream, tls_alert
from orchestrator.store.types import (
    Compacted,
    Conflict,
    Event,
    EventType,
    FutureRevision,
    InvalidRequest,
    KeyExists,
    KeyNotFound,
    KeyValue,
    NoQuorum,
    QuotaExceeded,
    StoreError,
    TooLarge,
    Unavailable,
)

READ_OPS = frozenset({"get", "status", "kv", "range", "revision"})


class ClientError(Exception):
    pass


class Indeterminate(ClientError):
    """The connection broke after the request was sent: it may or may not have taken effect."""


class TLSRefused(ClientError):
    """A TLS handshake failed or the server refused our certificate (or we refused its):
    nothing was applied; retrying with the same credentials will not help."""


SERVERS_GROUP = "system:orchestrator:servers"  # as `security.peercerts.SERVERS_GROUP`


@dataclass(frozen=True)
class ClientTLS:
    """Where a client's TLS credentials are: the cluster CA and a client certificate/key."""

    ca: Path
    cert: Path
    key: Path

    @classmethod
    def from_data_dir(cls, data_dir: str | os.PathLike[str]) -> ClientTLS:
        """A server's admin client certificate (`DATA_DIR/pki/admin.crt`, written at start)."""
        pki = Path(data_dir) / "pki"
        return cls(pki / "ca.crt", pki / "admin.crt", pki / "admin.key")

    def context(self) -> ssl.SSLContext:
        """The client context (blocking file I/O); OSError/ssl.SSLError if a file is bad."""
        return client_context(self.ca.read_bytes(), str(self.cert), str(self.key))


def client_context(ca_pem: bytes, certfile: str, keyfile: str) -> ssl.SSLContext:
    """TLS 1.3, the server verified against `ca_pem` (not its host name), our certificate."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=ca_pem.decode("ascii"))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False  # servers are identified by certificate, not address
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_cert_chain(certfile=certfile, keyfile=keyfile)
    return ctx


def _is_server_cert(cert: dict[str, Any] | None) -> bool:
    """Whether a verified peer certificate (`getpeercert()` form) is a server's."""
    for rdn in (cert or {}).get("subject", ()):
        for name, value in rdn:
            if name == "organizationName" and value == SERVERS_GROUP:
                return True
    return False


_STORE_ERRORS: dict[str, type[StoreError]] = {
    cls.code: cls
    for cls in (
        KeyExists,
        KeyNotFound,
        Conflict,
        Compacted,
        FutureRevision,
        TooLarge,
        InvalidRequest,
        QuotaExceeded,
        NoQuorum,
        Unavailable,
    )
}


def _store_error(status: str, value: Any) -> StoreError | None:
    """The StoreError a store error answer stands for (None if it is not one)."""
    cls = _STORE_ERRORS.get(status)
    if cls is None:
        return None
    message, extra = value if isinstance(value, list) and len(value) == 2 else (str(value), None)
    if cls is Conflict:
        return Conflict(message, _kv(extra))
    if cls is Compacted:
        return Compacted(message, int(extra or 0))
    return cls(message)


class RequestFailed(ClientError):
    def __init__(self, status: str, detail: Any) -> None:
        super().__init__(f"{status}: {detail}")
        self.status = status
        self.detail = detail


def _kv(w: Any) -> KeyValue | None:
    return None if w is None else KeyValue(w[0], bytes(w[1]), w[2], w[3], w[4])


def _event(w: Any) -> Event:
    kv = _kv(w[1])
    assert kv is not None
    return Event(EventType(w[0]), kv, _kv(w[2]))


_NOT_SENT = object()  # the answer to a queued request whose frame was never sent


class _Conn:
    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.refused = ""  # why the server refused us (TLS alert or refusal answer), if it did
        self.pending: dict[int, tuple[trio.Event, list[Any]]] = {}
        self.streams: dict[int, trio.MemorySendChannel[tuple[str, Any]]] = {}  # watches
        self.closed = False
        self.send_lock = trio.Lock()
        # Requests queued by `send` and not yet handed to the socket, with their request ids.
        self.outbox: list[tuple[int, bytes]] = []
        self.outbox_ready = trio.Event()

    def send(self, rid: int, frame: bytes) -> None:
        """Queue a request's frame (its id registered in `pending`) for `writer`, which sends
        everything queued at once: many tasks woken by one batch of answers make one write
        instead of one each (fewer syscalls here, and the server reads their requests together,
        so it proposes them as one batch). Raises OSError if the connection is closed (nothing
        was sent). A frame whose caller gave up (no longer pending) before it went out is not
        sent; one that never goes out (the connection closed first) is answered `_NOT_SENT`."""
        if self.closed:
            raise OSError("connection closed")
        self.outbox.append((rid, frame))
        self.outbox_ready.set()

    async def writer(self) -> None:
        """Send the queued frames until the connection breaks; then close it, so the reader
        ends and every request in flight learns that it was lost."""
        try:
            while True:
                await self.outbox_ready.wait()
                if self.closed:
                    return
                self.outbox_ready = trio.Event()
                batch, self.outbox = self.outbox, []
                data = b"".join(f for r, f in batch if r in self.pending)
                if data:
                    async with self.send_lock:  # watches and backups send with it too
                        await self.stream.send_all(data)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.closed = True
            self._fail_unsent()
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(self.stream)

    def _fail_unsent(self) -> None:
        """Answer the requests still queued (their frames were not sent) with `_NOT_SENT`."""
        unsent, self.outbox = self.outbox, []
        for rid, _ in unsent:
            slot = self.pending.pop(rid, None)
            if slot is not None:
                slot[1].append(_NOT_SENT)
                slot[0].set()

    async def reader(self) -> None:
        decoder = FrameDecoder(64 << 20)
        try:
            while True:
                data = await self.stream.receive_some(65536)
                if not data:
                    break
                for frame in decoder.receive_data(data):
                    rid, status, value = msgpack.unpackb(frame, strict_map_key=False)
                    if rid is None and status == "refused":  # the server's last word
                        self.refused = str(value)
                        continue
                    stream = self.streams.get(rid)
                    if stream is not None:
                        try:
                            stream.send_nowait((status, value))
                        except (trio.WouldBlock, trio.BrokenResourceError):
                            self.streams.pop(rid).close()  # consumer gone or far behind
                        continue
                    slot = self.pending.pop(rid, None)
                    if slot is not None:
                        slot[1].extend((status, value))
                        slot[0].set()
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, ValueError) as exc:
            alert = tls_alert(exc)
            if alert is not None:
                self.refused = alert
        finally:
            self.closed = True
            self._fail_unsent()  # queued but never sent: safe to retry
            self.outbox_ready.set()  # the writer stops
            for ev, _ in self.pending.values():
                ev.set()  # empty result list = connection lost
            self.pending.clear()
            for ch in self.streams.values():
                ch.close()  # end of stream without "canceled" = connection lost
            self.streams.clear()
            await trio.aclose_forcefully(self.stream)


class StoreClient:
    def __init__(
        self,
        endpoints: list[str],
        *,
        retry_delay: float = 0.05,
        tls: ssl.SSLContext | ClientTLS | None = None,
    ) -> None:
        if not endpoints:
            raise ValueError("at least one endpoint is needed")
        self.endpoints = list(endpoints)
        # Built once here (blocking file I/O, at start): every connection shares the context.
        self.tls = tls.context() if isinstance(tls, ClientTLS) else tls
        self.retry_delay = retry_delay
        self._conns: dict[str, _Conn] = {}
        self._ids: dict[int, str] = {}  # node id -> client endpoint, learned from status
        self._current = 0
        self._rid = itertools.count(1)
        self._nursery: trio.Nursery | None = None
        self._connect_lock = trio.Lock()

    async def __aenter__(self) -> StoreClient:
        self._cm = trio.open_nursery()
        self._nursery = await self._cm.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> bool | None:
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()
        try:
            return await self._cm.__aexit__(*exc)  # type: ignore[arg-type]  # passes through
        except BaseExceptionGroup as group:
            # The caller's own error (TLSRefused, Indeterminate, ...) comes out as itself, not
            # wrapped in the group of our connection tasks' nursery, which only cancelled.
            error = exc[1]
            if isinstance(error, BaseException) and group.exceptions == (error,):
                raise error from None
            raise

    # ------------------------------------------------------------------ operations
    async def put(self, key: str, value: bytes) -> bool:
        return bool(await self.call("put", key, value))

    async def get(self, key: str, *, linearizable: bool = True) -> bytes | None:
        v = await self.call("get", key, linearizable)
        return None if v is None else bytes(v)

    async def cas(self, key: str, expected: bytes | None, value: bytes) -> bool:
        return bool(await self.call("cas", key, expected, value))

    async def delete(self, key: str) -> bool:
        return bool(await self.call("delete", key))

    async def create(self, key: str, value: bytes) -> KeyValue:
        kv = _kv(await self.call("create", key, value))
        assert kv is not None
        return kv

    async def update(
        self, key: str, value: bytes, expected_mod_revision: int | None = None
    ) -> KeyValue:
        kv = _kv(await self.call("update", key, value, expected_mod_revision))
        assert kv is not None
        return kv

    async def get_kv(
        self, key: str, *, revision: int = 0, linearizable: bool = True
    ) -> KeyValue | None:
        return _kv(await self.call("kv", key, revision, linearizable))

    async def range(
        self,
        prefix: str,
        *,
        limit: int = 0,
        continue_token: str | None = None,
        revision: int = 0,
        linearizable: bool = True,
    ) -> tuple[list[KeyValue], int, str | None]:
        kvs, rev, token, _ = await self.call(
            "range", prefix, limit, continue_token, revision, linearizable
        )
        return [k for k in map(_kv, kvs) if k is not None], rev, token

    async def revision(self, *, linearizable: bool = True) -> int:
        return int(await self.call("revision", linearizable))

    async def compact(self, revision: int) -> None:
        await self.call("compact", revision)

    async def watch(
        self, prefix: str, start_revision: int = 0
    ) -> AsyncIterator[tuple[list[Event], int]]:
        """Yield (events, revision) batches from `start_revision` (0 = from now) forever,
        resuming on another server if the connection breaks; every event exactly once, in
        order. Raises Compacted if the history needed was compacted (re-list, then watch)."""
        if start_revision == 0:
            start_revision = await self.revision() + 1
        next_rev = start_revision
        while True:
            endpoint = self.endpoints[self._current % len(self.endpoints)]
            try:
                conn = await self._conn(endpoint)
            except OSError:
                self._current += 1
                await trio.sleep(self.retry_delay)
                continue
            rid = next(self._rid)
            send, recv = trio.open_memory_channel[tuple[str, Any]](10_000)
            conn.streams[rid] = send
            try:
                async with conn.send_lock:
                    await conn.stream.send_all(
                        encode_frame(msgpack.packb([rid, "watch", [prefix, next_rev, False]]))
                    )
                async for status, value in recv:
                    if status == "watch":
                        events = [_event(e) for e in value[0]]
                        # The response brings us up to its revision, events or not.
                        next_rev = max(next_rev, value[1] + 1)
                        yield events, value[1]
                    elif status == "canceled" and value[0] and "compact" in value[0]:
                        raise Compacted(value[0], value[1])
                    else:
                        break  # canceled for another reason: resume
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            finally:
                conn.streams.pop(rid, None)
            self._current += 1  # connection lost or watch ended: resume elsewhere
            await trio.sleep(self.retry_delay)

    async def backup(self) -> tuple[dict[str, Any], bytes]:
        """A consistent image of the store (see the service's "backup" op): (metadata, SQLite
        image), checked against the size and SHA-256 the server sent. Holds every write
        acknowledged before the call. Tries the servers in turn until one answers; bound it
        with `trio.fail_after`."""
        attempts = 0
        while True:
            endpoint = self.endpoints[self._current % len(self.endpoints)]
            try:
                return await self._backup_once(endpoint)
            except (OSError, Indeterminate, NoQuorum, Unavailable):
                self._current += 1  # unreachable, went away, or no quorum there: another one
            except RequestFailed as exc:
                if exc.status not in ("unavailable", "timeout", "not_leader"):
                    raise
                self._current += 1
            attempts += 1
            await trio.sleep(min(self.retry_delay * math.pow(1.5, min(attempts, 10)), 1.0))

    async def _backup_once(self, endpoint: str) -> tuple[dict[str, Any], bytes]:
        conn = await self._conn(endpoint)
        rid = next(self._rid)
        # Unbounded: the reader task must never drop a chunk (the image is in memory anyway).
        send, recv = trio.open_memory_channel[tuple[str, Any]](math.inf)
        conn.streams[rid] = send
        chunks: list[bytes] = []
        try:
            try:
                async with conn.send_lock:
                    await conn.stream.send_all(encode_frame(msgpack.packb([rid, "backup", []])))
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise OSError(f"connection to {endpoint} broke") from exc
            async with recv:
                async for status, value in recv:
                    if status == "chunk":
                        chunks.append(bytes(value))
                        continue
                    if status != "ok":
                        raise _store_error(status, value) or RequestFailed(status, value)
                    meta = dict(value)
                    image = b"".join(chunks)
                    if len(image) != meta.get("image_bytes") or (
                        hashlib.sha256(image).hexdigest() != meta.get("image_sha256")
                    ):
                        raise Indeterminate(f"backup from {endpoint} arrived damaged")
                    return meta, image
        finally:
            conn.streams.pop(rid, None)
        raise Indeterminate(f"connection to {endpoint} lost during the backup")

    async def status(self, endpoint: str) -> dict[str, Any]:
        st = await self.call_once(endpoint, "status")
        return dict(st)

    # ------------------------------------------------------------------ plumbing
    async def call(self, op: str, *args: Any) -> Any:
        """Send to the leader (following redirects), retrying while that is safe."""
        attempts = 0
        while True:
            endpoint = self.endpoints[self._current % len(self.endpoints)]
            try:
                return await self.call_once(endpoint, op, *args)
            except RequestFailed as exc:
                if exc.status == "not_leader":
                    await self._follow(exc.detail)
                elif exc.status in ("unavailable", "lost"):
                    pass  # certainly not applied: safe to retry
                elif exc.status == "timeout" and op in READ_OPS:
                    self._current += 1  # maybe this server lost quorum; try another
                elif exc.status == "timeout":
                    self._current += 1  # that server may be cut off: next time, another
                    raise Indeterminate(str(exc.detail)) from exc
                else:
                    raise
            except (NoQuorum, Unavailable) as exc:
                self._current += 1  # maybe this server lost quorum; try another
                if op not in READ_OPS and isinstance(exc, NoQuorum):
                    raise Indeterminate(str(exc)) from exc
            except OSError:
                self._current += 1  # could not connect: nothing was sent
            except Indeterminate:
                if op not in READ_OPS:
                    raise
                self._current += 1
            attempts += 1
            await trio.sleep(min(self.retry_delay * math.pow(1.5, min(attempts, 10)), 1.0))

    async def _follow(self, detail: Any) -> None:
        leader = detail[0] if detail else 0
        if leader and leader not in self._ids:
            for ep in self.endpoints:
                try:
                    st = await self.call_once(ep, "status")
                    self._ids[int(st["id"])] = ep
                except (OSError, ClientError):
                    continue
        if leader in self._ids:
            self._current = self.endpoints.index(self._ids[leader])
        else:
            self._current += 1

    async def _conn(self, endpoint: str) -> _Conn:
        conn = self._conns.get(endpoint)
        if conn is not None and not conn.closed:
            # No lock (a yield each): the tasks woken together queue their requests together.
            return conn
        async with self._connect_lock:
            conn = self._conns.get(endpoint)
            if conn is None or conn.closed:
                host, port = parse_addr(endpoint)
                stream = await self._connect(endpoint, host, port)
                conn = self._conns[endpoint] = _Conn(stream)
                assert self._nursery is not None
                self._nursery.start_soon(conn.reader)
                self._nursery.start_soon(conn.writer)
            return conn

    async def _connect(self, endpoint: str, host: str, port: int) -> trio.abc.Stream:
        """A connection to a server, over TLS when configured (module doc)."""
        sock = await trio.open_tcp_stream(host, port)
        if self.tls is None:
            return sock
        stream = TLSStream(sock, self.tls, server_side=False)
        try:
            await stream.do_handshake()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            await trio.aclose_forcefully(stream)
            alert = tls_alert(exc)
            if alert is None:
                raise OSError(f"connection to {endpoint} lost during the TLS handshake") from exc
            raise TLSRefused(f"{endpoint}: TLS handshake failed: {alert}") from None
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        if not _is_server_cert(stream.peer_certificate_fields()):
            await trio.aclose_forcefully(stream)
            raise TLSRefused(f"{endpoint} is not an orchestrator server (not a server certificate)")
        return stream

    async def call_once(self, endpoint: str, op: str, *args: Any) -> Any:
        """One request to one server; raises RequestFailed for a non-"ok" answer."""
        conn = await self._conn(endpoint)
        rid = next(self._rid)
        ev = trio.Event()
        result: list[Any] = []
        conn.pending[rid] = (ev, result)
        try:
            try:
                conn.send(rid, encode_frame(msgpack.packb([rid, op, list(args)])))
            except OSError:
                # Closed before our frame was queued: nothing of ours was sent.
                raise OSError(f"connection to {endpoint} closed") from None
            await ev.wait()
        finally:
            conn.pending.pop(rid, None)
        if conn.refused and (not result or result[0] is _NOT_SENT):
            # Never served: the server did not accept us (the refusal may even have arrived
            # before our frame went out: not retried either, the same credentials won't do).
            raise TLSRefused(f"{endpoint} refused this client: {conn.refused}")
        if result and result[0] is _NOT_SENT:
            raise OSError(f"connection to {endpoint} closed before {op} was sent")
        if not result:
            raise Indeterminate(f"connection to {endpoint} lost after sending {op}")
        status, value = result
        if status != "ok":
            raise _store_error(status, value) or RequestFailed(status, value)
        return value
