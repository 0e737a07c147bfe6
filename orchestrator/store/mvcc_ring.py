"""The MVCC store's ring of recent events, which serves `events_since` for recent revisions
without touching SQLite.

The ring holds the events of the last applied writes in (revision, key) order and is complete
for every revision at or above its `floor`: a read from there on needs no database. It keeps
`size` events at least (fewer if they exceed a byte budget, `RING_MAX_BYTES`): appends are
amortized O(1), dropping the oldest events in bulk once the ring holds twice its size (or its
budget). A restore empties it (`reset`): from then on it is complete from the next revision.

Why the store keeps a ring although the watch hub (store/watch.py) keeps one too: the hub's
ring lives on the trio thread and serves live watchers; this one lives with the database, on
its thread, and serves the hub's catch-up reads (`events_since`) that the hub's ring no
longer covers, and every other caller of `events_since` (the simulation's watchers).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from orchestrator.store.types import Event

RING_MAX_BYTES = 64 * 1024**2  # byte budget of the event ring (values can be 1.5 MiB)


class EventRing:
    def __init__(self, size: int) -> None:
        self.size = max(0, size)
        # Recent events in (revision, key) order; complete for every revision >= floor.
        self.events: list[Event] = []
        self.bytes = 0  # Σ event_bytes over the ring
        self.floor = 2

    def reset(self, revision: int) -> None:
        """Empty: complete from the revision after `revision` on."""
        self.events = []
        self.bytes = 0
        self.floor = revision + 1

    def covers(self, revision: int) -> bool:
        return bool(self.size) and revision >= self.floor

    def since(self, revision: int, prefix: str, limit: int) -> list[Event]:
        """As `MVCCStore.events_since`, for a revision the ring `covers`."""
        ring = self.events
        start = bisect.bisect_left(ring, revision, key=lambda ev: ev.kv.mod_revision)
        return take_whole_revisions(
            (ev for ev in ring[start:] if ev.kv.key.startswith(prefix)), limit
        )

    def extend(self, events: list[Event]) -> None:
        """Append to the ring; past 2x its event count or its byte budget, drop the oldest
        events in bulk (amortized O(1) per event) down to 1x / half the budget."""
        if not self.size:
            return
        ring = self.events
        ring.extend(events)
        self.bytes += sum(event_bytes(ev) for ev in events)
        if len(ring) <= 2 * self.size and self.bytes <= RING_MAX_BYTES:
            return
        cut = max(0, len(ring) - self.size)
        dropped = sum(event_bytes(ev) for ev in ring[:cut])
        while cut < len(ring) and self.bytes - dropped > RING_MAX_BYTES // 2:
            dropped += event_bytes(ring[cut])
            cut += 1
        if cut:
            self.floor = ring[cut - 1].kv.mod_revision + 1
            del ring[:cut]
            self.bytes -= dropped


def take_whole_revisions(events: Iterable[Event], limit: int) -> list[Event]:
    """Up to `limit` events (0 = all) ending at a revision boundary; a first revision with more
    than `limit` events is returned whole. `events` must hold every event of each revision it
    reaches into (up to MAX_TXN_OPS past the limit)."""
    out: list[Event] = []
    for ev in events:
        if limit > 0 and len(out) >= limit and ev.kv.mod_revision != out[-1].kv.mod_revision:
            break
        out.append(ev)
    if limit > 0 and len(out) > limit:
        last = out[-1].kv.mod_revision
        cut = len(out)
        while cut > 0 and out[cut - 1].kv.mod_revision == last:
            cut -= 1
        if cut > 0:
            del out[cut:]
    return out


def event_bytes(ev: Event) -> int:
    return len(ev.kv.key) + len(ev.kv.value) + (0 if ev.prev_kv is None else len(ev.prev_kv.value))
