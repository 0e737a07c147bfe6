"""Waiters: the outcome of one request to the Raft driver, set once from its loop.

`Waiter` is awaited by one task; `CallbackWaiter` calls back instead (for callers that answer
many requests without a task each); `BatchWaiter` stands for the waiters of the commands packed
into one batch entry, which share the entry's request id.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio


class Waiter:
    """The outcome of one request, set once (later sets are ignored), awaited by one task.

    Built on trio's low-level parking rather than a `trio.Event`: every write makes one, and
    the event's parking lot cost more than the rest of the waiter."""

    __slots__ = ("done", "error", "task", "value")

    def __init__(self) -> None:
        self.done = False
        self.value: Any = None
        self.error: BaseException | None = None
        self.task: trio.lowlevel.Task | None = None

    def set(self, value: Any) -> None:
        if not self.done:
            self.value = value
            self._wake()

    def fail(self, error: BaseException) -> None:
        if not self.done:
            self.error = error
            self._wake()

    def _wake(self) -> None:
        self.done = True
        task, self.task = self.task, None
        if task is not None:
            trio.lowlevel.reschedule(task)

    def _abort(self, _: Any) -> trio.lowlevel.Abort:
        self.task = None  # cancelled: a later set() has no one to wake
        return trio.lowlevel.Abort.SUCCEEDED

    async def wait(self) -> Any:
        if self.done:
            await trio.lowlevel.checkpoint()  # as Event.wait: always a checkpoint
        else:
            assert self.task is None, "a waiter is awaited by one task"
            self.task = trio.lowlevel.current_task()
            await trio.lowlevel.wait_task_rescheduled(self._abort)
        if self.error is not None:
            raise self.error
        return self.value


class CallbackWaiter(Waiter):
    """A waiter that calls `callback(value, error)` once, from the loop, instead of waking a
    task: for callers that answer many requests without a task each (the client port)."""

    __slots__ = ("callback",)

    def __init__(self, callback: Callable[[Any, BaseException | None], None]) -> None:
        self.callback: Callable[[Any, BaseException | None], None] | None = callback
        self.value = None
        self.error = None

    def set(self, value: Any) -> None:
        cb, self.callback = self.callback, None
        if cb is not None:
            cb(value, None)

    def fail(self, error: BaseException) -> None:
        cb, self.callback = self.callback, None
        if cb is not None:
            cb(None, error)

    async def wait(self) -> Any:
        raise TypeError("a CallbackWaiter reports through its callback")


class BatchWaiter(Waiter):
    """The waiters of a batch's commands, under the batch's one request id: the batch's result
    is the list of theirs (anything else, or a failure, goes to every one of them)."""

    __slots__ = ("waiters",)

    def __init__(self, waiters: list[Waiter]) -> None:
        self.waiters = waiters
        self.value = None
        self.error = None

    def set(self, value: Any) -> None:
        if isinstance(value, list) and len(value) == len(self.waiters):
            for w, v in zip(self.waiters, value, strict=True):
                w.set(v)
        else:
            for w in self.waiters:
                w.set(value)

    def fail(self, error: BaseException) -> None:
        for w in self.waiters:
            w.fail(error)

    async def wait(self) -> Any:
        raise TypeError("a batch's commands are waited for one by one")


def proposal_count(w: Waiter) -> int:
    """How many proposals a waiter stands for (a batch's: one per command)."""
    return len(w.waiters) if isinstance(w, BatchWaiter) else 1
