"""Kubernetes API benchmark: creates/s, gets/s, lists of 1,000 objects/s and watch fan-out,
through HTTPS with the official Python client, on real server processes.

    python benches/api_bench.py [--servers 1,3] [--clients 4] [--concurrency 16] \\
        [--creates 4000] [--gets 8000] [--lists 200] [--list-size 1000] \\
        [--watchers 100] [--watch-events 300] [--watch-writers 4] [--quick] [--json] \\
        [--profile S:PHASE] [--keep-data]

Servers: for each cluster size a fresh cluster of `orchestrator server` processes is started on
loopback (tests/cluster.py: Raft over SQLite with fsync on, the Kubernetes API over HTTPS,
`--runtime simulated --no-agent`, so no controller or agent adds load). The driver waits for a
leader, for every server's kubeconfig (written once its API listens) and for `/readyz`. All
servers of a cluster share the CA and the admin token; each server's own kubeconfig names its
own port.

Clients: `--clients` separate processes (multiprocessing, spawned), each with one
`kubernetes.client.ApiClient` per server (urllib3 pool as large as the threads that use it) and
`--concurrency` threads. Thread t of process p talks to server (p * concurrency + t) mod
servers, so the load is spread evenly over all servers of a cluster (a follower forwards writes
to the leader, as it would for a real client). Requests go through the generated API methods
(`create_namespaced_config_map`, ...) with `_preload_content=False`: the client builds, signs and
sends the request as usual and the body is read in full (lists and watch lines are parsed with
`json.loads`) but not turned into model objects, whose construction costs far more client CPU
than the request itself (a list of 1,000 ConfigMaps takes ~100 ms to deserialise) and would make
the client the bottleneck. Every process opens its connections (TLS handshakes) before the
measured window.

Phases (each one starts at the same instant in every client process):
  create  `--creates` ConfigMaps (~200 bytes of data each) in one namespace -> creates/s,
          send -> response latency p50/p99.
  get     `--gets` reads of those objects (cycling over them) -> gets/s, p50/p99.
  list    `--lists` lists of a namespace holding exactly `--list-size` ConfigMaps (filled
          before the window, not measured); one request returns them all, and every answer
          is checked to hold that many items -> lists/s, p50/p99.
  watch   `--watchers` watches of one namespace, spread over the client processes (a thread
          each) and over the servers, all started from the same resourceVersion and connected
          (response headers received) before the writes; then the driver process writes
          `--watch-events` ConfigMaps with `--watch-writers` threads (spread over the servers).
          Delivery latency of every (event, watcher) pair: writer's ack time (the create
          returned) -> the watcher read the event line, both time.time() on this machine;
          negative when the event reached the watcher before the writer saw its response.
          Also send -> receive (includes the write's commit). "ops/s" = deliveries per second
          from the first write to the last delivery. Every watcher must see every event exactly
          once (any miss or duplicate is reported as an error).

CPU: client = user+sys of the client processes over their part of the window (getrusage; for
the watch phase plus the driver's writer threads), server = sum over the server processes from
/proc/<pid>/stat around the window; "us/op" = CPU per operation (per delivery for watch),
"box %" = both over the machine's capacity in the window (near 100 % means the machine is the
limit), "oth %" = the CPU everything else on the machine used meanwhile (/proc/stat): if it is not
small, that phase was disturbed. Before each phase the driver waits (up to `--quiet-wait` s)
until the machine is at most 25 % busy. Nothing is asserted: this is a measurement.

`--profile S:PHASE[,...]` (e.g. 1:list,3:create) runs `py-spy record --gil` on the leader during
each such phase and prints the top functions by self and inclusive samples (profiling slows the
server: those phases' figures are not comparable).

Output: a table per cluster size, then one JSON line
`{"bench": "api", ..., "servers": {"1": {"create": {...}, ...}, "3": {...}}}`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # for benchlib, imported below

from benchlib import cluster_lib, cpu_self, machine_cpu, percentile, wait_quiet  # noqa: E402

PHASES = ("create", "get", "list", "watch")
NS_OPS = "bench-ops"
NS_LIST = "bench-list"
NS_WATCH = "bench-watch"
PAYLOAD = "x" * 200
REQUEST_TIMEOUT = 60.0  # seconds; a request slower than this is an error, not a hang


def _configmap(name: str, data: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name},
        "data": data if data is not None else {"payload": PAYLOAD},
    }


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _sleep_until(t: float) -> float:
    """Sleep until CLOCK_MONOTONIC time t (system-wide, so shared by the processes); returns
    how late we are."""
    time.sleep(max(0.0, t - time.monotonic()))
    return max(0.0, time.monotonic() - t)


def _core_api(kubeconfig: str, pool_size: int) -> Any:
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    cfg.connection_pool_maxsize = pool_size
    return client.CoreV1Api(client.ApiClient(cfg))


def _read(resp: Any) -> bytes:
    try:
        return resp.data
    finally:
        resp.release_conn()


# ---------------------------------------------------------------------------------- workers
class _Worker:
    """One client process: an ApiClient per server, a pool of `concurrency` threads."""

    def __init__(self, index: int, kubeconfigs: list[str], concurrency: int, watchers: int):
        self.index = index
        self.concurrency = concurrency
        n = len(kubeconfigs)
        self.cores = [_core_api(k, concurrency + watchers + 2) for k in kubeconfigs]
        # thread t of this process talks to server (index * concurrency + t) % n
        self.thread_core = [self.cores[(index * concurrency + t) % n] for t in range(concurrency)]
        self.pool = ThreadPoolExecutor(concurrency)

    def warm_up(self) -> None:
        """Open every thread's connection (TLS handshake) before any window."""

        def one(core: Any) -> None:
            _read(core.list_namespace(limit=1, _preload_content=False, _request_timeout=30))

        list(self.pool.map(one, self.thread_core))

    def run_ops(self, op: str, items: list[str], params: dict[str, Any]) -> dict[str, Any]:
        fn: Callable[[Any, str], None] = getattr(self, f"_op_{op}")
        self._params = params
        chunks = [items[t :: self.concurrency] for t in range(self.concurrency)]
        late = _sleep_until(params["start_at"])
        cpu0 = cpu_self()

        def loop(t: int) -> tuple[list[float], int, str]:
            core = self.thread_core[t]
            lat: list[float] = []
            errors, first = 0, ""
            for item in chunks[t]:
                t0 = time.monotonic()
                try:
                    fn(core, item)
                except Exception as exc:
                    errors += 1
                    first = first or f"{op} {item}: {exc!r}"[:300]
                    continue
                lat.append((time.monotonic() - t0) * 1000.0)
            return lat, errors, first

        outs = list(self.pool.map(loop, range(self.concurrency)))
        return {
            "t_end": time.monotonic(),
            "late_s": late,
            "cpu_s": cpu_self() - cpu0,
            "latencies_ms": [x for lat, _, _ in outs for x in lat],
            "errors": sum(e for _, e, _ in outs),
            "first_error": next((f for _, _, f in outs if f), ""),
        }

    def _op_create(self, core: Any, name: str) -> None:
        _read(
            core.create_namespaced_config_map(
                self._params["namespace"],
                _configmap(name),
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT,
            )
        )

    def _op_get(self, core: Any, name: str) -> None:
        _read(
            core.read_namespaced_config_map(
                name, NS_OPS, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
            )
        )

    def _op_list(self, core: Any, _item: str) -> None:
        body = _read(
            core.list_namespaced_config_map(
                NS_LIST, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
            )
        )
        got = len(json.loads(body)["items"])
        if got != self._params["list_size"]:
            raise RuntimeError(f"list returned {got} items, not {self._params['list_size']}")

    def watch(self, conn: Any, params: dict[str, Any]) -> dict[str, Any]:
        """Open this process's watchers, report when all are connected, then collect until each
        has seen `expected` ADDED events (or the deadline)."""
        from kubernetes.watch.watch import iter_resp_lines

        slots: list[int] = params["slots"]  # global watcher indices of this process
        expected: int = params["expected"]
        n = len(self.cores)
        connected = threading.Barrier(len(slots) + 1)
        cpu0 = cpu_self()

        def one(slot: int) -> dict[str, Any]:
            core = self.cores[slot % n]
            seen: list[tuple[str, float]] = []
            resp = None
            try:
                resp = core.list_namespaced_config_map(
                    NS_WATCH,
                    watch=True,
                    resource_version=params["resource_version"],
                    timeout_seconds=int(params["timeout_s"]),
                    _preload_content=False,
                    _request_timeout=(10, params["timeout_s"]),
                )
            except Exception as exc:
                connected.abort()
                return {"seen": seen, "error": f"watcher {slot} could not connect: {exc!r}"}
            error = ""
            try:
                connected.wait()
                for line in iter_resp_lines(resp):
                    now = time.time()
                    ev = json.loads(line)
                    kind = ev.get("type")
                    if kind == "ADDED":
                        seen.append((ev["object"]["metadata"]["name"], now))
                        if len(seen) >= expected:
                            break
                    elif kind != "BOOKMARK":
                        error = f"watcher {slot}: unexpected event {line[:200]}"
                        break
            except Exception as exc:
                error = f"watcher {slot}: {exc!r}"[:300]
            finally:
                resp.close()
                resp.release_conn()
            return {"seen": seen, "error": error}

        with ThreadPoolExecutor(len(slots)) as pool:
            futs = [pool.submit(one, s) for s in slots]
            try:
                connected.wait(timeout=30)
                conn.send({"connected": True})
            except threading.BrokenBarrierError:
                conn.send({"connected": False})
            outs = [f.result() for f in futs]
        return {
            "cpu_s": cpu_self() - cpu0,
            "watchers": [o["seen"] for o in outs],
            "errors": [o["error"] for o in outs if o["error"]],
        }


def _worker_main(
    conn: Any, index: int, kubeconfigs: list[str], concurrency: int, watchers: int
) -> None:
    try:
        w = _Worker(index, kubeconfigs, concurrency, watchers)
        w.warm_up()
        conn.send({"ready": True})
        while (msg := conn.recv()) is not None:
            kind, items, params = msg
            if kind == "watch":
                conn.send(w.watch(conn, params))
            else:
                conn.send(w.run_ops(kind, items, params))
    except Exception as exc:  # reported to the driver, which stops
        import traceback

        conn.send({"fatal": f"client process {index}: {exc!r}\n{traceback.format_exc()}"})


class _Clients:
    """The client processes of one cluster size."""

    def __init__(self, kubeconfigs: list[str], args: argparse.Namespace) -> None:
        ctx = mp.get_context("spawn")
        per_proc = max(_split(args.watchers, args.clients))
        self.conns = []
        self.procs = []
        for p in range(args.clients):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=_worker_main,
                args=(child, p, kubeconfigs, args.concurrency, per_proc),
                daemon=True,
            )
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)
        for _ in self._recv_all(120):
            pass

    def _recv(self, p: int, timeout: float) -> dict[str, Any]:
        if not self.conns[p].poll(timeout):
            raise RuntimeError(f"client process {p} did not answer within {timeout:g}s")
        msg = self.conns[p].recv()
        if "fatal" in msg:
            raise RuntimeError(msg["fatal"])
        return msg

    def _recv_all(self, timeout: float) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        return [
            self._recv(p, max(0.0, deadline - time.monotonic())) for p in range(len(self.conns))
        ]

    def send(self, p: int, kind: str, items: list[str], params: dict[str, Any]) -> None:
        self.conns[p].send((kind, items, params))

    def close(self) -> None:
        for c in self.conns:
            with contextlib.suppress(OSError):
                c.send(None)
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()


# ---------------------------------------------------------------------------------- driver
def _cpu_of(pids: list[int]) -> float:
    return sum(cluster_lib.process_cpu_seconds(pid) or 0.0 for pid in pids)


def _box(
    cli: float, srv: float, mach0: tuple[float, float], mach1: tuple[float, float]
) -> dict[str, float]:
    """Our CPU (clients + servers) and everything else's, as % of the machine's capacity over
    the window."""
    total = max(1e-9, mach1[1] - mach0[1])
    busy = mach1[0] - mach0[0]
    return {
        "box_cpu_pct": 100.0 * (cli + srv) / total,
        "other_cpu_pct": 100.0 * max(0.0, busy - cli - srv) / total,
    }


class _Spy:
    """py-spy record on one process for the length of a phase."""

    def __init__(self, pid: int, out: str, extra: list[str]) -> None:
        self.out = out
        argv = ["py-spy", "record", "--format", "raw", "--rate", "100", *extra]
        self.proc = subprocess.Popen(
            [*argv, "-p", str(pid), "-o", out],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        time.sleep(1.0)  # py-spy attaches

    def stop(self) -> None:
        self.proc.send_signal(2)  # SIGINT: py-spy writes its output and exits
        _, err = self.proc.communicate(timeout=60)
        if not os.path.exists(self.out):
            print(f"# py-spy failed: {err.decode(errors='replace')[-500:]}", flush=True)


def _profile_summary(path: str, seconds: float, top: int = 15) -> dict[str, Any]:
    self_c: Counter[str] = Counter()
    incl_c: Counter[str] = Counter()
    total = 0
    with open(path) as f:
        for line in f:
            stack, _, count_s = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            count = int(count_s)
            funcs = []
            for fr in stack.split(";"):
                name, _, loc = fr.partition(" (")
                file = loc.rsplit(":", 1)[0].rstrip(")")
                short = file.split("site-packages/")[-1].split("/work/main/")[-1]
                funcs.append(f"{name} ({short})")
            total += count
            if funcs:
                self_c[funcs[-1]] += count
            for fn in set(funcs):
                incl_c[fn] += count
    wall = seconds * 100.0
    print(f"# py-spy: {total} samples over {seconds:.1f}s at 100 Hz (100% = one core)")
    print("# top functions by self samples:")
    for fn, n in self_c.most_common(top):
        print(f"#   {100 * n / wall:6.1f}%  {fn}")
    print("# top functions by inclusive samples:")
    for fn, n in incl_c.most_common(top):
        print(f"#   {100 * n / wall:6.1f}%  {fn}")
    return {
        "samples": total,
        "self_top": self_c.most_common(top),
        "inclusive_top": incl_c.most_common(top),
    }


class _Bench:
    """One cluster size: servers, client processes, phases."""

    def __init__(self, n: int, root: Path, args: argparse.Namespace) -> None:
        self.n = n
        self.args = args
        self.root = root
        self.cluster = cluster_lib.Cluster(
            root,
            n,
            tick_ms=100,
            log_level="warning",
            extra_args=["--runtime", "simulated", "--no-agent"],
        )
        self.results: dict[str, Any] = {}

    # ------------------------------------------------------------------ setup
    def start(self) -> None:
        import trio

        cl = self.cluster
        cl.start()
        self.leader = cl.wait_leader_blocking(within=60)
        for i in range(self.n):
            trio.run(lambda i=i: cl.wait_api(i, within=60))
        self.kubeconfigs = [str(s.kubeconfig) for s in cl.servers]
        self.cores = [
            _core_api(k, self.args.watch_writers + 2) for k in self.kubeconfigs
        ]  # the driver's own clients (setup, watch writes)
        deadline = time.monotonic() + 60
        for i, core in enumerate(self.cores):
            while True:
                try:
                    body = _read(
                        core.api_client.call_api(
                            "/readyz",
                            "GET",
                            auth_settings=["BearerToken"],
                            _preload_content=False,
                            _request_timeout=5,
                        )[0]
                    )
                    if body.strip() == b"ok":
                        break
                except Exception:
                    pass
                cl.check_alive()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"server {i} is not ready after 60 s")
                time.sleep(0.1)
        for ns in (NS_OPS, NS_LIST, NS_WATCH):
            self._retry(lambda ns=ns: self.cores[0].create_namespace({"metadata": {"name": ns}}))
        self.pids = [p for i in cl.running() if (p := cl.pid(i)) is not None]
        self.clients = _Clients(self.kubeconfigs, self.args)

    def _retry(self, fn: Callable[[], Any], within: float = 30.0) -> Any:
        deadline = time.monotonic() + within
        while True:
            try:
                return fn()
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def close(self) -> None:
        clients = getattr(self, "clients", None)
        if clients is not None:
            clients.close()
        for core in getattr(self, "cores", []):
            core.api_client.close()

    # ------------------------------------------------------------------ phases
    def _quiet(self) -> float:
        return wait_quiet(self.args.quiet_wait) if self.args.quiet_wait > 0 else 0.0

    def _spy_for(self, phase: str) -> _Spy | None:
        if (self.n, phase) not in self.args.profile:
            return None
        out = str(self.root / f"py-spy-{self.n}-{phase}.txt")
        return _Spy(self.pids[self.leader], out, self.args.py_spy_args.split())

    def ops_phase(self, kind: str, items: list[str], params: dict[str, Any]) -> dict[str, Any]:
        """Run one measured phase of `kind` over `items`, spread over the client processes."""
        clients = self.clients
        parts = len(clients.conns)
        busy_before = self._quiet()
        spy = self._spy_for(kind)
        start_at = time.monotonic() + 0.5
        for p in range(parts):
            clients.send(p, kind, items[p::parts], {**params, "start_at": start_at})
        _sleep_until(start_at)
        srv0, mach0, wall0 = _cpu_of(self.pids), machine_cpu(), time.monotonic()
        outs = clients._recv_all(REQUEST_TIMEOUT * max(1, len(items)))
        srv1, mach1, wall1 = _cpu_of(self.pids), machine_cpu(), time.monotonic()
        if spy is not None:
            spy.stop()
            self.results.setdefault("profile", {})[kind] = _profile_summary(
                spy.out, wall1 - wall0 + 1.0
            )
        seconds = max(o["t_end"] for o in outs) - start_at
        lat = sorted(x for o in outs for x in o["latencies_ms"])
        ok = len(lat)
        cli = sum(o["cpu_s"] for o in outs)
        srv = srv1 - srv0
        first = next((o["first_error"] for o in outs if o["first_error"]), "")
        return {
            "ops": ok,
            "seconds": seconds,
            "ops_per_s": ok / seconds if seconds > 0 else float("nan"),
            "p50_ms": percentile(lat, 0.50),
            "p99_ms": percentile(lat, 0.99),
            "errors": sum(o["errors"] for o in outs),
            "first_error": first,
            "client_cpu_s": cli,
            "server_cpu_s": srv,
            "client_us_per_op": cli / ok * 1e6 if ok else float("nan"),
            "server_us_per_op": srv / ok * 1e6 if ok else float("nan"),
            **_box(cli, srv, mach0, mach1),
            "busy_before_pct": 100.0 * busy_before,
            "late_start_s": max(o["late_s"] for o in outs),
        }

    def watch_phase(self) -> dict[str, Any]:
        args = self.args
        clients = self.clients
        parts = len(clients.conns)
        rv = json.loads(
            _read(self.cores[0].list_namespaced_config_map(NS_WATCH, _preload_content=False))
        )["metadata"]["resourceVersion"]
        # global watcher index -> process (round robin), so watchers spread over processes and
        # (index mod servers) over servers
        slots = [list(range(p, args.watchers, parts)) for p in range(parts)]
        expected = args.watch_events
        timeout_s = 60.0 + expected * 0.5
        for p in range(parts):
            clients.send(
                p,
                "watch",
                [],
                {
                    "slots": slots[p],
                    "expected": expected,
                    "resource_version": rv,
                    "timeout_s": timeout_s,
                },
            )
        connected = clients._recv_all(60)
        busy_before = self._quiet()
        if not all(c.get("connected") for c in connected):
            raise RuntimeError("some watchers could not connect (see the client errors)")

        spy = self._spy_for("watch")
        names = [f"ev-{i}" for i in range(expected)]
        sent: dict[str, float] = {}
        acked: dict[str, float] = {}
        write_errors: list[str] = []

        def write(i: int) -> None:
            name = names[i]
            core = self.cores[i % self.n]
            t0 = time.time()
            sent[name] = t0
            try:
                _read(
                    core.create_namespaced_config_map(
                        NS_WATCH,
                        _configmap(name, {"sent": repr(t0), "payload": PAYLOAD}),
                        _preload_content=False,
                        _request_timeout=REQUEST_TIMEOUT,
                    )
                )
            except Exception as exc:
                write_errors.append(f"write {name}: {exc!r}"[:300])
                return
            acked[name] = time.time()

        srv0, mach0, cpu0, wall0 = _cpu_of(self.pids), machine_cpu(), cpu_self(), time.time()
        with ThreadPoolExecutor(args.watch_writers) as pool:
            list(pool.map(write, range(expected)))
        outs = clients._recv_all(timeout_s + 30)
        srv1, mach1, cpu1 = _cpu_of(self.pids), machine_cpu(), cpu_self()
        if spy is not None:
            spy.stop()
            self.results.setdefault("profile", {})["watch"] = _profile_summary(
                spy.out, time.time() - wall0
            )
        from_ack: list[float] = []
        from_send: list[float] = []
        errors = [e for o in outs for e in o["errors"]] + write_errors
        delivered = 0
        last = wall0
        bad_watchers = 0
        for o in outs:
            for seen in o["watchers"]:
                counts = Counter(name for name, _ in seen)
                if set(counts) != set(acked) or any(c != 1 for c in counts.values()):
                    bad_watchers += 1
                    missing = len(set(acked) - set(counts))
                    dups = sum(c - 1 for c in counts.values())
                    errors.append(f"a watcher missed {missing} events and saw {dups} twice")
                for name, t in seen:
                    delivered += 1
                    last = max(last, t)
                    if name in acked:
                        from_ack.append((t - acked[name]) * 1000.0)
                        from_send.append((t - sent[name]) * 1000.0)
        from_ack.sort()
        from_send.sort()
        seconds = last - wall0
        cli = sum(o["cpu_s"] for o in outs) + (cpu1 - cpu0)
        srv = srv1 - srv0
        return {
            "watchers": args.watchers,
            "events": expected,
            "ops": delivered,
            "expected_deliveries": args.watchers * expected,
            "seconds": seconds,
            "ops_per_s": delivered / seconds if seconds > 0 else float("nan"),
            "p50_ms": percentile(from_ack, 0.50),
            "p99_ms": percentile(from_ack, 0.99),
            "send_p50_ms": percentile(from_send, 0.50),
            "send_p99_ms": percentile(from_send, 0.99),
            "writes_acked": len(acked),
            "watchers_exact": args.watchers - bad_watchers,
            "errors": len(errors),
            "first_error": errors[0] if errors else "",
            "client_cpu_s": cli,
            "server_cpu_s": srv,
            "client_us_per_op": cli / delivered * 1e6 if delivered else float("nan"),
            "server_us_per_op": srv / delivered * 1e6 if delivered else float("nan"),
            **_box(cli, srv, mach0, mach1),
            "busy_before_pct": 100.0 * busy_before,
        }

    def run(self) -> dict[str, Any]:
        args = self.args
        r = self.results
        names = [f"cm-{i}" for i in range(args.creates)]
        r["create"] = self.ops_phase("create", names, {"namespace": NS_OPS})
        self._row("create", r["create"])
        gets = [names[i % len(names)] for i in range(args.gets)]
        r["get"] = self.ops_phase("get", gets, {})
        self._row("get", r["get"])
        fill = self.ops_phase(
            "create", [f"l-{i}" for i in range(args.list_size)], {"namespace": NS_LIST}
        )
        if fill["ops"] != args.list_size:
            raise RuntimeError(f"filling the list namespace failed: {fill['first_error']}")
        r["list"] = self.ops_phase("list", [""] * args.lists, {"list_size": args.list_size})
        r["list"]["objects_per_list"] = args.list_size
        self._row("list", r["list"])
        r["watch"] = self.watch_phase()
        self._row("watch", r["watch"])
        self.cluster.check_alive()
        r["leader"] = self.leader
        return r

    def _row(self, phase: str, x: dict[str, Any]) -> None:
        if self.args.json:
            return
        print(
            f"{phase:<7} {x['ops']:>7} {x['seconds']:>6.1f} {x['ops_per_s']:>8.0f} "
            f"{x['p50_ms']:>7.1f} {x['p99_ms']:>7.1f} {x['client_cpu_s']:>7.1f} "
            f"{x['client_us_per_op']:>7.0f} {x['server_cpu_s']:>7.1f} "
            f"{x['server_us_per_op']:>7.0f} {x['box_cpu_pct']:>5.0f} {x['other_cpu_pct']:>5.0f} "
            f"{x['errors']:>4}",
            flush=True,
        )
        if x["first_error"]:
            print(f"#   first error: {x['first_error']}", flush=True)
        if phase == "list":
            print(f"#   {x['objects_per_list']} objects per list", flush=True)
        if phase == "watch":
            print(
                f"#   {x['watchers']} watchers x {x['events']} events: "
                f"{x['ops']}/{x['expected_deliveries']} deliveries, "
                f"{x['watchers_exact']}/{x['watchers']} watchers saw every event exactly once; "
                f"latency ack->receive (above), send->receive p50 {x['send_p50_ms']:.1f} ms, "
                f"p99 {x['send_p99_ms']:.1f} ms",
                flush=True,
            )


HEADER = (
    f"{'phase':<7} {'ops':>7} {'secs':>6} {'ops/s':>8} {'p50 ms':>7} {'p99 ms':>7} "
    f"{'cli s':>7} {'cli us':>7} {'srv s':>7} {'srv us':>7} {'box%':>5} {'oth%':>5} {'err':>4}"
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--servers", default="1,3", help="cluster sizes, comma-separated")
    ap.add_argument("--clients", type=int, default=4, help="client processes")
    ap.add_argument("--concurrency", type=int, default=16, help="threads per client process")
    ap.add_argument("--creates", type=int, default=4000)
    ap.add_argument("--gets", type=int, default=8000)
    ap.add_argument("--lists", type=int, default=200)
    ap.add_argument("--list-size", type=int, default=1000, help="objects in the listed namespace")
    ap.add_argument("--watchers", type=int, default=100)
    ap.add_argument("--watch-events", type=int, default=300, help="writes watched")
    ap.add_argument("--watch-writers", type=int, default=4, help="writer threads (driver)")
    ap.add_argument("--quick", action="store_true", help="a tiny smoke run (seconds)")
    ap.add_argument("--json", action="store_true", help="print only the JSON line")
    ap.add_argument(
        "--profile", metavar="S:PHASE[,...]", help="py-spy the leader of S servers in PHASE"
    )
    ap.add_argument("--py-spy-args", default="--gil", help="extra py-spy record options")
    ap.add_argument(
        "--quiet-wait",
        type=float,
        default=20.0,
        help="before each phase, wait up to this many seconds for the machine to be at most "
        "25%% busy (a shared machine); 0 = do not wait",
    )
    ap.add_argument("--keep-data", action="store_true", help="keep the data directories")
    args = ap.parse_args()
    if args.quick:
        args.clients, args.concurrency = min(args.clients, 2), min(args.concurrency, 4)
        args.creates, args.gets, args.lists, args.list_size = 40, 80, 10, 100
        args.watchers, args.watch_events, args.watch_writers = 10, 20, 2
        args.quiet_wait = 0.0
    sizes = [int(x) for x in args.servers.split(",") if x]
    points = set()
    for point in filter(None, (args.profile or "").split(",")):
        s, _, phase = point.partition(":")
        if phase not in PHASES or not s.isdigit():
            ap.error(f"--profile S:PHASE[,...], PHASE one of {', '.join(PHASES)}")
        points.add((int(s), phase))
    if points and shutil.which("py-spy") is None:
        ap.error("--profile needs py-spy (pip install py-spy)")
    args.profile = points
    if args.creates < 1 or args.list_size < 1 or args.watchers < 1 or args.watch_events < 1:
        ap.error("counts must be at least 1")

    root = Path(tempfile.mkdtemp(prefix="api-bench-"))
    out: dict[str, Any] = {}
    if not args.json:
        print(
            f"# {os.cpu_count()} CPUs; {args.clients} client processes x {args.concurrency} "
            f"threads (kubernetes Python client, HTTPS, sync); fsync on; data in {root}",
            flush=True,
        )
    try:
        for n in sizes:
            bench = _Bench(n, root / f"s{n}", args)
            with bench.cluster:
                try:
                    bench.start()
                    if not args.json:
                        print(
                            f"\n# {n} server(s), leader = server {bench.leader}; "
                            f"us = CPU microseconds per op (watch: per delivery)",
                            flush=True,
                        )
                        print(HEADER, flush=True)
                    out[str(n)] = bench.run()
                finally:
                    bench.close()
    finally:
        if not args.keep_data:
            shutil.rmtree(root, ignore_errors=True)
    print(
        json.dumps(
            {
                "bench": "api",
                "cpus": os.cpu_count(),
                "clients": args.clients,
                "concurrency": args.concurrency,
                "servers": out,
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
