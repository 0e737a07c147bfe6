"""`orchestrator server --cluster-cidr/--service-cidr/--cluster-dns/--cluster-domain`: k3s's
defaults, the config file and environment keys, and bad values as usage errors with
`NetworkSettings.create`'s message (before anything starts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator import config
from orchestrator.cli import server as server_cli
from orchestrator.cli.main import _build_parser


def parse(argv: list[str], env: dict[str, str] | None = None) -> Any:
    return config.parse_args(_build_parser(), argv, environ=env or {})


def test_defaults_file_and_environment(tmp_path: Path) -> None:
    args = parse(["server", "--data-dir", str(tmp_path)])
    assert (args.cluster_cidr, args.service_cidr, args.cluster_dns, args.cluster_domain) == (
        "10.42.0.0/16",
        "10.43.0.0/16",
        "10.43.0.10",
        "cluster.local",
    )
    cfg = tmp_path / "c.yaml"
    cfg.write_text("cluster-cidr: 10.52.0.0/16\nservice-cidr: 10.53.0.0/16\n")
    env = {"ORCHESTRATOR_CLUSTER_DNS": "10.53.0.53", "ORCHESTRATOR_CLUSTER_DOMAIN": "edge.lan"}
    args = parse(["server", "--data-dir", str(tmp_path), "--config", str(cfg)], env)
    assert (args.cluster_cidr, args.service_cidr, args.cluster_dns, args.cluster_domain) == (
        "10.52.0.0/16",
        "10.53.0.0/16",
        "10.53.0.53",
        "edge.lan",
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--service-cidr", "nonsense"], "--service-cidr 'nonsense' is not a network"),
        (["--cluster-cidr", "10.43.0.0/16"], "overlaps"),
        (["--cluster-dns", "10.99.0.10"], "must lie inside --service-cidr"),
        (["--cluster-domain", "bad_domain"], "is not a DNS name"),
    ],
)
def test_bad_values_are_usage_errors(tmp_path: Path, flags: list[str], message: str) -> None:
    args = parse(["server", "--data-dir", str(tmp_path), *flags])
    with pytest.raises(SystemExit, match=message):
        server_cli.main(args)
