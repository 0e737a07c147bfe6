"""The subset of Kubernetes JSONPath that CRD `additionalPrinterColumns` use.

Grammar (optionally wrapped in `{...}` and/or led by `$`):

    path    := step*
    step    := "." name | ".." name | ".*" | "[" selector "]"
    name    := chars up to "." or "[" ("\\." escapes a dot: `.metadata.labels.app\\.k8s\\.io/x`)
    selector:= int | "*" | [int] ":" [int] | 'key' | "key" | "?(" "@" step* [op literal] ")"
    op      := == | != | < | <= | > | >=
    literal := 'str' | "str" | number | true | false | null

`compile(expr)` raises `JSONPathError` (a ValueError) with the position of bad syntax;
`Path.find(obj)` returns every match in document order (missing keys are no match, not an
error, like the API server's printer with AllowMissingKeys). Pure and never raises in `find`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

_OPS = ("==", "!=", "<=", ">=", "<", ">")


class JSONPathError(ValueError):
    """Bad JSONPath syntax; the message names the expression and the offending position."""


@dataclass(frozen=True, slots=True)
class _Field:
    name: str


@dataclass(frozen=True, slots=True)
class _Recursive:
    name: str  # "" = every descendant


@dataclass(frozen=True, slots=True)
class _Wildcard:
    pass


@dataclass(frozen=True, slots=True)
class _Index:
    index: int


@dataclass(frozen=True, slots=True)
class _Slice:
    start: int | None
    end: int | None


@dataclass(frozen=True, slots=True)
class _Filter:
    path: tuple[Any, ...]
    op: str  # "" = the path exists (and is not false/null)
    literal: Any


_Step = _Field | _Recursive | _Wildcard | _Index | _Slice | _Filter


@dataclass(frozen=True, slots=True)
class Path:
    expr: str
    steps: tuple[_Step, ...]

    def find(self, obj: Any) -> list[Any]:
        """All values the path selects in `obj`, in document order."""
        return _apply(self.steps, [obj])

    def first(self, obj: Any) -> tuple[bool, Any]:
        """(found, value) of the first match: what a printer column shows."""
        found = self.find(obj)
        return (True, found[0]) if found else (False, None)


def compile(expr: str) -> Path:
    """Parse `expr`; raises JSONPathError for syntax outside the supported subset."""
    text = expr.strip()
    if text.startswith("{"):
        if not text.endswith("}"):
            raise JSONPathError(f"unclosed action in {expr!r}")
        text = text[1:-1].strip()
    if text.startswith("$"):
        text = text[1:]
    if not text:
        raise JSONPathError(f"empty JSONPath expression {expr!r}")
    if text[0] not in ".[":
        raise JSONPathError(f"JSONPath {expr!r} must start with '.' or '['")
    parser = _Parser(text, expr)
    steps = parser.steps(in_filter=False)
    if parser.pos != len(text):
        raise parser.error("unexpected character")
    return Path(expr, tuple(steps))


class _Parser:
    def __init__(self, text: str, expr: str) -> None:
        self.text = text
        self.expr = expr
        self.pos = 0

    def error(self, what: str) -> JSONPathError:
        return JSONPathError(f"{what} at position {self.pos} in JSONPath {self.expr!r}")

    def peek(self, n: int = 1) -> str:
        return self.text[self.pos : self.pos + n]

    def steps(self, *, in_filter: bool) -> list[_Step]:
        out: list[_Step] = []
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c == ".":
                if self.peek(2) == "..":
                    self.pos += 2
                    name = self.name()
                    if not name and self.peek() not in ("[", "*"):
                        raise self.error("'..' must be followed by a name")
                    out.append(_Recursive(name))
                    continue
                self.pos += 1
                if self.peek() == "*":
                    self.pos += 1
                    out.append(_Wildcard())
                    continue
                name = self.name()
                if not name:
                    raise self.error("empty field name")
                out.append(_Field(name))
            elif c == "[":
                self.pos += 1
                out.append(self.bracket())
            elif in_filter:
                break
            else:
                raise self.error(f"unexpected {c!r}")
        return out

    def name(self) -> str:
        chars: list[str] = []
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c == "\\" and self.pos + 1 < len(self.text):
                chars.append(self.text[self.pos + 1])
                self.pos += 2
                continue
            if c in ".[]()=!<> \t" or c in "\"'":
                break
            chars.append(c)
            self.pos += 1
        return "".join(chars)

    def bracket(self) -> _Step:
        end = self.text.find("]", self.pos)
        if self.peek(2) == "?(":
            self.pos += 2
            step = self.filter()
            if self.peek(2) != ")]":
                raise self.error("unclosed filter, expected ')]'")
            self.pos += 2
            return step
        if self.peek() in ("'", '"'):
            key = self.string()
            if self.peek() != "]":
                raise self.error("expected ']'")
            self.pos += 1
            return _Field(key)
        if end < 0:
            raise self.error("unclosed bracket")
        inner = self.text[self.pos : end].strip()
        self.pos = end + 1
        if inner == "*":
            return _Wildcard()
        try:
            if ":" in inner:
                parts = inner.split(":")
                if len(parts) > 3:
                    raise ValueError(inner)
                start = int(parts[0]) if parts[0].strip() else None
                stop = int(parts[1]) if parts[1].strip() else None
                return _Slice(start, stop)
            return _Index(int(inner))
        except ValueError:
            raise JSONPathError(
                f"invalid array index {inner!r} in JSONPath {self.expr!r}"
            ) from None

    def string(self) -> str:
        quote = self.text[self.pos]
        self.pos += 1
        chars: list[str] = []
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c == "\\" and self.pos + 1 < len(self.text):
                chars.append(self.text[self.pos + 1])
                self.pos += 2
                continue
            if c == quote:
                self.pos += 1
                return "".join(chars)
            chars.append(c)
            self.pos += 1
        raise self.error("unterminated string")

    def skip_space(self) -> None:
        while self.peek() in (" ", "\t"):
            self.pos += 1

    def filter(self) -> _Filter:
        self.skip_space()
        if self.peek() != "@":
            raise self.error("a filter must start with '@'")
        self.pos += 1
        path = tuple(self.steps(in_filter=True))
        self.skip_space()
        for op in _OPS:
            if self.text.startswith(op, self.pos):
                self.pos += len(op)
                self.skip_space()
                literal = self.literal()
                self.skip_space()
                return _Filter(path, op, literal)
        return _Filter(path, "", None)

    def literal(self) -> Any:
        if self.peek() in ("'", '"'):
            return self.string()
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] not in ") \t":
            self.pos += 1
        word = self.text[start : self.pos]
        if word in ("true", "false", "null"):
            return json.loads(word)
        try:
            return int(word)
        except ValueError:
            pass
        try:
            return float(word)
        except ValueError:
            raise self.error(f"bad literal {word!r}") from None


def _descendants(v: Any) -> Iterator[Any]:
    yield v
    if isinstance(v, dict):
        for k in v:
            yield from _descendants(v[k])
    elif isinstance(v, list):
        for x in v:
            yield from _descendants(x)


def _apply(steps: tuple[_Step, ...], values: list[Any]) -> list[Any]:
    for step in steps:
        nxt: list[Any] = []
        for v in values:
            nxt.extend(_one(step, v))
        values = nxt
    return values


def _one(step: _Step, v: Any) -> list[Any]:
    if isinstance(step, _Field):
        return [v[step.name]] if isinstance(v, dict) and step.name in v else []
    if isinstance(step, _Wildcard):
        if isinstance(v, dict):
            return list(v.values())
        return list(v) if isinstance(v, list) else []
    if isinstance(step, _Index):
        if isinstance(v, list) and -len(v) <= step.index < len(v):
            return [v[step.index]]
        return []
    if isinstance(step, _Slice):
        return list(v[step.start : step.end]) if isinstance(v, list) else []
    if isinstance(step, _Recursive):
        out = []
        for d in _descendants(v):
            if not step.name:
                out.append(d)
            elif isinstance(d, dict) and step.name in d:
                out.append(d[step.name])
        return out
    items = v if isinstance(v, list) else []
    return [x for x in items if _matches(step, x)]


def _matches(f: _Filter, x: Any) -> bool:
    found = _apply(f.path, [x])
    if not f.op:
        return any(y is not None and y is not False for y in found)
    return any(_compare(y, f.op, f.literal) for y in found)


def _compare(a: Any, op: str, b: Any) -> bool:
    num = (int, float)
    if (
        isinstance(a, bool)
        or isinstance(b, bool)
        or not (isinstance(a, num) and isinstance(b, num))
    ):
        if op == "==":
            return type(a) is type(b) and a == b
        if op == "!=":
            return not (type(a) is type(b) and a == b)
        if not (isinstance(a, str) and isinstance(b, str)):
            return False
    try:
        if op == "==":
            return bool(a == b)
        if op == "!=":
            return bool(a != b)
        if op == "<":
            return bool(a < b)
        if op == "<=":
            return bool(a <= b)
        if op == ">":
            return bool(a > b)
        return bool(a >= b)
    except TypeError:
        return False


def text(value: Any) -> str:
    """A matched value as `kubectl -o jsonpath` prints it: strings bare, the rest as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "<nil>"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, separators=(",", ":"), sort_keys=True)
