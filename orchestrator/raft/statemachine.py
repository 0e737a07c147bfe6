"""The interface between the Raft driver and the replicated state machine it feeds.

Invariants every implementation must keep:
- Exactly-once apply: `apply` records the applied index in the *same* durable transaction as the
  changes the entries make, and skips entries at or below `applied_index()`. After a crash the
  driver may hand the same committed entries again; they must have no second effect.
- `apply` returns one result per input entry, in order (None for entries it skipped or that carry
  no command), and reports a malformed command as a result value rather than raising: a command
  is committed by the whole cluster, so every replica must reach the same outcome for it.
- `snapshot()` returns the applied index together with data describing exactly the state at that
  index; `restore(index, data)` replaces the whole state with it and sets the applied index to
  `index`, atomically.
- `sync()` makes everything applied so far survive a power cut. `apply` itself need not fsync
  (the Raft log is the durable record and is replayed), but the driver calls `sync()` before it
  forgets log entries, and after `restore`: from then on the state machine's own database is
  the snapshot, so the Raft storage keeps only the snapshot's metadata.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .types import Entry


class StateMachine(Protocol):
    def applied_index(self) -> int:
        """The index of the last entry whose effect is durable (0 for a fresh machine)."""
        ...

    def apply(self, entries: Sequence[Entry]) -> list[object]:
        """Apply committed entries (in index order) durably; one result per entry."""
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
