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

Before the workload, with `idle_seconds`, the CPU the idle cluster costs per second (the nodes'
Lease renewals and status reports, the controllers' resyncs) is measured over that window, once
every node's heartbeat has begun (`IDLE_SETTLE` after registration). `cpu_ms_per_pod_net` is
the run's CPU less that idle rate times the run's duration, per pod: a figure that does not
grow merely because a bigger run lasts longer with the same nodes heartbeating.

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
import os
import resource
import sys
import tempfile
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import trio

from orchestrator.apiserver.server import ApiOptions
from orchestrator.bench.httpnodes import HttpNodes, start_http_nodes
from orchestrator.bench.wakelag import WakeLag
from orchestrator.client.resource import DEPLOYMENTS, NAMESPACES, NODES, PODS, REPLICASETS
from orchestrator.controllers.runtime import InProcessClient
from orchestrator.kube.errors import ApiError
from orchestrator.kube.objects import Obj
from orchestrator.metrics import REGISTRY
from orchestrator.network.settings import NetworkSettings
from orchestrator.raft.node import NodeConfig
from orchestrator.scheduler.scheduler import Scheduler
from orchestrator.security.authn import User
from orchestrator.server import Server, ServerOptions, tune_gc
from orchestrator.testing.nodes import SimStatistics, SimulatedCluster

__all__ = ["BenchResult", "add_parser", "main", "run_bench"]

log = logging.getLogger(__name__)

ADMIN = User("bench-admin", ("system:masters", "system:authenticated"))
NAMESPACE = "bench"
CREATE_PARALLELISM = 8
RSS_SAMPLE_INTERVAL = 0.2  # seconds between samples of the current RSS during the run
BENCH_CLUSTER_CIDR = "10.128.0.0/9"  # pods; beside the default service CIDR 10.43.0.0/16
IDLE_SECONDS = 10.0  # the CLI's default idle window: one Lease renewal interval
IDLE_SETTLE = 10.0  # every node has renewed once by then (renewal phases: see simengine)
# Taints the node lifecycle controller puts on a node whose Lease expired.
_LEASE_TAINTS = frozenset({"node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"})


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


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class _Observer:
    """Per-pod timestamps from the shared pod informer (see the module doc), kept small so the
    benchmark's own bookkeeping hardly shows in RSS per pod: a pod's times are held only until it
    is Running, then only its three latencies (8 bytes each, in arrays) and its uid (a string the
    informer's cached pod holds anyway) in the set of pods done."""

    def __init__(self) -> None:
        self.pending: dict[str, list[float]] = {}  # uid -> [created, bound or -1] until Running
        self.done: set[str] = set()
        self.c2b = array("d")
        self.b2r = array("d")
        self.c2r = array("d")
        self.seen = 0
        self.bound = 0
        self.running = 0
        self.first_bind: float | None = None
        self.last_bind = 0.0
        self.all_running = trio.Event()
        self.expected = 0

    def nbytes(self) -> int:
        """Roughly what the observer holds beyond the informer's own objects."""
        arrays = sum(a.buffer_info()[1] * a.itemsize for a in (self.c2b, self.b2r, self.c2r))
        pending = sum(sys.getsizeof(v) for v in self.pending.values())
        return sys.getsizeof(self.done) + sys.getsizeof(self.pending) + pending + arrays

    def _bind(self, rec: list[float], now: float) -> None:
        rec[1] = now
        self.bound += 1
        if self.first_bind is None:
            self.first_bind = now
        self.last_bind = now

    def observe(self, pod: Obj, now: float) -> None:
        meta = pod.get("metadata") or {}
        key = meta.get("uid") or meta.get("name")
        if not isinstance(key, str) or key in self.done:
            return
        rec = self.pending.get(key)
        if rec is None:
            rec = self.pending[key] = [now, -1.0]
            self.seen += 1
        if rec[1] < 0 and (pod.get("spec") or {}).get("nodeName"):
            self._bind(rec, now)
        if (pod.get("status") or {}).get("phase") == "Running":
            if rec[1] < 0:
                self._bind(rec, now)
            created, bound = rec
            self.c2b.append(bound - created)
            self.b2r.append(now - bound)
            self.c2r.append(now - created)
            del self.pending[key]
            self.done.add(key)
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


def _rss_now_mib() -> float:
    """The process's current resident set (MiB); the peak where /proc is not there."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return _usage()[1]


def _metric_total(name: str, keep: Callable[[str], bool] = lambda _labels: True) -> float:
    """The sum of a registered counter's samples whose label text `keep` accepts (0 if none)."""
    family = REGISTRY.get(name)
    if family is None:
        return 0.0
    total = 0.0
    for line in family.render().splitlines():
        if line.startswith(name) and not line.startswith("#"):
            labels, _, value = line.rpartition(" ")
            if keep(labels):
                total += float(value)
    return total


def _server_errors() -> float:
    """HTTP answers with a 5xx code so far (`apiserver_request_total`)."""
    return _metric_total("apiserver_request_total", lambda labels: 'code="5' in labels)


def _controller_errors() -> float:
    return _metric_total("controller_runtime_reconcile_errors_total")


async def _nodes_not_ready(admin: InProcessClient) -> int:
    """Nodes whose Ready condition is not True, or that carry a taint the node lifecycle
    controller puts on nodes whose Lease expired."""
    listed = await admin.list(NODES)
    bad = 0
    for node in listed.get("items") or []:
        conds = (node.get("status") or {}).get("conditions") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)
        taints = (node.get("spec") or {}).get("taints") or []
        if not ready or any(t.get("key") in _LEASE_TAINTS for t in taints):
            bad += 1
    return bad


def _run_only(before: SimStatistics, after: SimStatistics) -> dict[str, int]:
    """The Lease figures of the run alone (not registration, nor the idle window)."""
    return {
        "run_lease_renewals": after.lease_renewals - before.lease_renewals,
        "run_lease_late": after.lease_late - before.lease_late,
        "run_lease_lost": after.lease_lost - before.lease_lost,
    }


async def run_bench(
    nodes: int,
    pods: int,
    deployments: int | None = None,
    *,
    progress: TextIO | None = None,
    data_dir: Path | None = None,
    give_up_after: float | None = None,
    nodes_over_http: bool = False,
    idle_seconds: float = 0.0,
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
            api=ApiOptions(root, "127.0.0.1:0", tls=nodes_over_http, cluster_token="bench"),
            # a podCIDR (/24) for each of up to 32,768 nodes, as a site this size would set
            network=NetworkSettings.create(cluster_cidr=BENCH_CLUSTER_CIDR),
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
            empty_rss = _rss_now_mib()
            per_node = max(110, -(-pods // nodes) + 10)  # room for every pod, whatever N
            node_opts: dict[str, Any] = {"cpu": "32", "memory": "256Gi", "pods": per_node}
            cluster: SimulatedCluster | None = None
            remote: HttpNodes | None = None
            if nodes_over_http:
                remote = await start_http_nodes(
                    nursery, server.api, nodes, prefix="sim-", node_options=node_opts
                )
            else:
                cluster = SimulatedCluster(api, nodes, prefix="sim-", **node_opts)
                await nursery.start(cluster.run)
            observer = _Observer()
            observer.expected = pods
            await observer.attach(server)
            server_lag = WakeLag()  # is the server's loop what makes renewals late?
            await nursery.start(server_lag.run)
            idle_rate = 0.0  # CPU seconds per second of the idle cluster (see the module doc)
            if idle_seconds > 0:
                await trio.sleep(IDLE_SETTLE)
                idle_cpu0, idle_t0 = _usage()[0], trio.current_time()
                await trio.sleep(idle_seconds)
                idle_rate = (_usage()[0] - idle_cpu0) / (trio.current_time() - idle_t0)
            errors0, controller_errors0 = _server_errors(), _controller_errors()
            baseline_rss = _rss_now_mib()
            if remote is not None:
                stats0 = (await remote.stats())[0]
            else:
                assert cluster is not None
                stats0 = cluster.statistics()
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
                tty = progress is not None and progress.isatty()
                head, tail = ("\r", "") if tty else ("", "\n")  # rewrite the line, or log lines
                while progress is not None:
                    elapsed = trio.current_time() - start
                    progress.write(
                        f"{head}{elapsed:7.1f}s  created {observer.seen:>6}  "
                        f"bound {observer.bound:>6}  running {observer.running:>6}/{pods}  "
                        f"({observer.running / max(elapsed, 1e-9):7.1f} pods/s)  "
                        f"RSS {_rss_now_mib():7.1f} MiB {tail}"
                    )
                    progress.flush()
                    await trio.sleep(0.5 if tty else 10.0)

            run_peak = baseline_rss

            async def sample_rss() -> None:  # ru_maxrss may be a start-up peak: sample the run
                nonlocal run_peak
                while True:
                    run_peak = max(run_peak, _rss_now_mib())
                    await trio.sleep(RSS_SAMPLE_INTERVAL)

            nursery.start_soon(report)
            nursery.start_soon(sample_rss)
            with trio.fail_after(give_up_after or float("inf")):
                async with trio.open_nursery() as creators:
                    for _ in range(min(CREATE_PARALLELISM, workloads)):
                        creators.start_soon(creator)
                await observer.all_running.wait()
            end = trio.current_time()
            cpu1, rss = _usage()
            run_peak = max(run_peak, _rss_now_mib())
            if progress is not None:
                progress.write("\n")
                progress.flush()
            sched = next(
                (c for c in (server.controllers.controllers if server.controllers else [])
                 if isinstance(c, Scheduler)),
                None,
            )  # fmt: skip
            nodes_lag: dict[str, Any] | None = None
            nodes_cpu: float | None = None
            if remote is not None:
                stats, nodes_cpu, nodes_lag = await remote.stop()
            else:
                assert cluster is not None
                stats = cluster.statistics()
            extra: dict[str, Any] = {
                "transport": "http" if nodes_over_http else "in-process",
                "empty_server_rss_mib": round(empty_rss, 1),
                "baseline_rss_mib": round(baseline_rss, 1),
                "run_peak_rss_mib": round(run_peak, 1),
                "rss_per_pod_kib": round((run_peak - baseline_rss) * 1024 / pods, 2),
                "cpu_ms_per_pod": round((cpu1 - cpu0) * 1000 / pods, 3),
                "idle_cpu_per_second": round(idle_rate, 4) if idle_seconds > 0 else None,
                "cpu_ms_per_pod_net": round(
                    (cpu1 - cpu0 - idle_rate * (end - start)) * 1000 / pods, 3
                )
                if idle_seconds > 0
                else None,
                "observer_kib": round(observer.nbytes() / 1024, 1),
                "nodes_cpu_seconds": nodes_cpu,
                "sim_started": stats.started,
                "sim_errors": stats.errors,
                "http_5xx": int(_server_errors() - errors0),
                "sim_5xx": stats.server_errors,
                "sim_no_answer": stats.connection_errors,
                "controller_errors": int(_controller_errors() - controller_errors0),
                "lease_renewals": stats.lease_renewals,
                "lease_failures": stats.lease_failures,
                "lease_late": stats.lease_late,
                "lease_lost": stats.lease_lost,
                "lease_max_delay": round(stats.lease_max_delay, 3),
                **_run_only(stats0, stats),
                "server_loop_lag": server_lag.summary(),
                "nodes_loop_lag": nodes_lag,
                "nodes_not_ready": await _nodes_not_ready(admin),
                "scheduler_bind_errors": sched.statistics().bind_errors if sched else None,
                "scheduler_attempts": sched.statistics().attempts if sched else None,
            }
            nursery.cancel_scope.cancel()
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
        create_to_bound_p50=round(_percentile(observer.c2b, 0.5), 3),
        create_to_bound_p99=round(_percentile(observer.c2b, 0.99), 3),
        bound_to_running_p50=round(_percentile(observer.b2r, 0.5), 3),
        bound_to_running_p99=round(_percentile(observer.b2r, 0.99), 3),
        create_to_running_p50=round(_percentile(observer.c2r, 0.5), 3),
        create_to_running_p99=round(_percentile(observer.c2r, 0.99), 3),
        peak_rss_mib=round(rss, 1),
        cpu_seconds=round(cpu1 - cpu0, 2),
        extra=extra,
    )


def _lag_text(lag: dict[str, Any]) -> str:
    return (f"mean {lag['mean'] * 1000:.0f} ms, max {lag['max']:.2f} s, over 0.1 s "
            f"{lag['over_0.1s']:.1%} of the time, over 1 s {lag['over_1s']:.1%}")  # fmt: skip


def add_parser(sub: Any) -> None:
    """Add `bench reconcile` to the `orchestrator` subparsers."""
    bench = sub.add_parser("bench", help="built-in whole-system benchmarks")
    bs = bench.add_subparsers(dest="bench_command", required=True)
    rec = bs.add_parser(
        "reconcile",
        help="time pods from workload creation to Running on simulated nodes (in process)",
    )
    rec.add_argument(
        "--nodes", type=int, default=None, help="simulated nodes (default 100; with --scales, "
        "one per 100 pods at each scale)"
    )  # fmt: skip
    rec.add_argument("--pods", type=int, default=10_000, help="pods in all (default 10000)")
    rec.add_argument(
        "--deployments", type=int, default=None, help="workloads to spread the pods over "
        "(default: one per 100 pods)"
    )  # fmt: skip
    rec.add_argument("--timeout", type=float, default=None, help="give up after this long (s)")
    rec.add_argument("--json", action="store_true", help="print a last JSON line of results")
    rec.add_argument(
        "--nodes-over-http", action="store_true", help="run the simulated nodes in a process of "
        "their own, each over loopback HTTPS with its own node token, as real agents"
    )  # fmt: skip
    rec.add_argument(
        "--idle-seconds", type=float, default=IDLE_SECONDS, help="measure the idle cluster's "
        f"CPU for this long before the workload, for a CPU per pod net of it (default "
        f"{IDLE_SECONDS:g}; 0: skip)"
    )  # fmt: skip
    rec.add_argument(
        "--scales", default=None, metavar="PODS,PODS,...", help="run each pod count in a fresh "
        "process (e.g. 1000,10000,100000) and print one table (with --json: one JSON line each)"
    )  # fmt: skip


def main(args: argparse.Namespace) -> int:
    if args.scales is not None:
        from orchestrator.bench.scales import run_scales  # a driver of this module's main

        return run_scales(args)
    nodes = 100 if args.nodes is None else args.nodes
    if nodes < 1 or args.pods < 1:
        print("error: --nodes and --pods must be at least 1", file=sys.stderr)
        return 2
    try:
        result = trio.run(
            lambda: run_bench(
                nodes,
                args.pods,
                args.deployments,
                progress=sys.stderr,
                give_up_after=args.timeout,
                nodes_over_http=args.nodes_over_http,
                idle_seconds=args.idle_seconds,
            )
        )
    except trio.TooSlowError:
        print(f"error: not all pods were Running within {args.timeout} s", file=sys.stderr)
        return 1
    d = result.as_dict()
    x = result.extra
    rows = [
        ("nodes / pods / workloads", f"{result.nodes} / {result.pods} / {result.workloads} "
         f"{result.workload_kind}s ({x['transport']})"),
        ("wall time", f"{result.seconds:.2f} s"),
        ("pods/s end to end", f"{result.pods_per_second:.1f}"),
        ("scheduler binds/s", f"{result.binds_per_second:.1f}"),
        ("create→bound p50/p99", f"{result.create_to_bound_p50:.3f} / "
         f"{result.create_to_bound_p99:.3f} s"),
        ("bound→Running p50/p99", f"{result.bound_to_running_p50:.3f} / "
         f"{result.bound_to_running_p99:.3f} s"),
        ("create→Running p50/p99", f"{result.create_to_running_p50:.3f} / "
         f"{result.create_to_running_p99:.3f} s"),
        ("peak RSS", f"{x['run_peak_rss_mib']:.1f} MiB during the run, "
         f"{result.peak_rss_mib:.1f} ever (empty server {x['empty_server_rss_mib']:.1f}, "
         f"with nodes {x['baseline_rss_mib']:.1f})"),
        ("RSS per pod", f"{x['rss_per_pod_kib']:.2f} KiB (observer {x['observer_kib']:.0f} KiB)"),
        ("CPU", f"{result.cpu_seconds:.2f} s, {x['cpu_ms_per_pod']:.3f} ms per pod"
         + (f" (nodes' process {x['nodes_cpu_seconds']:.2f} s)"
            if x["nodes_cpu_seconds"] is not None else "")),
        ("CPU net of the idle cluster", "not measured (--idle-seconds 0)"
         if x["cpu_ms_per_pod_net"] is None else f"{x['cpu_ms_per_pod_net']:.3f} ms per pod "
         f"(idle: {x['idle_cpu_per_second'] * 1000:.0f} ms of CPU per second)"),
        ("5xx (HTTP / nodes' writes)", f"{x['http_5xx']} / {x['sim_5xx']} (nodes' requests "
         f"without an answer: {x['sim_no_answer']})"),
        ("controller errors", f"{x['controller_errors']}"),
        ("Lease renewals", f"{x['lease_renewals']}: failed {x['lease_failures']}, late "
         f"{x['lease_late']}, lapsed {x['lease_lost']}, max delay {x['lease_max_delay']:.2f} s"),
        ("  of which in the run", f"{x['run_lease_renewals']}: late {x['run_lease_late']}, "
         f"lapsed {x['run_lease_lost']}"),
        ("event loop lag (server)", _lag_text(x["server_loop_lag"])),
        ("event loop lag (nodes)", "in the server's loop" if x["nodes_loop_lag"] is None
         else _lag_text(x["nodes_loop_lag"])),
        ("nodes not Ready", f"{x['nodes_not_ready']}"),
    ]  # fmt: skip
    for label, value in rows:
        print(f"{label:<26} {value}")
    if args.json:
        print(json.dumps({"bench": "reconcile", **d}, sort_keys=True))
    return 0
