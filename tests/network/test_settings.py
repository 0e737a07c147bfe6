"""The address plan's defaults (k3s's) and its checks."""

from __future__ import annotations

import ipaddress

import pytest

from orchestrator.network.settings import NetworkSettings


def test_defaults_are_k3s_defaults() -> None:
    s = NetworkSettings.create()
    assert str(s.cluster_cidr) == "10.42.0.0/16"
    assert str(s.service_cidr) == "10.43.0.0/16"
    assert s.cluster_dns == ipaddress.ip_address("10.43.0.10")
    assert s.cluster_domain == "cluster.local"
    assert str(s.kubernetes_service_ip) == "10.43.0.1"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cluster_cidr": "10.42.0.1/16"}, "--cluster-cidr"),
        ({"service_cidr": "nonsense"}, "--service-cidr"),
        ({"service_cidr": "10.42.128.0/20"}, "overlaps"),
        ({"cluster_dns": "10.44.0.10"}, "inside --service-cidr"),
        ({"cluster_dns": "10.43.0.1"}, "first address"),
        ({"cluster_dns": "x"}, "not an IP address"),
        ({"cluster_domain": "bad_domain"}, "DNS name"),
        ({"node_cidr_mask_size": 16}, "mask"),
        ({"service_cidr": "fd00::/108", "cluster_dns": "fd00::a"}, "one IP family"),
    ],
)
def test_bad_plans_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        NetworkSettings.create(**kwargs)  # type: ignore[arg-type]
