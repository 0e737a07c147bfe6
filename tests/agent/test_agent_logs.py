"""Pure CRI log handling: records, timestamps, options, partial-line joining, tail, since, limit,
and the attempt choice (kubelet's validateContainerLogStatus)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import trio

from orchestrator.agent.logfiles import (
    LogFormatter,
    LogOptions,
    LogRecord,
    choose_attempt,
    format_timestamp,
    list_attempts,
    parse_line,
    parse_timestamp,
    read_log,
    tail_start,
)
from orchestrator.kube.errors import ApiError

T0 = parse_timestamp("2026-11-30T05:58:54Z")


def rec(i: int, text: str, stream: str = "stdout", tag: str = "F") -> bytes:
    """A record `i` seconds after T0 (odd fractions, trailing zeros trimmed as containerd does)."""
    ns = T0 + i * 1_000_000_000 + 163_285_700
    ts = format_timestamp(ns)[:-1].rstrip("0") + "Z"
    return f"{ts} {stream} {tag} {text}\n".encode()


def test_parse_line() -> None:
    r = parse_line(b"2026-11-30T05:58:54.163285724Z stdout F hello world\n")
    assert r == LogRecord(T0 + 163285724, "stdout", False, b"hello world")
    assert parse_line(b"2026-11-30T05:58:54.67061822Z stderr P ").text == b""
    assert parse_line(b"2026-11-30T05:58:54Z stderr P").partial
    for bad in (b"hello", b"2026-11-30T05:58:54Z stdin F x", b"2026-11-30T05:58:54Z stdout X x"):
        with pytest.raises(ValueError, match="CRI log record"):
            parse_line(bad)
    with pytest.raises(ValueError, match="RFC 3339"):
        parse_line(b"yesterday stdout F x")


def test_timestamps() -> None:
    assert parse_timestamp("2026-11-30T05:58:54.5Z") == T0 + 500_000_000
    assert parse_timestamp("2026-11-30T07:58:54+02:00") == T0
    assert format_timestamp(T0 + 67_061_822_0) == "2026-11-30T05:58:54.670618220Z"
    assert format_timestamp(T0) == "2026-11-30T05:58:54.000000000Z"
    with pytest.raises(ValueError, match="valid time"):
        parse_timestamp("2026-13-30T05:58:54Z")


def test_options_from_query() -> None:
    now = T0 + 100 * 1_000_000_000
    o = LogOptions.from_query(
        {"tailLines": "5", "timestamps": "true", "follow": "1", "limitBytes": "10"}, now
    )
    assert (o.tail_lines, o.timestamps, o.follow, o.limit_bytes, o.previous) == (
        5,
        True,
        True,
        10,
        False,
    )
    assert LogOptions.from_query({"sinceSeconds": "10"}, now).since == now - 10_000_000_000
    assert LogOptions.from_query({"sinceTime": "2026-11-30T05:58:54Z"}, now).since == T0
    for bad, msg in (
        ({"tailLines": "-1"}, "tailLines"),
        ({"limitBytes": "0"}, "limitBytes"),
        ({"sinceSeconds": "0"}, "sinceSeconds"),
        ({"sinceSeconds": "5", "sinceTime": "2026-11-30T05:58:54Z"}, "at most one"),
        ({"sinceTime": "noon"}, "sinceTime"),
        ({"follow": "maybe"}, "follow"),
        ({"tailLines": "ten"}, "tailLines"),
    ):
        with pytest.raises(ValueError, match=msg):
            LogOptions.from_query(bad, now)


def _format(data: bytes, chunk: int = 7, **kw: Any) -> bytes:
    fmt = LogFormatter(LogOptions(**kw))
    out = b"".join(fmt.feed(data[i : i + chunk]) for i in range(0, len(data), chunk))
    return out + fmt.finish()


SAMPLE = (
    rec(0, "one")
    + rec(1, "two ", tag="P")
    + rec(1, "err", stream="stderr")
    + rec(2, "halves", tag="P")
    + rec(2, " joined")
    + b"garbage line\n"
    + rec(3, "three")
)


def test_partial_records_are_joined_per_stream() -> None:
    for chunk in (1, 7, 1000):
        assert _format(SAMPLE, chunk) == b"one\nerr\ntwo halves joined\nthree\n"


def test_timestamps_since_and_limit() -> None:
    out = _format(SAMPLE, timestamps=True)
    assert out.splitlines()[2] == b"2026-11-30T05:58:55.163285700Z two halves joined"
    # since: a joined line counts from its first record's time
    since = T0 + 1_500_000_000
    assert _format(SAMPLE, since=since) == b"three\n"
    assert _format(SAMPLE, since=T0 + 1_000_000_000) == b"err\ntwo halves joined\nthree\n"
    assert _format(SAMPLE, limit_bytes=6) == b"one\ner"
    fmt = LogFormatter(LogOptions(limit_bytes=2))
    assert fmt.feed(SAMPLE) == b"on"
    assert fmt.done
    assert fmt.feed(rec(9, "more")) == b""


def test_unterminated_last_line_waits_for_finish() -> None:
    fmt = LogFormatter(LogOptions())
    assert fmt.feed(rec(0, "a") + rec(1, "bc")[:-1]) == b"a\n"
    assert fmt.finish() == b"bc\n"  # parsed once input ends
    fmt = LogFormatter(LogOptions())
    assert fmt.feed(rec(0, "half", tag="P")) == b""
    assert fmt.finish() == b"half"  # a pending partial line is written without a newline


def _tail(data: bytes, n: int, block: int = 5) -> bytes:
    f = io.BytesIO(data)
    return _format(data[tail_start(f, n, block) :])


TAIL_SAMPLE = (
    rec(0, "one")
    + rec(1, "err", stream="stderr")
    + rec(2, "two ", tag="P")
    + rec(2, "halves", tag="P")
    + rec(2, " joined")
    + b"garbage line\n"
    + rec(3, "three")
)


@pytest.mark.parametrize("block", [1, 5, 64 * 1024])
def test_tail_counts_full_lines(block: int) -> None:
    everything = b"one\nerr\ntwo halves joined\nthree\n"
    assert _tail(TAIL_SAMPLE, 1, block) == b"three\n"
    assert _tail(TAIL_SAMPLE, 2, block) == b"two halves joined\nthree\n"
    assert _tail(TAIL_SAMPLE, 3, block) == b"err\ntwo halves joined\nthree\n"
    assert _tail(TAIL_SAMPLE, 4, block) == everything
    assert _tail(TAIL_SAMPLE, 100, block) == everything
    assert _tail(TAIL_SAMPLE, 0, block) == b""
    assert _tail(b"", 3, block) == b""
    # an unterminated line being written is after the offset but not counted
    growing = TAIL_SAMPLE + rec(4, "four")[:-1]
    assert _tail(growing, 1, block) == b"three\nfour\n"
    # A partial line interleaved with the other stream's lines may lose its head (the kubelet
    # counts raw records, which cuts more often).
    assert _tail(SAMPLE, 2, block) == b"halves joined\nthree\n"


def _pod(**status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p"}, "status": {"containerStatuses": [{"name": "c", **status}]}}


RUNNING = {"running": {"startedAt": "x"}}
TERMINATED = {"terminated": {"exitCode": 1, "containerID": "cri://2"}}


def test_choose_attempt_like_the_kubelet() -> None:
    assert choose_attempt(_pod(state=RUNNING), "c", [0, 1, 2], False) == 2
    assert choose_attempt(_pod(state=RUNNING, lastState=TERMINATED), "c", [0, 1, 2], True) == 1
    crash_loop = _pod(state={"waiting": {"reason": "CrashLoopBackOff"}}, lastState=TERMINATED)
    assert choose_attempt(crash_loop, "c", [0, 1], False) == 1
    assert choose_attempt(crash_loop, "c", [0, 1], True) == 1
    assert choose_attempt(_pod(state=TERMINATED), "c", [0], False) == 0
    # No status yet: trust the files.
    assert choose_attempt({"metadata": {"name": "p"}}, "c", [3, 4], True) == 3

    def err(pod: dict[str, Any], attempts: list[int], previous: bool) -> str:
        with pytest.raises(ApiError) as info:
            choose_attempt(pod, "c", attempts, previous)
        assert info.value.code == 400
        return info.value.message

    assert (
        err(_pod(state=RUNNING), [0], True)
        == 'previous terminated container "c" in pod "p" not found'
    )
    assert (
        err(_pod(state={"waiting": {"reason": "ContainerCreating"}}), [], False)
        == 'container "c" in pod "p" is waiting to start: ContainerCreating'
    )
    assert err(_pod(state={"waiting": {"reason": "ErrImagePull"}}), [], False).endswith(
        "image can't be pulled"
    )
    assert err({"metadata": {"name": "p"}}, [], False).endswith("ContainerCreating")


async def test_read_log_file(tmp_path: Path) -> None:
    path = tmp_path / "c" / "0.log"
    path.parent.mkdir()
    path.write_bytes(TAIL_SAMPLE)
    (tmp_path / "c" / "1.log").write_bytes(b"")
    (tmp_path / "c" / "notes.txt").write_bytes(b"")
    assert list_attempts(tmp_path / "c") == [0, 1]
    assert list_attempts(tmp_path / "missing") == []
    with trio.fail_after(10):
        chunks = [c async for c in read_log(path, LogOptions(tail_lines=2))]
        assert b"".join(chunks) == b"two halves joined\nthree\n"
        missing = [c async for c in read_log(tmp_path / "nope.log", LogOptions())]
        assert missing == []
