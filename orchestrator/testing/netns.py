"""Named network namespaces for tests, and the processes that run inside them.

`NamespaceSet(prefix)` makes namespaces `<id>-<role>` (`id` = prefix + 6 random hex digits),
runs commands in them with `nsenter --net=/run/netns/<name>` (not `ip netns exec`, whose remount
of /sys hides the cgroup mount runc needs; so processes share the host's mounts), and deletes
them, after SIGKILLing whatever still runs inside, on `delete()`. Nothing here touches the root
namespace: interfaces are created straight into a set's namespaces with `ip -n`.

Stale sets: `create()` records the owner (this process) in `/run/lock/orchestrator-netns-<id>`
and first deletes the namespaces of every set whose owner is dead (a test run killed before it
could clean up), so namespaces never pile up across runs. A live owner's set is never touched.

`NetnsProcess` is one long-lived process inside a namespace (a server, an agent, a DNS stub):
its output goes to a log file, it gets PR_SET_PDEATHSIG (dies with the test process) when
started from the main thread, and `stop()` is SIGTERM then SIGKILL.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["NamespaceSet", "NetnsError", "NetnsProcess", "enter", "sh"]

_OWNER_DIRS = ("/run/lock", "/tmp")
_OWNER_PREFIX = "orchestrator-netns-"


class NetnsError(AssertionError):
    """A namespace command failed or timed out (the message has the command and its stderr)."""


def enter(netns: str) -> list[str]:
    """The argv prefix that runs a command inside `netns` (network namespace only)."""
    return ["nsenter", f"--net=/run/netns/{netns}", "--"]


def sh(argv: Sequence[str], *, timeout: float = 30.0, check: bool = True, **kw: Any) -> str:
    """Run argv, capture its output; NetnsError on failure (if `check`) or timeout."""
    try:
        proc = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, check=False, **kw
        )
    except subprocess.TimeoutExpired as e:
        raise NetnsError(f"{' '.join(argv)} timed out after {timeout:.0f}s") from e
    if check and proc.returncode != 0:
        raise NetnsError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return str(proc.stdout)


def _owner_dir() -> Path:
    return Path(next((d for d in _OWNER_DIRS if os.access(d, os.W_OK)), _OWNER_DIRS[-1]))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_inside(netns: str) -> None:
    """SIGKILL every process whose network namespace is `netns`."""
    out = subprocess.run(
        ["ip", "netns", "pids", netns], capture_output=True, text=True, check=False
    ).stdout
    for word in out.split():
        if word.isdigit():
            with contextlib.suppress(OSError):
                os.kill(int(word), signal.SIGKILL)


def _delete_all(names: Sequence[str]) -> None:
    for name in names:
        kill_inside(name)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


def sweep_stale() -> list[str]:
    """Delete the namespaces of sets whose owner process is dead; the names deleted."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    existing = [line.split()[0] for line in listed.stdout.splitlines() if line.strip()]
    swept: list[str] = []
    for marker in _owner_dir().glob(_OWNER_PREFIX + "*"):
        set_id = marker.name.removeprefix(_OWNER_PREFIX)
        try:
            pid = int(marker.read_text().strip() or "0")
        except (OSError, ValueError):
            continue
        if pid and _alive(pid):
            continue
        mine = [n for n in existing if n.startswith(set_id + "-")]
        _delete_all(mine)
        swept += mine
        with contextlib.suppress(OSError):
            marker.unlink()
    return swept


class NamespaceSet:
    """Namespaces `<id>-<role>` owned by this process; see the module docstring."""

    def __init__(self, prefix: str) -> None:
        self.id = prefix + secrets.token_hex(3)
        self.names: list[str] = []
        self._marker = _owner_dir() / f"{_OWNER_PREFIX}{self.id}"

    def name(self, role: str) -> str:
        return f"{self.id}-{role}"

    def create(self, role: str) -> str:
        """A new namespace with its loopback up; its name."""
        if not self.names:
            sweep_stale()
            self._marker.write_text(f"{os.getpid()}\n")
        name = self.name(role)
        sh(["ip", "netns", "add", name])
        self.names.append(name)
        sh(["ip", "-n", name, "link", "set", "lo", "up"])
        return name

    def delete(self) -> None:
        """Kill what runs inside and delete every namespace of the set (best-effort)."""
        _delete_all(list(reversed(self.names)))
        self.names.clear()
        with contextlib.suppress(OSError):
            self._marker.unlink()


def _set_pdeathsig() -> None:  # in the child between fork and exec: die with the test process
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class NetnsProcess:
    """A long-lived process inside a namespace, logging to `log_path`."""

    name: str
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None
    expected_exit: bool = False  # stopped on purpose: not a death to report

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def start(
        self,
        netns: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        secret: str = "",
    ) -> None:
        """Start argv inside netns (the log gets a marker line; `secret` is masked in it)."""
        main = threading.current_thread() is threading.main_thread()
        with open(self.log_path, "ab") as log:
            shown = " ".join("<secret>" if secret and a == secret else a for a in argv)
            log.write(f"=== {time.ctime()} netns {netns}: {shown}\n".encode())
            log.flush()
            self.popen = subprocess.Popen(
                [*enter(netns), *argv],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=dict(env) if env is not None else None,
                start_new_session=True,
                preexec_fn=_set_pdeathsig if main else None,
            )
        self.expected_exit = False

    def stop(self, timeout: float = 10.0) -> None:
        p = self.popen
        self.expected_exit = True
        if p is None or p.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            text = ""
        body = "\n".join(text.splitlines()[-lines:])
        return f"----- {self.name} ({self.log_path}) -----\n{body}"
