"""externalTrafficPolicy: Local and hairpin traffic, for real, in namespaces this test makes.

    client  eth0 192.0.2.10    --veth--  node-a  vc0 192.0.2.1   vp0 10.42.0.1  --veth--  pod
            eth1 198.51.100.10 --veth--  node-b  vc0 198.51.100.1                      10.42.0.5

Each node namespace gets the rules of its own `NodeProxy` (node names "node-a", "node-b") for
one NodePort Service (ClusterIP 10.43.0.20:80, NodePort 30080) whose only endpoint, 10.42.0.5,
is on node-a. The pod's server answers with the peer address it sees. With `Local` policy the
NodePort answers through node-a with the client's own address (no masquerade) and not through
node-b (dropped: a timeout); with `Cluster` policy node-a masquerades (the pod sees node-a's
address) and node-b forwards (it has no route to the pod: "no route to host", not a
timeout). Hairpin: the pod reaches itself through the ClusterIP, masqueraded (else the answer
would never leave the pod's namespace to be un-NATed). The pod hangs off node-a by a routed
veth, not a bridge: the bridge's hairpin mode is the CNI plugin's part, not tested here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from orchestrator.agent.net.proxy import ExecIptables, NodeProxy, ProxyOptions
from orchestrator.agent.net.proxyrules import ProxyConfig
from orchestrator.metrics import Registry
from tests.network.test_proxy_netns import _ip, _reason

pytestmark = [pytest.mark.skipif(_reason() is not None, reason=str(_reason())), pytest.mark.trio]

SERVER = """
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("10.42.0.5", 8080)); s.listen(64)
print("ready", flush=True)
while True:
    c, peer = s.accept(); c.sendall(peer[0].encode()); c.close()
"""

CLIENT = """
import socket, sys
s = socket.socket(); s.settimeout(float(sys.argv[3]))
if len(sys.argv) > 4:
    s.bind((sys.argv[4], 0))
try:
    s.connect((sys.argv[1], int(sys.argv[2]))); print(s.recv(100).decode())
except ConnectionRefusedError:
    print("refused")
except OSError as e:
    print("error", type(e).__name__)
"""


def _sysctl(ns: str, *settings: str) -> None:
    cmd = ["ip", "netns", "exec", ns, "sysctl", "-qw", *settings]
    subprocess.run(cmd, check=True, timeout=30)


@pytest.fixture
def lab() -> Iterator[dict[str, str]]:
    tag = f"{os.getpid() % 100000}"
    ns = {k: f"px{k}{tag}" for k in ("a", "b", "pod", "cli")}
    server: subprocess.Popen[str] | None = None
    try:
        for n in ns.values():
            _ip("netns", "add", n)
            _ip("-n", n, "link", "set", "lo", "up")
        a, b, pod, cli = ns["a"], ns["b"], ns["pod"], ns["cli"]
        _ip("-n", a, "link", "add", "vp0", "type", "veth", "peer", "name", "eth0", "netns", pod)
        _ip("-n", a, "link", "add", "vc0", "type", "veth", "peer", "name", "eth0", "netns", cli)
        _ip("-n", b, "link", "add", "vc0", "type", "veth", "peer", "name", "eth1", "netns", cli)
        links = [(a, "vp0", "10.42.0.1/24"), (a, "vc0", "192.0.2.1/24"),
                 (b, "vc0", "198.51.100.1/24"), (pod, "eth0", "10.42.0.5/24"),
                 (cli, "eth0", "192.0.2.10/24"), (cli, "eth1", "198.51.100.10/24")]  # fmt: skip
        for n, dev, addr in links:
            _ip("-n", n, "addr", "add", addr, "dev", dev)
            _ip("-n", n, "link", "set", dev, "up")
        _ip("-n", pod, "route", "add", "default", "via", "10.42.0.1")
        for n in (a, b):  # routers; the hairpinned packet leaves by the link it came in by:
            # no ICMP redirect for it (the pod would then skip the node)
            _sysctl(n, "net.ipv4.ip_forward=1", "net.ipv4.conf.all.send_redirects=0",
                    "net.ipv4.conf.default.send_redirects=0")  # fmt: skip
        _sysctl(a, "net.ipv4.conf.vp0.send_redirects=0")
        _ip("-n", a, "route", "add", "10.43.0.0/16", "dev", "vp0")  # a default route's stand-in
        server = subprocess.Popen(
            ["ip", "netns", "exec", pod, sys.executable, "-c", SERVER],
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
        self.policy = "Cluster"
        self.sls = [
            {
                "metadata": {
                    "namespace": "shop",
                    "name": "web-a",
                    "labels": {"kubernetes.io/service-name": "web"},
                },
                "addressType": "IPv4",
                "ports": [{"port": 8080, "protocol": "TCP"}],
                "endpoints": [{"addresses": ["10.42.0.5"], "nodeName": "node-a"}],
            }
        ]

    def services(self) -> list[dict[str, Any]]:
        spec = {
            "type": "NodePort",
            "clusterIP": "10.43.0.20",
            "externalTrafficPolicy": self.policy,
            "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}],
        }
        return [{"metadata": {"namespace": "shop", "name": "web"}, "spec": spec}]

    def slices(self) -> list[dict[str, Any]]:
        return self.sls

    async def wait_changed(self, version: int) -> int:
        await trio.sleep_forever()
        raise AssertionError("unreachable")


async def _connect(ns: str, ip: str, port: int, wait: float = 5, src: str = "") -> str:
    """What the server answered (the peer it saw), "refused" or "error <exception>"."""
    args = [ip, str(port), str(wait), *([src] if src else [])]
    done = await trio.run_process(
        ["ip", "netns", "exec", ns, sys.executable, "-c", CLIENT, *args],
        capture_stdout=True,
        check=True,
    )
    return done.stdout.decode().strip()


async def test_local_policy_and_hairpin_through_real_rules(lab: dict[str, str]) -> None:
    src = Source()
    proxies = {
        n: NodeProxy(
            src,
            ProxyOptions(ProxyConfig(f"node-{n}", "10.42.0.0/16", "10.43.0.10")),
            ExecIptables(prefix=["ip", "netns", "exec", lab[n]]),
            metrics=Registry(),
        )
        for n in ("a", "b")
    }
    cli = lab["cli"]
    with trio.fail_after(120):
        for p in proxies.values():
            await p.sync(full=True)
        # Cluster policy: through node-a, masqueraded (the pod sees node-a's address)
        assert await _connect(cli, "192.0.2.1", 30080) == "10.42.0.1"
        # ... and node-b forwards too (DNAT; it has no route to the pod: host unreachable)
        assert await _connect(cli, "198.51.100.1", 30080, wait=1) == "error OSError"
        # hairpin: the pod reaches itself through its ClusterIP, masqueraded to node-a
        assert await _connect(lab["pod"], "10.43.0.20", 80, src="10.42.0.5") == "10.42.0.1"
        # Local policy: the source is kept, and only the node with the endpoint answers
        src.policy = "Local"
        for p in proxies.values():
            await p.sync(full=False)
        assert await _connect(cli, "192.0.2.1", 30080) == "192.0.2.10"
        assert await _connect(cli, "198.51.100.1", 30080, wait=1) == "error TimeoutError"
        # pod traffic to the ClusterIP is not external: hairpin still masqueraded
        assert await _connect(lab["pod"], "10.43.0.20", 80, src="10.42.0.5") == "10.42.0.1"
        # the endpoint moves to node-b (by name): node-a drops, node-b would serve it
        src.sls = [
            {**src.sls[0], "endpoints": [{"addresses": ["10.42.0.5"], "nodeName": "node-b"}]}
        ]
        for p in proxies.values():
            await p.sync(full=False)
        assert await _connect(cli, "192.0.2.1", 30080, wait=1) == "error TimeoutError"
