"""Smoke run of `benches/agent_bench.py --quick` (1 and 3 pods per network, 3 s idle) on a
real containerd, so the benchmark keeps working. Figures are reported, never asserted.

Skipped when containerd cannot run here (not root, binaries missing), failed instead under
ORCH_REQUIRE_CONTAINERD=1 (CI), as the `cri.containerd_env` fixture does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cri.containerd_env import REQUIRE_ENV

from orchestrator.testing.containerd import missing_prerequisites

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def test_agent_bench_quick() -> None:
    problems = missing_prerequisites()
    if problems:
        reason = f"containerd unavailable: {'; '.join(problems)}"
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benches" / "agent_bench.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=40,
        cwd=ROOT,
    )
    output = f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    if proc.returncode == 2 and os.environ.get(REQUIRE_ENV) != "1":  # containerd did not start
        pytest.skip(f"containerd unavailable:\n{proc.stderr[-2000:]}")
    assert proc.returncode == 0, f"agent_bench failed:\n{output}"
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert last["bench"] == "agent"
    assert last["ok"]
    rounds = {(r["network"], r["pods"]): r for r in last["rounds"]}
    assert set(rounds) == {("host", 1), ("host", 3), ("pod", 1), ("pod", 3)}
    assert all(r["running"] == r["pods"] for r in rounds.values()), output
    idle = last["idle"][-1]
    assert idle["pods"] == 3
    assert idle["rss_mib"] > 0
