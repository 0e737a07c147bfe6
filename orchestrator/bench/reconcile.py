"""`orchestrator bench reconcile`: how fast does the whole control plane take pods to Running?

Theory of operation
-------------------
One process holds everything, as on an edge device:

* a single-member server (Raft over SQLite with fsync, data in a temporary directory) with the
  API and the controllers on — the ControllerManager runs the workload controllers and the
  `Scheduler` on the leader, exactly as `orchestrator server` does;
* `N` simulated nodes (`SimulatedCluster`: one pod watch, a writer pool, each node writing as
  `system:node:<name>`);
* the workload: `D` Deployments (or, while no Deployment controller is registered, `D`
  ReplicaSets) whose replicas total `M`, created as fast as the API takes them;
* the cyclic garbage collector tuned as `orchestrator server` tunes it once started
  (`server.tune_gc`: start-up objects frozen, far rarer collections);
* an observer: an event handler on the controllers' shared pod informer (their list + watch)
  recording, per pod, when it was first seen (created), first seen with a node (bound) and
  first seen Running — the SLO's "as seen by watch", without a watch of its own that the
  measured process would have to serve.

The clock starts just before the first workload object is created and stops when the observer
has seen all `M` pods Running. Reported: pods/s end to end, the scheduler's binds/s (first to
last bind seen), p50/p99 of create→bound, bound→Running and create→Running, peak RSS
(`ru_maxrss`) and the CPU seconds the process used (all threads: SQLite work runs in threads).

A progress line goes to stderr (rewritten with `\\r`) when it is a terminal; `--json` prints a
last JSON line with `pods_per_second` and the rest.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import resource
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import trio

from orchestrator.apiserver.server import ApiOptions
from orchestrator.client.resource import DEPLOYMENTS, NAMESPACES, PODS, REPLICASETS
from orchestrator.controllers.runtime import InProcessClient
from orchestrator.kube.errors import ApiError
from orchestrator.kube.objects import Obj
from orchestrator.raft.node import NodeConfig
from orchestrator.scheduler.scheduler import Scheduler
from orchestrator.security.authn import User
from orchestrator.server import Server, ServerOptions, tune_gc
from orchestrator.testing.nodes import SimulatedCluster

__all__ = ["BenchResult", "add_parser", "main", "run_bench"]

log = logging.getLogger(__name__)

ADMIN = User("bench-admin", ("system:masters", "system:authenticated"))
NAMESPACE = "bench"
CREATE_PARALLELISM = 8


@dataclass
class _Pod:
    created: float
    bound: float | None = None
    running: float | None = None


@dataclass
class BenchResult:
    nodes: int
    pods: int
    workloads: int
    workload_kind: str
    seconds: float
    pods_per_second: float
    binds_per_second: float
    create_to_bound_p50: float
    create_to_bound_p99: float
    bound_to_running_p50: float
    bound_to_running_p99: float
    create_to_running_p50: float
    create_to_running_p99: float
    peak_rss_mib: float
    cpu_seconds: float
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "extra"}
        out.update(self.extra)
        return out


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class _Observer:
    """Per-pod timestamps from the shared pod informer (see the module doc)."""

    def __init__(self) -> None:
        self.pods: dict[str, _Pod] = {}
        self.bound = 0
        self.running = 0
        self.first_bind: float | None = None
        self.last_bind = 0.0
        self.all_running = trio.Event()
        self.expected = 0

    def observe(self, pod: Obj, now: float) -> None:
        meta = pod.get("metadata") or {}
        key = str(meta.get("uid") or meta.get("name"))
        rec = self.pods.get(key)
        if rec is None:
            rec = self.pods[key] = _Pod(now)
        if rec.bound is None and (pod.get("spec") or {}).get("nodeName"):
            rec.bound = now
            self.bound += 1
            if self.first_bind is None:
                self.first_bind = now
            self.last_bind = now
        if rec.running is None and (pod.get("status") or {}).get("phase") == "Running":
            rec.running = now
            if rec.bound is None:
                rec.bound = now
                self.bound += 1
            self.running += 1
            if self.running >= self.expected:
                self.all_running.set()

    async def attach(self, server: Server) -> None:
        """Observe through the controllers' shared pod informer: no watch of its own for the
        measured process to serve."""
        manager = server.controllers
        if manager is None:
            raise RuntimeError("the benchmark needs the server's controller manager")

        def seen(pod: Obj) -> None:
            if (pod.get("metadata") or {}).get("namespace") == NAMESPACE:
                self.observe(pod, trio.current_time())

        with trio.fail_after(60):
            while manager.informers is None:  # noqa: ASYNC110  (set when this lone server leads)
                await trio.sleep(0.01)
            pods = manager.informers.informer(PODS)  # the scheduler's and the controllers'
            pods.add_event_handler(on_add=seen, on_update=lambda _old, new: seen(new))
            await pods.wait_for_cache_sync()


def _template(i: int) -> Obj:
    labels = {"app": f"bench-{i}"}
    return {
        "metadata": {"labels": labels},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "app",
                    "image": "registry.example/bench:1",
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                }
            ],
        },
    }


def _workload(kind: str, i: int, replicas: int) -> Obj:
    template = _template(i)
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": f"bench-{i}", "namespace": NAMESPACE},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": dict(template["metadata"]["labels"])},
            "template": template,
        },
    }


def _deployments_available() -> bool:
    """Is a Deployment controller registered? (Until it lands, the bench uses ReplicaSets.)"""
    return importlib.util.find_spec("orchestrator.controllers.deployment") is not None


def _usage() -> tuple[float, float]:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024.0


async def run_bench(
    nodes: int,
    pods: int,
    deployments: int | None = None,
    *,
    progress: TextIO | None = None,
    data_dir: Path | None = None,
    give_up_after: float | None = None,
) -> BenchResult:
    """Run the benchmark (see the module doc) and return its figures."""
    workloads = deployments or max(1, pods // 100)
    kind = "Deployment" if _deployments_available() else "ReplicaSet"
    res = DEPLOYMENTS if kind == "Deployment" else REPLICASETS
    with tempfile.TemporaryDirectory(prefix="orchestrator-bench-") as tmp:
        root = data_dir or Path(tmp)
        opts = ServerOptions(
            NodeConfig(
                node_id=1, data_dir=root, peer_listen="127.0.0.1:0", founders={1: "127.0.0.1:0"}
            ),
            "127.0.0.1:0",
            token="bench",
            api=ApiOptions(root, "127.0.0.1:0", tls=False, cluster_token="bench"),
        )
        server = Server(opts)
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            assert server.api is not None
            api = server.api.api
            admin = InProcessClient(api, ADMIN, field_manager="bench")
            with trio.fail_after(60):
                while True:
                    try:
                        await admin.get(NAMESPACES, "kube-node-lease")
                        break
                    except ApiError:
                        await trio.sleep(0.05)
                await admin.create(NAMESPACES, {"metadata": {"name": NAMESPACE}})
            tune_gc()  # as `orchestrator server` does once started
            per_node = max(110, -(-pods // nodes) + 10)  # room for every pod, whatever N
            cluster = SimulatedCluster(
                api, nodes, prefix="sim-", cpu="32", memory="256Gi", pods=per_node
            )
            observer = _Observer()
            observer.expected = pods
            await nursery.start(cluster.run)
            await observer.attach(server)
            cpu0, _ = _usage()
            start = trio.current_time()
            sizes = [
                pods // workloads + (1 if i < pods % workloads else 0) for i in range(workloads)
            ]
            items = iter(list(enumerate(sizes)))

            async def creator() -> None:
                for i, n in items:
                    await admin.create(res, _workload(kind, i, n), NAMESPACE)

            async def report() -> None:
                while progress is not None:
                    elapsed = trio.current_time() - start
                    progress.write(
                        f"\r{elapsed:7.1f}s  created {len(observer.pods):>6}  bound "
                        f"{observer.bound:>6}  running {observer.running:>6}/{pods}  "
                        f"({observer.running / max(elapsed, 1e-9):7.1f} pods/s) "
                    )
                    progress.flush()
                    await trio.sleep(0.5)

            nursery.start_soon(report)
            with trio.fail_after(give_up_after or float("inf")):
                async with trio.open_nursery() as creators:
                    for _ in range(min(CREATE_PARALLELISM, workloads)):
                        creators.start_soon(creator)
                await observer.all_running.wait()
            end = trio.current_time()
            cpu1, rss = _usage()
            if progress is not None:
                progress.write("\n")
                progress.flush()
            sched = next(
                (c for c in (server.controllers.controllers if server.controllers else [])
                 if isinstance(c, Scheduler)),
                None,
            )  # fmt: skip
            stats = cluster.statistics()
            extra: dict[str, Any] = {
                "sim_started": stats.started,
                "sim_errors": stats.errors,
                "scheduler_bind_errors": sched.statistics().bind_errors if sched else None,
                "scheduler_attempts": sched.statistics().attempts if sched else None,
            }
            nursery.cancel_scope.cancel()
    recs = [r for r in observer.pods.values() if r.running is not None]
    c2b = [r.bound - r.created for r in recs if r.bound is not None]
    b2r = [r.running - r.bound for r in recs if r.running is not None and r.bound is not None]
    c2r = [r.running - r.created for r in recs if r.running is not None]
    seconds = end - start
    bind_span = observer.last_bind - (observer.first_bind or start)
    return BenchResult(
        nodes=nodes,
        pods=pods,
        workloads=workloads,
        workload_kind=kind,
        seconds=round(seconds, 3),
        pods_per_second=round(pods / seconds, 1),
        binds_per_second=round(observer.bound / bind_span, 1) if bind_span > 0 else 0.0,
        create_to_bound_p50=round(_percentile(c2b, 0.5), 3),
        create_to_bound_p99=round(_percentile(c2b, 0.99), 3),
        bound_to_running_p50=round(_percentile(b2r, 0.5), 3),
        bound_to_running_p99=round(_percentile(b2r, 0.99), 3),
        create_to_running_p50=round(_percentile(c2r, 0.5), 3),
        create_to_running_p99=round(_percentile(c2r, 0.99), 3),
        peak_rss_mib=round(rss, 1),
        cpu_seconds=round(cpu1 - cpu0, 2),
        extra=extra,
    )


def add_parser(sub: Any) -> None:
    """Add `bench reconcile` to the `orchestrator` subparsers."""
    bench = sub.add_parser("bench", help="built-in whole-system benchmarks")
    bs = bench.add_subparsers(dest="bench_command", required=True)
    rec = bs.add_parser(
        "reconcile",
        help="time pods from workload creation to Running on simulated nodes (in process)",
    )
    rec.add_argument("--nodes", type=int, default=100, help="simulated nodes (default 100)")
    rec.add_argument("--pods", type=int, default=10_000, help="pods in all (default 10000)")
    rec.add_argument(
        "--deployments", type=int, default=None, help="workloads to spread the pods over "
        "(default: one per 100 pods)"
    )  # fmt: skip
    rec.add_argument("--timeout", type=float, default=None, help="give up after this long (s)")
    rec.add_argument("--json", action="store_true", help="print a last JSON line of results")


def main(args: argparse.Namespace) -> int:
    if args.nodes < 1 or args.pods < 1:
        print("error: --nodes and --pods must be at least 1", file=sys.stderr)
        return 2
    progress = sys.stderr if sys.stderr.isatty() else None
    try:
        result = trio.run(
            lambda: run_bench(
                args.nodes,
                args.pods,
                args.deployments,
                progress=progress,
                give_up_after=args.timeout,
            )
        )
    except trio.TooSlowError:
        print(f"error: not all pods were Running within {args.timeout} s", file=sys.stderr)
        return 1
    d = result.as_dict()
    rows = [
        ("nodes / pods / workloads", f"{result.nodes} / {result.pods} / {result.workloads} "
         f"{result.workload_kind}s"),
        ("wall time", f"{result.seconds:.2f} s"),
        ("pods/s end to end", f"{result.pods_per_second:.1f}"),
        ("scheduler binds/s", f"{result.binds_per_second:.1f}"),
        ("create→bound p50/p99", f"{result.create_to_bound_p50:.3f} / "
         f"{result.create_to_bound_p99:.3f} s"),
        ("bound→Running p50/p99", f"{result.bound_to_running_p50:.3f} / "
         f"{result.bound_to_running_p99:.3f} s"),
        ("create→Running p50/p99", f"{result.create_to_running_p50:.3f} / "
         f"{result.create_to_running_p99:.3f} s"),
        ("peak RSS", f"{result.peak_rss_mib:.1f} MiB"),
        ("CPU", f"{result.cpu_seconds:.2f} s"),
    ]  # fmt: skip
    for label, value in rows:
        print(f"{label:<26} {value}")
    if args.json:
        print(json.dumps({"bench": "reconcile", **d}, sort_keys=True))
    return 0
