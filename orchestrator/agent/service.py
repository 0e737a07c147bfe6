"""Running the agent: standalone (`orchestrator agent`) or embedded in `orchestrator server`.

Standalone::

    orchestrator agent --server https://10.0.0.1:6443[,URL...] --token TOKEN \\
        --data-dir /var/lib/agent [--ca-file ca.crt | --kubeconfig node.yaml] \\
        [--runtime auto|containerd|simulated] [--containerd-socket PATH] [--node-name NAME] \\
        [--node-ip IP] [--labels k=v,...] [--kubelet-port PORT] [--cluster-cidr CIDR]
        [--flannel-backend vxlan|host-gw|none] [--cni-conf-dir DIR] [--cni-bin-dir DIR]

The agent runs as a node (user `system:node:<name>`, group `system:nodes`), so NodeRestriction
confines it to its own Node, Lease and pods. `--token` is either a join token from `orchestrator
token create` (`K10<sha256 of the CA>::<id>.<secret>`, or the bare `<id>.<secret>` with
`--ca-file`): the agent checks the CA against the pin before sending anything, trades the token
for node credentials and keeps them in `DATA_DIR/node-kubeconfig.yaml` for later starts (see
`join.py`); or a node token itself, with the CA from `--ca-file` or a `--kubeconfig` whose
cluster entry carries `certificate-authority-data` (then `--server`/`--token` may come from it
too). There is no trust-on-first-use: a server's CA is trusted only through a pin or a file.

Several servers: `--server` may be repeated or comma-separated (config key `server`: a list
or a string; env `ORCHESTRATOR_SERVER`, comma-separated). The agent joins through the first
that answers, then learns every API server from the cluster and keeps the list in
`DATA_DIR/apiservers.json` (`apiservers.ServerLearner`); its requests go through one
`RestClient` with an `EndpointSet` (`orchestrator.client.endpoints`): they stay on one server
while it works and move to the next when it fails (refused, reset, `API_TIMEOUT`/
`CONNECT_TIMEOUT` exceeded, 503 no quorum), watches included; a failed Lease renewal is retried
within a second or two (`node.py`), so the node stays Ready when a server is powered off.

Embedded (`orchestrator server`, default on; `--no-agent` disables): the agent runs in the
server's nursery with `InProcessClient(api, system:node:<name>)` — no HTTP, still authorized and
admitted as a node — data in `DATA_DIR/agent`, and serves container logs on its own port with a
certificate for `system:node:<name>` the server issues from its CA (`DATA_DIR/agent/kubelet.crt`,
renewed by the API server's renewal loop). A standalone agent serves them with a certificate of
its own key signed by the cluster CA, obtained when joining or later with its node credentials
(`servingcert`: `DATA_DIR/kubelet.crt`, renewed within 30 days of expiry, also while it runs:
`security.renewal`). Either way the log endpoint picks up a renewed or rotated certificate
without a restart.

The log endpoint (`logs.LogEndpoint`) listens on the node's address — the InternalIP its Node
reports: `--node-ip`, else the host's outbound address; for the embedded agent the API's
`--listen` address when that is a specific one (127.0.0.1 for a server on loopback) — never on
the wildcard, and on `--kubelet-port` (both commands; default 10250, 0 = any free port). The
Node advertises the port actually bound (0 when the endpoint is not served). A port that cannot
be bound stops start-up with one line (`listenerrors.ListenerError`: `error: --kubelet-port
10.0.0.5:10250: port 10250 is already in use ...`), exit status 1: a Node must not advertise a
port some other process holds (the API server would send its log requests there).

Runtime (`--runtime`, both commands, `agent/runtimes.py`): `auto` (default) uses containerd
when its socket answers, else the simulated runtime, loudly (a WARNING and a Node label).

Networking (`agent/net/`, flags and starters in `net/flags.py`, k3s's names): the pod network
(podCIDR to the runtime; on containerd also the CNI conflist, the routes of `--flannel-backend`
and masquerade), the node proxy (containerd only, unless `--disable-proxy`) and the node DNS
(on the cluster DNS address with containerd, or on `--dns-listen`), with pods' resolv.conf and
Service variables from the agent's Service cache. Only a node on containerd changes its host's
network; the embedded agent takes the same settings from the server's flags
(`embedded_network`).

Under systemd (`orchestrator install-service agent`): READY=1 once the agent runs and the
container runtime answers (never gated on the server), STATUS= with the connection state,
WATCHDOG=1 from the trio loop, STOPPING=1 on SIGTERM, SIGHUP reloads the log level.

Autonomy knobs, server side: `--node-monitor-grace-period` (default 40 s) is how long a silent
node stays Ready; after it the node is Ready=Unknown and tainted unreachable, and pods without a
longer toleration are evicted 300 s later (the default `node.kubernetes.io/unreachable`
toleration). The agent itself never stops its pods because the server is gone; pods evicted
meanwhile are stopped when it reconnects. For long partitions give the pods a longer (or no)
`tolerationSeconds` for `node.kubernetes.io/unreachable`.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import logging
import os
import signal
import socket
import sys
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from orchestrator.agent.agent import Agent, AgentOptions
from orchestrator.agent.net.flags import (
    DEFAULT_CNI_BIN_DIR,
    DEFAULT_CNI_CONF_DIR,
    add_podnet_flags,
    network_settings,
    pod_network,
    proxy_config,
    start_node_dns,
    start_proxy,
)
from orchestrator.agent.podcontext import WorkerOptions
from orchestrator.agent.runtimes import RUNTIMES, choose_runtime
from orchestrator.config import ListOption
from orchestrator.cri.runtime import RuntimeService
from orchestrator.listenerrors import ListenerError, naming_listener
from orchestrator.memory import trim_task
from orchestrator.network.settings import NetworkSettings
from orchestrator.systemd import Notifier, reload_log_level, signal_name, watchdog_task

if TYPE_CHECKING:
    from orchestrator.agent.logs import EndpointTLS, LogEndpoint
    from orchestrator.agent.net.nodedns import NodeDnsOptions
    from orchestrator.agent.net.poddns import PodDNS
    from orchestrator.apiserver.server import ApiServer
    from orchestrator.client.config import ClientConfig
    from orchestrator.client.endpoints import EndpointSet
    from orchestrator.security.pki import Pki

__all__ = [
    "AgentConfig",
    "add_parser",
    "client_config",
    "endpoint_set",
    "main",
    "run_embedded",
    "server_urls",
]

log = logging.getLogger(__name__)


DEFAULT_KUBELET_PORT = 10250
PORT_FLAG = "--kubelet-port"


async def start_endpoint(nursery: trio.Nursery, endpoint: LogEndpoint) -> int:
    """Start the log endpoint in `nursery`; its bound port. ListenerError if it cannot listen."""
    with naming_listener(PORT_FLAG, _host_port(endpoint.host, endpoint.port)):
        port: int = await nursery.start(endpoint.run)
    log.info("log endpoint on %s", _host_port(endpoint.host, port))
    return port


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def embedded_node_ip(node_ip: str, api_listen: str) -> str:
    """The embedded agent's node address: `node_ip`, else the API's listen host when it is a
    specific address (so a server on loopback keeps its agent on loopback), else the host's
    outbound address."""
    from orchestrator.agent.node import default_ip

    if node_ip:
        return node_ip
    host = api_listen.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return "127.0.0.1"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return default_ip()
    return default_ip() if ip.is_unspecified else str(ip)


@dataclass
class AgentConfig:
    """The embedded agent of a server."""

    runtime: str = "auto"  # "auto", "containerd" or "simulated"
    containerd_socket: str | None = None
    node_name: str = ""  # default: the hostname
    labels: dict[str, str] = field(default_factory=dict)
    node_ip: str = ""  # default: the API's listen address if specific, else the outbound one
    kubelet_port: int = DEFAULT_KUBELET_PORT  # the log endpoint's; 0: any free port
    worker: WorkerOptions = field(default_factory=WorkerOptions)  # tests shorten back-offs
    lease_duration: int = 40  # the node Lease's (seconds; the kubelet's default)
    renew_interval: float = 10.0  # seconds between Lease renewals
    proxy: bool = False  # the node proxy (off: it programs the host's iptables; containerd only)
    pod_dns: PodDNS | None = None  # pods' resolv.conf (server --cluster-dns...); None: runtime's
    node_dns: NodeDnsOptions | None = None  # the node DNS server; None: not run
    # the pod network (module doc); None: not run (the server sets it from its own flags)
    network: NetworkSettings | None = None
    flannel_backend: str = "vxlan"
    cni_conf_dir: Path | None = Path(DEFAULT_CNI_CONF_DIR)
    cni_bin_dir: Path = Path(DEFAULT_CNI_BIN_DIR)


def parse_labels(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"{part!r} is not KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def default_node_name() -> str:
    return socket.gethostname().lower()


# ---------------------------------------------------------------------------------- embedded
async def run_embedded(
    api: ApiServer,
    config: AgentConfig,
    data_dir: Path,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The server's own agent (module doc); `started` once its local pods have workers."""
    from orchestrator.agent import node_client
    from orchestrator.agent.logs import LogEndpoint

    name = config.node_name or default_node_name()
    node_ip = embedded_node_ip(config.node_ip, api.opts.listen)
    labels = dict(config.labels)
    kind, runtime = await choose_runtime(config.runtime, config.containerd_socket, labels)
    # the node DNS on the cluster DNS address only with a real runtime (it changes the host's
    # interfaces); on a given address always
    node_dns = config.node_dns
    if node_dns is not None and node_dns.listen is None and kind != "containerd":
        node_dns = None
    options = AgentOptions(
        name,
        data_dir,
        labels=labels,
        node_ip=node_ip,
        worker=config.worker,
        kubelet_port=0,
        lease_duration=config.lease_duration,
        renew_interval=config.renew_interval,
        # the node proxy, the node DNS and the pods' Service variables read it
        service_cache=kind == "containerd" and (config.proxy or node_dns is not None),
        dns=config.pod_dns,
    )
    agent = Agent(node_client(api.api, name), runtime, options)
    if config.network is not None:
        options.components.append(
            pod_network(
                config.network,
                config.flannel_backend,
                name,
                node_ip,
                kind,
                client=agent.client,
                runtime=agent.runtime,
                cni_conf_dir=config.cni_conf_dir,
                cni_bin_dir=config.cni_bin_dir,
            )
        )
    try:
        async with trio.open_nursery() as nursery:
            if api.pki is not None:
                tls = await _embedded_tls(api, api.pki, name, node_ip, data_dir)
                endpoint = LogEndpoint(
                    data_dir, agent.resolve_pod, tls=tls, host=node_ip, port=config.kubelet_port
                )
                options.kubelet_port = await start_endpoint(nursery, endpoint)
                api.certs.on_reload(EMBEDDED_LEAF, endpoint.reload_tls)
            agent.reporter.opts.kubelet_port = options.kubelet_port
            await start_node_dns(nursery, options, node_dns)
            await nursery.start(agent.run)
            if options.service_cache and config.proxy:
                network = config.network or NetworkSettings.create()
                await start_proxy(nursery, agent, proxy_config(name, network))
            log.info("node agent %s running (runtime %s)", name, kind)
            task_status.started()
    finally:
        with trio.CancelScope(shield=True):
            await runtime.aclose()


EMBEDDED_LEAF = "kubelet"  # the embedded agent's serving certificate in the server's renewer


async def _embedded_tls(
    api: ApiServer, pki: Pki, name: str, node_ip: str, data_dir: Path
) -> EndpointTLS:
    """The embedded agent's serving certificate (`system:node:<name>`, SANs its name and node
    address), issued from the server's CA when missing, not covering them or expiring, and
    renewed by the API server's renewal loop from then on."""
    from orchestrator.agent import servingcert
    from orchestrator.agent.logs import EndpointTLS
    from orchestrator.security.renewal import Leaf, in_thread

    addresses = servingcert.node_addresses(name, node_ip)
    cert_path, key_path = servingcert.paths(data_dir)

    def issue() -> EndpointTLS:
        return EndpointTLS.issue(pki, name, addresses, data_dir)

    def current() -> EndpointTLS:
        data_dir.mkdir(parents=True, exist_ok=True)
        if servingcert.check(data_dir, pki.ca_pem, addresses):
            return EndpointTLS(cert_path, key_path, pki.ca_pem)
        return issue()

    tls = await trio.to_thread.run_sync(current)
    api.certs.add(Leaf(EMBEDDED_LEAF, cert_path, key_path, in_thread(issue)))
    return tls


# ---------------------------------------------------------------------------------- standalone
def add_parser(sub: Any) -> None:
    """Add `agent` to the `orchestrator` subparsers."""
    from orchestrator.agent.net.nodedns import add_dns_flags

    a = sub.add_parser("agent", help="run a node agent that joins a cluster")
    a.add_argument(
        "--server",
        action=ListOption,
        metavar="URL",
        help="API server URL, e.g. https://10.0.0.1:6443; repeat it or separate URLs with "
        "commas to give several (the agent also learns the others from the cluster)",
    )
    a.add_argument(
        "--token",
        default=os.environ.get("ORCHESTRATOR_TOKEN"),
        help="join token (K10...::id.secret, from `orchestrator token create`) or node token "
        "(env ORCHESTRATOR_TOKEN)",
    )
    a.add_argument("--data-dir", type=Path, required=True, help="local state, logs, volumes")
    a.add_argument("--ca-file", type=Path, help="the cluster CA certificate (PEM)")
    a.add_argument(
        "--kubeconfig", type=Path, help="a kubeconfig with the server, CA and token instead"
    )
    a.add_argument(
        "--runtime",
        choices=RUNTIMES,
        default="auto",
        help="auto (default): containerd if its socket answers, else simulated with a warning",
    )
    a.add_argument("--containerd-socket", help="containerd's socket (default: the system one)")
    a.add_argument("--node-name", help="the Node's name (default: the hostname)")
    a.add_argument("--node-ip", help="the Node's InternalIP (default: the outbound address)")
    a.add_argument("--labels", type=parse_labels, default={}, help="node labels k=v,k2=v2")
    a.add_argument(
        "--lease-renew-interval",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="seconds between the node's Lease renewals (default 10); keep it well under the "
        "servers' --node-monitor-grace-period",
    )
    a.add_argument(
        "--disable-proxy",
        action="store_true",
        help="do not run the node proxy (Service rules in iptables; it runs by default with "
        "the containerd runtime, never with the simulated one)",
    )
    add_kubelet_port(a)
    add_dns_flags(a)
    add_podnet_flags(a)


def embedded_network(
    config: AgentConfig, args: argparse.Namespace, network: NetworkSettings
) -> AgentConfig:
    """`config` with the pod network, node proxy and node DNS the server's flags ask for.
    They only touch the host's network with the containerd runtime (`run_embedded`).
    SystemExit (a usage error) for a bad flag."""
    from orchestrator.agent.net.nodedns import NodeDnsOptions, load_pod_dns, parse_listen

    try:
        pod_dns = load_pod_dns(str(network.cluster_dns), network.cluster_domain, args.resolv_conf)
        listen = parse_listen(args.dns_listen) if args.dns_listen else None
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    return dataclasses.replace(
        config,
        network=network,
        flannel_backend=args.flannel_backend,
        cni_conf_dir=args.cni_conf_dir,
        cni_bin_dir=args.cni_bin_dir,
        proxy=not args.disable_proxy,
        pod_dns=pod_dns,
        node_dns=NodeDnsOptions(pod_dns, listen=listen),
    )


def add_kubelet_port(parser: argparse.ArgumentParser) -> None:
    """`--kubelet-port` (both `agent` and `server`; `--log-port` is its old, hidden name)."""
    parser.add_argument(
        PORT_FLAG,
        type=_port,
        default=DEFAULT_KUBELET_PORT,
        metavar="PORT",
        help="port of the node agent's HTTPS log endpoint, on the node's address (default "
        f"{DEFAULT_KUBELET_PORT}; 0 = any free port; the Node advertises the port bound)",
    )
    parser.add_argument(
        "--log-port",
        dest="kubelet_port",
        type=_port,
        default=argparse.SUPPRESS,
        help=argparse.SUPPRESS,
    )


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0 to 65535)")
    return port


def server_urls(args: argparse.Namespace) -> list[str]:
    """The `--server` URLs (each value may hold several, comma-separated), in order."""
    from orchestrator.client.endpoints import split_servers

    return split_servers(args.server or [])


def client_config(args: argparse.Namespace) -> ClientConfig:
    from orchestrator.client.config import ClientConfig, load_kubeconfig

    servers = server_urls(args)
    if args.kubeconfig:
        cfg = load_kubeconfig(args.kubeconfig)
        return ClientConfig(
            server=(servers[0] if servers else cfg.server).rstrip("/"),
            ca_pem=args.ca_file.read_bytes() if args.ca_file else cfg.ca_pem,
            token=args.token or cfg.token,
            cert_pem=cfg.cert_pem,
            key_pem=cfg.key_pem,
            insecure=cfg.insecure,
            tls_server_name=cfg.tls_server_name,
        )
    if not servers or not args.token:
        raise SystemExit("error: the agent needs --server and --token (or --kubeconfig)")
    ca = args.ca_file.read_bytes() if args.ca_file else None
    if any(s.startswith("https:") for s in servers) and ca is None:
        raise SystemExit(
            "error: give the cluster CA with --ca-file (the server's DATA_DIR/pki/ca.crt) or "
            "--kubeconfig; the agent does not trust a server it cannot verify"
        )
    return ClientConfig(server=servers[0], ca_pem=ca, token=args.token)


API_TIMEOUT = 10.0  # seconds a request to the API may take before the agent tries another server
CONNECT_TIMEOUT = 3.0  # seconds to connect to a server (a powered-off one never answers)


def endpoint_set(args: argparse.Namespace, cfg: ClientConfig) -> EndpointSet:
    """The servers to use: `--server` (else the config's), then those learnt earlier."""
    from orchestrator.agent.apiservers import load_servers
    from orchestrator.client.endpoints import EndpointSet

    seeds = server_urls(args) or [cfg.server]
    learnt = load_servers(args.data_dir)
    if learnt:
        log.info("API servers learnt earlier: %s", ", ".join(learnt))
    return EndpointSet(seeds, learnt)


async def _serve(args: argparse.Namespace, cfg: ClientConfig) -> None:
    from orchestrator.agent import servingcert
    from orchestrator.agent.apiservers import ServerLearner
    from orchestrator.agent.logs import EndpointTLS, LogEndpoint
    from orchestrator.agent.net.nodedns import node_dns_options
    from orchestrator.agent.node import default_ip
    from orchestrator.agent.servingcert import ensure_serving_cert, node_addresses
    from orchestrator.client.rest import RestClient
    from orchestrator.controllers.runtime import HttpClient
    from orchestrator.security.renewal import CertRenewer

    name = args.node_name or default_node_name()
    node_ip = args.node_ip or default_ip()  # reported as InternalIP and listened on
    labels = dict(args.labels)
    network = network_settings(args)  # bad flags fail before anything starts
    proxy = proxy_config(name, network)
    kind, runtime = await choose_runtime(args.runtime, args.containerd_socket, labels)
    proxy_on = kind == "containerd" and not args.disable_proxy
    pod_dns, dns = node_dns_options(args, kind)
    options = AgentOptions(
        name,
        args.data_dir,
        labels=labels,
        node_ip=node_ip,
        kubelet_port=0,  # until the log endpoint listens
        renew_interval=args.lease_renew_interval,
        # the node proxy, the node DNS and the pods' Service variables read it
        service_cache=kind == "containerd" or dns is not None,
        dns=pod_dns,
    )
    notifier = Notifier.from_env()
    sigs = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    try:
        with trio.open_signal_receiver(*sigs) as signals:
            endpoints = endpoint_set(args, cfg)
            async with RestClient(
                cfg,
                user_agent=f"orchestrator-agent/{name}",
                timeout=API_TIMEOUT,
                connect_timeout=CONNECT_TIMEOUT,
                endpoints=endpoints,
            ) as rest:
                agent = Agent(HttpClient(rest, field_manager="kubelet"), runtime, options)
                options.components.append(
                    pod_network(
                        network,
                        args.flannel_backend,
                        name,
                        node_ip,
                        kind,
                        client=agent.client,
                        runtime=agent.runtime,
                        cni_conf_dir=args.cni_conf_dir,
                        cni_bin_dir=args.cni_bin_dir,
                    )
                )
                async with trio.open_nursery() as nursery:
                    await nursery.start(watchdog_task, notifier)
                    await nursery.start(ServerLearner(rest, endpoints, args.data_dir).run)
                    await start_node_dns(nursery, options, dns)
                    addresses = node_addresses(name, node_ip)
                    served = await ensure_serving_cert(cfg, args.data_dir, addresses)
                    if served is not None and cfg.ca_pem is not None:
                        endpoint = LogEndpoint(
                            args.data_dir,
                            agent.resolve_pod,
                            tls=EndpointTLS(served[0], served[1], cfg.ca_pem),
                            host=node_ip,
                            port=args.kubelet_port,
                        )
                        options.kubelet_port = await start_endpoint(nursery, endpoint)
                        # renewed while running, through the server as at start
                        certs = CertRenewer()
                        certs.add(servingcert.leaf(cfg, args.data_dir, addresses))
                        certs.on_reload(servingcert.LEAF, endpoint.reload_tls)
                        await nursery.start(certs.run)
                    agent.reporter.opts.kubelet_port = options.kubelet_port
                    notifier.status("starting: restoring local pods")
                    await nursery.start(agent.run)
                    if proxy_on:
                        await start_proxy(nursery, agent, proxy)
                    log.info("node agent %s running against %s", name, ", ".join(endpoints.urls))
                    await wait_runtime(runtime, notifier)
                    notifier.ready(connection_status(agent, endpoints))
                    nursery.start_soon(_report_connection, agent, endpoints, notifier)
                    nursery.start_soon(trim_task)  # start-up garbage back to the kernel
                    async for signum in signals:
                        if signum == signal.SIGHUP:
                            notifier.reloading()
                            changes = reload_log_level()
                            log.warning("reloaded: %s", "; ".join(changes) or "nothing changed")
                            notifier.ready()
                            continue
                        name = signal_name(signum)  # "SIGINT", not "2"
                        log.info("received %s: stopping (containers keep running)", name)
                        notifier.stopping("stopping (containers keep running)")
                        nursery.cancel_scope.cancel()
                        break
    finally:
        with trio.CancelScope(shield=True):
            await runtime.aclose()


RUNTIME_RETRY = 2.0  # seconds between runtime checks before READY=1


async def wait_runtime(runtime: RuntimeService, notifier: Notifier) -> None:
    """Until the container runtime answers `version()` (STATUS says what it waits for)."""
    from orchestrator.cri.runtime import CriError

    while True:
        try:
            with trio.fail_after(10):
                await runtime.version()
            return
        except (CriError, OSError, trio.TooSlowError) as exc:
            notifier.status(f"waiting for the container runtime: {exc or type(exc).__name__}")
            await trio.sleep(RUNTIME_RETRY)


def connection_status(agent: Agent, endpoints: EndpointSet) -> str:
    state = "connected to" if agent.connected else "not connected to"
    known = len(endpoints.urls)
    return f"{state} {endpoints.current} ({known} API servers known); {len(agent.workers)} pods"


async def _report_connection(agent: Agent, endpoints: EndpointSet, notifier: Notifier) -> None:
    """STATUS= whenever the connection state or pod count changes (polled: the agent exposes
    them as plain attributes)."""
    while True:
        notifier.status(connection_status(agent, endpoints))
        await trio.sleep(1.0)


def main(args: argparse.Namespace) -> int:
    from orchestrator.agent.apiservers import load_servers
    from orchestrator.agent.join import JoinError, is_join_token, join_config
    from orchestrator.agent.servingcert import node_addresses

    servers = server_urls(args)
    if not args.kubeconfig and servers and args.token and is_join_token(args.token):
        ca = args.ca_file.read_bytes() if args.ca_file else None
        name = args.node_name or default_node_name()
        addresses = node_addresses(name, args.node_ip or "")
        known = list(dict.fromkeys([*servers, *load_servers(args.data_dir)]))
        try:
            cfg = trio.run(
                partial(join_config, serving_addresses=addresses),
                known,
                args.token,
                args.data_dir,
                name,
                ca,
            )
        except JoinError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    else:
        cfg = client_config(args)
    try:
        failure = run_agent(args, cfg)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if failure is not None:
        print(f"error: {failure}", file=sys.stderr)
        return 1
    return 0


def run_agent(args: argparse.Namespace, cfg: ClientConfig) -> ListenerError | None:
    """Run the agent until it is stopped; the ListenerError that stopped its start, if one did."""
    failure: BaseException | None = None
    try:
        trio.run(_serve, args, cfg)
    except* ListenerError as group:  # nurseries nest groups: keep the one line
        failure = group.exceptions[0]
        while isinstance(failure, BaseExceptionGroup):
            failure = failure.exceptions[0]
    return failure if isinstance(failure, ListenerError) else None
