"""`orchestrator install-service`: run the server or the agent as a systemd service.

    orchestrator install-service [server|agent] [--unit-dir DIR] [--env-file FILE]
        [--no-enable] [--dry-run] -- <flags of `orchestrator server` / `orchestrator agent`>

Writes `orchestrator.service` (or `orchestrator-agent.service`) with
`ExecStart=<this python> -m orchestrator <role> <flags>` (rendered by `orchestrator.systemd`),
and an environment file (mode 0600) holding the secrets: a `--token` among the flags is moved
there as `ORCHESTRATOR_TOKEN`, out of the world-readable unit and out of `ps`. An existing
environment file keeps its other lines. Then `systemctl daemon-reload` and
`systemctl enable --now <unit>` unless `--no-enable`; where systemd is not running, prints the
commands to run instead. `--dry-run` prints the files (token redacted) and writes nothing.
The flags are checked with the service's own parser first, so a typo fails here, not at boot.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from orchestrator import systemd

__all__ = ["add_parser", "main"]

DEFAULT_UNIT_DIR = Path("/etc/systemd/system")
DEFAULTS = {
    # role: (unit name, env file, data dir)
    "server": (
        "orchestrator.service",
        "/etc/orchestrator/orchestrator.env",
        "/var/lib/orchestrator",
    ),
    "agent": (
        "orchestrator-agent.service",
        "/etc/orchestrator/orchestrator-agent.env",
        "/var/lib/orchestrator-agent",
    ),
}
ROLES = tuple(DEFAULTS)


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--unit-dir", type=Path, default=DEFAULT_UNIT_DIR, help="where the unit goes")
    p.add_argument(
        "--env-file",
        type=Path,
        help="environment file for secrets and reloadable settings "
        "(default /etc/orchestrator/orchestrator.env, or orchestrator-agent.env)",
    )
    p.add_argument("--no-enable", action="store_true", help="write the files only")
    p.add_argument("--dry-run", action="store_true", help="print the files, write nothing")


def add_parser(sub: Any) -> None:
    """Add `install-service` to the `orchestrator` subparsers."""
    p = sub.add_parser(
        "install-service",
        help="install the server or agent as a systemd service",
        description=(__doc__ or "").split("\n\n")[2],
    )
    _options(p)
    p.add_argument(
        "words",
        nargs=argparse.REMAINDER,
        metavar="[server|agent] -- FLAGS",
        help="the role (default server), then `--` and the flags of the service",
    )


def split_words(args: argparse.Namespace) -> tuple[str, list[str]]:
    """(role, service flags) from `words`; options given after the role are parsed into
    `args` (argparse stops at the first positional otherwise)."""
    words = list(args.words)
    head, tail = (
        (words[: words.index("--")], words[words.index("--") + 1 :])
        if ("--" in words)
        else (words, [])
    )
    role = "server"
    if head and head[0] in ROLES:
        role = head.pop(0)
    if head:
        late = argparse.ArgumentParser(prog="orchestrator install-service", add_help=False)
        _options(late)
        for key in ("unit_dir", "env_file", "no_enable", "dry_run"):
            late.set_defaults(**{key: getattr(args, key)})
        known, rest = late.parse_known_args(head, argparse.Namespace())
        if rest:
            raise SystemExit(
                f"error: unexpected {' '.join(rest)!r}: put the service's flags after `--`"
            )
        for key, value in vars(known).items():
            setattr(args, key, value)
    return role, tail


def extract_token(flags: list[str]) -> tuple[list[str], str | None]:
    """`flags` without `--token X` / `--token=X`, and the token."""
    out: list[str] = []
    token: str | None = None
    it = iter(flags)
    for word in it:
        if word == "--token":
            token = next(it, None)
            if token is None:
                raise SystemExit("error: --token needs a value")
        elif word.startswith("--token="):
            token = word.split("=", 1)[1]
        else:
            out.append(word)
    return out, token


def _has_flag(flags: list[str], name: str) -> bool:
    return any(w == name or w.startswith(name + "=") for w in flags)


def _package_root() -> str | None:
    """The directory to put on PYTHONPATH if `orchestrator` is not importable from the
    interpreter's own paths (a source checkout)."""
    import orchestrator

    root = str(Path(orchestrator.__file__).resolve().parents[1])
    site_dirs = [p for p in sys.path if p and ("site-packages" in p or "dist-packages" in p)]
    if any(Path(p).resolve() == Path(root) for p in site_dirs):
        return None
    return root


def plan(
    args: argparse.Namespace,
) -> tuple[str, Path, str, Path, dict[str, str]]:
    """What to write: (unit name, unit path, unit text, env file path, env values to set)."""
    role, flags = split_words(args)
    unit_name, default_env, default_data = DEFAULTS[role]
    env_file = args.env_file or Path(default_env)
    flags, token = extract_token(flags)
    if not _has_flag(flags, "--data-dir"):
        flags = ["--data-dir", default_data, *flags]
    from orchestrator.cli.server import service_parser

    check = service_parser()  # the service's own parser: fail now, not at boot
    try:
        check.parse_args([role, *flags, *(["--token", token] if token else [])])
    except SystemExit as exc:
        raise SystemExit(f"error: the {role} flags are not valid (see above): {flags}") from exc
    spec = systemd.UnitSpec(
        role=role,
        exec_start=[sys.executable, "-m", "orchestrator", role, *flags],
        env_file=str(env_file),
        pythonpath=_package_root(),
    )
    values: dict[str, str] = {}
    if token:
        values["ORCHESTRATOR_TOKEN"] = token
    return unit_name, args.unit_dir / unit_name, systemd.render_unit(spec), env_file, values


def _env_text(env_file: Path, values: dict[str, str]) -> str:
    current = systemd.read_env_file(env_file)
    current.setdefault(systemd.LOG_LEVEL_VAR, "info")
    current.update(values)
    return systemd.render_env_file(
        current,
        header=[
            "orchestrator service settings (mode 0600: may hold secrets).",
            f"{systemd.LOG_LEVEL_VAR} is re-read on `systemctl reload`; the rest on restart.",
        ],
    )


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    path.chmod(0o600)  # an existing file keeps its mode on open


def systemd_running() -> bool:
    return shutil.which("systemctl") is not None and Path("/run/systemd/system").is_dir()


def main(args: argparse.Namespace) -> int:
    unit_name, unit_path, unit_text, env_file, values = plan(args)
    env_text = _env_text(env_file, values)
    if args.dry_run:
        shown = env_text
        if "ORCHESTRATOR_TOKEN" in values:
            shown = shown.replace(values["ORCHESTRATOR_TOKEN"], "<redacted>")
        print(f"# {unit_path}\n{unit_text}\n# {env_file} (mode 0600)\n{shown}", end="")
        return 0
    unit_path.parent.mkdir(parents=True, exist_ok=True)
    unit_path.write_text(unit_text)
    _write_private(env_file, env_text)
    print(f"wrote {unit_path} and {env_file}")
    commands = [["systemctl", "daemon-reload"], ["systemctl", "enable", "--now", unit_name]]
    if args.no_enable or not systemd_running():
        why = "--no-enable" if args.no_enable else "systemd is not running here"
        print(f"not enabled ({why}); to start it run:")
        for cmd in commands:
            print("  " + " ".join(cmd))
        return 0
    for cmd in commands:
        done = subprocess.run(cmd, check=False)
        if done.returncode != 0:
            ended = systemd.exit_description(done.returncode)  # "killed by SIGKILL", not -9
            print(f"error: {' '.join(cmd)} failed: it {ended}", file=sys.stderr)
            return 1
    print(f"{unit_name} enabled and started; `systemctl status {unit_name}` shows its state")
    return 0
