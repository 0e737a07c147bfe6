"""Assembles one server process: the Raft node, the MVCC store on it, and the client port.

Runs until cancelled or until SIGTERM/SIGINT, then shuts down cleanly (databases closed).
"""

from __future__ import annotations

import gc
import logging
import secrets
import signal
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import trio

from .agent.service import AgentConfig, run_embedded
from .api.apiserver import ApiOptions, ApiServer
from .controllers.registry import default_controllers
from .controllers.runtime.manager import ControllerManager, ControllerOptions
from .raft.node import NodeConfig, RaftNode
from .raft.statemachine import StateMachine
from .store.mvcc import DEFAULT_QUOTA_BYTES, MVCCStore
from .store.raftstore import CompactionPolicy, RaftStore
from .store.service import ClientService

log = logging.getLogger("orchestrator.server")


TOKEN_FILE = "token"
NODE_ID_FILE = "node-id"
JOIN_TIMEOUT = 60.0  # seconds a joining server keeps asking before it gives up


@dataclass
class ServerOptions:
    node: NodeConfig
    client_listen: str
    token: str = ""
    join_url: str | None = None  # client address of a member to ask for admission
    quota_bytes: int = DEFAULT_QUOTA_BYTES
    compaction: CompactionPolicy = field(default_factory=CompactionPolicy)
    api: ApiOptions | None = None  # None: no Kubernetes API on this server
    controllers: bool = True  # run the controllers while this server is the Raft leader
    controller_options: ControllerOptions = field(default_factory=ControllerOptions)
    agent: AgentConfig | None = None  # the embedded node agent (needs the API); None: none


def node_identity(data_dir: Path, requested: int | None, *, joining: bool) -> int:
    """This server's Raft id, fixed at its first start (ids must never change or be reused):
    the requested one, else 1 for a founder or a random one for a server that joins."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / NODE_ID_FILE
    if path.exists():
        stored = int(path.read_text().strip())
        if requested is not None and requested != stored:
            raise ValueError(f"{data_dir} belongs to node {stored}, not {requested}")
        return stored
    nid = (
        requested if requested is not None else (secrets.randbelow(2**31 - 2) + 2 if joining else 1)
    )
    path.write_text(f"{nid}\n")
    return nid


def cluster_token(data_dir: Path, given: str | None) -> str:
    """The secret a server must present to join through this one: given, stored, or new."""
    path = data_dir / TOKEN_FILE
    if given:
        token = given
    elif path.exists():
        return path.read_text().strip()
    else:
        token = "orch-" + secrets.token_hex(16)
    path.write_text(token + "\n")
    path.chmod(0o600)
    return token


def open_store(data_dir: Path, *, quota_bytes: int) -> StateMachine:
    return MVCCStore(data_dir / "store.db", quota_bytes=quota_bytes)


class Server:
    def __init__(self, opts: ServerOptions) -> None:
        self.opts = opts
        self.node = RaftNode(opts.node, partial(open_store, quota_bytes=opts.quota_bytes))
        self.store = RaftStore(self.node, compaction=opts.compaction)
        self.service = ClientService(self.store, opts.client_listen, token=opts.token)
        self.api = (
            ApiServer(self.store, opts.api, ready=lambda: self.node.core.lead != 0)
            if opts.api
            else None
        )
        self.controllers: ControllerManager | None = None
        if self.api is not None and opts.controllers:
            self.controllers = ControllerManager(
                self, default_controllers, options=opts.controller_options
            )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.store.run)
            await nursery.start(self.service.run)
            log.info(
                "server %d ready: peers on %s, clients on port %d",
                self.node.id,
                self.opts.node.peer_listen,
                self.service.port,
            )
            if self.opts.join_url is not None and not self.node.core.conf.members():
                await self._join(self.opts.join_url)
            if self.api is not None:
                await nursery.start(self.api.run)
            if self.controllers is not None:
                await nursery.start(self.controllers.run)
            if self.api is not None and self.opts.agent is not None:
                agent_dir = self.opts.node.data_dir / "agent"
                await nursery.start(partial(run_embedded, self.api, self.opts.agent, agent_dir))
            task_status.started()

    async def _join(self, url: str) -> None:
        """Ask a member to add us as a learner; the leader promotes us once we caught up."""
        from .store.client import ClientError, StoreClient

        if not url:
            log.info("server %d waits to be added (member add-learner)", self.node.id)
            return
        endpoint = url.split("://", 1)[-1].rstrip("/")
        advertise = self.opts.node.advertise or self.opts.node.peer_listen
        with trio.fail_after(JOIN_TIMEOUT):
            async with StoreClient([endpoint]) as client:
                while True:
                    try:
                        await client.call("join", self.opts.token, self.node.id, advertise)
                        break
                    except (OSError, ClientError) as exc:
                        if "token" in str(exc):
                            raise PermissionError(f"join refused by {endpoint}: {exc}") from exc
                        log.warning("join through %s failed (%s); retrying", endpoint, exc)
                        await trio.sleep(1.0)
        log.info("server %d joined through %s as learner %s", self.node.id, endpoint, advertise)


# Cyclic GC: a server allocates many short-lived containers per request (entries, messages,
# dicts); at CPython's default gen-0 threshold (700) the collector took ~8% of a server's CPU
# under write load (perf). Almost nothing here forms cycles, so collect far less often, and
# move everything alive after start-up out of the collector's sight.
GC_THRESHOLDS = (50_000, 20, 20)


def tune_gc() -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


async def serve_until_signalled(opts: ServerOptions) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(Server(opts).run)
            tune_gc()
            async for signum in signals:
                log.info("received %s: shutting down", signal.Signals(signum).name)
                nursery.cancel_scope.cancel()
                break
