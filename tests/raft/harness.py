"""A tiny synchronous in-memory network of `RaftCore`s for focused tests and transcripts.

Modelled on etcd-io/raft's `rafttest` interaction environment. Nothing here is concurrent and
nothing is random except each core's own seeded `random.Random`, so a test replays exactly.

Each `Node` owns an in-memory `Disk` (hard state, snapshot, log) and a trivial state machine
(the list of applied normal entries). `Cluster.process(nid)` runs the production driver order
for one `Ready`: persist to the disk, hand the messages to the network, apply, `advance`, then
report sent snapshots as delivered (like the simulation's driver). Messages wait in
`Cluster.inflight` until `deliver_round()` / `deliver_all()` hands them to their recipients;
`deliver_all()` loops "process every node, deliver every message" until the cluster is quiescent.

Faults: `partition(...)`, `block(frm, to, types)`, `heal()`, a one-off `drop=` predicate for a
delivery, `crash(nid)` (everything but the disk and the state machine is lost) and
`restart(nid)` (a new core from the disk).

Every event is rendered as one line into `Cluster.trace` (and returned by the call that caused
it), e.g. ``1->2 APP term=2 log=1/3 commit=3 entries=[2/4 2/5]``; see `describe_message` and
`describe_ready`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from orchestrator.raft.core import RaftCore, bootstrap
from orchestrator.raft.core_state import RaftConfig
from orchestrator.raft.types import (
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Message,
    MsgType,
    NodeId,
    ReadState,
    Ready,
    Role,
    Snapshot,
    SnapshotMeta,
)

MessageFilter = Callable[[Message], bool]


# ---------------------------------------------------------------------------- rendering
def _ids(ids: Iterable[int]) -> str:
    return "[" + " ".join(str(i) for i in sorted(ids)) + "]"


def _data(data: bytes) -> str:
    return data.decode("utf-8", "backslashreplace")


def describe_entry(e: Entry, *, data: bool = True) -> str:
    """`term/index`, followed by `:payload` when asked and the entry has one."""
    head = f"{e.term}/{e.index}"
    if not data:
        return head
    if e.type is EntryType.CONF_CHANGE:
        cc = ConfChange.decode(e.data)
        return f"{head}:{cc.type.name.lower().replace('_', '-')}({cc.node_id})"
    return f"{head}:{_data(e.data)}" if e.data else head


def describe_conf(conf: ConfState) -> str:
    text = f"voters={_ids(conf.voters)}"
    if conf.learners:
        text += f" learners={_ids(conf.learners)}"
    return text


def describe_message(m: Message) -> str:
    """One line per message, e.g. ``1->2 APP term=2 log=1/3 commit=3 entries=[2/4 2/5]``."""
    t = m.type
    parts = [f"{m.frm}->{m.to}", t.name, f"term={m.term}"]
    if t in (MsgType.APP, MsgType.VOTE, MsgType.PRE_VOTE):
        parts.append(f"log={m.log_term}/{m.index}")
    if t in (MsgType.APP, MsgType.HEARTBEAT, MsgType.COMMIT):
        parts.append(f"commit={m.commit}")
    if t is MsgType.APP and m.entries:
        parts.append("entries=[" + " ".join(describe_entry(e, data=False) for e in m.entries) + "]")
    if t in (MsgType.APP_RESP, MsgType.READ_INDEX_RESP):
        parts.append(f"index={m.index}")
    if m.reject:
        parts.append("rejected")
        if t is MsgType.APP_RESP:
            parts.append(f"hint={m.log_term}/{m.reject_hint}")
    if m.snapshot is not None:
        meta = m.snapshot.meta
        parts.append(f"snap={meta.term}/{meta.index} {describe_conf(meta.conf)}")
    if m.context:
        parts.append(f"ctx={_data(m.context)}")
    return " ".join(parts)


def describe_ready(nid: NodeId, rd: Ready) -> list[str]:
    """One line per item of a Ready, in driver order: state, persist, apply, reads, notes,
    then the messages (without the node prefix, since `1->2` already names the sender)."""
    out: list[str] = []
    if rd.soft_state is not None:
        ss = rd.soft_state
        out.append(f"{nid} state: {ss.role.name.lower()} term={ss.term} leader={ss.leader}")
    if rd.hard_state is not None:
        hs = rd.hard_state
        out.append(f"{nid} hard: term={hs.term} vote={hs.vote} commit={hs.commit}")
    if rd.snapshot is not None:
        meta = rd.snapshot.meta
        out.append(f"{nid} snapshot: {meta.term}/{meta.index} {describe_conf(meta.conf)}")
    if rd.entries:
        out.append(f"{nid} persist: " + " ".join(describe_entry(e) for e in rd.entries))
    if rd.committed:
        out.append(f"{nid} apply: " + " ".join(describe_entry(e) for e in rd.committed))
    for rs in rd.read_states:
        out.append(f"{nid} read: index={rs.index} ctx={_data(rs.context)}")
    for note in rd.notes:
        out.append(f"{nid} note: {note}")
    out.extend(describe_message(m) for m in rd.messages)
    return out


def describe(rd: Ready, nid: NodeId | None = None) -> str:
    """`describe_ready` as one string; the node id defaults to the sender of its messages."""
    if nid is None:
        nid = rd.messages[0].frm if rd.messages else 0
    return "\n".join(describe_ready(nid, rd))


def describe_status(core: RaftCore) -> list[str]:
    log = core.log
    lines = [
        f"{core.id}: {core.role.name.lower()} term={core.term} vote={core.vote} "
        f"leader={core.lead} commit={log.committed} applied={log.applied} "
        f"log=[{log.first_index()},{log.last_index()}] {describe_conf(core.conf)}"
    ]
    if core.role is Role.LEADER:
        for pid, pr in sorted(core.prs.items()):
            if pid == core.id:
                continue
            extra = " learner" if pr.is_learner else ""
            extra += f" inflight={len(pr.inflight)}" if pr.inflight else ""
            extra += " paused" if pr.is_paused() else ""
            lines.append(
                f"   {pid}: {pr.state.name.lower()} match={pr.match} next={pr.next}{extra}"
            )
    return lines


# ---------------------------------------------------------------------------- nodes
@dataclass
class Disk:
    hard_state: HardState = field(default_factory=HardState)
    snapshot: Snapshot = field(default_factory=lambda: Snapshot(SnapshotMeta()))
    entries: list[Entry] = field(default_factory=list)


@dataclass
class StateMachine:
    """Applied index plus the (index, data) of every non-empty normal entry applied."""

    applied: int = 0
    values: list[tuple[int, bytes]] = field(default_factory=list)

    def encode(self) -> bytes:
        return msgpack.packb([[i, d] for i, d in self.values])  # type: ignore[no-any-return]

    def restore(self, index: int, data: bytes) -> None:
        self.applied = index
        self.values = [(int(i), bytes(d)) for i, d in msgpack.unpackb(data)] if data else []

    def data(self) -> list[bytes]:
        return [d for _, d in self.values]


class Node:
    def __init__(self, nid: NodeId, config: RaftConfig, seed: int, disk: Disk) -> None:
        self.id = nid
        self.config = config
        self.seed = seed
        self.disk = disk
        self.sm = StateMachine()
        self.alive = False
        self.starts = 0
        self.read_states: list[ReadState] = []
        self.core: RaftCore = self._new_core()

    def _new_core(self) -> RaftCore:
        d = self.disk
        if self.sm.applied < d.snapshot.meta.index:
            self.sm.restore(d.snapshot.meta.index, d.snapshot.data)
        core = RaftCore(
            self.config,
            random.Random(self.seed * 1_000 + self.id * 10 + self.starts),
            hard_state=d.hard_state,
            snapshot=d.snapshot.meta,
            entries=list(d.entries),
            applied=self.sm.applied,
        )
        self.starts += 1
        self.alive = True
        return core

    def restart(self) -> None:
        self.core = self._new_core()

    def persist(self, rd: Ready) -> None:
        d = self.disk
        if rd.snapshot is not None:
            d.snapshot = rd.snapshot
            d.entries = []
        if rd.entries:
            first = rd.entries[0].index
            d.entries = [e for e in d.entries if e.index < first] + list(rd.entries)
        if rd.hard_state is not None:
            d.hard_state = rd.hard_state

    def apply(self, rd: Ready) -> None:
        if rd.snapshot is not None:
            self.sm.restore(rd.snapshot.meta.index, rd.snapshot.data)
        for e in rd.committed:
            if e.index <= self.sm.applied:
                continue
            assert e.index == self.sm.applied + 1, f"node {self.id}: gap before {e.index}"
            self.sm.applied = e.index
            if e.type is EntryType.NORMAL and e.data:
                self.sm.values.append((e.index, e.data))
        self.read_states.extend(rd.read_states)


# ---------------------------------------------------------------------------- cluster
class Cluster:
    """N cores bootstrapped as founders (plus optional empty joiners) on an in-memory network."""

    def __init__(
        self,
        voters: int | Iterable[NodeId] = 3,
        *,
        seed: int = 0,
        joiners: Iterable[NodeId] = (),
        **config: Any,
    ) -> None:
        founders = list(range(1, voters + 1)) if isinstance(voters, int) else sorted(voters)
        self.seed = seed
        self.config = config
        self.nodes: dict[NodeId, Node] = {}
        self.inflight: list[Message] = []
        self.sent: list[Message] = []  # every message handed to the network, dropped or not
        self.trace: list[str] = []
        self.groups: list[set[NodeId]] | None = None
        self.blocked: list[tuple[NodeId | None, NodeId | None, frozenset[MsgType] | None]] = []
        hs, entries = bootstrap(founders)
        for nid in founders:
            self._add(nid, Disk(hs, Snapshot(SnapshotMeta()), list(entries)))
        for nid in joiners:
            self.add_node(nid)

    def _add(self, nid: NodeId, disk: Disk) -> Node:
        cfg = RaftConfig(id=nid, **self.config)
        node = self.nodes[nid] = Node(nid, cfg, self.seed, disk)
        return node

    def add_node(self, nid: NodeId) -> Node:
        """An empty node that will join by replicating the log (after a conf change)."""
        return self._add(nid, Disk())

    def __getitem__(self, nid: NodeId) -> RaftCore:
        return self.nodes[nid].core

    # ---------------------------------------------------------------- observation
    def leader(self) -> NodeId | None:
        best: RaftCore | None = None
        for n in self.nodes.values():
            c = n.core
            if n.alive and c.role is Role.LEADER and (best is None or c.term > best.term):
                best = c
        return best.id if best is not None else None

    def _emit(self, lines: list[str]) -> list[str]:
        self.trace.extend(lines)
        return lines

    # ---------------------------------------------------------------- driver
    def process(self, nid: NodeId) -> list[str]:
        """Handle every pending Ready of one node; returns (and traces) what happened."""
        node = self.nodes[nid]
        out: list[str] = []
        core = node.core
        while node.alive and core.has_ready():
            rd = core.ready()
            node.persist(rd)
            lines = describe_ready(nid, rd)
            n_msgs = len(rd.messages)
            head, msg_lines = lines[: len(lines) - n_msgs], lines[len(lines) - n_msgs :]
            out.extend(head)
            for m, line in zip(rd.messages, msg_lines, strict=True):
                if m.type is MsgType.SNAP:
                    snap = node.disk.snapshot
                    assert m.snapshot is not None
                    assert snap.meta == m.snapshot.meta, f"node {nid}: sending a snapshot it lacks"
                    m.snapshot = snap
                self.sent.append(m)
                if self.is_blocked(m):
                    out.append(line + " (dropped)")
                else:
                    out.append(line)
                    self.inflight.append(m)
            node.apply(rd)
            core.advance(rd)
            for m in rd.messages:
                if m.type is MsgType.SNAP:
                    core.report_snapshot(m.to, True)
        return self._emit(out)

    def process_all(self) -> list[str]:
        out: list[str] = []
        for nid in sorted(self.nodes):
            out.extend(self.process(nid))
        return out

    def is_blocked(self, m: Message, drop: MessageFilter | None = None) -> bool:
        if drop is not None and drop(m):
            return True
        if self.groups is not None and not any(m.frm in g and m.to in g for g in self.groups):
            return True
        for frm, to, types in self.blocked:
            if (
                (frm is None or frm == m.frm)
                and (to is None or to == m.to)
                and (types is None or m.type in types)
            ):
                return True
        return False

    def deliver_round(self, drop: MessageFilter | None = None) -> list[str]:
        """Deliver every message now in flight (in send order), then process every node."""
        msgs, self.inflight = self.inflight, []
        out: list[str] = []
        for m in msgs:
            node = self.nodes.get(m.to)
            if node is None or not node.alive or self.is_blocked(m, drop):
                out.append(f"dropped in flight: {describe_message(m)}")
                continue
            node.core.step(m)
        self._emit(out)
        return out + self.process_all()

    def deliver_all(self, drop: MessageFilter | None = None, max_rounds: int = 1000) -> list[str]:
        """Process every node and deliver messages until nothing is left to do."""
        out = self.process_all()
        for _ in range(max_rounds):
            if not self.inflight:
                return out
            out.extend(self.deliver_round(drop))
        raise AssertionError(f"network not quiescent after {max_rounds} rounds")

    def rounds_until_quiet(self, drop: MessageFilter | None = None, limit: int = 1000) -> int:
        """Like deliver_all, returning the number of delivery rounds it took."""
        self.process_all()
        for n in range(limit):
            if not self.inflight:
                return n
            self.deliver_round(drop)
        raise AssertionError(f"network not quiescent after {limit} rounds")

    def take(self, pred: MessageFilter) -> list[Message]:
        """Remove (and return) the in-flight messages matching `pred`: hold them back."""
        kept = [m for m in self.inflight if not pred(m)]
        taken = [m for m in self.inflight if pred(m)]
        self.inflight = kept
        return taken

    def inject(self, msgs: Iterable[Message]) -> None:
        """Put messages (e.g. held back by `take`) back on the wire."""
        self.inflight.extend(msgs)

    # ---------------------------------------------------------------- time and requests
    def tick(self, nid: NodeId, n: int = 1) -> list[str]:
        core = self.nodes[nid].core
        for _ in range(n):
            core.tick()
        return self.process(nid)

    def campaign(self, nid: NodeId) -> list[str]:
        self.nodes[nid].core.campaign()
        return self.process(nid)

    def elect(self, nid: NodeId) -> None:
        """Make `nid` leader (campaign and deliver everything); asserts it worked."""
        self.campaign(nid)
        self.deliver_all()
        assert self.nodes[nid].core.role is Role.LEADER, describe_status(self.nodes[nid].core)

    def propose(self, nid: NodeId, *data: bytes) -> tuple[int, int]:
        res = self.nodes[nid].core.propose(list(data))
        self.process(nid)
        return res

    def conf_change(self, nid: NodeId, kind: ConfChangeType, target: NodeId) -> tuple[int, int]:
        res = self.nodes[nid].core.propose_conf_change(ConfChange(kind, target))
        self.process(nid)
        return res

    def read_index(self, nid: NodeId, ctx: bytes) -> list[str]:
        self.nodes[nid].core.read_index(ctx)
        return self.process(nid)

    def transfer(self, nid: NodeId, target: NodeId) -> list[str]:
        self.nodes[nid].core.transfer_leadership(target)
        return self.process(nid)

    def report_down(self, nid: NodeId, peer: NodeId) -> list[str]:
        """Tell node `nid` that `peer`'s process is gone (what the transport reports when the
        peer's connections close)."""
        self.nodes[nid].core.report_peer_down(peer)
        return self.process(nid)

    def compact(self, nid: NodeId, keep: int = 0) -> SnapshotMeta:
        """Snapshot the node's state machine at its applied index and compact its log,
        keeping the last `keep` applied entries (like the simulation's driver)."""
        node = self.nodes[nid]
        core = node.core
        index = node.sm.applied
        term = core.log.term(index)
        assert term is not None
        meta = SnapshotMeta(index, term, core.conf)
        upto = max(core.log.offset, index - keep)
        node.disk.snapshot = Snapshot(meta, node.sm.encode())
        node.disk.entries = [e for e in node.disk.entries if e.index > upto]
        core.compact(meta, upto)
        return meta

    def tick_until_leader(self, nids: Iterable[NodeId], max_ticks: int = 500) -> NodeId:
        """Tick `nids` one tick at a time (delivering everything after each round) until the
        highest-term leader is one of them; returns it."""
        ids = sorted(nids)
        for _ in range(max_ticks):
            lead = self.leader()
            if lead in ids:
                return lead
            for nid in ids:
                if self.nodes[nid].alive:
                    self.nodes[nid].core.tick()
            self.deliver_all()
        raise AssertionError(f"no leader among {ids} after {max_ticks} ticks")

    @classmethod
    def with_logs(
        cls,
        logs: dict[NodeId, list[int]],
        *,
        term: int | dict[NodeId, int],
        seed: int = 0,
        **config: Any,
    ) -> Cluster:
        """Founders whose logs continue the bootstrap entries with empty entries of the given
        terms (etcd-style "newTestRaft with stored entries"); each node restarts at `term`
        (one for all, or per node) with no vote and only the bootstrap entries committed."""
        c = cls(sorted(logs), seed=seed, **config)
        for nid, terms in logs.items():
            node = c.nodes[nid]
            base = list(node.disk.entries)
            n = len(base)
            t = term if isinstance(term, int) else term[nid]
            extra = [Entry(tt, n + i) for i, tt in enumerate(terms, start=1)]
            node.disk.entries = base + extra
            node.disk.hard_state = HardState(t, 0, n)
            node.sm = StateMachine()
            node.restart()
        return c

    # ---------------------------------------------------------------- faults
    def partition(self, *groups: Iterable[NodeId]) -> None:
        """Only nodes in the same group can talk; nodes in no group are isolated."""
        self.groups = [set(g) for g in groups]

    def isolate(self, nid: NodeId) -> None:
        self.partition([nid], [n for n in self.nodes if n != nid])

    def block(
        self,
        frm: NodeId | None = None,
        to: NodeId | None = None,
        types: Iterable[MsgType] | None = None,
    ) -> None:
        """Drop messages from `frm` to `to` (None: any) of `types` (None: all) until healed."""
        self.blocked.append((frm, to, frozenset(types) if types is not None else None))

    def heal(self) -> None:
        self.groups = None
        self.blocked = []

    def crash(self, nid: NodeId) -> None:
        """Lose everything but the disk and the state machine (which is durable per Ready)."""
        node = self.nodes[nid]
        node.alive = False
        node.read_states.clear()

    def restart(self, nid: NodeId) -> None:
        self.nodes[nid].restart()


def entries_of(core: RaftCore) -> list[tuple[int, int]]:
    """(term, index) of every entry in the core's log (after the compaction point)."""
    return [(e.term, e.index) for e in core.log.entries]


__all__ = [
    "Cluster",
    "ConfChangeType",
    "Disk",
    "MessageFilter",
    "Node",
    "StateMachine",
    "describe",
    "describe_conf",
    "describe_entry",
    "describe_message",
    "describe_ready",
    "describe_status",
    "entries_of",
]
