"""Watch fan-out: deliver the store's change events to many prefix watchers.

Theory of operation
-------------------
The apply loop calls `WatchHub.publish(events, revision)` after every applied batch. The hub
keeps the most recent events in a bounded in-memory *ring* and hands each new event to the
*synced* watchers whose prefix matches it. A watcher is in one of three states:

* **unsynced** (catching up): it needs events older than what the hub pushes live. Its
  consumer, inside `Watcher.__anext__`, pulls them itself, one batch per response: from the
  ring when the ring still covers the watcher's next revision, otherwise from the durable
  history (`HistorySource.events_since`, `replay_batch` events at a time). An unsynced watcher
  buffers nothing, so a slow reader costs no memory; it just reads at its own pace.
* **synced** (live): it has been handed every matching event up to the hub's revision;
  `publish` appends new matching events to its buffer (at most `buffer_limit` events).
* **ended**: canceled by the hub (compaction, slow consumer, `close`) — its consumer gets one
  final `canceled` response, then `StopAsyncIteration` — or by its owner (`cancel()`, leaving
  the `async with` block, or any exception, including `trio.Cancelled`, escaping `__anext__`).

The switch from unsynced to synced happens only while serving from the ring, in ONE synchronous
step (no checkpoint): the consumer takes the ring's last matching events and joins the live set
before any other task can run, so no event published meanwhile can be lost or duplicated.
Replaying from the durable history never switches directly: after each batch the watcher looks
again, and events published while `events_since` was awaited are simply found in the ring
(or, if the ring has already moved past them, in the next history batch).

A replay batch is trusted only up to `H0`, the hub's revision *before* the `events_since` call
(everything published up to `H0` was already applied, hence visible to the query; later
revisions may or may not be in its answer), and nothing above `H0` in it is used: it comes from
the ring or the next batch. Two kinds of source are handled (see `HistorySource.events_since`):
one that cuts the last revision short when exactly `limit` events come back, and one that only
returns whole revisions (possibly fewer than `limit` events with more to come, or more than
`limit` when one revision is bigger). So: an empty answer, or one reaching past `H0`, means
"complete up to `H0`"; a full answer (`limit` events or more) is trusted below its last
revision, which is read again (a full answer of one single revision is re-read with a doubled
limit); a shorter answer is trusted up to its last revision and the next read starts after it.

Invariants
----------
1. *Exactly once, in order, no gaps.* A watcher that is not canceled receives every event with
   `revision >= start_revision` whose key starts with its prefix, once, in revision order and,
   within a revision, in publish order. It never receives an event below its start revision,
   including for a watch on a future revision (etcd #20221): live delivery filters on
   `revision >= min_rev` and ring/history reads start at the watcher's next revision.
2. *Revisions never go back and never run ahead* (etcd #15271). Every response carries a
   revision R such that the watcher has received every matching event with revision <= R and
   none above R; R never decreases from one response to the next. A progress notification is
   sent only to a watcher with nothing pending (caught up and buffer empty), at the hub's
   revision.
3. *No silent loss* (etcd #17529, #18089). Events are never dropped to make room: a synced
   watcher that would exceed `buffer_limit` pending events is canceled ("watcher too slow"),
   and a watcher whose next revision is at or below the compaction revision is canceled with
   `cancel_reason="compacted"` and `compact_revision` set — also when the compaction happens
   during a replay (`events_since` raises `Compacted`). The client re-lists and watches again.
   Compaction is checked conservatively: `start_revision <= compact_revision` is refused even
   if some events are still available, since the deletes at those revisions may be gone.
4. *Bounded memory*: the ring holds at most `ring_size` events and `ring_bytes` bytes (whole
   revisions; it keeps the invariant that it contains every event with revision in
   `(ring floor, hub revision]`), and each synced watcher at most `buffer_limit` events;
   unsynced watchers buffer nothing; pending progress requests coalesce into one flag.
5. *publish never blocks* and costs O(events x distinct prefix lengths + deliveries): synced
   watchers are grouped by prefix and, for a key, only the groups `key[:L]` for the few
   distinct prefix lengths `L` in use are looked up; no watcher is scanned unless it matches.

The ring is the process's one in-memory copy of recent history. The MVCC store kept a second
ring of the same events for `events_since`; it was removed after a measurement: in `orchestrator
bench reconcile --nodes 100 --pods 3000` the hub asked the store for history 0 times (this ring
covered every watcher), so that ring only cost memory. Two other bounded caches are fed by the
same applies but are not histories: `store.recent.RecentValues` (the live value by key, for
local reads) and `apiserver.storage.Decoded` (decoded objects by key and revision); their
docstrings say why each is kept.

Contract with the caller: `publish` is called after the batch's events are visible to
`HistorySource.events_since`, with strictly increasing event revisions (never below the hub's
current revision), and all events of one revision in a single call. The hub starts at
`source.current_revision()` when it is constructed.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol, final

import trio

from orchestrator.store.types import Compacted, Event
from orchestrator.store.watch_registry import WatcherRegistry

__all__ = ["HistorySource", "WatchHub", "WatchResponse", "Watcher"]

CANCEL_COMPACTED = "compacted"
RING_MAX_BYTES = 64 * 1024**2  # the ring's default byte budget


class HistorySource(Protocol):
    """The durable event history (implemented by the store over MVCCStore on its DB thread)."""

    async def events_since(self, revision: int, prefix: str, limit: int) -> list[Event]:
        """Events with `revision >= revision` whose key starts with `prefix`, in revision order
        (and the publish order within a revision), oldest first, about `limit` of them: either
        a prefix of that sequence cut at exactly `limit` events (possibly in the middle of a
        revision), or whole revisions only (fewer than `limit` when the next revision does not
        fit, more when the first revision alone is bigger). An empty list means there is none
        up to the current revision. Raises `Compacted` if `revision <= compact_revision()`.
        `MVCCStore.events_since` is of the second kind."""
        ...

    def current_revision(self) -> int: ...

    def compact_revision(self) -> int: ...


@dataclass(frozen=True)
class WatchResponse:
    """One message to a watcher.

    `revision` is the store revision the watcher is brought up to: it has now received every
    matching event with revision <= `revision` (and none above)."""

    events: list[Event]
    revision: int
    progress: bool = False
    canceled: bool = False
    cancel_reason: str = ""
    compact_revision: int = 0


def event_bytes(ev: Event) -> int:
    """An event's bytes as the ring's budget counts them: key, value and previous value."""
    return len(ev.kv.key) + len(ev.kv.value) + (0 if ev.prev_kv is None else len(ev.prev_kv.value))


def _rev(event: Event) -> int:
    return event.kv.mod_revision


def _slow_reason(behind: int) -> str:
    return f"watcher too slow: {behind} events behind; re-list and watch again"


@final
class Watcher:
    """An async iterator of `WatchResponse`s; also an async context manager that cancels on exit.

    Create with `WatchHub.watch`. One task at a time may iterate it (`trio.BusyResourceError`
    otherwise). Any exception escaping `__anext__` (e.g. the consumer task being cancelled)
    ends the watch and removes it from the hub.
    """

    _ids = itertools.count(1)

    def __init__(
        self,
        hub: WatchHub,
        prefix: str,
        start_revision: int,
        *,
        progress_notify: bool,
        prev_kv: bool,
    ) -> None:
        self.id = next(Watcher._ids)
        self.prefix = prefix
        self.start_revision = start_revision  # effective start (a 0 "from now" is resolved)
        self.progress_notify = progress_notify
        self.prev_kv = prev_kv
        self._hub = hub
        # Unsynced: the next revision to read. Synced: the lowest revision accepted live
        # (above the hub's revision only for a watch on a future revision).
        self._next_rev = start_revision
        self._synced = False
        self._buffer: deque[Event] = deque()  # only a synced watcher's; <= buffer_limit
        self._final: WatchResponse | None = None  # the canceled response still to deliver
        self._ended = False  # no more responses (final delivered or canceled by the owner)
        self._progress_pending = False
        self._delivered = min(start_revision - 1, hub._revision)  # R of the last response
        self._lot = trio.lowlevel.ParkingLot()
        self._busy = False
        self._replayed = False  # counted once in statistics()["replays"]

    def __repr__(self) -> str:
        state = "ended" if self._ended or self._final else "synced" if self._synced else "unsynced"
        return f"<Watcher {self.id} prefix={self.prefix!r} start={self.start_revision} {state}>"

    @property
    def canceled(self) -> bool:
        return self._ended or self._final is not None

    # ---------------------------------------------------------------- consumer side
    def __aiter__(self) -> Watcher:
        return self

    async def __aenter__(self) -> Watcher:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cancel()

    async def __anext__(self) -> WatchResponse:
        if self._busy:
            raise trio.BusyResourceError("another task is already reading this watcher")
        self._busy = True
        try:
            return await self._next()
        except StopAsyncIteration:
            raise
        except BaseException:
            self.cancel()
            raise
        finally:
            self._busy = False

    def cancel(self) -> None:
        """End the watch now: the hub forgets it, iteration stops (no canceled response)."""
        if self._ended:
            return
        self._hub._detach(self)
        self._ended = True
        self._final = None
        self._buffer.clear()
        self._lot.unpark_all()

    async def _next(self) -> WatchResponse:
        await trio.lowlevel.checkpoint()
        hub = self._hub
        while True:
            if self._ended:
                raise StopAsyncIteration
            if self._final is not None:
                final, self._final = self._final, None
                self._ended = True
                return final
            if self._buffer:
                # Synced and drained: every matching event up to the hub's revision is here.
                events = list(self._buffer)
                self._buffer.clear()
                return self._respond(events, hub._revision)
            if not self._synced:
                response = await self._catch_up()
                if response is not None:
                    return response
                continue
            if self._progress_pending:
                self._progress_pending = False
                return self._respond([], hub._revision, progress=True)
            await self._lot.park()

    def _respond(
        self, events: list[Event], revision: int, *, progress: bool = False
    ) -> WatchResponse:
        self._delivered = revision
        if not self.prev_kv:
            events = [Event(e.type, e.kv) if e.prev_kv is not None else e for e in events]
        return WatchResponse(events, revision, progress=progress)

    async def _catch_up(self) -> WatchResponse | None:
        """One catch-up step: a response, or None (synced without events, or ended)."""
        hub = self._hub
        if self._next_rev > hub._ring_floor:
            events = hub._serve_from_ring(self)
            if not events:
                return None
            return self._respond(events, hub._revision if self._synced else self._next_rev - 1)

        compact = hub._source.compact_revision()
        if self._next_rev <= compact:
            hub._end(self, hub._compacted_response(self, compact))
            return None
        if not self._replayed:
            self._replayed = True
            hub._replays += 1
        h0 = hub._revision  # every revision <= h0 is visible to the query below
        start = self._next_rev
        limit = hub._replay_batch
        while True:
            hub._replay_batches += 1
            try:
                batch = await hub._source.events_since(start, self.prefix, limit)
            except Compacted as exc:
                if not self.canceled:
                    hub._end(self, hub._compacted_response(self, exc.compact_revision))
                return None
            if self.canceled:
                return None
            if not batch or _rev(batch[-1]) > h0:
                end = h0 + 1  # nothing more, or the batch runs past h0: complete up to h0
            elif _rev(batch[-1]) < start:
                raise RuntimeError(
                    f"history source returned revision {_rev(batch[-1])} for a read from "
                    f"revision {start}"
                )
            elif len(batch) >= limit:
                end = _rev(batch[-1])  # exclusive: that revision may be cut short
                if end <= start:  # one revision as big as the batch: read it whole
                    limit *= 2
                    continue
            else:
                # Whole revisions up to the last one; a source that never splits a revision
                # may stop short of `limit` with more to come, so ask again from there.
                end = _rev(batch[-1]) + 1
            break
        prefix = self.prefix
        events = [e for e in batch if start <= _rev(e) < end and e.kv.key.startswith(prefix)]
        self._next_rev = end
        if not events:
            return None
        return self._respond(events, end - 1)

    # ---------------------------------------------------------------- hub side
    def _push(self, events: list[Event]) -> None:
        behind = len(self._buffer) + len(events)
        if behind > self._hub._buffer_limit:
            self._hub._cancelled_slow += 1
            self._hub._end(
                self,
                WatchResponse(
                    [], self._delivered, canceled=True, cancel_reason=_slow_reason(behind)
                ),
            )
            return
        self._buffer.extend(events)
        self._lot.unpark_all()

    def _request_progress(self) -> None:
        if not self._progress_pending:
            self._progress_pending = True
            self._lot.unpark_all()


@final
class WatchHub:
    """Fans the store's events out to prefix watchers (see the module docstring).

    Args:
        source: the durable history, for watchers starting before the ring.
        ring_size: recent events kept in memory; watchers starting within it never touch the
            database. Size it to cover a few seconds of writes at peak.
        ring_bytes: the ring's byte budget (keys and values, `event_bytes`): fewer events are
            kept when they are big (a value can be 1.5 MiB).
        buffer_limit: events a live watcher may have pending before it is canceled as too slow.
        replay_batch: events per `events_since` call (and per catch-up response).
        progress_interval: seconds between periodic progress notifications (sent by `run()` to
            watchers created with `progress_notify=True`).
    """

    def __init__(
        self,
        source: HistorySource,
        *,
        ring_size: int = 10_000,
        ring_bytes: int = RING_MAX_BYTES,
        buffer_limit: int = 1_000,
        replay_batch: int = 500,
        progress_interval: float = 5.0,
    ) -> None:
        if ring_size < 0 or buffer_limit < 1 or replay_batch < 1 or progress_interval <= 0:
            raise ValueError(
                "need ring_size >= 0, buffer_limit >= 1, replay_batch >= 1, progress_interval > 0"
            )
        self._source = source
        self._ring_size = ring_size
        self._ring_max_bytes = ring_bytes
        self._buffer_limit = buffer_limit
        self._replay_batch = replay_batch
        self._progress_interval = progress_interval
        self._revision = source.current_revision()  # last published store revision
        # The ring: events [head:] with their revisions (parallel lists, for bisect). It holds
        # every event with revision in (_ring_floor, _revision], whole revisions only.
        self._ring_events: list[Event] = []
        self._ring_revs: list[int] = []
        self._ring_head = 0
        self._ring_bytes = 0  # Σ event_bytes of the events [head:]
        self._ring_floor = self._revision
        self._reg: WatcherRegistry[Watcher] = WatcherRegistry()
        self._closed: str | None = None
        self._closed_event = trio.Event()
        self._cancelled_slow = 0
        self._replays = 0
        self._replay_batches = 0

    # ---------------------------------------------------------------- public API
    @property
    def revision(self) -> int:
        """The last published store revision."""
        return self._revision

    def watch(
        self,
        prefix: str,
        start_revision: int = 0,
        *,
        progress_notify: bool = False,
        prev_kv: bool = True,
    ) -> Watcher:
        """Watch keys starting with `prefix` from `start_revision` (0 = from the next revision).

        A start at or below the compaction revision gives a watcher whose only response is
        canceled with `cancel_reason="compacted"`; a start in the future waits for it."""
        if start_revision < 0:
            raise ValueError(f"start_revision must be >= 0, got {start_revision}")
        start = start_revision or self._revision + 1
        w = Watcher(self, prefix, start, progress_notify=progress_notify, prev_kv=prev_kv)
        if self._closed is not None:
            w._final = WatchResponse([], w._delivered, canceled=True, cancel_reason=self._closed)
            return w
        compact = self._source.compact_revision()
        if start_revision and start <= compact:
            w._final = self._compacted_response(w, compact)
            return w
        if progress_notify:
            self._reg.progress[w] = None
        if start > self._revision:
            self._join(w)  # nothing to catch up on: live right away (maybe in the future)
        else:
            self._reg.unsynced[w] = None
        return w

    def publish(self, events: Sequence[Event], revision: int) -> None:
        """Record an applied batch and hand its events to the matching live watchers.

        `events` in revision order, all above the previous revision and at most `revision`
        (the store revision after the batch, which may advance with no events). Never blocks."""
        if self._closed is not None:
            return
        prev = self._revision
        last = prev
        for e in events:
            r = _rev(e)
            if r < last or r <= prev or r > revision:
                raise ValueError(
                    f"event revision {r} out of order (hub at {prev}, batch up to {revision})"
                )
            last = r
        if revision < prev:
            raise ValueError(f"revision going back: {revision} < {prev}")
        self._revision = revision
        if events:
            self._ring_events.extend(events)
            self._ring_revs.extend(_rev(e) for e in events)
            self._ring_bytes += sum(event_bytes(e) for e in events)
            self._evict()
        if not events or not self._reg.groups:
            return
        deliveries: dict[Watcher, list[Event]] = {}
        groups = self._reg.groups
        lens = self._reg.lens
        for e in events:
            key = e.kv.key
            r = _rev(e)
            for n in lens:
                if n > len(key):
                    break
                group = groups.get(key[:n])
                if group is None:
                    continue
                for w in group:
                    if r >= w._next_rev:
                        batch = deliveries.get(w)
                        if batch is None:
                            deliveries[w] = [e]
                        else:
                            batch.append(e)
        for w, batch in deliveries.items():
            w._push(batch)

    def notify_progress(self) -> None:
        """Ask every watcher for a progress response at its caught-up revision (a bookmark).
        A catching-up watcher sends it once it has caught up."""
        for w in self._all():
            w._request_progress()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Send periodic progress notifications until `close()` (or cancellation)."""
        task_status.started()
        deadline = trio.current_time()
        while self._closed is None:
            deadline += self._progress_interval
            with trio.move_on_at(deadline):
                await self._closed_event.wait()
            if self._closed is not None:
                return
            for w in list(self._reg.progress):
                w._request_progress()

    def close(self, reason: str = "watch hub closed") -> None:
        """Cancel every watcher (each gets a canceled response with `reason`); later watches
        are canceled at once and later publishes ignored."""
        if self._closed is not None:
            return
        self._closed = reason
        for w in self._all():
            self._end(w, WatchResponse([], w._delivered, canceled=True, cancel_reason=reason))
        self._ring_events.clear()
        self._ring_revs.clear()
        self._ring_head = 0
        self._ring_bytes = 0
        self._ring_floor = self._revision
        self._closed_event.set()

    def statistics(self) -> dict[str, Any]:
        return {
            "watchers": len(self._reg.unsynced) + sum(len(g) for g in self._reg.groups.values()),
            "synced": sum(len(g) for g in self._reg.groups.values()),
            "unsynced": len(self._reg.unsynced),
            "prefixes": len(self._reg.groups),
            "revision": self._revision,
            "ring_start_revision": self._ring_floor + 1,  # every event from here is in the ring
            "ring_end_revision": self._revision,
            "ring_events": len(self._ring_revs) - self._ring_head,
            "ring_bytes": self._ring_bytes,
            "buffered_events": sum(len(w._buffer) for g in self._reg.groups.values() for w in g),
            "cancelled_slow": self._cancelled_slow,
            "replays": self._replays,
            "replay_batches": self._replay_batches,
            "closed": self._closed is not None,
        }

    # ---------------------------------------------------------------- internals
    def _all(self) -> list[Watcher]:
        out = list(self._reg.unsynced)
        for group in self._reg.groups.values():
            out.extend(group)
        return out

    def _evict(self) -> None:
        """Drop the oldest events beyond `ring_size` or the byte budget, whole revisions only
        (each event's bytes are subtracted once: amortized O(1) per event)."""
        revs = self._ring_revs
        evs = self._ring_events
        head = self._ring_head
        n = len(revs)
        cut = max(head, n - self._ring_size)
        size = self._ring_bytes - sum(event_bytes(e) for e in evs[head:cut])
        while size > self._ring_max_bytes and cut < n:
            size -= event_bytes(evs[cut])
            cut += 1
        if cut > head:
            floor = revs[cut - 1]
            while cut < n and revs[cut] == floor:  # drop whole revisions only
                size -= event_bytes(evs[cut])
                cut += 1
            self._ring_floor = floor
            head = cut
        self._ring_bytes = size
        if head > 1024 and head * 2 > n:
            del self._ring_events[:head]
            del revs[:head]
            head = 0
        self._ring_head = head

    def _serve_from_ring(self, w: Watcher) -> list[Event]:
        """Next catch-up batch of `w` from the ring (`w._next_rev > _ring_floor`). Reaching the
        ring's end makes `w` synced in the same synchronous step."""
        revs = self._ring_revs
        ring = self._ring_events
        i = bisect_left(revs, w._next_rev, self._ring_head)
        n = len(revs)
        limit = self._replay_batch
        prefix = w.prefix
        out: list[Event] = []
        while i < n:
            r = revs[i]
            if len(out) >= limit and r != revs[i - 1]:
                w._next_rev = r
                return out
            e = ring[i]
            if e.kv.key.startswith(prefix):
                out.append(e)
            i += 1
        w._next_rev = max(w._next_rev, self._revision + 1)
        self._reg.unsynced.pop(w, None)
        self._join(w)
        return out

    def _join(self, w: Watcher) -> None:
        w._synced = True
        self._reg.add_synced(w)

    def _detach(self, w: Watcher) -> None:
        self._reg.unsynced.pop(w, None)
        self._reg.remove_synced(w)
        self._reg.progress.pop(w, None)

    def _end(self, w: Watcher, response: WatchResponse) -> None:
        """Cancel `w` from the hub's side: `response` is its last."""
        self._detach(w)
        w._buffer.clear()
        w._final = response
        w._lot.unpark_all()

    def _compacted_response(self, w: Watcher, compact_revision: int) -> WatchResponse:
        return WatchResponse(
            [],
            w._delivered,
            canceled=True,
            cancel_reason=CANCEL_COMPACTED,
            compact_revision=compact_revision,
        )
