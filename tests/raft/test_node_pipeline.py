"""`RaftNode._persist_and_apply`: a Ready's persist and apply are two calls queued at once on one
database thread, and the driver acts on the first result while the second runs.

- A follower persists first and sends its acknowledgement (which promises only what is
  persisted) while it applies.
- A leader whose committed entries were persisted by earlier Readies applies first and answers
  their proposals while its new entries are persisted.
- An entry committed in the same Ready that persists it (a lone server) is applied only after
  that persist.
- A Ready that only commits is not saved, and its entries are applied on the event loop when
  the state machine can (`AppliesNow`) and its thread is idle (else on the thread); the apply
  window is committed on the thread after the answer.

Readies come from real cores driven by the in-memory harness; the driver under test gets a
storage, state machine and transport that record what happens, and gates (threading.Event on
the database's thread) that hold a call until the test has seen what must happen meanwhile.
Real threads, so no mock clock: every wait is on an event, bounded by `trio.fail_after`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio
import trio.testing
from harness import Cluster

from orchestrator.raft.core import RaftCore
from orchestrator.raft.node import NodeConfig, RaftNode
from orchestrator.raft.node_state import ENVELOPE
from orchestrator.raft.statemachine import Applied
from orchestrator.raft.types import Entry, HardState, Message, MsgType, Ready, Snapshot
from orchestrator.raft.waiters import Waiter

GATE_SECONDS = 10.0  # a gate opens by itself after this, so a broken order fails, not hangs


class Recorder:
    """Storage, state machine and transport in one: records each call in `log`."""

    def __init__(self, *, hold_save: bool = False, hold_apply: bool = False) -> None:
        self.log: list[tuple[str, Any]] = []
        self.save_gate = threading.Event()
        self.apply_gate = threading.Event()
        if not hold_save:
            self.save_gate.set()
        if not hold_apply:
            self.apply_gate.set()
        self.sent = trio.Event()
        self.last_save_seconds: float | None = None

    def open_gates(self) -> None:
        self.save_gate.set()
        self.apply_gate.set()

    # RaftStorage
    def save(
        self,
        hard_state: HardState | None,
        entries: Sequence[Entry],
        snapshot: Snapshot | None = None,
    ) -> None:
        self.log.append(("save", [e.index for e in entries]))
        self.save_gate.wait(GATE_SECONDS)
        self.log.append(("saved", [e.index for e in entries]))

    # StateMachine
    def apply(self, entries: Sequence[Entry]) -> Applied[object]:
        self.log.append(("apply", [e.index for e in entries]))
        self.apply_gate.wait(GATE_SECONDS)
        self.log.append(("applied", [e.index for e in entries]))
        return Applied([None] * len(entries))

    # PeerTransport
    def send_now(self, messages: list[Message]) -> None:
        for m in messages:
            self.log.append(("send", m.type.name))
        self.sent.set()

    def position(self, event: tuple[str, Any]) -> int:
        return self.log.index(event)


def driver(core: RaftCore, tmp_path: Path, rec: Recorder) -> RaftNode:
    """A RaftNode around `core` that persists, applies and sends through `rec` (not started:
    the tests call `_handle_ready` themselves)."""
    node = RaftNode(
        NodeConfig(node_id=core.id, data_dir=tmp_path, peer_listen="127.0.0.1:0"),
        lambda _: rec,  # type: ignore[arg-type,return-value]
    )
    node.core = core
    node.storage = rec  # type: ignore[assignment]
    node.sm = rec  # type: ignore[assignment]
    node.transport = rec  # type: ignore[assignment]
    return node


def elected() -> Cluster:
    c = Cluster(3)
    c.elect(1)
    c.deliver_all()
    return c


def indexes(entries: list[Entry]) -> list[int]:
    return [e.index for e in entries]


async def test_a_follower_acknowledges_once_persisted_while_it_applies(tmp_path: Path) -> None:
    c = elected()
    c.propose(1, b"a")
    c.deliver_round()  # the followers persist a and acknowledge it
    c.deliver_round()  # the leader commits a and tells them
    held = c.take(lambda m: m.to == 2)
    b_index, _ = c.propose(1, b"b")
    held += c.take(lambda m: m.to == 2)
    core = c[2]
    for m in held:
        core.step(m)
    rd = core.ready()
    assert indexes(rd.entries) == [b_index]
    assert indexes(rd.committed) == [b_index - 1]  # a: persisted by an earlier Ready

    rec = Recorder(hold_apply=True)
    node = driver(core, tmp_path, rec)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(node._handle_ready, rd)
            try:
                await rec.sent.wait()
                # The acknowledgement left while a is still being applied.
                assert ("applied", [b_index - 1]) not in rec.log
            finally:
                rec.open_gates()
    assert {m.type for m in rd.messages} == {MsgType.APP_RESP}
    assert rec.position(("saved", [b_index])) < rec.position(("send", "APP_RESP"))
    assert rec.position(("send", "APP_RESP")) < rec.position(("applied", [b_index - 1]))
    assert node.applied_index() == b_index - 1


async def test_a_leader_answers_while_its_new_entries_are_persisted(tmp_path: Path) -> None:
    c = elected()
    rid = 12345
    a_index, _ = c.propose(1, ENVELOPE.pack(1, rid) + b"a")  # persisted (harness)
    c.deliver_round()  # the followers acknowledge a
    core = c[1]
    for m in c.take(lambda m: m.to == 1):
        core.step(m)  # a is committed
    core.propose([b"c"])
    rd = core.ready()
    assert indexes(rd.entries) == [a_index + 1]
    assert indexes(rd.committed) == [a_index]

    rec = Recorder(hold_save=True)
    node = driver(core, tmp_path, rec)
    waiter = Waiter()
    node._waiters[rid] = waiter
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(node._handle_ready, rd)
            try:
                await waiter.wait()
                # a's proposal is answered while c is still being persisted.
                assert ("saved", [a_index + 1]) not in rec.log
            finally:
                rec.open_gates()
    sends = len(rd.messages)  # to the followers, before the leader's own persist
    assert sends > 0
    # a's commit rides on c's append: one message per follower.
    assert rec.log[:sends] == [("send", "APP")] * sends
    assert rec.log[sends:] == [
        ("apply", [a_index]),
        ("applied", [a_index]),
        ("save", [a_index + 1]),
        ("saved", [a_index + 1]),
    ]
    assert node.applied_index() == a_index


async def test_an_entry_is_applied_only_after_it_is_persisted(tmp_path: Path) -> None:
    """A lone server commits its proposal at once: the Ready that persists it also hands it
    out for applying, and the apply must come second."""
    c = Cluster(1)
    c.campaign(1)
    c.deliver_all()
    core = c[1]
    index, _ = core.propose([b"x"])
    rd: Ready = core.ready()
    assert indexes(rd.entries) == indexes(rd.committed) == [index]

    rec = Recorder()
    node = driver(core, tmp_path, rec)
    with trio.fail_after(30):
        await node._handle_ready(rd)
    assert rec.log == [
        ("save", [index]),
        ("saved", [index]),
        ("apply", [index]),
        ("applied", [index]),
    ]


class ApplyingNow(Recorder):
    """A `Recorder` whose state machine also applies on the event loop (`AppliesNow`)."""

    def __init__(self, *, commit_due: bool = False, **kw: bool) -> None:
        super().__init__(**kw)
        self.due = commit_due

    def apply_now(self, entries: Sequence[Entry]) -> Applied[object] | None:
        self.log.append(("apply_now", [e.index for e in entries]))
        return Applied([None] * len(entries))

    def commit_due(self) -> bool:
        return self.due

    def commit(self) -> None:
        self.log.append(("commit", None))


def committing_leader() -> tuple[RaftCore, Ready, int]:
    """A leader whose entry a (persisted earlier) has just been acknowledged: its Ready only
    commits a (no entries; the hard state moves only its commit index)."""
    c = elected()
    a_index, _ = c.propose(1, ENVELOPE.pack(1, 777) + b"a")
    c.deliver_round()
    core = c[1]
    for m in c.take(lambda m: m.to == 1):
        core.step(m)
    rd = core.ready()
    assert not rd.entries
    assert indexes(rd.committed) == [a_index]
    assert rd.hard_state is not None
    assert rd.hard_state.commit == a_index
    return core, rd, a_index


async def test_a_ready_that_only_commits_is_not_saved_and_applies_on_the_event_loop(
    tmp_path: Path,
) -> None:
    core, rd, a_index = committing_leader()
    rec = ApplyingNow()
    node = driver(core, tmp_path, rec)
    node._applies_now = rec
    waiter = Waiter()
    node._waiters[777] = waiter
    with trio.fail_after(30):
        await node._handle_ready(rd)
        await waiter.wait()
    # The new commit index, to the followers: COMMIT to one that acknowledged the whole log
    # (not answered), an append without entries to one whose acknowledgement is on its way.
    assert {m.type for m in rd.messages} <= {MsgType.COMMIT, MsgType.APP}
    assert MsgType.COMMIT in {m.type for m in rd.messages}
    assert not any(m.entries for m in rd.messages)
    sent = [("send", m.type.name) for m in rd.messages]
    assert rec.log == [*sent, ("apply_now", [a_index])]
    assert node.applied_index() == a_index


async def test_applies_on_the_thread_while_the_thread_is_busy(tmp_path: Path) -> None:
    core, rd, a_index = committing_leader()
    rec = ApplyingNow()
    node = driver(core, tmp_path, rec)
    node._applies_now = rec
    busy = threading.Event()
    release = threading.Event()

    def occupy() -> None:  # another call (a read) holds the state machine's thread
        busy.set()
        release.wait(GATE_SECONDS)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(node._sm_db.run, occupy)
            await trio.to_thread.run_sync(busy.wait, GATE_SECONDS)
            nursery.start_soon(node._handle_ready, rd)
            await trio.testing.wait_all_tasks_blocked()
            release.set()
    assert ("apply", [a_index]) in rec.log
    assert not any(kind == "apply_now" for kind, _ in rec.log)


async def test_the_apply_window_is_committed_on_the_thread_after_the_answer(
    tmp_path: Path,
) -> None:
    core, rd, _ = committing_leader()
    rec = ApplyingNow(commit_due=True)
    node = driver(core, tmp_path, rec)
    node._applies_now = rec
    waiter = Waiter()
    node._waiters[777] = waiter
    with trio.fail_after(30):
        await node._handle_ready(rd)
    assert waiter.done
    assert rec.log[-1] == ("commit", None)
