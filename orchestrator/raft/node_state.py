"""A Raft server's configuration and the driver's fields (the bottom layer of `RaftNode`).

`RaftNode` is built in layers, each calling only itself and the ones below: `NodeState` (this
module: `NodeConfig` and the fields every step uses, with their invariants) <- `ReadyHandler`
(`node_ready`: one `Ready` through persist, send, apply, snapshot) <- `RaftNode` (`node`: the
public API, the loop that owns the core, requests). See `orchestrator.raft.node` for the
theory of operation.
"""

from __future__ import annotations

import itertools
import os
import random
import struct
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from orchestrator.dbthread import DbThread
from orchestrator.raft.core import RaftCore
from orchestrator.raft.statemachine import AppliesNow, StateMachine
from orchestrator.raft.storage import RaftStorage
from orchestrator.raft.transport import Address, Faults, PeerTLS, PeerTransport
from orchestrator.raft.types import (
    Message,
    NodeId,
    Snapshot,
    SnapshotMeta,
)
from orchestrator.raft.waiters import Waiter


def parse_addr(text: str) -> Address:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"address {text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


@dataclass
class NodeConfig:
    node_id: NodeId
    data_dir: Path
    peer_listen: str  # HOST:PORT this server listens on for peers (port 0 = any)
    advertise: str | None = None  # HOST:PORT peers use to reach us (default: peer_listen)
    founders: dict[NodeId, str] = field(default_factory=dict)  # a new cluster's voters
    tick_interval: float = 0.1
    election_tick: int = 10
    # Heartbeats every 2 ticks (200 ms), elections after 10-20 ticks: 5-10 heartbeats per
    # election timeout. The heartbeats were nearly all of an idle site's CPU (each one a TLS
    # record, a few task switches and a loop turn on both ends): every tick, a server took about
    # 1.3 % of a core, every other tick 0.7 %. A lone write's commit does not wait for them (the
    # leader sends the new commit index at once), and a killed leader is found by its closed
    # connections, not by missed heartbeats.
    heartbeat_tick: int = 2
    snapshot_every: int = 10_000  # applied entries between snapshots
    keep_tail: int = 5_000  # entries kept after a snapshot for slow followers
    # The same two bounds in bytes of entry data: batch entries can be 256 KiB each, so counting
    # entries alone would let the log (kept in memory too) grow to gigabytes.
    snapshot_every_bytes: int = 32 * 1024 * 1024
    keep_tail_bytes: int = 16 * 1024 * 1024
    max_inflight: int = 4  # appends in flight per follower; fewer, bigger batches cost less CPU
    seed: int | None = None
    faults: Faults | None = None
    # Mutual TLS on the peer port (`transport.PeerTLS`); every server sets it. None: plain TCP,
    # for in-process tests and benchmarks only.
    peer_tls: PeerTLS | None = None


ENVELOPE = struct.Struct("!QQ")  # origin node id, request id


class NodeState:
    """The driver's fields; `RaftNode` documents the constructor's arguments."""

    def __init__(
        self,
        cfg: NodeConfig,
        state_machine: Callable[[Path], StateMachine[Any]],
        *,
        on_apply: Callable[[Sequence[Any]], None] | None = None,
        on_snapshot: Callable[[], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self._on_apply = on_apply
        self._on_snapshot = on_snapshot
        self.id = cfg.node_id
        self._sm_factory = state_machine
        self._rng = random.Random(cfg.seed)
        self._raft_db = DbThread()
        self._sm_db = DbThread()
        self.storage: RaftStorage
        self.sm: StateMachine[Any]
        self.core: RaftCore
        self.transport: PeerTransport
        self.peers: dict[NodeId, str] = {}
        self._snapshot = Snapshot(SnapshotMeta())
        self._wake = trio.Event()
        self._inbox: list[Message] = []
        self._requests: list[tuple[str, Any, Waiter]] = []
        # The due time of the tick waiting for the loop (None: none waits). At most one waits:
        # ticks are coalesced, so a busy loop delays elections rather than triggering them.
        self._tick_due: float | None = None
        self.ticks = 0  # ticks the core was given
        # The latest a tick reached the core after its due time, in seconds (trio's clock), as
        # `raft_tick_lateness_seconds` observes every tick.
        self.tick_lateness_max = 0.0
        # Peers the transport saw go away, each with the count of messages it had received by
        # then; reported to the core once that many have been stepped (`_step_inbox`).
        self._peers_down: deque[tuple[NodeId, int]] = deque()
        self._stepped = 0  # messages taken from the transport and stepped into the core
        # Normal proposals carry an envelope (origin node id, request id) so the proposer
        # recognises its entry when applied, also when a follower forwarded it to the leader.
        # Request ids start at a random point so that entries replayed after a restart can
        # never be mistaken for new requests.
        self._rid = itertools.count(int.from_bytes(os.urandom(7), "big"))
        self._waiters: dict[int, Waiter] = {}  # request id -> waiter
        self._batches = False  # pack proposals that arrive together (see statemachine.py)
        self._applies_now: AppliesNow[Any] | None = None  # self.sm, if it can (statemachine.py)
        self._applied_bytes = 0  # entry data applied since the last snapshot
        self._by_index: dict[int, tuple[int, int]] = {}  # index -> (term, request id), leader only
        self._conf_waiters: dict[int, tuple[int, Waiter]] = {}  # index -> (term, waiter)
        self.auto_promote: set[NodeId] = set()  # learners to promote once caught up
        self._reads: dict[bytes, Waiter] = {}  # read context -> waiter (before ReadState)
        self._read_waits: list[tuple[int, Waiter]] = []  # (read index, waiter)
        # Read contexts must be unique across the cluster (the leader keys pending ReadIndex
        # requests by context, followers' and its own alike) and across restarts (an answer to
        # an earlier incarnation's request must not release a newer one): node id, a random
        # per-process tag, a counter.
        self._ctx_prefix = b"%d:%s:" % (self.id, os.urandom(4).hex().encode())
        self._ctx = itertools.count(1)
        self._applied_event = trio.Event()
        self._sm_applied = 0
        self._db_bytes = 0
        self.leader_changes = 0
        # (last index, proposals, perf_counter at append) of the leader's proposal batches not
        # yet applied, oldest first: raft_commit_duration_seconds.
        self._commit_clock: deque[tuple[int, int, float]] = deque()
        self._role_changed = trio.Event()  # set (and replaced) when role, leader or term change
