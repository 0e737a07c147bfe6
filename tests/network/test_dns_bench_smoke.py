"""A short run of benches/netbench_dns.py, so it keeps working (figures are not checked)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_dns_bench_runs() -> None:
    sys.path.insert(0, str(ROOT / "benches"))  # the spawned processes import it by name too
    try:
        import netbench_dns

        out = netbench_dns.run(seconds=0.6, window=2)
    finally:
        sys.path.remove(str(ROOT / "benches"))
    for phase in ("cluster", "cached_forward", "uncached_forward"):
        assert out[phase]["answered"] > 0, out  # type: ignore[index]
