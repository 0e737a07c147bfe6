"""What keeps the long-running processes (`orchestrator server`, `orchestrator agent`) small:
their command line builds only their own parser, the server imports neither the kubectl-like
CLI nor an HTTP client library it does not use, a standalone agent not the API server's layers,
and `orchestrator.memory` trims the C heap."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import trio
import trio.testing

from orchestrator import memory
from orchestrator.cli.main import _build_parser

ROOT = Path(__file__).resolve().parent.parent


def test_server_command_line_builds_only_what_it_needs() -> None:
    argv = ["--log-level", "warning", "server", "--data-dir", "/tmp/x", "--no-agent"]
    parser = _build_parser(argv)
    assert "get" not in _commands(parser)  # the kubectl-like CLI was not even imported
    args = parser.parse_args(argv)
    assert (args.command, args.no_agent, args.log_level) == ("server", True, "warning")
    assert args.config is None  # --config and --print-config are there too


@pytest.mark.parametrize(
    ("argv", "command"),
    [(["get", "pods"], "get"), (["--log-format", "text", "kv", "get", "k"], "kv"), ([], None)],
)
def test_other_commands_get_the_whole_parser(argv: list[str], command: str | None) -> None:
    parser = _build_parser(argv)
    assert {"get", "apply", "bench", "token", "install-service"} <= set(_commands(parser))
    if command is not None:
        assert parser.parse_args(argv).command == command


def _commands(parser: argparse.ArgumentParser) -> list[str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices)
    return []


def _loaded(argv: list[str], module: str, unwanted: tuple[str, ...]) -> list[str]:
    """The `unwanted` modules (and their submodules) a fresh interpreter has loaded once it
    built the parser for `argv` and imported `module`, as `python -m orchestrator` does."""
    code = f"""
import json, sys
from orchestrator.cli import main
main._build_parser({argv!r})
import {module}
print(json.dumps(sorted(m for m, v in sys.modules.items() if v is not None
    and m.startswith({unwanted!r}))))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return list(json.loads(out.stdout))


@pytest.mark.slow
def test_server_process_imports_no_cli_and_no_http_client() -> None:
    unwanted = (
        *("httpx", "click", "orchestrator.cli.kube", "orchestrator.bench", "orchestrator.testing"),
        *("orchestrator.kube.protobuf", "orchestrator.kube.schema.openapi"),  # on first request
    )
    assert _loaded(["server", "--data-dir", "/tmp/x"], "orchestrator.server", unwanted) == []


def test_the_api_knows_the_protobuf_media_type_without_importing_the_codec() -> None:
    from orchestrator.apiserver import app
    from orchestrator.kube import protobuf

    assert app.PROTOBUF == protobuf.MEDIA_TYPE


@pytest.mark.slow
def test_agent_process_imports_no_api_server_layers() -> None:
    unwanted = ("click", "pygments", "orchestrator.apiserver.resources", "orchestrator.kube.patch")
    argv = ["agent", "--server", "https://127.0.0.1:6443", "--token", "t", "--data-dir", "/x"]
    assert _loaded(argv, "orchestrator.agent.service", unwanted) == []


def test_trim_heap_is_safe_to_call() -> None:
    assert memory.trim_heap() in (True, False)


def test_trim_task_trims_after_settling_then_periodically(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[float] = []

    def fake_trim(pad: int) -> int:
        calls.append(trio.current_time())
        return 1

    monkeypatch.setattr(memory, "_TRIM", fake_trim)

    async def main() -> None:
        with trio.move_on_after(35):
            await memory.trim_task(settle=10, interval=10)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert calls == [10, 20, 30]


def test_trim_task_returns_without_malloc_trim(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "_TRIM", None)
    trio.run(memory.trim_task)  # returns at once: nothing to wait for
    assert memory.trim_heap() is False
