"""Run a cluster of real `orchestrator server` processes for tests and benchmarks.

    with Cluster(tmp_path, size=3, tick_ms=50) as cluster:
        cluster.start()
        leader = await cluster.wait_leader()       # in a trio task
        cluster.kill(leader)                        # SIGKILL, like a power cut
        await cluster.wait_leader()
        cluster.restart(leader)

Each server is a separate OS process (`sys.executable -m orchestrator server ...`) listening on
loopback ports allocated here; its stdout/stderr go to `<data dir>/server.log` (appended across
restarts, with a marker line per start). Servers are addressed by their index in
`cluster.servers` (0-based); server `i` has Raft node id `i + 1`.

The servers run mutual TLS on their peer and client ports with the CA derived from
`CLUSTER_TOKEN`; `cluster.tls` (`admin_tls()`) is an admin client context for that CA, for
`StoreClient(..., tls=cluster.tls)`; `raw_request` uses it unless told otherwise.

The waiting helpers are async (trio) and poll the servers' client port with a raw one-shot
status request (so they do not depend on `StoreClient`), always against a deadline, and fail fast
with the log tail if a server that should be running has exited. A plain script can drive them
with `trio.run(cluster.wait_leader)` or the `*_blocking` wrappers.

Invariants: leaving the `with` block always stops every process this object started (SIGTERM,
then SIGKILL after a bound) and reaps it; if the block is left with an exception the server logs
are dumped to stderr first. On Linux, servers started from the main thread also get
PR_SET_PDEATHSIG, so they die with the test process even if it is SIGKILLed.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, TypeVar

import msgpack
import trio

from orchestrator.raft.framing import FrameDecoder, encode_frame

REPO_ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
CLUSTER_TOKEN = "orch-test-cluster"  # every server shares it: it unlocks the shared credentials

T = TypeVar("T")


# The embedded agent programs no pod network, node proxy or cluster DNS address on the host.
HOST_NET_OFF = ["--flannel-backend", "none", "--disable-proxy", "--dns-listen", "127.0.0.1:0"]


class ClusterError(AssertionError):
    """A condition the cluster helper waited for did not happen, or a server died."""


class ServerDied(ClusterError):
    """A server that should be running has exited."""


def free_ports(n: int) -> list[int]:
    """`n` distinct loopback ports that were free a moment ago (all bound at once, so the same
    port is never handed out twice by one call)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((HOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _set_pdeathsig() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class ServerProc:
    """One server: where it lives and, while running, its process."""

    node_id: int
    data_dir: Path
    peer_port: int
    client_port: int
    api_port: int = 0
    join: bool = False
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    expected_exit: bool = True  # False while we consider it running
    exit_codes: list[int | None] = field(default_factory=list)

    @property
    def peer_addr(self) -> str:
        return f"{HOST}:{self.peer_port}"

    @property
    def endpoint(self) -> str:
        return f"{HOST}:{self.client_port}"

    @property
    def api_addr(self) -> str:
        return f"{HOST}:{self.api_port}"

    @property
    def kubeconfig(self) -> Path:
        return self.data_dir / "kubeconfig.yaml"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "server.log"


@functools.cache
def admin_tls(token: str = CLUSTER_TOKEN) -> ssl.SSLContext:
    """An admin client context for the servers of `token`: its derived CA, and a certificate
    issued here (in a temporary directory), as a server issues its own `pki/admin.crt`."""
    import tempfile

    from orchestrator.security.peercerts import ensure_admin_cert, ensure_cluster_ca
    from orchestrator.store.client import ClientTLS

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ensure_cluster_ca(root, token)
        ensure_admin_cert(root)
        return ClientTLS.from_data_dir(root).context()  # the files are read by now


async def raw_request(
    endpoint: str, op: str, *args: Any, within: float = 2.0, tls: ssl.SSLContext | None = None
) -> tuple[str, Any]:
    """One request on a fresh connection to a server's client port: (status, value).

    Raises OSError if the server cannot be reached or closes the connection, and
    trio.TooSlowError after `within` seconds."""
    host, _, port = endpoint.rpartition(":")
    with trio.fail_after(within):
        sock = await trio.open_tcp_stream(host, int(port))
        stream = trio.SSLStream(sock, tls or admin_tls(), server_hostname=None)
        async with stream:
            try:
                await stream.send_all(encode_frame(msgpack.packb([1, op, list(args)])))
                decoder = FrameDecoder(64 << 20)
                while True:
                    data = await stream.receive_some(65536)
                    if not data:
                        raise ConnectionResetError(f"{endpoint} closed the connection")
                    frames = decoder.receive_data(data)
                    if frames:
                        _rid, status, value = msgpack.unpackb(frames[0], strict_map_key=False)
                        return str(status), value
            except trio.BrokenResourceError as exc:  # a reset (e.g. a draining server's close)
                raise ConnectionResetError(f"{endpoint} reset the connection") from exc


class Cluster:
    """N server processes on loopback. See the module docstring."""

    def __init__(
        self,
        root: Path,
        size: int = 3,
        *,
        tick_ms: int = 50,
        election_ticks: int = 10,
        snapshot_every: int | None = None,
        keep_tail: int | None = None,
        log_level: str = "info",
        extra_args: Sequence[str] = (),
        stop_timeout: float = 5.0,
        api: bool = True,
        agent: bool = False,
    ) -> None:
        if size < 1:
            raise ValueError("a cluster needs at least one server")
        self.root = Path(root)
        self.tick_ms = tick_ms
        self.election_ticks = election_ticks
        self.snapshot_every = snapshot_every
        self.keep_tail = keep_tail
        self.log_level = log_level
        self.extra_args = list(extra_args)
        self.stop_timeout = stop_timeout
        self.api = api  # serve the Kubernetes API (False: store-only servers)
        self.agent = agent  # run each server's embedded node agent (off: no runtime needed)
        ports = free_ports(3 * size)
        self.servers: list[ServerProc] = [
            ServerProc(
                i + 1, self.root / f"n{i + 1}", ports[3 * i], ports[3 * i + 1], ports[3 * i + 2]
            )
            for i in range(size)
        ]
        self.initial_cluster = ",".join(f"{s.node_id}={s.peer_addr}" for s in self.servers)
        self.tls = admin_tls()

    # ------------------------------------------------------------------ addresses
    @property
    def endpoints(self) -> list[str]:
        """Client addresses of every server (running or not), in index order."""
        return [s.endpoint for s in self.servers]

    def endpoint(self, i: int) -> str:
        return self.servers[i].endpoint

    def peer_addr(self, i: int) -> str:
        return self.servers[i].peer_addr

    def node_id(self, i: int) -> int:
        return self.servers[i].node_id

    def index_of(self, node_id: int) -> int:
        for i, s in enumerate(self.servers):
            if s.node_id == node_id:
                return i
        raise KeyError(f"no server with node id {node_id}")

    # ------------------------------------------------------------------ processes
    def argv(self, i: int) -> list[str]:
        s = self.servers[i]
        argv = [
            sys.executable,
            "-m",
            "orchestrator",
            "--log-level",
            self.log_level,
            "--log-format",  # people read these logs (the tail is shown when a test fails)
            "text",
            "server",
            "--data-dir",
            str(s.data_dir),
            "--node-id",
            str(s.node_id),
            "--peer-listen",
            s.peer_addr,
            "--client-listen",
            s.endpoint,
            "--listen",
            s.api_addr if self.api else "none",
            "--token",
            CLUSTER_TOKEN,
            *(["--kubelet-port", "0"] if self.agent else ["--no-agent"]),  # servers share a host
            # should `auto` find a containerd, the host's network still stays as it is
            *(HOST_NET_OFF if self.agent else []),
            "--tick-ms",
            str(self.tick_ms),
            "--election-ticks",
            str(self.election_ticks),
        ]
        if s.join:
            argv.append("--join")
        else:
            argv += ["--initial-cluster", self.initial_cluster]
        if self.snapshot_every is not None:
            argv += ["--snapshot-every", str(self.snapshot_every)]
        if self.keep_tail is not None:
            argv += ["--keep-tail", str(self.keep_tail)]
        return argv + self.extra_args

    def start(self) -> Cluster:
        """Start every server that is not running."""
        for i in range(len(self.servers)):
            if not self.is_running(i):
                self.start_server(i)
        return self

    def start_server(self, i: int) -> None:
        s = self.servers[i]
        if self.is_running(i):
            raise ClusterError(f"server {i} (node {s.node_id}) is already running")
        s.data_dir.mkdir(parents=True, exist_ok=True)
        argv = self.argv(i)
        s.starts += 1
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        with open(s.log_path, "ab") as logf:
            logf.write(f"=== start #{s.starts} at {time.time():.3f}: {' '.join(argv)}\n".encode())
            logf.flush()
            # PR_SET_PDEATHSIG fires when the forking *thread* exits, so only use it from the
            # main thread (a worker thread would take the server down with it).
            main = threading.current_thread() is threading.main_thread()
            s.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                cwd=REPO_ROOT,
                env=env,
                start_new_session=True,  # a ^C in the terminal is for the test runner only
                preexec_fn=_set_pdeathsig if (main and sys.platform == "linux") else None,
            )
        s.expected_exit = False

    def restart(self, i: int) -> None:
        """Start server `i` again with the same data directory and ports."""
        self.start_server(i)

    def add_server(self, *, join: bool = True, start: bool = True) -> int:
        """A new server (next node id, fresh ports); started with `--join` by default.
        Returns its index. Adding it to the Raft membership is up to the caller."""
        peer, client, api = free_ports(3)
        node_id = max(s.node_id for s in self.servers) + 1
        self.servers.append(
            ServerProc(node_id, self.root / f"n{node_id}", peer, client, api, join=join)
        )
        i = len(self.servers) - 1
        if start:
            self.start_server(i)
        return i

    def is_running(self, i: int) -> bool:
        p = self.servers[i].proc
        return p is not None and p.poll() is None

    def running(self) -> list[int]:
        return [i for i in range(len(self.servers)) if self.is_running(i)]

    def pid(self, i: int) -> int | None:
        p = self.servers[i].proc
        return p.pid if p is not None and p.poll() is None else None

    def kill(self, i: int, sig: int = signal.SIGKILL, *, wait: float = 10.0) -> int | None:
        """Send `sig` to server `i` and wait (up to `wait` s) for it to exit; returns its exit
        status (None if it is still running, e.g. for a signal it handles slowly)."""
        s = self.servers[i]
        if s.proc is None:
            return None
        s.expected_exit = True
        if s.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                s.proc.send_signal(sig)
        try:
            code = s.proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            return None
        s.exit_codes.append(code)
        return code

    def stop(self, i: int) -> int | None:
        """SIGTERM, then SIGKILL if it has not exited within `stop_timeout`."""
        code = self.kill(i, signal.SIGTERM, wait=self.stop_timeout)
        if code is None and self.servers[i].proc is not None:
            code = self.kill(i, signal.SIGKILL)
        return code

    def stop_all(self) -> None:
        """SIGTERM to every running server, then SIGKILL whatever is left after
        `stop_timeout` seconds; every process is reaped."""
        procs = [s for s in self.servers if s.proc is not None and s.proc.returncode is None]
        for s in procs:
            s.expected_exit = True
            if s.proc is not None and s.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    s.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout
        for s in procs:
            assert s.proc is not None
            try:
                s.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    s.proc.kill()
                s.proc.wait()
            s.exit_codes.append(s.proc.returncode)

    def unexpected_exits(self) -> list[tuple[int, int | None]]:
        """(index, exit status) of servers that exited although nobody stopped them."""
        out = []
        for i, s in enumerate(self.servers):
            if s.proc is not None and not s.expected_exit and s.proc.poll() is not None:
                out.append((i, s.proc.returncode))
        return out

    def check_alive(self) -> None:
        """Raise ServerDied (with the log tail) if a server exited unexpectedly."""
        dead = self.unexpected_exits()
        if dead:
            tails = "\n".join(self.log_tail(i, 40) for i, _ in dead)
            raise ServerDied(f"server(s) exited unexpectedly (index, status): {dead}\n{tails}")

    def cpu_seconds(self, i: int) -> float | None:
        """User + system CPU time of server `i` so far (Linux /proc), None if unknown."""
        pid = self.pid(i)
        return None if pid is None else process_cpu_seconds(pid)

    # ------------------------------------------------------------------ logs
    def log_text(self, i: int) -> str:
        try:
            return self.servers[i].log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, i: int, lines: int = 200) -> str:
        s = self.servers[i]
        body = "\n".join(self.log_text(i).splitlines()[-lines:])
        return f"----- server {i} (node {s.node_id}) log {s.log_path} -----\n{body}"

    def dump_logs(self, out: IO[str] | None = None, lines: int = 200) -> None:
        out = out if out is not None else sys.stderr
        for i in range(len(self.servers)):
            print(self.log_tail(i, lines), file=out)
        out.flush()

    # ------------------------------------------------------------------ context manager
    def __enter__(self) -> Cluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.stop_all()
        finally:
            if exc_type is not None:
                self.dump_logs()

    # ------------------------------------------------------------------ async observation
    async def status(self, i: int, *, within: float = 2.0) -> dict[str, Any] | None:
        """Server i's Raft status, or None if it is not reachable right now."""
        try:
            st, value = await raw_request(self.endpoint(i), "status", within=within)
        except (OSError, trio.TooSlowError, ValueError):
            return None
        return dict(value) if st == "ok" else None

    async def statuses(self, indices: Iterable[int] | None = None) -> dict[int, dict[str, Any]]:
        """Status of every reachable server among `indices` (default: the running ones)."""
        idx = list(self.running() if indices is None else indices)
        out: dict[int, dict[str, Any]] = {}

        async def one(i: int) -> None:
            st = await self.status(i)
            if st is not None:
                out[i] = st

        async with trio.open_nursery() as nursery:
            for i in idx:
                nursery.start_soon(one, i)
        return out

    async def leader_index(self) -> int | None:
        """Index of the current leader: a running server that says it leads, with the highest
        term any running server reports. None if there is no such server right now."""
        sts = await self.statuses()
        if not sts:
            return None
        top = max(st["term"] for st in sts.values())
        for i, st in sts.items():
            if st["role"] == "leader" and st["term"] == top:
                return i
        return None

    async def wait_until(
        self,
        predicate: Callable[[], Awaitable[T | None]],
        *,
        within: float,
        what: str,
        interval: float = 0.05,
    ) -> T:
        """Poll `predicate` until it returns something other than None/False; raise
        ClusterError after `within` seconds, ServerDied as soon as a server dies."""
        deadline = trio.current_time() + within
        while True:
            self.check_alive()
            value = await predicate()
            if value is not None and value is not False:
                return value
            if trio.current_time() >= deadline:
                raise ClusterError(f"timed out after {within:.1f}s waiting for {what}")
            await trio.sleep(interval)

    async def wait_api(self, i: int, *, within: float = 30.0) -> Path:
        """Until server i's Kubernetes API listens (it writes its kubeconfig then)."""

        async def written() -> Path | None:
            path = self.servers[i].kubeconfig
            return path if path.exists() else None

        return await self.wait_until(written, within=within, what=f"server {i}'s API")

    async def wait_ready(self, i: int, *, within: float = 20.0) -> dict[str, Any]:
        """Until server i answers a status request."""

        async def ready() -> dict[str, Any] | None:
            if not self.is_running(i):
                raise ServerDied(f"server {i} is not running\n{self.log_tail(i, 40)}")
            return await self.status(i)

        return await self.wait_until(ready, within=within, what=f"server {i} to answer")

    async def wait_leader(self, *, within: float = 20.0, exclude: Iterable[int] = ()) -> int:
        """Until some running server (not in `exclude`) is the leader; returns its index."""
        excluded = set(exclude)

        async def leader() -> int | None:
            i = await self.leader_index()
            return i if i is not None and i not in excluded else None

        return await self.wait_until(leader, within=within, what="a leader")

    async def wait_caught_up(self, i: int, *, within: float = 30.0) -> dict[str, Any]:
        """Until server i has applied everything the leader had committed and applied (call it
        once writes have stopped). Returns server i's status."""

        async def caught_up() -> dict[str, Any] | None:
            lead = await self.leader_index()
            if lead is None:
                return None
            ls, st = await self.status(lead), await self.status(i)
            if ls is None or st is None:
                return None
            ok = st["applied"] >= ls["commit"] and st["applied"] == ls["applied"]
            return st if ok else None

        return await self.wait_until(caught_up, within=within, what=f"server {i} to catch up")

    # ------------------------------------------------------------------ for plain scripts
    def wait_leader_blocking(self, within: float = 20.0) -> int:
        """`wait_leader` for code that is not running inside trio."""
        return trio.run(lambda: self.wait_leader(within=within))

    def status_blocking(self, i: int) -> dict[str, Any] | None:
        return trio.run(lambda: self.status(i))


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a live process, from /proc (None where unavailable)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()  # skip "pid (comm) " - comm may contain spaces
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


async def check_reads(
    kv: Any,  # a StoreClient
    acked: dict[str, bytes],
    indeterminate: dict[str, bytes],
    *,
    stale_endpoint: str | None = None,
) -> None:
    """Every acknowledged key reads back its value; an indeterminate one reads back its value or
    nothing (keys are unique, so no other value is possible). Linearizable reads through the
    leader unless `stale_endpoint` is given, then local reads on that server."""
    bad: list[tuple[str, bytes | None, bytes | None]] = []
    limiter = trio.CapacityLimiter(32)

    async def one(key: str, value: bytes, must: bool) -> None:
        async with limiter:
            if stale_endpoint is None:
                got = await kv.get(key)
            else:
                raw = await kv.call_once(stale_endpoint, "get", key, False)
                got = None if raw is None else bytes(raw)
        if got != value and (must or got is not None):
            bad.append((key, value if must else None, got))

    async with trio.open_nursery() as nursery:
        for key, value in acked.items():
            nursery.start_soon(one, key, value, True)
        for key, value in indeterminate.items():
            nursery.start_soon(one, key, value, False)
    where = stale_endpoint or "the leader (linearizable)"
    assert not bad, f"{len(bad)} wrong reads on {where}, e.g. (key, expected, got): {bad[:5]}"
