"""The cluster's address plan: `NetworkSettings`, with k3s's flag names and defaults.

- `--cluster-cidr` (10.42.0.0/16): pods; each Node gets a /`node_cidr_mask_size` (24) of it as
  `spec.podCIDR`.
- `--service-cidr` (10.43.0.0/16): Service ClusterIPs; its first address is the ClusterIP of
  `default/kubernetes` (`kubernetes_service_ip`).
- `--cluster-dns` (10.43.0.10): the address pods send DNS queries to; inside the service CIDR
  and never handed to a Service.
- `--cluster-domain` (`cluster.local`).

Invariants (`NetworkSettings.create` checks them, `ValueError` with a clear message otherwise):
the two CIDRs are IPv4 or IPv6 networks that do not overlap, the node mask is longer than the
cluster CIDR's prefix, the cluster DNS address lies inside the service CIDR and is not its
first address, and the domain is a DNS name.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

__all__ = [
    "DEFAULT_CLUSTER_CIDR",
    "DEFAULT_CLUSTER_DNS",
    "DEFAULT_CLUSTER_DOMAIN",
    "DEFAULT_SERVICE_CIDR",
    "IPNetwork",
    "NetworkSettings",
]

DEFAULT_CLUSTER_CIDR = "10.42.0.0/16"
DEFAULT_SERVICE_CIDR = "10.43.0.0/16"
DEFAULT_CLUSTER_DNS = "10.43.0.10"
DEFAULT_CLUSTER_DOMAIN = "cluster.local"
DEFAULT_NODE_CIDR_MASK = 24

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
_DOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True)
class NetworkSettings:
    """The address plan (build it with `create`, which checks it)."""

    cluster_cidr: IPNetwork
    service_cidr: IPNetwork
    cluster_dns: ipaddress.IPv4Address | ipaddress.IPv6Address
    cluster_domain: str
    node_cidr_mask_size: int = DEFAULT_NODE_CIDR_MASK

    @classmethod
    def create(
        cls,
        cluster_cidr: str = DEFAULT_CLUSTER_CIDR,
        service_cidr: str = DEFAULT_SERVICE_CIDR,
        cluster_dns: str = DEFAULT_CLUSTER_DNS,
        cluster_domain: str = DEFAULT_CLUSTER_DOMAIN,
        node_cidr_mask_size: int = DEFAULT_NODE_CIDR_MASK,
    ) -> NetworkSettings:
        pods = _network("--cluster-cidr", cluster_cidr)
        services = _network("--service-cidr", service_cidr)
        if pods.version != services.version:
            raise ValueError("--cluster-cidr and --service-cidr must be of one IP family")
        if pods.overlaps(services):
            raise ValueError(f"--cluster-cidr {pods} overlaps --service-cidr {services}")
        if not pods.prefixlen < node_cidr_mask_size <= pods.max_prefixlen:
            raise ValueError(
                f"the node CIDR mask /{node_cidr_mask_size} must be longer than "
                f"--cluster-cidr's /{pods.prefixlen}"
            )
        try:
            dns = ipaddress.ip_address(cluster_dns)
        except ValueError:
            raise ValueError(f"--cluster-dns {cluster_dns!r} is not an IP address") from None
        if dns not in services or dns == services.network_address + 1:
            raise ValueError(
                f"--cluster-dns {dns} must lie inside --service-cidr {services} and not be "
                "its first address (that is the kubernetes Service's)"
            )
        domain = cluster_domain.strip(".").lower()
        if not _DOMAIN.match(domain) or len(domain) > 253:
            raise ValueError(f"--cluster-domain {cluster_domain!r} is not a DNS name")
        return cls(pods, services, dns, domain, node_cidr_mask_size)

    @property
    def kubernetes_service_ip(self) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
        """The ClusterIP of `default/kubernetes`: the service CIDR's first address."""
        return self.service_cidr.network_address + 1


def _network(flag: str, text: str) -> IPNetwork:
    try:
        return ipaddress.ip_network(text, strict=True)
    except ValueError as exc:
        raise ValueError(f"{flag} {text!r} is not a network address/prefix: {exc}") from None
