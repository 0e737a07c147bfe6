"""How the agent runs its networking: the flags (k3s's names and defaults) of the pod network,
node proxy and node DNS, the `AgentOptions.components` entry that makes a `PodNetwork` from the
agent's local store, and the starters of the node proxy and the node DNS server.

Only a node on a real runtime (containerd) programs routes, iptables and CNI config; on the
simulated runtime the podCIDR is only handed to the runtime (its pods have no network, and a
test must never change the host's tables).

- Pod network (`podnet.py`): hands the node's podCIDR to the runtime (CRI
  `UpdateRuntimeConfig`); on containerd also writes the CNI conflist into `--cni-conf-dir`
  (default /etc/cni/net.d), programs the routes to the other nodes' podCIDRs with
  `--flannel-backend` (vxlan, the default, or host-gw; none: the user brings the network) and
  masquerades traffic leaving `--cluster-cidr` (default 10.42.0.0/16).
- Node proxy (`proxy.py`, kube-proxy's iptables mode over the agent's `svccache`): on with
  containerd unless `--disable-proxy`, never with the simulated runtime (its pod IPs are fake).
- Node DNS (`nodedns.py`): `--cluster-dns` (default 10.43.0.10; empty: pods get the node's
  resolv.conf), `--cluster-domain`, `--resolv-conf`; the server answers on the cluster DNS
  address (port 53, interface `orch-dns`) with containerd, or on `--dns-listen HOST:PORT`.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from orchestrator.agent.net.routeplan import BACKENDS

if TYPE_CHECKING:
    from orchestrator.agent.agent import Agent, AgentOptions
    from orchestrator.agent.localstore import LocalStore
    from orchestrator.agent.net.nodedns import NodeDnsOptions
    from orchestrator.agent.net.podnet import PodNetwork
    from orchestrator.agent.net.proxyrules import ProxyConfig
    from orchestrator.controllers.runtime import Client
    from orchestrator.cri.runtime import RuntimeService
    from orchestrator.network.settings import NetworkSettings

__all__ = [
    "DEFAULT_CNI_BIN_DIR",
    "DEFAULT_CNI_CONF_DIR",
    "add_embedded_network_flags",
    "add_podnet_flags",
    "network_settings",
    "pod_network",
    "proxy_config",
    "start_node_dns",
    "start_proxy",
]

log = logging.getLogger(__name__)

DEFAULT_CNI_CONF_DIR = "/etc/cni/net.d"
DEFAULT_CNI_BIN_DIR = "/usr/lib/cni"


def pod_network(
    settings: NetworkSettings,
    backend: str,
    name: str,
    node_ip: str,
    runtime_kind: str,
    *,
    client: Client,
    runtime: RuntimeService,
    cni_conf_dir: Path | None,
    cni_bin_dir: Path,
) -> Callable[[LocalStore], PodNetwork]:
    """The agent component of the pod network (an `AgentOptions.components` entry). Only a
    node on a real runtime programs routes, iptables and CNI config (module doc)."""
    from orchestrator.agent.net.podnet import PodNetwork, PodNetworkOptions

    options = PodNetworkOptions(
        cni_conf_dir=cni_conf_dir, cni_bin_dir=cni_bin_dir, program=runtime_kind == "containerd"
    )

    def make(store: LocalStore) -> PodNetwork:
        return PodNetwork(
            settings,
            backend,
            name,
            node_ip,
            client=client,
            runtime=runtime,
            store=store,
            options=options,
        )

    return make


def network_settings(args: argparse.Namespace) -> NetworkSettings:
    """The address plan from the agent's flags (those given; k3s's defaults otherwise)."""
    from orchestrator.network.settings import NetworkSettings

    given = {
        key: getattr(args, key)
        for key in ("cluster_cidr", "cluster_dns", "cluster_domain")
        if getattr(args, key, None)
    }
    return NetworkSettings.create(**given)


def add_podnet_flags(parser: argparse.ArgumentParser, *, cluster_cidr: bool = True) -> None:
    """The pod network's flags (k3s's names and defaults; module doc). `cluster_cidr=False`:
    the parser has its own `--cluster-cidr` (the server's address plan)."""
    if cluster_cidr:
        parser.add_argument(
            "--cluster-cidr",
            type=_cluster_cidr,
            default=None,
            metavar="CIDR",
            help="the pods' network, whose traffic to elsewhere is masqueraded (default "
            "10.42.0.0/16; the servers' --cluster-cidr)",
        )
    parser.add_argument(
        "--flannel-backend",
        choices=BACKENDS,
        default="vxlan",
        help="how pods reach other nodes' pods: vxlan (default; routed networks), host-gw "
        "(nodes on one L2 segment) or none (bring your own network)",
    )
    parser.add_argument(
        "--cni-conf-dir",
        type=Path,
        default=Path(DEFAULT_CNI_CONF_DIR),
        metavar="DIR",
        help=f"where the agent writes the CNI conflist containerd reads (default "
        f"{DEFAULT_CNI_CONF_DIR})",
    )
    parser.add_argument(
        "--cni-bin-dir",
        type=Path,
        default=Path(DEFAULT_CNI_BIN_DIR),
        metavar="DIR",
        help=f"where the CNI plugins are (default {DEFAULT_CNI_BIN_DIR}; checked at start)",
    )


def _cluster_cidr(text: str) -> str:
    from orchestrator.network.settings import NetworkSettings

    try:
        NetworkSettings.create(cluster_cidr=text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def add_embedded_network_flags(parser: argparse.ArgumentParser) -> None:
    """The `server` flags of its embedded agent's pod network, node proxy and node DNS (the
    agent's, without the address plan, which the server's own flags give)."""
    from orchestrator.agent.net.nodedns import add_dns_flags

    add_podnet_flags(parser, cluster_cidr=False)
    parser.add_argument(
        "--disable-proxy",
        action="store_true",
        help="do not run the node proxy (Service rules in iptables; on by default with the "
        "containerd runtime)",
    )
    add_dns_flags(parser, plan=False)


def proxy_config(node_name: str, network: NetworkSettings) -> ProxyConfig:
    """The node proxy's settings from the address plan (`--cluster-cidr`, `--cluster-dns`)."""
    from orchestrator.agent.net.proxyrules import ProxyConfig

    return ProxyConfig.create(node_name, str(network.cluster_cidr), str(network.cluster_dns))


async def start_proxy(nursery: trio.Nursery, agent: Agent, config: ProxyConfig) -> None:
    """Start the node proxy on `agent.services` (the agent must run with `service_cache`)."""
    from orchestrator.agent.net.proxy import NodeProxy, ProxyOptions

    if agent.services is None:
        raise RuntimeError("the node proxy needs the agent's service cache (service_cache)")
    await nursery.start(NodeProxy(agent.services, ProxyOptions(config)).run)
    log.info("node proxy running (cluster CIDR %s)", config.cluster_cidr)


async def start_node_dns(
    nursery: trio.Nursery, options: AgentOptions, dns: NodeDnsOptions | None
) -> None:
    """Start the node DNS server when `dns` asks for one (it retries on its own)."""
    from orchestrator.agent.net.nodedns import run_node_dns

    if dns is not None:
        await nursery.start(run_node_dns, options.cluster, dns)
