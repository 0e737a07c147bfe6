"""`MVCCStore.apply_now` (raft/statemachine.py `AppliesNow`): the driver's apply of a few small
entries on its event loop. It applies exactly as `apply` would (results, events, rows) but never
ends the transaction, whatever its age; it refuses, applying nothing, more than
`APPLY_NOW_BYTES` of commands or a compaction (alone or in a batch); `commit_due` says when the
open transaction is `commit_interval` old. Real SQLite files in tmp_path, synchronous."""

from __future__ import annotations

from pathlib import Path

from test_mvcc import Node, dump

from orchestrator.raft.statemachine import pack_batch
from orchestrator.raft.types import Entry, EntryType
from orchestrator.store.mvcc import APPLY_NOW_BYTES
from orchestrator.store.types import encode_compact, encode_create, encode_put


def entries(node: Node, *commands: bytes) -> list[Entry]:
    out = []
    for data in commands:
        node.index += 1
        out.append(Entry(1, node.index, EntryType.NORMAL, data))
    return out


def test_apply_now_applies_as_apply_does_and_leaves_the_commit_to_the_caller(
    tmp_path: Path,
) -> None:
    now, plain = Node(tmp_path / "now.db"), Node(tmp_path / "plain.db")  # commit_interval 0
    commands = [encode_create("/a", b"1"), encode_put("/a", b"2"), encode_create("/a", b"3")]
    for cmds in ([commands[0]], commands[1:]):
        got = now.store.apply_now(entries(now, *cmds))
        want = plain.store.apply(entries(plain, *cmds))
        assert got is not None
        assert repr(got.results) == repr(want)  # one a failure (/a exists): errors by repr
        assert list(got.events) == plain.store.take_events()
        assert now.store._db().in_transaction  # not committed, although the window is 0 s
        assert now.store.commit_due()
    now.store.commit()
    assert not now.store.commit_due()
    assert dump(now.path) == dump(plain.path)
    assert now.store.applied_index() == plain.store.applied_index() == 3
    now.close()
    plain.close()


def test_commit_is_not_due_before_the_window_ends(tmp_path: Path) -> None:
    node = Node(tmp_path / "s.db", commit_interval=3600.0)
    assert node.store.apply_now(entries(node, encode_put("/k", b"v"))) is not None
    assert not node.store.commit_due()
    node.close()


def test_apply_now_refuses_large_batches_and_compactions(tmp_path: Path) -> None:
    node = Node(tmp_path / "s.db")
    node.apply(encode_put("/k", b"v"), encode_put("/k", b"w"))
    before = dump(node.path)
    big = encode_put("/big", b"x" * APPLY_NOW_BYTES)
    refused = [
        [big],
        [encode_compact(2)],
        [pack_batch([encode_put("/k", b"z"), encode_compact(2)])],
        [encode_put("/k", b"z"), encode_compact(2)],
    ]
    for cmds in refused:
        index = node.index
        assert node.store.apply_now(entries(node, *cmds)) is None, cmds
        node.index = index  # nothing was applied: the same indexes go to `apply`
        assert node.store.applied_index() == index
    node.store.commit()
    assert dump(node.path) == before
    # What it refused, `apply` takes.
    assert node.apply(big)[0].error is None
    node.close()
