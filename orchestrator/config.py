"""Configuration files and environment variables for `orchestrator server` and `orchestrator agent`.

Theory of operation
-------------------
argparse stays the single definition of every option: a configuration file and the environment
only change the *defaults* of the parser's actions before the command line is parsed, so the
precedence is

    command-line flags  >  environment (ORCHESTRATOR_<KEY>)  >  --config FILE  >  built-in defaults

A configuration file is a YAML mapping whose keys are the long flag names without the dashes in
front (`data-dir`, `listen`, `peer-listen`, `node-monitor-grace-period`, ...), plus the global
`log-level` and `log-format`::

    data-dir: /var/lib/orchestrator
    listen: 0.0.0.0:6443
    tls-san: [edge-1.local, 10.0.0.5]     # repeatable flags are lists
    node-monitor-grace-period: 20s
    no-agent: true                        # switches are booleans
    labels: {zone: shelf-2, tier: edge}   # `agent` only: a mapping (or "k=v,k2=v2")

Values are checked as the command line would check them (the action's `type` and `choices`);
an unknown key or a value of the wrong type is a usage error naming the key and the file. The
environment variable of a key is `ORCHESTRATOR_` + the key upper-cased with `_` for `-`
(`ORCHESTRATOR_TOKEN`, `ORCHESTRATOR_DATA_DIR`, `ORCHESTRATOR_LOG_LEVEL`; lists are
comma-separated, switches `true`/`false`); `ORCHESTRATOR_CONFIG` names the file.

A repeatable flag given on the command line replaces the file's list rather than extending it.
A `ListOption` (`--server` of the agent and of the server) is repeatable *and* comma-separated:
the file takes a list or one comma-separated string, the environment a comma-separated string.
A key both commands have (`server`, `token`, `data-dir`, ...) sets the option of the command
being run, so an environment shared by both sets both: `ORCHESTRATOR_SERVER` makes a server
join through that URL on its first start, as it makes an agent join.
`--print-config` prints the effective configuration (same keys, loadable as a file; the token is
masked) and exits 0.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "COMMANDS",
    "ENV_PREFIX",
    "ConfigError",
    "ListOption",
    "add_config_options",
    "effective_config",
    "env_values",
    "file_values",
    "find_command",
    "parse_args",
    "render_config",
]

COMMANDS = ("server", "agent")
"""The subcommands that take `--config` and `--print-config`."""

ENV_PREFIX = "ORCHESTRATOR_"
GLOBAL_KEYS = ("log-level", "log-format")  # options of the top-level parser, also in files
SECRET_KEYS = frozenset({"token"})
MASK = "<redacted>"
_OWN_KEYS = frozenset({"config", "print-config", "help"})
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


class ConfigError(ValueError):
    """A configuration file or environment variable that cannot be used (the message says why)."""


def add_config_options(parser: argparse.ArgumentParser) -> None:
    """Add `--config FILE` and `--print-config` to a subcommand's parser."""
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="YAML file of options (keys are the long flag names, e.g. data-dir); flags and "
        f"{ENV_PREFIX}<KEY> environment variables override it (env {ENV_PREFIX}CONFIG)",
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the effective configuration as YAML (secrets masked) and exit",
    )


class ListOption(argparse.Action):
    """A repeatable option whose values may also be comma-separated (`--server a,b --server c`
    gives ["a", "b", "c"]); the first flag replaces the default (a file's or the environment's
    list), later ones extend it. Empty items are dropped."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("default", [])
        super().__init__(option_strings, dest, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        current = getattr(namespace, self.dest, None)
        items = [] if current is None or current is self.default else list(current)
        items += [p.strip() for p in str(values).split(",") if p.strip()]
        setattr(namespace, self.dest, items)


# ---------------------------------------------------------------------------------- the options
def _key(action: argparse.Action) -> str | None:
    """The configuration key of an action: its first long option without the dashes."""
    for opt in action.option_strings:
        if opt.startswith("--"):
            return opt[2:]
    return None


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    out: dict[str, argparse.Action] = {}
    for action in parser._actions:
        key = _key(action)
        if key is not None and key not in _OWN_KEYS and action.dest != argparse.SUPPRESS:
            out[key] = action
    return out


def _all_actions(
    top: argparse.ArgumentParser, sub: argparse.ArgumentParser
) -> dict[str, tuple[argparse.ArgumentParser, argparse.Action]]:
    out = {k: (sub, a) for k, a in _actions(sub).items()}
    for key in GLOBAL_KEYS:
        action = _actions(top).get(key)
        if action is not None:
            out[key] = (top, action)
    return out


def _is_switch(action: argparse.Action) -> bool:
    return isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction))


def _is_list(action: argparse.Action) -> bool:
    return isinstance(action, argparse._AppendAction)


def _is_map(action: argparse.Action) -> bool:
    return isinstance(action.default, dict)


def _type_name(value: Any) -> str:
    return {dict: "a mapping", list: "a list", bool: "a boolean", str: "a string"}.get(
        type(value), type(value).__name__
    )


def _convert_scalar(action: argparse.Action, key: str, value: Any, where: str) -> Any:
    """One value as the command line would give it to the action (its `type`, `choices`)."""
    if action.nargs == "?" and action.const is not None and value is True:
        return action.const  # `join: true` is a bare `--join`
    if isinstance(value, bool) or value is None or isinstance(value, (list, dict)):
        raise ConfigError(f"{where}: {key!r} must be {_expected(action)}, not {_type_name(value)}")
    kind = action.type
    if kind is int:
        if not isinstance(value, int):
            if isinstance(value, str) and value.strip().lstrip("-").isdigit():
                value = int(value)
            else:
                raise ConfigError(f"{where}: {key!r} must be an integer, not {value!r}")
    elif kind is float:
        try:
            value = float(value)
        except ValueError:
            raise ConfigError(f"{where}: {key!r} must be a number, not {value!r}") from None
    elif kind is None or not callable(kind):
        if not isinstance(value, (str, int, float)):
            raise ConfigError(f"{where}: {key!r} must be a string, not {_type_name(value)}")
        value = str(value)
    else:
        try:
            value = kind(str(value))
        except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
            raise ConfigError(f"{where}: {key!r}: {exc}") from None
    if action.choices is not None and value not in action.choices:
        if isinstance(value, str) and value.lower() in action.choices:
            return value.lower()  # ORCHESTRATOR_LOG_LEVEL=INFO
        choices = ", ".join(map(str, action.choices))
        raise ConfigError(f"{where}: {key!r} must be one of {choices}, not {value!r}")
    return value


def _expected(action: argparse.Action) -> str:
    if _is_switch(action):
        return "a boolean"
    if isinstance(action, ListOption):
        return "a list or a comma-separated string"
    if _is_list(action):
        return "a list"
    if action.type is int:
        return "an integer"
    if action.type is float:
        return "a number"
    return "a string"


def _convert(action: argparse.Action, key: str, value: Any, where: str) -> Any:
    """A file value (already YAML-typed) for `action`, or `ConfigError`."""
    if _is_switch(action):
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: {key!r} must be true or false, not {value!r}")
        # store_false: `key: true` means the flag is given, i.e. the value is False.
        return value if isinstance(action, argparse._StoreTrueAction) else not value
    if _is_list(action):
        items = value if isinstance(value, list) else None
        if items is None:
            raise ConfigError(f"{where}: {key!r} must be a list, not {_type_name(value)}")
        return [_convert_scalar(action, key, v, where) for v in items]
    if isinstance(action, ListOption):
        texts = value if isinstance(value, list) else [value]
        parts = [_convert_scalar(action, key, v, where) for v in texts]
        return [p.strip() for text in parts for p in str(text).split(",") if p.strip()]
    if _is_map(action) and isinstance(value, dict):
        out: dict[str, str] = {}
        for k, v in value.items():
            if isinstance(v, (dict, list)) or v is None or isinstance(k, (dict, list)):
                raise ConfigError(f"{where}: {key!r} must map names to strings ({k!r}: {v!r})")
            out[str(k)] = str(v).lower() if isinstance(v, bool) else str(v)
        return out
    return _convert_scalar(action, key, value, where)


def _convert_env(action: argparse.Action, key: str, text: str, where: str) -> Any:
    """An environment value (always a string) for `action`, or `ConfigError`."""
    if _is_switch(action):
        word = text.strip().lower()
        if word not in _TRUE | _FALSE:
            raise ConfigError(f"{where}: must be true or false, not {text!r}")
        return _convert(action, key, word in _TRUE, where)
    if _is_list(action) or isinstance(action, ListOption):
        return _convert(action, key, [p.strip() for p in text.split(",") if p.strip()], where)
    return _convert_scalar(action, key, text, where)


# ---------------------------------------------------------------------------------- sources
def file_values(
    path: Path,
    top: argparse.ArgumentParser,
    sub: argparse.ArgumentParser,
) -> dict[str, Any]:
    """The options a configuration file sets, by key, converted and checked."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read the configuration file {path}: {exc.strerror}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: the configuration must be a mapping of option names to values")
    actions = _all_actions(top, sub)
    out: dict[str, Any] = {}
    for raw_key, value in doc.items():
        key = str(raw_key)
        where = f"{path}"
        if key not in actions:
            hint = key.replace("_", "-")
            extra = f" (did you mean {hint!r}?)" if hint in actions else ""
            raise ConfigError(
                f"{where}: unknown key {key!r}{extra}; the {sub.prog} options are: "
                + ", ".join(
                    k for k, (_, a) in sorted(actions.items()) if a.help != argparse.SUPPRESS
                )
            )
        if value is None:
            continue  # `key:` or `key: null` (as --print-config shows an unset option): unset
        out[key] = _convert(actions[key][1], key, value, where)
    return out


def env_values(
    environ: Mapping[str, str],
    top: argparse.ArgumentParser,
    sub: argparse.ArgumentParser,
) -> dict[str, Any]:
    """The options set by `ORCHESTRATOR_<KEY>` environment variables (empty ones are unset)."""
    out: dict[str, Any] = {}
    for key, (_, action) in _all_actions(top, sub).items():
        name = ENV_PREFIX + key.upper().replace("-", "_")
        text = environ.get(name)
        if text is None or (text == "" and not _is_switch(action)):
            continue
        out[key] = _convert_env(action, key, text, f"environment variable {name}")
    return out


# ---------------------------------------------------------------------------------- parsing
def find_command(argv: Sequence[str], top: argparse.ArgumentParser) -> str | None:
    """The subcommand named in `argv` (skipping the global options and their values)."""
    takes_value = {
        opt for a in top._actions if a.nargs != 0 and a.option_strings for opt in a.option_strings
    }
    skip = False
    for token in argv:
        if skip:
            skip = False
        elif token == "--":
            return None
        elif token in takes_value:
            skip = True
        elif not token.startswith("-"):
            return token
    return None


def _find_config(argv: Sequence[str]) -> str | None:
    found = None
    for i, token in enumerate(argv):
        if token == "--config" and i + 1 < len(argv):
            found = argv[i + 1]
        elif token.startswith("--config="):
            found = token.partition("=")[2]
    return found


def _subparser(top: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser | None:
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            found = action.choices.get(command)
            return found if isinstance(found, argparse.ArgumentParser) else None
    return None


def parse_args(
    top: argparse.ArgumentParser,
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> argparse.Namespace:
    """`top.parse_args(argv)` with the configuration file and environment as defaults for
    `server` and `agent`; handles `--print-config` (prints and exits 0). A bad file or variable
    is a usage error (exit 2)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    env = os.environ if environ is None else environ
    command = find_command(args_list, top)
    sub = _subparser(top, command) if command in COMMANDS else None
    if sub is None:
        return top.parse_args(args_list)
    try:
        config = _find_config(args_list) or env.get(ENV_PREFIX + "CONFIG") or None
        values = file_values(Path(config), top, sub) if config else {}
        values.update(env_values(env, top, sub))
    except ConfigError as exc:
        sub.error(str(exc))
    actions = _all_actions(top, sub)
    lists: dict[str, list[Any]] = {}
    for key, value in values.items():
        parser, action = actions[key]
        if _is_list(action):
            value = lists[key] = list(value)
        parser.set_defaults(**{action.dest: value})
        action.required = False  # the file or environment gave it
    args = top.parse_args(args_list)
    for key, value in lists.items():
        dest = actions[key][1].dest
        given = getattr(args, dest)
        if given is not value:  # flags were appended to a copy of the file's list: replace it
            setattr(args, dest, given[len(value) :])
    if config and getattr(args, "config", None) is None:
        args.config = Path(config)
    if getattr(args, "print_config", False):
        sys.stdout.write(render_config(effective_config(top, sub, args)))
        sys.stdout.flush()
        raise SystemExit(0)
    return args


# ---------------------------------------------------------------------------------- printing
def _plain(value: Any) -> Any:
    """A parsed value as YAML that `file_values` reads back to the same value."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {k: _plain(v) for k, v in value.items()}
        return ",".join(f"{k}={v}" for k, v in value.items())  # e.g. --initial-cluster
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def effective_config(
    top: argparse.ArgumentParser, sub: argparse.ArgumentParser, args: argparse.Namespace
) -> dict[str, Any]:
    """Every option of the command (and the global ones) by key, as parsed; secrets masked.
    Hidden (test-only) options are left out unless set."""
    out: dict[str, Any] = {}
    for key, (_, action) in sorted(_all_actions(top, sub).items()):
        value = getattr(args, action.dest, None)
        if action.help == argparse.SUPPRESS and value in (None, False, action.default):
            continue
        if key in SECRET_KEYS and value:
            value = MASK
        elif _is_switch(action) and isinstance(action, argparse._StoreFalseAction):
            value = not value  # the file key is the flag: true means given
        out[key] = _plain(value)
    return out


def render_config(config: Mapping[str, Any]) -> str:
    """The configuration as a YAML document."""
    return yaml.safe_dump(dict(config), sort_keys=False, default_flow_style=False)
