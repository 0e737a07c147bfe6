"""Sans-IO length-prefixed framing for the Raft peer transport.

Theory of operation
-------------------
A byte stream (one TCP connection) carries a sequence of frames. Each frame is a 4-byte
big-endian unsigned length followed by exactly that many payload bytes; there is no other
delimiter, padding or checksum (TCP already gives an ordered, checksummed stream). An empty
payload is a legal frame.

This module does no I/O, in the style of h11: the caller reads bytes from wherever it likes and
hands them to `FrameDecoder.receive_data`, which returns every payload completed by those bytes
and buffers the incomplete tail for the next call. Because the decoder only sees bytes, it splits
correctly no matter how the stream was chunked by the network (a header split across reads,
many frames in one read, ...).

Invariants:
- `receive_data` never returns a partial payload and never reorders payloads.
- A header announcing more than `max_frame` bytes raises `FrameTooLarge` as soon as the 4 header
  bytes have arrived, before any of that payload is buffered, so a hostile peer cannot make us
  allocate more than about `max_frame` bytes plus one read.
- After a `FramingError` the stream is desynchronised (there is no way to find the next frame
  boundary), so the decoder stays failed: every later call raises again. Close the connection.
- Buffer management is amortised O(total bytes): consumed bytes are skipped with an offset and
  the buffer is compacted only once the consumed prefix dominates it, so many small frames do
  not cost a copy of the whole buffer each.
"""

from __future__ import annotations

import struct

__all__ = [
    "HEADER_SIZE",
    "MAX_FRAME",
    "FrameDecoder",
    "FrameTooLarge",
    "FramingError",
    "encode_frame",
]

MAX_FRAME = 64 * 1024 * 1024  # default limit on a payload: large enough for a snapshot chunk
HEADER_SIZE = 4
_HEADER = struct.Struct(">I")
_MAX_ENCODABLE = 2**32 - 1  # what a 4-byte length can express

# Compacting costs a copy of the unconsumed tail; doing it only once the consumed prefix is both
# large and at least half the buffer keeps the total copying linear in the bytes received.
_COMPACT_MIN = 64 * 1024


class FramingError(ValueError):
    """The byte stream is not a valid sequence of frames."""


class FrameTooLarge(FramingError):
    """A frame (announced or to be encoded) exceeds the size limit."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"frame of {size} bytes exceeds the limit of {limit} bytes")
        self.size = size
        self.limit = limit


def encode_frame(payload: bytes) -> bytes:
    """Return `payload` prefixed with its 4-byte big-endian length."""
    n = len(payload)
    if n > _MAX_ENCODABLE:
        raise FrameTooLarge(n, _MAX_ENCODABLE)
    return _HEADER.pack(n) + payload


class FrameDecoder:
    """Incremental decoder: feed it bytes, get back complete payloads.

    `max_frame` may be changed between calls (the transport uses a small limit for the hello
    frame and the full limit afterwards); it applies to headers parsed after the change.
    """

    __slots__ = ("_buf", "_error", "_pos", "max_frame")

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        if max_frame < 0:
            raise ValueError("max_frame must be non-negative")
        self.max_frame = max_frame
        self._buf = bytearray()
        self._pos = 0  # start of the first unconsumed byte in _buf
        self._error: FramingError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as part of a payload (a partial frame)."""
        return len(self._buf) - self._pos

    def feed(self, data: bytes | bytearray) -> None:
        """Buffer `data` without parsing; pair with `next_frame`."""
        if self._error is not None:
            raise self._error
        self._buf += data

    def next_frame(self) -> bytes | None:
        """Return the next complete payload, or None if more bytes are needed."""
        if self._error is not None:
            raise self._error
        buf, pos = self._buf, self._pos
        avail = len(buf) - pos
        if avail < HEADER_SIZE:
            self._compact()
            return None
        (n,) = _HEADER.unpack_from(buf, pos)
        if n > self.max_frame:
            self._error = FrameTooLarge(n, self.max_frame)
            # Drop what we hold: nothing after this point can be trusted or used.
            self._buf = bytearray()
            self._pos = 0
            raise self._error
        end = pos + HEADER_SIZE + n
        if end > len(buf):
            self._compact()
            return None
        # memoryview avoids copying the slice twice (bytearray slice, then bytes()); it must be
        # released before the buffer is resized, hence the context manager.
        with memoryview(buf) as view:
            payload = bytes(view[pos + HEADER_SIZE : end])
        self._pos = end
        return payload

    def receive_data(self, data: bytes | bytearray) -> list[bytes]:
        """Buffer `data` and return every payload it completes, in stream order.

        If a header in `data` announces an oversize frame, `FrameTooLarge` is raised and the
        payloads that preceded it in this call are discarded with it; a caller that still wants
        them uses `feed` and `next_frame`.
        """
        self.feed(data)
        out: list[bytes] = []
        while (payload := self.next_frame()) is not None:
            out.append(payload)
        return out

    def _compact(self) -> None:
        pos = self._pos
        if pos == 0:
            return
        if pos == len(self._buf):
            self._buf.clear()
            self._pos = 0
        elif pos >= _COMPACT_MIN and pos * 2 >= len(self._buf):
            del self._buf[:pos]
            self._pos = 0
