"""Network faults for tests: `FaultInjector` decides, per Raft message, whether it is delivered,
how many times and after what delay (drops, duplicates, delays, partitions, isolation).

It plugs into `raft.transport.PeerTransport(faults=...)` (the transport's `Faults` protocol) and
into the deterministic simulation (`testing.raft_sim`); a server started with
`--enable-fault-injection` carries one that the client port's "faults" op steers. Faults act on
the sending side only, so one injector can be shared by every transport of a test cluster.
"""

from __future__ import annotations

import math
import random

from orchestrator.raft.types import Message, NodeId

__all__ = ["FaultInjector"]


class FaultInjector:
    """Test hook deciding, per message, how many copies are delivered and after what delay.

    `plan` is pure apart from consuming `rng`, so a seeded rng and the same sequence of calls
    reproduce the same faults. The rng is consumed only for active faults (one draw for a drop
    decision if `drop_rate > 0`, one for duplication if `dup_rate > 0`, one per copy if the delay
    range is non-zero).

    Partitions: with `partition(*groups)` active, a message flows iff some group contains both
    its sender and its receiver (groups may overlap to model a bridge node; a node in no group is
    cut off). `isolate(n)` additionally cuts n off from everyone. `heal` clears all faults.
    """

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self._drop_rate = 0.0
        self._dup_rate = 0.0
        self._delay: tuple[float, float] = (0.0, 0.0)
        self._groups: tuple[frozenset[NodeId], ...] | None = None
        self._isolated: set[NodeId] = set()

    @property
    def drop_rate(self) -> float:
        return self._drop_rate

    @drop_rate.setter
    def drop_rate(self, value: float) -> None:
        self._drop_rate = _probability(value, "drop_rate")

    @property
    def dup_rate(self) -> float:
        return self._dup_rate

    @dup_rate.setter
    def dup_rate(self, value: float) -> None:
        self._dup_rate = _probability(value, "dup_rate")

    @property
    def delay(self) -> tuple[float, float]:
        return self._delay

    @delay.setter
    def delay(self, value: tuple[float, float]) -> None:
        lo, hi = float(value[0]), float(value[1])
        if not (0.0 <= lo <= hi < math.inf):
            raise ValueError(f"delay must be a finite range 0 <= lo <= hi, got {value!r}")
        self._delay = (lo, hi)

    def partition(self, *groups: set[NodeId]) -> None:
        """Replace any partition: from now on messages only flow inside a group."""
        self._groups = tuple(frozenset(g) for g in groups)

    def isolate(self, node_id: NodeId) -> None:
        self._isolated.add(node_id)

    def heal(self) -> None:
        """Clear partitions, isolation, drop and duplication rates and delay."""
        self._groups = None
        self._isolated.clear()
        self._drop_rate = 0.0
        self._dup_rate = 0.0
        self._delay = (0.0, 0.0)

    def allows(self, frm: NodeId, to: NodeId) -> bool:
        """Whether the network topology (partitions, isolation) lets frm reach to."""
        if frm in self._isolated or to in self._isolated:
            return False
        if self._groups is None:
            return True
        return any(frm in g and to in g for g in self._groups)

    def plan(self, msg: Message) -> list[float]:
        """Delays (seconds) after which copies of msg are delivered; [] means dropped."""
        if not self.allows(msg.frm, msg.to):
            return []
        if self._drop_rate > 0.0 and self.rng.random() < self._drop_rate:
            return []
        copies = 2 if self._dup_rate > 0.0 and self.rng.random() < self._dup_rate else 1
        lo, hi = self._delay
        if hi == 0.0:
            return [0.0] * copies
        return [self.rng.uniform(lo, hi) for _ in range(copies)]


def _probability(value: float, what: str) -> float:
    v = float(value)
    if not 0.0 <= v <= 1.0:
        raise ValueError(f"{what} must be in [0, 1], got {value!r}")
    return v
