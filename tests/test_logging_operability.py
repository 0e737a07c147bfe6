"""What the logs of a server or an agent carry (`orchestrator.logsetup`, `orchestrator.systemd`).

- At INFO the per-request libraries (httpx, httpcore, hpack, h2, h11, hypercorn's access log)
  are silent: their loggers are at WARNING, and an httpx request logs nothing. At DEBUG they
  speak, labelled debug. A SIGHUP reload of the level moves them too.
- Signals are named ("SIGINT", never "2"), and so is the signal that killed a child.
"""

from __future__ import annotations

import io
import json
import logging
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from orchestrator import logsetup
from orchestrator.systemd import exit_description, reload_log_level, signal_name

LIBRARIES = ["httpx", "httpcore", "hpack", "h2", "h11", "hypercorn.access"]
CHILDREN = ["httpcore.connection", "httpcore.http11", "hpack.hpack", "h2.connection"]


@pytest.fixture
def logs() -> Iterator[io.StringIO]:
    """A stream for `logsetup.setup`; after the test the handler it installed is removed, the
    one it replaced (if any) put back, and the levels restored. pytest's own handlers are left
    alone: it adds and removes them per test phase."""
    root = logging.getLogger()
    saved_level = root.level
    saved_levels = {name: logging.getLogger(name).level for name in LIBRARIES}
    saved_handler = logsetup._handler
    was_installed = saved_handler is not None and saved_handler in root.handlers
    try:
        yield io.StringIO()
    finally:
        if logsetup._handler is not None and logsetup._handler is not saved_handler:
            root.removeHandler(logsetup._handler)
        logsetup._handler = saved_handler
        if was_installed and saved_handler is not None:
            root.addHandler(saved_handler)  # no-op if it is still there
        root.setLevel(saved_level)
        for name, level in saved_levels.items():
            logging.getLogger(name).setLevel(level)


def records(out: io.StringIO) -> list[dict[str, str]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def one_request() -> None:
    """An httpx request answered in process (no socket): httpx logs it as it would a probe."""
    transport = httpx.MockTransport(lambda request: httpx.Response(200, text="ok"))
    with httpx.Client(transport=transport) as client:
        assert client.get("http://10.88.0.7:8080/healthz").status_code == 200


@pytest.mark.parametrize("level", ["info", "warning", "error"])
def test_per_request_libraries_are_quiet_unless_debug(logs: io.StringIO, level: str) -> None:
    logsetup.setup(level, "json", stream=logs)
    for name in LIBRARIES + CHILDREN:
        assert logging.getLogger(name).getEffectiveLevel() == logging.WARNING, name
    assert logging.getLogger("orchestrator.agent").getEffectiveLevel() == logsetup._level(level)


def test_an_httpx_request_logs_nothing_at_info(logs: io.StringIO) -> None:
    logsetup.setup("info", "json", stream=logs)
    logging.getLogger("orchestrator.agent.probes").info("probe of pod a/b failed")
    one_request()
    assert [(r["logger"], r["level"]) for r in records(logs)] == [
        ("orchestrator.agent.probes", "info")
    ]


def test_at_debug_the_requests_are_logged_as_debug(logs: io.StringIO) -> None:
    logsetup.setup("debug", "json", stream=logs)
    for name in LIBRARIES + CHILDREN:
        assert logging.getLogger(name).getEffectiveLevel() == logging.DEBUG, name
    one_request()
    requests = [r for r in records(logs) if r["logger"] == "httpx"]
    assert requests, logs.getvalue()
    assert {r["level"] for r in requests} == {"debug"}  # httpx said INFO


def test_warnings_of_those_libraries_still_pass(logs: io.StringIO) -> None:
    logsetup.setup("info", "json", stream=logs)
    logging.getLogger("httpcore.connection").warning("connection reset")
    assert [(r["logger"], r["level"]) for r in records(logs)] == [
        ("httpcore.connection", "warning")
    ]


def test_set_level_and_a_sighup_reload_move_the_libraries_too(
    logs: io.StringIO, tmp_path: Path
) -> None:
    logsetup.setup("info", "json", stream=logs)
    logsetup.set_level("debug")
    assert logging.getLogger("httpx").getEffectiveLevel() == logging.DEBUG
    env_file = tmp_path / "orchestrator.env"
    env_file.write_text("ORCHESTRATOR_LOG_LEVEL=info\n")
    changes = reload_log_level({"ORCHESTRATOR_ENV_FILE": str(env_file)}, argv=[])
    assert changes == [f"log level debug -> info (from {env_file})"]
    assert logging.getLogger("httpx").getEffectiveLevel() == logging.WARNING
    one_request()
    assert records(logs) == []


def test_signals_are_named() -> None:
    assert signal_name(signal.SIGINT) == "SIGINT"
    assert signal_name(int(signal.SIGTERM)) == "SIGTERM"
    assert signal_name(1000) == "signal 1000"
    assert exit_description(-signal.SIGKILL) == "was killed by SIGKILL"
    assert exit_description(3) == "exited with status 3"
    assert exit_description(None) == "is still running"
