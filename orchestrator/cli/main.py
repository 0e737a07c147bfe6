"""Entry point of the `orchestrator` command.

Subcommands: `server` (run a Raft server with the replicated KV store), `kv` (put/get/delete
against it), `member` (membership changes), `status` (per-server Raft status, members and
leader; nodes and pods with a kubeconfig), `backup` / `restore` (`cli/backup.py`), `certs
check|rotate` (`cli/certs.py`), and the
kubectl-like `apply`, `get`, `describe`, `delete`, `scale`, `logs`, `rollout`, `explain`,
`api-resources` against the API server (`orchestrator.cli.kube`). Errors are
printed as one line for people, never as a traceback, with exit status 1 (2 for usage errors).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from orchestrator import config, logsetup

DEFAULT_PEER = "127.0.0.1:7001"
DEFAULT_CLIENT = "127.0.0.1:7101"
DEFAULT_API = "127.0.0.1:6443"


def _parse_cluster(text: str) -> dict[int, str]:
    out: dict[int, str] = {}
    for part in filter(None, text.split(",")):
        nid, sep, addr = part.partition("=")
        if not sep or not nid.strip().isdigit() or int(nid) < 1:
            raise argparse.ArgumentTypeError(f"{part!r} is not ID=HOST:PORT (ids start at 1)")
        out[int(nid)] = addr.strip()
    return out


def _duration(text: str) -> float:
    """Seconds from "40s", "1m", "500ms", "1h" or a plain number of seconds."""
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    for suffix in ("ms", "s", "m", "h"):
        if text.endswith(suffix):
            number, scale = text[: -len(suffix)], units[suffix]
            break
    else:
        number, scale = text, 1.0
    try:
        value = float(number) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 40s or 1m") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the duration must be positive")
    return value


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

    s = sub.add_parser("server", help="run a server (Raft member + replicated store)")
    s.add_argument("--data-dir", type=Path, required=True, help="where the databases live")
    s.add_argument(
        "--node-id", type=int, help="this server's Raft id (>= 1; default 1, random when joining)"
    )
    s.add_argument("--peer-listen", default=DEFAULT_PEER, help="HOST:PORT for other servers")
    s.add_argument("--advertise", help="HOST:PORT other servers use to reach this one")
    s.add_argument("--client-listen", default=DEFAULT_CLIENT, help="HOST:PORT for clients")
    s.add_argument(
        "--initial-cluster",
        type=_parse_cluster,
        help="founders of a NEW cluster: ID=HOST:PORT,... (default: this server alone)",
    )
    s.add_argument(
        "--join",
        metavar="URL",
        nargs="?",
        const="",
        help="join the cluster of the server at URL (its client address); without URL, start "
        "empty and wait for `member add-learner`",
    )
    s.add_argument(
        "--server",
        action=config.ListOption,
        metavar="URL",
        help="join the cluster through this server's Kubernetes API, e.g. "
        "https://10.0.0.1:6443 (repeat it or separate URLs with commas: tried in turn); "
        "with --token, best the K10... token in a server's DATA_DIR/server-token",
    )
    s.add_argument(
        "--token",
        default=os.environ.get("ORCHESTRATOR_TOKEN"),
        help="cluster join token (env ORCHESTRATOR_TOKEN); a new cluster makes one",
    )
    s.add_argument("--snapshot-every", type=int, default=10_000, help="entries between snapshots")
    s.add_argument("--keep-tail", type=int, default=5_000, help="entries kept after a snapshot")
    s.add_argument("--tick-ms", type=int, default=100, help="Raft tick (heartbeat) interval")
    s.add_argument("--enable-fault-injection", action="store_true", help=argparse.SUPPRESS)
    s.add_argument(
        "--quota-bytes",
        type=int,
        default=2 * 1024**3,
        help="store size (keys + values + history) above which only deletes and "
        "compaction are accepted",
    )
    s.add_argument(
        "--auto-compaction",
        default="5m",
        help="history kept: a duration (5m, 300s, 1h) or a number of revisions; 0 = off",
    )
    s.add_argument("--election-ticks", type=int, default=10, help="election timeout in ticks")
    s.add_argument(
        "--listen",
        default=DEFAULT_API,
        help="HOST:PORT of the Kubernetes API (HTTPS); use 0.0.0.0:6443 to serve other devices "
        "(the serving certificate then also names this host's addresses); 'none' = store only",
    )
    s.add_argument(
        "--tls-san",
        action="append",
        default=[],
        metavar="NAME_OR_IP",
        help="extra name or IP for the serving certificate (repeatable)",
    )
    s.add_argument(
        "--runtime",
        choices=["auto", "containerd", "simulated"],
        default="auto",
        help="container runtime of this server's node agent; auto (default): containerd if "
        "its socket answers, else simulated with a warning",
    )
    s.add_argument("--node-name", help="name of this server's Node (default: the hostname)")
    s.add_argument("--no-agent", action="store_true", help="run no node agent on this server")
    s.add_argument("--containerd-socket", help="containerd's socket for this server's agent")
    from orchestrator.agent.service import add_kubelet_port

    add_kubelet_port(s)  # --kubelet-port: the embedded agent's log endpoint
    s.add_argument(
        "--no-controllers",
        action="store_true",
        help="run no controllers on this server (they run only on the Raft leader anyway)",
    )
    s.add_argument(
        "--node-monitor-grace-period",
        type=_duration,
        default=40.0,
        metavar="DURATION",
        help="heartbeat silence before a node is Ready=Unknown and tainted unreachable, e.g. "
        "40s (default) or 10s for a small edge site on a reliable network",
    )
    s.add_argument(
        "--drain-timeout",
        type=_duration,
        default=5.0,
        metavar="DURATION",
        help="on SIGTERM, how long requests in progress may take to finish before the server "
        "stops anyway (default 5s; keep it well below the unit's TimeoutStopSec)",
    )
    s.add_argument("--plain-http", action="store_true", help=argparse.SUPPRESS)

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


def _server(args: argparse.Namespace) -> int:
    from orchestrator.raft.node import NodeConfig
    from orchestrator.server import (
        ServerOptions,
        cluster_token,
        node_identity,
        serve_until_signalled,
    )
    from orchestrator.store.raftstore import CompactionPolicy
    from orchestrator.testing.faults import FaultInjector

    if args.node_id is not None and args.node_id < 1:
        raise SystemExit("error: --node-id must be >= 1")
    from orchestrator.client.endpoints import split_servers

    servers = split_servers(args.server or [])
    if servers and args.join is not None:
        raise SystemExit(
            "error: give either --server URL (a server's API) or --join HOST:PORT (a server's "
            "client address) to join through, not both"
        )
    if servers and not args.token:
        raise SystemExit("error: --server URL needs --token (or ORCHESTRATOR_TOKEN)")
    for url in servers:
        if not url.startswith(("https://", "http://")):
            raise SystemExit(
                f"error: --server {url!r} is not a URL like https://HOST:6443 (a server's API; "
                "its client address HOST:PORT goes to --join)"
            )
    joining = args.join is not None or bool(servers)
    if args.join is not None and not args.token and not (args.data_dir / "token").exists():
        raise SystemExit(
            "error: --join needs --token (or ORCHESTRATOR_TOKEN): the cluster's token, from "
            "which the servers' certificate authority is derived"
        )
    if (
        args.initial_cluster
        and len(args.initial_cluster) > 1
        and not args.token
        and not (args.data_dir / "token").exists()
    ):
        raise SystemExit(
            "error: the founders of a multi-server cluster must share one --token "
            "(it also encrypts the credentials they share)"
        )
    node_id = node_identity(args.data_dir, args.node_id, joining=joining)
    from orchestrator.security.jointoken import parse_token

    try:  # `K10<CA sha256>::<cluster token>`: the pin is checked before joining
        given = parse_token(args.token) if args.token else None
    except ValueError as exc:
        raise SystemExit(f"error: --token: {exc}") from None
    if (
        given is not None
        and not joining
        and args.initial_cluster
        and not (args.data_dir / "pki" / "ca.crt").exists()
    ):
        from orchestrator.security.peercerts import check_founder_token

        try:  # the new cluster's CA is derived from the token: a weak one could be guessed
            check_founder_token(given.credentials, len(args.initial_cluster))
        except ValueError as exc:
            raise SystemExit(f"error: --token: {exc}") from None
    token = cluster_token(args.data_dir, given.credentials if given else None)
    founders: dict[int, str] = {}
    if not joining:
        founders = args.initial_cluster or {node_id: args.advertise or args.peer_listen}
        if node_id not in founders:
            raise SystemExit(f"error: --initial-cluster does not name this server ({node_id})")
    node = NodeConfig(
        node_id=node_id,
        data_dir=args.data_dir,
        peer_listen=args.peer_listen,
        advertise=args.advertise,
        founders=founders,
        tick_interval=args.tick_ms / 1000,
        election_tick=args.election_ticks,
        snapshot_every=args.snapshot_every,
        keep_tail=args.keep_tail,
        faults=FaultInjector(random.Random()) if args.enable_fault_injection else None,
    )
    try:
        compaction = CompactionPolicy.parse(args.auto_compaction)
    except ValueError:
        raise SystemExit(  # noqa: B904  (a usage error: the ValueError adds nothing)
            f"error: --auto-compaction {args.auto_compaction!r} is not like 5m or 10000"
        )
    from orchestrator.agent.service import AgentConfig, default_node_name
    from orchestrator.apiserver.server import ApiOptions, split_host_port
    from orchestrator.controllers.runtime.manager import ControllerOptions

    serve_api = args.listen.lower() not in ("", "none")
    if serve_api:
        try:
            split_host_port(args.listen)
        except ValueError:
            raise SystemExit(f"error: --listen {args.listen!r} is not HOST:PORT") from None
    opts = ServerOptions(
        node,
        args.client_listen,
        token=token,
        join_url=args.join,
        join_servers=servers,
        ca_pin=(given.pin or "") if given else "",
        quota_bytes=args.quota_bytes,
        compaction=compaction,
        controllers=not args.no_controllers,
        agent=None
        if args.no_agent or not serve_api
        else AgentConfig(
            runtime=args.runtime,
            containerd_socket=args.containerd_socket,
            node_name=args.node_name or "",
            kubelet_port=args.kubelet_port,
        ),
        controller_options=ControllerOptions(
            node_monitor_grace_period=args.node_monitor_grace_period
        ),
        drain_timeout=args.drain_timeout,
        api=None
        if not serve_api
        else ApiOptions(
            args.data_dir,
            args.listen,
            tls=not args.plain_http,
            extra_sans=args.tls_san,
            cluster_token=token,
            # The embedded agent's Node (the log proxy reads it like any other node's).
            node_name="" if args.no_agent else (args.node_name or default_node_name()),
        ),
    )
    print(f"node {node_id}; join token: {token}", file=sys.stderr, flush=True)
    if serve_api:
        kubeconfig = (args.data_dir / "kubeconfig.yaml").resolve()
        print(
            f"kubeconfig: {kubeconfig} (admin; written once the API listens on {args.listen}): "
            f"export KUBECONFIG={kubeconfig}",
            file=sys.stderr,
            flush=True,
        )
    from orchestrator.cluster.join import JoinFailed
    from orchestrator.listenerrors import ListenerError

    failure: BaseException | None = None
    try:
        trio.run(serve_until_signalled, opts)
    except* (ListenerError, PermissionError, JoinFailed, trio.TooSlowError) as eg:
        failure = eg.exceptions[0]
        while isinstance(failure, BaseExceptionGroup):  # nurseries nest groups
            failure = failure.exceptions[0]
    if failure is not None:
        timed_out = isinstance(failure, trio.TooSlowError)
        print(f"error: {'could not join in time' if timed_out else failure}", file=sys.stderr)
        return 1
    return 0


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
            return _server(args)
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
