"""Node proxy benchmark: time from a Service/endpoint change to its rules in the kernel.

    python benches/netbench_rules.py [--services 1000] [--endpoints 10] [--changes 50]

`run(services, endpoints, changes)` (also called by `benches/net_bench.py`) makes its own
network namespace (`ip netns add`, deleted afterwards; nothing outside it is touched), programs
`services` ClusterIP Services with `endpoints` ready endpoints each through the node proxy
(`NodeProxy` + `ExecIptables(prefix=ip netns exec NS)`, one full sync), then makes `changes`
changes one after the other, alternately one endpoint of one Service replaced and one Service
added or removed, and times each `NodeProxy.sync(full=False)`: asking the source which
Services changed (as the agent's ServiceCache answers), redoing those (`RuleBuilder.update`),
rendering the partial restore text and running `iptables-restore --noflush` until it exits
(the rules are in the kernel then). The debounce (`min_sync_period`) is not included: it is a
chosen delay, not work.

Returns (and prints as one JSON line) {"bench": "proxy_rules", "services", "endpoints",
"rules": nat rule count, "full_sync_ms", "change_ms": {"p50", "p99", "max"},
"change_ms_by_kind": {"endpoint": {"p50", "p99"}, "service": {...}} (an endpoint replaced / a
Service added or removed), "build_ms": {"p50", "p99"} (the pure part alone: update + render),
"restore_bytes": {"p50", "max"}}, "change_cpu_ms" (CPU time of this process and of the
iptables processes per change, "proxy_p50"/"proxy_p99" this process alone (the rest is the
`ip netns exec` + `iptables-restore` processes): what the change costs on an idle machine,
whatever the load; "load_average" says how loaded the machine was). Goal: p99 under 100 ms.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from orchestrator.agent.net.proxy import ExecIptables, NodeProxy, ProxyOptions  # noqa: E402
from orchestrator.agent.net.proxyrender import render_change  # noqa: E402
from orchestrator.agent.net.proxyrules import ProxyConfig  # noqa: E402
from orchestrator.agent.net.proxystate import RuleBuilder  # noqa: E402
from orchestrator.metrics import Registry  # noqa: E402

Obj = dict[str, Any]


class _Source:
    def __init__(self, services: int, endpoints: int) -> None:
        self.version = 0
        self.svcs: dict[str, Obj] = {}
        self.sls: dict[str, Obj] = {}
        self.next_ip = 0
        self.log: list[tuple[int, tuple[str, str]]] = []
        for i in range(services):
            self.add(i, endpoints)

    def _pod_ip(self) -> str:
        self.next_ip += 1
        n = self.next_ip
        return f"10.42.{n // 250 % 250}.{n % 250 + 2}"

    def add(self, i: int, endpoints: int) -> None:
        name = f"svc-{i}"
        self.svcs[name] = {
            "metadata": {"namespace": "bench", "name": name},
            "spec": {
                "type": "ClusterIP",
                "clusterIP": f"10.43.{i // 200 % 250 + 1}.{i % 200 + 2}",
                "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
            },
        }
        self.sls[name] = {
            "metadata": {
                "namespace": "bench",
                "name": f"{name}-a",
                "labels": {"kubernetes.io/service-name": name},
            },
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [
                {"addresses": [self._pod_ip()], "conditions": {"ready": True}}
                for _ in range(endpoints)
            ],
        }
        self.touch(name)

    def replace_endpoint(self, rng: random.Random) -> None:
        name = rng.choice(sorted(self.sls))
        sl = self.sls[name]
        eps = list(sl["endpoints"])
        eps[rng.randrange(len(eps))] = {"addresses": [self._pod_ip()], "conditions": {}}
        self.sls[name] = {**sl, "endpoints": eps}
        self.touch(name)

    def remove(self, name: str) -> None:
        del self.svcs[name], self.sls[name]
        self.touch(name)

    def touch(self, name: str) -> None:
        """Record a change of Service `name`, as the agent's ServiceCache does."""
        self.version += 1
        self.log.append((self.version, ("bench", name)))

    def service(self, namespace: str, name: str) -> Obj | None:
        return self.svcs.get(name)

    def slices_for(self, namespace: str, name: str) -> list[Obj]:
        sl = self.sls.get(name)
        return [sl] if sl is not None else []

    def changes_since(self, version: int) -> set[tuple[str, str]] | None:
        i = bisect.bisect_right(self.log, version, key=lambda entry: entry[0])
        return {key for _v, key in self.log[i:]}

    def services(self) -> list[Obj]:
        return list(self.svcs.values())

    def slices(self) -> list[Obj]:
        return list(self.sls.values())

    async def wait_changed(self, version: int) -> int:
        await trio.sleep_forever()
        raise AssertionError("unreachable")


def _cpu() -> tuple[float, float]:
    """CPU seconds of this process, and of its finished children (iptables-restore, ip netns)."""
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _measure(ns: str, services: int, endpoints: int, changes: int) -> dict[str, Any]:
    rng = random.Random(19)
    src = _Source(services, endpoints)
    config = ProxyConfig("bench", "10.42.0.0/16", "10.43.0.10")
    proxy = NodeProxy(
        src, ProxyOptions(config), ExecIptables(prefix=["ip", "netns", "exec", ns], timeout=120),
        metrics=Registry(),
    )  # fmt: skip
    t0 = time.perf_counter()
    await proxy.sync(full=True)
    full_ms = (time.perf_counter() - t0) * 1e3
    builder = RuleBuilder(config)  # the pure part alone, as the proxy does it
    builder.sync_all(src.services(), src.slices())
    seen = src.version
    change_ms: list[float] = []
    cpu_ms: list[float] = []
    self_ms: list[float] = []
    by_kind: dict[str, list[float]] = {"endpoint": [], "service": []}
    build_ms: list[float] = []
    sizes: list[int] = []
    extra = services
    for k in range(changes):
        if k % 2 == 0:
            src.replace_endpoint(rng)
        elif k % 4 == 1:
            src.add(extra, endpoints)
            extra += 1
        else:
            src.remove(rng.choice(sorted(src.svcs)))
        t0 = time.perf_counter()
        keys = src.changes_since(seen)
        assert keys is not None
        text = render_change(builder.update(keys, src.service, src.slices_for), builder)
        build_ms.append((time.perf_counter() - t0) * 1e3)
        seen = src.version
        sizes.append(len(text))
        t0, c0 = time.perf_counter(), _cpu()
        await proxy.sync(full=False)
        change_ms.append((time.perf_counter() - t0) * 1e3)
        c1 = _cpu()
        cpu_ms.append((c1[0] + c1[1] - c0[0] - c0[1]) * 1e3)
        self_ms.append((c1[0] - c0[0]) * 1e3)
        by_kind["endpoint" if k % 2 == 0 else "service"].append(change_ms[-1])
    assert proxy.applied is not None
    return {
        "bench": "proxy_rules",
        "services": services,
        "endpoints": endpoints,
        "rules": sum(len(r) for r in proxy.applied.chains("nat").values()),
        "full_sync_ms": round(full_ms, 1),
        "change_ms": {
            "p50": round(_pct(change_ms, 0.5), 1),
            "p99": round(_pct(change_ms, 0.99), 1),
            "max": round(max(change_ms), 1),
        },
        "change_cpu_ms": {
            "p50": round(_pct(cpu_ms, 0.5), 1),
            "p99": round(_pct(cpu_ms, 0.99), 1),
            "proxy_p50": round(_pct(self_ms, 0.5), 1),
            "proxy_p99": round(_pct(self_ms, 0.99), 1),
        },
        "load_average": round(os.getloadavg()[0], 1),
        "change_ms_by_kind": {
            kind: {"p50": round(_pct(v, 0.5), 1), "p99": round(_pct(v, 0.99), 1)}
            for kind, v in by_kind.items()
        },
        "build_ms": {"p50": round(_pct(build_ms, 0.5), 1), "p99": round(_pct(build_ms, 0.99), 1)},
        "restore_bytes": {"p50": int(_pct(sizes, 0.5)), "max": max(sizes)},
        "changes": changes,
    }


def run(services: int = 1000, endpoints: int = 10, changes: int = 50) -> dict[str, Any]:
    """Measure (module doc) inside a namespace made and removed here; needs root and iptables."""
    ns = f"orchbench{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True, timeout=30)
    try:
        return trio.run(_measure, ns, services, endpoints, changes)
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False, timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--services", type=int, default=1000)
    ap.add_argument("--endpoints", type=int, default=10)
    ap.add_argument("--changes", type=int, default=50)
    args = ap.parse_args()
    print(json.dumps(run(args.services, args.endpoints, args.changes)))


if __name__ == "__main__":
    main()
