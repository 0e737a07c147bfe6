"""Assembles one server process: the Raft node, the MVCC store on it, and the client port.

Runs until cancelled or until SIGTERM/SIGINT, then shuts down cleanly (databases closed).
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import trio

from .raft.node import NodeConfig, RaftNode
from .raft.statemachine import StateMachine
from .store.mvcc import DEFAULT_QUOTA_BYTES, MVCCStore
from .store.raftstore import CompactionPolicy, RaftStore
from .store.service import ClientService

log = logging.getLogger("orchestrator.server")


@dataclass
class ServerOptions:
    node: NodeConfig
    client_listen: str
    quota_bytes: int = DEFAULT_QUOTA_BYTES
    compaction: CompactionPolicy = field(default_factory=CompactionPolicy)


def open_store(data_dir: Path, *, quota_bytes: int) -> StateMachine:
    return MVCCStore(data_dir / "store.db", quota_bytes=quota_bytes)


class Server:
    def __init__(self, opts: ServerOptions) -> None:
        self.opts = opts
        self.node = RaftNode(opts.node, partial(open_store, quota_bytes=opts.quota_bytes))
        self.store = RaftStore(self.node, compaction=opts.compaction)
        self.service = ClientService(self.store, opts.client_listen)

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
            task_status.started()


async def serve_until_signalled(opts: ServerOptions) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(Server(opts).run)
            async for signum in signals:
                log.info("received %s: shutting down", signal.Signals(signum).name)
                nursery.cancel_scope.cancel()
                break
