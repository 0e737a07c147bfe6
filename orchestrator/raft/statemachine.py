"""The interface between the Raft driver and the replicated state machine it feeds.

Invariants every implementation must keep:
- Exactly-once apply: `apply` records the applied index in the *same* durable transaction as the
  changes the entries make, and skips entries at or below `applied_index()`. After a crash the
  driver may hand the same committed entries again; they must have no second effect.
- `apply` returns one result per input entry, in order (None for entries it skipped or that carry
  no command), and reports a malformed command as a result value rather than raising: a command
  is committed by the whole cluster, so every replica must reach the same outcome for it.
- `apply` also returns the events its changes made (`Applied.events`, in order; for the MVCC
  store, the watch events), which the driver hands to its `on_apply` observer once the batch
  is applied. A skipped entry makes no event, so a replay after a crash reports nothing twice;
  `restore` makes none (an observer learns of it through `on_restore` and catches up from the
  state machine).
- `snapshot()` returns the applied index together with data describing exactly the state at that
  index; `restore(index, data)` replaces the whole state with it and sets the applied index to
  `index`, atomically.
- `sync()` makes everything applied so far survive a power cut. `apply` itself need not fsync
  (the Raft log is the durable record and is replayed), but the driver calls `sync()` before it
  forgets log entries, and after `restore`: from then on the state machine's own database is
  the snapshot, so the Raft storage keeps only the snapshot's metadata.

Applying on the event loop (optional, `AppliesNow`): a state machine whose applies of a few small
entries are quick CPU work (no fsync, no commit, no compaction) may offer `apply_now`, which the
driver calls on its own (trio) thread instead of handing the entries to the state machine's
thread and waiting for it (two thread wake-ups: for a lone write, more than the apply itself).
`apply_now` returns None, doing nothing, for entries it cannot apply that quickly; those go
through `apply`. What it applied is not yet durable even as far as `apply` is (no commit): the
driver calls `commit()` on the state machine's thread when `commit_due()` says so.

Batches (optional): a state machine whose `accepts_batches` is true also applies entries made by
`pack_batch` (several commands that arrived together, one log entry for all: one log row, one
message slot, one envelope instead of one each). Their commands are applied in order, as if they
were consecutive entries, and the entry's result is the list of their results. A batch is
recognised by its first byte, 0xC1, which msgpack never produces, so no command can be mistaken
for one; a state machine whose commands are not msgpack must not accept batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, NamedTuple, Protocol, TypeVar, runtime_checkable

import msgpack

from orchestrator.raft.types import Entry

BATCH_TAG = b"\xc1"

E_co = TypeVar("E_co", covariant=True)


class Applied(NamedTuple, Generic[E_co]):
    """What `StateMachine.apply` did: one result per entry, and the events of its changes."""

    results: list[object]
    events: Sequence[E_co] = ()


def pack_batch(commands: Sequence[bytes]) -> bytes:
    """One entry payload holding `commands`, for a state machine that accepts batches."""
    return BATCH_TAG + msgpack.packb(commands)  # type: ignore[no-any-return]


def unpack_batch(data: bytes) -> list[bytes]:
    """The commands of a `pack_batch` payload; ValueError if `data` is not one."""
    if data[:1] != BATCH_TAG:
        raise ValueError("not a batch")
    try:
        commands = msgpack.unpackb(memoryview(data)[1:])
    except Exception as exc:  # msgpack raises many types for garbage input
        raise ValueError(f"undecodable batch: {type(exc).__name__}") from None
    if not isinstance(commands, list) or not all(isinstance(c, bytes) for c in commands):
        raise ValueError("a batch is an array of commands")
    return commands


class StateMachine(Protocol[E_co]):
    def applied_index(self) -> int:
        """The index of the last entry whose effect is durable (0 for a fresh machine)."""
        ...

    def apply(self, entries: Sequence[Entry]) -> Applied[E_co]:
        """Apply committed entries (in index order) durably; one result per entry, and the
        events of the changes."""
        ...

    def snapshot(self) -> tuple[int, bytes]:
        """The applied index and a serialization of the state at exactly that index."""
        ...

    def restore(self, index: int, data: bytes) -> None:
        """Replace the whole state with a snapshot taken at `index`."""
        ...

    def sync(self) -> None:
        """Make every applied change durable (fsync)."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class AppliesNow(Protocol[E_co]):
    """A state machine that can apply small batches on the event loop (module doc)."""

    def apply_now(self, entries: Sequence[Entry]) -> Applied[E_co] | None:
        """`apply`, without ending the transaction and only if it is quick CPU work; None
        (nothing applied) otherwise."""
        ...

    def commit_due(self) -> bool:
        """Do the applies made since the last commit wait long enough to be committed now?"""
        ...

    def commit(self) -> None:
        """Commit the applies made so far (no fsync needed: see `sync`)."""
        ...
