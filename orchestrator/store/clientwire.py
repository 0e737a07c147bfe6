"""The client port's wire vocabulary: argument checks, value encodings and who may ask what.

A request is `[request_id, op, [args...]]` (`store.service`); the checks here turn a malformed
argument into `BadRequest` (answered "error", nothing applied), `kv_wire`/`event_wire`/
`error_value` encode results, and the joiner policy decides what a server certificate of a
non-member (a joining or a removed server) may send: `join` (which also needs the cluster
token) and `get` of the sealed credentials bundle, nothing else. Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack

from orchestrator.raft.framing import encode_frame
from orchestrator.store.types import Compacted, Conflict, Event, KeyValue, StoreError

__all__ = [
    "JOINER_KEYS",
    "JOINER_OPS",
    "BadRequest",
    "bytes_arg",
    "error_value",
    "event_wire",
    "joiner_may",
    "joining_server",
    "kv_wire",
    "nonneg_arg",
    "positive_arg",
    "refusal",
    "text_arg",
]


class BadRequest(ValueError):
    pass


JOINER_OPS = frozenset({"join"})
JOINER_KEYS = frozenset({"/orchestrator/bootstrap"})  # `api.auth.shared.KEY`: sealed by the token


def joining_server(identity: str, is_member: Callable[[int], bool]) -> bool:
    """Is `identity` ("server N", "admin", ...) a server certificate of a non-member?"""
    kind, _, nid = identity.partition(" ")
    return kind == "server" and nid.isdigit() and not is_member(int(nid))


def joiner_may(frame: bytes) -> bool:
    """May a non-member server send this request: `join`, or `get` of the sealed bundle?"""
    try:
        req = msgpack.unpackb(frame)
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError):
        return False
    if not isinstance(req, list) or len(req) != 3 or not isinstance(req[2], list):
        return False
    _, op, args = req
    return op in JOINER_OPS or (op == "get" and bool(args) and args[0] in JOINER_KEYS)


def refusal(frame: bytes) -> bytes:
    """The answer to a request a joining server may not make (its id echoed when readable)."""
    try:
        req = msgpack.unpackb(frame)
        rid = req[0] if isinstance(req, list) and req else None
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError):
        rid = None
    why = "a server that is not a member may only join"
    return encode_frame(msgpack.packb([rid, "refused", why]))


def text_arg(v: Any, what: str) -> str:
    if not isinstance(v, str) or not v:
        raise BadRequest(f"{what} must be a non-empty string")
    return v


def bytes_arg(v: Any, what: str) -> bytes:
    if not isinstance(v, bytes):
        raise BadRequest(f"{what} must be bytes")
    return v


def nonneg_arg(v: Any, what: str) -> int:
    if type(v) is not int or v < 0:
        raise BadRequest(f"{what} must be a non-negative integer")
    return v


def positive_arg(v: Any, what: str) -> int:
    if type(v) is not int or v < 1:
        raise BadRequest(f"{what} must be a positive integer")
    return v


def kv_wire(kv: KeyValue | None) -> list[Any] | None:
    if kv is None:
        return None
    return [kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version]


def event_wire(e: Event) -> list[Any]:
    return [int(e.type), kv_wire(e.kv), kv_wire(e.prev_kv)]


def error_value(exc: StoreError) -> list[Any]:
    if isinstance(exc, Conflict):
        return [str(exc), kv_wire(exc.current)]
    if isinstance(exc, Compacted):
        return [str(exc), exc.compact_revision]
    return [str(exc), None]
