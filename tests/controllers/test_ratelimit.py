"""Rate limiters: exact delay sequences, forget, bucket refill and burst, composition, caps."""

from __future__ import annotations

import math

import pytest

from orchestrator.controllers.runtime.ratelimit import (
    ItemExponential,
    ItemFastSlow,
    MaxOf,
    RateLimiter,
    TokenBucket,
    WithMaxWait,
    default_controller_rate_limiter,
)


def delays(limiter: RateLimiter, item: object, n: int, now: float = 0.0) -> list[float]:
    return [limiter.when(item, now) for _ in range(n)]


# ---- ItemExponential -------------------------------------------------------------------------


def test_exponential_default_curve_matches_client_go() -> None:
    limiter = ItemExponential()
    got = delays(limiter, "a", 20)
    assert got[:3] == pytest.approx([0.005, 0.010, 0.020])
    assert got[17] == pytest.approx(655.36)  # 5 ms * 2**17
    assert got[18:] == [1000.0, 1000.0]  # capped from the 19th retry on
    assert limiter.num_requeues("a") == 20


def test_exponential_is_per_item() -> None:
    limiter = ItemExponential(0.001, 1000)
    assert delays(limiter, "a", 3) == pytest.approx([0.001, 0.002, 0.004])
    assert delays(limiter, "b", 2) == pytest.approx([0.001, 0.002])
    assert limiter.num_requeues("a") == 3
    assert limiter.num_requeues("b") == 2
    assert limiter.num_requeues("c") == 0


def test_exponential_forget_resets() -> None:
    limiter = ItemExponential(1.0, 100.0)
    assert delays(limiter, "a", 4) == [1.0, 2.0, 4.0, 8.0]
    limiter.forget("a")
    assert limiter.num_requeues("a") == 0
    assert limiter.when("a", 0.0) == 1.0
    limiter.forget("never-seen")  # no error


def test_exponential_cap_and_overflow_safe() -> None:
    limiter = ItemExponential(1.0, 60.0)
    assert delays(limiter, "a", 8) == [1, 2, 4, 8, 16, 32, 60, 60]
    huge = ItemExponential(0.005, 1000.0)
    huge._failures["x"] = 10**6  # a key that failed a million times
    assert huge.when("x", 0.0) == 1000.0
    big_base = ItemExponential(1e300, math.inf)
    for _ in range(1100):
        d = big_base.when("y", 0.0)
        assert d >= 0
    assert big_base.when("y", 0.0) == math.inf


def test_exponential_time_does_not_matter() -> None:
    limiter = ItemExponential(1.0, 100.0)
    assert [limiter.when("a", t) for t in (0.0, 1000.0, 5.0)] == [1.0, 2.0, 4.0]


@pytest.mark.parametrize(("base", "cap"), [(-1.0, 1.0), (1.0, -1.0), (math.nan, 1.0)])
def test_exponential_rejects_bad_parameters(base: float, cap: float) -> None:
    with pytest.raises(ValueError, match="must be a number >= 0"):
        ItemExponential(base, cap)


# ---- TokenBucket -----------------------------------------------------------------------------


def test_bucket_burst_then_one_per_interval() -> None:
    bucket = TokenBucket(qps=10.0, burst=3)
    got = delays(bucket, "a", 6, now=0.0)
    assert got == pytest.approx([0.0, 0.0, 0.0, 0.1, 0.2, 0.3])


def test_bucket_refills_over_time() -> None:
    bucket = TokenBucket(qps=2.0, burst=2)
    assert delays(bucket, "a", 2, now=0.0) == [0.0, 0.0]
    assert bucket.tokens(0.0) == 0.0
    assert bucket.tokens(0.5) == pytest.approx(1.0)
    assert bucket.when("a", 0.5) == 0.0  # one token refilled
    assert bucket.when("a", 0.5) == pytest.approx(0.5)  # reserved ahead
    # Long idle: refills to burst, not beyond.
    assert bucket.tokens(100.0) == 2.0
    assert delays(bucket, "a", 3, now=100.0) == pytest.approx([0.0, 0.0, 0.5])


def test_bucket_is_shared_by_all_items_and_has_no_item_state() -> None:
    bucket = TokenBucket(qps=1.0, burst=1)
    assert bucket.when("a", 0.0) == 0.0
    assert bucket.when("b", 0.0) == pytest.approx(1.0)
    assert bucket.when("c", 0.0) == pytest.approx(2.0)
    assert bucket.num_requeues("a") == 0
    bucket.forget("b")  # does not give tokens back
    assert bucket.when("d", 0.0) == pytest.approx(3.0)


def test_bucket_reservations_accumulate_kubernetes_104554() -> None:
    # 10,000 items rate-limited at once with client-go's default bucket: the tail waits ~990 s.
    bucket = TokenBucket(10.0, 100)
    got = delays(bucket, "k", 10_000)
    assert got[99] == 0.0
    assert got[-1] == pytest.approx(990.0)
    # ... and a retry right after waits behind all of them.
    assert bucket.when("other", 1.0) == pytest.approx(989.1)


def test_bucket_max_delay_caps_reservation_and_debt() -> None:
    bucket = TokenBucket(10.0, 100, max_delay=5.0)
    got = delays(bucket, "k", 10_000)
    assert max(got) == pytest.approx(5.0)
    assert got[100:150] == pytest.approx([0.1 * i for i in range(1, 51)])
    assert got[-1] == pytest.approx(5.0)
    # The debt is bounded too: 5 s later the bucket is back at zero, not 990 s behind.
    assert bucket.tokens(5.0) == pytest.approx(0.0)
    assert bucket.when("later", 5.0) == pytest.approx(0.1)
    assert bucket.tokens(15.0) == pytest.approx(99.0)


def test_bucket_max_delay_zero_never_delays() -> None:
    bucket = TokenBucket(1.0, 1, max_delay=0.0)
    assert delays(bucket, "a", 5) == [0.0] * 5


def test_bucket_time_going_backwards_counts_as_no_time() -> None:
    bucket = TokenBucket(1.0, 1)
    assert bucket.when("a", 10.0) == 0.0
    assert bucket.when("a", 5.0) == pytest.approx(1.0)
    assert bucket.when("a", 11.0) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("qps", "burst", "max_delay"), [(0.0, 1, None), (-1.0, 1, None), (1.0, 0, None), (1.0, 1, -1.0)]
)
def test_bucket_rejects_bad_parameters(qps: float, burst: int, max_delay: float | None) -> None:
    with pytest.raises(ValueError, match="TokenBucket"):
        TokenBucket(qps, burst, max_delay)


# ---- ItemFastSlow ----------------------------------------------------------------------------


def test_fast_slow_sequence_and_forget() -> None:
    limiter = ItemFastSlow(fast=0.1, slow=10.0, max_fast_attempts=3)
    assert delays(limiter, "a", 5) == [0.1, 0.1, 0.1, 10.0, 10.0]
    assert delays(limiter, "b", 1) == [0.1]
    assert limiter.num_requeues("a") == 5
    limiter.forget("a")
    assert limiter.num_requeues("a") == 0
    assert limiter.when("a", 0.0) == 0.1


def test_fast_slow_zero_fast_attempts() -> None:
    assert delays(ItemFastSlow(0.1, 2.0, 0), "a", 2) == [2.0, 2.0]


def test_fast_slow_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError, match="max_fast_attempts"):
        ItemFastSlow(1.0, 2.0, -1)


# ---- MaxOf and WithMaxWait -------------------------------------------------------------------


def test_max_of_picks_the_larger_and_all_record() -> None:
    fast_slow = ItemFastSlow(0.5, 3.0, 2)
    exponential = ItemExponential(0.1, 100.0)
    limiter = MaxOf(exponential, fast_slow)
    # exp: 0.1 0.2 0.4 0.8 1.6 3.2 ; fast/slow: 0.5 0.5 3 3 3 3
    assert delays(limiter, "a", 6) == pytest.approx([0.5, 0.5, 3.0, 3.0, 3.0, 3.2])
    assert exponential.num_requeues("a") == 6
    assert fast_slow.num_requeues("a") == 6
    assert limiter.num_requeues("a") == 6
    limiter.forget("a")
    assert exponential.num_requeues("a") == 0
    assert fast_slow.num_requeues("a") == 0


def test_max_of_num_requeues_is_the_largest() -> None:
    a = ItemExponential(1.0, 10.0)
    b = ItemExponential(1.0, 10.0)
    a.when("x", 0.0)
    a.when("x", 0.0)
    b.when("x", 0.0)
    assert MaxOf(a, b).num_requeues("x") == 2
    assert MaxOf(TokenBucket()).num_requeues("x") == 0


def test_max_of_needs_a_limiter() -> None:
    with pytest.raises(ValueError, match="at least one"):
        MaxOf()


def test_with_max_wait_caps_and_delegates() -> None:
    inner = ItemExponential(1.0, 1000.0)
    limiter = WithMaxWait(inner, 5.0)
    assert delays(limiter, "a", 5) == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert limiter.num_requeues("a") == 5
    limiter.forget("a")
    assert inner.num_requeues("a") == 0
    with pytest.raises(ValueError, match="max_wait"):
        WithMaxWait(inner, -1.0)


# ---- default ---------------------------------------------------------------------------------


def test_default_controller_rate_limiter() -> None:
    limiter = default_controller_rate_limiter()
    exponential, bucket = limiter.limiters
    assert isinstance(exponential, ItemExponential)
    assert (exponential.base, exponential.cap) == (0.005, 1000.0)
    assert isinstance(bucket, TokenBucket)
    assert (bucket.qps, bucket.burst, bucket.max_delay) == (10.0, 100, None)
    # One failing item: the exponential curve (the bucket has plenty of tokens).
    assert delays(limiter, "a", 4) == pytest.approx([0.005, 0.01, 0.02, 0.04])
    # 200 distinct items at once: the bucket dominates after the burst of 100 (4 used above).
    many = [limiter.when(i, 0.0) for i in range(200)]
    assert many[95] == pytest.approx(0.005)
    assert many[96] == pytest.approx(0.1)
    assert many[-1] == pytest.approx(10.4)


def test_default_controller_rate_limiter_is_configurable() -> None:
    limiter = default_controller_rate_limiter(
        base=0.05, cap=300.0, qps=50.0, burst=500, bucket_max_delay=60.0
    )
    exponential, bucket = limiter.limiters
    assert isinstance(exponential, ItemExponential)
    assert (exponential.base, exponential.cap) == (0.05, 300.0)
    assert isinstance(bucket, TokenBucket)
    assert (bucket.qps, bucket.burst, bucket.max_delay) == (50.0, 500, 60.0)
