"""The simulated runtime never opens a network connection on a pod's behalf, proven end to end: an
all-in-one `orchestrator server --runtime simulated` runs in a network namespace that has only
loopback (`unshare -n`, created by this test), where any connect to a simulated pod IP
(10.42.x.x, from its node's podCIDR) fails with ENETUNREACH. A Deployment whose pods have
httpGet and tcpSocket startup, readiness and liveness probes (period 1 s, liveness
failureThreshold 1) becomes Ready and stays Running without a restart: had a probe dialled, it
would have failed. `netns_driver.py` runs inside the namespace and reports in JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DRIVER = Path(__file__).with_name("netns_driver.py")


def _namespaces_available() -> str:
    """Why a loopback-only namespace cannot be made here ("" when it can)."""
    if os.geteuid() != 0:
        return "needs root to create a network namespace (unshare -n)"
    for tool in ("unshare", "ip"):
        if shutil.which(tool) is None:
            return f"needs the {tool!r} command"
    probe = subprocess.run(
        ["unshare", "-n", "ip", "link", "set", "lo", "up"], capture_output=True, timeout=30
    )
    if probe.returncode != 0:
        return f"cannot create a network namespace: {probe.stderr.decode().strip()}"
    return ""


def test_simulated_pods_are_probed_in_a_loopback_only_namespace(tmp_path: Path) -> None:
    why = _namespaces_available()
    if why:
        pytest.skip(why)
    script = f'ip link set lo up && exec "{sys.executable}" "{DRIVER}" "{tmp_path / "data"}"'
    res = subprocess.run(
        ["unshare", "-n", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=240,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    log = (tmp_path / "server.log").read_text(errors="replace") if res.returncode == 0 else ""
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout.strip().splitlines()[-1])
    assert report["pod_ip_unreachable"], "the namespace must make pod IPs unreachable"
    assert "error" not in report, (report, log[-4000:])
    assert len(report["became_ready"]) == 2
    for pod in report["pods"]:
        assert pod["podIP"].startswith("10.42."), pod  # a simulated, unreachable address
        assert (pod["phase"], pod["ready"], pod["restarts"]) == ("Running", True, 0), pod
    assert {pod["name"] for pod in report["pods"]} == set(report["became_ready"])
    # The agent's endpoint is on the node's address, which is loopback here.
    assert {"type": "InternalIP", "address": "127.0.0.1"} in report["node_addresses"]
