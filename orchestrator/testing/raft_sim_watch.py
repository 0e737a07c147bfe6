"""The watch model of the Raft simulation (`raft_sim`): client watches on the simulated servers.

Every replica must emit the same events for a revision (watch safety, checked as each server
applies). A watcher is attached to one live server and receives the events that server applies
from its next revision on; when the server crashes or installs a snapshot (which skips the
events in between), the watcher is attached to a live server again and catches up from that
server's history (`events_since`), or, if that history was compacted, restarts at the current
revision as a real client re-lists. At the end every watcher must have received each revision
of its segments exactly once, in order, with the events every replica agreed on.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.raft.types import NodeId
from orchestrator.store.types import Compacted as StoreCompacted
from orchestrator.testing.raft_sim_node import SimFailure, SimNode

__all__ = ["WatchModel"]


@dataclass
class _SimWatcher:
    """A client watch: attached to one server, resumes on another (from its next revision,
    through the store's history) when that server crashes or installs a snapshot."""

    id: int
    node: NodeId
    next_rev: int
    start_rev: int
    received: list[tuple[int, Any]] = field(default_factory=list)
    segments: list[tuple[int, int]] = field(default_factory=list)  # closed (start, end) ranges


def _event_key(e: Any) -> Any:
    kv, prev = e.kv, e.prev_kv
    return (
        int(e.type),
        kv.key,
        kv.value,
        kv.create_revision,
        kv.mod_revision,
        kv.version,
        None if prev is None else (prev.value, prev.mod_revision),
    )


class WatchModel:
    def __init__(
        self,
        rng: random.Random,
        alive: Callable[[], list[SimNode]],
        nodes: dict[NodeId, SimNode],
        log: Callable[[str], None],
    ) -> None:
        self.rng = rng
        self.alive = alive
        self.nodes = nodes
        self.log = log
        # The committed events by revision (every replica must produce the same), and watchers
        # attached to servers that must see each revision once, in order.
        self.events_by_rev: dict[int, list[Any]] = {}
        self.watchers: list[_SimWatcher] = []

    def check_events(self, n: SimNode, events: list[Any]) -> None:
        """Every replica must emit the same events for a revision; attached watchers get them."""
        by_rev: dict[int, list[Any]] = {}
        for e in events:
            by_rev.setdefault(e.kv.mod_revision, []).append(_event_key(e))
        for rev, evs in by_rev.items():
            prev = self.events_by_rev.setdefault(rev, evs)
            if prev != evs:
                raise SimFailure(
                    f"watch safety: node {n.id} emitted {evs} at revision {rev}, "
                    f"another emitted {prev}"
                )
        for w in self.watchers:
            if w.node == n.id:
                for e in events:
                    if e.kv.mod_revision >= w.next_rev:
                        w.received.append((e.kv.mod_revision, _event_key(e)))
                if events:
                    w.next_rev = max(w.next_rev, events[-1].kv.mod_revision + 1)

    def attach(self, w: _SimWatcher) -> None:
        """(Re)attach a watcher to a live server and catch up from its history."""
        alive = self.alive()
        if not alive:
            w.node = 0
            return
        node = self.rng.choice(alive)
        w.node = node.id
        try:
            events = node.sm.events_since(w.next_rev)
        except StoreCompacted:
            # The history it needs is gone: a real client re-lists and watches anew.
            w.segments.append((w.start_rev, w.next_rev - 1))
            w.start_rev = w.next_rev = node.sm.revision() + 1
            self.log(f"watcher {w.id} restarted at {w.next_rev} (history compacted)")
            return
        for e in events:
            w.received.append((e.kv.mod_revision, _event_key(e)))
        if events:
            w.next_rev = events[-1].kv.mod_revision + 1

    def reattach(self, n: SimNode) -> None:
        """`n` crashed, or installed a snapshot (which skips the events in between): its
        watchers resume from their next revision on a live server."""
        for w in self.watchers:
            if w.node == n.id:
                self.attach(w)

    def start_watcher(self) -> None:
        alive = self.alive()
        if not alive or alive[0].sm.revision() == 0:
            return  # no servers, or a state machine without revisions
        node = self.rng.choice(alive)
        rev = node.sm.revision()
        start = self.rng.randint(max(1, rev - 20), rev + 1)
        w = _SimWatcher(len(self.watchers), node.id, start, start)
        self.watchers.append(w)
        self.attach(w)

    def check(self) -> None:
        for w in self.watchers:
            if w.node == 0 or not self.nodes[w.node].alive:
                self.attach(w)
            w.segments.append((w.start_rev, w.next_rev - 1))
            expected: list[tuple[int, Any]] = []
            for lo, hi in w.segments:
                for rev in range(max(lo, 2), hi + 1):
                    if rev not in self.events_by_rev:
                        raise SimFailure(f"watch: revision {rev} was never applied anywhere")
                    expected.extend((rev, ev) for ev in self.events_by_rev[rev])
            if w.received != expected:
                got = [r for r, _ in w.received]
                want = [r for r, _ in expected]
                raise SimFailure(
                    f"watch: watcher {w.id} saw revisions {got[:50]}... expected {want[:50]}..."
                )
