"""msgpack encoding of Raft messages for the peer transport.

A message is encoded as one msgpack array with fixed positions (compact, no field names on the
wire). `decode_message` validates shape and types and raises `CodecError` on anything else, so a
malformed frame from the network can never reach the core.
"""

from __future__ import annotations

from typing import Any

import msgpack

from orchestrator.raft.types import (
    ConfState,
    Entry,
    EntryType,
    Message,
    MsgType,
    Snapshot,
    SnapshotMeta,
)


class CodecError(ValueError):
    """A frame that does not decode to a well-formed message."""


def _encode_snapshot(s: Snapshot | None) -> list[Any] | None:
    if s is None:
        return None
    m = s.meta
    return [m.index, m.term, sorted(m.conf.voters), sorted(m.conf.learners), s.data]


def encode_message(m: Message) -> bytes:
    return msgpack.packb(  # type: ignore[no-any-return]  # msgpack is untyped
        [
            int(m.type),
            m.to,
            m.frm,
            m.term,
            m.log_term,
            m.index,
            [(e.term, e.index, int(e.type), e.data) for e in m.entries],
            m.commit,
            m.reject,
            m.reject_hint,
            _encode_snapshot(m.snapshot),
            m.context,
        ],
        use_bin_type=True,
    )


MAX_INT = (1 << 63) - 1  # terms and indexes are stored as SQLite INTEGER (signed 64-bit)


def _int(v: Any, what: str) -> int:
    if type(v) is not int or not 0 <= v <= MAX_INT:
        raise CodecError(f"{what} must be an integer in [0, 2**63), got {v!r}")
    return v


def _bytes(v: Any, what: str) -> bytes:
    if not isinstance(v, bytes):
        raise CodecError(f"{what} must be bytes, got {type(v).__name__}")
    return v


def _ids(v: Any, what: str) -> frozenset[int]:
    if not isinstance(v, list):
        raise CodecError(f"{what} must be a list")
    return frozenset(_int(x, what) for x in v)


def decode_message(data: bytes) -> Message:
    try:
        obj = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise CodecError(f"not msgpack: {exc}") from exc
    if not isinstance(obj, list) or len(obj) != 12:
        raise CodecError("a message must be an array of 12 fields")
    t, to, frm, term, log_term, index, ents, commit, reject, hint, snap, ctx = obj
    try:
        mtype = MsgType(_int(t, "type"))
    except ValueError as exc:
        raise CodecError(f"unknown message type {t!r}") from exc
    if not isinstance(ents, list):
        raise CodecError("entries must be a list")
    entries = []
    for e in ents:
        if not isinstance(e, list) or len(e) != 4:
            raise CodecError("an entry must be an array of 4 fields")
        try:
            etype = EntryType(_int(e[2], "entry type"))
        except ValueError as exc:
            raise CodecError(f"unknown entry type {e[2]!r}") from exc
        entries.append(
            Entry(_int(e[0], "entry term"), _int(e[1], "entry index"), etype, _bytes(e[3], "data"))
        )
    snapshot = None
    if snap is not None:
        if not isinstance(snap, list) or len(snap) != 5:
            raise CodecError("a snapshot must be an array of 5 fields")
        voters, learners = _ids(snap[2], "voters"), _ids(snap[3], "learners")
        if voters & learners:
            raise CodecError("a node cannot be both voter and learner")
        meta = SnapshotMeta(
            _int(snap[0], "snapshot index"),
            _int(snap[1], "snapshot term"),
            ConfState(voters, learners),
        )
        snapshot = Snapshot(meta, _bytes(snap[4], "snapshot data"))
    if not isinstance(reject, bool):
        raise CodecError("reject must be a boolean")
    return Message(
        type=mtype,
        to=_int(to, "to"),
        frm=_int(frm, "from"),
        term=_int(term, "term"),
        log_term=_int(log_term, "log_term"),
        index=_int(index, "index"),
        entries=entries,
        commit=_int(commit, "commit"),
        reject=reject,
        reject_hint=_int(hint, "reject_hint"),
        snapshot=snapshot,
        context=_bytes(ctx, "context"),
    )
