"""`orchestrator token create|list|revoke`: join tokens, managed through the API server.

    orchestrator token create [--ttl 24h] [--description TEXT] [--groups system:bootstrappers]
    orchestrator token list [-o table|json]
    orchestrator token revoke ID

They talk to the API server's `/orchestrator/v1/tokens` endpoints (`apiserver/tokenapi.py`) with an
admin kubeconfig: `--kubeconfig FILE`, or `--data-dir DIR` for a server's own
`DIR/kubeconfig.yaml`, else kubectl's `$KUBECONFIG` / `~/.kube/config`. The table lives in the
replicated store, so any server will do and a revocation holds on every server.

`create` prints the token alone on stdout's last line (for scripts: `TOKEN=$(orchestrator token
create | tail -1)`), in the CA-pinning form `K10<sha256 of the CA>::<id>.<secret>`; the notes
for people go to stderr. `--ttl 0` makes a token that never expires. `list` shows IDs, expiry,
description and groups — never a secret. `revoke` takes a token ID, or a user name to revoke
that user's token (e.g. `system:node:edge-1`: a node's credentials).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import trio

PATH = "/orchestrator/v1/tokens"
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_ttl(text: str) -> float:
    """Seconds from "24h", "30m", "90s", "7d" or a plain number; 0 = never expires."""
    text = text.strip().lower()
    scale = _UNITS.get(text[-1:])
    number = text[:-1] if scale is not None else text
    try:
        value = float(number) * (scale or 1.0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 24h or 30m") from None
    if value < 0:
        raise argparse.ArgumentTypeError("the TTL cannot be negative")
    return value


def add_parser(sub: Any) -> None:
    """Add `token` to the `orchestrator` subparsers."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--kubeconfig", help="admin kubeconfig (default: $KUBECONFIG, ~/.kube)")
    common.add_argument("--data-dir", type=Path, help="a server's data dir: its kubeconfig.yaml")
    common.add_argument("--timeout", type=float, default=10.0, help="seconds before giving up")
    t = sub.add_parser("token", help="create, list and revoke join tokens")
    ts = t.add_subparsers(dest="token_command", required=True)
    c = ts.add_parser("create", parents=[common], help="a new join token (printed last)")
    c.add_argument("--ttl", type=parse_ttl, default=24 * 3600.0, help="e.g. 24h (0: never)")
    c.add_argument("--description", default="", help="what the token is for")
    c.add_argument(
        "--groups",
        default="",
        help="extra groups, comma-separated: system:bootstrappers[:...] (always included)",
    )
    ls = ts.add_parser("list", parents=[common], help="the tokens (no secrets)")
    ls.add_argument("-o", "--output", choices=["table", "json"], default="table")
    r = ts.add_parser("revoke", parents=[common], help="delete a token (ID or user name)")
    r.add_argument("id")


def _expires(value: float | None) -> str:
    if value is None:
        return "<never>"
    return dt.datetime.fromtimestamp(value, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _ttl(seconds: float | None) -> str:
    if seconds is None:
        return "<forever>"
    if seconds <= 0:
        return "<expired>"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def print_table(items: list[dict[str, Any]]) -> None:
    rows = [("ID", "TTL", "EXPIRES", "DESCRIPTION", "GROUPS")]
    for it in items:
        rows.append(
            (
                str(it.get("id", "")),
                _ttl(it.get("ttlSeconds")),
                _expires(it.get("expires")),
                str(it.get("description") or "<none>"),
                ",".join(it.get("groups") or []),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "   " + r[-1])


async def _run(args: argparse.Namespace) -> int:
    from orchestrator.client.config import load_kubeconfig
    from orchestrator.client.rest import RestClient

    path = args.kubeconfig or (args.data_dir / "kubeconfig.yaml" if args.data_dir else None)
    cfg = load_kubeconfig(path)
    with trio.fail_after(args.timeout):
        async with RestClient(cfg, user_agent="orchestrator-token") as rest:
            if args.token_command == "create":
                groups = [g.strip() for g in args.groups.split(",") if g.strip()]
                body = {"ttlSeconds": args.ttl, "description": args.description, "groups": groups}
                doc = await rest.request("POST", PATH, body=body)
                print(
                    f"token {doc['id']} created, expires {_expires(doc.get('expires'))}; join an "
                    f"agent with: orchestrator agent --server {cfg.server} --token <the token>",
                    file=sys.stderr,
                )
                print(doc["token"], flush=True)
            elif args.token_command == "list":
                doc = await rest.request("GET", PATH)
                items = doc.get("items") or []
                if args.output == "json":
                    print(json.dumps(items, indent=2))
                else:
                    print_table(items)
            else:
                await rest.request("DELETE", f"{PATH}/{quote(args.id, safe=':')}")
                print(f'token "{args.id}" revoked')
    return 0


def main(args: argparse.Namespace) -> int:
    from orchestrator.client.config import ConfigError
    from orchestrator.client.protocol import ApiConnectionError, ApiException

    try:
        return trio.run(_run, args)
    except (ApiException, ApiConnectionError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except trio.TooSlowError:
        print("error: timed out talking to the API server", file=sys.stderr)
        return 1
