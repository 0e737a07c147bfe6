"""kubectl-like commands for devices without kubectl: `apply`, `get`, `describe`, `delete`,
`scale`, `logs`, `rollout`, `explain`, `api-resources`.

They read the same kubeconfig as kubectl (`--kubeconfig`, else `$KUBECONFIG`, else
`~/.kube/config`; `--context`; `-n` over the context's namespace) and talk to the API server
through `orchestrator.client.RestClient`. One module per command group; `add_parsers` wires them
into the `orchestrator` parser and `main(args)` runs one. Invariant: every expected failure
(Status errors, unreachable server, bad kubeconfig, bad input) is printed as kubectl prints it,
on stderr, with exit status 1 and no traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TextIO

import httpx
import trio

from orchestrator.cli.kube import apply as _apply
from orchestrator.cli.kube import describe as _describe
from orchestrator.cli.kube import explain as _explain
from orchestrator.cli.kube import get as _get
from orchestrator.cli.kube import logs as _logs
from orchestrator.cli.kube import rollout as _rollout
from orchestrator.cli.kube import scale as _scale
from orchestrator.cli.kube._common import CommandError, Session, format_error
from orchestrator.client import (
    ApiConnectionError,
    ApiException,
    ConfigError,
    ResourceNotFound,
    RestClient,
    load_kubeconfig,
)

__all__ = ["COMMANDS", "add_parsers", "main", "run"]

Handler = Callable[[Session, argparse.Namespace], Awaitable[int]]

_HANDLERS: dict[str, Handler] = {
    "apply": _apply.apply,
    "delete": _apply.delete,
    "get": _get.get,
    "api-resources": _get.api_resources,
    "describe": _describe.describe,
    "scale": _scale.scale,
    "logs": _logs.logs,
    "rollout": _rollout.rollout,
    "explain": _explain.explain,
}
COMMANDS = frozenset(_HANDLERS)


def _common_parser() -> argparse.ArgumentParser:
    c = argparse.ArgumentParser(add_help=False)
    c.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
    c.add_argument("--context", help="kubeconfig context (default: current-context)")
    c.add_argument("-n", "--namespace", help="namespace (default: the context's, else default)")
    c.add_argument(
        "--request-timeout", type=float, default=30.0, help="seconds per request (not streams)"
    )
    return c


def add_parsers(sub: Any) -> None:
    """Add the kubectl-like subcommands to the `orchestrator` subparsers."""
    common = _common_parser()
    for mod in (_apply, _get, _describe, _scale, _logs, _rollout, _explain):
        mod.add_parsers(sub, common)


async def run(
    args: argparse.Namespace,
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> int:
    """Run one parsed command; returns the exit status (errors printed, never raised)."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        cfg = load_kubeconfig(args.kubeconfig, args.context, namespace=args.namespace)
        async with RestClient(
            cfg,
            transport=transport,
            timeout=args.request_timeout,
            on_warning=lambda text: print(f"Warning: {text}", file=err, flush=True),
        ) as client:
            session = Session(client, cfg.namespace, bool(args.namespace), out, err)
            return await _HANDLERS[args.command](session, args)
    except (
        ApiException,
        ApiConnectionError,
        CommandError,
        ConfigError,
        ResourceNotFound,
        OSError,
    ) as exc:
        print(format_error(exc), file=err, flush=True)
        return 1


def main(args: argparse.Namespace) -> int:
    """Entry from `orchestrator.cli.main`: run under trio, Ctrl-C exits 130 quietly."""
    if getattr(args, "log_level", "info") != "debug":
        for name in ("httpx", "httpcore"):  # one INFO line per request is not kubectl's output
            logging.getLogger(name).setLevel(logging.WARNING)
    try:
        return trio.run(run, args)
    except KeyboardInterrupt:
        return 130
