"""The agent's node-local DNS, put together: the node's resolv.conf read (`load_pod_dns`), the
cluster DNS address on a dummy interface `orch-dns` (`ensure_dns_interface`, as NodeLocal
DNSCache does), and `run_node_dns`, which keeps a `DnsServer` running there.

Where it listens: `--dns-listen HOST:PORT` when given (tests, the simulated runtime: any address
the process may bind, e.g. 127.0.0.1:5353); else the cluster DNS address, port 53, on
`orch-dns`, created in the agent's (host's) network namespace. Failing to make the interface or
to bind is logged and retried every `RETRY` seconds, never fatal to the agent: pods only lose
cluster DNS meanwhile.

The node's resolv.conf (`--resolv-conf`, default /etc/resolv.conf) is what pods with dnsPolicy
Default get and what the server forwards to. As k3s does, when the default file lists only
loopback nameservers (systemd-resolved's 127.0.0.53 stub) and
/run/systemd/resolve/resolv.conf exists, that file (the real upstreams) is used instead: a
loopback address is useless inside a pod's network namespace.
"""

from __future__ import annotations

import argparse
import errno
import ipaddress
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from orchestrator.agent.net.clusterview import ClusterView
from orchestrator.agent.net.poddns import PodDNS, ResolvConf, parse_resolv_conf
from orchestrator.network.settings import DEFAULT_CLUSTER_DNS, DEFAULT_CLUSTER_DOMAIN

__all__ = [
    "DEFAULT_RESOLV_CONF",
    "DNS_INTERFACE",
    "NodeDnsOptions",
    "add_dns_flags",
    "ensure_dns_interface",
    "load_pod_dns",
    "node_dns_options",
    "parse_listen",
    "read_resolv_conf",
    "run_node_dns",
]

log = logging.getLogger(__name__)

DNS_INTERFACE = "orch-dns"
DEFAULT_RESOLV_CONF = Path("/etc/resolv.conf")
SYSTEMD_RESOLV_CONF = Path("/run/systemd/resolve/resolv.conf")
RETRY = 30.0  # seconds between attempts to set up the interface or bind


def read_resolv_conf(path: Path) -> ResolvConf:
    """`path` parsed (the systemd-resolved substitution of the module doc for the default path);
    an unreadable file is logged and read as empty."""
    try:
        resolv = parse_resolv_conf(path.read_text())
    except OSError as exc:
        log.warning("cannot read --resolv-conf %s (%s): pods get no host nameservers", path, exc)
        return ResolvConf()
    if (
        path == DEFAULT_RESOLV_CONF
        and resolv.nameservers
        and all(_is_loopback(ns) for ns in resolv.nameservers)
    ):
        try:
            real = parse_resolv_conf(SYSTEMD_RESOLV_CONF.read_text())
        except OSError:
            return resolv
        log.info("%s has only loopback nameservers: using %s", path, SYSTEMD_RESOLV_CONF)
        return real
    return resolv


def _is_loopback(text: str) -> bool:
    try:
        return ipaddress.ip_address(text.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def load_pod_dns(cluster_dns: str, cluster_domain: str, resolv_conf: Path) -> PodDNS:
    """What pods' resolv.conf is made of (`--cluster-dns` may be empty or comma-separated)."""
    servers = tuple(s.strip() for s in cluster_dns.split(",") if s.strip())
    for s in servers:
        try:
            ipaddress.ip_address(s)
        except ValueError:
            raise ValueError(f"--cluster-dns {s!r} is not an IP address") from None
    return PodDNS(servers, cluster_domain.strip(".").lower(), read_resolv_conf(resolv_conf))


def parse_listen(text: str) -> tuple[str, int]:
    """`--dns-listen` HOST:PORT (`[v6]:PORT` for IPv6)."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    try:
        ipaddress.ip_address(host)
        number = int(port)
    except ValueError:
        number = -1
    if not sep or not 0 <= number <= 65535:
        raise ValueError(f"--dns-listen {text!r} is not IP:PORT (e.g. 127.0.0.1:5353)")
    return host, number


def ensure_dns_interface(address: str, name: str = DNS_INTERFACE) -> str:
    """A dummy link `name`, up, holding `address` (/32 or /128), in this process's network
    namespace; idempotent; the link used. A kernel without dummy links (EOPNOTSUPP) gets the
    address on `lo` instead: the node accepts it as local all the same (any interface's address
    is), so pods reach it through their gateway. Blocking (netlink): call it from a thread.
    OSError when netlink refuses."""
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    ip = ipaddress.ip_address(address)
    try:
        with IPRoute() as ipr:
            links = ipr.link_lookup(ifname=name)
            if not links:
                try:
                    ipr.link("add", ifname=name, kind="dummy")
                    links = ipr.link_lookup(ifname=name)
                except NetlinkError as exc:
                    if exc.code != errno.EOPNOTSUPP:
                        raise
                    log.warning("no dummy links in this kernel: %s goes on lo instead", ip)
                    name = "lo"
                    links = ipr.link_lookup(ifname=name)
            _address_up(ipr, links[0], ip)
    except NetlinkError as exc:
        raise OSError(exc.code, f"netlink: {exc}") from None
    return name


def _address_up(ipr: Any, index: int, ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> None:
    family = 2 if ip.version == 4 else 10
    present = {a.get_attr("IFA_ADDRESS") for a in ipr.get_addr(index=index, family=family)}
    if str(ip) not in present:
        ipr.addr("add", index=index, address=str(ip), prefixlen=ip.max_prefixlen)
    ipr.link("set", index=index, state="up")


@dataclass(frozen=True)
class NodeDnsOptions:
    """`--cluster-dns`'s first address, `--cluster-domain`, the reverse ranges answered, the
    node's resolv.conf and `--dns-listen` (None: the cluster DNS address on `orch-dns`)."""

    dns: PodDNS
    listen: tuple[str, int] | None = None
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()


async def run_node_dns(
    view: ClusterView,
    options: NodeDnsOptions,
    *,
    task_status: trio.TaskStatus[tuple[str, int] | None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Keep the node DNS server running (module doc); `started` with the bound address once it
    serves, or with None at once if it cannot yet (it keeps trying)."""
    from orchestrator.agent.net.dnsanswer import Zone
    from orchestrator.agent.net.dnsserver import DnsServer, Forwarder, upstreams_from

    if not options.dns.cluster_dns:
        log.info("no --cluster-dns: the node DNS server is not started")
        task_status.started(None)
        return
    cluster_ip = options.dns.cluster_dns[0]
    host, port = options.listen or (cluster_ip, 53)
    zone = Zone(options.dns.cluster_domain, options.networks, dns_ip=cluster_ip)
    started = False
    while True:
        try:
            if options.listen is None:
                await trio.to_thread.run_sync(ensure_dns_interface, cluster_ip)
            forwarder = Forwarder(upstreams_from(options.dns.host, (host, port)))
            server = DnsServer(view, zone, forwarder, host=host, port=port)
            async with trio.open_nursery() as nursery:
                bound = await nursery.start(server.run)
                if not started:
                    started = True
                    task_status.started(bound)
        except* Exception as group:  # no privileges, the port taken, no netlink, a bug...
            exc = group.exceptions[0]
            where = f"{host}:{port}" + ("" if options.listen else f" on {DNS_INTERFACE}")
            log.error(
                "node DNS server on %s failed: %s; pods' cluster DNS is down, retrying in %ds",
                where,
                exc,
                RETRY,
            )
        if not started:
            started = True
            task_status.started(None)
        await trio.sleep(RETRY)


def add_dns_flags(parser: argparse.ArgumentParser, *, plan: bool = True) -> None:
    """The agent's cluster DNS flags (kubelet/k3s names, see the module doc). `plan=False`:
    the parser has its own `--cluster-dns` and `--cluster-domain` (the server's address plan)."""
    if plan:
        parser.add_argument(
            "--cluster-dns",
            default=DEFAULT_CLUSTER_DNS,
            metavar="IP[,IP]",
            help=f"the cluster DNS address pods are given (default {DEFAULT_CLUSTER_DNS}; the "
            "node DNS server answers there; empty: pods use the node's resolv.conf)",
        )
        parser.add_argument(
            "--cluster-domain",
            default=DEFAULT_CLUSTER_DOMAIN,
            help=f"the cluster's DNS domain (default {DEFAULT_CLUSTER_DOMAIN})",
        )
    parser.add_argument(
        "--resolv-conf",
        type=Path,
        default=Path("/etc/resolv.conf"),
        help="the node's resolv.conf: for pods with dnsPolicy Default and the DNS server's "
        "upstreams (default /etc/resolv.conf)",
    )
    parser.add_argument(
        "--dns-listen",
        default="",
        metavar="IP:PORT",
        help="serve the node DNS on this address instead of the cluster DNS address on the "
        "orch-dns interface (tests, simulated runtime)",
    )


def node_dns_options(args: argparse.Namespace, kind: str) -> tuple[PodDNS, NodeDnsOptions | None]:
    """Pods' DNS and the node DNS server's setup from the flags; no server for the simulated
    runtime without `--dns-listen`. ValueError for a bad flag."""
    dns = load_pod_dns(args.cluster_dns, args.cluster_domain, args.resolv_conf)
    listen = parse_listen(args.dns_listen) if args.dns_listen else None
    if listen is None and kind == "simulated":
        return dns, None  # pods still get their resolv.conf
    return dns, NodeDnsOptions(dns, listen=listen)
