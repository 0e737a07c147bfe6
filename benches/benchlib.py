"""Small pieces the benchmark scripts share: the test cluster helper, CPU time, percentiles."""

from __future__ import annotations

import resource
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Run from a checkout without installing; tests/cluster.py starts real server processes.
for _p in (str(ROOT), str(ROOT / "tests")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import cluster as cluster_lib  # noqa: E402  (found through the path set above)

__all__ = ["ROOT", "cluster_lib", "cpu_self", "percentile"]


def cpu_self() -> float:
    """CPU seconds (user + system) used by this process so far."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[k]
