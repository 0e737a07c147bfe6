"""`Waiter` (orchestrator/raft/node.py): a request's outcome, set once, awaited by one task,
on trio's low-level parking. Deterministic: trio's MockClock (autojump)."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from orchestrator.raft.waiters import Waiter


async def test_a_value_set_before_or_after_the_wait_is_returned_once_set(
    autojump_clock: trio.testing.MockClock,
) -> None:
    early = Waiter()
    early.set(1)
    early.set(2)  # later outcomes are ignored
    early.fail(KeyError("late"))
    assert await early.wait() == 1

    late = Waiter()
    got: list[object] = []

    async def waiting() -> None:
        got.append(await late.wait())

    with trio.fail_after(10):  # a waiter that is never woken fails here instead of hanging
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiting)
            await trio.testing.wait_all_tasks_blocked()
            assert got == []
            late.set("done")
    assert got == ["done"]
    assert await late.wait() == "done"  # waiting again: the same outcome


async def test_a_failure_is_raised(autojump_clock: trio.testing.MockClock) -> None:
    w = Waiter()

    async def fail_soon() -> None:
        await trio.sleep(1)
        w.fail(ValueError("no quorum"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(fail_soon)
        with pytest.raises(ValueError, match="no quorum"):
            await w.wait()


async def test_a_cancelled_wait_ends_and_a_later_outcome_reaches_the_next_wait(
    autojump_clock: trio.testing.MockClock,
) -> None:
    w = Waiter()
    with trio.move_on_after(5) as scope:
        await w.wait()
    assert scope.cancelled_caught
    w.set("after")  # nobody is parked: nothing to wake, nothing breaks
    assert await w.wait() == "after"


async def test_a_set_waiter_still_checkpoints() -> None:
    w = Waiter()
    w.set(None)
    with trio.CancelScope() as scope:
        scope.cancel()
        with pytest.raises(trio.Cancelled):
            await w.wait()
