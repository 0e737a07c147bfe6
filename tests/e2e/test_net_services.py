"""Issue 19's checks of Services and cluster DNS, on one lab of two devices (the agents'
default backend, vxlan), shared by the module's tests, which run in file order:

* a client pod on device 1 resolves `web.shop.svc.cluster.local` (its resolv.conf: the cluster
  DNS 10.43.0.10, search list, ndots:5) and gets HTTP 200 from `web`, whose endpoint runs on
  device 2; the same through the ClusterIP, and through a NodePort on each device from the LAN;
* a LoadBalancer Service lists every device address in `status.loadBalancer.ingress` and
  answers on each of them from the LAN;
* scaling the Deployment: the EndpointSlice and the node proxy's rules follow within seconds
  (every replica answers through the ClusterIP);
* a pod that fails its readiness probe leaves the endpoints, and then gets no traffic;
* a headless Service resolves to its pods, StatefulSet pods by `<pod>.<service>` hostnames,
  pods by `a-b-c-d.<ns>.pod.cluster.local`;
* a name outside the cluster is forwarded to the stub upstream DNS in its own namespace;
* a pod reaches the API through the `kubernetes` Service (10.43.0.1:443), with the
  KUBERNETES_SERVICE_* and Docker-link variables in its environment. No Python image exists
  offline, and the image's busybox wget fails every TLS handshake from inside the container
  (a quirk of the tool: even straight to the server), so the pod's own wget shows that
  `kubernetes.default.svc` resolves to 10.43.0.1 through its search list, and the host's
  busybox wget, run in the pod's network namespace, fetches `https://10.43.0.1/version` with
  the service account token when one is mounted: any HTTP answer (200, or 401/403 without a
  token) proves TLS reached the API server through the Service;
* with the server stopped, DNS and Service traffic on a device keep working (the agent's local
  copy); the server is started again afterwards;
* with the server stopped, an agent restarted (a reboot: its iptables rules and `orch-dns`
  wiped first) serves DNS and the ClusterIP again from what it persisted.

Needs N1 (ClusterIPs, NodePorts, podCIDRs), N2 (EndpointSlices, ServiceLB), N3 (pod network),
N4 (node proxy), N5 (node-local DNS, resolv.conf, Service variables). Marked slow; skipped with
the reason when the lab cannot run here, failed under ORCH_REQUIRE_CONTAINERD=1.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from typing import Any

import pytest
from netlabfix import (
    HTTP_PORT,
    lan_fetch,
    open_lab,
    pod,
    running_pods,
    wait_running,
    web_container,
)

from orchestrator.testing.netlab import EXTERNAL_ADDRESS, EXTERNAL_NAME, NetLab

pytestmark = pytest.mark.slow

NS = "shop"
SERVICE_CIDR = ipaddress.IPv4Network("10.43.0.0/16")
CLUSTER_DNS = "10.43.0.10"
KUBERNETES_IP = "10.43.0.1"
LB_PORT = 8000
CLIENT = "client"
FOLLOW = 30.0  # "within seconds": generous for 2 loaded CI cores, still far below a minute


def service(name: str, *, type_: str = "ClusterIP", port: int = 80, headless: bool = False,
            selector: str = "web") -> dict[str, Any]:  # fmt: skip
    spec: dict[str, Any] = {
        "type": type_,
        "selector": {"app": selector},
        "ports": [{"name": "http", "port": port, "targetPort": HTTP_PORT}],
    }
    if headless:
        spec["clusterIP"] = "None"
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NS},
            "spec": spec}  # fmt: skip


def manifests() -> list[dict[str, Any]]:
    web_template = {
        "metadata": {"labels": {"app": "web"}},
        "spec": {
            "nodeName": "edge-2",  # the endpoints live on the other device than the client
            "terminationGracePeriodSeconds": 1,
            "containers": [web_container()],
        },
    }
    db_template = {
        "metadata": {"labels": {"app": "db"}},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [web_container(probe=False)]},
    }
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
        service("web"),
        service("web-np", type_="NodePort"),
        service("web-lb", type_="LoadBalancer", port=LB_PORT),
        service("db", headless=True, selector="db"),
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "namespace": NS},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "web"}},
                "template": web_template,
            },
        },
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "db", "namespace": NS},
            "spec": {
                "replicas": 2,
                "serviceName": "db",
                "selector": {"matchLabels": {"app": "db"}},
                "template": db_template,
            },
        },
    ]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetLab]:
    with open_lab(tmp_path_factory.mktemp("lab"), 2) as lab:
        lab.apply(manifests()[0])
        lab.apply(*manifests()[1:])
        wait_running(lab, NS, "app=web", 1)
        wait_running(lab, NS, "app=db", 2)
        # The client is created after the Services, so it gets their Docker-link variables.
        lab.apply(pod(CLIENT, "edge-1", namespace=NS))
        wait_running(lab, NS, f"app={CLIENT}", 1)
        yield lab


def get(lab: NetLab, *args: str) -> Any:
    return lab.kubectl_json("get", "-n", NS, *args)


def cluster_ip(lab: NetLab, name: str) -> str:
    ip = get(lab, "service", name)["spec"].get("clusterIP")
    assert ip, f"service {name} has no clusterIP"
    return str(ip)


def ready_endpoints(lab: NetLab, service_name: str) -> set[str]:
    """Addresses of the ready endpoints in the Service's EndpointSlices."""
    slices = get(lab, "endpointslices", "-l", f"kubernetes.io/service-name={service_name}")
    return {
        addr
        for s in slices["items"]
        for ep in s.get("endpoints") or []
        if (ep.get("conditions") or {}).get("ready", True)
        for addr in ep.get("addresses") or []
    }


def exec_client(lab: NetLab, argv: list[str], seconds: int = 5) -> tuple[int, str, str]:
    r = lab.pod_exec(CLIENT, ["timeout", str(seconds), *argv], namespace=NS, timeout=seconds + 10)
    return r.returncode, r.stdout, r.stderr


def resolve(lab: NetLab, name: str) -> set[str]:
    """The IPv4 addresses busybox nslookup prints for `name` through the pod's resolv.conf.
    For a short name busybox asks every search-list expansion and exits 1 when any of them is
    NXDOMAIN (as all but one must be), so its status counts only when it printed no answer."""
    code, out, err = exec_client(lab, ["nslookup", "-type=a", name])
    _, _, answers = out.partition("Name:")
    found = {line.split()[-1] for line in answers.splitlines() if line.startswith("Address")}
    assert found or code == 0, f"nslookup {name}: {out}{err}"
    return found


def client_fetch(lab: NetLab, url: str) -> str:
    """GET url from the client pod, which must answer HTTP 200: the body."""
    code, out, err = exec_client(lab, ["wget", "-S", "-O-", url])
    assert code == 0, f"GET {url}: {err}"
    assert any(" 200 " in line for line in err.splitlines()), err  # wget -S: the status line
    return out.strip()


def web_pod_names(lab: NetLab) -> set[str]:
    return set(running_pods(lab, NS, "app=web"))


def test_client_pod_resolv_conf_points_at_cluster_dns(lab: NetLab) -> None:
    _, conf, _ = exec_client(lab, ["cat", "/etc/resolv.conf"])
    lines = conf.splitlines()
    assert f"nameserver {CLUSTER_DNS}" in lines, conf
    assert f"search {NS}.svc.cluster.local svc.cluster.local cluster.local" in lines, conf
    assert any(line.startswith("options") and "ndots:5" in line for line in lines), conf


def test_service_by_name_gives_http_200_from_the_other_device(lab: NetLab) -> None:
    ip = cluster_ip(lab, "web")
    assert ipaddress.IPv4Address(ip) in SERVICE_CIDR
    assert lab.wait_for(lambda: ready_endpoints(lab, "web"), "web's EndpointSlice", FOLLOW)
    assert resolve(lab, "web.shop.svc.cluster.local") == {ip}
    assert resolve(lab, "web") == {ip}  # through the search list
    [name] = web_pod_names(lab)
    assert client_fetch(lab, "http://web.shop.svc.cluster.local/") == name


def test_cluster_ip_and_node_port_on_each_device(lab: NetLab) -> None:
    [name] = web_pod_names(lab)
    assert client_fetch(lab, f"http://{cluster_ip(lab, 'web')}/") == name
    node_port = get(lab, "service", "web-np")["spec"]["ports"][0]["nodePort"]
    assert 30000 <= node_port <= 32767
    for d in lab.devices:
        assert lan_fetch(lab, f"http://{d.address}:{node_port}/") == (0, name), d.node_name


def test_load_balancer_answers_on_every_device_address(lab: NetLab) -> None:
    def ingress() -> set[str] | None:
        st = get(lab, "service", "web-lb").get("status") or {}
        ips = {i.get("ip") for i in (st.get("loadBalancer") or {}).get("ingress") or []}
        return ips if ips == {d.address for d in lab.devices} else None

    lab.wait_for(ingress, "web-lb's ingress = every device address", FOLLOW)
    [name] = web_pod_names(lab)
    for d in lab.devices:
        assert lan_fetch(lab, f"http://{d.address}:{LB_PORT}/") == (0, name), d.node_name


def answers(lab: NetLab, url: str, n: int) -> list[str]:
    """n GETs of url from the client pod, in one exec (a loop inside the pod): each answer's
    body, or "<failed>"."""
    loop = f'for i in $(seq {n}); do timeout 5 wget -qO- {url} || echo "<failed>"; done'
    r = lab.pod_exec(CLIENT, ["sh", "-c", loop], namespace=NS, timeout=6 * n + 10)
    return [line.strip() for line in r.stdout.splitlines() if line.strip()]


def seen_through(lab: NetLab, url: str, want: set[str], what: str) -> set[str]:
    """Request url from the client until every name in `want` has answered (random balancing)."""
    seen: set[str] = set()

    def all_seen() -> bool:
        seen.update(answers(lab, url, 10))
        return want <= seen

    lab.wait_for(all_seen, what, FOLLOW)
    return seen


def test_scaling_updates_endpoints_and_rules_within_seconds(lab: NetLab) -> None:
    lab.kubectl("scale", "-n", NS, "deployment/web", "--replicas=3")
    pods = wait_running(lab, NS, "app=web", 3)
    ips = {p["status"]["podIP"] for p in pods.values()}
    lab.wait_for(lambda: ready_endpoints(lab, "web") == ips, "3 ready endpoints", FOLLOW)
    seen = seen_through(lab, f"http://{cluster_ip(lab, 'web')}/", set(pods), "every replica")
    assert seen == set(pods)


def test_unready_pod_leaves_the_rules_before_it_gets_traffic(lab: NetLab) -> None:
    pods = wait_running(lab, NS, "app=web", 3)
    victim, others = sorted(pods)[0], set(sorted(pods)[1:])
    victim_ip = pods[victim]["status"]["podIP"]
    lab.pod_exec(victim, ["rm", "/tmp/www/ready"], namespace=NS)  # readiness now fails
    lab.wait_for(
        lambda: victim_ip not in ready_endpoints(lab, "web"), f"{victim} out of endpoints", FOLLOW
    )
    got = answers(lab, f"http://{cluster_ip(lab, 'web')}/", 20)
    assert len(got) == 20, got
    assert victim not in got
    assert set(got) <= others, got  # and none failed
    lab.pod_exec(victim, ["sh", "-c", "echo ok > /tmp/www/ready"], namespace=NS)


def test_headless_service_statefulset_hostnames_and_pod_records(lab: NetLab) -> None:
    db = wait_running(lab, NS, "app=db", 2)
    ips = {name: p["status"]["podIP"] for name, p in db.items()}
    assert set(ips) == {"db-0", "db-1"}
    assert resolve(lab, "db.shop.svc.cluster.local") == set(ips.values())
    for name, ip in ips.items():
        assert resolve(lab, f"{name}.db.shop.svc.cluster.local") == {ip}
        assert resolve(lab, f"{ip.replace('.', '-')}.shop.pod.cluster.local") == {ip}
    assert client_fetch(lab, f"http://db-0.db.shop.svc.cluster.local:{HTTP_PORT}/") == "db-0"


def test_outside_name_is_forwarded_to_the_upstream(lab: NetLab) -> None:
    assert resolve(lab, EXTERNAL_NAME) == {EXTERNAL_ADDRESS}
    code, out, _ = exec_client(lab, ["nslookup", "-type=a", "nope.example.org"])
    assert code != 0 or EXTERNAL_ADDRESS not in out


def test_pod_reaches_the_api_through_the_kubernetes_service(lab: NetLab) -> None:
    _, env, _ = exec_client(lab, ["env"])
    variables = dict(line.split("=", 1) for line in env.splitlines() if "=" in line)
    assert variables.get("KUBERNETES_SERVICE_HOST") == KUBERNETES_IP
    assert variables.get("KUBERNETES_SERVICE_PORT") == "443"
    assert variables.get("WEB_SERVICE_HOST") == cluster_ip(lab, "web")
    assert variables.get("WEB_SERVICE_PORT") == "80"
    kubernetes = lab.kubectl_json("get", "-n", "default", "service", "kubernetes")
    assert kubernetes["spec"]["clusterIP"] == KUBERNETES_IP
    token_file = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    code, token, _ = exec_client(lab, ["cat", token_file])
    header = ["--header", f"Authorization: Bearer {token.strip()}"] if code == 0 else []
    # The pod's resolver finds the Service; the request then leaves from the pod's network
    # namespace with the host's busybox: the image's busybox wget fails every TLS handshake
    # from inside the container's mount namespace (even straight to 192.0.2.10:6443; with the
    # same binary run from the host's filesystem it works), a quirk of the tool, not the path.
    # busybox nslookup uses no search list for a dotted name; wget (libc's resolver) does, and
    # says where it connects before the plain request to a TLS port fails.
    _, _, err = exec_client(lab, ["wget", "-O-", "http://kubernetes.default.svc:443/"])
    assert f"kubernetes.default.svc:443 ({KUBERNETES_IP}:443)" in err, err
    url = f"https://{KUBERNETES_IP}/version"
    wget = ["timeout", "5", "busybox", "wget", "--no-check-certificate", "-qO-", *header, url]
    r = lab.pod_net_exec(CLIENT, wget, namespace=NS)
    # 200 with the version, or (no token mounted) 401/403 from the API server itself.
    assert (r.returncode == 0 and "gitVersion" in r.stdout) or any(
        s in r.stderr for s in ("401", "403")
    ), (r.stdout, r.stderr)


def test_dns_and_services_keep_working_with_the_server_stopped(lab: NetLab) -> None:
    ip = cluster_ip(lab, "web")
    names = {p["metadata"]["name"] for p in get(lab, "pods", "-l", "app=web")["items"]}
    lab.stop_server()
    try:
        assert resolve(lab, "web.shop.svc.cluster.local") == {ip}
        assert resolve(lab, "db-0.db.shop.svc.cluster.local")
        assert client_fetch(lab, f"http://{ip}/") in names
        assert client_fetch(lab, "http://web.shop.svc.cluster.local/") in names
    finally:
        lab.start_server()


def try_resolve(lab: NetLab, name: str) -> set[str] | None:
    try:
        return resolve(lab, name) or None
    except AssertionError:  # no answer yet (NetnsError, LabError included)
        return None


def try_fetch(lab: NetLab, url: str) -> str | None:
    code, out, _ = exec_client(lab, ["wget", "-qO-", url])
    return out.strip() if code == 0 else None


# What a reboot loses on a device and the agent alone puts back from its local copy: the node
# proxy's and the pod network's iptables rules and the DNS address's dummy link. Pods,
# containerd, cni0 and flannel.1 stay: a new flannel.1 gets a new VTEP MAC, which the other
# devices cannot learn while the server is down (the agent would have to make it with the MAC
# it last published), so their replies would not reach this device.
REBOOT_WIPE = (
    "iptables -t nat -F; iptables -t nat -X; iptables -t filter -F; iptables -t filter -X;"
    " ip link del orch-dns; true"
)


def test_a_rebooted_agent_serves_dns_and_services_from_its_local_copy(lab: NetLab) -> None:
    """Server stopped, device 1's agent restarted (a reboot of the agent, with its iptables rules
    and DNS link wiped): it cannot reach the API, so DNS and the ClusterIP work again only from
    the Services/EndpointSlices (and Nodes) it persisted."""
    ip = cluster_ip(lab, "web")
    names = {p["metadata"]["name"] for p in get(lab, "pods", "-l", "app=web")["items"]}
    edge2_cidr = lab.kubectl_json("get", "node", "edge-2")["spec"]["podCIDR"]
    assert try_resolve(lab, "web.shop.svc.cluster.local") == {ip}  # and pod_exec knows the node
    lab.stop_server()
    try:
        lab.stop_agent(1)
        lab.exec(1, ["sh", "-c", REBOOT_WIPE], check=True)
        assert ip not in lab.exec(1, ["iptables-save", "-t", "nat"]).stdout
        lab.start_agent(1)

        def routed() -> bool:
            routes = lab.exec(1, ["ip", "-4", "route", "show"]).stdout
            return any(r.split()[:1] == [edge2_cidr] for r in routes.splitlines())

        lab.wait_for(routed, f"the route to edge-2's {edge2_cidr} back, offline", FOLLOW)
        lab.wait_for(
            lambda: ip in lab.exec(1, ["iptables-save", "-t", "nat"]).stdout,
            f"the node proxy's rules for {ip} back, offline",
            FOLLOW,
        )
        lab.wait_for(
            lambda: try_resolve(lab, "web.shop.svc.cluster.local") == {ip},
            "cluster DNS answering web.shop from the local copy",
            FOLLOW,
        )
        assert try_resolve(lab, "db-0.db.shop.svc.cluster.local")
        got = lab.wait_for(
            lambda: try_fetch(lab, f"http://{ip}/"), f"GET http://{ip}/ offline", FOLLOW
        )
        assert got in names
        assert client_fetch(lab, "http://web.shop.svc.cluster.local/") in names
    finally:
        lab.start_server()
