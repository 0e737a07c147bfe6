"""A thin TLS stream for trio (`TLSStream`), and how to read the errors of a TLS connection.

Job: the TLS layer of the peer port (`raft.transport`) and of the store's client port
(`store.service`, `store.client`). It replaces `trio.SSLStream` there because that one was a
fifth of the leader's Python time at 64 puts in flight: it returns one TLS record (<= 16 KiB)
per `receive_some` and yields to the scheduler once per record, and each `send_all` takes a
FIFO lock with a yield of its own before its transport send.

Theory of operation: an `ssl.SSLObject` over two `ssl.MemoryBIO`s (incoming, outgoing), as
trio's. `receive_some` decrypts everything already received (every complete record, up to
`max_bytes`) in one go; only when there is nothing to return does it read the socket, with one
large read (`receive_size`), and decrypt again. `send_all` encrypts the whole buffer (OpenSSL
cuts it into records) and hands the ciphertext to the socket in one `send_all`. So a read or a
write costs one socket call and one yield however many records it spans. `send_nowait` does a
write with no yield at all when the stream is idle (a lone Raft message, a lone answer): what
the kernel does not take at once waits as a backlog that the next `send_all` (even of b"") or
`flush` sends first.

Invariants and limits:
- The handshake is explicit: callers `await do_handshake()` (bounded by them) before anything
  else; `receive_some`/`send_all` before it raise RuntimeError. A handshake that fails sends
  the alert OpenSSL queued (why the peer's certificate is refused) before it raises, briefly
  and best effort, so the other side can tell a refusal from a crash.
- At most one task receives and one task sends at a time (a reader task and a writer task
  share a connection); the outgoing BIO is drained under `_send_lock`, so bytes reach the
  socket in the order OpenSSL produced them, including anything a read produces (a TLS 1.3
  KeyUpdate answer). TLS 1.3 only on our contexts, so no renegotiation: a write never needs
  a read.
- Errors as trio's: any TLS error (an alert, a bad record, TCP EOF without close_notify) marks
  the stream broken and raises `trio.BrokenResourceError` from the `ssl.SSLError`; a clean
  close_notify reads as EOF (b""). `tls_alert` / `tls_reason` read such a cause chain.
- Memory: the incoming BIO holds at most one `receive_size` read beyond what a caller's
  `max_bytes` left undecrypted; the outgoing BIO is emptied by every send.
- `aclose` sends close_notify when no send is in progress (best effort) and closes the socket
  whatever happens, also when cancelled.
"""

from __future__ import annotations

import contextlib
import os
import ssl
from typing import Any

import trio

__all__ = ["TLSStream", "tls_alert", "tls_reason"]

RECEIVE_SIZE = 256 * 1024  # bytes per socket read: many records decrypted per yield
ALERT_SEND_TIMEOUT = 1.0  # the alert of a failed handshake is a courtesy: never wait long

_CONN_ERRORS = (OSError, trio.BrokenResourceError, trio.ClosedResourceError)


class TLSStream(trio.abc.Stream):
    """TLS over a trio stream (module doc). `transport_stream` is the stream below."""

    def __init__(
        self,
        transport_stream: trio.abc.Stream,
        context: ssl.SSLContext,
        *,
        server_side: bool,
        receive_size: int = RECEIVE_SIZE,
    ) -> None:
        self.transport_stream = transport_stream
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        # No server_hostname: peers are identified by their certificates, not their addresses.
        self._ssl = context.wrap_bio(self._incoming, self._outgoing, server_side=server_side)
        self._receive_size = receive_size
        self._send_lock = trio.StrictFIFOLock()
        self._backlog = b""  # ciphertext a `send_nowait` could not hand to the kernel at once
        self._handshook = False
        self._broken = False
        self._closed = False

    # ------------------------------------------------------------------ public API

    def peer_certificate(self) -> bytes | None:
        """The peer's certificate (DER) as the handshake verified it; None if it sent none."""
        return self._ssl.getpeercert(binary_form=True)

    def peer_certificate_fields(self) -> dict[str, Any] | None:
        """The same certificate decoded as `ssl.SSLObject.getpeercert()` does (subject...)."""
        cert = self._ssl.getpeercert()
        return dict(cert) if cert else None

    def cipher(self) -> tuple[str, str, int] | None:
        return self._ssl.cipher()

    def version(self) -> str | None:
        return self._ssl.version()

    async def do_handshake(self) -> None:
        """Complete the handshake (callers bound it); BrokenResourceError if it fails."""
        self._check_open()
        while True:
            try:
                self._ssl.do_handshake()
            except ssl.SSLWantReadError:
                await self._flush()
                await self._fill()
                continue
            except ssl.SSLError as exc:
                self._broken = True
                await self._send_alert()
                raise trio.BrokenResourceError(f"TLS handshake failed: {exc}") from exc
            break
        await self._flush()  # our last flight (and, from a server, its session tickets)
        self._handshook = True

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """Everything decryptable now, up to max_bytes; b"" at a clean end of TLS."""
        self._check_ready()
        limit = self._receive_size if max_bytes is None else max_bytes
        if limit < 1:
            raise ValueError("max_bytes must be >= 1")
        filled = False
        while True:
            data = self._decrypt(limit)
            if self._outgoing.pending:  # a read can produce output (a KeyUpdate answer)
                await self._flush()
            if data is not None:
                if not filled:  # served from what was buffered: still a checkpoint
                    await trio.lowlevel.checkpoint()
                return data
            await self._fill()
            filled = True

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self._check_ready()
        if not data:
            if self._backlog:
                await self._flush()
            else:
                await trio.lowlevel.checkpoint()
            return
        try:
            self._ssl.write(data)
        except ssl.SSLError as exc:
            self._broken = True
            raise trio.BrokenResourceError(f"TLS write failed: {exc}") from exc
        await self._flush()

    def send_nowait(self, data: bytes) -> bool:
        """Encrypt `data` and hand the ciphertext to the kernel now, without yielding: for a
        caller that would otherwise wake a writer task only for this (a task switch, and
        trio's send yields once more after a send that succeeded at once).

        Only when nothing else is being or waiting to be sent, and over a socket; returns
        False, having sent nothing, otherwise. True: all of it is either in the kernel or, if
        the kernel took only part, held here (`backlogged`), to go first with the next
        `send_all` or `flush` (the caller must make sure one follows). A socket error marks
        the stream broken and raises BrokenResourceError, as `send_all` would."""
        sock = self.transport_stream
        if (
            not isinstance(sock, trio.SocketStream)
            or self._send_lock.locked()
            or self._backlog
            or self._outgoing.pending
            or not self._handshook
            or self._broken
            or self._closed
            or not data
        ):
            return False
        try:
            self._ssl.write(data)
        except ssl.SSLError as exc:
            self._broken = True
            raise trio.BrokenResourceError(f"TLS write failed: {exc}") from exc
        ciphertext = self._outgoing.read()
        try:
            sent = os.write(sock.socket.fileno(), ciphertext)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            self._broken = True
            raise trio.BrokenResourceError(f"socket send failed: {exc}") from exc
        if sent < len(ciphertext):
            self._backlog = ciphertext[sent:]
        return True

    @property
    def backlogged(self) -> bool:
        """Ciphertext of a `send_nowait` is waiting for `flush` (or the next `send_all`)."""
        return bool(self._backlog)

    async def flush(self) -> None:
        """Send whatever is waiting to be sent (a `send_nowait`'s backlog)."""
        self._check_ready()
        await self._flush()

    async def wait_send_all_might_not_block(self) -> None:
        await self.transport_stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        try:
            if (
                self._handshook
                and not self._broken
                and not self._send_lock.locked()
                and not self._backlog
            ):
                with contextlib.suppress(ssl.SSLError):
                    self._ssl.unwrap()  # queues close_notify; the peer's is not awaited
                if self._outgoing.pending:
                    with contextlib.suppress(*_CONN_ERRORS):
                        await self.transport_stream.send_all(self._outgoing.read())
        finally:
            await self.transport_stream.aclose()

    # ------------------------------------------------------------------ internals

    def _check_open(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("this TLS stream was closed")
        if self._broken:
            raise trio.BrokenResourceError("this TLS stream is broken")

    def _check_ready(self) -> None:
        self._check_open()
        if not self._handshook:
            raise RuntimeError("TLSStream: call do_handshake() first")

    def _decrypt(self, limit: int) -> bytes | None:
        """What the incoming BIO decrypts to, up to limit bytes: None if nothing yet, b"" at
        a clean end (close_notify). Raises BrokenResourceError on a TLS error."""
        chunks: list[bytes] = []
        size = 0
        try:
            while size < limit:
                chunk = self._ssl.read(limit - size)
                if not chunk:  # close_notify received
                    break
                chunks.append(chunk)
                size += len(chunk)
        except ssl.SSLWantReadError:
            if not chunks:
                return None
        except ssl.SSLError as exc:
            if chunks:  # deliver what came before the error; it is raised on the next read
                return b"".join(chunks)
            self._broken = True
            raise trio.BrokenResourceError(f"TLS read failed: {exc}") from exc
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _fill(self) -> None:
        """One read from the transport into the incoming BIO (EOF is recorded there)."""
        data = await self.transport_stream.receive_some(self._receive_size)
        if data:
            self._incoming.write(data)
        else:
            self._incoming.write_eof()

    async def _flush(self) -> None:
        """Send what the TLS engine has queued, in order (module doc)."""
        try:
            self._send_lock.acquire_nowait()
        except trio.WouldBlock:
            await self._send_lock.acquire()
        try:
            while self._backlog or self._outgoing.pending:
                if self._backlog:
                    data, self._backlog = self._backlog, b""
                else:
                    data = self._outgoing.read()
                try:
                    await self.transport_stream.send_all(data)
                except BaseException:
                    self._broken = True  # some unknown part of the ciphertext went out
                    raise
        finally:
            self._send_lock.release()

    async def _send_alert(self) -> None:
        """What a failed handshake left in the outgoing BIO: the alert saying why."""
        if not self._outgoing.pending:
            return
        with trio.move_on_after(ALERT_SEND_TIMEOUT), contextlib.suppress(*_CONN_ERRORS):
            await self.transport_stream.send_all(self._outgoing.read())


def tls_alert(exc: BaseException) -> str | None:
    """The reason of a TLS error in exc's cause chain (an alert from the other side, a failed
    verification), or None when the connection just broke (reset, EOF: the peer is gone)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLError):
            if isinstance(seen, ssl.SSLEOFError | ssl.SSLZeroReturnError):
                return None
            return str(seen.reason or seen)
        seen = seen.__cause__ or seen.__context__
    return None


def tls_reason(exc: BaseException) -> str:
    """The most telling message in an exception's cause chain (an SSLError's, if any)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLError):
            return str(seen.reason or seen)
        seen = seen.__cause__ or seen.__context__
    return str(exc) or type(exc).__name__
