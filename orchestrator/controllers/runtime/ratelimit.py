"""Rate limiters for the work queue: small, composable, pure objects (client-go's
`util/workqueue/default_rate_limiters.go`).

Theory of operation
-------------------
A rate limiter answers one question: "this item failed (again); how long until it may be retried?"

    delay = limiter.when(item, now)     # records one more failure of `item`, returns seconds
    limiter.num_requeues(item)          # failures recorded since the last forget
    limiter.forget(item)                # the item succeeded: clear its history

`when` is not a query: it *records* (a failure for per-item limiters, a reserved slot for the
token bucket), so call it once per retry. Time is passed in (`now`, seconds on any monotonic
base); nothing here sleeps, reads a clock or uses randomness, so every sequence of delays is
reproducible in a unit test. The work queue calls `when` from `add_rate_limited` and `forget`
from the controller's success path (see `workqueue.py`).

Limiters
--------
* `ItemExponential(base, cap)`: per item, `base * 2**failures`, capped; the count survives
  until `forget`. Default 5 ms → 1000 s (5, 10, 20 ms … 655 s at the 18th failure, then 1000 s).
* `TokenBucket(qps, burst, max_delay)`: one bucket for all items (golang.org/x/time/rate
  semantics): `burst` retries pass immediately, then one every `1/qps` seconds; each `when`
  *reserves* the next slot, even far in the future.
* `ItemFastSlow(fast, slow, max_fast_attempts)`: `fast` for the first attempts, then `slow`.
* `MaxOf(*limiters)`: the largest delay of all (every limiter records the failure).
* `WithMaxWait(limiter, max_wait)`: caps another limiter's delay.

`default_controller_rate_limiter()` is client-go's `DefaultTypedControllerRateLimiter`:
`MaxOf(ItemExponential(0.005, 1000), TokenBucket(10, 100))`, with each number configurable.

Known pathology (kubernetes#104554): the bucket keeps reserving. 10,000 items rate-limited at
once leave the tail ~1000 s (10 qps) behind, and every later retry queues behind that debt, even
an item whose own exponential delay is 5 ms. `TokenBucket(max_delay=...)` caps it: no
reservation is more than `max_delay` ahead, and the bucket never owes more than `max_delay`
worth of tokens, so the limiter recovers within `max_delay` of the storm. The price: while the
bucket is at its cap the global rate is not enforced (items beyond it all wait `max_delay`).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Protocol

__all__ = [
    "ItemExponential",
    "ItemFastSlow",
    "MaxOf",
    "RateLimiter",
    "TokenBucket",
    "WithMaxWait",
    "default_controller_rate_limiter",
]


class RateLimiter(Protocol):
    """How long an item waits before its next retry. Pure: `now` is passed in, nothing sleeps."""

    def when(self, item: Hashable, now: float) -> float:
        """Record one more retry of `item` at time `now`; return the delay in seconds (>= 0)."""
        ...

    def forget(self, item: Hashable) -> None:
        """Clear the retry history of `item` (it succeeded, or was given up on)."""
        ...

    def num_requeues(self, item: Hashable) -> int:
        """How many retries of `item` were recorded since the last `forget`."""
        ...


def _check_non_negative(name: str, value: float) -> None:
    # `not value >= 0` also catches NaN.
    if not value >= 0:
        raise ValueError(f"{name} must be a number >= 0, got {value!r}")


class ItemExponential:
    """Per-item exponential back-off: `base * 2**n` seconds for retry n (from 0), at most `cap`.

    client-go `ItemExponentialFailureRateLimiter`. The failure count is kept until `forget`; a
    count too large for a float (thousands of failures) yields `cap` instead of overflowing.
    """

    def __init__(self, base: float = 0.005, cap: float = 1000.0) -> None:
        _check_non_negative("ItemExponential base", base)
        _check_non_negative("ItemExponential cap", cap)
        self.base = base
        self.cap = cap
        # item -> retries recorded since the last forget (absent = 0).
        self._failures: dict[Hashable, int] = {}

    def when(self, item: Hashable, now: float) -> float:
        exp = self._failures.get(item, 0)
        self._failures[item] = exp + 1
        # 2.0**1024 overflows a float; anything past 2**1023 is beyond every sensible cap anyway.
        if exp >= 1023:
            return self.cap
        return min(self.base * 2.0**exp, self.cap)

    def forget(self, item: Hashable) -> None:
        self._failures.pop(item, None)

    def num_requeues(self, item: Hashable) -> int:
        return self._failures.get(item, 0)


class TokenBucket:
    """One token bucket shared by all items: `burst` immediate retries, then `qps` per second.

    Semantics of golang.org/x/time/rate's `Reserve` (client-go `TypedBucketRateLimiter`): the
    bucket starts full; it refills at `qps` tokens per second up to `burst`; every `when` takes a
    token, going into debt if none is left, and returns how long until that token exists. The
    reservation is never cancelled, so a burst of N retries makes the N-th wait about
    `(N - burst) / qps` seconds.

    `max_delay` (seconds, None = unlimited as in client-go) bounds that wait and the debt behind
    it, which is the fix for kubernetes#104554 described in the module docstring. The bucket has
    no per-item state: `forget` does nothing and `num_requeues` is always 0.
    """

    def __init__(self, qps: float = 10.0, burst: int = 100, max_delay: float | None = None) -> None:
        if not qps > 0:
            raise ValueError(f"TokenBucket qps must be > 0, got {qps!r}")
        if burst < 1:
            raise ValueError(f"TokenBucket burst must be >= 1, got {burst!r}")
        if max_delay is not None:
            _check_non_negative("TokenBucket max_delay", max_delay)
        self.qps = qps
        self.burst = burst
        self.max_delay = max_delay
        # Tokens available at time `_last`; negative = reserved ahead (debt). Never above `burst`,
        # never below `-max_delay * qps` when `max_delay` is set.
        self._tokens: float = float(burst)
        # Time the token count was last brought up to date; None before the first `when`.
        self._last: float | None = None

    def tokens(self, now: float) -> float:
        """Tokens available at `now` (negative when retries are reserved ahead). Does not record."""
        if self._last is None:
            return self._tokens
        elapsed = max(0.0, now - self._last)
        return min(float(self.burst), self._tokens + elapsed * self.qps)

    def when(self, item: Hashable, now: float) -> float:
        tokens = self.tokens(now) - 1.0
        # Time never runs backwards for the bucket: an earlier `now` counts as no time passing.
        self._last = now if self._last is None else max(self._last, now)
        if self.max_delay is not None:
            tokens = max(tokens, -self.max_delay * self.qps)
        self._tokens = tokens
        if tokens >= 0:
            return 0.0
        return -tokens / self.qps

    def forget(self, item: Hashable) -> None:
        return None

    def num_requeues(self, item: Hashable) -> int:
        return 0


class ItemFastSlow:
    """Per item: `fast` seconds for the first `max_fast_attempts` retries, then `slow` seconds.

    client-go `ItemFastSlowRateLimiter` (e.g. retry quickly a few times, then settle into a
    slow poll). The count is kept until `forget`.
    """

    def __init__(self, fast: float, slow: float, max_fast_attempts: int) -> None:
        _check_non_negative("ItemFastSlow fast", fast)
        _check_non_negative("ItemFastSlow slow", slow)
        if max_fast_attempts < 0:
            raise ValueError(f"ItemFastSlow max_fast_attempts must be >= 0: {max_fast_attempts!r}")
        self.fast = fast
        self.slow = slow
        self.max_fast_attempts = max_fast_attempts
        # item -> retries recorded since the last forget (absent = 0).
        self._failures: dict[Hashable, int] = {}

    def when(self, item: Hashable, now: float) -> float:
        n = self._failures.get(item, 0) + 1
        self._failures[item] = n
        return self.fast if n <= self.max_fast_attempts else self.slow

    def forget(self, item: Hashable) -> None:
        self._failures.pop(item, None)

    def num_requeues(self, item: Hashable) -> int:
        return self._failures.get(item, 0)


class MaxOf:
    """The largest delay of several limiters. Every limiter records every retry.

    `num_requeues` is the largest count, `forget` forgets in all (client-go `MaxOfRateLimiter`).
    """

    def __init__(self, *limiters: RateLimiter) -> None:
        if not limiters:
            raise ValueError("MaxOf needs at least one rate limiter")
        self.limiters: tuple[RateLimiter, ...] = limiters

    def when(self, item: Hashable, now: float) -> float:
        # A list, not a generator: every limiter must record the retry, not only up to the max.
        return max([limiter.when(item, now) for limiter in self.limiters])

    def forget(self, item: Hashable) -> None:
        for limiter in self.limiters:
            limiter.forget(item)

    def num_requeues(self, item: Hashable) -> int:
        return max(limiter.num_requeues(item) for limiter in self.limiters)


class WithMaxWait:
    """Another limiter's delay, at most `max_wait` seconds (client-go `WithMaxWaitRateLimiter`)."""

    def __init__(self, limiter: RateLimiter, max_wait: float) -> None:
        _check_non_negative("WithMaxWait max_wait", max_wait)
        self.limiter = limiter
        self.max_wait = max_wait

    def when(self, item: Hashable, now: float) -> float:
        return min(self.limiter.when(item, now), self.max_wait)

    def forget(self, item: Hashable) -> None:
        self.limiter.forget(item)

    def num_requeues(self, item: Hashable) -> int:
        return self.limiter.num_requeues(item)


def default_controller_rate_limiter(
    *,
    base: float = 0.005,
    cap: float = 1000.0,
    qps: float = 10.0,
    burst: int = 100,
    bucket_max_delay: float | None = None,
) -> MaxOf:
    """client-go's `DefaultTypedControllerRateLimiter`: per item 5 ms → 1000 s; 10 qps, burst 100.

    Each number can be changed per controller. `bucket_max_delay` caps the bucket's reservation
    (kubernetes#104554, see the module docstring); None keeps client-go's unbounded behaviour.
    """
    return MaxOf(ItemExponential(base, cap), TokenBucket(qps, burst, max_delay=bucket_max_delay))
