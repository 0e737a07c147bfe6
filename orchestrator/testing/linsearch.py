"""The search engine of the linearizability checker: the register model and the Wing & Gong /
Lowe backtracking search over the operations of ONE key (`search`), on a doubly linked event list
with lift/unlift, memoized on (linearized set, state), with the pruning rules and the symmetry
reduction. The theory of operation, and why each pruning rule keeps the search exact, is in
`orchestrator.testing.linearizability`, which prepares the operations (`KeyOp`), calls `search`
per key and explains failures.

Invariants: `search(ops)` needs ``ops[i].index == i``; it never mutates the `KeyOp`s; it returns
`OK`, `FAIL` (with the longest partial linearization and the linearizable frontier) or
`TIMEOUT` once `time.monotonic()` passes the deadline (looked at every `_CLOCK_EVERY` steps).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = [
    "CAS",
    "DELETE",
    "FAIL",
    "GET",
    "KINDS",
    "OK",
    "PUT",
    "TIMEOUT",
    "KeyOp",
    "Operation",
    "Outcome",
    "State",
    "search",
]

State = bytes | None

PUT = 0
GET = 1
DELETE = 2
CAS = 3
KINDS: dict[str, int] = {"put": PUT, "get": GET, "delete": DELETE, "cas": CAS}

OK = 0
FAIL = 1
TIMEOUT = 2

# How many search steps between two looks at the clock.
_CLOCK_EVERY = 0x3FF


@dataclass(frozen=True, slots=True)
class Operation:
    """One client operation on the key-value store, as observed by the client.

    `value` is the new value for ``put`` and ``cas`` (``None`` for ``get``/``delete``);
    `expected` is the value ``cas`` compares against (``None`` = the key must be absent).
    `ret` is ``None`` if the client never got a response (crash/timeout): the operation may or
    may not have taken effect, at any time after `call`, and `output` is ignored.
    `output`: ``get`` -> the ``bytes`` read or ``None``; ``put`` -> ``True``;
    ``delete`` -> whether the key existed; ``cas`` -> whether it swapped.
    """

    client: int
    kind: str
    key: str
    value: bytes | None
    expected: bytes | None
    call: float
    ret: float | None
    output: object


@dataclass(frozen=True, slots=True)
class KeyOp:
    """An operation prepared for the search on one key. `index` is its bit in the bitmask."""

    index: int
    kind: int
    value: State
    expected: State
    output: object  # normalised: bytes | None for get, bool for delete / cas, None otherwise
    call: float
    ret: float  # math.inf when indeterminate
    completed: bool
    source: Operation
    source_index: int  # position in the history given to check_history


class _Entry:
    """A node of the event list. Call entries carry the operation and point at their return."""

    __slots__ = (
        "bit",
        "completed",
        "expected",
        "index",
        "is_call",
        "kind",
        "match",
        "next",
        "output",
        "prereq",
        "prev",
        "rank",
        "read_only",
        "value",
    )

    def __init__(self, op: KeyOp | None, is_call: bool) -> None:
        self.is_call = is_call
        self.match: _Entry = self
        self.prev: _Entry = self
        self.next: _Entry = self
        self.prereq = 0  # bit of an identical operation that must be linearized first
        self.rank = 0  # return entries: how many finite returns precede this one
        if op is None:
            self.index = -1
            self.bit = 0
            self.kind = -1
            self.value: State = None
            self.expected: State = None
            self.output: object = None
            self.completed = False
            self.read_only = False
        else:
            self.index = op.index
            self.bit = 1 << op.index
            self.kind = op.kind
            self.value = op.value
            self.expected = op.expected
            self.output = op.output
            self.completed = op.completed
            self.read_only = op.completed and _is_read_only(op)


@dataclass(slots=True)
class Outcome:
    status: int
    best: list[int] = field(default_factory=list)  # longest partial linearization (op indices)
    best_state: State = None
    # Failures only: every completed operation returning among the first `frontier` returns
    # was linearized in some explored configuration, so that prefix is linearizable.
    frontier: int = 0


def search(ops: Sequence[KeyOp], deadline: float | None) -> Outcome:
    """Wing & Gong / Lowe search over the operations of one key. ``ops[i].index == i``."""
    remaining = sum(1 for op in ops if op.completed)
    if remaining == 0:
        return Outcome(OK)

    # Build the event list: calls before returns at equal times (see module docstring).
    events: list[tuple[float, int, int]] = []
    for op in ops:
        events.append((op.call, 0, op.index))
        events.append((op.ret, 1, op.index))
    events.sort()
    head = _Entry(None, False)
    tail = _Entry(None, False)
    call_entries: list[_Entry | None] = [None] * len(ops)
    prev = head
    rank = 0
    for _time, is_return, index in events:
        if is_return:
            entry = _Entry(None, False)
            entry.rank = rank
            rank += 1
            call_entry = call_entries[index]
            assert call_entry is not None
            call_entry.match = entry
        else:
            entry = _Entry(ops[index], True)
            call_entries[index] = entry
        prev.next = entry
        entry.prev = prev
        prev = entry
    prev.next = tail
    tail.prev = prev
    _link_identical(ops, events, call_entries)

    state: State = None
    linearized = 0
    # (entry, state before it, forced): `forced` marks a read-only move (see below).
    stack: list[tuple[_Entry, State, bool]] = []
    # Bits of the indeterminate operations currently linearized, in stack order.
    indeterminate_used: list[int] = []
    cache: set[tuple[int, State]] = set()
    best: list[int] = []
    best_state: State = None
    frontier = 0
    steps = 0
    monotonic = time.monotonic

    entry = head
    # The moves of a configuration are tried in two passes over its candidates: completed
    # operations first, then indeterminate ones, which are rarely needed.
    indeterminate_pass = False
    fresh = True  # just reached a new configuration
    while True:
        steps += 1
        if deadline is not None and not steps & _CLOCK_EVERY and monotonic() >= deadline:
            return Outcome(TIMEOUT, best, best_state)
        backtrack = False
        if fresh:
            # In a new configuration, first look for a read-only move: a completed candidate
            # that never changes the state and whose output the model accepts now. If one
            # exists, it is the only move tried here (see "pruning" in the module docstring).
            fresh = False
            candidate = head.next
            while candidate.is_call:
                if (
                    candidate.read_only
                    and linearized & candidate.prereq == candidate.prereq
                    and _step(candidate, state)[0]
                ):
                    break
                candidate = candidate.next
            if candidate.is_call:
                new_linearized = linearized | candidate.bit
                config = (new_linearized, state)
                if config in cache:
                    backtrack = True
                else:
                    cache.add(config)
                    stack.append((candidate, state, True))
                    linearized = new_linearized
                    remaining -= 1
                    if remaining == 0:
                        return Outcome(OK)
                    _lift(candidate)
                    fresh = True
                    continue
            entry = head.next
            indeterminate_pass = False
        if not backtrack and not entry.is_call and not indeterminate_pass:
            # End of the first pass: go over the candidates again for indeterminate ones.
            if entry.rank > frontier:
                frontier = entry.rank
            indeterminate_pass = True
            entry = head.next
            continue
        if backtrack or not entry.is_call:
            # The first pending return was reached in both passes: its operation can no
            # longer be placed. Or the configuration is known to be dead. Backtrack.
            while True:
                if not stack:
                    return Outcome(FAIL, best, best_state, frontier)
                if len(stack) > len(best):  # a local maximum: remember it for the explanation
                    best = [e.index for e, _, _ in stack]
                    best_state = state
                entry, state, forced = stack.pop()
                linearized ^= entry.bit
                if entry.completed:
                    remaining += 1
                else:
                    indeterminate_used.pop()
                _unlift(entry)
                if not forced:
                    break
                # The configuration before a read-only move has no other moves worth trying.
            indeterminate_pass = not entry.completed
            entry = entry.next
            continue
        if entry.completed == indeterminate_pass or linearized & entry.prereq != entry.prereq:
            # Not for this pass, or an identical operation must be taken first.
            entry = entry.next
            continue
        accepted, new_state = _step(entry, state)
        # An indeterminate operation that would not change the state is never worth taking.
        if accepted and (entry.completed or new_state != state):
            new_linearized = linearized | entry.bit
            config = (new_linearized, new_state)
            if config not in cache:
                cache.add(config)
                # Dominance: reaching the same state without one of the indeterminate
                # operations leaves strictly more options, so if that configuration was
                # already explored (and failed) this one fails too.
                if entry.completed:
                    dominated = False
                    for bit in indeterminate_used:
                        if (new_linearized ^ bit, new_state) in cache:
                            dominated = True
                            break
                else:
                    dominated = (linearized, new_state) in cache
                    if not dominated:
                        for bit in indeterminate_used:
                            if (new_linearized ^ bit, new_state) in cache:
                                dominated = True
                                break
                if not dominated:
                    stack.append((entry, state, False))
                    state = new_state
                    linearized = new_linearized
                    if entry.completed:
                        remaining -= 1
                        if remaining == 0:
                            return Outcome(OK)
                    else:
                        indeterminate_used.append(entry.bit)
                    _lift(entry)
                    fresh = True
                    continue
        entry = entry.next


def _link_identical(
    ops: Sequence[KeyOp],
    events: Sequence[tuple[float, int, int]],
    call_entries: Sequence[_Entry | None],
) -> None:
    """Symmetry reduction: order interchangeable operations.

    Two operations with the same kind, arguments and output (both completed, or both
    indeterminate) make identical model steps. If A's window starts and ends before B's (in
    event order), any linearization using B before A -- or B but not A -- stays valid with the
    two swapped, so B only becomes a candidate once A is linearized.
    """
    ret_pos = [0] * len(ops)
    for pos, (_time, is_return, index) in enumerate(events):
        if is_return:
            ret_pos[index] = pos
    classes: dict[tuple[int, State, State, object, bool], list[int]] = {}
    for _time, is_return, index in events:
        if is_return:
            continue
        op = ops[index]
        members = classes.setdefault((op.kind, op.value, op.expected, op.output, op.completed), [])
        # Members are in call order; look back a little for one that also returns first.
        for other in reversed(members[-8:]):
            if not op.completed or ret_pos[other] < ret_pos[index]:
                entry = call_entries[index]
                assert entry is not None
                entry.prereq = 1 << other
                break
        members.append(index)


def _is_read_only(op: KeyOp) -> bool:
    """Whether a completed operation, given its output, leaves the state alone wherever it is
    placed: a get, a delete that found nothing, a cas that failed (or swapped x for x)."""
    if op.kind == GET:
        return True
    if op.kind == DELETE:
        return op.output is False
    if op.kind == CAS:
        return op.output is False or op.expected == op.value
    return False


def _step(entry: _Entry, state: State) -> tuple[bool, State]:
    """The register model: (does it accept the operation's output, the new state)."""
    kind = entry.kind
    if kind == GET:  # only completed gets reach the search
        return entry.output == state, state
    if kind == PUT:  # a put's output is not checked
        return True, entry.value
    if kind == DELETE:
        return not entry.completed or entry.output is (state is not None), None
    if state == entry.expected:  # cas that swaps
        return not entry.completed or entry.output is True, entry.value
    return not entry.completed or entry.output is False, state  # cas that does not swap


def _lift(entry: _Entry) -> None:
    """Take a call entry and its return out of the list (they stay linked to it)."""
    entry.prev.next = entry.next
    entry.next.prev = entry.prev
    match = entry.match
    match.prev.next = match.next
    match.next.prev = match.prev


def _unlift(entry: _Entry) -> None:
    """Undo `_lift`: put the return back, then the call."""
    match = entry.match
    match.prev.next = match
    match.next.prev = match
    entry.prev.next = entry
    entry.next.prev = entry
