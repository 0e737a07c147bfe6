"""TCP through a ClusterIP against the pod IP directly: connection latency and throughput.

    python benches/netbench_conn.py [--connections 2000] [--seconds 3] [--services 1000]

Needs root, iproute2, nsenter and iptables-restore. Everything happens in three network
namespaces made here (`nbc<hex>-cli`, `-node`, `-pod`) and deleted at the end, with
documentation-range addresses and no default route, so no packet can leave them:

    cli  198.51.100.2/24 ──veth── 198.51.100.1 node 203.0.113.1 ──veth── 203.0.113.2/24 pod

`node` forwards between the two (the node the client pod and the server pod meet on) and holds
the node proxy's rules: kube-proxy's iptables shape (nat PREROUTING → KUBE-SERVICES → one
KUBE-SVC chain per Service → KUBE-SEP → DNAT), written by hand here, with `--services` filler
Services ahead of ours in KUBE-SERVICES so that the lookup walks a realistic chain. The
ClusterIP is 192.0.2.100 (ports 80 → 8080 echo, 81 → 8081 sink); the direct path is the pod's
own address 203.0.113.2, forwarded by the same node without the DNAT.

The pod runs this file with `--role server` (a threaded echo server on 8080: it answers each
connection's 64-byte message and closes; a sink on 8081 that reads and discards); the client
runs it with `--role client` and prints JSON: per path, connect+request+reply latency over
`--connections` fresh connections (p50/p99/mean, µs), and one connection's throughput for
`--seconds` (MiB/s). The two paths alternate in rounds so drift in the machine's load hits
both alike. `run()` returns the figures and the ClusterIP's overhead in percent (the goal of
issue 19: within 10 %).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import secrets
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
CLIENT_IP, CLIENT_GW = "198.51.100.2", "198.51.100.1"
POD_IP, POD_GW = "203.0.113.2", "203.0.113.1"
CLUSTER_IP = "192.0.2.100"
ECHO_PORT, SINK_PORT = 8080, 8081
MESSAGE = b"x" * 64
ROUNDS = 4


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))] if s else float("nan")


# ------------------------------------------------------------------ the pod's servers


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        data = b""
        while len(data) < len(MESSAGE):
            chunk = self.request.recv(4096)
            if not chunk:
                return
            data += chunk
        self.request.sendall(data)


class _Sink(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while self.request.recv(1 << 16):
            pass


class _Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
    request_queue_size = 512


def serve(host: str) -> None:
    servers = [_Server((host, ECHO_PORT), _Echo), _Server((host, SINK_PORT), _Sink)]
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for t in threads:
        t.start()
    print("ready", flush=True)
    sys.stdin.read()  # until the bench closes our stdin (or kills us)


# ------------------------------------------------------------------ the client


def _latency(host: str, port: int, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        with socket.create_connection((host, port), timeout=5) as s:
            s.sendall(MESSAGE)
            got = b""
            while len(got) < len(MESSAGE):
                chunk = s.recv(4096)
                if not chunk:
                    raise ConnectionError(f"{host}:{port} closed early")
                got += chunk
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def _throughput(host: str, port: int, seconds: float) -> tuple[int, float]:
    block = b"\0" * (1 << 16)
    sent = 0
    with socket.create_connection((host, port), timeout=5) as s:
        t0 = time.perf_counter()
        deadline = t0 + seconds
        while time.perf_counter() < deadline:
            s.sendall(block)
            sent += len(block)
        elapsed = time.perf_counter() - t0
    return sent, elapsed


def client(connections: int, seconds: float) -> dict[str, Any]:
    paths = {"direct": (POD_IP, ECHO_PORT, SINK_PORT), "cluster_ip": (CLUSTER_IP, 80, 81)}
    lat: dict[str, list[float]] = {p: [] for p in paths}
    sent: dict[str, int] = dict.fromkeys(paths, 0)
    spent: dict[str, float] = dict.fromkeys(paths, 0.0)
    for host, port, _ in paths.values():
        _latency(host, port, 20)  # warm up (ARP, conntrack, the server's threads)
    for _ in range(ROUNDS):
        for name, (host, port, sink) in paths.items():
            lat[name] += _latency(host, port, max(1, connections // ROUNDS))
            b, t = _throughput(host, sink, seconds / ROUNDS)
            sent[name] += b
            spent[name] += t
    result: dict[str, Any] = {}
    for name in paths:
        v = lat[name]
        result[name] = {
            "connections": len(v),
            "p50_us": round(_pct(v, 0.5), 1),
            "p99_us": round(_pct(v, 0.99), 1),
            "mean_us": round(sum(v) / len(v), 1),
            "mib_s": round(sent[name] / spent[name] / (1 << 20), 1),
        }
    return result


# ------------------------------------------------------------------ the namespaces


def _sh(argv: Sequence[str], *, input: str | None = None) -> str:
    proc = subprocess.run(list(argv), capture_output=True, text=True, input=input, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {proc.stderr.strip()}")
    return proc.stdout


def _enter(ns: str) -> list[str]:
    return ["nsenter", f"--net=/run/netns/{ns}", "--"]


def proxy_rules(filler: int) -> str:
    """The node's nat table: `filler` unrelated Services, then ours (echo 80, sink 81)."""
    lines = ["*nat", ":KUBE-SERVICES - [0:0]"]
    ours = [("ECHO", 80, ECHO_PORT), ("SINK", 81, SINK_PORT)]
    for name, _, _ in ours:
        lines += [f":KUBE-SVC-{name} - [0:0]", f":KUBE-SEP-{name} - [0:0]"]
    lines += ["-A PREROUTING -j KUBE-SERVICES", "-A OUTPUT -j KUBE-SERVICES"]
    for i in range(filler):
        # Other Services' ClusterIPs (198.18.0.0/15, the benchmarking range): never matched.
        ip = f"198.18.{i // 250}.{i % 250 + 1}"
        lines.append(f"-A KUBE-SERVICES -d {ip}/32 -p tcp -m tcp --dport 80 -j RETURN")
    for name, port, target in ours:
        lines += [
            f"-A KUBE-SERVICES -d {CLUSTER_IP}/32 -p tcp -m tcp --dport {port} -j KUBE-SVC-{name}",
            f"-A KUBE-SVC-{name} -j KUBE-SEP-{name}",
            f"-A KUBE-SEP-{name} -p tcp -m tcp -j DNAT --to-destination {POD_IP}:{target}",
        ]
    return "\n".join([*lines, "COMMIT", ""])


@contextlib.contextmanager
def namespaces(filler: int) -> Iterator[dict[str, str]]:
    prefix = "nbc" + secrets.token_hex(3)
    ns = {role: f"{prefix}-{role}" for role in ("cli", "node", "pod")}
    made: list[str] = []
    try:
        for name in ns.values():
            _sh(["ip", "netns", "add", name])
            made.append(name)
            _sh(["ip", "-n", name, "link", "set", "lo", "up"])
        node = ns["node"]
        for role, ip, gw in (("cli", CLIENT_IP, CLIENT_GW), ("pod", POD_IP, POD_GW)):
            _sh(["ip", "-n", node, "link", "add", f"to-{role}", "type", "veth",
                 "peer", "name", "eth0", "netns", ns[role]])  # fmt: skip
            _sh(["ip", "-n", node, "addr", "add", f"{gw}/24", "dev", f"to-{role}"])
            _sh(["ip", "-n", node, "link", "set", f"to-{role}", "up"])
            _sh(["ip", "-n", ns[role], "addr", "add", f"{ip}/24", "dev", "eth0"])
            _sh(["ip", "-n", ns[role], "link", "set", "eth0", "up"])
        # Only the lab's own ranges are routed; no default route anywhere.
        for dst in (f"{POD_IP}/32", f"{CLUSTER_IP}/32"):
            _sh(["ip", "-n", ns["cli"], "route", "add", dst, "via", CLIENT_GW])
        _sh(["ip", "-n", ns["pod"], "route", "add", f"{CLIENT_IP}/32", "via", POD_GW])
        _sh([*_enter(node), "sysctl", "-qw", "net.ipv4.ip_forward=1"])
        _sh([*_enter(node), "iptables-restore", "--noflush"], input=proxy_rules(filler))
        yield ns
    finally:
        for name in reversed(made):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


def missing_prerequisites() -> list[str]:
    import os
    import shutil

    problems = [] if os.geteuid() == 0 else ["not running as root"]
    for tool in ("ip", "nsenter", "iptables-restore"):
        if shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None:
            problems.append(f"{tool} not found")
    return problems


def run(connections: int = 2000, seconds: float = 3.0, services: int = 1000) -> dict[str, Any]:
    """Measure both paths in namespaces made here; RuntimeError when it cannot run."""
    problems = missing_prerequisites()
    if problems:
        raise RuntimeError("; ".join(problems))
    me = [sys.executable, str(HERE)]
    with namespaces(services) as ns:
        server = subprocess.Popen(
            [*_enter(ns["pod"]), *me, "--role", "server"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert server.stdout is not None
            if server.stdout.readline().strip() != "ready":
                raise RuntimeError("the echo server did not start")
            out = _sh([*_enter(ns["cli"]), *me, "--role", "client",
                       "--connections", str(connections), "--seconds", str(seconds)])  # fmt: skip
        finally:
            server.kill()
            server.wait()
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    d, c = result["direct"], result["cluster_ip"]
    result["services"] = services
    result["latency_overhead_p50_pct"] = round((c["p50_us"] / d["p50_us"] - 1) * 100, 1)
    result["throughput_overhead_pct"] = round((1 - c["mib_s"] / d["mib_s"]) * 100, 1)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--role", choices=["bench", "server", "client"], default="bench")
    p.add_argument("--connections", type=int, default=2000)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--services", type=int, default=1000, help="filler Services ahead of ours")
    args = p.parse_args(argv)
    if args.role == "server":
        serve(POD_IP)
        return 0
    if args.role == "client":
        print(json.dumps(client(args.connections, args.seconds)), flush=True)
        return 0
    try:
        result = run(args.connections, args.seconds, args.services)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"bench": "net_conn", **result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
