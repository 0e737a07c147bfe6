"""`looplag.LoopLag`: the longest step (with its task's name) and batch of a window, from the
instrument's hooks driven by a fake clock; and the environment switch."""

from __future__ import annotations

import pytest
import trio

from orchestrator import looplag
from orchestrator.looplag import LoopLag


class _Task:
    def __init__(self, name: str) -> None:
        self.name = name


def test_window_figures_from_the_hooks() -> None:
    now = [0.0]
    lag = LoopLag(clock=lambda: now[0])
    lag.after_task_step(_Task("started-before"))  # a step begun before it was added: ignored
    lag.after_io_wait(0)
    for name, took in (("a", 0.001), ("slow", 0.050), ("b", 0.0001)):
        lag.before_task_step(_Task(name))
        now[0] += took
        lag.after_task_step(_Task(name))
    lag.before_io_wait(0)
    w = lag.take()
    assert w.steps == 3
    assert w.max_step == pytest.approx(0.050)
    assert w.slowest_task == "slow"
    assert w.batches == 1
    assert w.max_batch == pytest.approx(0.0511)
    assert sum(w.histogram) == 3
    assert "longest step 50.0 ms (slow)" in w.summary()
    assert lag.take().steps == 0  # a new window


async def test_installed_it_sees_the_real_loop() -> None:
    lag = LoopLag()
    trio.lowlevel.add_instrument(lag)
    try:
        for _ in range(5):
            await trio.lowlevel.checkpoint()
    finally:
        trio.lowlevel.remove_instrument(lag)
    assert lag.take().steps >= 4  # the steps between adding and removing it


@pytest.mark.parametrize(("value", "expected"), [("", None), ("2", 2.0), ("0", None), ("x", None)])
def test_interval_from_env(monkeypatch: pytest.MonkeyPatch, value: str, expected: float) -> None:
    monkeypatch.setenv(looplag.ENV, value)
    assert looplag.interval_from_env() == expected
