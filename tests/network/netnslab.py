"""A small lab of network namespaces for the pod network tests (all made and removed here).

`Lab` makes a LAN namespace holding a bridge, and per node a "node" namespace (address
192.0.2.<10+i>/24 on a veth into the LAN bridge, a bridge `cni0` = the podCIDR's gateway) and
a "pod" namespace (one veth into `cni0`, address .2 of the podCIDR, default route via the
gateway). Nothing routes out of these namespaces: no packet leaves them.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import subprocess
import sys
from dataclasses import dataclass, field

LAN = "192.0.2.0/24"
LAN_HOST = "192.0.2.1"  # the LAN namespace's own address: "outside the cluster"


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def can_make_namespaces() -> str:
    """'' when this process may make network namespaces, else why not (a skip reason)."""
    if os.geteuid() != 0:
        return "needs root to make network namespaces"
    try:
        subprocess.run(["ip", "-V"], check=True, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "iproute2 (`ip`) is not installed"
    return ""


@dataclass
class Node:
    name: str
    ns: str
    pod_ns: str
    ip: str
    pod_cidr: str

    @property
    def pod_ip(self) -> str:
        return str(ipaddress.ip_network(self.pod_cidr).network_address + 2)


@dataclass
class Lab:
    prefix: str = field(default_factory=lambda: f"t19pn{secrets.token_hex(3)}")
    nodes: list[Node] = field(default_factory=list)
    made: list[str] = field(default_factory=list)

    @property
    def lan(self) -> str:
        return f"{self.prefix}-lan"

    def _netns(self, name: str) -> str:
        ip("netns", "add", name)
        self.made.append(name)
        ip("-n", name, "link", "set", "lo", "up")
        return name

    def start(self, count: int) -> Lab:
        lan = self._netns(self.lan)
        ip("-n", lan, "link", "add", "br0", "type", "bridge")
        ip("-n", lan, "addr", "add", f"{LAN_HOST}/24", "dev", "br0")
        ip("-n", lan, "link", "set", "br0", "up")
        for i in range(count):
            name = f"node-{chr(ord('a') + i)}"
            ns = self._netns(f"{self.prefix}-n{i}")
            pod_ns = self._netns(f"{self.prefix}-p{i}")
            node = Node(name, ns, pod_ns, f"192.0.2.{10 + i}", f"10.42.{i}.0/24")
            # node <-> LAN
            ip(
                "-n",
                lan,
                "link",
                "add",
                f"lan{i}",
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                ns,
            )
            ip("-n", lan, "link", "set", f"lan{i}", "master", "br0", "up")
            ip("-n", ns, "addr", "add", f"{node.ip}/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
            # pod <-> cni0 bridge of the node
            gateway = str(ipaddress.ip_network(node.pod_cidr).network_address + 1)
            ip("-n", ns, "link", "add", "cni0", "type", "bridge")
            ip("-n", ns, "addr", "add", f"{gateway}/24", "dev", "cni0")
            ip("-n", ns, "link", "set", "cni0", "up")
            ip(
                "-n",
                ns,
                "link",
                "add",
                "veth0",
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                pod_ns,
            )
            ip("-n", ns, "link", "set", "veth0", "master", "cni0", "up")
            ip("-n", pod_ns, "addr", "add", f"{node.pod_ip}/24", "dev", "eth0")
            ip("-n", pod_ns, "link", "set", "eth0", "up")
            ip("-n", pod_ns, "route", "add", "default", "via", gateway)
            self.nodes.append(node)
        return self

    def close(self) -> None:
        for name in reversed(self.made):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
        self.made.clear()


LISTENER = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(8)
print("ready", flush=True)
while True:
    c, peer = s.accept()
    c.sendall(peer[0].encode())
    c.close()
"""

DIALER = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2) as s:
        print(s.recv(100).decode())
except OSError as exc:
    print("error", type(exc).__name__)
"""


def listen(ns: str, port: int) -> subprocess.Popen[str]:
    """A TCP server in `ns` answering each connection with the peer's address."""
    proc = subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, "-c", LISTENER, str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def dial(ns: str, host: str, port: int) -> str:
    """From `ns`: the address the server at host:port saw us as, or 'error ...'."""
    done = subprocess.run(
        ["ip", "netns", "exec", ns, sys.executable, "-c", DIALER, host, str(port)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout.strip()
