"""`orchestrator bench reconcile --scales 1000,10000,100000`: how the cost grows with the pods.

Each scale runs as `orchestrator bench reconcile --pods P --json` in a fresh process, one after
the other, so each peak RSS is that scale's own (`ru_maxrss` never goes down in a process) and
no scale inherits another's heap. The nodes are `--nodes` at every scale if given, else one per
100 pods (10, 100 and 1,000 for the default scales). The children's progress and logs go to
stderr; then one table is printed (with `--json`, also each scale's JSON line, with `"scale"`
set). A scale that fails or times out is reported as such and the others still run.

Columns: pods/s end to end; peak RSS; RSS per pod above the baseline (the server with its nodes
registered, before the first workload); CPU per pod of the measured process (the server, and
the in-process nodes unless `--nodes-over-http`), and net of the idle cluster's CPU (see
`orchestrator.bench.reconcile`); 5xx answers (HTTP, plus the nodes' writes)
and Lease renewals that failed, came late or let the Lease lapse; nodes not Ready at the end.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

__all__ = ["parse_scales", "run_scales", "table"]

PODS_PER_NODE = 100


def parse_scales(text: str) -> list[int]:
    """`"1000,10000"` -> [1000, 10000]; ValueError naming the bad item."""
    out: list[int] = []
    for item in text.split(","):
        item = item.strip().replace("_", "")
        if not item.isdigit() or int(item) < 1:
            raise ValueError(f"--scales: {item!r} is not a pod count (a positive integer)")
        out.append(int(item))
    if not out:
        raise ValueError("--scales: give at least one pod count, e.g. 1000,10000")
    return out


def _row(d: dict[str, Any]) -> list[str]:
    if "error" in d:
        return [f"{d['pods']:,}", f"{d['nodes']:,}", d["error"]] + [""] * 7
    lease = f"{d['lease_renewals']} / {d['lease_failures']} / {d['lease_late']} / {d['lease_lost']}"
    return [
        f"{d['pods']:,}",
        f"{d['nodes']:,}",
        f"{d['pods_per_second']:.1f}",
        f"{d['run_peak_rss_mib']:.1f}",
        f"{d['baseline_rss_mib']:.1f}",
        f"{d['rss_per_pod_kib']:.2f}",
        f"{d['cpu_ms_per_pod']:.3f}",
        "-" if d.get("cpu_ms_per_pod_net") is None else f"{d['cpu_ms_per_pod_net']:.3f}",
        f"{d['http_5xx']} / {d['sim_5xx']}",
        lease,
        f"{d['nodes_not_ready']}",
    ]


HEADER = [
    "pods",
    "nodes",
    "pods/s",
    "peak RSS MiB",
    "baseline MiB",
    "RSS/pod KiB",
    "CPU ms/pod",
    "net of idle",
    "5xx http/nodes",
    "leases ok/failed/late/lapsed",
    "not Ready",
]


def table(results: list[dict[str, Any]], transport: str) -> str:
    """The markdown table of `results` (each a JSON result, or {"pods", "nodes", "error"})."""
    rows = [HEADER, ["---"] * len(HEADER)] + [_row(d) for d in results]
    lines = [f"bench reconcile, simulated nodes {transport}"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def run_scales(args: argparse.Namespace) -> int:
    """Run every scale of `args.scales` in its own process; print the table."""
    try:
        scales = parse_scales(args.scales)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.nodes is not None and args.nodes < 1:
        print("error: --nodes must be at least 1", file=sys.stderr)
        return 2
    results: list[dict[str, Any]] = []
    for pods in scales:
        nodes = args.nodes if args.nodes is not None else max(1, pods // PODS_PER_NODE)
        cmd = [sys.executable, "-m", "orchestrator", "bench", "reconcile", "--json",
               "--pods", str(pods), "--nodes", str(nodes)]  # fmt: skip
        if args.deployments is not None:
            cmd += ["--deployments", str(args.deployments)]
        if args.timeout is not None:
            cmd += ["--timeout", str(args.timeout)]
        if args.nodes_over_http:
            cmd.append("--nodes-over-http")
        cmd += ["--idle-seconds", str(args.idle_seconds)]
        print(f"--- {pods} pods on {nodes} nodes", file=sys.stderr, flush=True)
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
        lines = proc.stdout.strip().splitlines()
        if proc.returncode != 0 or not lines or not lines[-1].startswith("{"):
            results.append({"pods": pods, "nodes": nodes, "error": f"exit {proc.returncode}"})
            continue
        d = json.loads(lines[-1])
        results.append(d)
        print(proc.stdout, file=sys.stderr, end="", flush=True)  # that scale's own summary
    transport = "over HTTPS (a process of their own)" if args.nodes_over_http else "in process"
    print(table(results, transport))
    if args.json:
        for d in results:
            print(json.dumps({"bench": "reconcile", "scale": d["pods"], **d}, sort_keys=True))
    return 0 if all("error" not in d for d in results) else 1
