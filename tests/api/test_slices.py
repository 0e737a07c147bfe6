"""`apiserver.slices`: a long List or Table body is encoded in pieces that join to exactly
`codec.dumps` of it, with checkpoints between items once a time slice is spent; short bodies
and any other body are one piece, encoded without a checkpoint."""

from __future__ import annotations

import itertools

import pytest
import trio
import trio.testing

from orchestrator.apiserver import slices
from orchestrator.apiserver.codec import dumps
from orchestrator.apiserver.slices import TimeSlice, encode_json, long_list


def _list(n: int) -> dict[str, object]:
    return {
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": "7"},
        "items": [{"metadata": {"name": f"p{i}"}, "data": {"k": "é" * (i % 5)}} for i in range(n)],
    }


@pytest.mark.parametrize("n", [0, 1, 2, 3, 50, 700])
async def test_pieces_join_to_dumps(n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slices, "PIECE_BYTES", 256)  # many pieces
    body = _list(n)
    pieces = await encode_json(body)
    assert b"".join(pieces) == dumps(body)
    assert all(pieces)
    if n > 20:
        assert len(pieces) > 1


async def test_a_table_body_is_sliced_too() -> None:
    body = {"kind": "Table", "columnDefinitions": [], "rows": [{"cells": [i]} for i in range(9)]}
    assert long_list(body) == "rows"
    assert b"".join(await encode_json(body)) == dumps(body)


@pytest.mark.parametrize(
    "body",
    [
        {"kind": "Pod", "metadata": {"name": "p"}},
        {"items": [1, 2, 3], "metadata": {}},  # not the last member: encoded whole
        {"items": [1]},
        {"items": "not a list"},
        [1, 2, 3],
        "text",
        None,
        {},
    ],
)
async def test_other_bodies_are_one_piece(body: object) -> None:
    assert await encode_json(body) == [dumps(body)]


async def test_pause_checkpoints_only_when_the_slice_is_spent() -> None:
    ticks = itertools.count()
    ts = TimeSlice(budget=3, clock=lambda: float(next(ticks)))  # every clock read: +1 s
    with trio.testing.assert_no_checkpoints():
        await ts.pause()  # clock 1, 2: under budget
        await ts.pause()
    with trio.testing.assert_checkpoints():
        await ts.pause()  # clock 3: spent; a checkpoint, and a new slice from 4
    with trio.testing.assert_no_checkpoints():
        await ts.pause()  # clock 5
