"""How long the event loop goes without a checkpoint: a trio `Instrument` that times every task
step and every scheduling batch, for finding what starves the Raft loop and the lease renewals.

Theory of operation: trio runs, in each pass of its loop, every task that is runnable, one step
each (a step is the code between two checkpoints), then waits for I/O. A task that becomes
runnable therefore waits at most one batch; a batch lasts the sum of its steps. So two numbers
say how responsive the loop is: the longest single step (something that should checkpoint more
often: a big encode, a long synchronous loop) and the longest batch (too many runnable tasks at
once: bulk work that should be bounded). `LoopLag` keeps, for the current window, the count and
the longest of each (with the name of the slowest step's task), and a log2 histogram of steps
by duration; `take()` returns the window's figures and starts a new window.

Enabled only on demand (it costs two clock reads per task step): `ORCHESTRATOR_LOOP_LAG=<s>`
makes `serve_until_signalled` install it and log every `<s>` seconds the window's figures
(WARNING when a step or a batch took longer than `SLOW_STEP` / `SLOW_BATCH`, else INFO), and the
tests install it around a workload to report the figures. Nothing here changes what runs.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

log = logging.getLogger("orchestrator.looplag")

ENV = "ORCHESTRATOR_LOOP_LAG"
SLOW_STEP = 0.020  # a step longer than this delays every other task (the Raft loop included)
SLOW_BATCH = 0.100  # a batch longer than this delays a task that just became runnable
BUCKETS = 16  # steps by duration: bucket i counts steps under 2**i * 0.1 ms (the last: longer)


@dataclass
class LagWindow:
    """A window's figures (seconds); `slowest_task` names the task of the longest step."""

    steps: int = 0
    step_seconds: float = 0.0
    max_step: float = 0.0
    slowest_task: str = ""
    batches: int = 0
    max_batch: float = 0.0
    histogram: list[int] = field(default_factory=lambda: [0] * BUCKETS)

    def summary(self) -> str:
        return (
            f"{self.steps} steps ({self.step_seconds:.2f} s busy), longest step"
            f" {self.max_step * 1000:.1f} ms ({self.slowest_task or '-'}), {self.batches}"
            f" batches, longest batch {self.max_batch * 1000:.1f} ms"
        )


class LoopLag(trio.abc.Instrument):
    """Times task steps and scheduling batches (see the module doc)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self.window = LagWindow()
        self._step_start: float | None = None  # None: the step began before we were added
        self._batch_start: float | None = None

    def take(self) -> LagWindow:
        """The current window's figures; a new window starts."""
        window, self.window = self.window, LagWindow()
        return window

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._step_start = self._clock()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if self._step_start is None:
            return
        took = self._clock() - self._step_start
        w = self.window
        w.steps += 1
        w.step_seconds += took
        if took > w.max_step:
            w.max_step = took
            w.slowest_task = task.name
        i = 0 if took <= 0.0001 else min(BUCKETS - 1, math.ceil(math.log2(took / 0.0001)))
        w.histogram[i] += 1

    def after_io_wait(self, timeout: float) -> None:
        self._batch_start = self._clock()

    def before_io_wait(self, timeout: float) -> None:
        if self._batch_start is None:
            return
        took = self._clock() - self._batch_start
        w = self.window
        w.batches += 1
        w.max_batch = max(w.max_batch, took)


def interval_from_env() -> float | None:
    """The logging interval `ORCHESTRATOR_LOOP_LAG` asks for, or None (off, or not a number)."""
    text = os.environ.get(ENV, "").strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        log.warning("%s=%r is not a number of seconds: loop lag not measured", ENV, text)
        return None
    return seconds if seconds > 0 else None


async def report_task(interval: float) -> None:
    """Install a `LoopLag` and log its window every `interval` seconds, until cancelled."""
    lag = LoopLag()
    trio.lowlevel.add_instrument(lag)
    try:
        while True:
            await trio.sleep(interval)
            w = lag.take()
            slow = w.max_step > SLOW_STEP or w.max_batch > SLOW_BATCH
            log.log(logging.WARNING if slow else logging.INFO, "event loop: %s", w.summary())
    finally:
        trio.lowlevel.remove_instrument(lag)
