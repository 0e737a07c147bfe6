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

from netbench_conn import missing_prerequisites, proxy_rules  # noqa: E402  (benches/ path)

pytestmark = pytest.mark.slow


def test_proxy_rules_put_the_filler_ahead_of_the_service() -> None:
    rules = proxy_rules(3).splitlines()
    services = [r for r in rules if r.startswith("-A KUBE-SERVICES")]
    assert len(services) == 3 + 2
    assert all("-j RETURN" in r for r in services[:3])
    assert rules[0] == "*nat"
    assert rules[-1] == "COMMIT"


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
