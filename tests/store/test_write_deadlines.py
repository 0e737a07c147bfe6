"""The write-deadline sweeper of `RaftStore` (`_expire`): a write that finished costs it no
wake-up. Serial writes each finish long before their deadline; the sweeper wakes at the first
pending deadline, drops every finished write from the top of its heap and sleeps until the
next write still pending. Mocked clock, a fake node that answers writes when told to."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import trio
import trio.testing

from orchestrator.raft.node import NodeConfig
from orchestrator.raft.waiters import Waiter
from orchestrator.store.raftstore import RaftStore
from orchestrator.store.types import NoQuorum


class FakeNode:
    """What `submit_write` uses of a RaftNode: the waiters it was given, answered by the test."""

    id = 1

    def __init__(self) -> None:
        self.waiters: list[Waiter] = []

    def applied_index(self) -> int:
        return 0

    @property
    def is_leader(self) -> bool:
        return False  # no progress to wait on: a write at its deadline fails

    def submit(self, data: bytes, *, waiter: Waiter) -> Waiter:
        self.waiters.append(waiter)
        return waiter


async def test_finished_writes_do_not_wake_the_sweeper(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    store = RaftStore(
        NodeConfig(node_id=1, data_dir=tmp_path, peer_listen="127.0.0.1:0"),
        lambda d: None,  # type: ignore[arg-type,return-value]  # never opened here
        quorum_timeout=5.0,
    )
    node = FakeNode()
    store.node = node  # type: ignore[assignment]
    results: list[tuple[Any, BaseException | None]] = []

    def done(value: Any, error: BaseException | None) -> None:
        results.append((value, error))

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store._expire)
            await trio.testing.wait_all_tasks_blocked()
            first_deadline = trio.current_time() + store.quorum_timeout
            for _ in range(50):  # serial writes, 10 ms apart, each answered at once
                store.submit_write(b"w", done)
                node.waiters[-1].set(object())
                await trio.sleep(0.01)
            store.submit_write(b"pending", done)  # one that no quorum answers
            pending_deadline = trio.current_time() + store.quorum_timeout
            # The sweeper wakes once, at the first write's deadline, and then waits for the
            # pending write's: not 50 times, 10 ms apart.
            await trio.sleep_until(first_deadline + 0.015)
            await trio.testing.wait_all_tasks_blocked()
            assert [item[2] is not None for item in store._deadlines] == [True]
            assert math.isclose(store._sweep.deadline, pending_deadline + 0.01)
            sweep = store._sweep
            await trio.sleep_until(pending_deadline + 0.02)
            assert isinstance(results[-1][1], NoQuorum)
            assert store._sweep is not sweep
            assert store._sweep.deadline == math.inf
            assert len(results) == 51
            assert all(e is None for _, e in results[:50])
            nursery.cancel_scope.cancel()
