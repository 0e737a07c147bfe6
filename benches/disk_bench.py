"""Disk writes of the all-in-one server (flash wear): bytes written per hour at idle and under a
steady churn of one pod per second.

    python benches/disk_bench.py [--quick] [--idle-seconds 120] [--churn-seconds 120]
        [--pods 10] [--settle 10] [--auto-compaction 5m] [--keep-data]

One real `orchestrator server --runtime simulated` process (store, API, controllers, scheduler
and the embedded node agent with the simulated container runtime, as in footprint.py; started
with `--log-level warning`, its log outside the data dir) on a fresh data dir. After `--settle`
seconds, two phases are measured:

* **idle**: nothing is asked of the server for `--idle-seconds`;
* **churn**: `--pods` pods are created and Running first (not measured), then for
  `--churn-seconds`, once a second, one new pod is created and the oldest one deleted through
  the API (plain pods, scheduled by the scheduler onto the server's own Node, run by the agent),
  so the number of pods stays constant.

What is measured, per phase, extrapolated to one hour:

* `write_bytes` of the process from /proc/PID/io: the bytes it caused to be written to the
  block layer (page-cache pages it dirtied, counted once per page until written back; its log
  included, which is tiny at warning level). Filesystem journal (jbd2) writes are not in it.
  If /proc/PID/io cannot be read, the figure falls back to the SQLite WAL frames below plus the
  growth of the data dir's files (`io_source` says which was used).
* WAL frames appended to each SQLite database (raft.db, store.db, agent/agent.db), counted
  from the frame headers of each WAL file every 0.2 s (frames x (page size + 24)): where the
  bytes go. Plus `write` syscalls per second (`syscw`), Raft fsyncs (the
  `raft_wal_fsync_duration_seconds` count of /metrics), store revisions and compactions, the
  largest WAL file seen and the database sizes at the end, and which keys the phase wrote
  (from the store's history table, grouped by resource).

What is written, and why (measured on this project's 2-core build machine, ext4):

* **Idle: about 10 MiB/h** (27 KiB per renewal; `--idle-seconds 300`: 60 s windows vary from
  8 to 12), all of it the node agent renewing its Lease `kube-node-lease/<node>` every 10 s
  (the kubelet's heartbeat: the node lifecycle controller marks a Node unreachable 40 s after
  the last renewal). It is the only write at idle: the Node status is PATCHed only
  when it changes (and every 5 min), the controllers and the scheduler are fenced by the Raft
  term instead of renewing leader-election Leases, a one-server cluster sends no Raft
  heartbeats, the Raft core emits a HardState only when term, vote or commit changed, the
  agent's database is not written, nothing polls by writing. Each renewal (a 0.7 KiB Raft
  entry) is one fsynced transaction in raft.db (`synchronous=FULL`: the entry's page and the
  hard state's page; 1 KiB pages) and a share of store.db's commit every 30 s (meta row with
  the applied index, history row, key index, current-state index; 4 KiB pages, not fsynced,
  `synchronous=NORMAL`: the Raft log is the durable record). A fsynced commit costs at least
  one 4 KiB page of `write_bytes` however little it writes (the page its WAL ends in was
  cleaned by the previous fsync and is dirtied again), plus the pages it touched; the rest is
  the wal-index pages and the checkpoints. Before issue 18 (4 KiB pages everywhere, store.db
  committed every 100 ms): 14-17 MiB/h, 39-49 KiB per renewal.
* **Automatic compaction** (`--auto-compaction 5m`) used to propose a compaction every 30 s as
  soon as anything was behind the retention window - at idle, 3 lease revisions - each a Raft
  entry, a delete in store.db and a `wal_checkpoint(TRUNCATE)` (two more fsyncs, the WAL
  truncated and regrown): from 5 minutes after start, idle writes grew from 18 to 28 MiB/h
  (`--settle 300 --idle-seconds 300`: 28.4 MiB/h with 10 compactions, now 17.9 MiB/h with 1).
  Now (store/raftstore.py `Compactor`) a compaction waits until it frees 1,000 revisions or the
  previous one is a retention period old, as etcd (periodic: every retention period below an
  hour), kine and kube-apiserver (every 5 min) do. The default windows end before the first
  compaction (5.5 min after start); `--settle 300` measures the steady state.
* **Churn, 1 pod/s: 530-620 MiB/h, 15-17 KiB per key write** (before issue 18: 1.2 GiB/h,
  35 KiB). Measure it over 60 s or more: store.db commits every 30 s, so a shorter window may see
  none of its writes (and the next one twice as many). Each pod makes 10 key writes (create,
  bind, two status updates - containers waiting, then Running -, the deletion with its grace
  period and the final delete, plus 4 Events: Scheduled, Created, Started, Killing). Per key
  write (60 s windows): raft.db WAL 4.5 KiB (was 10.8: 1 KiB pages), store.db WAL 1.8 KiB (was
  7.0: applies share one transaction for 30 s instead of 100 ms, so the index leaves are written
  once per commit), agent.db WAL 2.2 KiB (was 5.2: 1 KiB pages, pods stored without
  managedFields, and not written again when the server echoes the agent's own status report: 4
  fsynced transactions per pod instead of 5, so a node that reboots offline still knows its
  pods), and 6.5 KiB the table calls "other" (was 12): each fsync's re-dirtied page (about 13
  fsyncs/s: one per Raft entry, as Raft batches only what arrives together, plus the agent's),
  the checkpoints copying pages into the database files, the wal-index. The floor of this design
  is about one 4 KiB page per fsync per key write plus the entry's own bytes twice (WAL,
  checkpoint): below 8 KiB per key write needs several key writes per fsync.
* **Bounded files**: SQLite checkpoints each WAL every 1,000 pages (raft.db: 4,096 of 1 KiB)
  and reuses it from its start (largest WAL about 3 MiB under churn); after a burst every
  WAL is cut back to 8 MiB (`dbthread.WAL_SIZE_LIMIT`); the Raft log is compacted every
  10,000 entries and the store's history by the policy above.

For comparison (store-notes.md, edge-notes.md): several writes a second to kine's
`state.db-wal` wore a high-endurance SD card out in under 6 months (k3s#11313), kine#105 reports
a constant 5 MB/s (18 GB/h), and k3s's docs ask for 500 KiB/s and 10 IOPS of disk for its SQLite
datastore; the idle figure here is about 3 KiB/s and 0.1 fsyncs/s. Output: a table (with bytes
per key write: the total, and per database the WAL frames, then the rest), then one JSON line
`{"bench": "disk", "idle_bytes_per_hour": ..., "churn_bytes_per_hour": ...,
"churn_bytes_per_key_write": ..., ...}`;
exit 1 only if a measurement could not be made. `--quick` (the smoke test): 3 s phases, 3 pods.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import sqlite3
import struct
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # for benchlib and footprint (which put the repo on sys.path)

from footprint import BenchError, Proc, admin_client, cold_start, wait_for  # noqa: E402

Obj = dict[str, Any]
DATABASES = {"raft": "raft.db", "store": "store.db", "agent": "agent/agent.db"}
SAMPLE_EVERY = 0.2  # seconds between samples of the WAL counters and file sizes
PODS_PATH = "/api/v1/namespaces/default/pods"
WAL_FRAME_HEADER = 24


# ---------------------------------------------------------------------------------- probes
def proc_io(pid: int) -> dict[str, int] | None:
    """/proc/PID/io as a dict, or None where it cannot be read (no permission, no procfs)."""
    try:
        with open(f"/proc/{pid}/io") as f:
            return {k: int(v) for k, v in (line.split(":") for line in f)}
    except (OSError, ValueError):
        return None


def wal_frames(wal: Path, salts: bytes, known: int) -> tuple[int, int, bytes] | None:
    """(page size, frames, salts) of a WAL file: the frames from its start that carry the salts
    of its header (the current generation: a WAL restarted after a checkpoint is rewritten from
    its start with new salts, and the older frames after the new ones no longer count), or None
    if there is no WAL. Read from the file itself, not the `-shm` wal-index, which a database
    in exclusive locking mode keeps in memory; `known` frames with the same `salts` were counted
    by the previous call, so only the frame headers after them are read."""
    try:
        with open(wal, "rb") as f:
            header = f.read(32)
            if len(header) < 32:
                return None
            page = struct.unpack_from(">I", header, 8)[0]
            page = 65536 if page == 1 else page
            new_salts = header[16:24]
            n = known if new_salts == salts else 0
            while True:
                f.seek(32 + n * (page + WAL_FRAME_HEADER))
                frame = f.read(WAL_FRAME_HEADER)
                if len(frame) < WAL_FRAME_HEADER or frame[8:16] != new_salts:
                    return page, n, new_salts
                n += 1
    except OSError:
        return None


def file_sizes(data: Path) -> dict[str, int]:
    """Size of every regular file under the data dir (relative path -> bytes)."""
    out = {}
    for top, _, files in os.walk(data):  # errors (a pod's directory removed meanwhile) skipped
        for name in files:
            path = os.path.join(top, name)
            with contextlib.suppress(OSError):  # removed meanwhile
                out[os.path.relpath(path, data)] = os.stat(path).st_size
    return out


@dataclass
class _Wal:
    salts: bytes = b""
    mx_frame: int = 0
    frames: int = 0  # appended since the probe started
    bytes: int = 0


@dataclass
class Totals:
    """Counters since the probe started; `Probe.snapshot()` copies them at a phase boundary."""

    io: dict[str, int] | None
    wal_bytes: dict[str, int]
    wal_frames: dict[str, int]
    growth: int  # Σ positive growth of the data dir's files between samples
    sizes: dict[str, int]
    at: float


@dataclass
class Probe:
    """Samples the server's disk counters every SAMPLE_EVERY s in a thread."""

    pid: int
    data: Path
    wal: dict[str, _Wal] = field(default_factory=dict)
    growth: int = 0
    wal_max: dict[str, int] = field(default_factory=dict)
    _sizes: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self.wal = {name: _Wal() for name in DATABASES}
        self._sample(first=True)
        self._thread = threading.Thread(target=self._run, name="disk-probe", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY):
            self._sample()

    def _sample(self, *, first: bool = False) -> None:
        with self._lock:
            for name, rel in DATABASES.items():
                w = self.wal[name]
                idx = wal_frames(self.data / (rel + "-wal"), w.salts, w.mx_frame)
                if idx is None:
                    continue
                page, mx_frame, salts = idx
                if not first:
                    # Same salts: the WAL grew by the new frames. New salts: it was restarted
                    # from its start after a checkpoint (frames written just before the restart
                    # and after the last sample are missed; sampling often keeps that small).
                    new = mx_frame - w.mx_frame if salts == w.salts else mx_frame
                    w.frames += max(0, new)
                    w.bytes += max(0, new) * (page + WAL_FRAME_HEADER)
                w.salts, w.mx_frame = salts, mx_frame
            sizes = file_sizes(self.data)
            if not first:
                self.growth += sum(
                    max(0, size - self._sizes.get(path, 0)) for path, size in sizes.items()
                )
            self._sizes = sizes
            for path, size in sizes.items():
                if path.endswith("-wal"):
                    self.wal_max[path] = max(self.wal_max.get(path, 0), size)

    def snapshot(self) -> Totals:
        self._sample()
        with self._lock:
            return Totals(
                io=proc_io(self.pid),
                wal_bytes={k: w.bytes for k, w in self.wal.items()},
                wal_frames={k: w.frames for k, w in self.wal.items()},
                growth=self.growth,
                sizes=dict(self._sizes),
                at=time.monotonic(),
            )

    def reset_wal_max(self) -> None:
        with self._lock:
            self.wal_max = {p: s for p, s in self._sizes.items() if p.endswith("-wal")}


# ---------------------------------------------------------------------------------- server
def metrics(client: httpx.Client, url: str) -> dict[str, float]:
    """The unlabelled samples (and histogram counts) of the server's /metrics."""
    r = client.get(url + "/metrics")
    if r.status_code != 200:
        raise BenchError(f"GET /metrics: {r.status_code} {r.text[:200]}")
    out: dict[str, float] = {}
    for line in r.text.splitlines():
        if line.startswith("#") or "{" in line:
            continue
        name, _, value = line.partition(" ")
        with contextlib.suppress(ValueError):
            out[name] = float(value)
    return out


def key_group(key: str) -> str:
    """/registry/core/pods/default/x -> core/pods; /orchestrator/tokens/x -> orchestrator/tokens."""
    parts = key.strip("/").split("/")
    if parts[0] == "registry" and len(parts) >= 3:
        return f"{parts[1]}/{parts[2]}"
    return "/".join(parts[:2])


def writes_by_key(store_db: Path, revisions: tuple[int, int]) -> dict[str, int]:
    """Keys written in revisions (first, last] per key group, from the store's history table
    (read with a read-only connection once the phases are over, so it cannot disturb them)."""
    first, last = revisions
    conn = sqlite3.connect(f"file:{store_db}?mode=ro", uri=True, timeout=5)
    try:
        rows = conn.execute(
            "SELECT key FROM history WHERE id >= ? AND id < ?",
            ((first + 1) << 8, (last + 1) << 8),
        ).fetchall()
    finally:
        conn.close()
    return dict(Counter(key_group(str(r[0])) for r in rows).most_common())


# ---------------------------------------------------------------------------------- phases
def per_hour(value: float, seconds: float) -> float:
    return value * 3600.0 / seconds


def phase_result(
    probe: Probe, before: Totals, after: Totals, m0: dict[str, float], m1: dict[str, float]
) -> Obj:
    window = after.at - before.at
    wal = {k: after.wal_bytes[k] - before.wal_bytes[k] for k in DATABASES}
    frames = {k: after.wal_frames[k] - before.wal_frames[k] for k in DATABASES}
    fallback = sum(wal.values()) + (after.growth - before.growth)
    out: Obj = {"window_s": round(window, 1)}
    if before.io is not None and after.io is not None:
        io = {k: after.io[k] - before.io[k] for k in after.io}
        out["io_source"] = "proc"
        out["write_bytes"] = io["write_bytes"]
        out["wchar"] = io["wchar"]
        out["write_syscalls_per_s"] = round(io["syscw"] / window, 2)
    else:
        out["io_source"] = "files"
        out["write_bytes"] = fallback
    out["bytes_per_hour"] = round(per_hour(out["write_bytes"], window))
    out["wal_bytes_per_hour"] = {k: round(per_hour(v, window)) for k, v in wal.items()}
    out["wal_bytes"] = wal
    out["wal_frames"] = frames
    out["file_growth_bytes"] = after.growth - before.growth

    def delta(name: str) -> float:
        return m1.get(name, 0.0) - m0.get(name, 0.0)

    out["raft_fsyncs_per_s"] = round(delta("raft_wal_fsync_duration_seconds_count") / window, 3)
    out["revisions_per_s"] = round(delta("store_revision") / window, 3)
    out["raft_entries_per_s"] = round(delta("raft_applied_index") / window, 3)
    out["compactions"] = int(delta("store_compactions_total"))
    out["wal_max_bytes"] = dict(sorted(probe.wal_max.items()))
    out["db_bytes_end"] = {
        k: after.sizes.get(rel, 0) for k, rel in DATABASES.items() if rel in after.sizes
    }
    out["_revisions"] = (int(m0.get("store_revision", 0)), int(m1.get("store_revision", 0)))
    return out


def per_key_write(phase: Obj, revisions: tuple[int, int]) -> Obj:
    """Bytes written per key written in a phase: the process's `write_bytes`, and the WAL
    frames of each database, divided by the keys the phase wrote (history rows; the revision
    count if a compaction removed some of them), None when no key was written. `other` is what
    the WAL frames do not explain: checkpoints copying pages into the database files, WAL pages
    written again after an fsync (a frame is not page-aligned, so each fsynced commit rewrites
    the page its predecessor ended in), the wal-index, the log."""
    keys = max(sum(phase["writes_by_key"].values()), revisions[1] - revisions[0])
    if keys == 0:
        return {"key_writes": 0, "bytes_per_key_write": None, "bytes_per_key_write_by_db": None}
    wal = phase["wal_bytes"]
    by_db: Obj = {db: round(wal[db] / keys) for db in DATABASES}
    by_db["other"] = round((phase["write_bytes"] - sum(wal.values())) / keys)
    return {
        "key_writes": keys,
        "bytes_per_key_write": round(phase["write_bytes"] / keys),
        "bytes_per_key_write_by_db": by_db,
    }


def measure(probe: Probe, client: httpx.Client, url: str, seconds: float, work: Any) -> Obj:
    """Run `work(seconds)` (or sleep) between two snapshots of the counters."""
    probe.reset_wal_max()
    m0 = metrics(client, url)
    before = probe.snapshot()
    extra = work(seconds) if work is not None else (time.sleep(seconds) or {})
    after = probe.snapshot()
    m1 = metrics(client, url)
    out = phase_result(probe, before, after, m0, m1)
    out.update(extra)
    return out


def pod(name: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "churn"}},
        "spec": {"containers": [{"name": "c", "image": "nginx:1.26"}]},
    }


def running(client: httpx.Client, url: str) -> int:
    items = client.get(url + PODS_PATH, params={"labelSelector": "app=churn"}).json()["items"]
    return sum((p.get("status") or {}).get("phase") == "Running" for p in items)


class Churn:
    """Keep `pods` pods: each second create one and delete the oldest."""

    def __init__(self, client: httpx.Client, url: str, pods: int) -> None:
        self.client, self.url, self.pods = client, url, pods
        self.next = 0
        self.live: list[str] = []

    def create(self) -> None:
        name = f"churn-{self.next}"
        self.next += 1
        r = self.client.post(self.url + PODS_PATH, json=pod(name))
        if r.status_code != 201:
            raise BenchError(f"creating pod {name}: {r.status_code} {r.text[:300]}")
        self.live.append(name)

    def delete_oldest(self) -> None:
        name = self.live.pop(0)
        r = self.client.delete(f"{self.url}{PODS_PATH}/{name}")
        if r.status_code not in (200, 202, 404):
            raise BenchError(f"deleting pod {name}: {r.status_code} {r.text[:300]}")

    def warm_up(self) -> None:
        for _ in range(self.pods):
            self.create()
        wait_for(
            lambda: running(self.client, self.url) >= self.pods or None,
            f"{self.pods} pods Running",
            120,
            0.5,
        )

    def run(self, seconds: float) -> Obj:
        t0 = time.monotonic()
        created = late = 0
        tick = t0
        while tick - t0 < seconds:
            self.create()
            self.delete_oldest()
            created += 1
            tick += 1.0
            pause = tick - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            else:
                late += 1
        return {
            "pods": self.pods,
            "pods_created": created,
            "ticks_late": late,
            "running_at_end": running(self.client, self.url),
        }


# ---------------------------------------------------------------------------------- main
def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def print_table(r: Obj) -> None:
    phases = [p for p in ("idle", "churn") if p in r]
    rows: list[tuple[str, ...]] = [("MEASURE", *(p.upper() for p in phases))]

    def row(label: str, fn: Any) -> None:
        rows.append((label, *(fn(r[p]) for p in phases)))

    row("window", lambda p: f"{p['window_s']} s")
    row("bytes written per hour", lambda p: fmt_bytes(p["bytes_per_hour"]))
    row("  source", lambda p: p["io_source"])
    for db in DATABASES:
        row(
            f"  {db}.db WAL frames per hour",
            lambda p, db=db: fmt_bytes(p["wal_bytes_per_hour"][db]),
        )
    row("key writes", lambda p: str(p["key_writes"]))
    row(
        "bytes per key write",
        lambda p: "-" if p["bytes_per_key_write"] is None else fmt_bytes(p["bytes_per_key_write"]),
    )
    for part in (*DATABASES, "other"):
        label = f"  {part}.db WAL" if part != "other" else "  other (checkpoints, re-dirtied)"
        row(
            label,
            lambda p, part=part: (
                "-"
                if p["bytes_per_key_write_by_db"] is None
                else fmt_bytes(p["bytes_per_key_write_by_db"][part])
            ),
        )
    row("write syscalls per s", lambda p: str(p.get("write_syscalls_per_s", "n/a")))
    row("Raft fsyncs per s", lambda p: str(p["raft_fsyncs_per_s"]))
    row("Raft entries per s", lambda p: str(p["raft_entries_per_s"]))
    row("store revisions per s", lambda p: str(p["revisions_per_s"]))
    row("compactions", lambda p: str(p["compactions"]))
    row(
        "largest WAL",
        lambda p: fmt_bytes(max(p["wal_max_bytes"].values(), default=0)),
    )
    row("databases at end", lambda p: fmt_bytes(sum(p["db_bytes_end"].values())))
    row(
        "keys written (top 3)",
        lambda p: ", ".join(f"{k} {v}" for k, v in list(p["writes_by_key"].items())[:3]) or "-",
    )
    widths = [max(len(x[i]) for x in rows) for i in range(len(rows[0]))]
    for x in rows:
        print("  ".join(c.ljust(w) for c, w in zip(x, widths, strict=True)).rstrip())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke test: 3 s phases, 3 pods")
    p.add_argument("--idle-seconds", type=float, default=120.0, help="idle window")
    p.add_argument("--churn-seconds", type=float, default=120.0, help="churn window")
    p.add_argument("--pods", type=int, default=10, help="pods kept during the churn")
    p.add_argument("--settle", type=float, default=10.0, help="seconds after READY before idle")
    p.add_argument(
        "--auto-compaction", default=None, help="passed to the server (default: its own, 5m)"
    )
    p.add_argument("--keep-data", action="store_true", help="keep the data dir and log")
    args = p.parse_args(argv)
    if args.quick:
        args.idle_seconds, args.churn_seconds, args.pods, args.settle = 3.0, 3.0, 3, 1.0
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="orch-disk-"))  # short: unix socket paths
    extra = ["--runtime", "simulated"]
    if args.auto_compaction is not None:
        extra += ["--auto-compaction", args.auto_compaction]
    result: Obj = {
        "bench": "disk",
        "quick": args.quick,
        "runtime": "simulated",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "auto_compaction": args.auto_compaction or "5m (server default)",
    }
    proc: Proc | None = None
    try:
        _, proc = cold_start(root, *extra, keep=True)
        assert proc is not None
        data = root / "data"
        client, url = admin_client(data / "kubeconfig.yaml", timeout=30)
        probe = Probe(proc.pid, data)
        with client:
            probe.start()
            try:
                time.sleep(args.settle)
                proc.check()
                result["idle"] = measure(probe, client, url, args.idle_seconds, None)
                churn = Churn(client, url, args.pods)
                churn.warm_up()
                time.sleep(1.0)
                result["churn"] = measure(probe, client, url, args.churn_seconds, churn.run)
                proc.check()
            finally:
                probe.stop()
        # After the server stopped: store.db commits its applies only every 30 s (and when it
        # closes), and a reader on another connection sees only what is committed.
        proc.stop()
        for phase in ("idle", "churn"):
            revisions = result[phase].pop("_revisions")
            result[phase]["writes_by_key"] = writes_by_key(data / "store.db", revisions)
            result[phase].update(per_key_write(result[phase], revisions))
    except (BenchError, httpx.HTTPError, OSError, sqlite3.Error) as exc:
        print(f"error: {exc}", file=sys.stderr)
        print(f"data kept in {root}", file=sys.stderr)
        if proc is not None:
            proc.stop()
        return 1
    if args.keep_data:
        print(f"data kept in {root}", file=sys.stderr)
    else:
        shutil.rmtree(root, ignore_errors=True)
    result["idle_bytes_per_hour"] = result["idle"]["bytes_per_hour"]
    result["churn_bytes_per_hour"] = result["churn"]["bytes_per_hour"]
    result["churn_bytes_per_key_write"] = result["churn"]["bytes_per_key_write"]
    result["ok"] = True
    print_table(result)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
