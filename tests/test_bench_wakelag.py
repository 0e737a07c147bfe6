"""The bench's event-loop lag monitor, on trio's MockClock."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from orchestrator.bench.wakelag import INTERVAL, WakeLag


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


def test_summary_buckets_and_maximum() -> None:
    lag = WakeLag()
    for value in (0.0, 0.02, 0.2, 1.5):
        lag.record(value)
    s = lag.summary()
    assert s["samples"] == 4
    assert s["max"] == 1.5
    assert s["over_0.1s"] == 0.5
    assert s["over_1s"] == 0.25
    assert WakeLag().summary()["samples"] == 0


async def test_a_busy_loop_shows_as_lag(autojump_clock: trio.testing.MockClock) -> None:
    lag = WakeLag()
    async with trio.open_nursery() as nursery:
        await nursery.start(lag.run)
        await trio.sleep(INTERVAL / 2)  # the sampler sleeps until INTERVAL
        autojump_clock.jump(2.0)  # the loop was away for 2 s (a blocking task, or no CPU)
        await trio.sleep(INTERVAL * 2)
        nursery.cancel_scope.cancel()
    s = lag.summary()
    assert s["max"] >= 1.9
    assert s["over_1s"] > 0
