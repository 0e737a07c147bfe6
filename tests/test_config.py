"""Configuration file, environment and flags for `server` and `agent` (`orchestrator.config`),
and the log setup (`orchestrator.logsetup`)."""

from __future__ import annotations

import contextlib
import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator import config, logsetup
from orchestrator.cli.main import _build_parser


def parse(argv: list[str], env: dict[str, str] | None = None) -> Any:
    return config.parse_args(_build_parser(), argv, environ=env or {})


def write(path: Path, doc: Any) -> Path:
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return path


SERVER_FILE = {
    "data-dir": "/var/lib/orch",
    "listen": "0.0.0.0:6443",
    "peer-listen": "10.0.0.5:7001",
    "node-monitor-grace-period": "20s",
    "tls-san": ["edge-1.local", "10.0.0.5"],
    "no-agent": True,
    "tick-ms": 50,
    "initial-cluster": "1=10.0.0.5:7001,2=10.0.0.6:7001",
    "log-level": "debug",
}


def test_file_values_become_the_defaults(tmp_path: Path) -> None:
    cfg = write(tmp_path / "c.yaml", SERVER_FILE)
    args = parse(["server", "--config", str(cfg)])  # --data-dir (required) comes from the file
    assert args.data_dir == Path("/var/lib/orch")
    assert args.listen == "0.0.0.0:6443"
    assert args.peer_listen == "10.0.0.5:7001"
    assert args.node_monitor_grace_period == 20.0
    assert args.tls_san == ["edge-1.local", "10.0.0.5"]
    assert args.no_agent is True
    assert args.tick_ms == 50
    assert args.initial_cluster == {1: "10.0.0.5:7001", 2: "10.0.0.6:7001"}
    assert args.log_level == "debug"
    assert args.client_listen == "127.0.0.1:7101"  # not in the file: built-in default


def test_precedence_flags_over_environment_over_file(tmp_path: Path) -> None:
    cfg = write(tmp_path / "c.yaml", {**SERVER_FILE, "token": "from-file"})
    env = {"ORCHESTRATOR_TOKEN": "from-env", "ORCHESTRATOR_LISTEN": "127.0.0.1:7443"}
    args = parse(["server", "--config", str(cfg)], env)
    assert (args.token, args.listen, args.tick_ms) == ("from-env", "127.0.0.1:7443", 50)
    args = parse(["--log-level", "error", "server", "--config", str(cfg), "--token", "flag"], env)
    assert (args.token, args.log_level) == ("flag", "error")
    # a repeatable flag replaces the file's list instead of extending it
    args = parse(["server", "--config", str(cfg), "--tls-san", "other"])
    assert args.tls_san == ["other"]
    # environment: lists are comma-separated, switches true/false, the file from ORCHESTRATOR_CONFIG
    env = {
        "ORCHESTRATOR_CONFIG": str(cfg),
        "ORCHESTRATOR_TLS_SAN": "a, b",
        "ORCHESTRATOR_NO_AGENT": "false",
        "ORCHESTRATOR_LOG_LEVEL": "WARNING",
    }
    args = parse(["server"], env)
    assert (args.tls_san, args.no_agent, args.log_level) == (["a", "b"], False, "warning")
    assert args.data_dir == Path("/var/lib/orch")


def test_agent_labels_mapping_and_token_env(tmp_path: Path) -> None:
    cfg = write(
        tmp_path / "a.yaml",
        {"data-dir": str(tmp_path), "server": "https://s:6443", "labels": {"zone": "a", "n": 1}},
    )
    args = parse(["agent", "--config", str(cfg)], {"ORCHESTRATOR_TOKEN": "node-tok"})
    assert args.labels == {"zone": "a", "n": "1"}
    assert (args.server, args.token) == (["https://s:6443"], "node-tok")
    args = parse(["agent", "--config", str(cfg), "--labels", "x=y"])
    assert args.labels == {"x": "y"}
    write(cfg, {"data-dir": str(tmp_path), "labels": "k=v,k2=v2"})  # the flag's form works too
    assert parse(["agent", "--config", str(cfg)]).labels == {"k": "v", "k2": "v2"}


def test_agent_servers_repeatable_comma_separated_file_list_and_env(tmp_path: Path) -> None:
    a, b, c = "https://a:6443", "https://b:6443", "https://c:6443"
    base = ["agent", "--data-dir", str(tmp_path)]
    assert parse([*base, "--server", f"{a},{b}", "--server", c]).server == [a, b, c]
    assert parse(base).server == []
    cfg = write(tmp_path / "a.yaml", {"server": [a, f"{b},{c}"]})
    assert parse([*base, "--config", str(cfg)]).server == [a, b, c]
    write(cfg, {"server": f"{a}, {b}"})
    assert parse([*base, "--config", str(cfg)]).server == [a, b]
    # the environment beats the file; a flag replaces both (it does not extend them)
    env = {"ORCHESTRATOR_SERVER": f"{c},{a}"}
    assert parse([*base, "--config", str(cfg)], env).server == [c, a]
    assert parse([*base, "--config", str(cfg), "--server", b], env).server == [b]
    out = io.StringIO()
    with pytest.raises(SystemExit), contextlib.redirect_stdout(out):
        parse([*base, "--config", str(cfg), "--print-config"])
    assert yaml.safe_load(out.getvalue())["server"] == [a, b]  # loadable as a file again
    write(cfg, {"server": {"a": 1}})
    with pytest.raises(SystemExit):
        parse([*base, "--config", str(cfg)])


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"data_dir": "/x"}, "unknown key 'data_dir' (did you mean 'data-dir'?)"),
        ({"bogus": 1}, "unknown key 'bogus'"),
        ({"labels": {"a": "b"}}, "unknown key 'labels'"),  # an agent option, not a server one
        ({"tick-ms": "fast"}, "'tick-ms' must be an integer"),
        ({"tick-ms": True}, "'tick-ms' must be an integer, not a boolean"),
        ({"tls-san": "a.local"}, "'tls-san' must be a list, not a string"),
        ({"no-agent": "yes"}, "'no-agent' must be true or false"),
        ({"runtime": "docker"}, "'runtime' must be one of "),
        ({"node-monitor-grace-period": "soon"}, "'node-monitor-grace-period': 'soon' is not"),
        ({"listen": ["a"]}, "'listen' must be a string, not a list"),
        ("- a\n- b\n", "must be a mapping"),
        ("a: [\n", "is not valid YAML"),
    ],
)
def test_bad_files_are_usage_errors_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], doc: Any, message: str
) -> None:
    cfg = write(tmp_path / "bad.yaml", doc)
    with pytest.raises(SystemExit) as exc:
        parse(["server", "--data-dir", str(tmp_path), "--config", str(cfg)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert str(cfg) in err


def test_bad_environment_and_missing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse(["server", "--data-dir", str(tmp_path)], {"ORCHESTRATOR_TICK_MS": "x"})
    assert "ORCHESTRATOR_TICK_MS" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse(["server", "--config", str(tmp_path / "nope.yaml")])
    assert "cannot read the configuration file" in capsys.readouterr().err


def test_other_commands_ignore_config_environment(tmp_path: Path) -> None:
    args = parse(["status"], {"ORCHESTRATOR_CONFIG": str(tmp_path / "missing.yaml")})
    assert args.command == "status"


def test_print_config_shows_the_effective_configuration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = write(tmp_path / "c.yaml", {**SERVER_FILE, "token": "s3cret"})
    with pytest.raises(SystemExit) as exc:
        parse(["server", "--config", str(cfg), "--tick-ms", "70", "--print-config"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "s3cret" not in out
    shown = yaml.safe_load(out)
    assert shown["token"] == config.MASK
    assert shown["tick-ms"] == 70
    assert shown["listen"] == "0.0.0.0:6443"
    assert shown["tls-san"] == ["edge-1.local", "10.0.0.5"]
    assert shown["node-monitor-grace-period"] == 20.0
    assert shown["no-agent"] is True
    assert "config" not in shown
    assert "print-config" not in shown
    assert "enable-fault-injection" not in shown  # hidden options only when set
    # what it prints is a configuration file giving the same result (the token aside)
    del shown["token"]
    again = write(tmp_path / "again.yaml", shown)
    a = parse(["server", "--config", str(again)])
    b = parse(["server", "--config", str(cfg), "--tick-ms", "70"])
    for key in ("data_dir", "listen", "tls_san", "initial_cluster", "tick_ms", "no_agent"):
        assert getattr(a, key) == getattr(b, key), key
    assert a.node_monitor_grace_period == b.node_monitor_grace_period


def test_print_config_through_main(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from orchestrator.cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(["agent", "--data-dir", str(tmp_path), "--token", "t", "--print-config"])
    assert exc.value.code == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["token"] == config.MASK
    assert shown["data-dir"] == str(tmp_path)


# ---------------------------------------------------------------------------------- logs
@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
    root.setLevel(level)


def test_json_logs_and_set_level(restore_logging: None) -> None:
    out = io.StringIO()
    logsetup.setup("info", "auto", out)  # a StringIO is not a terminal: JSON
    log = logging.getLogger("orchestrator.test")
    log.info("dropped %s from non-member %d", "VOTE", 99, extra={"node": 3})
    log.debug("not shown")
    logsetup.set_level("debug")
    assert logsetup.get_level() == "debug"
    log.debug("now shown")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception('failed "quoted"')
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["msg"] for r in lines] == [
        "dropped VOTE from non-member 99",
        "now shown",
        'failed "quoted"',
    ]
    first = lines[0]
    assert (first["level"], first["logger"], first["node"]) == ("info", "orchestrator.test", 3)
    assert first["ts"].endswith("Z")
    assert "T" in first["ts"]
    assert "RuntimeError: boom" in lines[2]["exc"]
    # the message text is searchable in the raw file (tests grep server logs)
    assert "dropped VOTE from non-member 99" in out.getvalue()


def test_text_logs_and_reconfiguring(restore_logging: None) -> None:
    out = io.StringIO()
    logsetup.setup("warning", "text", out)
    logsetup.setup("info", "text", out)  # replaces its own handler: one line per record
    logging.getLogger("x").info("hello %s", "there", extra={"pod": "default/p"})
    text = out.getvalue()
    assert text.count("hello there") == 1
    assert " INFO x: hello there pod=default/p" in text
    with pytest.raises(ValueError, match="log format"):
        logsetup.setup("info", "xml", out)
    with pytest.raises(ValueError, match="log level"):
        logsetup.set_level("loud")
