"""The MVCC store's checks of commands and read arguments: keys, values, expected revisions,
prefixes, txn compares. A malformed command raises `Invalid` (caught by the store and turned
into a result with `error` set: every replica reaches the same outcome); a malformed read
raises `InvalidRequest` at the caller."""

from __future__ import annotations

from typing import Any

from orchestrator.store.mvcc_sql import NO_UPPER
from orchestrator.store.types import (
    MAX_KEY_BYTES,
    MAX_VALUE_BYTES,
    CompareTarget,
    InvalidRequest,
    KeyValue,
    StoreError,
    TooLarge,
)

COMPARE_OPS = frozenset({"=", "!=", "<", ">"})
INT_TARGETS = frozenset({CompareTarget.MOD, CompareTarget.CREATE, CompareTarget.VERSION})


class Invalid(Exception):
    """A malformed command (internal: becomes a result with `error` set)."""

    def __init__(self, error: StoreError) -> None:
        super().__init__(str(error))
        self.error = error


def key_bytes(key: Any) -> int:
    """The UTF-8 size of a valid key; raises Invalid for anything that is not a valid key."""
    if not isinstance(key, str) or not key:
        raise Invalid(InvalidRequest(f"key must be a non-empty string, got {key!r:.80}"))
    try:
        n = len(key.encode())
    except UnicodeEncodeError:
        raise Invalid(InvalidRequest(f"key {key!r:.80} is not valid Unicode")) from None
    if n > MAX_KEY_BYTES:
        raise Invalid(TooLarge(f"key {key[:40]!r}... is {n} bytes, over {MAX_KEY_BYTES}"))
    if "\x00" in key:
        raise Invalid(InvalidRequest(f"key {key!r:.80} contains a NUL character"))
    return n


def check_value(key: str, value: Any) -> int:
    if not isinstance(value, bytes):
        raise Invalid(InvalidRequest(f"value of {key!r} must be bytes"))
    if len(value) > MAX_VALUE_BYTES:
        raise Invalid(TooLarge(f"value of {key!r} is {len(value)} bytes, over {MAX_VALUE_BYTES}"))
    return len(value)


def check_revision(what: str, rev: Any) -> int | None:
    """An expected revision: None or a non-negative int (bool is not an int here)."""
    if rev is None:
        return None
    if isinstance(rev, bool) or not isinstance(rev, int) or rev < 0:
        raise Invalid(InvalidRequest(f"{what} must be a non-negative integer or nil"))
    return rev


def prefix_end(prefix: str) -> str | bytes:
    """The smallest string above every string starting with `prefix` (NO_UPPER if none)."""
    chars = list(prefix)
    while chars and chars[-1] == "\U0010ffff":
        chars.pop()
    if not chars:
        return NO_UPPER
    cp = ord(chars[-1]) + 1
    if 0xD800 <= cp <= 0xDFFF:  # surrogates cannot be stored; skip to the next scalar value
        cp = 0xE000
    chars[-1] = chr(cp)
    return "".join(chars)


def check_text(what: str, text: Any) -> None:
    """Reads take any str that SQLite can bind (valid Unicode); InvalidRequest otherwise."""
    if not isinstance(text, str):
        raise InvalidRequest(f"{what} must be a string, got {type(text).__name__}")
    try:
        text.encode()
    except UnicodeEncodeError:
        raise InvalidRequest(f"{what} {text!r:.80} is not valid Unicode") from None


def bounds(prefix: str, start_after: str) -> tuple[str, str | bytes]:
    check_text("prefix", prefix)
    check_text("start_after", start_after)
    # key > s  <=>  key >= s + "\0", the immediate successor of s in code point order.
    lower = max(prefix, start_after + "\x00") if start_after else prefix
    return lower, prefix_end(prefix)


def compare(kv: KeyValue | None, target: str, op: str, operand: Any) -> bool:
    actual: Any
    if target == CompareTarget.VALUE:
        actual = None if kv is None else kv.value
        if actual is None or operand is None:
            same = actual is None and operand is None
            return same if op == "=" else (not same if op == "!=" else False)
    elif kv is None:
        actual = 0
    elif target == CompareTarget.MOD:
        actual = kv.mod_revision
    elif target == CompareTarget.CREATE:
        actual = kv.create_revision
    else:
        actual = kv.version
    if op == "=":
        return bool(actual == operand)
    if op == "!=":
        return bool(actual != operand)
    if op == "<":
        return bool(actual < operand)
    return bool(actual > operand)
