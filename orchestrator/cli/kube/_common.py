"""What every kubectl-like command shares: the session (client + discovery), errors, printing.

`Session` holds the open `RestClient`, the effective namespace and a lazily fetched
`ResourceMapper`; `resolve` re-fetches discovery once when a name is unknown (a CRD created a
moment ago). `format_error` turns any expected failure into the one line kubectl would print;
`format_table` lays out columns like kubectl's tabwriter (columns padded to the widest cell plus
`padding` spaces, the last column unpadded). Pure functions take `now` where time matters.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import yaml

from orchestrator.client import (
    ApiConnectionError,
    ApiException,
    ConfigError,
    ResourceInfo,
    ResourceMapper,
    ResourceNotFound,
    RestClient,
    discover,
)
from orchestrator.kube.schema.columns import human_duration

FIELD_MANAGER = "orchestrator-cli"


class CommandError(Exception):
    """A failure the command reports itself; printed as `error: <message>`."""


@dataclass
class Session:
    client: RestClient
    namespace: str  # -n, else the context's namespace, else "default"
    explicit_namespace: bool  # -n was given
    out: TextIO
    err: TextIO
    _mapper: ResourceMapper | None = field(default=None, repr=False)
    _fresh: bool = field(default=False, repr=False)

    async def mapper(self, *, refresh: bool = False) -> ResourceMapper:
        if self._mapper is None or (refresh and not self._fresh):
            self._mapper = await discover(self.client)
            self._fresh = True
        return self._mapper

    async def resolve(self, text: str) -> ResourceInfo:
        try:
            return (await self.mapper()).resolve(text)
        except ResourceNotFound:
            if self._fresh and self._mapper is not None and not self._mapper.failed:
                raise
            return (await self.mapper(refresh=True)).resolve(text)

    async def for_kind(self, api_version: str, kind: str) -> ResourceInfo:
        try:
            return (await self.mapper()).for_kind(api_version, kind)
        except ResourceNotFound:
            # A CRD applied earlier in the same run: discovery must be read again.
            self._fresh = False
            m = await self.mapper(refresh=True)
            try:
                return m.for_kind(api_version, kind)
            except ResourceNotFound:
                raise CommandError(
                    f'resource mapping not found for kind "{kind}" in version "{api_version}"; '
                    "ensure CRDs are installed first"
                ) from None

    def ns_for(self, res: ResourceInfo) -> str | None:
        return self.namespace if res.namespaced else None

    def print(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def eprint(self, text: str) -> None:
        print(text, file=self.err, flush=True)


# ---- errors -----------------------------------------------------------------------------------


def format_api_error(exc: ApiException, context: str = "") -> str:
    """The line(s) kubectl prints for a Status error; `context` like `error when creating "f": `."""
    if exc.code == 401:
        return f"error: You must be logged in to the server ({exc.message})"
    details = exc.details
    if exc.reason == "Invalid" and details.get("name") is not None:
        causes = [c for c in details.get("causes") or [] if isinstance(c, dict)]
        kind = details.get("kind") or "object"
        head = f'The {kind} "{details.get("name")}" is invalid: '
        lines = [
            f"{c.get('field')}: {c.get('message')}" if c.get("field") else str(c.get("message"))
            for c in causes
        ]
        if len(lines) == 1:
            return context + head + lines[0]
        if lines:
            return context + head + "\n" + "\n".join(f"* {line}" for line in lines)
        return context + exc.message
    if exc.reason and exc.reason != "Unknown":
        return f"Error from server ({exc.reason}): {context}{exc.message}"
    return f"Error from server: {context}{exc.message}"


def format_error(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        return format_api_error(exc)
    if isinstance(exc, (CommandError, ConfigError, ResourceNotFound, ApiConnectionError)):
        return f"error: {exc.args[0] if exc.args else exc}"
    if isinstance(exc, OSError):
        return f"error: {exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
    return f"error: {exc}"


# ---- output -----------------------------------------------------------------------------------


def cell(value: Any) -> str:
    if value is None:
        return "<none>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def format_table(
    rows: Sequence[Sequence[str]], *, padding: int = 3, widths: Sequence[int] | None = None
) -> list[str]:
    """Align columns like Go's tabwriter: every column but the last padded to its widest cell."""
    if not rows:
        return []
    n = max(len(r) for r in rows)
    w = [0] * n
    for r in rows:
        for i, c in enumerate(r):
            w[i] = max(w[i], len(c))
    if widths:
        w = [max(a, b) for a, b in zip(w, list(widths) + [0] * n, strict=False)]
    out = []
    for r in rows:
        parts = [c.ljust(w[i] + padding) if i < len(r) - 1 else c for i, c in enumerate(r)]
        out.append("".join(parts).rstrip())
    return out


def column_widths(rows: Sequence[Sequence[str]]) -> list[int]:
    w: list[int] = []
    for r in rows:
        for i, c in enumerate(r):
            if i >= len(w):
                w.append(0)
            w[i] = max(w[i], len(c))
    return w


def dump(obj: Any, fmt: str) -> str:
    """`-o json` (4-space indent, like kubectl) or `-o yaml` (block style, keys sorted)."""
    if fmt == "json":
        return json.dumps(obj, indent=4, ensure_ascii=False)
    return yaml.safe_dump(obj, default_flow_style=False, sort_keys=True, allow_unicode=True)


def parse_time(text: Any) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def age(timestamp: Any, now: float) -> str:
    t = parse_time(timestamp)
    return "<unknown>" if t is None else human_duration(now - t)


def split_targets(
    args: Sequence[str],
) -> tuple[list[tuple[str, list[str]]], bool]:
    """`TYPE NAME...`, `TYPE1,TYPE2`, or `TYPE/NAME...` → [(type, names)], and whether the
    slash form was used. Raises CommandError on a mix."""
    if not args:
        raise CommandError("you must specify the type of resource")
    if any("/" in a for a in args):
        if not all("/" in a for a in args):
            raise CommandError(
                "there is no need to specify a resource type as a separate argument when "
                "passing arguments in resource/name form"
            )
        out: list[tuple[str, list[str]]] = []
        for a in args:
            t, _, n = a.partition("/")
            if not t or not n:
                raise CommandError(
                    f'arguments in resource/name form must have a single resource and name: "{a}"'
                )
            for entry in out:
                if entry[0] == t:
                    entry[1].append(n)
                    break
            else:
                out.append((t, [n]))
        return out, True
    types = [t for t in args[0].split(",") if t]
    names = list(args[1:])
    if len(types) > 1 and names:
        raise CommandError("names cannot be given with more than one resource type; use TYPE/NAME")
    return [(t, names) for t in types], False


def label_selector(match_labels: Any) -> str:
    if not isinstance(match_labels, dict):
        return ""
    return ",".join(f"{k}={v}" for k, v in sorted(match_labels.items()))


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")


def parse_duration(text: str) -> float:
    """`30s`, `5m`, `1h30m`, `250ms` or plain seconds; 0 means no limit."""
    t = text.strip()
    if re.fullmatch(r"\d+(\.\d+)?", t):
        return float(t)
    pos, total = 0, 0.0
    for m in _DURATION.finditer(t):
        if m.start() != pos:
            break
        total += float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m.group(2)]
        pos = m.end()
    if pos != len(t) or not t:
        raise CommandError(f'invalid duration "{text}" (use 30s, 5m, 1h)')
    return total


def pairs(mapping: Any) -> Iterable[tuple[str, Any]]:
    return sorted(mapping.items()) if isinstance(mapping, dict) else ()
