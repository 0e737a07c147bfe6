"""How busy a process's trio event loop is: the lag of a task that sleeps `INTERVAL`.

A task asking to wake in `INTERVAL` seconds wakes late by as long as the loop was running other
tasks (or the process was not given a CPU). The bench runs one in the measured server and one
in the simulated nodes' process, so a late Lease renewal can be traced to the loop that was
busy. Memory is fixed: a count per lag bucket and the maximum. (`orchestrator.looplag` is the
other view, from inside: a trio Instrument naming the longest task step; this one needs no
instrument and measures what a timer, such as a Lease renewal's, sees.)
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

import trio

__all__ = ["INTERVAL", "WakeLag"]

INTERVAL = 0.05
BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 2.0, 5.0)  # upper bounds (s) of the lag buckets


class WakeLag:
    """Samples the loop's lag every `INTERVAL` seconds while `run` runs (module doc)."""

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)
        self.max = 0.0
        self.total = 0.0

    def record(self, lag: float) -> None:
        self.counts[bisect_right(BUCKETS, lag)] += 1
        self.max = max(self.max, lag)
        self.total += lag

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            start = trio.current_time()
            await trio.sleep(INTERVAL)
            self.record(max(0.0, trio.current_time() - start - INTERVAL))

    def summary(self) -> dict[str, Any]:
        """Samples, mean and max lag (s), and the fraction of samples later than 0.1 s and 1 s."""
        n = sum(self.counts)
        over = {f"over_{b:g}s": round(sum(self.counts[i + 1 :]) / n, 4) if n else 0.0
                for i, b in enumerate(BUCKETS) if b in (0.1, 1.0)}  # fmt: skip
        return {
            "samples": n,
            "mean": round(self.total / n, 4) if n else 0.0,
            "max": round(self.max, 3),
            **over,
        }
