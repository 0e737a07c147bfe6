"""`orchestrator server`: its command line and start-up, beside the agent's (`agent/service.py`).

`add_parser(sub)` adds the `server` subcommand to the `orchestrator` subparsers; `main(args)`
checks the flags that depend on each other (joining needs a token, founders of a multi-server
cluster share one), resolves the node's identity and the cluster token in the data directory,
builds `ServerOptions` and runs `orchestrator.server.serve_until_signalled` under trio.
`service_parser()` is a parser of the two long-running commands alone (`server` and `agent`,
each with `--config`/`--print-config`): `install-service` checks a unit's flags with it before
writing the unit.

This module is on the long-running server's import path: it imports only `argparse`, `config`
and, lazily, what `server` itself needs (never the kubectl-like CLI or the benchmark).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from pathlib import Path
from typing import Any

import trio

from orchestrator import config

__all__ = ["DEFAULT_API", "DEFAULT_CLIENT", "DEFAULT_PEER", "add_parser", "main", "service_parser"]

DEFAULT_PEER = "127.0.0.1:7001"
DEFAULT_CLIENT = "127.0.0.1:7101"
DEFAULT_API = "127.0.0.1:6443"
# `apiserver.flowcontrol.DEFAULT_MAX_REQUESTS_INFLIGHT`, not imported: this module stays light
# (a test checks the two agree).
DEFAULT_MAX_REQUESTS_INFLIGHT = 600


def _parse_cluster(text: str) -> dict[int, str]:
    out: dict[int, str] = {}
    for part in filter(None, text.split(",")):
        nid, sep, addr = part.partition("=")
        if not sep or not nid.strip().isdigit() or int(nid) < 1:
            raise argparse.ArgumentTypeError(f"{part!r} is not ID=HOST:PORT (ids start at 1)")
        out[int(nid)] = addr.strip()
    return out


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be 0 or more")
    return value


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


def add_parser(sub: Any) -> None:
    """Add `server` to the `orchestrator` subparsers."""
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
    s.add_argument(
        "--tick-ms",
        type=int,
        default=100,
        help="Raft tick interval; the leader heartbeats every 2 ticks",
    )
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
    from orchestrator.agent.net.flags import add_embedded_network_flags
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
    from orchestrator.network import settings as net

    s.add_argument(
        "--cluster-cidr",
        default=net.DEFAULT_CLUSTER_CIDR,
        metavar="CIDR",
        help=f"pod addresses; each node gets a /{net.DEFAULT_NODE_CIDR_MASK} of it as its "
        f"podCIDR (default {net.DEFAULT_CLUSTER_CIDR}, as k3s)",
    )
    s.add_argument(
        "--service-cidr",
        default=net.DEFAULT_SERVICE_CIDR,
        metavar="CIDR",
        help="Service ClusterIPs; its first address is the kubernetes Service's "
        f"(default {net.DEFAULT_SERVICE_CIDR}, as k3s)",
    )
    s.add_argument(
        "--cluster-dns",
        default=net.DEFAULT_CLUSTER_DNS,
        metavar="IP",
        help="the address pods send DNS queries to, inside --service-cidr "
        f"(default {net.DEFAULT_CLUSTER_DNS}, as k3s)",
    )
    s.add_argument(
        "--node-cidr-mask-size",
        type=int,
        default=net.DEFAULT_NODE_CIDR_MASK,
        metavar="BITS",
        help=f"prefix length of each node's podCIDR (default {net.DEFAULT_NODE_CIDR_MASK}: "
        "254 pod addresses per node; 22 gives 1,022)",
    )
    s.add_argument(
        "--cluster-domain",
        default=net.DEFAULT_CLUSTER_DOMAIN,
        metavar="DOMAIN",
        help=f"the cluster's DNS domain (default {net.DEFAULT_CLUSTER_DOMAIN})",
    )
    add_embedded_network_flags(s)  # the embedded agent's pod network, proxy and DNS
    s.add_argument(
        "--drain-timeout",
        type=_duration,
        default=5.0,
        metavar="DURATION",
        help="on SIGTERM, how long requests in progress may take to finish before the server "
        "stops anyway (default 5s; keep it well below the unit's TimeoutStopSec)",
    )
    s.add_argument(
        "--max-requests-inflight",
        type=_non_negative_int,
        default=DEFAULT_MAX_REQUESTS_INFLIGHT,
        metavar="N",
        help="seats of the API's overload gate (API Priority and Fairness), shared by its "
        "priority levels: beyond them requests wait in fair queues or get 429 Retry-After "
        f"(default {DEFAULT_MAX_REQUESTS_INFLIGHT}, as kube-apiserver's 400 + 200; 0: no limit)",
    )
    s.add_argument("--plain-http", action="store_true", help=argparse.SUPPRESS)


def service_parser() -> argparse.ArgumentParser:
    """A parser of `orchestrator server` and `orchestrator agent` alone, each with its
    `--config FILE` and `--print-config`: the flags a systemd unit passes to the service."""
    p = argparse.ArgumentParser(prog="orchestrator")
    sub = p.add_subparsers(dest="command", required=True)
    add_parser(sub)
    from orchestrator.agent import service as agent_service

    agent_service.add_parser(sub)
    for command in config.COMMANDS:
        config.add_config_options(sub.choices[command])
    return p


def main(args: argparse.Namespace) -> int:
    """Run `orchestrator server` until SIGTERM/SIGINT; 1 with one line on stderr when it
    cannot start (a port taken, a failed join), usage errors as `SystemExit`."""
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
    from orchestrator.agent.service import AgentConfig, default_node_name, embedded_network
    from orchestrator.apiserver.flowcontrol import FlowControlConfig
    from orchestrator.apiserver.server import ApiOptions, split_host_port
    from orchestrator.controllers.runtime import ControllerOptions
    from orchestrator.network.settings import NetworkSettings

    try:
        network = NetworkSettings.create(
            cluster_cidr=args.cluster_cidr,
            service_cidr=args.service_cidr,
            cluster_dns=args.cluster_dns,
            cluster_domain=args.cluster_domain,
            node_cidr_mask_size=args.node_cidr_mask_size,
        )
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
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
        else embedded_network(
            AgentConfig(
                runtime=args.runtime,
                containerd_socket=args.containerd_socket,
                node_name=args.node_name or "",
                kubelet_port=args.kubelet_port,
            ),
            args,
            network,
        ),
        controller_options=ControllerOptions(
            node_monitor_grace_period=args.node_monitor_grace_period, network=network
        ),
        network=network,
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
            flowcontrol=FlowControlConfig(max_requests_inflight=args.max_requests_inflight),
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
