"""Smoke run of benches/scheduler_bench.py's loop, so the benchmark keeps working. Speed is
measured by the benchmark itself, never asserted here."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "benches" / "scheduler_bench.py"


def load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("scheduler_bench", BENCH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_loop_places_every_pod_without_overcommitting() -> None:
    bench = load_bench()
    result = bench.run_once(bench.make_nodes(10), bench.make_pods(500, 20, seed=1), seed=1)
    assert result["placed"] == 500
    assert result["unschedulable"] == 0


def test_bench_loop_reports_unschedulable_pods_when_full() -> None:
    bench = load_bench()
    result = bench.run_once(bench.make_nodes(2), bench.make_pods(300, 5, seed=2), seed=2)
    assert result["placed"] + result["unschedulable"] == 300
    assert result["placed"] <= 220  # 110 pods per node
