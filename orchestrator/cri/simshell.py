"""The simulated runtime's containers' behaviour: a `Behaviour` given by the test, or the
container's command read by a tiny busybox shell, turned into a `Timeline` of events at offsets
from the container's start (log lines, file changes, at most one exit). Pure: nothing here runs
or sleeps; `SimulatedRuntime` applies a timeline as trio time passes (see `cri.simulated`).

The shell knows `sleep N|infinity`, `echo ...` (with `>&2`, `> file`, `>> file`), `touch F`,
`rm [-f] F`, `exit N`, `true`, `false`, `httpd [-f] [-p PORT]` (serves until stopped),
`trap ... TERM`, `sh -c SCRIPT`, joined with `;`, `&&`, `||` or newlines. Anything else is taken
as a command that succeeds at once.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from orchestrator.cri.runtime import ContainerConfig, ExecResult

__all__ = [
    "FOREVER",
    "Behaviour",
    "BehaviourSource",
    "ExecExit",
    "Timeline",
    "argv_to_script",
    "echo_words",
    "interpret_main",
    "parse_seconds",
    "split_script",
    "timeline_of",
]

FOREVER: Final = float("inf")


@dataclass(frozen=True)
class Behaviour:
    """How a simulated container behaves, overriding what its command would do.

    `run_for`: seconds from start to exit (None: until stopped). `exit_code` / `oom` (exit 137,
    reason OOMKilled) describe that exit. `healthy_attempts_from`: attempts below this number crash
    (exit `exit_code`, default 1 if 0) after `run_for`/1 s, later ones run normally: a crash loop
    that heals. `create_error`/`start_error`: the call fails with this text (a RuntimeFailure).
    `logs`: stdout lines written at start. `exec`: answers by command (`" ".join(cmd)`); commands
    not listed are interpreted. `http_status`: what `http_get` answers (None: not listening).
    `ports`: ports `tcp_connect` accepts. `ignore_sigterm`: stop waits the whole grace period.
    `start_latency`: overrides the runtime's.
    """

    run_for: float | None = None
    exit_code: int = 0
    oom: bool = False
    healthy_attempts_from: int | None = None
    create_error: str | None = None
    start_error: str | None = None
    logs: tuple[str, ...] = ()
    exec: Mapping[str, ExecResult] = field(default_factory=dict)
    http_status: int | None = None
    ports: tuple[int, ...] = ()
    ignore_sigterm: bool = False
    start_latency: float | None = None


BehaviourSource = Mapping[str, Behaviour] | Callable[[ContainerConfig], Behaviour | None]


@dataclass
class Timeline:
    """Events at offsets (seconds) from start; `exit_at` FOREVER = until stopped."""

    events: list[tuple[float, str, str, bytes]] = field(default_factory=list)  # t, kind, arg, data
    exit_at: float = FOREVER
    exit_code: int = 0
    reason: str = ""
    handles_term: bool = True
    http_ports: tuple[int, ...] = ()


class ExecExit(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


_SEPARATORS: Final = frozenset({";", "&&", "||", "&", "|", ";;"})


def split_script(script: str) -> Iterator[list[str]]:
    """Split a shell script into commands (words; redirections stay tokens: `>`, `>>`, `>&`)."""
    lex = shlex.shlex(script.replace("\n", " ; "), posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    words: list[str] = []
    for tok in lex:
        if tok in _SEPARATORS:
            if words:
                yield words
            words = []
        else:
            words.append(tok)
    if words:
        yield words


def argv_to_script(argv: Sequence[str]) -> tuple[list[list[str]], bool]:
    """(commands, is_shell): `sh -c SCRIPT` becomes its commands; anything else one command."""
    if len(argv) >= 3 and os.path.basename(argv[0]) in ("sh", "ash", "bash") and argv[1] == "-c":
        return list(split_script(argv[2])), True
    return [list(argv)], False


def parse_seconds(word: str) -> float:
    if word in ("inf", "infinity"):
        return FOREVER
    try:
        return float(word.rstrip("s"))
    except ValueError:
        return 0.0


def echo_words(words: list[str]) -> tuple[str, str, bool, str]:
    """echo args → (text, stream, append, file)."""
    stream, target, append = "stdout", "", False
    out: list[str] = []
    newline = True
    i = 1
    while i < len(words):
        w = words[i]
        nxt = words[i + 1] if i + 1 < len(words) else ""
        if w == "-n" and not out:
            newline = False
        elif w == ">&":
            stream, i = ("stderr" if nxt == "2" else "stdout"), i + 1
        elif w in (">", ">>"):
            target, append, i = nxt, w == ">>", i + 1
        else:
            out.append(w)
        i += 1
    return " ".join(out) + ("\n" if newline else ""), stream, append, target


def interpret_main(argv: Sequence[str]) -> Timeline:
    tl = Timeline()
    if not argv:
        return tl  # the image's default command: runs until stopped
    commands, _ = argv_to_script(argv)
    tl.handles_term = False  # PID 1 without a handler ignores SIGTERM (observed on containerd)
    t = 0.0
    for words in commands:
        name = os.path.basename(words[0])
        if name == "sleep":
            t += parse_seconds(words[1] if len(words) > 1 else "0")
            if t == FOREVER:
                return tl
        elif name == "echo":
            text, stream, append, target = echo_words(words)
            if target:
                tl.events.append((t, "append" if append else "write", target, text.encode()))
            else:
                tl.events.append((t, "log", stream, text.encode()))
        elif name == "touch":
            tl.events.extend((t, "append", p, b"") for p in words[1:])
        elif name == "rm":
            tl.events.extend((t, "rm", p, b"") for p in words[1:] if not p.startswith("-"))
        elif name == "exit":
            tl.exit_at, tl.exit_code = t, int(words[1]) if len(words) > 1 else 0
            return tl
        elif name == "false":
            tl.exit_code = 1
        elif name == "trap" and "TERM" in words:
            tl.handles_term = True
        elif name == "httpd":
            port = 80
            if "-p" in words[:-1]:
                port = int(words[words.index("-p") + 1].rsplit(":", 1)[-1])
            tl.http_ports += (port,)
            if "-f" in words:  # foreground: serves until stopped
                return tl
        elif name == "exec" and len(words) > 1:
            rest = interpret_main(words[1:])
            rest.events = tl.events + [(t + e[0], *e[1:]) for e in rest.events]
            rest.exit_at += t
            rest.http_ports = tl.http_ports + rest.http_ports
            return rest
        else:
            tl.exit_code = 0
    tl.exit_at = t
    return tl


def timeline_of(config: ContainerConfig, b: Behaviour | None) -> Timeline:
    """The timeline of a container started with `config`: its behaviour's, else its command's."""
    if b is None:
        return interpret_main([*config.command, *config.args])
    tl = Timeline(handles_term=not b.ignore_sigterm)
    tl.events = [(0.0, "log", "stdout", (line + "\n").encode()) for line in b.logs]
    crash = b.healthy_attempts_from is not None and config.attempt < b.healthy_attempts_from
    if crash:
        tl.exit_at = b.run_for if b.run_for is not None else 1.0
        tl.exit_code = b.exit_code or 1
    elif b.healthy_attempts_from is not None:
        return tl  # healed: runs until stopped
    elif b.run_for is not None:
        tl.exit_at, tl.exit_code = b.run_for, b.exit_code
    if b.oom and not (b.healthy_attempts_from is not None and not crash):
        tl.exit_code, tl.reason = 137, "OOMKilled"
        if tl.exit_at == FOREVER:
            tl.exit_at = 0.0
    return tl
