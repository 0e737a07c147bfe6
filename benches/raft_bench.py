"""Raft write benchmark: committed proposals per second and commit latency, on real processes.

    python benches/raft_bench.py --servers 1,3 --concurrency 1,16,256 --duration 10 \\
        [--client-procs 2] [--value-bytes 100] [--keep-data]

For each cluster size, a fresh cluster of `orchestrator server` processes is started on
loopback (see tests/cluster.py; the server always fsyncs its SQLite commits). For each
concurrency, `--client-procs` separate Python processes (this file with `--worker`) each run a
trio `StoreClient` with their share of the concurrency: every task writes `--value-bytes` values to
distinct keys, back to back, for `--duration` seconds. Load generation is kept out of the
measuring process so that the client is not what is measured; the CPU the clients used is
reported next to the servers' (user + system seconds during the measured window).

A write counts when it is acknowledged ("ok": committed on a quorum and applied on the leader)
within the window; its latency is the time from sending it to the acknowledgement. Output: a
table (servers, concurrency, writes/s, p50 ms, p99 ms, client CPU s, server CPU s) and finally
one JSON line with every figure. This is a measurement, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from benchlib import cluster_lib, cpu_self, percentile  # noqa: E402  (path set above)


# ---------------------------------------------------------------------------------- worker
async def _worker(args: argparse.Namespace) -> dict[str, Any]:
    from orchestrator.store.client import ClientError, StoreClient

    endpoints = args.endpoints.split(",")
    value = (b"v" * args.value_bytes)[: args.value_bytes]
    latencies: list[float] = []
    ok_in_window = 0
    errors = 0
    from orchestrator.store.client import ClientTLS

    # The servers' client port requires mutual TLS: a server's admin certificate.
    async with StoreClient(endpoints, tls=ClientTLS.from_data_dir(args.tls_dir)) as kv:
        # Connect and find the leader before the window opens.
        with trio.fail_after(30):
            await kv.put(f"{args.prefix}-warmup", value)
        await trio.sleep(max(0.0, args.start_at - time.time()))
        cpu0 = cpu_self()
        t_start = time.perf_counter()
        t_end = t_start + args.duration

        async def task(t: int) -> None:
            nonlocal ok_in_window, errors
            seq = 0
            while time.perf_counter() < t_end:
                key = f"{args.prefix}-{t}-{seq}"
                seq += 1
                t0 = time.perf_counter()
                try:
                    await kv.put(key, value)
                except ClientError:
                    errors += 1
                    continue
                t1 = time.perf_counter()
                if t1 <= t_end:
                    ok_in_window += 1
                    latencies.append((t1 - t0) * 1000.0)

        async with trio.open_nursery() as nursery:
            for t in range(args.tasks):
                nursery.start_soon(task, t)
        cpu = cpu_self() - cpu0
    return {"ok": ok_in_window, "errors": errors, "cpu_s": cpu, "latencies_ms": latencies}


def worker_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--endpoints", required=True)
    ap.add_argument("--tasks", type=int, required=True)
    ap.add_argument("--duration", type=float, required=True)
    ap.add_argument("--start-at", type=float, required=True)
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--tls-dir", required=True, help="a server's data dir (its admin cert)")
    args = ap.parse_args(argv)
    result = trio.run(_worker, args)
    json.dump(result, sys.stdout)
    sys.stdout.flush()
    return 0


# ---------------------------------------------------------------------------------- driver
def _split(total: int, parts: int) -> list[int]:
    parts = max(1, min(parts, total))
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _server_cpu(cluster: Any) -> float:
    return sum(cluster.cpu_seconds(i) or 0.0 for i in cluster.running())


def run_point(
    cluster: Any, n_servers: int, concurrency: int, args: argparse.Namespace
) -> dict[str, Any]:
    shares = _split(concurrency, args.client_procs)
    start_at = time.time() + args.startup_s
    # The leader first: the client sticks to the first server that answers, and a follower
    # would forward every write (an extra hop that is not what this point measures).
    leader = cluster.wait_leader_blocking(within=30)
    endpoints = [cluster.endpoint(leader)] + [
        e for i, e in enumerate(cluster.endpoints) if i != leader
    ]
    procs = []
    for p, share in enumerate(shares):
        argv = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--worker",
            "--endpoints",
            ",".join(endpoints),
            "--tasks",
            str(share),
            "--duration",
            str(args.duration),
            "--start-at",
            repr(start_at),
            "--prefix",
            f"s{n_servers}c{concurrency}p{p}",
            "--value-bytes",
            str(args.value_bytes),
            "--tls-dir",
            str(cluster.servers[0].data_dir),
        ]
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE))
    # Server CPU is sampled around the window (the clients warm up before start_at).
    time.sleep(max(0.0, start_at - time.time()))
    cpu0 = _server_cpu(cluster)
    time.sleep(args.duration)
    cpu1 = _server_cpu(cluster)
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=args.duration + 120)
        if proc.returncode != 0:
            raise RuntimeError(f"client process failed with status {proc.returncode}")
        results.append(json.loads(out))
    lat = sorted(x for r in results for x in r["latencies_ms"])
    ok = sum(r["ok"] for r in results)
    return {
        "servers": n_servers,
        "concurrency": concurrency,
        "client_procs": len(shares),
        "writes": ok,
        "writes_per_s": ok / args.duration,
        "p50_ms": percentile(lat, 0.50),
        "p99_ms": percentile(lat, 0.99),
        "errors": sum(r["errors"] for r in results),
        "client_cpu_s": sum(r["cpu_s"] for r in results),
        "server_cpu_s": cpu1 - cpu0,
    }


def _print_row(r: dict[str, Any]) -> None:
    print(
        f"{r['servers']:>7} {r['concurrency']:>11} {r['writes_per_s']:>9.0f} "
        f"{r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} {r['client_cpu_s']:>12.2f} "
        f"{r['server_cpu_s']:>12.2f}",
        flush=True,
    )


def main() -> int:
    if "--worker" in sys.argv[1:]:
        return worker_main(sys.argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--servers", default="1,3", help="cluster sizes, comma-separated")
    ap.add_argument(
        "--concurrency",
        default="1,16,256",
        help="writes in flight (over all client processes), comma-separated",
    )
    ap.add_argument("--duration", type=float, default=10.0, help="seconds measured per point")
    ap.add_argument("--client-procs", type=int, default=2, help="load-generating processes")
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument(
        "--startup-s",
        type=float,
        default=2.0,
        help="time given to the client processes to start and connect",
    )
    ap.add_argument("--keep-data", action="store_true", help="keep the data directories")
    args = ap.parse_args()
    sizes = [int(x) for x in args.servers.split(",") if x]
    levels = [int(x) for x in args.concurrency.split(",") if x]

    cluster_mod = cluster_lib
    root = Path(tempfile.mkdtemp(prefix="raft-bench-"))
    rows: list[dict[str, Any]] = []
    print(
        f"# {os.cpu_count()} CPUs, {args.duration:g}s per point, {args.client_procs} client "
        f"processes, {args.value_bytes}-byte values, data in {root}",
        flush=True,
    )
    print(
        f"{'servers':>7} {'concurrency':>11} {'writes/s':>9} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'client CPU s':>12} {'server CPU s':>12}",
        flush=True,
    )
    try:
        for n in sizes:
            with cluster_mod.Cluster(
                root / f"{n}-servers", n, tick_ms=100, log_level="warning", api=False
            ) as cluster:
                cluster.start()
                cluster.wait_leader_blocking(within=30)
                for c in levels:
                    row = run_point(cluster, n, c, args)
                    rows.append(row)
                    _print_row(row)
                cluster.check_alive()
    finally:
        if not args.keep_data:
            import shutil

            shutil.rmtree(root, ignore_errors=True)
    print(
        json.dumps(
            {
                "bench": "raft_write",
                "duration_s": args.duration,
                "value_bytes": args.value_bytes,
                "results": rows,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
