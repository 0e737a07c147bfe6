"""`RaftNode._on_message`: the transport hands each message straight to the loop's inbox from
its connection task (no task in between); messages that arrive together are in the inbox
together when the loop wakes, in order; a full inbox refuses (the transport drops and counts);
and the transport keeps going when the callback refuses or fails."""

from __future__ import annotations

import logging
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import trio
import trio.testing

from orchestrator.raft.node import NodeConfig, RaftNode
from orchestrator.raft.transport import PeerTransport
from orchestrator.raft.types import Message, MsgType


def _node(tmp_path: Path, queue_size: int = 100) -> RaftNode:
    node = RaftNode(
        NodeConfig(node_id=1, data_dir=tmp_path, peer_listen="127.0.0.1:0"),
        lambda _: None,  # type: ignore[arg-type,return-value]  # no state machine is used
    )
    node.transport = SimpleNamespace(queue_size=queue_size)  # type: ignore[assignment]
    return node


def _ack(frm: int, index: int) -> Message:
    return Message(type=MsgType.APP_RESP, to=1, frm=frm, term=1, index=index)


async def test_messages_delivered_together_are_in_the_inbox_together(tmp_path: Path) -> None:
    node = _node(tmp_path)
    woken = node._wake
    acks = [_ack(2, 5), _ack(3, 5), _ack(2, 6)]
    assert all(node._on_message(m) for m in acks)
    assert woken.is_set()
    assert node._inbox == acks  # in order, for the loop's next turn
    node._inbox = []  # as the loop takes them
    assert node._on_message(_ack(3, 6))
    assert node._inbox == [_ack(3, 6)]  # later ones go to the loop's new list


async def test_a_full_inbox_refuses(tmp_path: Path) -> None:
    node = _node(tmp_path, queue_size=2)
    assert node._on_message(_ack(2, 1))
    assert node._on_message(_ack(2, 2))
    assert not node._on_message(_ack(2, 3))
    assert len(node._inbox) == 2


@pytest.mark.parametrize("outcome", ["refuse", "raise"])
async def test_the_transport_counts_a_refused_message_and_keeps_delivering(
    outcome: str, caplog: pytest.LogCaptureFixture
) -> None:
    got: list[Message] = []
    arrived = trio.Event()

    def on_message(m: Message) -> bool:
        arrived.set()
        if m.term == 1:
            if outcome == "raise":
                raise RuntimeError("a bug in the driver")
            return False
        got.append(m)
        return True

    rx = PeerTransport(2, ("127.0.0.1", 0), {}, admit_unknown=True, on_message=on_message)
    with trio.fail_after(20), caplog.at_level(logging.ERROR):
        async with trio.open_nursery() as nursery:
            await nursery.start(rx.run)
            tx = PeerTransport(
                1, ("127.0.0.1", 0), {2: ("127.0.0.1", rx.port)}, rng=random.Random(1)
            )
            await nursery.start(tx.run)
            tx.send(Message(MsgType.HEARTBEAT, to=2, frm=1, term=1))
            await arrived.wait()
            tx.send(Message(MsgType.HEARTBEAT, to=2, frm=1, term=2))
            while not got:  # noqa: ASYNC110  (a callback's list, polled)
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    assert [m.term for m in got] == [2]
    stats = rx.statistics()
    assert stats.received == 1
    assert stats.dropped_inbound_full == 1
    if outcome == "raise":
        assert "error in on_message" in caplog.text
