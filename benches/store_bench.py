"""Store benchmark: puts/s, put latency and watch delivery latency, on real processes; vs etcd.

    python benches/store_bench.py --servers 1,3 --concurrency 1,64,512 --duration 10 \\
        [--client-procs 4] [--value-bytes 1024] [--vs-etcd [--etcd-client grpc,http]] \\
        [--no-watch] [--profile 3:512] [--keep-data]

Ours: for each cluster size a fresh cluster of `orchestrator server` processes is started on
loopback (tests/cluster.py; Raft over SQLite with fsync on). For each concurrency,
`--client-procs` separate Python processes (this file with `--worker`) share the concurrency:
every task puts `--value-bytes` values to distinct keys under a per-point prefix, back to back,
for `--duration` seconds, through `StoreClient` given the leader's endpoint first (it sticks to
the first server that answers; a follower would forward every write to the leader, an extra hop;
`--write-to spread` measures that, for both systems). At the same time a
watcher process (its own `StoreClient.watch` on the prefix, connected to a follower when there is
one, else to the only server) receives every event.

TLS on both sides, on equal terms: our servers run mutual TLS on their peer and client ports (as
every server does), and the writers and the watcher connect with the admin certificate of the
cluster (`--tls-dir`: a data dir whose `pki/` holds ca.crt and admin.crt/key). etcd runs with
TLS on its peer and client URLs and client certificates required on both
(`--peer-client-cert-auth --client-cert-auth`), certificates from a CA made by the bench in the
same layout, and its grpc and http clients present a client certificate.

etcd (`--vs-etcd`): a 3-member cluster of the system's `etcd` binary (data dirs in the temp dir,
loopback ports, default settings: WAL fsync on, 100 ms heartbeat, 1 s election) is loaded with the
same pattern, writers talking to the leader, the watcher to a follower, through one of:
  grpc  etcd's native API (what etcd's own clients use): grpcio with hand-encoded protobuf
        (PutRequest / WatchRequest are a few fields; no generated stubs needed); one HTTP/2
        channel per client process, asyncio.
  http  etcd's gRPC gateway (HTTP JSON, POST /v3/kv/put and the /v3/watch stream, base64 key
        and value): one HTTP/1.1 keep-alive connection per task, a minimal raw HTTP client on
        trio. (httpx was tried first: about 3 ms of client CPU per request on trio, i.e. the
        client was the bottleneck; the raw client costs ~45 us.) The gateway transcodes JSON to
        gRPC inside etcd, which costs etcd CPU, so this flatters us; the headline ratio is
        therefore against grpc.
Both clusters of the same size run side by side and the points alternate (ours, then etcd, at
each concurrency), so that a change in background load does not land on one system only. Each
cluster keeps its data from point to point (as a real store would), so later points run against
a bigger store.

Measures. A put counts when it is acknowledged within the window; its latency is send -> ack.
Watch delivery latency: each value starts with the writer's CLOCK_MONOTONIC time taken just
before it sent the put (system-wide on Linux, so comparable across processes); the watcher
records, for every event whose put started in the window, receive time - that start time (so it
includes the put's own commit latency). The watcher listens `--watch-grace` s past the window;
"watch events" is how many in-window events it saw (>= puts acked in the window when nothing is
lost, since puts started in the window but acked after it count too). CPU: client = the writer
processes' user+sys seconds over their run, watcher = the watcher process's, server = the sum
over all server processes sampled around the window (/proc); "srv us/put" = server CPU per
acknowledged put, "box %" = all of these over the machine's CPU capacity in the window: near
100 % means the machine, not one side, is the limit. Nothing is asserted: this is a measurement.

Shared machines: before each point the driver waits (up to `--quiet-wait` s) until the machine
is at most 25 % busy, and "oth %" reports the CPU that processes other than ours used during the
window (from /proc/stat): if it is not small, that point was disturbed.

`--profile S:C` runs `py-spy record --gil` (pip install py-spy) on our leader during point (S
servers, concurrency C), prints the leader's CPU per thread (/proc) and the top functions by
samples. `--gil` keeps only the thread holding the GIL, i.e. Python code running; py-spy's own
idle filter counts a thread blocked in fsync (state D) as busy. Work done with the GIL released
(inside SQLite) shows in the per-thread CPU, not in the samples.

Output: one line per point as it completes, a comparison table at servers=3 (ours / etcd per
concurrency, for each etcd client), and last one JSON line with every figure, including
`ratio_vs_etcd_c<C>` (puts/s ours / etcd over grpc) and `ratio_vs_etcd_<client>_c<C>`.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import trio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from benchlib import cluster_lib, cpu_self, machine_cpu, percentile, wait_quiet  # noqa: E402  (path set above)

STAMP_LEN = 24  # "%023.9f " of CLOCK_MONOTONIC; a multiple of 3, so base64 splits cleanly
STAMP_B64 = STAMP_LEN * 4 // 3


def _stamp() -> tuple[float, bytes]:
    now = time.monotonic()
    return now, b"%023.9f " % now


def _pad(value_bytes: int) -> bytes:
    return b"v" * max(0, value_bytes - STAMP_LEN)


def _prefix_end(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])


# ---------------------------------------------------------------------------------- protobuf
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _pb_len(field: int, data: bytes) -> bytes:
    return _varint((field << 3) | 2) + _varint(len(data)) + data


def _pb_fields(buf: bytes) -> list[tuple[int, Any]]:
    """(field number, value) pairs of one protobuf message (varints as int, the rest bytes)."""
    out: list[tuple[int, Any]] = []
    i, n = 0, len(buf)
    while i < n:
        key = shift = 0
        while True:
            b = buf[i]
            i += 1
            key |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                break
        field, wire = key >> 3, key & 7
        if wire == 0:
            v = shift = 0
            while True:
                b = buf[i]
                i += 1
                v |= (b & 0x7F) << shift
                shift += 7
                if b < 0x80:
                    break
            out.append((field, v))
        elif wire == 2:
            ln = shift = 0
            while True:
                b = buf[i]
                i += 1
                ln |= (b & 0x7F) << shift
                shift += 7
                if b < 0x80:
                    break
            out.append((field, buf[i : i + ln]))
            i += ln
        elif wire == 1:
            out.append((field, buf[i : i + 8]))
            i += 8
        elif wire == 5:
            out.append((field, buf[i : i + 4]))
            i += 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
    return out


def _watch_response_stamps(msg: bytes) -> tuple[bool, list[float]]:
    """etcdserverpb.WatchResponse -> (canceled, the stamps of its events' values)."""
    canceled = False
    stamps: list[float] = []
    for field, v in _pb_fields(msg):
        if field == 4 and v:  # canceled
            canceled = True
        elif field == 11:  # events: Event{type=1, kv=2{..., value=5}, prev_kv=3}
            for f2, kv in _pb_fields(v):
                if f2 == 2:
                    for f3, value in _pb_fields(kv):
                        if f3 == 5:
                            stamps.append(float(value[: STAMP_LEN - 1]))
    return canceled, stamps


# ---------------------------------------------------------------------------------- HTTP/1.1
class _Http:
    """A minimal HTTP/1.1 keep-alive client connection on trio (one request at a time)."""

    def __init__(self, stream: trio.abc.Stream, host: str) -> None:
        self.stream = stream
        self.host = host.encode()
        self.buf = b""

    @classmethod
    async def connect(cls, endpoint: str, tls: ssl.SSLContext) -> _Http:
        host, _, port = endpoint.rpartition(":")
        sock = await trio.open_tcp_stream(host, int(port))
        stream = trio.SSLStream(sock, tls, server_hostname=None)
        await stream.do_handshake()
        return cls(stream, host)

    async def _fill(self) -> None:
        data = await self.stream.receive_some(65536)
        if not data:
            raise ConnectionResetError("server closed the connection")
        data = bytes(data)
        self.buf += data

    async def send(self, path: str, body: bytes) -> None:
        await self.stream.send_all(
            b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (path.encode(), self.host, len(body), body)
        )

    async def head(self) -> tuple[int, bool, int]:
        """(status, chunked, content length) of the next response."""
        while b"\r\n\r\n" not in self.buf:
            await self._fill()
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        chunked, length = False, 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        return status, chunked, length

    async def chunk(self) -> bytes:
        """The next chunk of a chunked body (b"" at its end)."""
        while b"\r\n" not in self.buf:
            await self._fill()
        line, _, self.buf = self.buf.partition(b"\r\n")
        size = int(line.split(b";")[0], 16)
        while len(self.buf) < size + 2:
            await self._fill()
        data, self.buf = self.buf[:size], self.buf[size + 2 :]
        if size == 0:  # no trailers from etcd
            return b""
        return data

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        await self.send(path, body)
        status, chunked, length = await self.head()
        if chunked:
            parts = []
            while part := await self.chunk():
                parts.append(part)
            return status, b"".join(parts)
        while len(self.buf) < length:
            await self._fill()
        data, self.buf = self.buf[:length], self.buf[length:]
        return status, data


# ---------------------------------------------------------------------------------- workers
class _Tally:
    """Put outcomes of one writer process inside the measured window."""

    def __init__(self, start_at: float, duration: float) -> None:
        self.start_at = start_at
        self.t_end = start_at + duration
        self.latencies: list[float] = []
        self.ok = 0
        self.errors = 0
        self.first_error = ""
        self.cpu0 = 0.0
        self.late_s = 0.0

    def begin(self) -> None:
        self.late_s = max(0.0, time.monotonic() - self.start_at)
        self.cpu0 = cpu_self()

    def done(self, t0: float) -> None:
        t1 = time.monotonic()
        if t1 <= self.t_end:
            self.ok += 1
            self.latencies.append((t1 - t0) * 1000.0)

    def error(self, exc: BaseException) -> None:
        self.errors += 1
        if not self.first_error:
            self.first_error = repr(exc)[:300]

    def result(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "errors": self.errors,
            "first_error": self.first_error,
            "cpu_s": cpu_self() - self.cpu0,
            "late_s": self.late_s,
            "latencies_ms": self.latencies,
        }


class _WatchTally:
    def __init__(self, start_at: float, duration: float) -> None:
        self.start_at = start_at
        self.t_end = start_at + duration
        self.latencies: list[float] = []
        self.other = 0
        self.cpu0 = cpu_self()

    def seen(self, stamps: list[float]) -> None:
        now = time.monotonic()
        for s in stamps:
            if self.start_at <= s <= self.t_end:
                self.latencies.append((now - s) * 1000.0)
            else:
                self.other += 1

    def result(self) -> dict[str, Any]:
        return {
            "events": len(self.latencies),
            "other_events": self.other,
            "cpu_s": cpu_self() - self.cpu0,
            "latencies_ms": self.latencies,
        }


def _client_tls(args: argparse.Namespace) -> ssl.SSLContext:
    """The admin client context of `--tls-dir` (TLS 1.3, server verified against the CA)."""
    from orchestrator.store.client import ClientTLS

    return ClientTLS.from_data_dir(args.tls_dir).context()


def _client_tls_any(args: argparse.Namespace) -> ssl.SSLContext:
    """`_client_tls` for etcd's HTTP gateway: ALPN http/1.1 (its port also serves gRPC over
    HTTP/2), TLS 1.2 allowed (etcd picks 1.3 anyway when offered)."""
    ctx = _client_tls(args)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def _grpc_credentials(args: argparse.Namespace) -> Any:
    import grpc

    pki = Path(args.tls_dir) / "pki"
    return grpc.ssl_channel_credentials(
        root_certificates=(pki / "ca.crt").read_bytes(),
        private_key=(pki / "admin.key").read_bytes(),
        certificate_chain=(pki / "admin.crt").read_bytes(),
    )


async def _ours_put(args: argparse.Namespace) -> dict[str, Any]:
    from orchestrator.store.client import ClientError, StoreClient
    from orchestrator.store.types import StoreError

    pad = _pad(args.value_bytes)
    tally = _Tally(args.start_at, args.duration)
    async with StoreClient(args.endpoints.split(","), tls=_client_tls(args)) as kv:
        with trio.fail_after(30):  # connect and find the leader before the window opens
            await kv.put(f"{args.prefix}warmup", _stamp()[1] + pad)
        await trio.sleep(max(0.0, args.start_at - time.monotonic()))
        tally.begin()

        async def task(t: int) -> None:
            seq = 0
            while time.monotonic() < tally.t_end:
                key = f"{args.prefix}{t}-{seq}"
                seq += 1
                t0, stamp = _stamp()
                try:
                    await kv.put(key, stamp + pad)
                except (ClientError, StoreError) as exc:
                    tally.error(exc)
                    continue
                tally.done(t0)

        async with trio.open_nursery() as nursery:
            for t in range(args.tasks):
                nursery.start_soon(task, t)
    return tally.result()


async def _ours_watch(args: argparse.Namespace) -> dict[str, Any]:
    from orchestrator.store.client import StoreClient

    tally = _WatchTally(args.start_at, args.duration)
    async with StoreClient(args.endpoints.split(","), tls=_client_tls(args)) as kv:
        with trio.move_on_after(args.start_at + args.duration + args.grace - time.monotonic()):
            async for events, _rev in kv.watch(args.prefix):
                tally.seen([float(e.kv.value[: STAMP_LEN - 1]) for e in events])
    return tally.result()


async def _etcd_http_put(args: argparse.Namespace) -> dict[str, Any]:
    endpoint = args.endpoints.split(",")[0]
    pad_b64 = base64.b64encode(_pad(args.value_bytes))
    tally = _Tally(args.start_at, args.duration)

    def body(key: str, stamp: bytes) -> bytes:
        return b'{"key":"%s","value":"%s%s"}' % (
            base64.b64encode(key.encode()),
            base64.b64encode(stamp),
            pad_b64,
        )

    conns = []
    tls = _client_tls_any(args)
    for _ in range(args.tasks):
        conn = await _Http.connect(endpoint, tls)
        status, data = await conn.post("/v3/kv/put", body(f"{args.prefix}warmup", _stamp()[1]))
        if status != 200:
            raise RuntimeError(f"etcd gateway answered {status}: {data[:200]!r}")
        conns.append(conn)
    await trio.sleep(max(0.0, args.start_at - time.monotonic()))
    tally.begin()

    async def task(t: int, conn: _Http) -> None:
        seq = 0
        while time.monotonic() < tally.t_end:
            key = f"{args.prefix}{t}-{seq}"
            seq += 1
            t0, stamp = _stamp()
            try:
                status, data = await conn.post("/v3/kv/put", body(key, stamp))
            except OSError as exc:
                tally.error(exc)
                conn = await _Http.connect(endpoint, _client_tls_any(args))
                continue
            if status != 200:
                tally.error(RuntimeError(f"HTTP {status}: {data[:200]!r}"))
                continue
            tally.done(t0)

    async with trio.open_nursery() as nursery:
        for t, conn in enumerate(conns):
            nursery.start_soon(task, t, conn)
    return tally.result()


async def _etcd_http_watch(args: argparse.Namespace) -> dict[str, Any]:
    tally = _WatchTally(args.start_at, args.duration)
    prefix = args.prefix.encode()
    req = json.dumps(
        {
            "create_request": {
                "key": base64.b64encode(prefix).decode(),
                "range_end": base64.b64encode(_prefix_end(prefix)).decode(),
            }
        }
    ).encode()
    conn = await _Http.connect(args.endpoints.split(",")[0], _client_tls_any(args))
    with trio.move_on_after(args.start_at + args.duration + args.grace - time.monotonic()):
        await conn.send("/v3/watch", req)
        status, chunked, _ = await conn.head()
        if status != 200 or not chunked:
            raise RuntimeError(f"etcd watch answered {status} (chunked={chunked})")
        pending = b""
        while chunk := await conn.chunk():
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if not line.strip():
                    continue
                result = json.loads(line).get("result", {})
                if result.get("canceled"):
                    raise RuntimeError(f"etcd canceled the watch: {result}")
                tally.seen(
                    [
                        float(base64.b64decode(ev["kv"]["value"][:STAMP_B64])[: STAMP_LEN - 1])
                        for ev in result.get("events", ())
                    ]
                )
    return tally.result()


async def _etcd_grpc_put(args: argparse.Namespace) -> dict[str, Any]:
    import asyncio

    import grpc

    pad = _pad(args.value_bytes)
    tally = _Tally(args.start_at, args.duration)
    async with grpc.aio.secure_channel(
        args.endpoints.split(",")[0], _grpc_credentials(args)
    ) as channel:
        put = channel.unary_unary("/etcdserverpb.KV/Put")  # raw bytes in and out

        def request(key: str, stamp: bytes) -> bytes:  # PutRequest{key=1, value=2}
            return _pb_len(1, key.encode()) + _pb_len(2, stamp + pad)

        await asyncio.wait_for(put(request(f"{args.prefix}warmup", _stamp()[1])), 30)
        await asyncio.sleep(max(0.0, args.start_at - time.monotonic()))
        tally.begin()

        async def task(t: int) -> None:
            seq = 0
            while time.monotonic() < tally.t_end:
                key = f"{args.prefix}{t}-{seq}"
                seq += 1
                t0, stamp = _stamp()
                try:
                    await put(request(key, stamp))
                except grpc.aio.AioRpcError as exc:
                    tally.error(exc)
                    continue
                tally.done(t0)

        await asyncio.gather(*(task(t) for t in range(args.tasks)))
    return tally.result()


async def _etcd_grpc_watch(args: argparse.Namespace) -> dict[str, Any]:
    import asyncio

    import grpc

    tally = _WatchTally(args.start_at, args.duration)
    prefix = args.prefix.encode()
    # WatchRequest{create_request=1: WatchCreateRequest{key=1, range_end=2}}
    create = _pb_len(1, _pb_len(1, prefix) + _pb_len(2, _prefix_end(prefix)))
    async with grpc.aio.secure_channel(
        args.endpoints.split(",")[0], _grpc_credentials(args)
    ) as channel:
        call = channel.stream_stream("/etcdserverpb.Watch/Watch")()
        await call.write(create)

        async def receive() -> None:
            while True:
                msg = await call.read()
                if msg is grpc.aio.EOF:
                    raise RuntimeError("etcd ended the watch stream")
                canceled, stamps = _watch_response_stamps(msg)
                if canceled:
                    raise RuntimeError("etcd canceled the watch")
                tally.seen(stamps)

        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(
                receive(), args.start_at + args.duration + args.grace - time.monotonic()
            )
        call.cancel()
    return tally.result()


WORKERS = {
    "ours-put": ("trio", _ours_put),
    "ours-watch": ("trio", _ours_watch),
    "etcd-http-put": ("trio", _etcd_http_put),
    "etcd-http-watch": ("trio", _etcd_http_watch),
    "etcd-grpc-put": ("asyncio", _etcd_grpc_put),
    "etcd-grpc-watch": ("asyncio", _etcd_grpc_watch),
}


def worker_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", required=True, choices=sorted(WORKERS))
    ap.add_argument("--endpoints", required=True)
    ap.add_argument("--tasks", type=int, default=1)
    ap.add_argument("--duration", type=float, required=True)
    ap.add_argument("--start-at", type=float, required=True, help="CLOCK_MONOTONIC time")
    ap.add_argument("--grace", type=float, default=0.0)
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--value-bytes", type=int, default=1024)
    ap.add_argument("--tls-dir", required=True, help="a data dir: pki/ca.crt, admin.crt/key")
    args = ap.parse_args(argv)
    loop, fn = WORKERS[args.worker]
    if loop == "trio":
        result = trio.run(fn, args)
    else:
        import asyncio

        result = asyncio.run(fn(args))
    json.dump(result, sys.stdout)
    sys.stdout.flush()
    return 0


# ---------------------------------------------------------------------------------- etcd
class EtcdCluster:
    """N etcd members on loopback (default settings), stopped and reaped on exit."""

    def __init__(self, root: Path, size: int, binary: str) -> None:
        cluster_mod = cluster_lib
        self._pdeathsig = cluster_mod._set_pdeathsig
        self.root = root
        self.binary = binary
        ports = cluster_mod.free_ports(2 * size)
        self.names = [f"m{i + 1}" for i in range(size)]
        self.client_ports = ports[1::2]
        self.peer_ports = ports[0::2]
        self.initial = ",".join(
            f"{n}=https://127.0.0.1:{p}" for n, p in zip(self.names, self.peer_ports, strict=True)
        )
        self.procs: list[subprocess.Popen[bytes]] = []
        self.tls_dir = root / "tls"  # pki/: ca.crt, peer.crt/key (members), admin.crt/key
        self._tls: ssl.SSLContext | None = None

    def _make_pki(self) -> None:
        """A CA of the bench's own, one certificate for every member (serverAuth and
        clientAuth, SAN 127.0.0.1: used on the client and the peer URLs) and a client one."""
        from orchestrator.security.peercerts import (
            ensure_admin_cert,
            ensure_cluster_ca,
            ensure_peer_cert,
        )

        ensure_cluster_ca(self.tls_dir, "")  # a random CA
        ensure_peer_cert(self.tls_dir, 1, ["127.0.0.1"])
        ensure_admin_cert(self.tls_dir)
        from orchestrator.store.client import ClientTLS

        ctx = ClientTLS.from_data_dir(self.tls_dir).context()
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        self._tls = ctx

    @property
    def endpoints(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.client_ports]

    def __enter__(self) -> EtcdCluster:
        self._make_pki()
        pki = self.tls_dir / "pki"
        tls_args = [
            "--cert-file",
            str(pki / "peer.crt"),
            "--key-file",
            str(pki / "peer.key"),
            "--trusted-ca-file",
            str(pki / "ca.crt"),
            "--client-cert-auth",
            "--peer-cert-file",
            str(pki / "peer.crt"),
            "--peer-key-file",
            str(pki / "peer.key"),
            "--peer-trusted-ca-file",
            str(pki / "ca.crt"),
            "--peer-client-cert-auth",
        ]
        for name, cport, pport in zip(self.names, self.client_ports, self.peer_ports, strict=True):
            data = self.root / name
            data.mkdir(parents=True, exist_ok=True)
            argv = [
                self.binary,
                "--name",
                name,
                "--data-dir",
                str(data / "data"),
                "--listen-client-urls",
                f"https://127.0.0.1:{cport}",
                "--advertise-client-urls",
                f"https://127.0.0.1:{cport}",
                "--listen-peer-urls",
                f"https://127.0.0.1:{pport}",
                "--initial-advertise-peer-urls",
                f"https://127.0.0.1:{pport}",
                "--initial-cluster",
                self.initial,
                "--initial-cluster-state",
                "new",
                "--initial-cluster-token",
                "store-bench",
                "--logger",
                "zap",
                "--log-level",
                "warn",
                *tls_args,
            ]
            with open(data / "etcd.log", "ab") as logf:
                self.procs.append(
                    subprocess.Popen(
                        argv,
                        stdin=subprocess.DEVNULL,
                        stdout=logf,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        preexec_fn=self._pdeathsig if sys.platform == "linux" else None,
                    )
                )
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def status(self, i: int) -> dict[str, Any] | None:
        req = urllib.request.Request(
            f"https://{self.endpoints[i]}/v3/maintenance/status", data=b"{}", method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=2, context=self._tls) as resp:
                return json.loads(resp.read())
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def wait_leader(self, within: float = 30.0) -> int:
        """Index of the leader once every member answers and agrees on one."""
        deadline = time.monotonic() + within
        while True:
            for i, p in enumerate(self.procs):
                if p.poll() is not None:
                    log = (self.root / self.names[i] / "etcd.log").read_text(errors="replace")
                    raise RuntimeError(f"etcd member {i} exited:\n{log[-3000:]}")
            sts = [self.status(i) for i in range(len(self.procs))]
            if all(sts):
                ids = [st["header"]["member_id"] for st in sts if st]
                leaders = {st.get("leader") for st in sts if st}
                if len(leaders) == 1 and (lead := leaders.pop()) in ids:
                    return ids.index(lead)
            if time.monotonic() > deadline:
                raise RuntimeError(f"etcd cluster has no leader after {within:g}s")
            time.sleep(0.2)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.poll() is None]


# ---------------------------------------------------------------------------------- driver
def _split(total: int, parts: int) -> list[int]:
    parts = max(1, min(parts, total))
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _main_and_process_cpu(pid: int) -> tuple[float, float]:
    """(main thread, whole process) user + system CPU seconds of a live process. Per-thread
    figures for the other threads are not usable: trio's worker threads come and go, and the
    CPU of a thread that exited only shows in the process total."""
    proc_cpu = cluster_lib.process_cpu_seconds
    return _task_cpu(pid, pid), proc_cpu(pid) or 0.0


def _task_cpu(pid: int, tid: int) -> float:
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            stat = f.read()
    except OSError:
        return 0.0
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_of(pids: list[int]) -> float:
    proc_cpu = cluster_lib.process_cpu_seconds
    return sum(proc_cpu(pid) or 0.0 for pid in pids)


def _spawn(
    kind: str,
    endpoints: list[str],
    tasks: int,
    prefix: str,
    start_at: float,
    args: argparse.Namespace,
    tls_dir: Path,
) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        kind,
        "--endpoints",
        ",".join(endpoints),
        "--tasks",
        str(tasks),
        "--duration",
        str(args.duration),
        "--start-at",
        repr(start_at),
        "--grace",
        str(args.watch_grace),
        "--prefix",
        prefix,
        "--value-bytes",
        str(args.value_bytes),
        "--tls-dir",
        str(tls_dir),
    ]
    return subprocess.Popen(argv, stdout=subprocess.PIPE)


def _collect(proc: subprocess.Popen[bytes], timeout: float) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"client process failed with status {proc.returncode}")
    return json.loads(out)


def run_point(
    system: str,
    client: str,
    n_servers: int,
    concurrency: int,
    write_endpoints: list[str],
    watch_endpoint: str | None,
    server_pids: list[int],
    args: argparse.Namespace,
    tls_dir: Path,
    profile_pid: int | None = None,
) -> dict[str, Any]:
    idle_busy = wait_quiet(args.quiet_wait) if args.quiet_wait > 0 else 0.0
    shares = _split(concurrency, args.client_procs)
    start_at = time.monotonic() + args.startup_s
    prefix = f"/bench/{system}-{client}-s{n_servers}c{concurrency}/"
    kind = "ours" if system == "ours" else f"etcd-{client}"
    watcher = None
    if watch_endpoint is not None:
        watcher = _spawn(f"{kind}-watch", [watch_endpoint], 1, prefix, start_at, args, tls_dir)
    # write_endpoints lists the leader first: "leader" sends every writer there, "spread"
    # starts writer process p at member p (a follower forwards the write to the leader).
    rot = [
        write_endpoints[p % len(write_endpoints) :] + write_endpoints[: p % len(write_endpoints)]
        if args.write_to == "spread"
        else write_endpoints
        for p in range(len(shares))
    ]
    writers = [
        _spawn(f"{kind}-put", rot[p], share, f"{prefix}p{p}-", start_at, args, tls_dir)
        for p, share in enumerate(shares)
    ]
    # Server CPU is sampled around the window (the clients warm up before start_at).
    time.sleep(max(0.0, start_at - time.monotonic()))
    spy = None
    leader0 = (0.0, 0.0)
    if profile_pid is not None:
        spy = subprocess.Popen(
            [
                args.py_spy,
                "record",
                "--format",
                "raw",
                "--threads",
                "--rate",
                str(args.py_spy_rate),
                *args.py_spy_args.split(),
                "-d",
                str(int(args.duration)),
                "-p",
                str(profile_pid),
                "-o",
                args.profile_file,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        leader0 = _main_and_process_cpu(profile_pid)
    cpu0, mach0 = _cpu_of(server_pids), machine_cpu()
    time.sleep(max(0.0, start_at + args.duration - time.monotonic()))
    cpu1, mach1 = _cpu_of(server_pids), machine_cpu()
    leader_threads: dict[str, float] = {}
    if profile_pid is not None:
        main1, proc1 = _main_and_process_cpu(profile_pid)
        leader_threads = {
            "main thread (trio loop)": main1 - leader0[0],
            "other threads (SQLite, fsync; trio workers)": (proc1 - leader0[1])
            - (main1 - leader0[0]),
        }
    results = [_collect(w, args.duration + 120) for w in writers]
    wres = _collect(watcher, args.watch_grace + 120) if watcher is not None else None
    if spy is not None:
        _, err = spy.communicate(timeout=args.duration + 60)
        if spy.returncode != 0:
            print(f"# py-spy failed: {err.decode(errors='replace')[-500:]}", flush=True)
    lat = sorted(x for r in results for x in r["latencies_ms"])
    wlat = sorted(wres["latencies_ms"]) if wres else []
    ok = sum(r["ok"] for r in results)
    client_cpu = sum(r["cpu_s"] for r in results)
    watch_cpu = wres["cpu_s"] if wres else 0.0
    server_cpu = cpu1 - cpu0
    ours_cpu = client_cpu + watch_cpu + server_cpu
    machine_busy = mach1[0] - mach0[0]
    errors = [r["first_error"] for r in results if r["first_error"]]
    return {
        "system": system,
        "client": client,
        "servers": n_servers,
        "concurrency": concurrency,
        "client_procs": len(shares),
        "puts": ok,
        "puts_per_s": ok / args.duration,
        "p50_ms": percentile(lat, 0.50),
        "p99_ms": percentile(lat, 0.99),
        "errors": sum(r["errors"] for r in results),
        "first_error": errors[0] if errors else "",
        "late_start_s": max(r["late_s"] for r in results),
        "watch_events": wres["events"] if wres else 0,
        "watch_p50_ms": percentile(wlat, 0.50),
        "watch_p99_ms": percentile(wlat, 0.99),
        "client_cpu_s": client_cpu,
        "watch_cpu_s": watch_cpu,
        "server_cpu_s": server_cpu,
        "server_us_per_put": server_cpu / ok * 1e6 if ok else float("nan"),
        "client_us_per_put": client_cpu / ok * 1e6 if ok else float("nan"),
        "box_cpu_pct": 100.0 * ours_cpu / (mach1[1] - mach0[1]),
        # Everything else that ran on the machine meanwhile (other users' jobs, the kernel's
        # work for the disk, ...); the clients' windows run a little past the servers'.
        "other_cpu_pct": 100.0 * max(0.0, machine_busy - ours_cpu) / (mach1[1] - mach0[1]),
        "busy_before_pct": 100.0 * idle_busy,
        **({"profiled_leader_thread_cpu_s": leader_threads} if profile_pid else {}),
    }


class _OursTarget:
    """Our running cluster: writers go through StoreClient (to the leader), the watcher to a
    follower."""

    def __init__(self, cluster: Any, n: int) -> None:
        self.cluster = cluster
        self.n = n
        cluster.start()
        self._find_leader()

    def _find_leader(self) -> None:
        self.leader = self.cluster.wait_leader_blocking(within=30)
        self.follower = next((i for i in range(self.n) if i != self.leader), self.leader)

    def _profiled(self, args: argparse.Namespace) -> int:
        """The server to profile: the leader, or (--profile-role follower) the next one."""
        if args.profile_role == "follower" and len(self.cluster.servers) > 1:
            return (self.leader + 1) % len(self.cluster.servers)
        return self.leader

    def run(self, c: int, args: argparse.Namespace, *, profile: bool) -> dict[str, Any]:
        cl = self.cluster
        others = [ep for i, ep in enumerate(cl.endpoints) if i != self.leader]
        row = run_point(
            "ours",
            "msgpack",
            self.n,
            c,
            [cl.endpoint(self.leader), *others],
            None if args.no_watch else cl.endpoint(self.follower),
            [cl.pid(i) for i in cl.running()],
            args,
            cl.servers[0].data_dir,  # its admin certificate
            profile_pid=cl.pid(self._profiled(args)) if profile else None,
        )
        cl.check_alive()
        if trio.run(cl.leader_index) != self.leader:
            print("# note: our leader changed during this point", flush=True)
            self._find_leader()
        return row


class _EtcdTarget:
    """The running etcd cluster: writers talk to the leader, the watcher to a follower."""

    def __init__(self, etcd: EtcdCluster, n: int) -> None:
        self.etcd = etcd
        self.n = n
        self._find_leader()

    def _find_leader(self) -> None:
        self.leader = self.etcd.wait_leader()
        self.follower = next((i for i in range(self.n) if i != self.leader), self.leader)

    def run(self, c: int, client: str, args: argparse.Namespace) -> dict[str, Any]:
        e = self.etcd
        others = [ep for i, ep in enumerate(e.endpoints) if i != self.leader]
        row = run_point(
            "etcd",
            client,
            self.n,
            c,
            [e.endpoints[self.leader], *others],
            None if args.no_watch else e.endpoints[self.follower],
            e.pids(),
            args,
            e.tls_dir,
        )
        if e.wait_leader() != self.leader:
            print("# note: the etcd leader changed during this point", flush=True)
            self._find_leader()
        return row


HEADER = (
    f"{'system':<9} {'srv':>3} {'conc':>4} {'puts/s':>7} {'p50 ms':>7} {'p99 ms':>8} "
    f"{'watch p50':>9} {'watch p99':>9} {'w.events':>8} {'cli CPU s':>9} "
    f"{'wch CPU s':>9} {'srv CPU s':>9} {'srv us/put':>10} {'box %':>5} {'oth %':>5} "
    f"{'err':>4}"
)


def _label(r: dict[str, Any]) -> str:
    return "ours" if r["system"] == "ours" else f"etcd-{r['client']}"


def _print_row(r: dict[str, Any]) -> None:
    print(
        f"{_label(r):<9} {r['servers']:>3} {r['concurrency']:>4} {r['puts_per_s']:>7.0f} "
        f"{r['p50_ms']:>7.2f} {r['p99_ms']:>8.2f} {r['watch_p50_ms']:>9.2f} "
        f"{r['watch_p99_ms']:>9.2f} {r['watch_events']:>8} {r['client_cpu_s']:>9.2f} "
        f"{r['watch_cpu_s']:>9.2f} {r['server_cpu_s']:>9.2f} {r['server_us_per_put']:>10.0f} "
        f"{r['box_cpu_pct']:>5.0f} {r['other_cpu_pct']:>5.0f} {r['errors']:>4}",
        flush=True,
    )
    if r["first_error"]:
        print(f"#   first error: {r['first_error']}", flush=True)
    if r["late_start_s"] > 0.05:
        print(
            f"#   a client process started {r['late_start_s']:.2f}s late (raise --startup-s)",
            flush=True,
        )


def _comparison(rows: list[dict[str, Any]], clients: list[str], n: int) -> dict[str, Any]:
    """Print the ours-vs-etcd table at `n` servers; return the ratio figures."""
    ours = {r["concurrency"]: r for r in rows if r["system"] == "ours" and r["servers"] == n}
    etcd = {
        (r["client"], r["concurrency"]): r
        for r in rows
        if r["system"] == "etcd" and r["servers"] == n
    }
    ratios: dict[str, Any] = {}
    if not ours or not etcd:
        return ratios
    print(
        f"\n# ours vs etcd, {n} servers each (ratio = ours / etcd; latency ratios > 1 mean "
        f"ours is slower)"
    )
    print(
        f"{'conc':>4} {'etcd via':<8} {'ours puts/s':>11} {'etcd puts/s':>11} "
        f"{'puts ratio':>10} {'ours p99':>8} {'etcd p99':>8} {'ours wch99':>10} "
        f"{'etcd wch99':>10} {'ours srv us/put':>15} {'etcd srv us/put':>15}"
    )
    for c in sorted(ours):
        o = ours[c]
        for client in clients:
            e = etcd.get((client, c))
            if e is None:
                continue
            ratio = o["puts_per_s"] / e["puts_per_s"] if e["puts_per_s"] else float("nan")
            print(
                f"{c:>4} {client:<8} {o['puts_per_s']:>11.0f} {e['puts_per_s']:>11.0f} "
                f"{ratio:>10.3f} {o['p99_ms']:>8.1f} {e['p99_ms']:>8.1f} "
                f"{o['watch_p99_ms']:>10.1f} {e['watch_p99_ms']:>10.1f} "
                f"{o['server_us_per_put']:>15.0f} {e['server_us_per_put']:>15.0f}"
            )
            ratios[f"ratio_vs_etcd_{client}_c{c}"] = ratio
            ratios[f"p99_ratio_vs_etcd_{client}_c{c}"] = o["p99_ms"] / e["p99_ms"]
            ratios[f"cpu_per_put_ratio_vs_etcd_{client}_c{c}"] = (
                o["server_us_per_put"] / e["server_us_per_put"]
            )
            if client == clients[0]:
                ratios[f"ratio_vs_etcd_c{c}"] = ratio
    return ratios


def _profile_summary(
    path: str, duration: float, thread_cpu: dict[str, float], top: int = 20, rate: int = 100
) -> dict[str, Any]:
    """Print the leader's CPU by thread (/proc) and the top functions (self and inclusive
    samples) of a py-spy raw profile."""
    print(
        f"\n# our leader's CPU by thread over the {duration:g}s window (/proc; 100% = one "
        f"core): {100 * sum(thread_cpu.values()) / duration:.1f}% in all"
    )
    for name, cpu in sorted(thread_cpu.items(), key=lambda kv: -kv[1]):
        print(f"#   {100 * cpu / duration:6.1f}%  {name}")
    self_c: Counter[str] = Counter()
    incl_c: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = 0
    with open(path) as f:
        for line in f:
            stack, _, count_s = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            count = int(count_s)
            frames = stack.split(";")
            thread = frames[0].split(": ", 1)[-1] if frames[0].startswith("thread") else "?"
            threads[thread] += count
            funcs = []
            for fr in frames[1:]:
                name, _, loc = fr.partition(" (")
                file = loc.rsplit(":", 1)[0].rstrip(")")
                funcs.append(f"{name} ({file.split('site-packages/')[-1]})")
            total += count
            if funcs:
                self_c[funcs[-1]] += count
            for fn in set(funcs):
                incl_c[fn] += count
    wall = duration * rate  # samples of one thread busy the whole time
    print(
        f"# py-spy on our leader: {total} samples over {duration:g}s at {rate} Hz "
        f"(100% = one thread sampled all the time); by thread:"
    )
    for t, n in threads.most_common(8):
        print(f"#   {100 * n / wall:6.1f}%  {t}")
    print("# top functions by self samples:")
    for fn, n in self_c.most_common(top):
        print(f"#   {100 * n / wall:6.1f}%  {fn}")
    print("# top functions by inclusive samples:")
    for fn, n in incl_c.most_common(top):
        print(f"#   {100 * n / wall:6.1f}%  {fn}")
    return {
        "samples": total,
        "threads": dict(threads.most_common(8)),
        "self_top": self_c.most_common(top),
        "inclusive_top": incl_c.most_common(top),
    }


def main() -> int:
    if "--worker" in sys.argv[1:]:
        return worker_main(sys.argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--servers", default="1,3", help="cluster sizes (ours), comma-separated")
    ap.add_argument(
        "--concurrency",
        default="1,64,512",
        help="puts in flight (over all client processes), comma-separated",
    )
    ap.add_argument("--duration", type=float, default=10.0, help="seconds measured per point")
    ap.add_argument("--client-procs", type=int, default=4, help="load-generating processes")
    ap.add_argument("--value-bytes", type=int, default=1024)
    ap.add_argument("--no-watch", action="store_true", help="no watcher process")
    ap.add_argument(
        "--watch-grace",
        type=float,
        default=5.0,
        help="seconds the watcher keeps listening after the window",
    )
    ap.add_argument(
        "--startup-s",
        type=float,
        default=3.0,
        help="time given to the client processes to start and connect",
    )
    ap.add_argument(
        "--quiet-wait",
        type=float,
        default=30.0,
        help="before each point, wait up to this many seconds for the machine to "
        "be at most 25%% busy (a shared machine); 0 = do not wait",
    )
    ap.add_argument(
        "--write-to",
        choices=["leader", "spread"],
        default="leader",
        help="leader: every writer talks to the leader (both systems); spread: "
        "writer process p talks to member p, followers forward to the leader",
    )
    ap.add_argument("--vs-etcd", action="store_true", help="also measure an etcd cluster")
    ap.add_argument("--etcd-bin", default="etcd")
    ap.add_argument("--etcd-servers", type=int, default=3, help="etcd cluster size")
    ap.add_argument(
        "--etcd-client",
        default="grpc,http",
        help="how to talk to etcd: grpc (native; the headline ratio uses the first "
        "listed) and/or http (the JSON gateway)",
    )
    ap.add_argument(
        "--profile",
        metavar="S:C",
        help="py-spy our leader during the point with S servers, concurrency C",
    )
    ap.add_argument(
        "--profile-role",
        choices=["leader", "follower"],
        default="leader",
        help="which server --profile records",
    )
    ap.add_argument(
        "--py-spy-args",
        default="--gil",
        help="extra py-spy record options (default --gil: only the thread holding "
        "the GIL, i.e. Python code on a CPU; py-spy's own idle detection counts "
        "threads in fsync as busy)",
    )
    ap.add_argument(
        "--py-spy-rate",
        type=int,
        default=100,
        help="py-spy samples per second (higher: finer profile, more overhead on that server)",
    )
    ap.add_argument(
        "--profile-file",
        default="",
        help="where py-spy writes its raw profile (default: in the temp dir)",
    )
    ap.add_argument("--keep-data", action="store_true", help="keep the data directories")
    args = ap.parse_args()
    if args.value_bytes < STAMP_LEN:
        ap.error(f"--value-bytes must be at least {STAMP_LEN}")
    sizes = [int(x) for x in args.servers.split(",") if x]
    levels = [int(x) for x in args.concurrency.split(",") if x]
    clients = [x for x in args.etcd_client.split(",") if x]
    if any(c not in ("grpc", "http") for c in clients):
        ap.error("--etcd-client takes grpc and/or http")
    profile_point = tuple(int(x) for x in args.profile.split(":")) if args.profile else None
    args.py_spy = shutil.which("py-spy") if profile_point else None
    if profile_point and args.py_spy is None:
        ap.error("--profile needs py-spy (pip install py-spy)")
    etcd_bin = shutil.which(args.etcd_bin) if args.vs_etcd else None
    if args.vs_etcd and etcd_bin is None:
        ap.error(f"--vs-etcd: no {args.etcd_bin!r} binary (apt-get install etcd-server)")

    cluster_mod = cluster_lib
    root = Path(tempfile.mkdtemp(prefix="store-bench-"))
    if profile_point and not args.profile_file:
        args.profile_file = str(root / f"leader-{profile_point[0]}x{profile_point[1]}.txt")
    rows: list[dict[str, Any]] = []
    profile: dict[str, Any] | None = None
    etcd_version = ""
    if etcd_bin:
        out = subprocess.run([etcd_bin, "--version"], capture_output=True, text=True).stdout
        etcd_version = out.splitlines()[0].split()[-1] if out else "?"
    print(
        f"# {os.cpu_count()} CPUs, {args.duration:g}s per point, {args.client_procs} client "
        f"processes + {'no watcher' if args.no_watch else '1 watcher'}, "
        f"{args.value_bytes}-byte values, fsync on, data in {root}"
        + (f"; etcd {etcd_version} via {'+'.join(clients)}" if etcd_bin else ""),
        flush=True,
    )
    print(HEADER, flush=True)
    etcd_n = args.etcd_servers if etcd_bin else None
    try:
        # etcd runs next to our cluster of the same size, point by point (ours, then etcd at
        # the same concurrency), so that a change in the machine's background load does not
        # land on one system only. The idle cluster costs a few heartbeats.
        for n in sizes + ([etcd_n] if etcd_n is not None and etcd_n not in sizes else []):
            with contextlib.ExitStack() as stack:
                ours = None
                if n in sizes:
                    cluster = stack.enter_context(
                        cluster_mod.Cluster(
                            root / f"ours-{n}", n, tick_ms=100, log_level="warning", api=False
                        )
                    )
                    ours = _OursTarget(cluster, n)
                etcd = None
                if n == etcd_n:
                    assert etcd_bin is not None
                    etcd = _EtcdTarget(
                        stack.enter_context(EtcdCluster(root / f"etcd-{n}", n, etcd_bin)), n
                    )
                for c in levels:
                    if ours is not None:
                        spy = profile_point == (n, c)
                        row = ours.run(c, args, profile=spy)
                        rows.append(row)
                        _print_row(row)
                        if spy and os.path.exists(args.profile_file):
                            profile = {
                                "point": list(profile_point or ()),
                                "file": args.profile_file,
                                "thread_cpu_s": row["profiled_leader_thread_cpu_s"],
                            }
                    if etcd is not None:
                        for client in clients:
                            row = etcd.run(c, client, args)
                            rows.append(row)
                            _print_row(row)
        ratios = _comparison(rows, clients, args.etcd_servers) if etcd_bin else {}
        if profile is not None:
            profile.update(
                _profile_summary(
                    profile["file"], args.duration, profile["thread_cpu_s"], rate=args.py_spy_rate
                )
            )
    finally:
        if not args.keep_data:
            shutil.rmtree(root, ignore_errors=True)
    print(
        json.dumps(
            {
                "bench": "store_put_watch",
                "duration_s": args.duration,
                "value_bytes": args.value_bytes,
                "cpus": os.cpu_count(),
                "client_procs": args.client_procs,
                "etcd_version": etcd_version,
                **ratios,
                "results": rows,
                "profile": profile,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
