"""systemd integration: unit rendering (golden text, `systemd-analyze verify`), the sd_notify
client against a datagram socket the test owns, `orchestrator install-service`, and real
`orchestrator server` processes: READY=1 only once the API serves, STATUS=, WATCHDOG=1 at half
of WATCHDOG_USEC, SIGHUP reloading the log level, STOPPING=1 and exit 0 on SIGTERM, and a
SIGTERM'd leader handing leadership over faster than an election could.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing
from cluster import REPO_ROOT, Cluster, free_ports

from orchestrator import systemd
from orchestrator.cli import install_service
from orchestrator.cli.main import _build_parser, main
from orchestrator.raft.progress import ProgressState
from orchestrator.raft.status import PeerProgress, Status
from orchestrator.raft.types import Role
from orchestrator.server import successor
from orchestrator.systemd import Notifier, UnitSpec, render_unit, watchdog_task

GOLDEN_UNIT = """\
# Written by `orchestrator install-service`; edit the environment file for settings
# and secrets (SIGHUP, `systemctl reload`, re-reads what can be reloaded).
[Unit]
Description=Edge orchestrator server
Wants=network-online.target
After=network-online.target containerd.service

[Service]
Type=notify
NotifyAccess=main
Environment=ORCHESTRATOR_ENV_FILE=/etc/orchestrator/orchestrator.env
Environment=PYTHONPATH=/opt/orchestrator
EnvironmentFile=-/etc/orchestrator/orchestrator.env
ExecStart=/usr/bin/python3 -m orchestrator server --data-dir /var/lib/orchestrator \
--tls-san "my host" --x 100%%
ExecReload=/bin/kill -HUP $MAINPID
Restart=always
RestartSec=2
# Containers are not ours to kill: only the main process is signalled on stop.
KillMode=process
Delegate=yes
LimitNOFILE=1048576
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity
WatchdogSec=30
# A server may take long to open or join; a hung event loop is caught by the watchdog.
TimeoutStartSec=0
TimeoutStopSec=30

[Install]
WantedBy=multi-user.target
"""


def test_render_unit_golden() -> None:
    spec = UnitSpec(
        role="server",
        exec_start=[
            "/usr/bin/python3",
            "-m",
            "orchestrator",
            "server",
            "--data-dir",
            "/var/lib/orchestrator",
            "--tls-san",
            "my host",
            "--x",
            "100%",
        ],
        env_file="/etc/orchestrator/orchestrator.env",
        pythonpath="/opt/orchestrator",
    )
    assert render_unit(spec) == GOLDEN_UNIT


def test_exec_quote() -> None:
    q = systemd.exec_quote
    assert q("/usr/bin/python3") == "/usr/bin/python3"
    assert q("a b") == '"a b"'
    assert q('say "hi"') == '"say \\"hi\\""'
    assert q("$HOME") == "$$HOME"
    assert q("%h") == "%%h"
    assert q("") == '""'


def test_env_file_round_trip() -> None:
    values = {"ORCHESTRATOR_TOKEN": 'a b"c\\d', "ORCHESTRATOR_LOG_LEVEL": "debug"}
    text = systemd.render_env_file(values, header=["secrets"])
    assert text.startswith("# secrets\n")
    assert systemd.parse_env_file(text) == values
    assert systemd.parse_env_file("export A='x y'\n; c\nB = 2\nnot a line\n") == {
        "A": "x y",
        "B": "2",
    }
    with pytest.raises(ValueError, match="not a valid"):
        systemd.render_env_file({"1X": "y"})


def test_reload_log_level_from_env_file_then_config_file(tmp_path: Path) -> None:
    root = logging.getLogger()
    saved = root.level
    env_file, config = tmp_path / "o.env", tmp_path / "config.yaml"
    config.write_text("data-dir: /x\nlog-level: warning\n")
    env = {"ORCHESTRATOR_ENV_FILE": str(env_file), "ORCHESTRATOR_CONFIG": str(config)}
    try:
        root.setLevel(logging.INFO)
        assert systemd.reload_log_level(env, argv=[]) == [
            f"log level info -> warning (from {config})"
        ]
        env_file.write_text("ORCHESTRATOR_LOG_LEVEL=debug\n")  # the environment wins
        assert systemd.reload_log_level(env, argv=[]) == [
            f"log level warning -> debug (from {env_file})"
        ]
        assert systemd.reload_log_level(env, argv=[]) == []  # unchanged
        env_file.write_text("ORCHESTRATOR_LOG_LEVEL=loud\n")
        assert systemd.reload_log_level(env, argv=[]) == []  # invalid: kept
        assert root.level == logging.DEBUG
        other = tmp_path / "other.yaml"
        other.write_text("log-level: error\n")
        assert systemd.config_file_path(["server", "--config", str(other)], env) == str(other)
        assert systemd.reload_log_level({}, argv=[f"--config={other}"]) == [
            f"log level debug -> error (from {other})"
        ]
        assert systemd.reload_log_level({}, argv=[]) == []
    finally:
        root.setLevel(saved)


# ---------------------------------------------------------------------------------- sd_notify
@pytest.fixture
def notify_socket() -> Iterator[tuple[socket.socket, str]]:
    """A datagram socket the test owns, as systemd would (short path: AF_UNIX limit)."""
    d = tempfile.mkdtemp(prefix="sdn", dir="/tmp")
    path = os.path.join(d, "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    try:
        yield sock, path
    finally:
        sock.close()
        shutil.rmtree(d, ignore_errors=True)


def _drain(sock: socket.socket) -> list[str]:
    out = []
    sock.setblocking(False)
    while True:
        try:
            out.append(sock.recv(4096).decode())
        except BlockingIOError:
            return out


def test_notifier_is_a_no_op_without_notify_socket() -> None:
    env = {"WATCHDOG_USEC": "2000000"}
    n = Notifier.from_env(env)
    assert not n.enabled
    assert n.watchdog_interval is None
    assert not n.ready()
    assert not n.status("x")
    assert not n.watchdog()
    assert not n.stopping()
    assert env == {}  # consumed


def test_notifier_sends_datagrams(notify_socket: tuple[socket.socket, str]) -> None:
    sock, path = notify_socket
    env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "3000000", "OTHER": "1"}
    n = Notifier.from_env(env)
    assert env == {"OTHER": "1"}  # children cannot notify on our behalf
    assert n.watchdog_interval == 1.5
    n.status("starting")
    n.status("starting")  # unchanged: not resent
    n.ready("leader term 2")
    n.watchdog()
    n.reloading()
    n.stopping()
    got = _drain(sock)
    assert got[:3] == ["STATUS=starting", "READY=1\nSTATUS=leader term 2", "WATCHDOG=1"]
    assert got[3].startswith("RELOADING=1\nMONOTONIC_USEC=")
    assert got[4:] == ["STOPPING=1"]
    n.close()


def test_notifier_abstract_namespace() -> None:
    name = f"orchestrator-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    with sock:
        sock.bind("\0" + name)
        with Notifier.from_env({"NOTIFY_SOCKET": "@" + name}) as n:
            assert n.ready()
        assert _drain(sock) == ["READY=1"]


def test_notifier_watchdog_of_another_process_is_ignored() -> None:
    env = {"NOTIFY_SOCKET": "/nonexistent", "WATCHDOG_USEC": "1000", "WATCHDOG_PID": "1"}
    with Notifier.from_env(env) as n:
        assert n.watchdog_interval is None
        assert not n.ready()  # nobody listens: dropped, never raised
        assert n.dropped == 1


async def test_watchdog_task_pings_at_half_the_interval(
    notify_socket: tuple[socket.socket, str], autojump_clock: trio.testing.MockClock
) -> None:
    sock, path = notify_socket
    with Notifier(path, watchdog_usec=2_000_000) as n, trio.move_on_after(3.5):
        await watchdog_task(n)
    assert _drain(sock) == ["WATCHDOG=1"] * 4  # at 0, 1, 2, 3 s
    assert trio.current_time() == pytest.approx(3.5)


# ---------------------------------------------------------------------------------- install
def test_install_service_writes_unit_and_private_env_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env_file = tmp_path / "etc" / "orchestrator.env"
    env_file.parent.mkdir()
    env_file.write_text("# mine\nCUSTOM=kept\nORCHESTRATOR_LOG_LEVEL=warning\n")
    rc = main(
        [
            "install-service",
            "--unit-dir",
            str(tmp_path / "units"),
            "--env-file",
            str(env_file),
            "--no-enable",
            "--",
            "--data-dir",
            str(tmp_path / "data"),
            "--token",
            "s3cret-token",
            "--listen",
            "0.0.0.0:6443",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "systemctl enable --now orchestrator.service" in out
    unit = (tmp_path / "units" / "orchestrator.service").read_text()
    assert "s3cret" not in unit
    assert f"ExecStart={sys.executable} -m orchestrator server --data-dir {tmp_path}" in unit
    for line in (
        "Type=notify",
        "NotifyAccess=main",
        "Restart=always",
        "RestartSec=2",
        "KillMode=process",
        "Delegate=yes",
        "LimitNOFILE=1048576",
        "WatchdogSec=30",
        "TimeoutStopSec=30",
        f"EnvironmentFile=-{env_file}",
    ):
        assert line in unit.splitlines()
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    values = systemd.read_env_file(env_file)
    assert values == {
        "CUSTOM": "kept",
        "ORCHESTRATOR_LOG_LEVEL": "warning",
        "ORCHESTRATOR_TOKEN": "s3cret-token",
    }


def test_install_service_agent_dry_run_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(
        [
            "install-service",
            "agent",
            "--dry-run",
            "--unit-dir",
            str(tmp_path),
            "--",
            "--server",
            "https://10.0.0.1:6443",
            "--token=node-secret",
            "--ca-file",
            "/etc/orchestrator/ca.crt",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []
    assert "node-secret" not in out
    assert "ORCHESTRATOR_TOKEN=<redacted>" in out
    assert "orchestrator agent --data-dir /var/lib/orchestrator-agent --server" in out
    assert "EnvironmentFile=-/etc/orchestrator/orchestrator-agent.env" in out


def test_install_service_rejects_bad_service_flags(tmp_path: Path) -> None:
    args = _build_parser().parse_args(
        ["install-service", "--dry-run", "--", "--no-such-flag", "--unit-dir", str(tmp_path)]
    )
    with pytest.raises(SystemExit, match="server flags are not valid"):
        install_service.main(args)


def test_written_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed here")
    rc = main(
        [
            "install-service",
            "--unit-dir",
            str(tmp_path),
            "--env-file",
            str(tmp_path / "o.env"),
            "--no-enable",
            "--",
            "--data-dir",
            str(tmp_path / "data"),
        ]
    )
    assert rc == 0
    unit = tmp_path / "orchestrator.service"
    done = subprocess.run(
        [tool, "verify", str(unit)], capture_output=True, text=True, timeout=60, check=False
    )
    # verify exits 0 even for "ignoring" warnings: any line naming our unit is a failure.
    complaints = [
        line
        for line in (done.stdout + done.stderr).splitlines()
        if unit.name in line or str(unit) in line
    ]
    assert done.returncode == 0, done.stderr
    assert complaints == []
    bad = tmp_path / "bad.service"
    bad.write_text(unit.read_text().replace("Type=notify", "Type=notifyy"))
    done = subprocess.run(
        [tool, "verify", str(bad)], capture_output=True, text=True, timeout=60, check=False
    )
    assert "bad.service" in done.stdout + done.stderr  # the check would catch a mistake


def test_successor_is_the_most_caught_up_replicated_voter() -> None:
    def pr(match: int, state: str = "replicate", learner: bool = False) -> PeerProgress:
        return PeerProgress(match, match + 1, ProgressState[state.upper()], learner)

    def leader(voters: list[int], progress: dict[int, PeerProgress]) -> Status:
        return Status(1, 2, Role.LEADER, 1, 10, 10, 10, 1, tuple(voters), (), progress)

    status = leader([1, 2, 3], {1: pr(10), 2: pr(8), 3: pr(9), 4: pr(10, learner=True)})
    assert successor(status) == 3
    status = leader([1, 2, 3], {1: pr(10), 2: pr(10, "probe"), 3: pr(9, "snapshot")})
    assert successor(status) is None
    assert successor(leader([1], {})) is None


# ---------------------------------------------------------------------------------- processes
async def _recv(sock: trio.socket.SocketType, log: list[str]) -> str:
    msg = (await sock.recv(4096)).decode()
    log.append(msg)
    return msg


async def _wait_exit(proc: subprocess.Popen[bytes]) -> int:
    return await trio.to_thread.run_sync(proc.wait, abandon_on_cancel=True)


def _start(argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    with open(log_path, "wb") as logf:
        return subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)


@pytest.mark.slow
async def test_server_under_a_notify_socket(tmp_path: Path) -> None:
    d = tempfile.mkdtemp(prefix="sdn", dir="/tmp")
    path = os.path.join(d, "notify")
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    await sock.bind(path)
    env_file = tmp_path / "orchestrator.env"
    env_file.write_text("ORCHESTRATOR_LOG_LEVEL=info\n")
    peer, client, api = free_ports(3)
    data = tmp_path / "data"
    log_path = tmp_path / "server.log"
    env = dict(
        os.environ,
        NOTIFY_SOCKET=path,
        WATCHDOG_USEC="2000000",
        ORCHESTRATOR_ENV_FILE=str(env_file),
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    )
    env.pop("ORCHESTRATOR_LOG_LEVEL", None)
    argv = [
        sys.executable,
        "-m",
        "orchestrator",
        "server",
        "--data-dir",
        str(data),
        "--peer-listen",
        f"127.0.0.1:{peer}",
        "--client-listen",
        f"127.0.0.1:{client}",
        "--listen",
        f"127.0.0.1:{api}",
        "--runtime",
        "simulated",
        "--node-name",
        "systemd-test",
        "--kubelet-port",
        "0",  # not 10250: another test's server may hold it
    ]
    messages: list[str] = []
    proc = _start(argv, env, log_path)
    try:
        with trio.fail_after(60):
            while True:  # READY=1 comes only once the API serves (its kubeconfig is written)
                msg = await _recv(sock, messages)
                if msg.startswith("READY=1"):
                    assert (data / "kubeconfig.yaml").exists()
                    assert "STATUS=leader term" in msg
                    break
                assert not (data / "kubeconfig.yaml").exists() or msg == "WATCHDOG=1"
            assert messages[0] == "WATCHDOG=1"  # the watchdog runs from the start
            assert "STATUS=starting: opening the store" in messages
            pings = 0
            with trio.fail_after(5):  # one ping a second (half of 2 s)
                while pings < 3:
                    pings += await _recv(sock, messages) == "WATCHDOG=1"

            env_file.write_text("ORCHESTRATOR_LOG_LEVEL=debug\n")
            proc.send_signal(signal.SIGHUP)
            while not (await _recv(sock, messages)).startswith("RELOADING=1"):
                pass
            while await _recv(sock, messages) != "READY=1":
                pass
            text = log_path.read_text()
            assert "reloaded: log level info -> debug" in text
            # The debug line is logged only once the level is debug (text or JSON log lines).
            line = next(ln for ln in text.splitlines() if "debug logging is on" in ln)
            assert "debug" in line.replace("debug logging is on", "").lower()

            proc.send_signal(signal.SIGTERM)
            while not (await _recv(sock, messages)).startswith("STOPPING=1"):
                pass
            with trio.fail_after(30):  # TimeoutStopSec
                assert await _wait_exit(proc) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sock.close()
        shutil.rmtree(d, ignore_errors=True)
    order = [m.split("\n")[0] for m in messages if m != "WATCHDOG=1"]
    assert order.index("READY=1") < order.index("RELOADING=1") < order.index("STOPPING=1")
    assert "received SIGTERM: shutting down" in log_path.read_text()


@pytest.mark.slow
async def test_sigterm_on_the_leader_hands_leadership_over(tmp_path: Path) -> None:
    # Election timeout 3-6 s (60 ticks of 50 ms): a new leader within 2 s of the old one's
    # SIGTERM can only come from a leadership transfer.
    with Cluster(tmp_path, size=3, tick_ms=50, election_ticks=60, api=False) as cluster:
        cluster.start()
        old = await cluster.wait_leader(within=30)
        for i in range(3):
            await cluster.wait_caught_up(i)
        old_term = (await cluster.status(old) or {})["term"]
        s = cluster.servers[old]
        assert s.proc is not None
        s.expected_exit = True
        s.proc.send_signal(signal.SIGTERM)
        start = trio.current_time()
        new = await cluster.wait_leader(within=2.0, exclude=[old])
        elapsed = trio.current_time() - start
        status = await cluster.status(new)
        assert status is not None
        assert status["term"] == old_term + 1
        with trio.fail_after(30):  # TimeoutStopSec; no second signal (it could race the exit)
            assert await _wait_exit(s.proc) == 0
        text = cluster.log_text(old)
        assert f"handing leadership to {cluster.node_id(new)} before stopping" in text
        assert elapsed < 2.0
