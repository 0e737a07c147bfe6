"""Smoke run of `benches/net_bench.py --quick`, so the network benchmark keeps working: it
prints its table and one JSON line; parts that are not available say why instead of failing.
The connection part makes its own namespaces, so it runs only as root with iproute2, nsenter and
iptables-restore. Figures are reported, never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benches"))

from netbench_conn import generated_rules, missing_prerequisites  # noqa: E402  (benches/ path)

pytestmark = pytest.mark.slow


def test_the_bench_programs_the_node_proxys_own_rules() -> None:
    """Every filler Service and ours get a KUBE-SERVICES rule of the product's generator."""
    rules = generated_rules(3).splitlines()
    services = [r for r in rules if r.startswith("-A KUBE-SERVICES") and "KUBE-SVC-" in r]
    assert len(services) == 3 + 2
    assert rules.count("COMMIT") >= 2  # nat and filter


def test_net_bench_quick() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benches" / "net_bench.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    output = f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, output
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert last["bench"] == "net"
    assert set(last) == {"bench", "rules", "dns", "conn"}
    for part in ("rules", "dns", "conn"):
        assert last[part], output
        if "error" in last[part]:
            assert last[part]["error"].startswith("not available"), output
            assert "not available" in proc.stdout
    if not missing_prerequisites():
        conn = last["conn"]
        assert "error" not in conn, output
        for path in ("direct", "cluster_ip"):
            assert conn[path]["connections"] > 0
            assert conn[path]["mib_s"] > 0
