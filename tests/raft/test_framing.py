"""Tests for the sans-IO length-prefixed framing: round trips under arbitrary chunking, the size
limit, and the failed-decoder state."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.raft.framing import (
    HEADER_SIZE,
    MAX_FRAME,
    FrameDecoder,
    FrameTooLarge,
    FramingError,
    encode_frame,
)


def test_encode_frame_is_big_endian_length_prefix() -> None:
    assert encode_frame(b"abc") == b"\x00\x00\x00\x03abc"
    assert encode_frame(b"") == b"\x00\x00\x00\x00"
    assert len(encode_frame(b"x" * 300)) == HEADER_SIZE + 300


def test_default_limit_is_64_mib() -> None:
    assert MAX_FRAME == 64 * 1024 * 1024
    assert FrameDecoder().max_frame == MAX_FRAME


def test_several_frames_in_one_chunk() -> None:
    payloads = [b"one", b"", b"three", b"\x00" * 1000]
    decoder = FrameDecoder()
    assert decoder.receive_data(b"".join(map(encode_frame, payloads))) == payloads
    assert decoder.buffered == 0


def test_byte_at_a_time() -> None:
    payloads = [b"hello", b"", b"world"]
    stream = b"".join(map(encode_frame, payloads))
    decoder = FrameDecoder()
    out: list[bytes] = []
    for i in range(len(stream)):
        out += decoder.receive_data(stream[i : i + 1])
    assert out == payloads
    assert decoder.buffered == 0


def test_partial_frame_stays_buffered() -> None:
    decoder = FrameDecoder()
    frame = encode_frame(b"payload")
    assert decoder.receive_data(frame[:2]) == []
    assert decoder.buffered == 2
    assert decoder.receive_data(frame[2:-1]) == []
    assert decoder.receive_data(frame[-1:]) == [b"payload"]
    assert decoder.receive_data(b"") == []


def test_feed_and_next_frame() -> None:
    decoder = FrameDecoder()
    decoder.feed(encode_frame(b"a") + encode_frame(b"b") + b"\x00")
    assert decoder.next_frame() == b"a"
    assert decoder.next_frame() == b"b"
    assert decoder.next_frame() is None
    assert decoder.buffered == 1


@given(
    payloads=st.lists(st.binary(max_size=300), max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=30),
)
def test_round_trip_with_arbitrary_splits(payloads: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(encode_frame(p) for p in payloads)
    bounds = [0, *sorted(c % (len(stream) + 1) for c in cuts), len(stream)]
    decoder = FrameDecoder(max_frame=300)
    out: list[bytes] = []
    for start, end in itertools.pairwise(bounds):
        out += decoder.receive_data(stream[start:end])
    assert out == payloads
    assert decoder.buffered == 0


def test_many_small_frames_in_one_chunk_is_linear() -> None:
    # Quadratic copying would make this take minutes; linear decoding takes a fraction of a second.
    n = 50_000
    stream = b"".join(encode_frame(i.to_bytes(3, "big")) for i in range(n))
    out = FrameDecoder().receive_data(stream)
    assert len(out) == n
    assert out[-1] == (n - 1).to_bytes(3, "big")


def test_buffer_is_compacted_when_frames_trickle_in() -> None:
    # Chunks never line up with frame boundaries (777 and 1004 are coprime), so the buffer is
    # rarely empty; without compaction it would keep every byte consumed since it last was.
    stream = encode_frame(b"x" * 1000) * 2000
    decoder = FrameDecoder()
    count, largest = 0, 0
    for start in range(0, len(stream), 777):
        count += len(decoder.receive_data(stream[start : start + 777]))
        largest = max(largest, len(decoder._buf))
    assert count == 2000
    assert decoder.buffered == 0
    assert largest < 200_000


def test_frame_at_the_limit_is_accepted() -> None:
    decoder = FrameDecoder(max_frame=10)
    assert decoder.receive_data(encode_frame(b"0123456789")) == [b"0123456789"]


def test_oversize_header_raises_before_the_payload_arrives() -> None:
    decoder = FrameDecoder(max_frame=10)
    header_only = encode_frame(b"x" * 11)[:HEADER_SIZE]
    assert decoder.receive_data(header_only[:3]) == []  # not yet a complete header
    with pytest.raises(FrameTooLarge) as info:
        decoder.receive_data(header_only[3:])
    assert info.value.size == 11
    assert info.value.limit == 10
    assert isinstance(info.value, FramingError)
    assert isinstance(info.value, ValueError)


def test_oversize_after_good_frames_with_next_frame() -> None:
    decoder = FrameDecoder(max_frame=10)
    decoder.feed(encode_frame(b"ok") + b"\xff\xff\xff\xff")
    assert decoder.next_frame() == b"ok"
    with pytest.raises(FrameTooLarge):
        decoder.next_frame()


def test_decoder_stays_failed() -> None:
    decoder = FrameDecoder(max_frame=10)
    with pytest.raises(FrameTooLarge):
        decoder.receive_data(b"\xde\xad\xbe\xef")
    with pytest.raises(FrameTooLarge):
        decoder.receive_data(encode_frame(b"fine"))
    with pytest.raises(FrameTooLarge):
        decoder.next_frame()


def test_limit_can_be_raised_between_frames() -> None:
    decoder = FrameDecoder(max_frame=4)
    decoder.feed(encode_frame(b"hi") + encode_frame(b"longer payload"))
    assert decoder.next_frame() == b"hi"
    decoder.max_frame = 100
    assert decoder.next_frame() == b"longer payload"


def test_negative_limit_is_rejected() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        FrameDecoder(max_frame=-1)
