"""Edge footprint benchmark: start time, memory and CPU of the product's processes, and leader
failover time of a three-server site.

    python benches/footprint.py [--quick] [--runs 3] [--idle 30] [--pods 1000]
        [--failover-rounds 5] [--no-containerd] [--no-failover] [--keep-data] [--only failover]

What is measured (every process is a real `python -m orchestrator ...` on loopback, started the
way a user starts it, so interpreter start-up and imports are included):

* **Cold start to READY** of the all-in-one server (`orchestrator server`, fresh data dir: new
  CA, certificates, tokens, a one-server Raft cluster, the API, the controllers and the
  embedded node agent), `--runtime auto`: once with no containerd socket (so the simulated
  runtime, as on this machine by default), once with a private containerd
  (`orchestrator.testing.containerd.ContainerdInstance(network="auto")`, through
  `--containerd-socket`;
  skipped unless root with containerd installed, or with `--no-containerd`). "READY" is the
  server's sd_notify `READY=1` (the driver listens on its own `NOTIFY_SOCKET`), measured from
  just before the process is spawned; beside it the time to the first successful authenticated
  API request (`GET /api/v1/namespaces/default` with the admin token of the kubeconfig the server
  wrote). Median of `--runs`.
* **Idle** RSS (`VmRSS`, at the end of the window; in MiB and in MB = 10^6 bytes) and CPU
  (user+sys over the window, % of one core) of that all-in-one process (simulated runtime, its
  own Node, no pods), over `--idle` seconds after a settle time.
* **RSS with `--pods` pods**: a Deployment with that many replicas, its template bound to the
  server's own node (`nodeName`, so the 110-pod capacity the scheduler enforces does not cap
  it), all Running on the simulated runtime; then RSS and CPU over a short window. The process
  holds the store, the API's caches, the controllers' informers and one agent worker per pod.
  The bench polls the pod list once a second meanwhile; a failed list (an error status, a
  timeout, a dropped connection) is counted, not fatal, and so are the server log's lines a
  load must not cause (`no quorum`, failed Lease renewals, ERRORs): both are reported.
* **Agent only**: an `orchestrator agent --runtime simulated` process joined (K10 token) to a
  separate server without an agent, idle with its Node Ready: its RSS and CPU.
* **Leader failover** in a three-server site (production Raft timing: 100 ms tick, 10-tick
  election timeout): SIGKILL the leader, then start a ConfigMap create through another
  server's API every 20 ms (overlapping attempts, each with its own name) until one succeeds;
  the failover time is from just before the kill to the first success. The killed server is
  restarted and caught up between rounds; median and max of `--failover-rounds`.

Goals (from the issue): start to READY < 1 s, idle RSS of the all-in-one process < 60 MB
(10^6 bytes: 57.2 MiB), failover < 1.5 s. They are reported as met or not, never asserted.
Output: a table, then one JSON line `{"bench": "footprint", ...}`; exit 1 only if a measurement
could not be made. The children inherit the bench's environment (plus `PYTHONUNBUFFERED` and
`PYTHONPATH`); the variables of it that change memory use (`MEMORY_ENV`) are recorded in the
JSON line as `env` — the bench sets none of them.
`--quick` (the smoke test): one run, short windows, 50 pods, one failover round, no containerd.
`--only failover` measures the failover alone (with the rounds' distribution); `--no-failover`
skips it (the three-server site).
"""

from __future__ import annotations

import argparse
import base64
import itertools
import json
import os
import platform
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import trio
import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # for benchlib, which puts the repo and tests/ on sys.path

from benchlib import ROOT, cluster_lib  # noqa: E402  (path set above)

Obj = dict[str, Any]
T = TypeVar("T")
GOALS = {"start_ready_s": 1.0, "idle_rss_mb": 60.0, "failover_s": 1.5}
MIB_PER_MB = 10**6 / 2**20  # 60 MB = 57.2 MiB
# Inherited variables that change a Python process's memory use (recorded, never set here).
MEMORY_ENV = (
    "MALLOC_ARENA_MAX",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_MMAP_THRESHOLD_",
    "PYTHONMALLOC",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONOPTIMIZE",
    "PYTHONNODEBUGRANGES",
    "LD_PRELOAD",
)
NODE = "footprint"
NS_PATH = "/api/v1/namespaces/default"


class BenchError(Exception):
    """A measurement could not be made (a process died, something never became ready)."""


# ---------------------------------------------------------------------------------- /proc
def rss_mib(pid: int) -> float:
    """Resident set size of process `pid` in MiB (`VmRSS`)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise BenchError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def observe(pid: int, window: float) -> Obj:
    """RSS (at the end and the peak of 1 s samples) and CPU % of one core over `window` s."""
    c0, t0 = cpu_seconds(pid), time.monotonic()
    peak = rss_mib(pid)
    while time.monotonic() - t0 < window:
        time.sleep(min(1.0, max(0.0, window - (time.monotonic() - t0))))
        peak = max(peak, rss_mib(pid))
    c1, t1 = cpu_seconds(pid), time.monotonic()
    rss = rss_mib(pid)
    return {
        "rss_mib": round(rss, 1),
        "rss_mb": round(rss / MIB_PER_MB, 1),
        "rss_peak_mib": round(peak, 1),
        "cpu_pct": round(100 * (c1 - c0) / (t1 - t0), 2),
        "window_s": round(t1 - t0, 1),
    }


def wait_for(fn: Callable[[], T | None], what: str, within: float, every: float = 0.05) -> T:
    deadline = time.monotonic() + within
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise BenchError(f"timed out after {within:.0f} s waiting for {what}")
        time.sleep(every)


# ---------------------------------------------------------------------------------- processes
def child_env(notify_socket: str | None = None) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("NOTIFY_SOCKET", None)
    if notify_socket:
        env["NOTIFY_SOCKET"] = notify_socket
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


class Proc:
    """One `python -m orchestrator ...` child with its log file."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str]) -> None:
        self.log = log
        with open(log, "ab") as f:
            self.popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=f,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                env=env,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def check(self) -> None:
        if self.popen.poll() is not None:
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])
            raise BenchError(f"process exited with {self.popen.returncode}:\n{tail}")

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


# A bench never changes the host's network: no pod network, node proxy or cluster DNS address
# on the host for the embedded agent on containerd (its node DNS answers on loopback).
HOST_NET_OFF = ("--flannel-backend", "none", "--disable-proxy", "--dns-listen", "127.0.0.1:0")


def server_argv(data_dir: Path, *extra: str) -> list[str]:
    peer, client, api = cluster_lib.free_ports(3)
    return [
        sys.executable,
        "-m",
        "orchestrator",
        "--log-level",
        "warning",
        "--log-format",
        "text",
        "server",
        "--data-dir",
        str(data_dir),
        "--peer-listen",
        f"127.0.0.1:{peer}",
        "--client-listen",
        f"127.0.0.1:{client}",
        "--listen",
        f"127.0.0.1:{api}",
        "--kubelet-port",
        "0",
        *extra,
    ]


def admin_credentials(kubeconfig: Path) -> tuple[str, ssl.SSLContext, dict[str, str]]:
    """(API URL, TLS context trusting the cluster CA, admin bearer header) of a kubeconfig."""
    doc = yaml.safe_load(kubeconfig.read_text())
    cluster = doc["clusters"][0]["cluster"]
    ca = base64.b64decode(cluster["certificate-authority-data"]).decode()
    token = doc["users"][0]["user"]["token"]
    verify = ssl.create_default_context(cadata=ca)
    return str(cluster["server"]), verify, {"Authorization": f"Bearer {token}"}


def admin_client(kubeconfig: Path, timeout: float = 2.0) -> tuple[httpx.Client, str]:
    url, verify, headers = admin_credentials(kubeconfig)
    return httpx.Client(verify=verify, headers=headers, timeout=timeout), url


def api_ok(kubeconfig: Path) -> bool:
    """One authenticated request succeeds (False while the kubeconfig or the API is missing)."""
    if not kubeconfig.exists():
        return False
    try:
        client, url = admin_client(kubeconfig, timeout=1.0)
        with client:
            return client.get(url + NS_PATH).status_code == 200
    except (httpx.HTTPError, OSError, yaml.YAMLError, KeyError, TypeError, ValueError):
        return False


# ---------------------------------------------------------------------------------- cold start
def cold_start(root: Path, *extra: str, keep: bool = False) -> tuple[Obj, Proc | None]:
    """Start an all-in-one server on a fresh data dir: seconds to READY=1 and to the first
    authenticated API request. With `keep` the process is returned running."""
    root.mkdir(parents=True, exist_ok=True)
    data = root / "data"
    notify_path = str(root / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(notify_path)
    sock.setblocking(False)
    # one node runs all the pods: a podCIDR of 4,094 addresses (a /24 holds 254)
    argv = server_argv(data, "--node-name", NODE, "--node-cidr-mask-size", "20", *extra)
    kubeconfig = data / "kubeconfig.yaml"
    t0 = time.monotonic()
    proc = Proc(argv, root / "server.log", child_env(notify_path))
    ready_at = api_at = None
    try:
        deadline = t0 + 60
        while ready_at is None or api_at is None:
            proc.check()
            if time.monotonic() > deadline:
                raise BenchError(f"no READY=1 / API within 60 s (log {proc.log})")
            try:
                while True:
                    msg = sock.recv(4096)
                    if ready_at is None and b"READY=1" in msg.split(b"\n"):
                        ready_at = time.monotonic() - t0
            except BlockingIOError:
                pass
            if api_at is None and api_ok(kubeconfig):
                api_at = time.monotonic() - t0
            time.sleep(0.005)
    except BaseException:
        proc.stop()
        raise
    finally:
        sock.close()
    result = {"ready_s": round(ready_at, 3), "api_s": round(api_at, 3)}
    if keep:
        return result, proc
    proc.stop()
    return result, None


def node_runtime_label(kubeconfig: Path) -> str:
    client, url = admin_client(kubeconfig)
    with client:

        def node() -> Obj | None:
            r = client.get(f"{url}/api/v1/nodes/{NODE}")
            return r.json() if r.status_code == 200 else None

        labels = wait_for(node, "the server's Node", 30, 0.1)["metadata"].get("labels") or {}
    return str(labels.get("orchestrator.dev/runtime", "containerd"))


def cold_starts(root: Path, runs: int, *extra: str) -> Obj:
    results = [cold_start(root / f"run{i}", *extra)[0] for i in range(runs)]
    return {
        "ready_s": round(statistics.median(r["ready_s"] for r in results), 3),
        "api_s": round(statistics.median(r["api_s"] for r in results), 3),
        "runs": results,
    }


def containerd_cold_start(root: Path, runs: int) -> Obj:
    from orchestrator.testing.containerd import (
        ContainerdError,
        ContainerdInstance,
        missing_prerequisites,
    )

    problems = missing_prerequisites()
    if problems:
        return {"skipped": "; ".join(problems)}
    instance = ContainerdInstance(root / "ctd", network="auto")
    try:
        instance.start()
    except ContainerdError as exc:
        return {"skipped": f"containerd did not start: {exc}"}
    try:
        extra = ("--runtime", "auto", "--containerd-socket", str(instance.socket), *HOST_NET_OFF)
        out = cold_starts(root / "srv", runs, *extra)
        # the last run again, kept running: which runtime did `auto` pick?
        _, proc = cold_start(root / "check", *extra, keep=True)
        assert proc is not None
        try:
            out["runtime"] = node_runtime_label(root / "check" / "data" / "kubeconfig.yaml")
        finally:
            proc.stop()
        return out
    finally:
        instance.stop()


# ---------------------------------------------------------------------------------- pods
def deployment(replicas: int) -> Obj:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "footprint"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "footprint"}},
            "template": {
                "metadata": {"labels": {"app": "footprint"}},
                "spec": {
                    "nodeName": NODE,
                    "containers": [{"name": "c", "image": "nginx:1.26"}],
                },
            },
        },
    }


def with_pods(kubeconfig: Path, pid: int, count: int, window: float, log: Path) -> Obj:
    client, url = admin_client(kubeconfig, timeout=30)
    with client:
        t0 = time.monotonic()
        r = client.post(
            url + "/apis/apps/v1/namespaces/default/deployments", json=deployment(count)
        )
        if r.status_code != 201:
            raise BenchError(f"creating the Deployment: {r.status_code} {r.text[:300]}")

        list_errors: list[str] = []

        def all_running() -> int | None:
            # A failed list (an error status, a timeout, a dropped connection) is reported,
            # not fatal: the server is expected to slow down under this load, and the next
            # poll tries again (only `wait_for`'s deadline ends the wait).
            try:
                r = client.get(
                    url + "/api/v1/namespaces/default/pods",
                    params={"labelSelector": "app=footprint"},
                )
                items = r.json()["items"] if r.status_code == 200 else None
            except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
                list_errors.append(f"{type(exc).__name__}: {exc}"[:200])
                return None
            if items is None:
                list_errors.append(f"{r.status_code} {r.text[:200]}")
                return None
            n = sum((p.get("status") or {}).get("phase") == "Running" for p in items)
            return n if n >= count else None

        wait_for(all_running, f"{count} pods Running", 600, 1.0)
        to_running = time.monotonic() - t0
    time.sleep(5.0 if window >= 10 else 1.0)  # let the last status writes settle
    out = observe(pid, window)
    out.update(pods=count, create_to_running_s=round(to_running, 1))
    out["list_errors"] = len(list_errors)
    if list_errors:
        out["list_error_samples"] = list_errors[:5]
    out["server_errors"] = server_errors(log)
    return out


def server_errors(log: Path) -> Obj:
    """What the server logged that a load must not cause: failed writes (503, no quorum),
    failed Lease renewals, controller errors (counted, with the first few lines)."""
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    marks = {
        "no_quorum": "no quorum answered",
        "lease_renewal_failed": "lease renewal failed",
        "controller_errors": "failed; retrying",
        "errors": " ERROR ",
    }
    out: Obj = {k: sum(m in line for line in lines) for k, m in marks.items()}
    samples = [line[:200] for line in lines if any(m in line for m in marks.values())]
    if samples:
        out["samples"] = samples[:5]
    return out


# ---------------------------------------------------------------------------------- agent only
def agent_only(root: Path, window: float) -> Obj:
    root.mkdir(parents=True, exist_ok=True)
    data = root / "server"
    server = Proc(server_argv(data, "--no-agent"), root / "server.log", child_env())
    agent: Proc | None = None
    try:
        kubeconfig = data / "kubeconfig.yaml"
        wait_for(lambda: (server.check(), api_ok(kubeconfig))[1], "the agent's server", 60)
        client, url = admin_client(kubeconfig)
        with client:
            r = client.post(url + "/orchestrator/v1/tokens", json={"ttlSeconds": 600})
            if r.status_code not in (200, 201):
                raise BenchError(f"token create: {r.status_code} {r.text[:300]}")
            token = r.json()["token"]
            argv = [
                sys.executable,
                "-m",
                "orchestrator",
                "--log-level",
                "warning",
                "--log-format",
                "text",
                "agent",
                "--server",
                url,
                "--token",
                token,
                "--data-dir",
                str(root / "agent"),
                "--runtime",
                "simulated",
                "--node-name",
                "footprint-agent",
                "--kubelet-port",
                "0",
            ]
            agent = Proc(argv, root / "agent.log", child_env())

            def ready() -> bool:
                agent.check()
                r = client.get(url + "/api/v1/nodes/footprint-agent")
                if r.status_code != 200:
                    return False
                conds = (r.json().get("status") or {}).get("conditions") or []
                return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

            wait_for(ready, "the agent's Node Ready", 60, 0.1)
        time.sleep(3.0 if window >= 10 else 1.0)
        out = observe(agent.pid, window)
        out["server_no_agent_rss_mib"] = round(rss_mib(server.pid), 1)
        return out
    finally:
        if agent is not None:
            agent.stop()
        server.stop()


# ---------------------------------------------------------------------------------- failover
async def first_write_after_kill(cluster: Any, leader: int, target: int) -> float:
    """Kill -9 `leader`, then start a ConfigMap create through server `target` every
    `PROBE_EVERY` s (each with its own timeout and name, overlapping) until one succeeds:
    seconds from just before the kill to that success."""
    url, verify, headers = admin_credentials(cluster.servers[target].kubeconfig)
    url = f"https://127.0.0.1:{cluster.servers[target].api_port}"
    limits = httpx.Limits(max_connections=500, max_keepalive_connections=50)
    names = itertools.count()
    async with httpx.AsyncClient(
        verify=verify, headers=headers, timeout=PROBE_TIMEOUT, limits=limits
    ) as client:
        succeeded: list[float] = []
        done = trio.Event()

        async def attempt() -> None:
            body = {"metadata": {"name": f"fo-{leader}-{next(names)}"}, "data": {"k": "v"}}
            try:
                r = await client.post(url + NS_PATH + "/configmaps", json=body)
            except httpx.HTTPError:
                return
            if r.status_code == 201:
                succeeded.append(time.monotonic())
                done.set()

        with trio.move_on_after(30):  # the target's API is up and the cluster writes
            while not succeeded:
                await attempt()
                await trio.sleep(0.05)
        if not succeeded:
            raise BenchError("no write succeeded before the kill")
        succeeded.clear()
        done = trio.Event()
        t0 = time.monotonic()
        cluster.kill(leader)
        with trio.move_on_after(30):
            async with trio.open_nursery() as nursery:
                while not done.is_set():
                    nursery.start_soon(attempt)
                    with trio.move_on_after(PROBE_EVERY):
                        await done.wait()
                nursery.cancel_scope.cancel()
        if not succeeded:
            raise BenchError("no write succeeded within 30 s of killing the leader")
        return min(succeeded) - t0


PROBE_EVERY = 0.02  # seconds between write attempts during a failover
PROBE_TIMEOUT = 5.0  # seconds one attempt may take


def failover(root: Path, rounds: int) -> Obj:
    results: list[float] = []
    with cluster_lib.Cluster(
        root, 3, tick_ms=100, election_ticks=10, api=True, agent=False, log_level="warning"
    ) as cluster:
        cluster.start()
        cluster.wait_leader_blocking(within=30)
        for i in range(3):
            trio.run(lambda i=i: cluster.wait_api(i))
        for _ in range(rounds):
            leader = cluster.wait_leader_blocking(within=30)
            target = (leader + 1) % 3
            took = trio.run(first_write_after_kill, cluster, leader, target)
            results.append(round(took, 3))
            cluster.restart(leader)
            trio.run(lambda i=leader: cluster.wait_ready(i, within=30))
            trio.run(lambda i=leader: cluster.wait_caught_up(i, within=30))
    return {
        "rounds": results,
        "median_s": round(statistics.median(results), 3),
        "max_s": max(results),
        "min_s": min(results),
        "sorted": sorted(results),
    }


# ---------------------------------------------------------------------------------- main
def print_table(r: Obj) -> None:
    def fmt(v: Any, unit: str) -> str:
        return f"{v}{unit}" if isinstance(v, int | float) else str(v)

    rows = []
    for variant in ("simulated", "containerd") if "cold_start" in r else ():
        cs = r["cold_start"][variant]
        if "skipped" in cs:
            rows.append((f"cold start ({variant})", "skipped", cs["skipped"][:60]))
            continue
        note = f"first API request {cs['api_s']} s; runs {[x['ready_s'] for x in cs['runs']]}"
        if "runtime" in cs:
            note += f"; auto picked {cs['runtime']}"
        goal = "met" if cs["ready_s"] < GOALS["start_ready_s"] else "NOT met (goal < 1 s)"
        rows.append((f"cold start to READY=1 ({variant})", fmt(cs["ready_s"], " s"), note))
        rows.append(("", "", goal))
    if "idle" in r:
        idle = r["idle"]
        goal_mb = GOALS["idle_rss_mb"]
        goal = f"goal < {goal_mb:g} MB = {goal_mb * MIB_PER_MB:.1f} MiB"
        goal = ("met" if idle["rss_mb"] < goal_mb else "NOT met") + f" ({goal})"
        rows.append(("idle all-in-one RSS", fmt(idle["rss_mib"], " MiB"), f"{idle['rss_mb']} MB"))
        rows.append(("", "", goal))
        rows.append(
            ("idle all-in-one CPU", fmt(idle["cpu_pct"], " %"), f"over {idle['window_s']} s")
        )
        p = r["pods"]
        rows.append(
            (
                f"all-in-one RSS with {p['pods']} pods",
                fmt(p["rss_mib"], " MiB"),
                f"CPU {p['cpu_pct']} %; all Running {p['create_to_running_s']} s after create",
            )
        )
        errs = p.get("server_errors") or {}
        rows.append(
            (
                "",
                "",
                f"list errors {p.get('list_errors', 0)}; server: no-quorum "
                f"{errs.get('no_quorum', 0)}, lease renewals failed "
                f"{errs.get('lease_renewal_failed', 0)}, errors {errs.get('errors', 0)}",
            )
        )
        a = r["agent"]
        rows.append(
            (
                "agent-only RSS",
                fmt(a["rss_mib"], " MiB"),
                f"{a['rss_mb']} MB; CPU {a['cpu_pct']} %; its server without agent "
                f"{a['server_no_agent_rss_mib']} MiB",
            )
        )
    f = r["failover"]
    if "skipped" in f:
        rows.append(("leader failover (kill -9 -> write)", "skipped", f["skipped"]))
    else:
        goal = "met" if f["median_s"] < GOALS["failover_s"] else "NOT met (goal < 1.5 s)"
        goal += "; max " + ("met" if f["max_s"] < GOALS["failover_s"] else "NOT met")
        rows.append(("leader failover (kill -9 -> write)", fmt(f["median_s"], " s"), goal))
        rows.append(("", "", f"rounds {f['rounds']}"))
        rows.append(("", "", f"sorted {f['sorted']}, max {f['max_s']} s"))
    w0 = max(len(x[0]) for x in rows)
    w1 = max(len(x[1]) for x in rows)
    print(f"{'MEASURE':{w0}}  {'VALUE':>{w1}}  NOTES")
    for name, value, note in rows:
        print(f"{name:{w0}}  {value:>{w1}}  {note}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke test: one run, short windows")
    p.add_argument("--runs", type=int, default=3, help="cold starts per variant (median)")
    p.add_argument("--idle", type=float, default=30.0, help="idle window, seconds")
    p.add_argument("--pods", type=int, default=1000, help="pods for the RSS-with-pods figure")
    p.add_argument("--failover-rounds", type=int, default=5)
    p.add_argument("--no-containerd", action="store_true", help="skip the containerd variant")
    p.add_argument(
        "--no-failover", action="store_true", help="skip the failover of a three-server site"
    )
    p.add_argument("--keep-data", action="store_true", help="keep the data dirs and logs")
    p.add_argument(
        "--only", choices=["failover"], help="run only this measurement (the others are skipped)"
    )
    args = p.parse_args(argv)
    if args.quick:
        args.runs, args.idle, args.pods, args.failover_rounds = 1, 2.0, 50, 1
        args.no_containerd = True
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="orch-footprint-"))  # short: unix socket paths
    result: Obj = {
        "bench": "footprint",
        "quick": args.quick,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "goals": GOALS,
        "env": {k: os.environ[k] for k in MEMORY_ENV if k in os.environ},
    }
    try:
        if args.only == "failover":
            result["failover"] = failover(root / "site", args.failover_rounds)
            return _finish(args, root, result)
        cold: Obj = {"simulated": cold_starts(root / "cold-sim", args.runs)}
        # the all-in-one process of the quick start: simulated runtime, kept for idle and pods
        _, proc = cold_start(root / "aio", keep=True)
        assert proc is not None
        try:
            kubeconfig = root / "aio" / "data" / "kubeconfig.yaml"
            cold["simulated"]["runtime"] = node_runtime_label(kubeconfig)
            time.sleep(5.0 if args.idle >= 10 else 1.0)
            result["idle"] = observe(proc.pid, args.idle)
            result["pods"] = with_pods(
                kubeconfig, proc.pid, args.pods, min(args.idle, 10.0), proc.log
            )
        finally:
            proc.stop()
        cold["containerd"] = (
            {"skipped": "--no-containerd"}
            if args.no_containerd
            else containerd_cold_start(root / "cold-ctd", args.runs)
        )
        result["cold_start"] = cold
        result["agent"] = agent_only(root / "agent", min(args.idle, 10.0))
        result["failover"] = (
            {"skipped": "--no-failover"}
            if args.no_failover
            else failover(root / "site", args.failover_rounds)
        )
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        print(f"data kept in {root}", file=sys.stderr)
        return 1
    simulated = result["cold_start"]["simulated"]
    result["met"] = {
        "start_ready": simulated["ready_s"] < GOALS["start_ready_s"],
        "idle_rss": result["idle"]["rss_mb"] < GOALS["idle_rss_mb"],
    }
    return _finish(args, root, result)


def _finish(args: argparse.Namespace, root: Path, result: Obj) -> int:
    if args.keep_data:
        print(f"data kept in {root}", file=sys.stderr)
    else:
        shutil.rmtree(root, ignore_errors=True)
    f = result["failover"]
    result.setdefault("met", {})["failover"] = (
        None if "skipped" in f else f["median_s"] < GOALS["failover_s"]
    )
    result["ok"] = True
    print_table(result)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
