"""Node agent benchmark on a real containerd: pod create -> Running latency, and the agent's
idle cost with pods running.

    python benches/agent_bench.py [--counts 1,10,50] [--networks host,pod] [--idle 30]
        [--baseline-idle 10] [--quick] [--keep-data]

Setup: a private containerd (`ContainerdInstance(network="auto")`: its own root, socket and CNI
bridge `orch<N>` with pods in 10.89.<N>.0/24, images `localhost/busybox:1` and `localhost/pause:1`
imported, so every image is present) and one `orchestrator server` process (tests/cluster.py:
Raft over SQLite with fsync, the API over HTTPS, controllers, and its embedded node agent on that
containerd, node `bench-node`). The driver waits for the Node to be Ready.

Rounds: for each network (`host`: `hostNetwork: true`; `pod`: the CNI bridge) and each count N,
the driver opens a pod watch (label `bench-round=<round>`, from the list's resourceVersion), then
creates N pods at once (one busybox `sleep 3600` container each, SIGTERM trapped,
`imagePullPolicy: IfNotPresent`, `spec.nodeName` set so no scheduling is measured) over one
HTTPS client. Latency of a pod = `time.time()` when its watch event first shows phase Running
with every container ready, minus `time.time()` just before its create request was sent (both on
this machine; creationTimestamp has one-second resolution). Reported: p50, p99, max and the
time until the last pod of the round was Running. Pods of a round are deleted (and their
disappearance awaited) before the next round, except the last round's.

Idle: with 0 pods (before the rounds, `--baseline-idle` s) and with the last round's pods
running (`--idle` s, by default 50 pods on the pod network), the server process's RSS
(`VmRSS`) and its CPU (user+sys from /proc/<pid>/stat over the window, as % of one core); the
agent is embedded in the server, so these figures include the API server, Raft and the
controllers (their idle cost is the 0-pod baseline). containerd's own CPU in the same window is
reported beside it (the agent's 1 s relist calls it); shims are not counted.

Output: a table, then one JSON line `{"bench": "agent", "rounds": [...], "idle": [...], ...}`.
A measurement: nothing is asserted, but a pod that never gets Running within `--timeout` is an
error (exit 1).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # for benchlib, which puts the repo and tests/ on sys.path

from benchlib import cluster_lib, percentile  # noqa: E402  (path set above)
from e2e.kubectlrun import wait_api_ready  # noqa: E402  (tests/ on the path)

from orchestrator.client.config import load_kubeconfig  # noqa: E402
from orchestrator.client.resource import NODES, PODS  # noqa: E402
from orchestrator.client.rest import RestClient  # noqa: E402
from orchestrator.controllers.runtime import HttpClient  # noqa: E402
from orchestrator.kube.errors import ApiError  # noqa: E402
from orchestrator.testing.containerd import (  # noqa: E402
    ContainerdError,
    ContainerdInstance,
    missing_prerequisites,
)

Obj = dict[str, Any]
NODE = "bench-node"
NAMESPACE = "default"
IMAGE = "localhost/busybox:1"
# PID 1 of a container ignores SIGTERM unless it handles it: trap it so deletes take no grace
SLEEPER = "trap 'exit 0' TERM; sleep 3600 & wait"


# ---------------------------------------------------------------------------------- /proc
def process_cpu(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_rss(pid: int) -> int:
    """Resident set size of process `pid` in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


async def idle_window(server_pid: int, containerd_pid: int | None, seconds: float) -> Obj:
    """CPU and RSS of the server (and containerd's CPU) over `seconds` of doing nothing."""
    s0, c0, t0 = process_cpu(server_pid), _cpu_or_zero(containerd_pid), time.monotonic()
    rss_max = process_rss(server_pid)
    end = t0 + seconds
    while time.monotonic() < end:
        await trio.sleep(min(1.0, max(0.0, end - time.monotonic())))
        rss_max = max(rss_max, process_rss(server_pid))
    wall = time.monotonic() - t0
    return {
        "seconds": round(wall, 1),
        "rss_mib": round(process_rss(server_pid) / 2**20, 1),
        "rss_max_mib": round(rss_max / 2**20, 1),
        "cpu_percent": round(100 * (process_cpu(server_pid) - s0) / wall, 2),
        "containerd_cpu_percent": round(100 * (_cpu_or_zero(containerd_pid) - c0) / wall, 2),
    }


def _cpu_or_zero(pid: int | None) -> float:
    try:
        return process_cpu(pid) if pid else 0.0
    except OSError:
        return 0.0


# ---------------------------------------------------------------------------------- pods
def bench_pod(name: str, round_id: str, host_network: bool) -> Obj:
    spec: Obj = {
        "nodeName": NODE,
        "terminationGracePeriodSeconds": 2,
        "containers": [
            {
                "name": "app",
                "image": IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", SLEEPER],
            }
        ],
    }
    if host_network:
        spec["hostNetwork"] = True
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"bench-round": round_id}},
        "spec": spec,
    }


def running_and_ready(pod: Obj) -> bool:
    status = pod.get("status") or {}
    statuses = status.get("containerStatuses") or []
    return (
        status.get("phase") == "Running"
        and bool(statuses)
        and all(cs.get("ready") for cs in statuses)
    )


async def run_round(
    client: HttpClient, round_id: str, count: int, host_network: bool, within: float
) -> Obj:
    """Create `count` pods at once; watch them until each is Running and ready."""
    selector = f"bench-round={round_id}"
    listed = await client.list(PODS, NAMESPACE, label_selector=selector)
    rv = str(listed["metadata"]["resourceVersion"])
    names = [f"{round_id}-{i}" for i in range(count)]
    sent: dict[str, float] = {}
    running: dict[str, float] = {}
    errors: list[str] = []

    async def create(name: str) -> None:
        sent[name] = time.time()
        try:
            await client.create(PODS, bench_pod(name, round_id, host_network), NAMESPACE)
        except ApiError as exc:
            errors.append(f"create {name}: {exc}")

    with trio.move_on_after(within):
        async with (
            client.watch(PODS, NAMESPACE, resource_version=rv, label_selector=selector) as events,
            trio.open_nursery() as nursery,
        ):
            for name in names:
                nursery.start_soon(create, name)
            async for _etype, obj in events:
                name = str(obj["metadata"]["name"])
                if name not in running and running_and_ready(obj):
                    running[name] = time.time()
                    if len(running) == count:
                        break
    latencies = sorted(running[n] - sent[n] for n in running)
    missing = sorted(set(names) - set(running))
    if missing:
        errors.append(f"{len(missing)} pods not Running within {within:g} s: {missing[:5]}")
    return {
        "network": "host" if host_network else "pod",
        "pods": count,
        "running": len(running),
        "p50_s": round(percentile(latencies, 0.5), 3),
        "p99_s": round(percentile(latencies, 0.99), 3),
        "max_s": round(latencies[-1], 3) if latencies else float("nan"),
        "all_running_s": round(max(running.values()) - min(sent.values()), 3)
        if running
        else float("nan"),
        "errors": errors,
    }


async def delete_round(client: HttpClient, round_id: str, within: float) -> float:
    """Delete the round's pods and wait until the API has none left; seconds taken."""
    selector = f"bench-round={round_id}"
    t0 = time.monotonic()
    listed = await client.list(PODS, NAMESPACE, label_selector=selector)
    async with trio.open_nursery() as nursery:
        for pod in listed.get("items") or []:
            nursery.start_soon(_delete_quietly, client, str(pod["metadata"]["name"]))
    with trio.fail_after(within):
        while (await client.list(PODS, NAMESPACE, label_selector=selector))["items"]:  # noqa: ASYNC110  (polling the server)
            await trio.sleep(0.2)
    return time.monotonic() - t0


async def _delete_quietly(client: HttpClient, name: str) -> None:
    try:
        await client.delete(PODS, name, NAMESPACE)
    except ApiError as exc:
        if exc.code != 404:
            raise


async def wait_node_ready(client: HttpClient, within: float) -> None:
    with trio.fail_after(within):
        while True:
            try:
                node = await client.get(NODES, NODE)
                conds = (node.get("status") or {}).get("conditions") or []
                if any(c["type"] == "Ready" and c["status"] == "True" for c in conds):
                    return
            except ApiError:
                pass
            await trio.sleep(0.2)


# ---------------------------------------------------------------------------------- driver
async def drive(args: argparse.Namespace, kubeconfig: Path, pids: tuple[int, int | None]) -> Obj:
    server_pid, containerd_pid = pids
    cfg = load_kubeconfig(kubeconfig)
    result: Obj = {"bench": "agent", "node": NODE, "rounds": [], "idle": []}
    async with RestClient(cfg, user_agent="agent-bench") as rest:
        client = HttpClient(rest)
        await wait_node_ready(client, 60)
        if args.baseline_idle > 0:
            result["idle"].append(
                {"pods": 0, **await idle_window(server_pid, containerd_pid, args.baseline_idle)}
            )
        plan = [(net, n) for net in args.networks for n in args.counts]
        for index, (net, count) in enumerate(plan):
            round_id = f"r{index}-{net}-{count}"
            r = await run_round(client, round_id, count, net == "host", args.timeout)
            result["rounds"].append(r)
            print_round(r)
            if index < len(plan) - 1:
                r["delete_s"] = round(await delete_round(client, round_id, args.timeout), 3)
            else:
                idle = await idle_window(server_pid, containerd_pid, args.idle)
                result["idle"].append({"pods": r["running"], "network": net, **idle})
                await delete_round(client, round_id, args.timeout)
    return result


def print_round(r: Obj) -> None:
    print(
        f"  {r['network']:<5} {r['pods']:>4} pods  running {r['running']:>4}  "
        f"p50 {r['p50_s']:>6.3f} s  p99 {r['p99_s']:>6.3f} s  max {r['max_s']:>6.3f} s  "
        f"all {r['all_running_s']:>6.3f} s" + (f"  ERRORS {r['errors']}" if r["errors"] else ""),
        flush=True,
    )


def print_table(result: Obj) -> None:
    print("\ncreate -> Running (watch), image present")
    print(f"  {'net':<5} {'pods':>5} {'p50 s':>8} {'p99 s':>8} {'max s':>8} {'all s':>8}")
    for r in result["rounds"]:
        print(
            f"  {r['network']:<5} {r['pods']:>5} {r['p50_s']:>8.3f} {r['p99_s']:>8.3f} "
            f"{r['max_s']:>8.3f} {r['all_running_s']:>8.3f}"
        )
    print("idle (server process with the embedded agent)")
    print(f"  {'pods':>5} {'secs':>6} {'RSS MiB':>8} {'CPU %':>7} {'containerd CPU %':>17}")
    for i in result["idle"]:
        print(
            f"  {i['pods']:>5} {i['seconds']:>6.1f} {i['rss_mib']:>8.1f} {i['cpu_percent']:>7.2f} "
            f"{i['containerd_cpu_percent']:>17.2f}"
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--counts", default="1,10,50", help="pods created at once, per round")
    p.add_argument("--networks", default="host,pod", help="host and/or pod")
    p.add_argument("--idle", type=float, default=30.0, help="idle window with pods, seconds")
    p.add_argument("--baseline-idle", type=float, default=10.0, help="idle window, no pods")
    p.add_argument("--timeout", type=float, default=120.0, help="per round, seconds")
    p.add_argument("--quick", action="store_true", help="1 and 3 pods, 3 s idle (smoke test)")
    p.add_argument("--keep-data", action="store_true", help="keep the data directories")
    args = p.parse_args(argv)
    if args.quick:
        args.counts, args.idle, args.baseline_idle, args.timeout = "1,3", 3.0, 1.0, 30.0
    args.counts = [int(x) for x in str(args.counts).split(",") if x]
    args.networks = [x for x in str(args.networks).split(",") if x]
    if not args.counts or any(n < 1 for n in args.counts):
        p.error("--counts: positive integers, e.g. 1,10,50")
    if not args.networks or set(args.networks) - {"host", "pod"}:
        p.error("--networks: host, pod or host,pod")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    problems = missing_prerequisites()
    if problems:
        print(f"containerd unavailable: {'; '.join(problems)}", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="orch-agent-bench-"))  # short: unix socket paths
    instance = ContainerdInstance(root / "ctd", network="auto")
    try:
        instance.start()
    except ContainerdError as exc:
        print(f"containerd unavailable: {exc}", file=sys.stderr)
        return 2
    result: Obj = {}
    failed = False
    try:
        print(f"containerd {instance.socket} (pod network {instance.subnet})", flush=True)
        extra = [
            "--runtime",
            "containerd",
            "--containerd-socket",
            str(instance.socket),
            "--node-name",
            NODE,
        ]
        with cluster_lib.Cluster(
            root / "cluster", size=1, agent=True, extra_args=extra, log_level="warning"
        ) as cluster:
            cluster.start()
            wait_api_ready(cluster, 0, within=60)
            pid = cluster.pid(0)
            assert pid is not None
            try:
                result = trio.run(drive, args, cluster.servers[0].kubeconfig, (pid, instance.pid))
            except BaseException:
                cluster.dump_logs(sys.stderr, lines=60)
                raise
    finally:
        instance.stop()
        if not args.keep_data:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"data kept in {root}", file=sys.stderr)
    print_table(result)
    failed = any(r["errors"] for r in result["rounds"])
    result["ok"] = not failed
    print(json.dumps(result))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
