"""Issue 19's network benchmark: one table of the node proxy, the node DNS and the data path.

    python benches/net_bench.py [--quick] [--services 1000] [--endpoints 10]
        [--dns-seconds 5] [--connections 2000] [--conn-seconds 3] [--json]

Three parts, each its own module next to this file, each `run(...) -> dict`:

* `netbench_rules.run(services, endpoints)`: from a Service or endpoint change to the node
  proxy's rules in place, at `--services` x `--endpoints` (p50, p99); goal: p99 < 100 ms;
* `netbench_dns.run(seconds)`: the node DNS server's queries/s and p99 latency, cached and
  uncached; goal: >= 5,000 q/s per node with p99 < 5 ms;
* `netbench_conn.run(connections, seconds, services)`: TCP connection latency and throughput
  through a ClusterIP against the pod IP directly, in namespaces it makes (root needed);
  goal: the ClusterIP within 10 %.

A part that cannot be imported or run (not built yet, not root) is shown as "not available"
with the reason; the others still run. The last line printed is one JSON object with every
part's figures (`{"bench": "net", "rules": {...} | {"error": ...}, ...}`). Figures are
reported, never asserted. `--quick` (the smoke test): 100 Services x 10, 1 s of DNS, 200
connections and 0.5 s of throughput.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

GOALS = {
    "rules": "one change at 1,000 Services programmed in < 100 ms at p99",
    "dns": ">= 5,000 queries/s per node, p99 < 5 ms",
    "conn": "a ClusterIP connection within 10 % of a direct one",
}


def _part(module: str, call: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        return {"error": f"not available: {module} ({e})"}
    t0 = time.monotonic()
    try:
        result = dict(call(mod))
    except Exception as e:  # a part's failure must not hide the others' figures
        return {"error": f"not available: {type(e).__name__}: {e}"}
    result.setdefault("elapsed_s", round(time.monotonic() - t0, 2))
    return result


def _flat(d: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = []
    for k, v in d.items():
        if isinstance(v, dict):
            rows += _flat(v, f"{prefix}{k}.")
        else:
            rows.append((prefix + k, v))
    return rows


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = []
    for part, figures in results.items():
        lines.append(f"{part:<6} goal: {GOALS[part]}")
        if "error" in figures:
            lines.append(f"       {figures['error']}")
            continue
        rows = _flat(figures)
        width = max(len(k) for k, _ in rows)
        lines += [f"       {k:<{width}}  {v}" for k, v in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke test: small and short")
    p.add_argument("--services", type=int, default=1000)
    p.add_argument("--endpoints", type=int, default=10)
    p.add_argument("--dns-seconds", type=float, default=5.0)
    p.add_argument("--connections", type=int, default=2000)
    p.add_argument("--conn-seconds", type=float, default=3.0)
    args = p.parse_args(argv)
    if args.quick:
        args.services, args.dns_seconds, args.connections, args.conn_seconds = 100, 1.0, 200, 0.5
    results = {
        "rules": _part("netbench_rules", lambda m: m.run(args.services, args.endpoints)),
        "dns": _part("netbench_dns", lambda m: m.run(args.dns_seconds)),
        "conn": _part(
            "netbench_conn",
            lambda m: m.run(args.connections, args.conn_seconds, args.services),
        ),
    }
    print(table(results), flush=True)
    print(json.dumps({"bench": "net", **results}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
