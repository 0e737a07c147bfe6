"""Process-wide logging: JSON lines for machines, a readable line for people.

`setup(level, fmt)` installs one handler on the root logger (replacing the one a previous call
installed, so calling it again reconfigures). `fmt` is `json`, `text` or `auto`: JSON when the
stream is not a terminal (journald, files, pipes), text when it is.

A JSON line is one object per record::

    {"ts": "2025-01-02T03:04:05.678Z", "level": "info", "logger": "orchestrator.raft.node",
     "msg": "node 1: leader is now 1 (term 2)", "node": 1}

`ts` is UTC with milliseconds; `msg` is the formatted message (non-ASCII kept as is, so a
substring search of the file for a message still works unless it contains quotes or
backslashes); any `extra={...}` fields of the record follow, and `exc` holds the traceback
when there is one. Values that are not JSON become their `str()`.

The text format is `2025-01-02 03:04:05,678 INFO orchestrator.raft.node: message key=value`.

`set_level(level)` changes the level at run time (a SIGHUP reload calls it); it accepts the
same names as `--log-level` (`debug`, `info`, `warning`, `error`).

INFO is one line per meaningful event. The libraries' per-request lines stay at DEBUG: httpx
logs every request it sends at INFO ("HTTP Request: GET ... 200 OK": an agent's probes and
heartbeats, several lines a second on flash), and httpcore, hpack, h2, h11 and hypercorn's
access log add their own per-request and per-frame lines. The loggers in `PER_REQUEST` are
set to WARNING unless the process logs at DEBUG, so at INFO those records are not even made;
at DEBUG they are shown, their INFO records relabelled DEBUG (a search for level info never
finds one). Their warnings and errors always pass.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

__all__ = [
    "FORMATS",
    "LEVELS",
    "PER_REQUEST",
    "JsonFormatter",
    "TextFormatter",
    "add_arguments",
    "get_level",
    "set_level",
    "setup",
]

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("auto", "json", "text")

# Attributes every LogRecord has: anything else on a record came from `extra=`.
_STANDARD = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys()
    | {"message", "asctime", "taskName"}
)

_handler: logging.Handler | None = None  # the one `setup` installed

# Libraries that log per request or per frame (module doc): at DEBUG only.
PER_REQUEST = ("httpx", "httpcore", "hpack", "h2", "h11", "hypercorn.access")


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD and k[0] != "_"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, msg, extra fields, exc."""

    def format(self, record: logging.LogRecord) -> str:
        secs = int(record.created)
        ms = int((record.created - secs) * 1000)
        doc: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{ms:03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in _extras(record).items():
            doc.setdefault(key, value)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exc"] = record.exc_text
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return json.dumps(doc, ensure_ascii=False, default=str, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """`time LEVEL logger: message key=value ...` (then the traceback, if any)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        extras = _extras(record)
        if extras:
            line += "".join(f" {k}={v}" for k, v in extras.items())
        return line


def _per_request(name: str) -> bool:
    return any(name == top or name.startswith(top + ".") for top in PER_REQUEST)


class _DemotePerRequest(logging.Filter):
    """On the handler: an INFO record of a `PER_REQUEST` logger is shown as DEBUG (the loggers'
    levels already keep it out unless the process logs at DEBUG)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.INFO and _per_request(record.name):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


def _quiet_per_request(level: int) -> None:
    """The `PER_REQUEST` loggers' level for a process logging at `level` (module doc)."""
    quiet = logging.DEBUG if level <= logging.DEBUG else logging.WARNING
    for name in PER_REQUEST:
        logging.getLogger(name).setLevel(quiet)


def _level(name: str | int) -> int:
    if isinstance(name, int):
        return name
    value = logging.getLevelName(name.upper())
    if not isinstance(value, int):
        raise ValueError(f"unknown log level {name!r}: use one of {', '.join(LEVELS)}")
    return value


def setup(level: str | int = "info", fmt: str = "auto", stream: TextIO | None = None) -> None:
    """Log to `stream` (default stderr) at `level` in format `fmt` (auto, json, text)."""
    global _handler
    if fmt not in FORMATS:
        raise ValueError(f"unknown log format {fmt!r}: use one of {', '.join(FORMATS)}")
    out = sys.stderr if stream is None else stream
    if fmt == "auto":
        isatty = getattr(out, "isatty", None)
        fmt = "text" if isatty is not None and isatty() else "json"
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(_DemotePerRequest())
    root = logging.getLogger()
    if _handler is not None:
        root.removeHandler(_handler)
    _handler = handler
    root.addHandler(handler)
    set_level(level)


def set_level(level: str | int) -> None:
    """Change the root logger's level at run time (e.g. on SIGHUP); the per-request loggers
    follow (module doc)."""
    value = _level(level)
    logging.getLogger().setLevel(value)
    _quiet_per_request(value)


def get_level() -> str:
    """The root logger's level as a `--log-level` name."""
    return logging.getLevelName(logging.getLogger().level).lower()


def add_arguments(parser: Any) -> None:
    """`--log-level` and `--log-format` on an argparse parser."""
    parser.add_argument("--log-level", default="info", choices=list(LEVELS))
    parser.add_argument(
        "--log-format",
        default="auto",
        choices=list(FORMATS),
        help="json (one object per line), text, or auto: text on a terminal, json otherwise",
    )
