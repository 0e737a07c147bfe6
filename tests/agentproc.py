"""Run `orchestrator agent` processes (standalone node agents) for tests and benchmarks.

    agent = AgentProc(tmp_path / "a1", "edge-1", server_url, join_token)
    agent.start()                    # joins with the K10 token on its first start
    agent.kill()                     # SIGKILL, like a power cut
    agent.start()                    # same data dir: reuses its node credentials

Each agent is a separate OS process (`sys.executable -m orchestrator agent ...`), by default on
the simulated runtime (no containerd needed) with its log endpoint on a free port, so several
agents share one host; stdout/stderr go to `<data dir>/agent.log` (appended across restarts,
with a marker line per start). Like `cluster.Cluster`, leaving the `with` block stops the
process (SIGTERM, then SIGKILL) and dumps the log tail if the block failed; agents started from
the main thread get PR_SET_PDEATHSIG so they die with the test process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from cluster import REPO_ROOT, _set_pdeathsig


class AgentProc:
    """One `orchestrator agent` process: its data dir, node name and, while running, process."""

    def __init__(
        self,
        data_dir: Path,
        node_name: str,
        server: str,
        token: str,
        *,
        runtime: str = "simulated",
        lease_renew_interval: float = 1.0,
        log_level: str = "info",
        extra_args: Sequence[str] = (),
    ) -> None:
        self.data_dir = Path(data_dir)
        self.node_name = node_name
        self.server = server
        self.token = token
        self.runtime = runtime
        self.lease_renew_interval = lease_renew_interval
        self.log_level = log_level
        self.extra_args = list(extra_args)
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def log_path(self) -> Path:
        return self.data_dir / "agent.log"

    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "orchestrator",
            "--log-level",
            self.log_level,
            "--log-format",
            "text",
            "agent",
            "--server",
            self.server,
            "--token",
            self.token,
            "--data-dir",
            str(self.data_dir),
            "--node-name",
            self.node_name,
            "--runtime",
            self.runtime,
            "--lease-renew-interval",
            str(self.lease_renew_interval),
            "--kubelet-port",
            "0",
            *self.extra_args,
        ]

    def start(self) -> AgentProc:
        if self.running:
            raise RuntimeError(f"agent {self.node_name} is already running")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        argv = self.argv()
        self.starts += 1
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("NOTIFY_SOCKET", None)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        with open(self.log_path, "ab") as logf:
            shown = " ".join(a if a != self.token else "<token>" for a in argv)
            logf.write(f"=== start #{self.starts} at {time.time():.3f}: {shown}\n".encode())
            logf.flush()
            main = threading.current_thread() is threading.main_thread()
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                cwd=REPO_ROOT,
                env=env,
                start_new_session=True,
                preexec_fn=_set_pdeathsig if (main and sys.platform == "linux") else None,
            )
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.running and self.proc is not None else None

    def kill(self, sig: int = signal.SIGKILL, *, wait: float = 10.0) -> int | None:
        """Send `sig` and wait up to `wait` s; the exit status, or None if still running."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout: float = 5.0) -> int | None:
        """SIGTERM, then SIGKILL if it has not exited within `timeout`."""
        code = self.kill(signal.SIGTERM, wait=timeout)
        if code is None and self.proc is not None:
            code = self.kill(signal.SIGKILL)
        return code

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            text = ""
        body = "\n".join(text.splitlines()[-lines:])
        return f"----- agent {self.node_name} log {self.log_path} -----\n{body}"

    def __enter__(self) -> AgentProc:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.stop()
        finally:
            if exc_type is not None:
                print(self.log_tail(), file=sys.stderr)
