"""Assembles one server process: the Raft node, its state machine and its client port.

Runs until cancelled or until SIGTERM/SIGINT, then shuts down cleanly (databases closed).
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass
from pathlib import Path

import trio

from .raft.kv import KVStateMachine
from .raft.node import NodeConfig, RaftNode
from .raft.service import ClientService
from .raft.statemachine import StateMachine

log = logging.getLogger("orchestrator.server")


@dataclass
class ServerOptions:
    node: NodeConfig
    client_listen: str


def open_kv(data_dir: Path) -> StateMachine:
    return KVStateMachine(data_dir / "kv.db")


class Server:
    def __init__(self, opts: ServerOptions) -> None:
        self.opts = opts
        self.node = RaftNode(opts.node, open_kv)
        self.service = ClientService(self.node, opts.client_listen)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.node.run)
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
