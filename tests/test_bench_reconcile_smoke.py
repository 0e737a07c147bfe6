"""Smoke run of `orchestrator bench reconcile` in a subprocess: 5 simulated nodes, 50 pods,
everything Running, a JSON result line. Figures are reported by the benchmark, never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def test_bench_reconcile_small() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "bench", "reconcile", "--nodes", "5",
         "--pods", "50", "--timeout", "30", "--json"],
        capture_output=True,
        text=True,
        timeout=40,
        cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert last["bench"] == "reconcile"
    assert last["pods"] == 50
    assert last["nodes"] == 5
    assert last["sim_started"] == 50
    assert last["pods_per_second"] > 0
    assert last["scheduler_bind_errors"] == 0
