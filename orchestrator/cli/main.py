"""Entry point of the `orchestrator` command.

Subcommands: `server` (run a Raft server with the replicated KV store; `cli/server.py`), `agent`
(a node agent; `agent/service.py`), `kv` (put/get/delete against the store), `member`
(membership changes), `status` (per-server Raft status, members and leader; nodes and pods with
a kubeconfig), `backup` / `restore` (`cli/backup.py`), `certs check|rotate` (`cli/certs.py`),
and the kubectl-like `apply`, `get`, `describe`, `delete`, `scale`, `logs`, `rollout`,
`explain`, `api-resources` against the API server (`orchestrator.cli.kube`). Errors are printed
as one line for people, never as a traceback, with exit status 1 (2 for usage errors).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import trio

from orchestrator import config, logsetup


def _build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The `orchestrator` command's parser; with `argv`, only what that command line needs:
    `server` and `agent` run for days, so for them the other commands' modules (the kubectl-like
    CLI and its HTTP client, the benchmark, ...) are not imported into the long-running process
    (megabytes of idle RSS). Without `argv`, every command."""
    p = argparse.ArgumentParser(prog="orchestrator", description="Edge orchestrator.")
    p.add_argument(
        "--log-level",
        default=os.environ.get("ORCHESTRATOR_LOG_LEVEL", "info").lower(),
        choices=["debug", "info", "warning", "error"],
        help="(env ORCHESTRATOR_LOG_LEVEL; a service re-reads it from its env file on SIGHUP)",
    )
    p.add_argument(
        "--log-format",
        default="auto",
        choices=list(logsetup.FORMATS),
        help="json (one object per line), text, or auto: text on a terminal, json otherwise "
        "(env ORCHESTRATOR_LOG_FORMAT for server and agent)",
    )
    sub = p.add_subparsers(dest="command", required=True)

    from orchestrator.cli import server as server_cli  # orchestrator server

    server_cli.add_parser(sub)

    ep = argparse.ArgumentParser(add_help=False)
    from orchestrator.cli import (
        storecreds,  # --endpoints, --data-dir, --cacert/--cert/--key, --timeout
    )

    storecreds.add_options(ep)

    kv = sub.add_parser("kv", help="read and write the replicated key-value store")
    kvs = kv.add_subparsers(dest="kv_command", required=True)
    put = kvs.add_parser("put", parents=[ep])
    put.add_argument("key")
    put.add_argument("value")
    get = kvs.add_parser("get", parents=[ep])
    get.add_argument("key")
    get.add_argument("--stale", action="store_true", help="serve from the local copy")
    get.add_argument(
        "-o",
        "--output",
        choices=["text", "json"],
        default="text",
        help="text: the value if it is UTF-8 text; json: exact bytes (base64) and revisions",
    )
    dele = kvs.add_parser("delete", parents=[ep])
    dele.add_argument("key")

    mem = sub.add_parser("member", help="change cluster membership (one server at a time)")
    ms = mem.add_subparsers(dest="member_command", required=True)
    al = ms.add_parser("add-learner", parents=[ep], help="add a non-voting member")
    al.add_argument("node_id", type=int)
    al.add_argument("peer_addr", help="HOST:PORT the new server listens on for peers")
    for name, help_ in (
        ("promote", "make a caught-up learner a voter"),
        ("remove", "remove a member"),
        ("transfer-leader", "hand leadership to this voter"),
    ):
        c = ms.add_parser(name, parents=[ep], help=help_)
        c.add_argument("node_id", type=int)

    st = sub.add_parser(
        "status",
        parents=[ep],
        help="Raft status of every server, members and leader; nodes and pods with a kubeconfig",
    )
    st.add_argument("-o", "--output", choices=["table", "json"], default="table")
    lean = argv is not None and config.find_command(argv, p) in config.COMMANDS
    if not lean:
        from orchestrator.cli import backup as backup_cli  # orchestrator backup | restore
        from orchestrator.cli import status as status_cli  # status --kubeconfig / --data-dir

        status_cli.add_options(st)
        backup_cli.add_parsers(sub, ep)

        from orchestrator.cli import (
            kube,  # kubectl-like commands against the API server (apply, get, ...)
        )

        kube.add_parsers(sub)
        from orchestrator.bench import reconcile as bench_reconcile  # orchestrator bench reconcile

        bench_reconcile.add_parser(sub)
    from orchestrator.agent import service as agent_service  # orchestrator agent

    agent_service.add_parser(sub)
    if not lean:
        from orchestrator.cli import token as token_cli  # orchestrator token create|list|revoke

        token_cli.add_parser(sub)
        from orchestrator.cli import certs as certs_cli  # orchestrator certs check|rotate

        certs_cli.add_parser(sub)
        from orchestrator.cli import install_service  # orchestrator install-service

        install_service.add_parser(sub)
    for command in config.COMMANDS:  # --config FILE, --print-config
        config.add_config_options(sub.choices[command])
    return p


async def _client_command(args: argparse.Namespace) -> int:
    from orchestrator.cli import storecreds
    from orchestrator.store.client import StoreClient

    endpoints, tls, cluster = storecreds.resolve(args)
    print(f"cluster: {cluster} (servers {', '.join(endpoints)})", file=sys.stderr, flush=True)
    with trio.fail_after(args.timeout):
        async with StoreClient(endpoints, tls=tls) as c:
            if args.command == "kv":
                if args.kv_command == "put":
                    await c.put(args.key, args.value.encode())
                    print("OK")
                elif args.kv_command == "get":
                    from orchestrator.cli.kvget import print_value

                    got = await c.get_kv(args.key, linearizable=not args.stale)
                    if got is None:
                        print(f"error: key {args.key!r} not found", file=sys.stderr)
                        return 1
                    return print_value(got, args.output, sys.stdout, sys.stderr)
                else:
                    print("deleted" if await c.delete(args.key) else "not found")
            elif args.command == "member":
                op = {
                    "add-learner": "add_learner",
                    "promote": "promote",
                    "remove": "remove",
                    "transfer-leader": "transfer",
                }[args.member_command]
                extra = [args.peer_addr] if op == "add_learner" else []
                await c.call(op, args.node_id, *extra)
                print("OK")
            else:
                rows = []
                for e in endpoints:
                    try:
                        rows.append((e, await c.status(e)))
                    except (OSError, Exception) as exc:  # one dead server must not hide the rest
                        rows.append((e, {"error": str(exc) or type(exc).__name__}))
                from orchestrator.cli import status as status_cli

                path = status_cli.kubeconfig_of(args)
                kube = None if path is None else await status_cli.kube_summary(path, 5.0)
                _print_status(rows, args.output, kube)
    return 0


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024  # type: ignore[assignment]  # int -> float for display
    return str(n)


def _print_status(
    rows: list[tuple[str, dict[str, Any]]], output: str, kube: dict[str, Any] | None = None
) -> None:
    from orchestrator.cli import status as status_cli

    if output == "json":
        report: dict[str, Any] = dict(rows)
        if kube is not None:  # only then: without a kubeconfig the keys are the endpoints
            report["cluster"] = {**status_cli.raft_summary(rows), **kube}
        print(json.dumps(report, indent=2, default=str))
        return
    print(
        f"{'ENDPOINT':21} {'ID':>3} {'ROLE':9} {'TERM':>5} {'LEADER':>6} {'COMMIT':>8} "
        f"{'APPLIED':>8} {'REV':>8} {'COMPACTED':>9} {'DB':>9} {'WAL':>9}  MEMBERS"
    )
    for e, st in rows:
        if "error" in st:
            print(f"{e:21} unreachable: {st['error']}")
            continue
        members = ",".join(map(str, st["voters"]))
        if st["learners"]:
            members += " learners:" + ",".join(map(str, st["learners"]))
        print(
            f"{e:21} {st['id']:>3} {st['role']:9} {st['term']:>5} {st['leader']:>6} "
            f"{st['commit']:>8} {st['applied']:>8} {st.get('revision', 0):>8} "
            f"{st.get('compact_revision', 0):>9} {_size(st['db_bytes']):>9} "
            f"{_size(st.get('wal_bytes', 0)):>9}  {members}"
        )
        for pid, pr in st.get("progress", {}).items():
            if int(pid) == st["id"]:
                continue
            lag = st["last_index"] - pr["match"]
            learner = " (learner)" if pr["learner"] else ""
            print(f"{'':21}   peer {pid}: {pr['state']}, match {pr['match']}, lag {lag}{learner}")
    status_cli.print_overview(status_cli.raft_summary(rows), kube)


def main(argv: Sequence[str] | None = None) -> int:
    # A configuration file and ORCHESTRATOR_<KEY> variables give `server`/`agent` defaults.
    argv = list(sys.argv[1:] if argv is None else argv)
    args = config.parse_args(_build_parser(argv), argv)
    logsetup.setup(args.log_level, args.log_format)
    try:
        if args.command == "server":
            from orchestrator.cli import server as server_cli

            return server_cli.main(args)
        if args.command == "token":
            from orchestrator.cli import token as token_cli

            return token_cli.main(args)
        if args.command == "agent":
            from orchestrator.agent import service as agent_service

            return agent_service.main(args)
        if args.command == "certs":
            from orchestrator.cli import certs as certs_cli

            return certs_cli.main(args)
        if args.command == "install-service":
            from orchestrator.cli import install_service

            return install_service.main(args)
        if args.command == "bench":
            from orchestrator.bench import reconcile as bench_reconcile

            return bench_reconcile.main(args)
        from orchestrator.cli import backup as backup_cli
        from orchestrator.cli import kube

        if args.command in backup_cli.COMMANDS:
            return backup_cli.main(args)
        if args.command in kube.COMMANDS:
            return kube.main(args)
        return trio.run(_client_command, args)
    except KeyboardInterrupt:
        return 130
    except trio.TooSlowError:
        print(
            "error: timed out (is a server running at --endpoints, and does it have a leader?)",
            file=sys.stderr,
        )
        return 1
    except Exception as exc:
        from orchestrator.store.client import ClientError

        if isinstance(exc, (ClientError, OSError, ValueError)):
            print(f"error: {exc}", file=sys.stderr)
            return 1
        raise
