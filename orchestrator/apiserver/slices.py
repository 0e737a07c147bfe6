"""Bulk work in time slices: a list, a watch's initial state and a large response body are
made a piece at a time, with a checkpoint between pieces, so that one request for a large
collection never holds the event loop for more than a few milliseconds.

Why: everything in a server shares one trio loop, the Raft loop and the node's Lease renewal
included. Decoding, presenting and encoding 1,000 pods is about half a second of CPU on a small
device; done in one step, every other task (the Raft loop's next Ready, a write's answer, a
heartbeat) waits that long, and a few such requests back to back make writes miss their
deadlines. In slices the same work takes a little longer for the one request, and nobody else
waits more than a slice.

`TimeSlice.pause()` is called between items; it checkpoints only once `STEP_BUDGET` seconds of
work passed since the last one (a checkpoint per item would cost a scheduling round per object
under load, and a small request never pays one). `encode_json` is `codec.dumps` for a body whose
last member is a long list (a List's `items`, a Table's `rows`): the same bytes, in pieces of
about `PIECE_BYTES`, encoded item by item between pauses; any other body is encoded whole.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import trio

from orchestrator.apiserver.codec import dumps

STEP_BUDGET = 0.003  # seconds of work between checkpoints
PIECE_BYTES = 64 * 1024  # a response body is sent in pieces of about this size
LIST_KEYS = ("items", "rows")  # the members that make a body long


class TimeSlice:
    """Cooperative time slicing for one bulk task (see the module doc); `clock` for tests."""

    __slots__ = ("_budget", "_clock", "_since")

    def __init__(
        self, budget: float = STEP_BUDGET, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self._budget = budget
        self._clock = clock
        self._since = clock()

    async def pause(self) -> None:
        """Checkpoint if this slice's budget is spent (then a new slice starts)."""
        if self._clock() - self._since >= self._budget:
            await trio.lowlevel.checkpoint()
            self._since = self._clock()


def long_list(body: Any) -> str | None:
    """The member of `body` that `encode_json` encodes in slices, or None: a list of more than
    one item that is the last member of a dict body (so the pieces, joined, are `dumps(body)`)."""
    if type(body) is not dict or not body:
        return None
    last = next(reversed(body))
    if last in LIST_KEYS and type(body[last]) is list and len(body[last]) > 1:
        return str(last)
    return None


async def encode_json(body: Any, timeslice: TimeSlice | None = None) -> list[bytes]:
    """`dumps(body)` as a list of pieces (see the module doc); never empty."""
    key = long_list(body)
    if key is None:
        return [dumps(body)]
    ts = timeslice or TimeSlice()
    head = dumps({**body, key: []})  # ...,"items":[]}
    pieces: list[bytes] = []
    current = [head[:-2]]  # ...,"items":[
    size = len(current[0])
    for i, item in enumerate(body[key]):
        await ts.pause()
        data = dumps(item)
        if i:
            current.append(b",")
        current.append(data)
        size += len(data) + 1
        if size >= PIECE_BYTES:
            pieces.append(b"".join(current))
            current, size = [], 0
    current.append(b"]}")
    pieces.append(b"".join(current))
    return pieces
