"""The node DNS server's speed: queries per second and latency (p50/p99), on loopback.

    python benches/netbench_dns.py [--seconds 5] [--window 8]

Three processes: the node DNS server (`agent.net.dnsserver.DnsServer` over a snapshot of
`SERVICES` Services, on 127.0.0.1, any free port), a stub upstream DNS server (another loopback
port; answers any name with one A record, TTL 300) and this one, the load generator: one UDP
socket keeping `--window` queries outstanding, timing each from send to answer. Phases, each
`seconds / 3` long:

* `cluster`: A queries for the Services' names in turn (answered from the snapshot, then from
  the memo of answers);
* `cached_forward`: one outside name again and again (forwarded once, then from the cache);
* `uncached_forward`: a new outside name every query (every one forwarded to the stub).

Goal (issue 19): at least 5,000 q/s with p99 under 5 ms for the cached phases. `run(seconds)`
returns the figures as a dict (benches/net_bench.py calls it); the script prints them as JSON.
Nothing leaves loopback.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import socket
import struct
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SERVICES = 200
GOAL_QPS = 5000
GOAL_P99_MS = 5.0


def _stub_upstream(conn: Connection) -> None:
    """A blocking UDP responder: A 192.0.2.1 (TTL 300) for any name, made from the query's
    bytes (no parsing, so the stub is not what limits the uncached phase)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    conn.send(sock.getsockname()[1])
    record = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 300, 4) + socket.inet_aton("192.0.2.1")
    while True:
        data, addr = sock.recvfrom(4096)
        end = data.find(b"\x00", 12) + 5  # the question's end (plain labels, then type+class)
        if len(data) < 17 or end < 17:
            continue
        flags = struct.unpack_from("!H", data, 2)[0] | 0x8080  # QR, RA
        header = data[:2] + struct.pack("!HHHHH", flags, 1, 1, 0, 0)
        sock.sendto(header + data[12:end] + record, addr)


def _dns_server(conn: Connection, upstream_port: int) -> None:
    import trio

    from orchestrator.agent.net.clusterview import SnapshotView
    from orchestrator.agent.net.dnsanswer import Zone
    from orchestrator.agent.net.dnsserver import DnsServer, Forwarder

    services = [
        {
            "kind": "Service",
            "metadata": {"namespace": f"ns{i % 10}", "name": f"svc{i}"},
            "spec": {"clusterIP": f"10.43.{i // 250}.{i % 250 + 2}", "ports": [{"port": 80}]},
        }
        for i in range(SERVICES)
    ]

    async def main() -> None:
        server = DnsServer(
            SnapshotView(services),
            Zone("cluster.local"),
            Forwarder([("127.0.0.1", upstream_port)]),
            host="127.0.0.1",
            port=0,
        )
        async with trio.open_nursery() as nursery:
            _, port = await nursery.start(server.run)
            conn.send(port)

    trio.run(main)


def _queries(phase: str) -> list[bytes] | None:
    import dns.message

    if phase == "cluster":
        names = [f"svc{i}.ns{i % 10}.svc.cluster.local" for i in range(SERVICES)]
    elif phase == "cached_forward":
        names = ["www.example.com"]
    else:
        return None  # made per query
    return [dns.message.make_query(n, "A").to_wire() for n in names]


def _load(port: int, phase: str, seconds: float, window: int) -> dict[str, float | int]:
    """Keep `window` queries outstanding for `seconds`; rate and latency of the answers."""
    import dns.message

    fixed = _queries(phase)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.connect(("127.0.0.1", port))
    sock.settimeout(1.0)
    pending: dict[int, float] = {}
    latencies: list[float] = []
    lost = 0
    n = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        now = time.perf_counter()
        if now >= deadline:
            break
        while len(pending) < window:
            qid = n % 65536
            if fixed is not None:
                wire = struct.pack("!H", qid) + fixed[n % len(fixed)][2:]
            else:
                q = dns.message.make_query(f"q{n}.{int(start)}.bench.example", "A")
                q.id = qid
                wire = q.to_wire()
            n += 1
            pending[qid] = time.perf_counter()
            sock.send(wire)
        try:
            data = sock.recv(4096)
        except TimeoutError:
            lost += len(pending)
            pending.clear()
            continue
        sent = pending.pop(struct.unpack_from("!H", data)[0], None)
        if sent is not None:
            latencies.append(time.perf_counter() - sent)
    elapsed = time.perf_counter() - start
    sock.close()
    latencies.sort()

    def pct(p: float) -> float:
        if not latencies:
            return float("nan")
        return round(latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000, 3)

    return {
        "qps": round(len(latencies) / elapsed),
        "answered": len(latencies),
        "lost": lost,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
    }


def run(seconds: float = 5, window: int = 8) -> dict[str, object]:
    """The three phases of the module doc; their figures and whether the goal is met."""
    ctx = multiprocessing.get_context("spawn")
    stub_conn, stub_child = ctx.Pipe()
    stub = ctx.Process(target=_stub_upstream, args=(stub_child,), daemon=True)
    stub.start()
    procs = [stub]
    try:
        if not stub_conn.poll(30):
            raise RuntimeError("the stub upstream did not start")
        upstream_port = stub_conn.recv()
        srv_conn, srv_child = ctx.Pipe()
        server = ctx.Process(target=_dns_server, args=(srv_child, upstream_port), daemon=True)
        server.start()
        procs.append(server)
        if not srv_conn.poll(30):
            raise RuntimeError("the DNS server did not start")
        port = srv_conn.recv()
        phases = {}
        for phase in ("cluster", "cached_forward", "uncached_forward"):
            _load(port, phase, min(0.5, seconds / 6), window)  # warm-up (fills memo/cache)
            phases[phase] = _load(port, phase, seconds / 3, window)
    finally:
        for p in procs:
            p.terminate()
            p.join(5)
    cached = [phases["cluster"], phases["cached_forward"]]
    return {
        "bench": "dns",
        "window": window,
        "seconds": seconds,
        **phases,
        "goal": {"qps": GOAL_QPS, "p99_ms": GOAL_P99_MS},
        "goal_met": all(
            float(p["qps"]) >= GOAL_QPS and float(p["p99_ms"]) < GOAL_P99_MS for p in cached
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--window", type=int, default=8, help="queries outstanding at once")
    args = parser.parse_args()
    print(json.dumps(run(args.seconds, args.window)))


if __name__ == "__main__":
    main()
