"""Pod DNS and Service variables where the agent builds pods: the sandbox config carries the
pod's resolv.conf, the container env the Service variables (the container's own win)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from orchestrator.agent.net.clusterview import SnapshotView
from orchestrator.agent.net.poddns import PodDNS, ResolvConf
from orchestrator.agent.podcontext import WorkerContext
from orchestrator.agent.podspec import container_env, sandbox_config
from orchestrator.cri.runtime import DNSConfig
from orchestrator.kube.objects import Obj

DNS = PodDNS(("10.43.0.10",), "cluster.local", ResolvConf(("192.0.2.53",), ("corp",), ()))
SERVICES = [
    {
        "kind": "Service",
        "metadata": {"namespace": "default", "name": "kubernetes"},
        "spec": {"clusterIP": "10.43.0.1", "ports": [{"name": "https", "port": 443}]},
    },
    {
        "kind": "Service",
        "metadata": {"namespace": "shop", "name": "db"},
        "spec": {"clusterIP": "10.43.0.5", "ports": [{"port": 5432}]},
    },
]


def pod(**spec: object) -> Obj:
    return {
        "metadata": {"namespace": "shop", "name": "p", "uid": "u1"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}], **spec},
    }


class NoObjects:
    async def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        return None


def ctx(cluster: SnapshotView) -> WorkerContext:
    nothing = cast(Any, None)
    return WorkerContext(
        runtime=nothing,
        client=nothing,
        store=nothing,
        objects=NoObjects(),
        events=nothing,
        node_name="n1",
        host_ip="192.0.2.10",
        data_dir=Path("/nonexistent"),
        cluster=cluster,
        dns=DNS,
    )


def test_sandbox_config_carries_the_pods_resolv_conf(tmp_path: Path) -> None:
    config = sandbox_config(pod(), 0, node="n1", data_dir=tmp_path, dns=DNS)
    assert config.dns == DNSConfig(
        ("10.43.0.10",),
        ("shop.svc.cluster.local", "svc.cluster.local", "cluster.local", "corp"),
        ("ndots:5",),
    )
    assert sandbox_config(pod(), 0, node="n1", data_dir=tmp_path).dns is None
    host = sandbox_config(pod(hostNetwork=True), 0, node="n1", data_dir=tmp_path, dns=DNS)
    assert host.dns == DNSConfig(("192.0.2.53",), ("corp",), ())


async def test_container_env_has_service_variables() -> None:
    c: Obj = {
        "name": "c",
        "env": [
            {"name": "DB_SERVICE_PORT", "value": "1234"},  # the container's own wins
            {"name": "URL", "value": "http://$(DB_SERVICE_HOST):$(DB_SERVICE_PORT)"},
        ],
    }
    env = await container_env(ctx(SnapshotView(SERVICES)), pod(), c, "10.42.0.5")
    assert env["KUBERNETES_SERVICE_HOST"] == "10.43.0.1"
    assert env["KUBERNETES_PORT_443_TCP"] == "tcp://10.43.0.1:443"
    assert env["DB_SERVICE_HOST"] == "10.43.0.5"
    assert env["DB_SERVICE_PORT"] == "1234"
    assert env["URL"] == "http://10.43.0.5:1234"


async def test_enable_service_links_false() -> None:
    env = await container_env(
        ctx(SnapshotView(SERVICES)), pod(enableServiceLinks=False), {"name": "c"}, ""
    )
    assert "KUBERNETES_SERVICE_HOST" in env
    assert "DB_SERVICE_HOST" not in env


async def test_no_services_known() -> None:
    assert await container_env(ctx(SnapshotView()), pod(), {"name": "c"}, "") == {}
