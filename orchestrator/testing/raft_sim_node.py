"""A simulated Raft server for the whole-cluster simulation (`testing/raft_sim.py`).

`SimNode` runs the real `RaftCore` under a driver that follows the production order (persist
the Ready to its simulated `Disk`, send, apply to its state machine, advance), crashes by
throwing away everything but the disk and the state machine's durable copy, and restarts from
them. It reaches the rest of the simulation only through `SimHost` (the network, the clients'
operations and the safety checks), which `Simulation` implements.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from orchestrator.raft.core import RaftCore, bootstrap
from orchestrator.raft.core_state import RaftConfig
from orchestrator.raft.types import (
    Entry,
    EntryType,
    HardState,
    Message,
    MsgType,
    NodeId,
    Ready,
    Role,
    Snapshot,
    SnapshotMeta,
)
from orchestrator.testing.machines import SimStateMachine


class SimFailure(AssertionError):
    """A safety or liveness property was violated; the message names it."""


StateMachineFactory = Callable[[], SimStateMachine]
# The entry's id, so a forwarding server recognises its entry: a client op id, or (from
# BATCH_IDS on) a batch id, whose ops are `Simulation.batch_ops[id]`.
ENVELOPE = struct.Struct("!Q")
BATCH_IDS = 1 << 48
# Command bytes per batch entry (RaftNode's _BATCH_BYTES scaled to the simulation's commands of a
# few dozen bytes and its 4 KiB messages): a busy server's queue splits into several entries.
BATCH_BYTES = 96


@dataclass
class SimOp:
    client: int
    kind: str
    key: str
    value: bytes | None
    expected: bytes | None
    call: int
    ret: int | None = None
    output: object = None
    state: str = "pending"  # pending | done | failed | indeterminate


class SimHost(Protocol):
    """What a simulated server uses of the simulation around it (`Simulation` is the one
    implementation): its configuration, the network, the clients' operations, the checks."""

    rng: random.Random
    sm_factory: StateMachineFactory
    snapshot_every: int
    keep_tail: int
    ops: list[SimOp]
    batch_ops: dict[int, list[int]]

    def raft_config(self, nid: NodeId) -> RaftConfig: ...
    def network_send(self, src: SimNode, m: Message) -> None: ...
    def ops_of(self, eid: int) -> list[int]: ...
    def op_done(self, op_id: int, output: object) -> None: ...
    def op_failed(self, op_id: int) -> None: ...
    def op_indeterminate(self, op_id: int) -> None: ...
    def op_abandoned(self, op_id: int) -> None: ...
    def on_leader(self, n: SimNode) -> None: ...
    def check_applied(self, n: SimNode, e: Entry) -> None: ...
    def check_events(self, n: SimNode, events: list[Any]) -> None: ...
    def check_snapshot(self, n: SimNode, index: int, digest: Any) -> None: ...
    def watchers_reattach(self, n: SimNode) -> None: ...


# ---------------------------------------------------------------------------- nodes
@dataclass
class Disk:
    hard_state: HardState = field(default_factory=HardState)
    snapshot: Snapshot = field(default_factory=lambda: Snapshot(SnapshotMeta()))
    entries: list[Entry] = field(default_factory=list)


@dataclass
class Pending:
    eid: int  # envelope id: an op id or a batch id
    index: int
    term: int


class SimNode:
    def __init__(self, sim: SimHost, nid: NodeId, founders: list[NodeId]) -> None:
        self.sim = sim
        self.id = nid
        self.disk = Disk()
        if founders:
            self.disk.hard_state, self.disk.entries = bootstrap(founders)
        self.sm = sim.sm_factory()
        self.alive = False
        self.removed = False
        self.core: RaftCore
        self.pending: dict[int, Pending] = {}  # index -> write (or batch) waiting for apply
        self.forwarded: set[int] = set()  # envelope ids of entries forwarded to the leader
        self.queue: list[tuple[int, bytes]] = []  # (op id, command) held for a batch
        self.reads: dict[bytes, int] = {}  # read context -> op id
        self.read_waits: list[tuple[int, int]] = []  # (read index, op id)
        self.last_snapshot_index = 0

    def start(self) -> None:
        sim = self.sim
        self.sm.open()
        snap = self.disk.snapshot
        if self.sm.applied_index() < snap.meta.index:
            # RaftNode refuses to start like this: the state machine is synced before the log
            # is compacted behind it.
            raise SimFailure(f"node {self.id}: state machine behind its Raft snapshot")
        self.core = RaftCore(
            sim.raft_config(self.id),
            random.Random(sim.rng.random()),
            hard_state=self.disk.hard_state,
            snapshot=snap.meta,
            entries=list(self.disk.entries),
            applied=self.sm.applied_index(),
        )
        self.last_snapshot_index = snap.meta.index
        self.alive = True
        self.pending.clear()
        self.reads.clear()
        self.read_waits.clear()

    def crash(self) -> None:
        sim = self.sim
        self.alive = False
        self.sm.close()
        sim.watchers_reattach(self)
        for eid in [p.eid for p in self.pending.values()] + list(self.forwarded):
            for op_id in sim.ops_of(eid):
                sim.op_indeterminate(op_id)
        self.forwarded.clear()
        for op_id, _ in self.queue:
            sim.op_failed(op_id)  # never proposed: certainly no effect
        self.queue.clear()
        for op_id in list(self.reads.values()) + [o for _, o in self.read_waits]:
            self.sim.op_abandoned(op_id)
        self.pending.clear()
        self.reads.clear()
        self.read_waits.clear()

    # The production driver loop, step for step.
    def process(self) -> None:
        core = self.core
        while self.alive and core.has_ready():
            rd = core.ready()
            self._persist(rd)
            for m in rd.messages:
                self.sim.network_send(self, m)
            self._apply(rd)
            core.advance(rd)
            self._after_advance(rd)

    def _persist(self, rd: Ready) -> None:
        d = self.disk
        if rd.snapshot is not None:
            d.snapshot = rd.snapshot
            d.entries = []
        if rd.entries:
            # The disk log is contiguous: truncate at the first new index, then append.
            first = rd.entries[0].index
            if d.entries:
                del d.entries[max(0, first - d.entries[0].index) :]
            d.entries.extend(rd.entries)
        # As in production, a Ready that only moves the commit index is not saved.
        if rd.hard_state is not None and not rd.commit_only(d.hard_state):
            d.hard_state = rd.hard_state

    def _apply(self, rd: Ready) -> None:
        sim = self.sim
        if rd.snapshot is not None:
            meta = rd.snapshot.meta
            self.sm.restore(meta.index, rd.snapshot.data)
            # A restore produces no events; watchers resume from history.
            self.sim.watchers_reattach(self)
            self.last_snapshot_index = meta.index
            sim.check_snapshot(self, meta.index, self.sm.digest())
            for idx in [i for i in self.pending if i <= meta.index]:
                # Superseded by the snapshot: outcome unknown to this server.
                for op_id in sim.ops_of(self.pending.pop(idx).eid):
                    sim.op_indeterminate(op_id)
            for eid in self.forwarded:
                for op_id in sim.ops_of(eid):
                    sim.op_indeterminate(op_id)
            self.forwarded.clear()
        if rd.committed:
            # Strip the envelopes (op or batch ids), as RaftNode does, before the state machine.
            eids: list[int | None] = []
            entries = []
            for e in rd.committed:
                if e.type is EntryType.NORMAL and e.data:
                    eids.append(ENVELOPE.unpack_from(e.data)[0])
                    e = Entry(e.term, e.index, e.type, e.data[ENVELOPE.size :])
                else:
                    eids.append(None)
                entries.append(e)
            applied = self.sm.apply(entries)
            sim.check_events(self, list(applied.events))
            for e, res, fwd_id in zip(rd.committed, applied.results, eids, strict=True):
                sim.check_applied(self, e)
                p = self.pending.pop(e.index, None)
                if p is not None:
                    if p.term == e.term:
                        self._entry_done(p.eid, res)
                    else:
                        for op_id in sim.ops_of(p.eid):
                            sim.op_failed(op_id)
                if fwd_id is not None and fwd_id in self.forwarded:
                    self.forwarded.discard(fwd_id)
                    self._entry_done(fwd_id, res)
        for rs in rd.read_states:
            read_op = self.reads.pop(rs.context, None)
            if read_op is not None:
                self.read_waits.append((rs.index, read_op))
        self._serve_reads()
        if rd.soft_state is not None and rd.soft_state.role is Role.LEADER:
            sim.on_leader(self)
        if rd.soft_state is not None and rd.soft_state.role is not Role.LEADER:
            # Lost leadership: local read requests will never be answered.
            for op_id in self.reads.values():
                sim.op_abandoned(op_id)
            self.reads.clear()

    def _entry_done(self, eid: int, result: object) -> None:
        """An entry this server proposed or forwarded was applied with `result`: its op is
        done, or, for a batch, each op with its own command's result (RaftNode's _BatchWaiter;
        here anything but one result per command is a failure of the state machine)."""
        sim = self.sim
        if eid < BATCH_IDS:
            sim.op_done(eid, self.sm.output(sim.ops[eid].kind, result))
            return
        op_ids = sim.batch_ops[eid]
        if not isinstance(result, list) or len(result) != len(op_ids):
            raise SimFailure(
                f"node {self.id}: batch {eid} of {len(op_ids)} commands applied with result "
                f"{result!r:.200}, not one result per command"
            )
        for op_id, res in zip(op_ids, result, strict=True):
            sim.op_done(op_id, self.sm.output(sim.ops[op_id].kind, res))

    def _serve_reads(self) -> None:
        applied = self.sm.applied_index()
        keep = []
        for idx, op_id in self.read_waits:
            if idx <= applied:
                self.sim.op_done(op_id, self.sm.read(self.sim.ops[op_id].key))
            else:
                keep.append((idx, op_id))
        self.read_waits = keep

    def _after_advance(self, rd: Ready) -> None:
        sim = self.sim
        for m in rd.messages:
            if m.type is MsgType.SNAP:
                self.core.report_snapshot(m.to, True)
        applied = self.core.log.applied
        if applied - self.last_snapshot_index >= sim.snapshot_every:
            # Like RaftNode: the state machine's database is the snapshot; sync it and keep
            # only the metadata with the log.
            self.sm.sync()
            index = self.sm.applied_index()
            term = self.core.log.term(index)
            assert term is not None
            meta = SnapshotMeta(index, term, self.core.conf)
            upto = max(self.core.log.offset, index - sim.keep_tail)
            self.disk.snapshot = Snapshot(meta)
            self.disk.entries = [e for e in self.disk.entries if e.index > upto]
            self.core.compact(meta, upto)
            self.last_snapshot_index = index
            sim.check_snapshot(self, index, self.sm.digest())
