"""`EventCorrelator`: which write, if any, one recorded Event becomes; client-go's
EventCorrelator as a pure core (no I/O, no clock: `now` is passed in).

Theory of operation
-------------------
Events are the chattiest writes a controller or an agent makes, and each one is a key written
through Raft onto flash. `correlate(...)` takes one recorded Event and answers, in client-go's
order (`tools/record/events_cache.go`):

1. **Aggregate.** Events with the same source, involved object, type and reason but different
   messages are "similar". Once `max_similar` (10) distinct messages of one such group were
   seen, each within `window` (10 min) of the one before, the Event's message becomes
   `"(combined from similar events): <message>"` and its identity drops the message, so every
   further similar Event bumps one combined Event instead of creating another.
2. **Deduplicate.** An Event whose identity (source, involved object, type, reason, message)
   was written within `window` becomes `Bump`: the existing Event's `count` + 1 and a new
   `lastTimestamp` (a PATCH); otherwise `Create`.
3. **Filter spam.** Each (source, involved object) has a token bucket: `burst` (25) tokens,
   one more every `refill_seconds` (300 s). A write (create or bump) takes a token; without one
   the Event is dropped (`Drop`). A loop that records an Event every second about one object
   thus writes 25 times, then once every 5 minutes.

The caller writes what `correlate` answers and then reports the outcome: `created(...)` after
a create (the Event's namespace and name, for later bumps), `bumped(...)` after a bump,
`forget(...)` when the Event to bump is gone (a 404: the next one is created again).

Invariants: same inputs, same answers (no clock, no randomness); memory is bounded: each of the
three tables keeps at most `max_keys` entries, dropping the least recently used (a forgotten
entry only costs a create instead of a bump, or a fresh bucket).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TypeVar

__all__ = [
    "AGGREGATE_PREFIX",
    "Bump",
    "Create",
    "Drop",
    "EventCorrelator",
    "EventIdentity",
    "ObjectRef",
]

AGGREGATE_PREFIX = "(combined from similar events): "
DEFAULT_WINDOW = 600.0  # client-go: maxLru entries expire after 10 minutes
DEFAULT_MAX_SIMILAR = 10  # client-go: defaultAggregateMaxEvents
DEFAULT_BURST = 25  # client-go: defaultSpamBurst
DEFAULT_REFILL_SECONDS = 300.0  # client-go: defaultSpamQPS = 1/300
DEFAULT_MAX_KEYS = 4096  # client-go: maxLruCacheEntries

# (kind, apiVersion, namespace, name, uid) of the involved object.
ObjectRef = tuple[str, str, str, str, str]


@dataclass(frozen=True, slots=True)
class EventIdentity:
    """What makes two Events the same Event (one is bumped by the other)."""

    source: str  # component and host
    involved: ObjectRef
    type: str
    reason: str
    message: str  # "" for a combined (aggregated) Event: its identity has no message


@dataclass(frozen=True, slots=True)
class Create:
    """Write a new Event with this message (count 1); then call `created`."""

    identity: EventIdentity
    message: str


@dataclass(frozen=True, slots=True)
class Bump:
    """Patch the existing Event `namespace/name` to `count` and a new lastTimestamp; then call
    `bumped`, or `forget` if it is gone (and create one with `message` instead)."""

    identity: EventIdentity
    message: str
    namespace: str
    name: str
    count: int


@dataclass(frozen=True, slots=True)
class Drop:
    """Write nothing: the (source, object) pair spent its token bucket."""

    identity: EventIdentity


Decision = Create | Bump | Drop


@dataclass(slots=True)
class _Written:
    namespace: str
    name: str
    count: int
    last: float  # `now` of the last write


@dataclass(slots=True)
class _Similar:
    messages: dict[str, None]  # distinct messages seen (at most max_similar)
    last: float  # `now` of the last similar Event


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


K = TypeVar("K")
V = TypeVar("V")


def _touch(table: OrderedDict[K, V], key: K, value: V, limit: int) -> None:
    table[key] = value
    table.move_to_end(key)
    while len(table) > limit:
        table.popitem(last=False)


class EventCorrelator:
    """See the module docstring. Synchronous and deterministic; one per recorder."""

    def __init__(
        self,
        *,
        window: float = DEFAULT_WINDOW,
        max_similar: int = DEFAULT_MAX_SIMILAR,
        burst: int = DEFAULT_BURST,
        refill_seconds: float = DEFAULT_REFILL_SECONDS,
        max_keys: int = DEFAULT_MAX_KEYS,
    ) -> None:
        if window <= 0 or refill_seconds <= 0:
            raise ValueError("window and refill_seconds must be positive")
        if max_similar < 1 or burst < 1 or max_keys < 1:
            raise ValueError("max_similar, burst and max_keys must be at least 1")
        self.window = window
        self.max_similar = max_similar
        self.burst = burst
        self.refill_seconds = refill_seconds
        self.max_keys = max_keys
        self._written: OrderedDict[EventIdentity, _Written] = OrderedDict()
        self._similar: OrderedDict[tuple[str, ObjectRef, str, str], _Similar] = OrderedDict()
        self._buckets: OrderedDict[tuple[str, ObjectRef], _Bucket] = OrderedDict()

    def correlate(
        self, source: str, involved: ObjectRef, type: str, reason: str, message: str, now: float
    ) -> Decision:
        """The write one recorded Event becomes (module doc, steps 1-3)."""
        identity, message = self._aggregate(source, involved, type, reason, message, now)
        if not self._take_token(source, involved, now):
            return Drop(identity)
        seen = self._written.get(identity)
        if seen is not None and now - seen.last < self.window:
            return Bump(identity, message, seen.namespace, seen.name, seen.count + 1)
        return Create(identity, message)

    def created(self, decision: Create, namespace: str, name: str, now: float) -> None:
        """The Event of `decision` was created as `namespace/name`."""
        _touch(self._written, decision.identity, _Written(namespace, name, 1, now), self.max_keys)

    def bumped(self, decision: Bump, now: float) -> None:
        """The Event of `decision` was patched to its count."""
        written = _Written(decision.namespace, decision.name, decision.count, now)
        _touch(self._written, decision.identity, written, self.max_keys)

    def forget(self, identity: EventIdentity) -> None:
        """The Event written for `identity` is gone; the next one is created anew."""
        self._written.pop(identity, None)

    # ------------------------------------------------------------------ steps
    def _aggregate(
        self, source: str, involved: ObjectRef, type: str, reason: str, message: str, now: float
    ) -> tuple[EventIdentity, str]:
        group = (source, involved, type, reason)
        similar = self._similar.get(group)
        if similar is None or now - similar.last >= self.window:
            similar = _Similar({}, now)
        similar.last = now
        if message not in similar.messages and len(similar.messages) < self.max_similar:
            similar.messages[message] = None
        _touch(self._similar, group, similar, self.max_keys)
        if len(similar.messages) >= self.max_similar:
            return EventIdentity(source, involved, type, reason, ""), AGGREGATE_PREFIX + message
        return EventIdentity(source, involved, type, reason, message), message

    def _take_token(self, source: str, involved: ObjectRef, now: float) -> bool:
        key = (source, involved)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = _Bucket(float(self.burst), now)
        elapsed = max(0.0, now - bucket.at)
        bucket.tokens = min(float(self.burst), bucket.tokens + elapsed / self.refill_seconds)
        bucket.at = now
        _touch(self._buckets, key, bucket, self.max_keys)
        if bucket.tokens < 1.0:
            return False
        bucket.tokens -= 1.0
        return True
