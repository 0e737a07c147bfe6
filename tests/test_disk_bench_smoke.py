"""Smoke run of `benches/disk_bench.py --quick` (3 s idle, 3 s of churn with 3 pods), so the
benchmark keeps working. Figures are reported, never asserted against a budget: only that each
was measured and is plausible."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def test_disk_bench_quick() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benches" / "disk_bench.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=ROOT,
    )
    output = f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, f"disk_bench failed:\n{output}"
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert last["bench"] == "disk"
    assert last["ok"], output
    assert last["runtime"] == "simulated"
    idle, churn = last["idle"], last["churn"]
    assert idle["io_source"] in ("proc", "files")
    assert last["idle_bytes_per_hour"] == idle["bytes_per_hour"] >= 0
    # the churn wrote pods through Raft: entries, WAL frames in both databases, some bytes
    assert churn["pods_created"] >= 2
    assert churn["raft_entries_per_s"] > 0
    assert churn["wal_frames"]["raft"] > 0  # (store.db commits every 30 s: maybe none in 3 s)
    # Keys written are counted from the revisions; `writes_by_key` reads store.db once the
    # server stopped, and a server killed after 10 s (a loaded machine) may not have committed.
    assert churn["key_writes"] >= sum(churn["writes_by_key"].values())
    assert churn["key_writes"] > 0
    assert churn["bytes_per_key_write"] > 0
    assert set(churn["bytes_per_key_write_by_db"]) == {"raft", "store", "agent", "other"}
    assert last["churn_bytes_per_hour"] == churn["bytes_per_hour"] > 0
    assert churn["db_bytes_end"]["store"] > 0
