"""Small pieces the benchmark scripts share: the test cluster helper, CPU time, percentiles."""

from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Run from a checkout without installing; tests/cluster.py starts real server processes.
for _p in (str(ROOT), str(ROOT / "tests")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import cluster as cluster_lib  # noqa: E402  (found through the path set above)

__all__ = ["ROOT", "cluster_lib", "cpu_self", "machine_cpu", "percentile", "wait_quiet"]


def cpu_self() -> float:
    """CPU seconds (user + system) used by this process so far."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[k]


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already in user
    return (total - idle) / tick, total / tick


def wait_quiet(max_wait: float, busy_limit: float = 0.25) -> float:
    """Wait (up to max_wait s) until the machine is at most busy_limit busy over 1 s, so that
    load started by others does not land in a measurement. Returns the last busy fraction."""
    deadline = time.monotonic() + max_wait
    while True:
        b0, t0 = machine_cpu()
        time.sleep(1.0)
        b1, t1 = machine_cpu()
        busy = (b1 - b0) / max(1e-9, t1 - t0)
        if busy <= busy_limit or time.monotonic() >= deadline:
            return busy
