"""Kubernetes protobuf request bodies (`application/vnd.kubernetes.protobuf`) as JSON-shaped dicts.

kubectl's generator commands (`create namespace|configmap|secret|serviceaccount|deployment|
service`) post their objects through typed clients that speak only protobuf. This module turns
such a body into the dict the JSON path would have produced (camelCase names, ints, bools,
base64 for bytes, IntOrString as int or str, Quantity as str, Time as RFC 3339), so validation
and defaulting downstream are the same for both encodings.

Wire format: the 4-byte magic `k8s\\x00`, then a `runtime.Unknown` message (typeMeta=1
{apiVersion=1, kind=2}, raw=2 = the object's own message, contentEncoding=3, contentType=4).
The object is decoded by a table per message type, `{field number: (json name, kind, sub,
repeated)}`. The tables are not written here: they are derived from the kinds' schemas, whose
structs carry the upstream field numbers (`x-orchestrator-proto`, see `kube.schema.proto`), when
this module is first imported (the API server imports it on the first protobuf request). A kind
ending in `*` is a Go pointer (or otherwise meaningful at zero): its zero value is kept; any
other scalar at its zero value is dropped, as Go's `omitempty` JSON would. `inline` merges a
submessage into its parent (Go's embedded structs); `map` is a repeated entry message (key=1,
value=2) whose `sub` is the value kind. Time, IntOrString, Quantity and FieldsV1 are decoded
here, by the fixed apimachinery messages below.

Refusals never guess: a field number a described message does not list is a 415 naming it, an
object kind without a table is a 415 listing the accepted ones (clients can send JSON instead),
and bytes that are not valid protobuf are a 400. Nothing else escapes `decode`.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from orchestrator.kube import errors
from orchestrator.kube.errors import ApiError
from orchestrator.kube.schema.builtin import builtin_kinds
from orchestrator.kube.schema.proto import (
    BOOL,
    BYTES,
    FIELDSV1,
    INLINE,
    INT32,
    INT64,
    INTSTR,
    MAP,
    MESSAGE,
    MICROTIME,
    QUANTITY,
    STRING,
    TIME,
    Field,
    Msg,
    roots,
)

MEDIA_TYPE: Final = "application/vnd.kubernetes.protobuf"
MAGIC: Final = b"k8s\x00"

_VARINT_KINDS = frozenset({BOOL, INT32, INT64})
_WIRE_VARINT, _WIRE_FIXED64, _WIRE_LEN, _WIRE_FIXED32 = 0, 1, 2, 5


def _one(json_name: str, kind: str) -> Field:
    return (json_name, kind, None, False)


# ----------------------------------------------------------------------- apimachinery wire types
TIMESTAMP = Msg("v1.Time", {1: _one("seconds", INT64), 2: _one("nanos", INT32)})
INT_OR_STRING = Msg(
    "intstr.IntOrString",
    {1: _one("type", INT64 + "*"), 2: _one("intVal", INT32 + "*"), 3: _one("strVal", STRING + "*")},
)
QUANTITY_MSG = Msg("resource.Quantity", {1: _one("string", STRING + "*")})
FIELDS_V1 = Msg("v1.FieldsV1", {1: _one("Raw", BYTES + "*")})

# (apiVersion, kind) of the Unknown envelope -> the message of `raw`, from the kinds' schemas.
ROOTS: Final[dict[tuple[str, str], Msg]] = roots(builtin_kinds())

_UNKNOWN = Msg("runtime.Unknown", {})  # decoded by hand in `_decode`; named in errors
_TYPE_META = Msg("runtime.TypeMeta", {})


# ----------------------------------------------------------------------- errors
class _Malformed(Exception):
    """Bytes that are not valid protobuf (or not a valid value): becomes a 400."""


def _unsupported_field(number: int, msg: Msg) -> ApiError:
    return ApiError(
        415,
        "UnsupportedMediaType",
        f"unsupported field {number} in protobuf {msg.name}; send JSON instead",
    )


def _unsupported_kind(api_version: str, kind: str) -> ApiError:
    accepted = ", ".join(f"{av} {k}" for av, k in sorted(ROOTS, key=lambda r: (r[1], r[0])))
    return ApiError(
        415,
        "UnsupportedMediaType",
        f"protobuf bodies are accepted only for {accepted}; send application/json "
        f"(got {api_version or '<no apiVersion>'} {kind or '<no kind>'})",
    )


# ----------------------------------------------------------------------- wire format
def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = 0
    for i in range(10):
        if pos >= len(data):
            raise _Malformed("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            if result >= 1 << 64:
                raise _Malformed("varint overflows 64 bits")
            return result, pos
    raise _Malformed("varint longer than 10 bytes")


def _fields(data: bytes) -> list[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of each field: an int for varint/fixed, bytes for
    length-delimited."""
    out: list[tuple[int, int, int | bytes]] = []
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if number == 0 or number > 0x1FFFFFFF:
            raise _Malformed(f"invalid field number {number}")
        value: int | bytes
        if wire == _WIRE_VARINT:
            value, pos = _varint(data, pos)
        elif wire == _WIRE_LEN:
            length, pos = _varint(data, pos)
            if length > len(data) - pos:
                raise _Malformed(f"field {number} runs past the end of its message")
            value, pos = data[pos : pos + length], pos + length
        elif wire in (_WIRE_FIXED64, _WIRE_FIXED32):
            size = 8 if wire == _WIRE_FIXED64 else 4
            if size > len(data) - pos:
                raise _Malformed(f"field {number} runs past the end of its message")
            value, pos = int.from_bytes(data[pos : pos + size], "little"), pos + size
        else:
            raise _Malformed(f"field {number} has unsupported wire type {wire}")
        out.append((number, wire, value))
    return out


def _signed(value: int, bits: int) -> int:
    if value >= 1 << 63:
        value -= 1 << 64
    if not -(1 << (bits - 1)) <= value < 1 << (bits - 1):
        raise _Malformed(f"{value} does not fit in int{bits}")
    return value


# ----------------------------------------------------------------------- values
def _rfc3339(ts: dict[str, Any], micro: bool) -> str | None:
    seconds, nanos = ts.get("seconds", 0), ts.get("nanos", 0)
    if seconds == 0 and nanos == 0:
        return None  # Go's zero time: JSON null, and never sent by a client
    if not 0 <= nanos < 1_000_000_000:
        raise _Malformed(f"timestamp nanos {nanos} out of range")
    try:
        t = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(
            seconds=seconds, microseconds=nanos // 1000
        )
    except OverflowError:
        raise _Malformed(f"timestamp {seconds}s out of range") from None
    text = f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:{t.second:02d}"
    return f"{text}.{t.microsecond:06d}Z" if micro else f"{text}Z"


_MISSING: Final = object()
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def _scalar(kind: str, wire: int, value: int | bytes, msg: Msg, number: int) -> Any:
    if kind in _VARINT_KINDS:
        if not isinstance(value, int) or wire != _WIRE_VARINT:
            raise _Malformed(f"field {number} of {msg.name} is not a varint")
        if kind == BOOL:
            return value != 0
        return _signed(value, 32 if kind == INT32 else 64)
    if not isinstance(value, bytes):
        raise _Malformed(f"field {number} of {msg.name} is not length-delimited")
    if kind == STRING:
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise _Malformed(f"field {number} of {msg.name} is not UTF-8") from None
    if kind == BYTES:
        return base64.b64encode(value).decode("ascii")
    if kind in (TIME, MICROTIME):
        return _rfc3339(_message(TIMESTAMP, value), micro=kind == MICROTIME)
    if kind == INTSTR:
        ios = _message(INT_OR_STRING, value)
        if ios.get("type", 0) == 1:
            return ios.get("strVal", "")
        return ios.get("intVal", 0)
    if kind == QUANTITY:
        return _message(QUANTITY_MSG, value).get("string", "")
    if kind == FIELDSV1:
        raw = _message(FIELDS_V1, value).get("Raw", "")
        if not raw:
            return {}
        try:
            return json.loads(base64.b64decode(raw))
        except (ValueError, RecursionError):
            raise _Malformed(f"field {number} of {msg.name} is not JSON") from None
    raise AssertionError(f"unknown field kind {kind!r}")  # a table bug, not input


def _is_zero(value: Any) -> bool:
    return value is None or value == "" or value == 0 or value is False


def _map_entry(entry: bytes, value_kind: str, msg: Msg, number: int) -> tuple[str, Any]:
    key: Any = ""
    value: Any = _MISSING
    for n, wire, v in _fields(entry):
        if n == 1:
            key = _scalar(STRING, wire, v, msg, number)
        elif n == 2:
            value = _scalar(value_kind, wire, v, msg, number)
        else:
            raise _Malformed(f"map entry of field {number} of {msg.name} has field {n}")
    if value is _MISSING:
        value = 0 if value_kind in _VARINT_KINDS else ""
    return key, value


def _message(msg: Msg, data: bytes) -> dict[str, Any]:
    out: dict[str, Any] = {}
    chunks: dict[int, list[bytes]] = {}
    for number, wire, value in _fields(data):
        spec = msg.fields.get(number)
        if spec is None:
            raise _unsupported_field(number, msg)
        name, kind, sub, repeated = spec
        keep = kind.endswith("*")
        kind = kind.rstrip("*")
        if repeated:
            items = out.setdefault(name, [])
            if kind in _VARINT_KINDS and isinstance(value, bytes):  # packed
                pos = 0
                while pos < len(value):
                    item, pos = _varint(value, pos)
                    items.append(_scalar(kind, _WIRE_VARINT, item, msg, number))
            elif kind == MESSAGE:
                assert isinstance(sub, Msg)
                items.append(_message(sub, _len_delimited(value, msg, number)))
            else:
                items.append(_scalar(kind, wire, value, msg, number))
        elif kind == MAP:
            assert isinstance(sub, str)
            key, item = _map_entry(_len_delimited(value, msg, number), sub, msg, number)
            out.setdefault(name, {})[key] = item
        elif kind in (MESSAGE, INLINE):
            # Repeated occurrences of a message merge, as protobuf says: decode their
            # concatenation once, after the loop (the key keeps its first position).
            chunks.setdefault(number, []).append(_len_delimited(value, msg, number))
            if kind == MESSAGE:
                out.setdefault(name, {})
        else:
            item = _scalar(kind, wire, value, msg, number)
            if (keep and item is not None) or not _is_zero(item):
                out[name] = item
            else:
                out.pop(name, None)  # the last occurrence wins, and it is Go's zero value
    for number, parts in chunks.items():
        name, kind, sub, _ = msg.fields[number]
        assert isinstance(sub, Msg)
        decoded = _message(sub, b"".join(parts))
        if kind == INLINE:
            out.update(decoded)
        else:
            out[name] = decoded
    return out


def _len_delimited(value: int | bytes, msg: Msg, number: int) -> bytes:
    if not isinstance(value, bytes):
        raise _Malformed(f"field {number} of {msg.name} is not length-delimited")
    return value


# ----------------------------------------------------------------------- entry point
def decode(body: bytes) -> dict[str, Any]:
    """A Kubernetes protobuf request body as the JSON-shaped object. Raises only ApiError:
    400 for malformed bytes, 415 for kinds or fields this decoder does not describe."""
    try:
        return _decode(body)
    except _Malformed as exc:
        raise errors.bad_request(f"the protobuf request body is malformed: {exc}") from None


def _decode(body: bytes) -> dict[str, Any]:
    if not body.startswith(MAGIC):
        raise _Malformed("it does not start with the Kubernetes protobuf magic k8s\\x00")
    api_version = kind = encoding = content_type = ""
    raw = b""
    for number, wire, value in _fields(body[len(MAGIC) :]):
        if not isinstance(value, bytes) or wire != _WIRE_LEN:
            raise _Malformed(f"field {number} of runtime.Unknown is not length-delimited")
        if number == 1:
            for n, w, v in _fields(value):
                if not isinstance(v, bytes) or w != _WIRE_LEN or n not in (1, 2):
                    raise _Malformed(f"field {n} of runtime.TypeMeta is not a string")
                text = _scalar(STRING, w, v, _TYPE_META, n)
                api_version, kind = (text, kind) if n == 1 else (api_version, text)
        elif number == 2:
            raw = value
        elif number in (3, 4):
            text = _scalar(STRING, wire, value, _UNKNOWN, number)
            encoding, content_type = (text, content_type) if number == 3 else (encoding, text)
        else:
            raise _Malformed(f"runtime.Unknown has no field {number}")
    if encoding:
        raise ApiError(
            415,
            "UnsupportedMediaType",
            f"protobuf bodies with content encoding {encoding!r} are not supported; "
            "send application/json",
        )
    if content_type not in ("", MEDIA_TYPE):
        raise ApiError(
            415,
            "UnsupportedMediaType",
            f"the protobuf envelope holds {content_type!r}; send application/json",
        )
    root = ROOTS.get((api_version, kind))
    if root is None:
        raise _unsupported_kind(api_version, kind)
    return {"apiVersion": api_version, "kind": kind, **_message(root, raw)}
