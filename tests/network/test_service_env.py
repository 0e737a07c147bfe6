"""Service environment variables of pods (`agent.net.svcenv`), as the kubelet's
`envvars.FromServices`."""

from __future__ import annotations

from orchestrator.agent.net.svcenv import service_env, services_for_pod
from orchestrator.kube.objects import Obj


def svc(ns: str, name: str, ip: str, *ports: Obj, **spec: object) -> Obj:
    return {
        "metadata": {"namespace": ns, "name": name},
        "spec": {"clusterIP": ip, "ports": list(ports), **spec},
    }


KUBERNETES = svc("default", "kubernetes", "10.43.0.1", {"name": "https", "port": 443})
SERVICES = {
    ("default", "kubernetes"): KUBERNETES,
    ("shop", "my-svc"): svc(
        "shop",
        "my-svc",
        "10.43.0.7",
        {"name": "http", "port": 80, "protocol": "TCP"},
        {"port": 53, "protocol": "UDP"},
    ),
    ("shop", "headless"): svc("shop", "headless", "None", {"port": 1}),
    ("shop", "ext"): svc("shop", "ext", "", type="ExternalName", externalName="x.example"),
    ("shop", "noports"): svc("shop", "noports", "10.43.0.8"),
    ("other", "elsewhere"): svc("other", "elsewhere", "10.43.0.9", {"port": 1}),
    ("shop", "v6"): svc("shop", "v6", "fd00::5", {"port": 8080, "name": "web-ui"}),
}


def test_kubernetes_variables() -> None:
    env = service_env([KUBERNETES])
    assert env == {
        "KUBERNETES_SERVICE_HOST": "10.43.0.1",
        "KUBERNETES_SERVICE_PORT": "443",
        "KUBERNETES_SERVICE_PORT_HTTPS": "443",
        "KUBERNETES_PORT": "tcp://10.43.0.1:443",
        "KUBERNETES_PORT_443_TCP": "tcp://10.43.0.1:443",
        "KUBERNETES_PORT_443_TCP_PROTO": "tcp",
        "KUBERNETES_PORT_443_TCP_PORT": "443",
        "KUBERNETES_PORT_443_TCP_ADDR": "10.43.0.1",
    }


def test_docker_link_variables() -> None:
    env = service_env([SERVICES[("shop", "my-svc")]])
    assert env == {
        "MY_SVC_SERVICE_HOST": "10.43.0.7",
        "MY_SVC_SERVICE_PORT": "80",
        "MY_SVC_SERVICE_PORT_HTTP": "80",
        "MY_SVC_PORT": "tcp://10.43.0.7:80",
        "MY_SVC_PORT_80_TCP": "tcp://10.43.0.7:80",
        "MY_SVC_PORT_80_TCP_PROTO": "tcp",
        "MY_SVC_PORT_80_TCP_PORT": "80",
        "MY_SVC_PORT_80_TCP_ADDR": "10.43.0.7",
        "MY_SVC_PORT_53_UDP": "udp://10.43.0.7:53",
        "MY_SVC_PORT_53_UDP_PROTO": "udp",
        "MY_SVC_PORT_53_UDP_PORT": "53",
        "MY_SVC_PORT_53_UDP_ADDR": "10.43.0.7",
    }


def test_ipv6_and_dashed_port_names() -> None:
    env = service_env([SERVICES[("shop", "v6")]])
    assert env["V6_PORT"] == "tcp://[fd00::5]:8080"
    assert env["V6_SERVICE_PORT_WEB_UI"] == "8080"


def test_which_services() -> None:
    names = [s["metadata"]["name"] for s in services_for_pod(SERVICES, "shop", True)]
    assert names == ["kubernetes", "my-svc", "noports", "v6"]
    env = service_env(services_for_pod(SERVICES, "shop", True))
    assert "NOPORTS_SERVICE_HOST" not in env  # no port: nothing (the kubelet would index [0])
    assert "HEADLESS_SERVICE_HOST" not in env
    assert "EXT_SERVICE_HOST" not in env
    assert "ELSEWHERE_SERVICE_HOST" not in env


def test_service_links_disabled_keeps_kubernetes() -> None:
    names = [s["metadata"]["name"] for s in services_for_pod(SERVICES, "shop", False)]
    assert names == ["kubernetes"]
    assert services_for_pod({}, "shop", True) == []


def test_own_namespace_kubernetes_wins() -> None:
    mine = svc("shop", "kubernetes", "10.43.0.99", {"port": 1})
    services = {**SERVICES, ("shop", "kubernetes"): mine}
    assert services_for_pod(services, "shop", True)[0] is mine
    assert services_for_pod(services, "shop", False)[0] is KUBERNETES
