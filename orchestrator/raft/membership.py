"""Membership data the Raft driver replicates besides the core's configuration: the peer address
book (node id -> "host:port", with a mark for learners to promote once caught up), which
travels in conf-change contexts and in snapshots; and the conf changes that carry it.
"""

from __future__ import annotations

import msgpack

from orchestrator.raft.types import ConfChange, ConfChangeType, NodeId

PROMOTE_MARK = "#promote"  # in the persisted address book: a learner to promote when caught up


def book(peers: dict[NodeId, str], auto_promote: set[NodeId]) -> dict[NodeId, str]:
    """The address book as persisted (storage, snapshots): addresses plus promotion marks."""
    return {p: a + PROMOTE_MARK if p in auto_promote else a for p, a in peers.items()}


def unbook(book: dict[NodeId, str]) -> tuple[dict[NodeId, str], set[NodeId]]:
    peers = {p: a.removesuffix(PROMOTE_MARK) for p, a in book.items()}
    return peers, {p for p, a in book.items() if a.endswith(PROMOTE_MARK)}


def pack_snapshot(book: dict[NodeId, str], sm_data: bytes) -> bytes:
    return msgpack.packb([book, sm_data])  # type: ignore[no-any-return]


def unpack_snapshot(data: bytes) -> tuple[dict[NodeId, str], bytes]:
    book, sm_data = msgpack.unpackb(data, strict_map_key=False)
    return {int(k): str(v) for k, v in book.items()}, bytes(sm_data)


def add_learner_change(node_id: NodeId, addr: str, *, auto_promote: bool = False) -> ConfChange:
    """Add a learner reachable at `addr`; with auto_promote the leader makes it a voter once it
    has caught up (how `server --join` grows a cluster)."""
    context = msgpack.packb({"addr": addr, "promote": auto_promote})
    return ConfChange(ConfChangeType.ADD_LEARNER, node_id, context)


def member_context(context: bytes) -> tuple[str | None, bool]:
    """(peer address, auto-promote) carried by a conf change; tolerant of garbage."""
    try:
        ctx = msgpack.unpackb(context)
        addr = ctx.get("addr")
        return (addr if isinstance(addr, str) else None), bool(ctx.get("promote"))
    except Exception:  # a malformed context must not stop the apply loop
        return None, False


def promote_change(node_id: NodeId) -> ConfChange:
    return ConfChange(ConfChangeType.ADD_VOTER, node_id)


def remove_change(node_id: NodeId) -> ConfChange:
    return ConfChange(ConfChangeType.REMOVE, node_id)
