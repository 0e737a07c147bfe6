"""Scheduler core benchmark: pods scheduled per second through the pure core, no I/O.

    python benches/scheduler_bench.py [--nodes 100] [--pods 10000] [--deployments 100]
        [--seed 1] [--repeat 3] [--quick]

Builds `--nodes` nodes (three zones, a few tainted, a few with PreferNoSchedule taints, the
usual allocatable of a 32-core 128 GiB machine, 110 pods) and `--pods` pending pods stamped out
of `--deployments` templates (varied cpu/memory requests; some with a zone nodeSelector, some
with preferred node affinity, some tolerating the taints, each replica owned by its Deployment's
ReplicaSet so spreading has work to do). Then it runs the whole loop a driver would, minus the
API calls: `queue.add` every pod, then `queue.pop` → `schedule_one` → `cache.assume` → the bound
pod coming back through the watch (`cache.add_pod` with `spec.nodeName` set) → `queue.done`,
until the queue is empty. A pod nothing fits goes to `add_unschedulable`.

Output: one line per repetition (pods/s, µs per pod, pods placed, unschedulable), the best and
median, then one JSON line with every figure. A measurement, not a test: nothing is asserted,
but the script checks afterwards that no node ended up overcommitted.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.scheduler import (
    SchedulerCache,
    SchedulingQueue,
    schedule_one,
)

ZONES = ("zone-a", "zone-b", "zone-c")


def make_nodes(count: int) -> list[dict[str, Any]]:
    nodes = []
    for i in range(count):
        taints = []
        if i % 25 == 0:
            taints.append({"key": "dedicated", "value": "edge-gpu", "effect": "NoSchedule"})
        if i % 10 == 3:
            taints.append({"key": "flaky", "value": "yes", "effect": "PreferNoSchedule"})
        nodes.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": f"node-{i:04d}",
                    "uid": f"node-uid-{i}",
                    "labels": {
                        "kubernetes.io/hostname": f"node-{i:04d}",
                        "topology.kubernetes.io/zone": ZONES[i % len(ZONES)],
                        "disk": "ssd" if i % 2 else "hdd",
                    },
                },
                "spec": {"taints": taints} if taints else {},
                "status": {
                    "allocatable": {"cpu": "32", "memory": "128Gi", "pods": "110"},
                    "capacity": {"cpu": "32", "memory": "128Gi", "pods": "110"},
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            }
        )
    return nodes


def make_template(d: int, rng: random.Random) -> dict[str, Any]:
    cpu = rng.choice(["50m", "100m", "150m", "200m", "250m"])
    memory = rng.choice(["64Mi", "128Mi", "256Mi", "512Mi"])
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "app",
                "image": f"registry.local/app-{d}:1.0",
                "resources": {"requests": {"cpu": cpu, "memory": memory}},
                "ports": [{"containerPort": 8080}],
            }
        ],
        "schedulerName": "default-scheduler",
        "priority": 0,
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}
        ],
    }
    if d % 5 == 1:
        spec["nodeSelector"] = {"topology.kubernetes.io/zone": ZONES[d % len(ZONES)]}
    if d % 4 == 2:
        spec["affinity"] = {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 10,
                        "preference": {
                            "matchExpressions": [
                                {"key": "disk", "operator": "In", "values": ["ssd"]}
                            ]
                        },
                    }
                ]
            }
        }
    if d % 10 == 7:
        spec["tolerations"].append(
            {"key": "dedicated", "operator": "Equal", "value": "edge-gpu", "effect": "NoSchedule"}
        )
    return spec


def make_pods(count: int, deployments: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    templates = [make_template(d, rng) for d in range(deployments)]
    pods = []
    for i in range(count):
        d = i % deployments
        pods.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"app-{d}-{i:06d}",
                    "namespace": "bench",
                    "uid": f"pod-uid-{i}",
                    "labels": {"app": f"app-{d}"},
                    "ownerReferences": [
                        {
                            "apiVersion": "apps/v1",
                            "kind": "ReplicaSet",
                            "name": f"app-{d}-rs",
                            "uid": f"rs-uid-{d}",
                            "controller": True,
                        }
                    ],
                },
                "spec": templates[d],
                "status": {"phase": "Pending"},
            }
        )
    return pods


def run_once(
    nodes: list[dict[str, Any]], pods: list[dict[str, Any]], seed: int
) -> dict[str, float]:
    cache = SchedulerCache()
    queue = SchedulingQueue()
    rng = random.Random(seed)
    for node in nodes:
        cache.add_node(node)
    now = 0.0
    placed = unschedulable = 0
    start = time.perf_counter()
    for new in pods:
        queue.add(new, now)
    while (pod := queue.pop(now)) is not None:
        decision = schedule_one(pod, cache, rng, now)
        if decision.node is None:
            queue.add_unschedulable(pod, now)
            unschedulable += 1
            continue
        cache.assume(decision.pod or pod, decision.node, now)
        bound = {**pod, "spec": {**pod["spec"], "nodeName": decision.node}}
        cache.add_pod(bound)  # the watch shows the binding: confirms the assumption
        queue.done(pod)
        placed += 1
    elapsed = time.perf_counter() - start
    for info in cache.nodes():
        assert info.cpu <= info.alloc_cpu, f"{info.name} overcommitted on cpu"
        assert info.memory <= info.alloc_memory, f"{info.name} overcommitted on memory"
        assert info.pod_count <= info.alloc_pods, f"{info.name} has too many pods"
    assert cache.statistics().assumed == 0
    return {
        "seconds": elapsed,
        "pods_per_s": len(pods) / elapsed,
        "us_per_pod": elapsed / len(pods) * 1e6,
        "placed": placed,
        "unschedulable": unschedulable,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--deployments", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1,000 pods, one repetition")
    args = parser.parse_args()
    if args.quick:
        args.pods, args.repeat = 1000, 1
    nodes = make_nodes(args.nodes)
    pods = make_pods(args.pods, args.deployments, args.seed)
    runs = []
    for i in range(args.repeat):
        result = run_once(nodes, pods, args.seed)
        runs.append(result)
        print(
            f"run {i + 1}: {result['pods_per_s']:9.0f} pods/s  {result['us_per_pod']:6.1f} µs/pod"
            f"  placed {result['placed']:.0f}  unschedulable {result['unschedulable']:.0f}",
            flush=True,
        )
    rates = [r["pods_per_s"] for r in runs]
    best, median = max(rates), statistics.median(rates)
    print(f"{args.pods} pods on {args.nodes} nodes: best {best:.0f} pods/s, median {median:.0f}")
    summary = {
        "bench": "scheduler",
        "nodes": args.nodes,
        "pods": args.pods,
        "deployments": args.deployments,
        "best_pods_per_s": round(best),
        "median_pods_per_s": round(median),
        "runs": runs,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
