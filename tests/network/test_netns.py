"""Test namespaces (`orchestrator.testing.netns`): a set made by a process that died without
cleaning up is swept by the next set; a live owner's set is left alone; processes inside a
namespace are killed when it is deleted. Root and iproute2 needed (skipped otherwise)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.testing.netns import NamespaceSet, NetnsProcess, sh, sweep_stale

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("nsenter") is None,
    reason="needs root, iproute2 and nsenter",
)

ROOT = Path(__file__).resolve().parents[2]


def listed() -> str:
    return sh(["ip", "netns", "list"])


def test_dead_owners_namespaces_are_swept_live_ones_kept() -> None:
    orphan = subprocess.run(
        [sys.executable, "-c",
         "import os\nfrom orchestrator.testing.netns import NamespaceSet\n"
         "s = NamespaceSet('tnsorph'); s.create('a'); print(s.id, flush=True); os._exit(0)"],
        capture_output=True, text=True, check=True, cwd=ROOT, timeout=30,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    ).stdout.strip()  # fmt: skip
    assert f"{orphan}-a" in listed()
    live = NamespaceSet("tnslive")
    try:
        live.create("a")  # sweeps the orphan's set first
        assert f"{orphan}-a" not in listed()
        assert sweep_stale() == []  # our own set's owner (this process) is alive
        assert f"{live.id}-a" in listed()
    finally:
        live.delete()
    assert f"{live.id}-a" not in listed()


def test_delete_kills_what_runs_inside(tmp_path: Path) -> None:
    ns = NamespaceSet("tnskill")
    proc = NetnsProcess("sleeper", tmp_path / "sleeper.log")
    try:
        name = ns.create("a")
        proc.start(name, ["sleep", "600"])
        assert proc.running
        assert proc.popen is not None
        pid = str(proc.popen.pid)
        deadline = time.monotonic() + 10  # nsenter joins the namespace just after the fork
        while pid not in sh(["ip", "netns", "pids", name]).split():
            assert time.monotonic() < deadline, "the sleeper never showed up in the namespace"
            time.sleep(0.01)
    finally:
        ns.delete()
    assert proc.popen is not None
    assert proc.popen.wait(timeout=10) != 0
    assert "netns" in proc.tail()
