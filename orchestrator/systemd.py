"""systemd integration: the unit files `orchestrator install-service` writes, and sd_notify.

Theory of operation
-------------------
Unit files are rendered by pure functions (`render_unit`, `render_env_file`) from a `UnitSpec`;
the CLI (`orchestrator.cli.install_service`) does the file writing and `systemctl` calls. The
unit is `Type=notify` with `NotifyAccess=main`, `KillMode=process` + `Delegate=yes` (containers
and shims are not in our process and survive a restart of the orchestrator, as with k3s and
containerd), `Restart=always`, a `WatchdogSec=` and `TimeoutStopSec=`. Secrets (the join or node
token) live in a mode-0600 environment file, never in the world-readable unit; the unit passes
the file's path as `ORCHESTRATOR_ENV_FILE` so that SIGHUP can re-read it.

sd_notify without libsystemd: the protocol is one datagram of newline-separated `KEY=VALUE`
lines to the Unix socket named by `$NOTIFY_SOCKET` (a leading `@` means the abstract namespace).
`Notifier.from_env()` reads (and, by default, removes from the environment, so children cannot
notify on our behalf) `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID`; without
`NOTIFY_SOCKET` every method is a no-op. Sending never blocks: the socket is non-blocking and a
datagram that does not fit in the receiver's queue is dropped (and logged), since the next status
or watchdog ping supersedes it anyway.

The message order a service sends: `STATUS=starting...` lines, `READY=1` once it serves,
`STATUS=` on every change worth showing in `systemctl status`, `WATCHDOG=1` every half
`WATCHDOG_USEC` from a task of the trio loop (`watchdog_task`: a hung event loop stops pinging
and systemd restarts the service), `RELOADING=1` + `MONOTONIC_USEC=` ... `READY=1` around a
SIGHUP reload, and `STOPPING=1` when shutdown begins.

Logs name signals (`signal_name`: "SIGTERM", never "15"), and a child's end says whether it
exited or was killed by which signal (`exit_description`).
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import signal
import socket
import sys
import time
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import trio

from orchestrator import logsetup

__all__ = [
    "ENV_FILE_VAR",
    "LOG_LEVEL_VAR",
    "Notifier",
    "UnitSpec",
    "config_file_path",
    "exec_quote",
    "exit_description",
    "parse_env_file",
    "read_env_file",
    "reload_log_level",
    "render_env_file",
    "render_unit",
    "signal_name",
    "watchdog_task",
]

log = logging.getLogger(__name__)

ENV_FILE_VAR = "ORCHESTRATOR_ENV_FILE"  # the unit tells the service where its env file is


# ---------------------------------------------------------------------------------- unit files
@dataclass(frozen=True)
class UnitSpec:
    """What a unit file says. `exec_start` is the full command line (argv)."""

    role: str  # "server" or "agent"
    exec_start: Sequence[str]
    env_file: str
    description: str = ""
    pythonpath: str | None = None  # when the package is not installed in site-packages
    restart_sec: int = 2
    watchdog_sec: int = 30
    timeout_stop_sec: int = 30
    limit_nofile: int = 1048576
    wants: Sequence[str] = ("network-online.target",)
    after: Sequence[str] = ("network-online.target", "containerd.service")
    extra_env: Mapping[str, str] = field(default_factory=dict)


_SAFE_ARG = re.compile(r"[A-Za-z0-9_@%$+=:,./-]+")


def signal_name(signum: int) -> str:
    """`SIGTERM` for 15: what people and log searches know a signal by (`signal 99` for a
    number this platform has no name for)."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def exit_description(returncode: int | None) -> str:
    """How a child ended, from `Popen.returncode` (negative: killed by that signal)."""
    if returncode is None:
        return "is still running"
    if returncode < 0:
        return f"was killed by {signal_name(-returncode)}"
    return f"exited with status {returncode}"


def exec_quote(arg: str) -> str:
    """One argument of `ExecStart=` as systemd parses it: `%` specifiers and `$` variables are
    escaped, anything else than plain characters is double-quoted with C-style escapes."""
    text = arg.replace("%", "%%").replace("$", "$$")
    if text and _SAFE_ARG.fullmatch(text):
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _env_assignment(key: str, value: str) -> str:
    """`Environment=` operand: the whole KEY=VALUE quoted if needed (systemd's syntax)."""
    pair = f"{key}={value}".replace("%", "%%")
    if re.fullmatch(r"[A-Za-z0-9_@+=:,./-]+", pair):
        return pair
    return '"' + pair.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_unit(spec: UnitSpec) -> str:
    """The unit file for `spec` (deterministic text; see the module docstring)."""
    description = spec.description or (
        "Edge orchestrator server" if spec.role == "server" else "Edge orchestrator node agent"
    )
    env: dict[str, str] = {ENV_FILE_VAR: spec.env_file}
    if spec.pythonpath:
        env["PYTHONPATH"] = spec.pythonpath
    env.update(spec.extra_env)
    lines = [
        "# Written by `orchestrator install-service`; edit the environment file for settings",
        "# and secrets (SIGHUP, `systemctl reload`, re-reads what can be reloaded).",
        "[Unit]",
        f"Description={description}",
        f"Wants={' '.join(spec.wants)}" if spec.wants else "",
        f"After={' '.join(spec.after)}" if spec.after else "",
        "",
        "[Service]",
        "Type=notify",
        "NotifyAccess=main",
        *(f"Environment={_env_assignment(k, v)}" for k, v in env.items()),
        f"EnvironmentFile=-{spec.env_file}",
        "ExecStart=" + " ".join(exec_quote(a) for a in spec.exec_start),
        "ExecReload=/bin/kill -HUP $MAINPID",
        "Restart=always",
        f"RestartSec={spec.restart_sec}",
        "# Containers are not ours to kill: only the main process is signalled on stop.",
        "KillMode=process",
        "Delegate=yes",
        f"LimitNOFILE={spec.limit_nofile}",
        "LimitNPROC=infinity",
        "LimitCORE=infinity",
        "TasksMax=infinity",
        f"WatchdogSec={spec.watchdog_sec}",
        "# A server may take long to open or join; a hung event loop is caught by the watchdog.",
        "TimeoutStartSec=0",
        f"TimeoutStopSec={spec.timeout_stop_sec}",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ]
    return "\n".join(line for i, line in enumerate(lines) if line or _keep_blank(lines, i))


def _keep_blank(lines: list[str], i: int) -> bool:
    """Blank separators stay only before a section header or at the very end."""
    return i == len(lines) - 1 or lines[i + 1].startswith("[")


_ENV_SAFE = re.compile(r"[A-Za-z0-9_@%+=:,./-]*")


def render_env_file(values: Mapping[str, str], *, header: Iterable[str] = ()) -> str:
    """An `EnvironmentFile=`: `KEY=VALUE` lines, values double-quoted when needed."""
    out = [f"# {h}" for h in header]
    for key, value in values.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValueError(f"{key!r} is not a valid environment variable name")
        if _ENV_SAFE.fullmatch(value):
            out.append(f"{key}={value}")
        else:
            escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
            out.append(f'{key}="{escaped}"')
    return "\n".join(out) + "\n"


def parse_env_file(text: str) -> dict[str, str]:
    """The variables of an environment file (`KEY=VALUE`, `#` comments, shell-like quotes,
    an optional `export `), as systemd and `render_env_file` understand them."""
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        line = line.removeprefix("export ").lstrip()
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            continue
        value = value.strip()
        if value[:1] == '"' and value[-1:] == '"' and len(value) >= 2:
            body = value[1:-1]
            value = re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), body)
        else:
            try:
                parts = shlex.split(value)
            except ValueError:
                parts = [value]
            value = " ".join(parts)
        out[key] = value
    return out


# ---------------------------------------------------------------------------------- sd_notify
def _socket_address(name: str) -> str | bytes | None:
    if name.startswith("@"):
        return b"\0" + name[1:].encode()  # abstract namespace
    if name.startswith("/"):
        return name
    return None


class Notifier:
    """sd_notify client; every method is a no-op without `NOTIFY_SOCKET` (module docstring)."""

    def __init__(self, notify_socket: str | None = None, watchdog_usec: int | None = None) -> None:
        self.address = _socket_address(notify_socket) if notify_socket else None
        if notify_socket and self.address is None:
            log.warning("NOTIFY_SOCKET=%r is not supported (not a path or @name)", notify_socket)
        self.watchdog_usec = watchdog_usec if watchdog_usec and watchdog_usec > 0 else None
        self._sock: socket.socket | None = None
        self.sent = 0  # datagrams sent (statistics)
        self.dropped = 0  # datagrams that could not be sent
        self._last_status: str | None = None

    @classmethod
    def from_env(
        cls, environ: MutableMapping[str, str] | None = None, *, unset: bool = True
    ) -> Notifier:
        """From `NOTIFY_SOCKET`, `WATCHDOG_USEC`, `WATCHDOG_PID` (removed from `environ`, by
        default `os.environ`, unless `unset=False`). The watchdog is ours only if
        `WATCHDOG_PID` is unset or names this process."""
        env = os.environ if environ is None else environ
        get = env.pop if unset else env.get
        notify_socket = get("NOTIFY_SOCKET", None) or None
        usec_text = get("WATCHDOG_USEC", None)
        pid_text = get("WATCHDOG_PID", None)
        usec: int | None = None
        if usec_text and (not pid_text or pid_text.strip() == str(os.getpid())):
            try:
                usec = int(usec_text)
            except ValueError:
                log.warning("WATCHDOG_USEC=%r is not a number; watchdog off", usec_text)
        return cls(notify_socket, usec)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    @property
    def watchdog_interval(self) -> float | None:
        """Seconds between `WATCHDOG=1` pings (half of `WATCHDOG_USEC`), None: no watchdog."""
        if self.address is None or self.watchdog_usec is None:
            return None
        return self.watchdog_usec / 2e6

    def notify(self, *lines: str) -> bool:
        """Send `KEY=VALUE` lines as one datagram; True if it was sent. Never blocks."""
        if self.address is None or not lines:
            return False
        if self._sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            sock.setblocking(False)
            self._sock = sock
        data = "\n".join(lines).encode()
        try:
            self._sock.sendto(data, self.address)
        except OSError as exc:  # BlockingIOError (queue full), the manager gone, ...
            self.dropped += 1
            log.debug("sd_notify %r not sent: %s", lines, exc)
            return False
        self.sent += 1
        return True

    def ready(self, status: str | None = None) -> bool:
        if status is not None:
            self._last_status = status
            return self.notify("READY=1", f"STATUS={_one_line(status)}")
        return self.notify("READY=1")

    def status(self, text: str) -> bool:
        """`STATUS=text` (one line), sent only if it differs from the last one."""
        text = _one_line(text)
        if text == self._last_status:
            return False
        self._last_status = text
        return self.notify(f"STATUS={text}")

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def reloading(self) -> bool:
        """Start of a reload (for `Type=notify-reload`; harmless otherwise); end it with
        `ready()`."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.notify("RELOADING=1", f"MONOTONIC_USEC={usec}")

    def stopping(self, status: str | None = None) -> bool:
        if status is not None:
            self._last_status = status
            return self.notify("STOPPING=1", f"STATUS={_one_line(status)}")
        return self.notify("STOPPING=1")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> Notifier:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _one_line(text: str) -> str:
    return " ".join(text.split())


async def watchdog_task(
    notifier: Notifier, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Ping `WATCHDOG=1` at half of `WATCHDOG_USEC` from this trio loop until cancelled (returns
    at once when there is no watchdog). Runs in the loop, not a thread: if the loop hangs, the
    pings stop and systemd restarts the service."""
    interval = notifier.watchdog_interval
    task_status.started()
    if interval is None:
        return
    log.debug("systemd watchdog: pinging every %.1fs", interval)
    while True:
        notifier.watchdog()
        await trio.sleep(interval)


def read_env_file(path: str | Path) -> dict[str, str]:
    """`parse_env_file` of a file; {} if it does not exist."""
    try:
        return parse_env_file(Path(path).read_text())
    except FileNotFoundError:
        return {}


LOG_LEVEL_VAR = "ORCHESTRATOR_LOG_LEVEL"
_LEVELS = ("debug", "info", "warning", "error")


def config_file_path(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> str | None:
    """The YAML configuration file this process was started with: `--config FILE` on its
    command line (`orchestrator.config`), else `ORCHESTRATOR_CONFIG`."""
    words = list(sys.argv[1:] if argv is None else argv)
    found: str | None = None
    for i, word in enumerate(words):
        if word == "--config" and i + 1 < len(words):
            found = words[i + 1]
        elif word.startswith("--config="):
            found = word.partition("=")[2]
    env = os.environ if environ is None else environ
    return found or env.get("ORCHESTRATOR_CONFIG") or None


def _config_log_level(path: str) -> str:
    import yaml

    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        log.warning("reload: cannot read the configuration file %s: %s", path, exc)
        return ""
    value = doc.get("log-level") if isinstance(doc, dict) else None
    return str(value) if value is not None else ""


def reload_log_level(
    environ: Mapping[str, str] | None = None, argv: Sequence[str] | None = None
) -> list[str]:
    """SIGHUP's reload: the log level from the environment file named by
    `ORCHESTRATOR_ENV_FILE` (`ORCHESTRATOR_LOG_LEVEL`), else from the configuration file
    (`log-level`; see `config_file_path`) — the environment wins over the file, as at start —
    applied to the root logger. Returns what changed, for the log (empty: nothing to reload or
    nothing changed)."""
    env = os.environ if environ is None else environ
    text, source = "", ""
    env_file = env.get(ENV_FILE_VAR)
    if env_file:
        text, source = read_env_file(env_file).get(LOG_LEVEL_VAR, ""), env_file
    config = config_file_path(argv, env)
    if not text.strip() and config:
        text, source = _config_log_level(config), config
    text = text.strip().lower()
    if not text:
        return []
    if text not in _LEVELS:
        log.warning("reload: %s: log level %r is not one of %s; kept", source, text, _LEVELS)
        return []
    root = logging.getLogger()
    old = logging.getLevelName(root.level).lower()
    if old == text:
        return []
    logsetup.set_level(text)  # the per-request libraries' loggers follow
    return [f"log level {old} -> {text} (from {source})"]
