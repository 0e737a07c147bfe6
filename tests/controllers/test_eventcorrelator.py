"""The pure EventCorrelator (client-go's): dedup into bumps, aggregation of similar messages, the
per-object token bucket, the window, forgetting a gone Event, bounded memory, determinism."""

from __future__ import annotations

import random

import pytest

from orchestrator.controllers.runtime.eventcorrelator import (
    AGGREGATE_PREFIX,
    Bump,
    Create,
    Drop,
    EventCorrelator,
    ObjectRef,
)

POD: ObjectRef = ("Pod", "v1", "default", "web-1", "uid-1")
OTHER: ObjectRef = ("Pod", "v1", "default", "web-2", "uid-2")


def write(c: EventCorrelator, decision: Create | Bump | Drop, now: float, name: str = "e") -> None:
    """What the recorder does after a successful write."""
    if isinstance(decision, Create):
        c.created(decision, "default", name, now)
    elif isinstance(decision, Bump):
        c.bumped(decision, now)


def test_first_event_is_created_and_a_repeat_bumps_it() -> None:
    c = EventCorrelator()
    d = c.correlate("agent/n1", POD, "Warning", "BackOff", "restarting", 0.0)
    assert isinstance(d, Create)
    assert d.message == "restarting"
    write(c, d, 0.0, "web-1.a")
    for n in range(2, 6):
        b = c.correlate("agent/n1", POD, "Warning", "BackOff", "restarting", float(n))
        assert isinstance(b, Bump)
        assert (b.namespace, b.name, b.count) == ("default", "web-1.a", n)
        write(c, b, float(n))


def test_a_different_message_object_type_or_source_is_another_event() -> None:
    c = EventCorrelator()
    write(c, c.correlate("agent/n1", POD, "Normal", "Started", "started c", 0.0), 0.0)
    for args in (
        ("agent/n1", POD, "Normal", "Started", "started d"),
        ("agent/n1", OTHER, "Normal", "Started", "started c"),
        ("agent/n1", POD, "Warning", "Started", "started c"),
        ("agent/n2", POD, "Normal", "Started", "started c"),
        ("agent/n1", POD, "Normal", "Created", "started c"),
    ):
        assert isinstance(c.correlate(*args, 1.0), Create), args


def test_the_dedup_window_expires() -> None:
    c = EventCorrelator(window=600.0)
    write(c, c.correlate("s", POD, "Normal", "R", "m", 0.0), 0.0)
    assert isinstance(c.correlate("s", POD, "Normal", "R", "m", 599.0), Bump)
    assert isinstance(c.correlate("s", POD, "Normal", "R", "m", 599.0 + 600.0), Create)


def test_an_unwritten_decision_is_not_remembered() -> None:
    """Only `created` makes later Events bumps: a create that failed is tried again."""
    c = EventCorrelator()
    assert isinstance(c.correlate("s", POD, "Normal", "R", "m", 0.0), Create)
    assert isinstance(c.correlate("s", POD, "Normal", "R", "m", 1.0), Create)


def test_forget_after_a_404_creates_again() -> None:
    c = EventCorrelator()
    write(c, c.correlate("s", POD, "Normal", "R", "m", 0.0), 0.0)
    b = c.correlate("s", POD, "Normal", "R", "m", 1.0)
    assert isinstance(b, Bump)
    c.forget(b.identity)
    assert isinstance(c.correlate("s", POD, "Normal", "R", "m", 2.0), Create)


def test_ten_similar_messages_are_combined_into_one_event() -> None:
    c = EventCorrelator(max_similar=10)
    for i in range(9):
        d = c.correlate("s", POD, "Warning", "Failed", f"error {i}", float(i))
        assert isinstance(d, Create)
        assert d.message == f"error {i}"
        write(c, d, float(i), f"e{i}")
    d = c.correlate("s", POD, "Warning", "Failed", "error 9", 9.0)
    assert isinstance(d, Create)
    assert d.message == AGGREGATE_PREFIX + "error 9"
    assert d.identity.message == ""
    write(c, d, 9.0, "combined")
    # every further similar Event, new message or old, bumps the combined one
    for i, msg in enumerate(("error 10", "error 3", "error 11"), start=2):
        b = c.correlate("s", POD, "Warning", "Failed", msg, 10.0 + i)
        assert isinstance(b, Bump)
        assert (b.name, b.count, b.message) == ("combined", i, AGGREGATE_PREFIX + msg)
        write(c, b, 10.0 + i)


def test_aggregation_resets_after_a_quiet_window() -> None:
    c = EventCorrelator(max_similar=3, window=100.0)
    for i in range(3):
        write(c, c.correlate("s", POD, "Warning", "F", f"m{i}", float(i)), float(i), f"e{i}")
    d = c.correlate("s", POD, "Warning", "F", "m9", 200.0)
    assert isinstance(d, Create)
    assert d.message == "m9"


def test_token_bucket_allows_a_burst_then_one_per_refill() -> None:
    c = EventCorrelator(burst=25, refill_seconds=300.0)
    decisions = [c.correlate("s", POD, "Normal", "R", f"m{i % 3}", 0.0) for i in range(30)]
    assert sum(not isinstance(d, Drop) for d in decisions) == 25
    assert all(isinstance(d, Drop) for d in decisions[25:])
    assert isinstance(c.correlate("s", POD, "Normal", "R", "m0", 299.0), Drop)
    assert not isinstance(c.correlate("s", POD, "Normal", "R", "m0", 300.0), Drop)
    assert isinstance(c.correlate("s", POD, "Normal", "R", "m0", 300.0), Drop)
    # another object, or the same object from another source, has a bucket of its own
    assert not isinstance(c.correlate("s", OTHER, "Normal", "R", "m0", 300.0), Drop)
    assert not isinstance(c.correlate("t", POD, "Normal", "R", "m0", 300.0), Drop)
    # a long pause refills up to the burst, not beyond
    after = [c.correlate("s", POD, "Normal", "R", "m0", 1e6) for _ in range(30)]
    assert sum(not isinstance(d, Drop) for d in after) == 25


def test_a_loop_recording_every_second_writes_little() -> None:
    """A crash loop reporting the same Event every second for an hour: 25 writes, then one per
    5 minutes, and all of them bumps of one Event after the first."""
    c = EventCorrelator()
    creates = bumps = 0
    for t in range(3600):
        d = c.correlate("agent/n1", POD, "Warning", "BackOff", "Back-off restarting", float(t))
        creates += isinstance(d, Create)
        bumps += isinstance(d, Bump)
        write(c, d, float(t))
    assert creates == 1
    assert bumps == 24 + 11  # the burst, then 3575 s / 300 s of refills


def test_memory_is_bounded() -> None:
    c = EventCorrelator(max_keys=50)
    for i in range(1000):
        ref: ObjectRef = ("Pod", "v1", "default", f"p{i}", f"u{i}")
        write(c, c.correlate("s", ref, "Normal", "R", f"m{i}", float(i)), float(i), f"e{i}")
    assert len(c._written) <= 50
    assert len(c._similar) <= 50
    assert len(c._buckets) <= 50


def test_same_inputs_same_answers() -> None:
    def run(seed: int) -> list[object]:
        rng = random.Random(seed)
        c = EventCorrelator(max_similar=4, burst=5, refill_seconds=30.0, window=60.0)
        out: list[object] = []
        t = 0.0
        for _ in range(500):
            t += rng.choice((0.0, 1.0, 10.0, 100.0))
            ref = rng.choice((POD, OTHER))
            d = c.correlate("s", ref, "Warning", rng.choice("AB"), f"m{rng.randrange(6)}", t)
            if rng.random() < 0.9:
                write(c, d, t, f"e{len(out)}")
            out.append(d)
        return out

    assert run(7) == run(7)
    assert run(7) != run(8)


@pytest.mark.parametrize(
    "kwargs",
    [{"window": 0}, {"refill_seconds": -1}, {"max_similar": 0}, {"burst": 0}, {"max_keys": 0}],
)
def test_bad_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be"):
        EventCorrelator(**kwargs)  # type: ignore[arg-type]  # the values are what is tested
