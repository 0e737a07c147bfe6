"""How the agent runs the pod network: its flags (k3s's names and defaults) and the
`AgentOptions.components` entry that makes a `PodNetwork` from the agent's local store.

Only a node on a real runtime (containerd) programs routes, iptables and CNI config; on the
simulated runtime the podCIDR is only handed to the runtime (its pods have no network, and a
test must never change the host's tables).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.agent.net.routeplan import BACKENDS

if TYPE_CHECKING:
    from orchestrator.agent.localstore import LocalStore
    from orchestrator.agent.net.podnet import PodNetwork
    from orchestrator.controllers.runtime import Client
    from orchestrator.cri.runtime import RuntimeService
    from orchestrator.network.settings import NetworkSettings

__all__ = [
    "DEFAULT_CNI_BIN_DIR",
    "DEFAULT_CNI_CONF_DIR",
    "add_podnet_flags",
    "network_settings",
    "pod_network",
]

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
