"""Batch entries end to end: real `RaftNode`s + `RaftStore`s over loopback TCP.

When the state machine accepts batches (the MVCC store does), the proposals the driver's loop
takes in one turn become few log entries, each holding many commands (raft/node.py
`_entry_data`); a `_BatchWaiter` hands each command its own result. Here many writes are started
at once, and the tests check what callers see (every write resolves with its own result, a
conflict fails only its own write, forwarded batches resolve on the follower, a watcher sees
every revision once, in order) and, by reading the Raft log in raft.db, that batches were in
fact made.

Real clock (loopback TCP): conditions are polled under `trio.fail_after`, never slept for.
"""

from __future__ import annotations

import sqlite3
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio
from storekit import raft_stores

from orchestrator.raft.node import _BATCH_BYTES
from orchestrator.raft.statemachine import BATCH_TAG, unpack_batch
from orchestrator.store.raftstore import RaftStore
from orchestrator.store.types import (
    Event,
    EventType,
    KeyExists,
    KeyValue,
    StoreError,
    encode_create,
    encode_put,
)

ENVELOPE = struct.Struct("!QQ")  # origin node id, request id (raft/node.py)


async def leader_of(stores: dict[int, RaftStore]) -> int:
    """The leader's id, once one is known to every server (callers hold the deadline)."""
    while True:
        leaders = {s.node.leader_id for s in stores.values()}
        lead = leaders.pop() if len(leaders) == 1 else 0
        if lead in stores and stores[lead].node.is_leader:
            return lead
        await trio.sleep(0.01)


@dataclass
class LoggedEntry:
    index: int
    origin: int
    commands: list[bytes]
    batch: bool
    payload_bytes: int


def proposals_in_log(store: RaftStore) -> list[LoggedEntry]:
    """The client proposals in the server's durable Raft log (raft.db, read through a second,
    read-only connection): NORMAL entries with an envelope, each with its commands."""
    path = store.node.cfg.data_dir / "raft.db"
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT idx, type, data FROM entries ORDER BY idx").fetchall()
    finally:
        conn.close()
    out = []
    for idx, etype, data in rows:
        if etype != 0 or len(data) < ENVELOPE.size:
            continue  # a conf change, or a new leader's empty entry
        origin, _ = ENVELOPE.unpack_from(data)
        payload = bytes(data[ENVELOPE.size :])
        batch = payload[:1] == BATCH_TAG
        commands = unpack_batch(payload) if batch else [payload]
        out.append(LoggedEntry(idx, origin, commands, batch, len(payload)))
    return out


def created_keys(entries: list[LoggedEntry], prefix: str) -> list[str]:
    """The keys of the create commands under `prefix` in the log, in log order."""
    keys = []
    for e in entries:
        for c in e.commands:
            cmd = msgpack.unpackb(c)
            if cmd[0] == "create" and cmd[1].startswith(prefix):
                keys.append(cmd[1])
    return keys


async def until_applied(stores: dict[int, RaftStore], index: int) -> None:
    while any(s.node.applied_index() < index for s in stores.values()):  # noqa: ASYNC110  (polling)
        await trio.sleep(0.01)


# ---------------------------------------------------------------------------- tests
@pytest.mark.parametrize("size", [1, 3])
async def test_concurrent_writes_become_batches(tmp_path: Path, size: int) -> None:
    n = 200
    value = b"v" * 3000  # 200 x ~3 KiB: more than one batch's worth (_BATCH_BYTES)
    with trio.fail_after(20):
        async with raft_stores(tmp_path, size) as stores:
            lead = await leader_of(stores)
            store = stores[lead]
            results: dict[int, KeyValue] = {}

            async def create(i: int) -> None:
                results[i] = await store.create(f"/b/{i:03}", value + b"%d" % i)

            async with trio.open_nursery() as nursery:
                for i in range(n):
                    nursery.start_soon(create, i)

            revs = sorted(kv.mod_revision for kv in results.values())
            assert len(set(revs)) == n
            assert revs == list(range(revs[0], revs[0] + n))  # one revision each, no gaps
            for i, kv in results.items():
                assert kv.key == f"/b/{i:03}"
                assert kv.value == value + b"%d" % i
                assert kv.create_revision == kv.mod_revision
                assert kv.version == 1
            for s in stores.values():  # every server, linearizable reads
                listed = await s.list("/b/")
                assert [kv.key for kv in listed.kvs] == [f"/b/{i:03}" for i in range(n)]
                assert {kv.key: kv for kv in listed.kvs} == {kv.key: kv for kv in results.values()}

            entries = proposals_in_log(store)
            assert sorted(created_keys(entries, "/b/")) == [f"/b/{i:03}" for i in range(n)]
            assert len(entries) < n  # fewer log entries than commands: batches were made
            assert any(e.batch and len(e.commands) > 1 for e in entries)
            for e in entries:
                if e.batch:
                    assert sum(len(c) for c in e.commands) <= _BATCH_BYTES
            # ~600 KiB of commands cannot fit one batch
            assert sum(1 for e in entries if e.batch) >= 3
            if size > 1:  # followers hold the same log
                await until_applied(stores, entries[-1].index)
                for s in stores.values():
                    assert proposals_in_log(s) == entries


async def test_a_conflict_in_a_batch_fails_only_its_write(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with raft_stores(tmp_path, 3) as stores:
            lead = await leader_of(stores)
            store = stores[lead]
            await store.create("/c/taken", b"0")
            outcomes: dict[str, tuple[Any, BaseException | None]] = {}
            done = trio.Event()

            def submit(name: str, command: bytes) -> None:
                def finish(value: Any, error: BaseException | None) -> None:
                    outcomes[name] = (value, error)
                    if len(outcomes) == len(commands):
                        done.set()

                store.submit_write(command, finish)

            commands = {f"ok{i}": encode_create(f"/c/{i}", b"%d" % i) for i in range(20)}
            commands["dup-first"] = encode_create("/c/dup", b"first")
            commands["dup-second"] = encode_create("/c/dup", b"second")
            commands["taken"] = encode_create("/c/taken", b"again")
            commands["cas-stale"] = encode_put("/c/taken", b"x", 1)
            commands["last"] = encode_put("/c/last", b"z")
            for name, command in commands.items():  # all in one loop turn: one batch
                submit(name, command)
            await done.wait()

            for name in ("dup-second", "taken"):
                assert isinstance(outcomes[name][1], KeyExists), name
            stale = outcomes["cas-stale"][1]
            assert isinstance(stale, StoreError)
            assert stale.code == "conflict"
            ok = {k: v for k, (v, e) in outcomes.items() if e is None}
            assert set(ok) == set(commands) - {"dup-second", "taken", "cas-stale"}
            revs = [v.revision for v in ok.values()]
            assert len(set(revs)) == len(revs)
            assert ok["dup-first"].kv.value == b"first"
            assert await store.get("/c/dup") == ok["dup-first"].kv
            taken = await store.get("/c/taken")
            assert taken is not None
            assert taken.value == b"0"

            # They were one entry: the conflicts failed inside a batch, the rest applied.
            [entry] = [e for e in proposals_in_log(store) if e.batch]
            assert len(entry.commands) == len(commands)
            assert entry.origin == lead


async def test_writes_through_a_follower_are_forwarded_as_batches(tmp_path: Path) -> None:
    n = 150
    with trio.fail_after(20):
        async with raft_stores(tmp_path, 3) as stores:
            lead = await leader_of(stores)
            follower = next(nid for nid in stores if nid != lead)
            store = stores[follower]
            results: dict[int, KeyValue] = {}
            errors: list[BaseException] = []

            async def write(i: int) -> None:
                try:
                    if i % 3 == 0:
                        results[i] = await store.update(f"/f/{i % 10}", b"%d" % i)
                    else:
                        results[i] = await store.create(f"/f/new/{i}", b"%d" % i)
                except StoreError as exc:
                    errors.append(exc)

            async with trio.open_nursery() as nursery:
                for i in range(n):
                    nursery.start_soon(write, i)

            assert errors == []
            revs = sorted(kv.mod_revision for kv in results.values())
            assert revs == list(range(revs[0], revs[0] + n))
            # Each update got its own predecessor chain: versions per key are 1, 2, 3, ...
            versions: dict[str, list[int]] = {}
            for kv in sorted(results.values(), key=lambda kv: kv.mod_revision):
                versions.setdefault(kv.key, []).append(kv.version)
            for key, vs in versions.items():
                assert vs == list(range(1, len(vs) + 1)), key
            for i, kv in results.items():
                assert (await stores[lead].get(kv.key, revision=kv.mod_revision)) == kv, i

            mine = [e for e in proposals_in_log(stores[lead]) if e.origin == follower]
            assert sum(len(e.commands) for e in mine) == n
            assert len(mine) < n
            assert any(e.batch for e in mine)
            assert not any(e.origin == lead for e in proposals_in_log(stores[lead]))


@pytest.mark.parametrize("watch_on", ["leader", "follower"])
async def test_a_watcher_sees_every_revision_once_in_order(tmp_path: Path, watch_on: str) -> None:
    n = 200
    keys = [f"/w/{i}" for i in range(7)]
    with trio.fail_after(20):
        async with raft_stores(tmp_path, 3) as stores:
            lead = await leader_of(stores)
            watched = lead if watch_on == "leader" else next(i for i in stores if i != lead)
            start = await stores[lead].current_revision() + 1
            got: list[Event] = []
            async with stores[watched].watch("/w/", start) as watcher:
                results: list[Any] = []

                async def write(i: int) -> None:
                    # Writers at both servers: the leader's own and forwarded batches.
                    s = stores[lead] if i % 2 else stores[next(j for j in stores if j != lead)]
                    key = keys[i % len(keys)]
                    try:
                        if i % 5 == 4:
                            results.append(await s.delete(key))
                        else:
                            results.append(await s.update(key, b"%d" % i))
                    except StoreError as exc:
                        results.append(exc)  # a delete of an absent key

                async with trio.open_nursery() as nursery:
                    for i in range(n):
                        nursery.start_soon(write, i)
                end = await stores[lead].current_revision()
                async for response in watcher:
                    got.extend(response.events)
                    if response.revision >= end:
                        break
            assert len(results) == n
            revs = [e.kv.mod_revision for e in got]
            assert revs == list(range(start, end + 1))  # each once, in order, no gaps
            # The events are the writes' own: an update's event is its KeyValue.
            updates = {kv.mod_revision: kv for kv in results if isinstance(kv, KeyValue)}
            for e in got:
                if e.type is EventType.PUT and e.kv.mod_revision in updates:
                    assert e.kv == updates[e.kv.mod_revision]
            # What the watcher saw replays to the store's final state.
            state: dict[str, bytes] = {}
            for e in got:
                if e.type is EventType.PUT:
                    state[e.kv.key] = e.kv.value
                else:
                    state.pop(e.kv.key, None)
            listed = await stores[watched].list("/w/")
            assert {kv.key: kv.value for kv in listed.kvs} == state


async def test_writes_across_a_leadership_transfer_apply_once(tmp_path: Path) -> None:
    """Batches in flight when leadership moves away from the server that takes the writes (it
    refuses while transferring, then forwards to the new leader): a write whose attempt had no
    effect is retried by the store, one that landed is not; creates of distinct keys would show
    a double application."""
    n = 240
    with trio.fail_after(30):
        async with raft_stores(tmp_path, 3) as stores:
            lead = await leader_of(stores)
            target = next(nid for nid in stores if nid != lead)
            results: dict[int, KeyValue] = {}

            async def create(i: int) -> None:
                results[i] = await stores[lead].create(f"/t/{i:03}", b"%d" % i)

            async with trio.open_nursery() as nursery:
                for wave in range(8):
                    for i in range(wave * 30, wave * 30 + 30):
                        nursery.start_soon(create, i)
                    if wave == 3:
                        nursery.start_soon(stores[lead].node.transfer_leadership, target)
                    await trio.lowlevel.checkpoint()  # this wave reaches the loop before the next
            assert len(results) == n
            revs = sorted(kv.mod_revision for kv in results.values())
            assert len(set(revs)) == n
            listed = await stores[target].list("/t/")
            assert [kv.key for kv in listed.kvs] == [f"/t/{i:03}" for i in range(n)]
            new_lead = await leader_of(stores)
            keys = created_keys(proposals_in_log(stores[new_lead]), "/t/")
            assert sorted(keys) == [f"/t/{i:03}" for i in range(n)]  # each command appended once
