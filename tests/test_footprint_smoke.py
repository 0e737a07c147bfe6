"""Smoke run of `benches/footprint.py --quick` (one cold start, short windows, 50 pods, one
failover round, no containerd), so the benchmark keeps working. Figures are reported, never
asserted against the goals: only that each was measured and is plausible."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def test_footprint_quick() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benches" / "footprint.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=40,
        cwd=ROOT,
    )
    output = f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, f"footprint failed:\n{output}"
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert last["bench"] == "footprint"
    assert last["ok"], output
    simulated = last["cold_start"]["simulated"]
    assert 0 < simulated["ready_s"] < 30
    assert 0 < simulated["api_s"] < 30
    assert simulated["runtime"] == "simulated"  # --runtime auto without containerd
    assert "skipped" in last["cold_start"]["containerd"]
    assert last["idle"]["rss_mib"] > 10
    assert last["pods"]["pods"] == 50
    assert last["pods"]["rss_mib"] > 10
    assert last["agent"]["rss_mib"] > 10
    assert len(last["failover"]["rounds"]) == 1
    assert 0 < last["failover"]["median_s"] < 30
    assert set(last["met"]) == {"start_ready", "idle_rss", "failover"}
