"""Container log files: reading CRI log files (pure parsing, formatting, tailing) and following
them (`read_log`), as the kubelet's log reader does. The HTTPS endpoint that serves them is
`agent.logs`.

*Files.* The runtime writes each container's output to
`{data_dir}/pods/{namespace}_{name}_{uid}/{container}/{attempt}.log` (the sandbox's
`log_directory` plus the container's `log_path`), one CRI record per line:
`<RFC3339Nano> <stdout|stderr> <F|P> <text>`. A line longer than the runtime's limit is split
into `P` (partial) records closed by an `F` record; `parse_line` reads one record and
`LogFormatter` joins partial records back into one line per stream.

*Options* (`LogOptions.from_query`, the kubelet's `PodLogOptions`): `tailLines` = the last N
full lines (found by reading the file backwards, `tail_start`; a line split into P records counts
once), then `sinceTime`/`sinceSeconds` drop lines older than that instant, `timestamps` prefixes
each line with its (first record's) time in the fixed-width RFC3339Nano form, and `limitBytes`
cuts the output after that many bytes (mid-line, as the kubelet does). `previous` selects the
previous container instance's file, `follow` keeps the stream open for new lines.

*Which file* (`choose_attempt`): as the kubelet's `validateContainerLogStatus`, from the pod's
status as the agent knows it and the attempt files present: the current instance is the highest
attempt; `previous` needs `lastState.terminated` and means the attempt before a running (or
terminated) one, or the newest one when the container is waiting to restart. A container that
never ran answers 400 `container "c" in pod "p" is waiting to start: <reason>`; a missing
previous instance 400 `previous terminated container "c" in pod "p" not found`.

*Follow* (`read_log`): read to the end, then poll every `poll_interval` seconds (no inotify).
Following stops, after the rest of the file is sent, when the file is replaced or truncated
(rotation), when a newer attempt appears, when the container is no longer running, or when the
pod is gone or has another UID; it also stops when the client disconnects (the ASGI app cancels
the stream).
"""

from __future__ import annotations

import calendar
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import trio

from orchestrator.kube import errors
from orchestrator.kube.objects import Obj

__all__ = [
    "POLL_INTERVAL",
    "READ_CHUNK",
    "LogFormatter",
    "LogOptions",
    "LogOptionsError",
    "LogRecord",
    "choose_attempt",
    "container_status",
    "format_timestamp",
    "list_attempts",
    "log_dir",
    "parse_line",
    "parse_timestamp",
    "read_log",
    "tail_start",
]

log = logging.getLogger(__name__)

POLL_INTERVAL = 0.2
READ_CHUNK = 64 * 1024

# --------------------------------------------------------------------------- records

_TS = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})"
)


def parse_timestamp(text: str) -> int:
    """RFC 3339 (any fraction up to nanoseconds, Z or an offset) -> nanoseconds since the epoch."""
    m = _TS.fullmatch(text)
    if m is None:
        raise ValueError(f"{text!r} is not an RFC 3339 timestamp")
    y, mo, d, h, mi, s = (int(m.group(i)) for i in range(1, 7))
    frac = int((m.group(7) or "0").ljust(9, "0"))
    zone = m.group(8)
    offset = 0
    if zone not in ("Z", "z"):
        sign = 1 if zone[0] == "+" else -1
        offset = sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    try:
        secs = calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0))
        time.gmtime(secs)  # range check
    except (ValueError, OverflowError) as exc:
        raise ValueError(f"{text!r} is not a valid time") from exc
    if not (1 <= mo <= 12 and 1 <= d <= 31 and h < 24 and mi < 60 and s < 61):
        raise ValueError(f"{text!r} is not a valid time")
    return (secs - offset) * 1_000_000_000 + frac


def format_timestamp(ns: int) -> str:
    """Nanoseconds -> the kubelet's output form, RFC3339Nano with all nine digits, UTC."""
    secs, frac = divmod(ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{frac:09d}Z"


@dataclass(frozen=True, slots=True)
class LogRecord:
    timestamp: int  # nanoseconds since the epoch
    stream: str  # "stdout" | "stderr"
    partial: bool  # a `P` record: the line continues in the next record of this stream
    text: bytes  # without the line's newline


def parse_line(line: bytes) -> LogRecord:
    """One CRI log record (with or without its trailing newline); ValueError if malformed."""
    if line.endswith(b"\n"):
        line = line[:-1]
    parts = line.split(b" ", 3)
    if len(parts) < 3:
        raise ValueError(f"not a CRI log record: {line[:80]!r}")
    ts, stream, tag = parts[0], parts[1], parts[2]
    if stream not in (b"stdout", b"stderr"):
        raise ValueError(f"unknown stream {stream[:20]!r} in a CRI log record")
    if tag not in (b"F", b"P"):
        raise ValueError(f"unknown tag {tag[:20]!r} in a CRI log record")
    try:
        when = parse_timestamp(ts.decode("ascii"))
    except UnicodeDecodeError as exc:
        raise ValueError("bad timestamp in a CRI log record") from exc
    return LogRecord(when, stream.decode(), tag == b"P", parts[3] if len(parts) > 3 else b"")


def _is_full_record(line: bytes) -> bool:
    parts = line.split(b" ", 3)
    return len(parts) >= 3 and parts[2] == b"F"


# --------------------------------------------------------------------------- options


class LogOptionsError(ValueError):
    """An invalid log query; the message names the parameter."""


_TRUE = ("true", "1", "True", "TRUE", "t", "T")
_FALSE = ("false", "0", "False", "FALSE", "f", "F", "")


def _flag(params: Mapping[str, str], name: str) -> bool:
    value = params.get(name, "")
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise LogOptionsError(f"invalid boolean value {value!r} for query parameter {name!r}")


def _int(params: Mapping[str, str], name: str) -> int | None:
    value = params.get(name, "")
    if value == "":
        return None
    if re.fullmatch(r"[+-]?[0-9]+", value) is None:
        raise LogOptionsError(f"invalid integer value {value!r} for query parameter {name!r}")
    return int(value)


@dataclass(frozen=True)
class LogOptions:
    follow: bool = False
    previous: bool = False
    timestamps: bool = False
    since: int | None = None  # nanoseconds since the epoch: drop lines older than this
    tail_lines: int | None = None
    limit_bytes: int | None = None

    @classmethod
    def from_query(cls, params: Mapping[str, str], now_ns: int) -> LogOptions:
        """From query parameters (last value of each); validation as the API server's."""
        tail = _int(params, "tailLines")
        if tail is not None and tail < 0:
            raise LogOptionsError("tailLines: Invalid value: must be greater than or equal to 0")
        limit = _int(params, "limitBytes")
        if limit is not None and limit < 1:
            raise LogOptionsError("limitBytes: Invalid value: must be greater than 0")
        since_seconds = _int(params, "sinceSeconds")
        since_time = params.get("sinceTime", "")
        if since_seconds is not None and since_time:
            raise LogOptionsError("at most one of `sinceTime` or `sinceSeconds` may be specified")
        since: int | None = None
        if since_seconds is not None:
            if since_seconds < 1:
                raise LogOptionsError("sinceSeconds: Invalid value: must be greater than 0")
            since = now_ns - since_seconds * 1_000_000_000
        elif since_time:
            try:
                since = parse_timestamp(since_time)
            except ValueError as exc:
                raise LogOptionsError(f"sinceTime: {exc}") from None
        return cls(
            follow=_flag(params, "follow"),
            previous=_flag(params, "previous"),
            timestamps=_flag(params, "timestamps"),
            since=since,
            tail_lines=tail,
            limit_bytes=limit,
        )


# --------------------------------------------------------------------------- formatting


class LogFormatter:
    """Bytes of a CRI log file in, the user's log text out (pure; feed it in any chunks).

    Partial (`P`) records are held per stream until their `F` record; an unterminated last line
    of the file is held until its newline (or until `finish`).
    """

    def __init__(self, options: LogOptions) -> None:
        self.options = options
        self._rest = b""  # bytes after the last newline seen
        self._partial: dict[str, tuple[int, list[bytes]]] = {}
        self._left = options.limit_bytes

    @property
    def done(self) -> bool:
        """True once `limitBytes` bytes were produced: stop reading."""
        return self._left is not None and self._left <= 0

    def feed(self, data: bytes) -> bytes:
        if self.done:
            return b""
        data = self._rest + data
        cut = data.rfind(b"\n")
        if cut < 0:
            self._rest = data
            return b""
        self._rest = data[cut + 1 :]
        out = [self._record(line) for line in data[:cut].split(b"\n")]
        return self._limit(b"".join(out))

    def finish(self) -> bytes:
        """The end of input: an unterminated last record and pending partial lines (without a
        newline, as the kubelet writes partial records)."""
        if self.done:
            return b""
        out = [self._record(self._rest)] if self._rest else []
        self._rest = b""
        for first, pieces in self._partial.values():
            out.append(self._line(first, b"".join(pieces), b""))
        self._partial.clear()
        return self._limit(b"".join(out))

    def _record(self, line: bytes) -> bytes:
        try:
            rec = parse_line(line)
        except ValueError as exc:
            log.debug("skipping a malformed log line: %s", exc)
            return b""
        pending = self._partial.get(rec.stream)
        if rec.partial:
            if pending is None:
                self._partial[rec.stream] = (rec.timestamp, [rec.text])
            else:
                pending[1].append(rec.text)
            return b""
        if pending is not None:
            del self._partial[rec.stream]
            return self._line(pending[0], b"".join(pending[1]) + rec.text, b"\n")
        return self._line(rec.timestamp, rec.text, b"\n")

    def _line(self, when: int, text: bytes, end: bytes) -> bytes:
        since = self.options.since
        if since is not None and when < since:
            return b""
        if self.options.timestamps:
            return format_timestamp(when).encode() + b" " + text + end
        return text + end

    def _limit(self, out: bytes) -> bytes:
        if self._left is None or not out:
            return out
        out = out[: self._left]
        self._left -= len(out)
        return out


def tail_start(f: BinaryIO, n: int, block: int = READ_CHUNK) -> int:
    """The offset in `f` where its last `n` full lines start (blocking; reads backwards).

    A line split into P records counts once; an unterminated last line does not count (it is
    still being written) but lies after the offset, so it is shown too.
    """
    f.seek(0, os.SEEK_END)
    end = f.tell()
    if n <= 0:
        return end
    buf, buf_start = b"", end  # buf = file[buf_start : buf_start + len(buf)]
    line_end: int | None = None  # newline of the line being looked at (absolute)
    search_to = end
    full = 0
    while True:
        rel = buf.rfind(b"\n", 0, search_to - buf_start)
        if rel < 0:
            if buf_start > 0:
                size = min(block, buf_start)
                buf_start -= size
                f.seek(buf_start)
                buf = f.read(size) + buf
                continue
            # The first line of the file.
            if line_end is not None and _is_full_record(buf[: line_end - buf_start]):
                full += 1
                if full == n + 1:
                    return line_end + 1
            return 0
        if line_end is not None and _is_full_record(buf[rel + 1 : line_end - buf_start]):
            full += 1
            if full == n + 1:
                return line_end + 1
        line_end = search_to = buf_start + rel
        buf = buf[: rel + 1]


# --------------------------------------------------------------------------- files


def log_dir(data_dir: Path, namespace: str, name: str, uid: str) -> Path:
    """The sandbox's log directory (the agent core creates it with this name)."""
    return Path(data_dir) / "pods" / f"{namespace}_{name}_{uid}"


def list_attempts(container_dir: Path) -> list[int]:
    """The attempts with a log file (`{attempt}.log`) in a container's directory, ascending."""
    try:
        names = os.listdir(container_dir)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(int(n[:-4]) for n in names if n.endswith(".log") and n[:-4].isdigit())


def container_status(pod: Mapping[str, Any], container: str) -> Obj | None:
    status = pod.get("status") or {}
    for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
        for cs in status.get(key) or []:
            if isinstance(cs, dict) and cs.get("name") == container:
                return cs
    return None


def _waiting_message(container: str, pod: str, reason: str) -> str:
    if reason == "ErrImagePull":
        return f'container "{container}" in pod "{pod}" is waiting to start: image can\'t be pulled'
    if reason == "ImagePullBackOff":
        return (
            f'container "{container}" in pod "{pod}" is waiting to start: '
            "trying and failing to pull image"
        )
    return f'container "{container}" in pod "{pod}" is waiting to start: {reason}'


def choose_attempt(
    pod: Mapping[str, Any], container: str, attempts: list[int], previous: bool
) -> int:
    """Which attempt's file to serve (see the module docstring); ApiError(400) if none."""
    name = str((pod.get("metadata") or {}).get("name", ""))
    cs = container_status(pod, container)
    not_found = errors.bad_request(
        f'previous terminated container "{container}" in pod "{name}" not found'
    )
    if cs is None:  # the agent has not reported it yet: trust the files
        if previous:
            if len(attempts) < 2:
                raise not_found
            return attempts[-2]
        if not attempts:
            raise errors.bad_request(_waiting_message(container, name, "ContainerCreating"))
        return attempts[-1]
    state = cs.get("state") or {}
    last = (cs.get("lastState") or {}).get("terminated")
    current = "running" in state or "terminated" in state
    if previous:
        if not last:
            raise not_found
        wanted = attempts[:-1] if current else attempts
        if not wanted:
            raise not_found
        return wanted[-1]
    if current or last:
        if not attempts:
            if current:
                return 0  # started, but the runtime has not created its file yet
            raise errors.bad_request(f'container "{container}" in pod "{name}" is terminated')
        return attempts[-1]
    waiting = state.get("waiting")
    if isinstance(waiting, dict):
        return _raise(_waiting_message(container, name, str(waiting.get("reason") or "")))
    return _raise(f'container "{container}" in pod "{name}" is waiting to start - no logs yet')


def _raise(message: str) -> int:
    raise errors.bad_request(message)


def _same_file(path: Path, fd: int) -> bool:
    """False if `path` no longer names the open file or the file shrank (rotated, truncated)."""
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino) and now.st_size >= os.lseek(
        fd, 0, os.SEEK_CUR
    )


async def read_log(
    path: Path,
    options: LogOptions,
    *,
    still_current: Callable[[], Awaitable[bool]] | None = None,
    poll_interval: float = POLL_INTERVAL,
) -> AsyncIterator[bytes]:
    """The formatted log of one file, in chunks of whole lines.

    With `options.follow` and a `still_current` check, waits for more lines (polling) until the
    file is rotated or truncated or `still_current()` says the container moved on; the rest of the
    file is sent first. Without them it ends at the end of the file.
    """
    fmt = LogFormatter(options)
    follow = options.follow and still_current is not None
    f: Any = None  # trio's AsyncIOWrapper around a binary file
    try:
        while f is None:
            try:
                f = await trio.open_file(path, "rb")
            except FileNotFoundError:
                if not follow or still_current is None or not await still_current():
                    return
                await trio.sleep(poll_interval)
        raw: BinaryIO = f.wrapped
        if options.tail_lines is not None:
            offset = await trio.to_thread.run_sync(tail_start, raw, options.tail_lines)
            await f.seek(offset)
        ending = not follow
        while True:
            chunk = await f.read(READ_CHUNK)
            if chunk:
                out = fmt.feed(chunk)
                if out:
                    yield out
                if fmt.done:
                    return
                continue
            if ending:
                break
            assert still_current is not None
            same = await trio.to_thread.run_sync(_same_file, path, raw.fileno())
            if not same or not await still_current():
                ending = True  # one more pass: send what was written meanwhile, then stop
                continue
            await trio.sleep(poll_interval)
        out = fmt.finish()
        if out:
            yield out
    finally:
        if f is not None:
            with trio.CancelScope(shield=True):
                await f.aclose()
