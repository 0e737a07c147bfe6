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
A list or Table response is not made as a body first: `ItemsEncoder` encodes each object as
it is selected, between the same pauses (`get.list_json`, `get.list_table_json`).
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


class ItemsEncoder:
    """A body whose last member is a long list, encoded an item at a time as the items come
    (a list's objects as they are selected, so that only their bytes are held, not the
    decoded objects: 1,000 pods are about 25 MiB of dicts and 3 MiB of JSON), in pieces of
    about `PIECE_BYTES`; `finish` adds the rest of the body, which may be known only then (a
    List's resourceVersion and continue token). The pieces, joined, are `codec.dumps` of the
    body with its items."""

    __slots__ = ("_count", "_current", "_pieces", "_size")

    def __init__(self) -> None:
        self._pieces: list[bytes] = []
        self._current: list[bytes] = []
        self._size = 0
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, item: Any) -> None:
        data = dumps(item)
        if self._count:
            self._current.append(b",")
        self._current.append(data)
        self._count += 1
        self._size += len(data) + 1
        if self._size >= PIECE_BYTES:
            self._pieces.append(b"".join(self._current))
            self._current, self._size = [], 0

    def finish(self, body: dict[str, Any]) -> list[bytes]:
        """The pieces of `body` with the items added, `body`'s last member being an empty
        list (where they go); never empty, no piece empty. The encoder is spent."""
        head = dumps(body)  # ...,"items":[]}
        if not head.endswith(b"[]}") or body[next(reversed(body))] != []:
            raise ValueError("the body's last member must be an empty list")
        self._current.append(b"]}")
        pieces, self._pieces = self._pieces, []
        pieces.append(b"".join(self._current))
        self._current = []
        pieces[0] = head[:-2] + pieces[0]  # ...,"items":[ and the first items
        return pieces


async def encode_json(body: Any, timeslice: TimeSlice | None = None) -> list[bytes]:
    """`dumps(body)` as a list of pieces (see the module doc); never empty."""
    key = long_list(body)
    if key is None:
        return [dumps(body)]
    ts = timeslice or TimeSlice()
    encoder = ItemsEncoder()
    for item in body[key]:
        await ts.pause()
        encoder.add(item)
    return encoder.finish({**body, key: []})
