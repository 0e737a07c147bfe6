"""The node proxy for real, inside network namespaces this test makes (no route out of them).

    client ns (192.0.2.10) --veth-- node ns (192.0.2.1 | 10.42.0.1) --veth-- pod ns
                                    iptables by NodeProxy               10.42.0.5, 10.42.0.6
                                                                        echo servers on :8080

The pod namespace runs a TCP server on each address that answers with that address. The node
namespace gets the rules of a NodePort Service (ClusterIP 10.43.0.20:80, NodePort 30080)
through `NodeProxy` + `ExecIptables(prefix=ip netns exec NODE)`. The client connects to the
ClusterIP and to the NodePort: it reaches the endpoint; the endpoints change: the rules follow
(a partial sync); no endpoints: the connection is refused.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from orchestrator.agent.net.proxy import ExecIptables, NodeProxy, ProxyOptions
from orchestrator.agent.net.proxyrules import ProxyConfig
from orchestrator.metrics import Registry


def _reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root to make network namespaces"
    for tool in ("ip", "iptables-restore", "iptables-save", "iptables"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


pytestmark = [pytest.mark.skipif(_reason() is not None, reason=str(_reason())), pytest.mark.trio]

SERVER = """
import socket, sys, threading
def serve(ip):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((ip, 8080)); s.listen(64)
    while True:
        c, _ = s.accept(); c.sendall(ip.encode()); c.close()
for ip in sys.argv[1:]:
    threading.Thread(target=serve, args=(ip,), daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"""

CLIENT = """
import socket, sys
s = socket.socket(); s.settimeout(5)
try:
    s.connect((sys.argv[1], int(sys.argv[2]))); print(s.recv(100).decode())
except ConnectionRefusedError:
    print("refused")
except OSError as e:
    print("error", e)
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def lab() -> Iterator[dict[str, str]]:
    tag = f"{os.getpid() % 100000}"
    ns = {"node": f"pxnode{tag}", "pod": f"pxpod{tag}", "client": f"pxcli{tag}"}
    server: subprocess.Popen[str] | None = None
    try:
        for n in ns.values():
            _ip("netns", "add", n)
            _ip("-n", n, "link", "set", "lo", "up")
        node, pod, cli = ns["node"], ns["pod"], ns["client"]
        _ip("-n", node, "link", "add", "vp0", "type", "veth", "peer", "name", "eth0", "netns", pod)
        _ip("-n", node, "link", "add", "vc0", "type", "veth", "peer", "name", "eth0", "netns", cli)
        _ip("-n", node, "addr", "add", "10.42.0.1/24", "dev", "vp0")
        _ip("-n", node, "addr", "add", "192.0.2.1/24", "dev", "vc0")
        for dev in ("vp0", "vc0"):
            _ip("-n", node, "link", "set", dev, "up")
        # the service CIDR routes somewhere (as a default route would), so an unNATed packet
        # reaches FORWARD (and the REJECT of a Service without endpoints); not back out of vc0,
        # where ICMP redirects would use up the rate limit of ICMP errors to the client
        _ip("-n", node, "route", "add", "10.43.0.0/16", "dev", "vp0")
        subprocess.run(
            ["ip", "netns", "exec", node, "sysctl", "-qw", "net.ipv4.ip_forward=1"],
            check=True,
            timeout=30,
        )
        for n, addrs, gw in ((pod, ["10.42.0.5/24", "10.42.0.6/24"], "10.42.0.1"),
                             (cli, ["192.0.2.10/24"], "192.0.2.1")):  # fmt: skip
            for a in addrs:
                _ip("-n", n, "addr", "add", a, "dev", "eth0")
            _ip("-n", n, "link", "set", "eth0", "up")
            _ip("-n", n, "route", "add", "default", "via", gw)
        server = subprocess.Popen(
            ["ip", "netns", "exec", pod, sys.executable, "-c", SERVER, "10.42.0.5", "10.42.0.6"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None
        assert server.stdout.readline().strip() == "ready"
        yield ns
    finally:
        if server is not None:
            server.kill()
            server.wait(timeout=30)
            if server.stdout is not None:
                server.stdout.close()
        for n in ns.values():
            subprocess.run(["ip", "netns", "del", n], capture_output=True, timeout=30)


class Source:
    def __init__(self) -> None:
        self.version = 0
        self.svcs: list[dict[str, Any]] = [
            {
                "metadata": {"namespace": "shop", "name": "web"},
                "spec": {
                    "type": "NodePort",
                    "clusterIP": "10.43.0.20",
                    "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}],
                },
            }
        ]
        self.sls: list[dict[str, Any]] = []

    def set_endpoints(self, *ips: str) -> None:
        self.sls = [
            {
                "metadata": {
                    "namespace": "shop",
                    "name": "web-a",
                    "labels": {"kubernetes.io/service-name": "web"},
                },
                "addressType": "IPv4",
                "ports": [{"port": 8080, "protocol": "TCP"}],
                "endpoints": [{"addresses": [ip], "nodeName": "node"} for ip in ips],
            }
        ]
        self.version += 1

    def services(self) -> list[dict[str, Any]]:
        return self.svcs

    def slices(self) -> list[dict[str, Any]]:
        return self.sls

    async def wait_changed(self, version: int) -> int:
        await trio.sleep_forever()
        raise AssertionError("unreachable")


async def _connect(client_ns: str, ip: str, port: int) -> str:
    done = await trio.run_process(
        ["ip", "netns", "exec", client_ns, sys.executable, "-c", CLIENT, ip, str(port)],
        capture_stdout=True,
        check=True,
    )
    return done.stdout.decode().strip()


async def test_cluster_ip_and_node_port_through_real_rules(lab: dict[str, str]) -> None:
    src = Source()
    iptables = ExecIptables(prefix=["ip", "netns", "exec", lab["node"]])
    proxy = NodeProxy(
        src, ProxyOptions(ProxyConfig("node", "10.42.0.0/16", "10.43.0.10")), iptables,
        metrics=Registry(),
    )  # fmt: skip
    cli = lab["client"]
    with trio.fail_after(120):
        src.set_endpoints("10.42.0.5")
        await proxy.sync(full=True)
        assert await _connect(cli, "10.43.0.20", 80) == "10.42.0.5"
        assert await _connect(cli, "192.0.2.1", 30080) == "10.42.0.5"
        # the endpoint moves: a partial sync, the traffic follows
        src.set_endpoints("10.42.0.6")
        await proxy.sync(full=False)
        assert await _connect(cli, "10.43.0.20", 80) == "10.42.0.6"
        assert await _connect(cli, "192.0.2.1", 30080) == "10.42.0.6"
        # two endpoints: both are reached (random balancing; 20 tries miss one with p=2^-19)
        src.set_endpoints("10.42.0.5", "10.42.0.6")
        await proxy.sync(full=False)
        seen = {await _connect(cli, "10.43.0.20", 80) for _ in range(20)}
        assert seen == {"10.42.0.5", "10.42.0.6"}
        # sessionAffinity ClientIP: one client keeps its endpoint (-m recent)
        src.svcs[0]["spec"]["sessionAffinity"] = "ClientIP"
        src.svcs = [dict(src.svcs[0])]  # a new object, as an informer would hand over
        await proxy.sync(full=False)
        stuck = {await _connect(cli, "10.43.0.20", 80) for _ in range(8)}
        assert len(stuck) == 1
        src.svcs[0]["spec"].pop("sessionAffinity")
        src.svcs = [dict(src.svcs[0])]
        # no endpoints: refused, not hanging
        src.set_endpoints()
        await proxy.sync(full=False)
        assert await _connect(cli, "10.43.0.20", 80) == "refused"
        assert await _connect(cli, "192.0.2.1", 30080) == "refused"
        # a full sync on top of what is there changes nothing and keeps one set of jumps
        await proxy.sync(full=True)
        saved = await iptables.save()
        assert saved.count("-A PREROUTING") == 1
        assert "KUBE-SVC-" not in saved
        src.set_endpoints("10.42.0.5")
        await proxy.sync(full=False)
        assert await _connect(cli, "10.43.0.20", 80) == "10.42.0.5"
