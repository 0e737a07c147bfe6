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
         "--pods", "50", "--timeout", "30", "--idle-seconds", "0.5", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
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
    assert last["transport"] == "in-process"
    assert last["http_5xx"] == 0
    assert last["lease_failures"] == 0
    assert last["rss_per_pod_kib"] is not None
    assert last["idle_cpu_per_second"] >= 0  # measured over the idle window
    assert last["cpu_ms_per_pod_net"] is not None


def test_bench_reconcile_nodes_over_http() -> None:
    """The nodes run in a child process, each over HTTPS with its own node token."""
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "bench", "reconcile", "--nodes", "3",
         "--pods", "20", "--timeout", "60", "--idle-seconds", "0", "--json",
         "--nodes-over-http"],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert last["transport"] == "http"
    assert last["pods"] == 20
    assert last["nodes_cpu_seconds"] > 0
    assert last["sim_started"] > 0  # the child may not have seen its last replies yet
    assert last["sim_errors"] == 0
    assert last["http_5xx"] == 0
    assert last["nodes_not_ready"] == 0


def test_bench_reconcile_scales_prints_one_table() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "bench", "reconcile", "--scales", "20,40",
         "--nodes", "2", "--timeout", "60", "--idle-seconds", "0", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    out = proc.stdout.strip().splitlines()
    rows = [line for line in out if line.startswith("| ")]
    assert len(rows) == 2 + 2  # header, rule, one row per scale
    assert rows[2].startswith("| 20 | 2 |")
    assert rows[3].startswith("| 40 | 2 |")
    scales = [json.loads(line) for line in out if line.startswith("{")]
    assert [d["scale"] for d in scales] == [20, 40]
    assert all(d["sim_started"] == d["pods"] for d in scales)
