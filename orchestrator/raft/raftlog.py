"""The Raft log as the core sees it: a compaction point followed by a contiguous list of entries.

Layout (indexes are 1-based)::

    ... compacted ... | offset | entries[0] = offset+1 ... entries[-1] = last_index
                                 ^ stable: persisted up to here (driver told us via advance)
                                 ^ committed: known durable on a quorum
                                 ^ applied: handed to the driver for applying

Invariants: offset <= applied <= committed <= last_index; stable <= last_index; the snapshot
that a lagging follower is sent (`snapshot`) has index >= offset, so every index above it is
either in `entries` or not yet written. Pure data structure: no I/O.
"""

from __future__ import annotations

from orchestrator.raft.types import Entry, Snapshot, SnapshotMeta


class RaftLog:
    __slots__ = (
        "applied",
        "committed",
        "entries",
        "offset",
        "offset_term",
        "pending_snapshot",
        "snapshot",
        "stable",
    )

    def __init__(self, snapshot: SnapshotMeta, entries: list[Entry], committed: int) -> None:
        self.snapshot = snapshot
        self.offset = snapshot.index
        self.offset_term = snapshot.term
        if entries and entries[0].index != self.offset + 1:
            # The stored log may start below the snapshot (compaction keeps a tail for slow
            # followers); drop what the snapshot already covers except the entry at offset.
            first = entries[0].index
            if first > self.offset + 1:
                raise ValueError(f"log starts at {first}, after snapshot index {self.offset}")
            cut = self.offset - first  # entries[cut] is at index offset
            self.offset_term = entries[cut].term if cut >= 0 else self.offset_term
            entries = entries[cut + 1 :]
        self.entries = entries
        self.stable = self.last_index()
        self.committed = max(committed, self.offset)
        self.applied = self.offset
        self.pending_snapshot: Snapshot | None = None

    # ---- queries -------------------------------------------------------------------------
    def first_index(self) -> int:
        return self.offset + 1

    def last_index(self) -> int:
        return self.offset + len(self.entries)

    def last_term(self) -> int:
        return self.entries[-1].term if self.entries else self.offset_term

    def term(self, index: int) -> int | None:
        """Term of the entry at index; None when compacted away or not yet written."""
        if index == self.offset:
            return self.offset_term
        pos = index - self.offset - 1
        if pos < 0 or pos >= len(self.entries):
            return None
        return self.entries[pos].term

    def match_term(self, index: int, term: int) -> bool:
        return self.term(index) == term

    def is_up_to_date(self, last_index: int, last_term: int) -> bool:
        """Raft §5.4.1: a candidate's log is at least as up to date as ours."""
        my_term = self.last_term()
        return last_term > my_term or (last_term == my_term and last_index >= self.last_index())

    def slice(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        """Entries [lo, hi), at least one if any, stopping once max_bytes of data is reached."""
        start = lo - self.offset - 1
        end = min(hi - self.offset - 1, len(self.entries))
        if start >= end:
            return []
        out = self.entries[start:end]
        size = 0
        for i, e in enumerate(out):
            size += len(e.data) + 16
            if size > max_bytes and i > 0:
                return out[:i]
        return out

    def find_conflict_by_term(self, index: int, term: int) -> int:
        """Largest index <= `index` whose term is <= `term` (or the compaction point).

        Used for fast back-off: one rejected append skips a whole term of divergent entries."""
        index = min(index, self.last_index())
        while index > self.offset:
            t = self.term(index)
            if t is not None and t <= term:
                return index
            index -= 1
        return index

    def unstable(self) -> list[Entry]:
        return self.entries[self.stable - self.offset :] if self.stable < self.last_index() else []

    def next_committed(self, max_entries: int) -> list[Entry]:
        lo = max(self.applied, self.offset) + 1  # after a snapshot install, start above it
        hi = min(self.committed, lo + max_entries - 1)
        if hi < lo:
            return []
        return self.entries[lo - self.offset - 1 : hi - self.offset]

    # ---- mutations -----------------------------------------------------------------------
    def append(self, entries: list[Entry]) -> int:
        """Append entries that follow on from, or overwrite a suffix of, the log."""
        if not entries:
            return self.last_index()
        first = entries[0].index
        if first <= self.committed:
            raise AssertionError(f"overwriting committed entry {first} (commit {self.committed})")
        keep = first - self.offset - 1
        if keep < len(self.entries):
            del self.entries[keep:]
        self.entries.extend(entries)
        if self.stable >= first:
            self.stable = first - 1
        return self.last_index()

    def maybe_append(
        self, index: int, log_term: int, commit: int, entries: list[Entry]
    ) -> int | None:
        """Follower side of AppendEntries. Returns the last index now known to match the
        leader, or None when the entry at `index` does not have term `log_term`."""
        if not self.match_term(index, log_term):
            return None
        last_new = index + len(entries)
        # Skip the prefix we already hold; only a real conflict truncates.
        # (The caller has rejected appends below the commit index, so no entry here is compacted.)
        for i, e in enumerate(entries):
            if self.term(e.index) != e.term:
                self.append(entries[i:])
                break
        self.commit_to(min(commit, last_new))
        return last_new

    def commit_to(self, index: int) -> None:
        if index > self.committed:
            if index > self.last_index():
                raise AssertionError(f"commit {index} beyond last index {self.last_index()}")
            self.committed = index

    def restore(self, snapshot: Snapshot) -> None:
        """Replace the whole log with a snapshot received from the leader."""
        meta = snapshot.meta
        self.snapshot = meta
        self.offset, self.offset_term = meta.index, meta.term
        self.entries = []
        self.committed = meta.index
        self.stable = meta.index
        self.pending_snapshot = snapshot

    def compact(self, snapshot: SnapshotMeta, upto: int) -> None:
        """Forget entries up to `upto` (already applied and covered by `snapshot`)."""
        if upto > self.applied or upto > snapshot.index:
            raise ValueError(
                f"cannot compact to {upto}: applied {self.applied}, snapshot {snapshot.index}"
            )
        if snapshot.index >= self.snapshot.index:
            self.snapshot = snapshot
        if upto <= self.offset:
            return
        term = self.term(upto)
        assert term is not None
        del self.entries[: upto - self.offset]
        self.offset, self.offset_term = upto, term
