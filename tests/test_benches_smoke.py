"""Smoke runs of the benchmark scripts, so they keep working as the code under them changes.
Figures are not checked here: speed is measured by the benchmarks themselves, never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def test_api_bench_quick_single_server() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benches" / "api_bench.py"), "--quick", "--servers", "1"],
        capture_output=True,
        text=True,
        timeout=40,
        cwd=ROOT,
    )
    assert proc.returncode == 0, f"api_bench failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert last["bench"] == "api"
    one = last["servers"]["1"]
    for phase in ("create", "get", "list", "watch"):
        assert one[phase]["errors"] == 0, one[phase]["first_error"]
    assert one["watch"]["watchers_exact"] == one["watch"]["watchers"]
