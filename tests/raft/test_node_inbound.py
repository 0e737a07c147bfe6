"""`RaftNode._forward_inbound`: the messages the transport delivered together reach the loop's
inbox together, with one wake-up of the loop (not one turn of the loop per message)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import trio
import trio.testing

from orchestrator.raft.node import NodeConfig, RaftNode
from orchestrator.raft.types import Message, MsgType


class RecordingWake:
    """Stands in for the loop's wake-up event: records the inbox's length at each set()."""

    def __init__(self, node: RaftNode) -> None:
        self.node = node
        self.seen: list[int] = []

    def set(self) -> None:
        self.seen.append(len(self.node._inbox))


def _node(tmp_path: Path) -> tuple[RaftNode, trio.MemorySendChannel[Message]]:
    node = RaftNode(
        NodeConfig(node_id=1, data_dir=tmp_path, peer_listen="127.0.0.1:0"),
        lambda _: None,  # type: ignore[arg-type,return-value]  # no state machine is used
    )
    send, receive = trio.open_memory_channel[Message](100)
    node.transport = SimpleNamespace(inbound=receive)  # type: ignore[assignment]
    return node, send


def _ack(frm: int, index: int) -> Message:
    return Message(type=MsgType.APP_RESP, to=1, frm=frm, term=1, index=index)


async def test_messages_delivered_together_wake_the_loop_once(tmp_path: Path) -> None:
    node, send = _node(tmp_path)
    wake = RecordingWake(node)
    node._wake = wake  # type: ignore[assignment]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(node._forward_inbound)
        await trio.testing.wait_all_tasks_blocked()
        acks = [_ack(2, 5), _ack(3, 5), _ack(2, 6)]
        for m in acks:
            send.send_nowait(m)
        await trio.testing.wait_all_tasks_blocked()
        assert node._inbox == acks  # in order
        assert wake.seen == [3]  # one wake-up, with all three in the inbox
        node._inbox = []  # as the loop takes them
        send.send_nowait(_ack(3, 6))
        await trio.testing.wait_all_tasks_blocked()
        assert node._inbox == [_ack(3, 6)]  # later ones go to the loop's new list
        assert wake.seen == [3, 1]
        await send.aclose()  # the transport stopped: the task ends
