"""Deterministic whole-cluster simulation of the Raft core (FoundationDB / VOPR style).

Theory of operation
-------------------
One seed fixes everything: cluster size, fault rates, the schedule of crashes, partitions,
leadership transfers and membership changes, message delays, and the clients' operations. Time is
a simulated millisecond clock driven by an event heap, so a run takes no wall time beyond CPU and
replays exactly (`python benches/raft_sim.py --start SEED --seeds 1 -v`).

Each simulated server runs the real `RaftCore` under a driver that follows the production order
(persist the Ready to its simulated disk, send, apply to its state machine, advance). A crash
throws away everything but the disk (Raft log, hard state, snapshot) and the state machine's
durable copy; a restart rebuilds the core from them, as the real server does from SQLite. The
servers that can reach a crashed one are told it is down (`report_peer_down`), as the transport
does when a killed process's connections close; spurious reports about live servers (a flapping
connection) are injected too.

Checked during the run: at most one leader per term (election safety); a new leader holds every
committed entry (leader completeness); every server applies the same entry at each index
(state-machine safety); applied indexes are contiguous. Checked at the end: logs match pairwise
(log matching); after healing every fault the cluster elects a leader, commits, and all servers
converge on the same state; the clients' history of reads and writes is linearizable.

The state machine is pluggable (`StateMachineFactory`) so the MVCC store can run here too.

Batch entries: when the state machine accepts them (the MVCC store does; the dictionary does
not), a seeded share of the clients' writes is held at the server they reached for a few
milliseconds and then proposed (or forwarded) together with the others held there, as RaftNode
packs the proposals that arrive while its loop is busy: consecutive commands up to
`BATCH_BYTES` become one entry, `pack_batch(commands)`, a lone command stays a plain entry. A
batch entry's envelope carries a batch id instead of an op id (`Simulation.batch_ops` maps it
to its ops); when it is applied, the proposing server hands result i to the batch's op i, and
a batch that is lost, superseded or cut off by a crash takes all its ops with it.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from orchestrator.raft.core_state import RaftConfig
from orchestrator.raft.statemachine import pack_batch
from orchestrator.raft.types import (
    ConfChange,
    ConfChangeType,
    Entry,
    Message,
    MsgType,
    NodeId,
    ProposalDropped,
    Role,
    Snapshot,
    SnapshotMeta,
)
from orchestrator.testing.linearizability import Operation, check_history
from orchestrator.testing.machines import MVCCMachine
from orchestrator.testing.raft_sim_node import (
    BATCH_BYTES,
    BATCH_IDS,
    ENVELOPE,
    Pending,
    SimFailure,
    SimNode,
    SimOp,
    StateMachineFactory,
)
from orchestrator.testing.raft_sim_watch import WatchModel

__all__ = ["SimFailure", "SimResult", "Simulation", "run_seed"]

TICK_MS = 100
CLIENT_TIMEOUT_MS = 4000


# ---------------------------------------------------------------------------- simulation
@dataclass
class SimResult:
    seed: int
    nodes: int
    events: int
    ops_ok: int
    ops_indeterminate: int
    leaders: int
    sim_ms: int
    notes: list[str]
    batches: int = 0  # batch entries made (two commands or more; refused ones too)
    batched_ops: int = 0  # the client writes inside them


class Simulation:
    def __init__(
        self, seed: int, *, sm_factory: StateMachineFactory = MVCCMachine, verbose: bool = False
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.sm_factory = sm_factory
        self.verbose = verbose
        r = self.rng
        self.n_initial = r.choice([1, 3, 3, 3, 5, 5])
        self.duration_ms = r.randint(20_000, 40_000)
        self.drop_rate = r.choice([0.0, 0.01, 0.05, 0.1])
        self.dup_rate = r.choice([0.0, 0.01, 0.05])
        self.max_delay = r.choice([5, 20, 60, 200])
        self.snapshot_every = r.choice([10, 40, 200, 10_000])
        self.keep_tail = r.choice([0, 5, 50])
        self.n_clients = r.randint(1, 6)
        self.keys = [f"k{i}" for i in range(r.randint(1, 4))]
        self.pre_vote = r.random() < 0.9
        self.check_quorum = self.pre_vote or r.random() < 0.5
        self.now = 0
        self.events: list[tuple[int, int, Callable[[], None]]] = []
        self.seq = itertools.count()
        self.nodes: dict[NodeId, SimNode] = {}
        self.partition: list[set[NodeId]] | None = None
        self.next_id = self.n_initial + 1
        self.leaders_by_term: dict[int, NodeId] = {}
        self.applied: dict[int, tuple[int, int, bytes]] = {}
        self.snap_digests: dict[int, Any] = {}
        self.ops: list[SimOp] = []
        self.leader_guess: dict[int, NodeId] = {}
        self.watch = WatchModel(r, self._alive, self.nodes, self.log)
        self.n_events = 0
        self.log_lines: list[str] = []
        founders = list(range(1, self.n_initial + 1))
        for nid in founders:
            self.nodes[nid] = SimNode(self, nid, founders)
            self.nodes[nid].start()
        # Batch entries, if the state machine accepts them: the share of client writes held at
        # their server for up to `batch_wait` ms, to be proposed with the others held there.
        # (Drawn last, and only then, so that a machine without batches replays as before.)
        self.batch_rate = 0.0
        self.batch_wait = 0
        if self.nodes[founders[0]].sm.accepts_batches:
            self.batch_rate = r.choice([0.0, 0.5, 0.9, 1.0])
            self.batch_wait = r.choice([2, 10, 30])
        self.batch_ids = itertools.count(BATCH_IDS)
        self.batch_ops: dict[int, list[int]] = {}  # batch id -> its ops, in command order
        self.n_batched_ops = 0

    def raft_config(self, nid: NodeId) -> RaftConfig:
        return RaftConfig(
            id=nid,
            election_tick=10,
            heartbeat_tick=1,
            pre_vote=self.pre_vote,
            check_quorum=self.check_quorum,
            max_inflight=8,
            max_msg_bytes=4096,
        )

    def log(self, text: str) -> None:
        line = f"[{self.now:>6}ms] {text}"
        self.log_lines.append(line)
        if self.verbose:
            print(line)

    # ------------------------------------------------------------------ events
    def at(self, delay: int, fn: Callable[[], None]) -> None:
        heapq.heappush(self.events, (self.now + delay, next(self.seq), fn))

    def run(self) -> SimResult:
        for nid in self.nodes:
            self.at(self.rng.randint(0, TICK_MS), partial(self._tick, nid))
        for c in range(self.n_clients):
            self.at(self.rng.randint(0, 500), partial(self._client_next, c))
        self.at(self.rng.randint(1000, 4000), self._nemesis)
        for _ in range(self.rng.randint(0, 3)):
            self.at(self.rng.randint(0, self.duration_ms // 2), self.watch.start_watcher)
        self._run_until(self.duration_ms)
        self._heal_all()
        self._run_until(self.duration_ms + 15_000)
        self._check_converged()
        self._check_log_matching()
        self._check_linearizable()
        self.watch.check()
        done = sum(1 for o in self.ops if o.state == "done")
        indet = sum(1 for o in self.ops if o.state == "indeterminate")
        return SimResult(
            self.seed,
            len(self.nodes),
            self.n_events,
            done,
            indet,
            len(self.leaders_by_term),
            self.now,
            self.log_lines[-20:],
            len(self.batch_ops),
            self.n_batched_ops,
        )

    def _run_until(self, t_end: int) -> None:
        while self.events and self.events[0][0] <= t_end:
            t, _, fn = heapq.heappop(self.events)
            self.now = t
            self.n_events += 1
            fn()
        self.now = t_end

    def _tick(self, nid: NodeId) -> None:
        node = self.nodes[nid]
        if node.alive:
            node.core.tick()
            node.process()
        self.at(TICK_MS, lambda: self._tick(nid))

    # ------------------------------------------------------------------ network
    def reachable(self, a: NodeId, b: NodeId) -> bool:
        if self.partition is None:
            return True
        return any(a in g and b in g for g in self.partition)

    def network_send(self, src: SimNode, m: Message) -> None:
        if m.type is MsgType.SNAP:
            # Like RaftNode: a snapshot of the state machine as it is now (at the core's
            # applied index: messages go out before this Ready's entries are applied).
            index, data = src.sm.snapshot()
            term = src.core.log.term(index)
            if m.snapshot is None or term is None or index < m.snapshot.meta.index:
                raise SimFailure(f"node {src.id} cannot make the snapshot it was asked for")
            m.snapshot = Snapshot(SnapshotMeta(index, term, src.core.conf), data)
        if not self.reachable(m.frm, m.to) or self.rng.random() < self.drop_rate:
            return
        copies = 2 if self.rng.random() < self.dup_rate else 1
        for _ in range(copies):
            self.at(self.rng.randint(1, self.max_delay), partial(self._deliver, m))

    def _deliver(self, m: Message) -> None:
        node = self.nodes.get(m.to)
        if node is None or not node.alive or not self.reachable(m.frm, m.to):
            return
        node.core.step(m)
        node.process()

    # ------------------------------------------------------------------ faults
    def _alive(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.alive]

    def _nemesis(self) -> None:
        r = self.rng
        choice = r.random()
        alive = self._alive()
        down = [n for n in self.nodes.values() if not n.alive and not n.removed]
        if r.random() < 0.15 and alive:
            # A connection to a live leader flaps: its follower hears "down" for nothing.
            n = r.choice(alive)
            if n.core.lead:
                self.at(r.randint(0, self.max_delay), partial(self._report_down, n.id, n.core.lead))
        if choice < 0.25 and alive:
            n = r.choice(alive)
            self.log(f"crash node {n.id}")
            n.crash()
            for other in self._alive():
                # Its kernel closes its connections: whoever can reach it notices.
                if self.reachable(n.id, other.id) and r.random() < 0.9:
                    self.at(
                        r.randint(1, self.max_delay), partial(self._report_down, other.id, n.id)
                    )
            self.at(r.randint(200, 6000), partial(self._restart, n))
        elif choice < 0.45 and len(self.nodes) > 1:
            ids = list(self.nodes)
            r.shuffle(ids)
            cut = r.randint(1, len(ids) - 1)
            self.partition = [set(ids[:cut]), set(ids[cut:])]
            self.log(f"partition {self.partition}")
            self.at(r.randint(500, 8000), self._heal_partition)
        elif choice < 0.55:
            leader = self._leader()
            if leader is not None:
                voters = [v for v in leader.core.conf.voters if v != leader.id]
                if voters:
                    target = r.choice(voters)
                    self.log(f"transfer leadership {leader.id} -> {target}")
                    leader.core.transfer_leadership(target)
                    leader.process()
        elif choice < 0.70 and self.n_initial > 1:
            self._membership_step()
        elif down:
            self._restart(r.choice(down))
        if self.now < self.duration_ms - 2000:
            self.at(r.randint(300, 3000), self._nemesis)

    def _report_down(self, nid: NodeId, peer: NodeId) -> None:
        node = self.nodes.get(nid)
        if node is None or not node.alive:
            return
        self.log(f"node {nid} told that {peer} is down")
        node.core.report_peer_down(peer)
        node.process()

    def _restart(self, n: SimNode) -> None:
        if not n.alive and not n.removed:
            self.log(f"restart node {n.id}")
            n.start()

    def _heal_partition(self) -> None:
        if self.partition is not None:
            self.log("heal partition")
        self.partition = None

    def _heal_all(self) -> None:
        self.log("heal everything; restart every crashed node")
        self.partition = None
        self.drop_rate = 0.0
        self.dup_rate = 0.0
        for n in self.nodes.values():
            if not n.alive and not n.removed:
                n.start()

    def _leader(self) -> SimNode | None:
        best = None
        for n in self._alive():
            if n.core.role is Role.LEADER and (best is None or n.core.term > best.core.term):
                best = n
        return best

    def _membership_step(self) -> None:
        """Replace voters one at a time: add a learner, promote it, remove an old voter."""
        leader = self._leader()
        if leader is None:
            return
        core = leader.core
        learners = sorted(core.conf.learners)
        try:
            if learners:
                nid = learners[0]
                pr = core.prs.get(nid)
                if pr is not None and pr.match >= core.log.committed:
                    self.log(f"propose promote {nid}")
                    core.propose_conf_change(ConfChange(ConfChangeType.ADD_VOTER, nid))
            elif len(core.conf.voters) > self.n_initial:
                candidates = sorted(core.conf.voters)
                victim = self.rng.choice(candidates)
                self.log(f"propose remove {victim}")
                core.propose_conf_change(ConfChange(ConfChangeType.REMOVE, victim))
            else:
                nid = self.next_id
                self.next_id += 1
                node = SimNode(self, nid, [])
                self.nodes[nid] = node
                node.start()
                self.at(TICK_MS, lambda: self._tick(nid))
                self.log(f"propose add learner {nid}")
                core.propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, nid))
        except ProposalDropped as exc:
            self.log(f"membership change refused: {exc}")
        leader.process()

    # ------------------------------------------------------------------ safety checks
    def on_leader(self, n: SimNode) -> None:
        term = n.core.term
        prev = self.leaders_by_term.get(term)
        if prev is not None and prev != n.id:
            raise SimFailure(f"election safety: nodes {prev} and {n.id} both leader in term {term}")
        self.leaders_by_term[term] = n.id
        self.log(f"node {n.id} is leader at term {term}")
        log = n.core.log
        for idx, (term_i, _, _) in self.applied.items():
            if idx > log.offset and log.term(idx) != term_i:
                raise SimFailure(
                    f"leader completeness: leader {n.id} (term {term}) lacks committed entry "
                    f"{idx}@{term_i}"
                )

    def check_applied(self, n: SimNode, e: Entry) -> None:
        rec = (e.term, int(e.type), e.data)
        prev = self.applied.setdefault(e.index, rec)
        if prev != rec:
            raise SimFailure(
                f"state machine safety: node {n.id} applied {e.index}@{e.term}, "
                f"another applied {e.index}@{prev[0]}"
            )

    def check_events(self, n: SimNode, events: list[Any]) -> None:
        self.watch.check_events(n, events)

    def watchers_reattach(self, n: SimNode) -> None:
        self.watch.reattach(n)

    def check_snapshot(self, n: SimNode, index: int, digest: Any) -> None:
        prev = self.snap_digests.setdefault(index, digest)
        if prev != digest:
            raise SimFailure(f"state machine safety: node {n.id} state at {index} differs")

    def _check_converged(self) -> None:
        members = [n for n in self.nodes.values() if n.alive and not n.removed]
        leader = self._leader()
        if leader is None:
            raise SimFailure("liveness: no leader 15 s after every fault healed")
        voters = leader.core.conf.voters
        # A no-op write must commit once healed.
        try:
            leader.core.propose([b""])
        except ProposalDropped as exc:
            raise SimFailure(f"liveness: healed leader refuses proposals: {exc}") from exc
        leader.process()
        self._run_until(self.now + 5000)
        target = leader.core.log.committed
        digests = {}
        for n in members:
            if n.id in voters and n.sm.applied_index() < target:
                raise SimFailure(
                    f"liveness: node {n.id} applied {n.sm.applied_index()} < commit {target}"
                )
            if n.id in voters:
                digests[n.id] = (n.sm.applied_index(), n.sm.digest())
        if len({repr(d) for d in digests.values()}) > 1:
            raise SimFailure(f"convergence: state machines differ: {digests}")

    def _check_log_matching(self) -> None:
        logs = {}
        for n in self.nodes.values():
            if n.alive:
                lg = n.core.log
                logs[n.id] = {e.index: e for e in lg.entries}
        ids = sorted(logs)
        for i, a in enumerate(ids):
            for b in ids[i + 1 :]:
                la, lb = logs[a], logs[b]
                common = sorted(set(la) & set(lb), reverse=True)
                matched = False
                for idx in common:
                    ea, eb = la[idx], lb[idx]
                    if ea.term == eb.term:
                        matched = True
                    if matched and ea != eb:
                        raise SimFailure(f"log matching: nodes {a},{b} differ at {idx}")

    def _check_linearizable(self) -> None:
        ops = [
            Operation(
                client=o.client,
                kind=o.kind,
                key=o.key,
                value=o.value,
                expected=o.expected,
                call=float(o.call),
                ret=None if o.state == "indeterminate" else float(o.ret or 0),
                output=o.output,
            )
            for o in self.ops
            if o.state in ("done", "indeterminate")
        ]
        res = check_history(ops, timeout=60.0)
        if not res.ok:
            raise SimFailure(f"linearizability violated on key {res.key}:\n{res.explanation}")

    # ------------------------------------------------------------------ clients
    def _client_next(self, c: int) -> None:
        if self.now >= self.duration_ms:
            return
        r = self.rng
        key = r.choice(self.keys)
        kind = r.choices(["put", "get", "cas", "delete"], [4, 4, 2, 1])[0]
        value = f"c{c}-{len(self.ops)}".encode()
        expected = None
        if kind == "cas":
            # Expect a value that was written recently, or absence.
            seen = [o.value for o in self.ops[-10:] if o.key == key and o.kind == "put"]
            expected = r.choice(seen) if seen and r.random() < 0.8 else None
        op = SimOp(c, kind, key, value if kind in ("put", "cas") else None, expected, self.now)
        self.ops.append(op)
        op_id = len(self.ops) - 1
        candidates = self._alive()
        if not candidates:
            self._op_finish_retry(op_id, "failed")
            return
        # Like a real client: go to the leader it was last pointed at, else anywhere.
        guess = self.nodes.get(self.leader_guess.get(c, 0))
        node = (
            guess
            if guess is not None and guess.alive and r.random() < 0.9
            else r.choice(candidates)
        )
        try:
            if kind == "get":
                ctx = f"r{op_id}".encode()
                node.core.read_index(ctx)
                node.reads[ctx] = op_id
            else:
                command = node.sm.command(kind, key, value if kind != "delete" else None, expected)
                if self.batch_rate and r.random() < self.batch_rate:
                    # Held, like a proposal arriving while RaftNode's loop is busy; proposed
                    # with the others held at this server by one flush.
                    if not node.queue:
                        self.at(r.randint(1, self.batch_wait), partial(self._flush, node))
                    node.queue.append((op_id, command))
                    self.at(CLIENT_TIMEOUT_MS, lambda: self._client_timeout(op_id))
                    return
                data = ENVELOPE.pack(op_id) + command
                if node.core.role is not Role.LEADER and r.random() < 0.5:
                    node.core.forward([data])  # like RaftNode on a follower
                    node.forwarded.add(op_id)
                else:
                    index, term = node.core.propose([data])
                    node.pending[index] = Pending(op_id, index, term)
        except ProposalDropped as exc:
            self.leader_guess[c] = exc.leader
            self._op_finish_retry(op_id, "failed")
            return
        node.process()
        self.at(CLIENT_TIMEOUT_MS, lambda: self._client_timeout(op_id))

    def ops_of(self, eid: int) -> list[int]:
        """The client ops an entry's envelope id stands for."""
        return self.batch_ops[eid] if eid >= BATCH_IDS else [eid]

    def _flush(self, node: SimNode) -> None:
        """Propose (or, on a follower, maybe forward) the writes held at `node` as RaftNode's
        `_entry_data` does: consecutive commands up to BATCH_BYTES in one batch entry each, a
        lone command as a plain entry; all entries in one call."""
        if not node.alive or not node.queue:
            return  # a crash failed them, or an earlier flush took them
        queue, node.queue = node.queue, []
        eids: list[int] = []
        data: list[bytes] = []
        i = 0
        while i < len(queue):
            j = i + 1
            size = len(queue[i][1])
            while j < len(queue) and size + len(queue[j][1]) <= BATCH_BYTES:
                size += len(queue[j][1])
                j += 1
            if j == i + 1:
                eid, payload = queue[i]
            else:
                eid = next(self.batch_ids)
                self.batch_ops[eid] = [op_id for op_id, _ in queue[i:j]]
                self.n_batched_ops += j - i
                payload = pack_batch([command for _, command in queue[i:j]])
            eids.append(eid)
            data.append(ENVELOPE.pack(eid) + payload)
            i = j
        forward = node.core.role is not Role.LEADER and self.rng.random() < 0.5
        how = "forwards" if forward else "proposes"
        self.log(f"node {node.id} {how} {len(queue)} held writes as {len(data)} entries")
        try:
            if forward:
                node.core.forward(data)
                node.forwarded.update(eids)
            else:
                first, term = node.core.propose(data)
                for k, eid in enumerate(eids):
                    node.pending[first + k] = Pending(eid, first + k, term)
        except ProposalDropped as exc:
            for op_id, _ in queue:
                self.leader_guess[self.ops[op_id].client] = exc.leader
                self._op_finish_retry(op_id, "failed")
            return
        node.process()

    def _op_finish_retry(self, op_id: int, state: str) -> None:
        op = self.ops[op_id]
        if op.state != "pending":
            return
        op.state = state
        op.ret = self.now
        self.at(
            self.rng.randint(1, 50) if state == "done" else self.rng.randint(50, 300),
            lambda: self._client_next(op.client),
        )

    def op_done(self, op_id: int, output: object) -> None:
        op = self.ops[op_id]
        if op.state == "pending":
            op.output = output
            self._op_finish_retry(op_id, "done")

    def op_failed(self, op_id: int) -> None:
        self._op_finish_retry(op_id, "failed")

    def op_indeterminate(self, op_id: int) -> None:
        self._op_finish_retry(op_id, "indeterminate")

    def op_abandoned(self, op_id: int) -> None:
        # A read that never returned has no effect: drop it from the history.
        self._op_finish_retry(op_id, "failed")

    def _client_timeout(self, op_id: int) -> None:
        op = self.ops[op_id]
        if op.state == "pending":
            self._op_finish_retry(op_id, "failed" if op.kind == "get" else "indeterminate")


def run_seed(
    seed: int, *, verbose: bool = False, sm_factory: StateMachineFactory = MVCCMachine
) -> SimResult:
    """Run one seed; raises SimFailure (with the tail of the event log) on a violation."""
    sim = Simulation(seed, sm_factory=sm_factory, verbose=verbose)
    try:
        return sim.run()
    except SimFailure as exc:
        tail = "\n".join(sim.log_lines[-30:])
        raise SimFailure(f"seed {seed}: {exc}\n--- last events ---\n{tail}") from exc
    finally:
        for n in sim.nodes.values():
            n.sm.dispose()
