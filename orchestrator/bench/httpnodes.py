"""Simulated nodes over real HTTPS, in a process of their own (`bench reconcile --nodes-over-http`).

Theory of operation
-------------------
In process, simulated nodes call the API without HTTP, TLS, JSON or authentication by token:
cheap, but not what a real agent costs the server. With `--nodes-over-http` the benchmark:

1. issues one node token per node (`system:node:<name>`, group `system:nodes`) in the server's
   cluster token table, as `orchestrator agent` joining gets one;
2. starts this module as a child process (`python -m orchestrator.bench.httpnodes`) and sends it,
   as the first line on its stdin, one JSON object: the server's URL, its CA, the tokens and the
   nodes' options (so no credential is written to a file or shows in a process listing);
3. the child runs a `SimulatedCluster` in which every node has its own `RestClient` (its own
   connection pool and bearer token: NodeRestriction and authentication apply to each write as
   to a real agent's) over loopback HTTPS, and prints `ready` once every node is registered and
   the pod watch is open;
4. a line `stats` on its stdin makes the child print one JSON line: the engine's
   `SimStatistics`, its own CPU seconds and its event loop's lag (`WakeLag`); when the benchmark
   is done it closes the child's stdin, and the child prints that line once more and exits.

The measured process is then the server alone: its CPU and RSS exclude the nodes' HTTP
clients, whose CPU the child reports separately.

Invariants: the child never outlives the benchmark (it runs under the benchmark's nursery, which
kills it on cancellation, and it stops by itself when its stdin closes); tokens travel only on
the pipe.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import subprocess
import sys
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import trio

from orchestrator.apiserver.server import ApiServer
from orchestrator.bench.wakelag import WakeLag
from orchestrator.client.config import ClientConfig
from orchestrator.client.rest import RestClient
from orchestrator.controllers.runtime.client import Client, HttpClient
from orchestrator.testing.nodes import FIELD_MANAGER, SimStatistics, SimulatedCluster

__all__ = ["REQUEST_TIMEOUT", "HttpNodes", "start_http_nodes"]

log = logging.getLogger(__name__)

REQUEST_TIMEOUT = 30.0  # each node's requests, as an agent's RestClient
READY_TIMEOUT = 600.0  # registering thousands of nodes over HTTPS on a slow device
TOKEN_PARALLELISM = 16
WORKERS = 64


class _Lines:
    """Lines from a byte stream (the child's stdout, or stdin in the child)."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self.stream = stream
        self.buf = bytearray()

    async def readline(self) -> bytes:
        """The next line without its newline; b"" at the end of the stream."""
        while True:
            nl = self.buf.find(b"\n")
            if nl >= 0:
                line = bytes(self.buf[:nl])
                del self.buf[: nl + 1]
                return line
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                line, self.buf = bytes(self.buf), bytearray()
                return line
            self.buf += chunk


@dataclass
class HttpNodes:
    """The running child process of simulated nodes; `stop()` ends it and returns its figures."""

    process: trio.Process
    lines: _Lines

    async def stats(self) -> tuple[SimStatistics, float, dict[str, Any]]:
        """The child's statistics, CPU seconds and loop lag so far."""
        assert self.process.stdin is not None
        await self.process.stdin.send_all(b"stats\n")
        with trio.fail_after(60):
            return self._parse(await self.lines.readline())

    async def stop(self) -> tuple[SimStatistics, float, dict[str, Any]]:
        """Close the child's stdin, read its last figures (as `stats`), wait for it to exit."""
        assert self.process.stdin is not None
        await self.process.stdin.aclose()
        with trio.fail_after(60):
            line = await self.lines.readline()
            await self.process.wait()
        return self._parse(line)

    def _parse(self, line: bytes) -> tuple[SimStatistics, float, dict[str, Any]]:
        if not line:
            raise RuntimeError(f"the simulated nodes exited with {self.process.returncode}")
        doc = json.loads(line)
        return SimStatistics(**doc["stats"]), float(doc["cpu_seconds"]), doc["loop_lag"]


async def start_http_nodes(
    nursery: trio.Nursery,
    apiserver: ApiServer,
    n: int,
    *,
    prefix: str,
    node_options: dict[str, Any],
    workers: int = WORKERS,
) -> HttpNodes:
    """Issue `n` node tokens, start the child under `nursery` and wait until its nodes are
    registered (see the module doc)."""
    if apiserver.tokens is None or apiserver.pki is None or not apiserver.port:
        raise RuntimeError("the API server is not serving HTTPS with its token table yet")
    tokens = apiserver.tokens
    names = [f"{prefix}{i}" for i in range(n)]
    creds: dict[str, str] = {}
    limit = trio.CapacityLimiter(TOKEN_PARALLELISM)

    async def issue(name: str) -> None:
        async with limit:
            creds[name] = await tokens.add_node(name)

    async with trio.open_nursery() as issuers:
        for name in names:
            issuers.start_soon(issue, name)
    config = {
        "server": f"https://127.0.0.1:{apiserver.port}",
        "ca_pem": apiserver.pki.ca_pem.decode("ascii"),
        "prefix": prefix,
        "tokens": [creds[name] for name in names],
        "workers": workers,
        "node_options": node_options,
    }
    process: trio.Process = await nursery.start(
        partial(
            trio.run_process,
            [sys.executable, "-m", "orchestrator.bench.httpnodes"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            check=False,
        )
    )
    assert process.stdin is not None
    assert process.stdout is not None
    await process.stdin.send_all(json.dumps(config).encode() + b"\n")
    lines = _Lines(process.stdout)
    with trio.fail_after(READY_TIMEOUT):
        ready = await lines.readline()
    if ready != b"ready":
        raise RuntimeError(f"the simulated nodes did not start (said {ready[:200]!r})")
    return HttpNodes(process, lines)


# ---------------------------------------------------------------------------------- the child
async def _serve(config: dict[str, Any], stdin: _Lines, out: trio.abc.SendStream) -> None:
    tokens: list[str] = list(config["tokens"])
    prefix = str(config["prefix"])
    ca_pem = str(config["ca_pem"]).encode("ascii")
    async with AsyncExitStack() as stack:
        clients: dict[str, Client] = {}
        for i, token in enumerate(tokens):
            cfg = ClientConfig(str(config["server"]), ca_pem=ca_pem, token=token)
            rest = await stack.enter_async_context(
                RestClient(cfg, timeout=REQUEST_TIMEOUT, user_agent="simulated-kubelet")
            )
            clients[f"{prefix}{i}"] = HttpClient(rest, field_manager=FIELD_MANAGER)
        cluster = SimulatedCluster(
            None,
            len(tokens),
            prefix,
            workers=int(config["workers"]),
            client_for=clients.__getitem__,
            **dict(config["node_options"]),
        )
        lag = WakeLag()

        async def report() -> None:
            ru = resource.getrusage(resource.RUSAGE_SELF)
            doc = {
                "stats": asdict(cluster.statistics()),
                "cpu_seconds": ru.ru_utime + ru.ru_stime,
                "loop_lag": lag.summary(),
            }
            await out.send_all(json.dumps(doc).encode() + b"\n")

        async with trio.open_nursery() as nursery:
            await nursery.start(cluster.run)
            await nursery.start(lag.run)
            await out.send_all(b"ready\n")
            while line := await stdin.readline():  # until the benchmark closes our stdin
                if line.strip() == b"stats":
                    await report()
            await report()
            nursery.cancel_scope.cancel()


async def _child() -> None:
    stdin = _Lines(trio.lowlevel.FdStream(os.dup(0)))
    out = trio.lowlevel.FdStream(os.dup(1))
    line = await stdin.readline()
    if not line:
        raise SystemExit("expected the configuration as the first line on stdin")
    await _serve(json.loads(line), stdin, out)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    trio.run(_child)
