"""Linearizability checker for histories of a key-value store.

A *history* is a set of operations, each with an invocation time (`call`), a response time
(`ret`) and the output the client observed. The history is *linearizable* if every operation
can be given a single instant inside its ``[call, ret]`` window such that executing the
operations one by one in the order of those instants, against a sequential key-value model,
produces exactly the observed outputs.

Theory of operation
-------------------
This is the Wing & Gong backtracking search with Lowe's memoization, as implemented by
Porcupine (Anish Athalye) and, for indeterminate operations, as specified by Knossos.

1. **P-compositionality.** Linearizability is a local property and the model's keys are
   independent registers, so the history is partitioned by key and each key is checked on its
   own. That turns one search over ``n`` operations into many much smaller ones.

2. **Events.** For one key, every operation contributes a call event and a return event;
   operations that never returned (``ret is None``) get a return event at ``+inf``. Events are
   sorted by time. *At equal timestamps calls sort before returns*: an operation returning at
   ``t`` and one invoked at ``t`` are treated as concurrent. This is the permissive choice -- it
   never reports a violation that depends on the order of two events carrying the same
   timestamp (with a coarse clock, "equal" usually means "unordered").

3. **Search.** The events form a doubly linked list. Scanning from the head, any call event
   met before the first return event belongs to an operation that may be linearized *now*
   (everything that must precede it has been linearized, since its call precedes every pending
   return). The search tries such a candidate against the model; if the model accepts the
   observed output, the operation's call and return are *lifted* out of the list, the previous
   model state is pushed on a stack and the scan restarts from the head. Reaching a return
   event means the operation it belongs to can no longer be placed: pop the stack, undo the
   last lift (*unlift*) and try the next candidate after it. An empty stack at that point means
   the history is not linearizable. The search is an explicit loop with an explicit stack, so
   there is no recursion limit.

4. **Memoization (Lowe).** A configuration is fully described by the set of linearized
   operations (a bitmask, as a Python int) and the model state. Every configuration reached is
   cached; a configuration reached a second time was already fully explored without success,
   so that branch is pruned. This turns the exponential worst case into something that is
   almost linear for realistic histories.

5. **Indeterminate operations** (``ret is None``: crashed or timed out clients) may have taken
   effect at any instant after their call, or never. Their return event is at ``+inf``, the
   model accepts any output for them, and the search succeeds as soon as every *completed*
   operation is linearized: the indeterminate operations still pending can be dropped (which is
   the same as linearizing them after everything else, where nothing observes them). An
   indeterminate ``get`` has no effect and no observable output, so it is discarded up front.

6. **Pruning.** Each rule below only discards moves when another move that is kept succeeds
   whenever the discarded one would; so the search stays exact (a brute-force differential
   test checks this).

   - *Read-only moves are forced.* A completed operation whose output says it did not change
     the state (a ``get``, a ``delete`` that found nothing, a ``cas`` that failed) can be moved
     to the front of any linearization in which it is already a candidate and the model
     accepts it now. So when such a candidate exists it is the only move tried.
   - *Useless indeterminate moves are skipped.* Taking an indeterminate operation that leaves
     the state unchanged now gains nothing: it stays available for later.
   - *Symmetry.* Operations with the same kind, arguments and output make identical steps; if
     A's window starts and ends before B's, B only becomes a candidate after A.
   - *Dominance.* Reaching a state without some indeterminate operation leaves more options
     than reaching it with it (the operation is optional). So a configuration is dead if the
     one without any single one of its indeterminate operations is cached.
   - *Order.* Completed candidates are tried before indeterminate ones, which are rarely
     needed; this only changes how fast a linearization is found.

   Failing histories are still the expensive case: the search has to exhaust every
   configuration before the point of failure. Memory grows with the number of configurations
   cached (roughly ``n/8`` bytes plus ~100 bytes each for ``n`` operations on a key).

7. **Explanations.** When a key fails, the checker looks for the *smallest failing prefix*:
   the history cut right after the k-th return event (operations still running at the cut
   become indeterminate). Non-linearizability is monotone in k. The failed search already
   proves the prefix up to the first return it could never get past is linearizable, so the
   next prefix is tried first and bisection takes over if that one passes. The operation
   returning at the cut is the first one that cannot be placed; the explanation lists the
   operations of that prefix and the longest partial linearization found for it.

The register model per key: the state is the current value (``None`` = absent). ``put`` sets
it (its output is not checked: a put that did not succeed must be recorded as indeterminate);
``get`` returns it; ``delete`` sets it to ``None`` and outputs whether the key existed;
``cas(expected, new)`` sets it to ``new`` and outputs ``True`` if the state equals
``expected`` (``None`` = must be absent), else leaves it alone and outputs ``False``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["CheckResult", "Operation", "check_history"]

_State = bytes | None

_PUT = 0
_GET = 1
_DELETE = 2
_CAS = 3
_KINDS: dict[str, int] = {"put": _PUT, "get": _GET, "delete": _DELETE, "cas": _CAS}

_OK = 0
_FAIL = 1
_TIMEOUT = 2

# How many search steps between two looks at the clock.
_CLOCK_EVERY = 0x3FF
# At most this many operations are listed in a failure explanation.
_MAX_LISTED = 60
# At most this many operations of the longest partial linearization are listed.
_MAX_LINEARIZED_LISTED = 15


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


@dataclass(frozen=True)
class CheckResult:
    """Outcome of `check_history`.

    ``ok`` is ``True`` if the history is linearizable -- or if the check ran out of time, in
    which case ``timed_out`` is ``True`` and the answer is really "unknown". ``key`` is the
    first key (in sorted order) found not to be linearizable.
    """

    ok: bool
    key: str | None
    explanation: str
    timed_out: bool = False


@dataclass(frozen=True, slots=True)
class _KeyOp:
    """An operation prepared for the search on one key. `index` is its bit in the bitmask."""

    index: int
    kind: int
    value: _State
    expected: _State
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

    def __init__(self, op: _KeyOp | None, is_call: bool) -> None:
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
            self.value: _State = None
            self.expected: _State = None
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
class _Outcome:
    status: int
    best: list[int] = field(default_factory=list)  # longest partial linearization (op indices)
    best_state: _State = None
    # Failures only: every completed operation returning among the first `frontier` returns
    # was linearized in some explored configuration, so that prefix is linearizable.
    frontier: int = 0


def _as_state(value: object, what: str) -> _State:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"{what} must be bytes or None, got {type(value).__name__}")


def _prepare(ops: Sequence[Operation]) -> dict[str, list[_KeyOp]]:
    """Validate and normalise the history, partitioned by key (indices are per key)."""
    by_key: dict[str, list[_KeyOp]] = {}
    for source_index, op in enumerate(ops):
        kind = _KINDS.get(op.kind)
        if kind is None:
            raise ValueError(f"operation #{source_index}: unknown kind {op.kind!r}")
        call = float(op.call)
        if math.isnan(call) or math.isinf(call):
            raise ValueError(f"operation #{source_index}: call time must be finite, got {call}")
        completed = op.ret is not None
        ret = math.inf if op.ret is None else float(op.ret)
        if math.isnan(ret) or (completed and ret < call):
            raise ValueError(
                f"operation #{source_index}: return time {op.ret} is before call time {call}"
            )
        if completed and math.isinf(ret):
            raise ValueError(f"operation #{source_index}: return time must be finite or None")
        if kind == _GET and not completed:
            continue  # an indeterminate read changes nothing and observed nothing
        output: object = None
        if completed:
            if kind == _GET:
                output = _as_state(op.output, f"operation #{source_index}: get output")
            elif kind in (_DELETE, _CAS):
                if not isinstance(op.output, bool):
                    raise TypeError(
                        f"operation #{source_index}: {op.kind} output must be a bool, "
                        f"got {type(op.output).__name__}"
                    )
                output = op.output
        key_ops = by_key.setdefault(op.key, [])
        key_ops.append(
            _KeyOp(
                index=len(key_ops),
                kind=kind,
                value=_as_state(op.value, f"operation #{source_index}: value"),
                expected=_as_state(op.expected, f"operation #{source_index}: expected"),
                output=output,
                call=call,
                ret=ret,
                completed=completed,
                source=op,
                source_index=source_index,
            )
        )
    return by_key


def _search(ops: Sequence[_KeyOp], deadline: float | None) -> _Outcome:
    """Wing & Gong / Lowe search over the operations of one key. ``ops[i].index == i``."""
    remaining = sum(1 for op in ops if op.completed)
    if remaining == 0:
        return _Outcome(_OK)

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

    state: _State = None
    linearized = 0
    # (entry, state before it, forced): `forced` marks a read-only move (see below).
    stack: list[tuple[_Entry, _State, bool]] = []
    # Bits of the indeterminate operations currently linearized, in stack order.
    indeterminate_used: list[int] = []
    cache: set[tuple[int, _State]] = set()
    best: list[int] = []
    best_state: _State = None
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
            return _Outcome(_TIMEOUT, best, best_state)
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
                        return _Outcome(_OK)
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
                    return _Outcome(_FAIL, best, best_state, frontier)
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
                            return _Outcome(_OK)
                    else:
                        indeterminate_used.append(entry.bit)
                    _lift(entry)
                    fresh = True
                    continue
        entry = entry.next


def _link_identical(
    ops: Sequence[_KeyOp],
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
    classes: dict[tuple[int, _State, _State, object, bool], list[int]] = {}
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


def _is_read_only(op: _KeyOp) -> bool:
    """Whether a completed operation, given its output, leaves the state alone wherever it is
    placed: a get, a delete that found nothing, a cas that failed (or swapped x for x)."""
    if op.kind == _GET:
        return True
    if op.kind == _DELETE:
        return op.output is False
    if op.kind == _CAS:
        return op.output is False or op.expected == op.value
    return False


def _step(entry: _Entry, state: _State) -> tuple[bool, _State]:
    """The register model: (does it accept the operation's output, the new state)."""
    kind = entry.kind
    if kind == _GET:  # only completed gets reach the search
        return entry.output == state, state
    if kind == _PUT:  # a put's output is not checked
        return True, entry.value
    if kind == _DELETE:
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


def _prefix(
    ops: Sequence[_KeyOp], order: Sequence[tuple[float, int, int]], cut: int
) -> list[_KeyOp]:
    """The history up to and including event position `cut` (a return event).

    Operations invoked by then are kept, re-indexed; those that had not returned by then become
    indeterminate (they may or may not have taken effect before the cut).
    """
    called: list[int] = []
    returned: set[int] = set()
    for _time, is_return, index in order[: cut + 1]:
        if is_return:
            returned.add(index)
        else:
            called.append(index)
    result: list[_KeyOp] = []
    for index in called:
        op = ops[index]
        completed = index in returned
        if not completed and op.kind == _GET:
            continue
        result.append(
            _KeyOp(
                index=len(result),
                kind=op.kind,
                value=op.value,
                expected=op.expected,
                output=op.output if completed else None,
                call=op.call,
                ret=op.ret if completed else math.inf,
                completed=completed,
                source=op.source,
                source_index=op.source_index,
            )
        )
    return result


def _fmt_time(t: float | None) -> str:
    return "inf" if t is None else f"{t:.6f}"


def _fmt_state(value: object) -> str:
    return "<absent>" if value is None else repr(value)


def _describe(op: Operation, source_index: int) -> str:
    if op.kind == "put":
        text = f"put({op.value!r})"
    elif op.kind == "get":
        text = "get()"
    elif op.kind == "delete":
        text = "delete()"
    else:
        text = f"cas({_fmt_state(op.expected)} -> {_fmt_state(op.value)})"
    if op.ret is None:
        result = "? (no response)"
    elif op.kind == "get":
        result = _fmt_state(op.output)
    else:
        result = repr(op.output)
    window = f"[{_fmt_time(op.call)}, {_fmt_time(op.ret)}{']' if op.ret is not None else ')'}"
    return f"#{source_index} {window} client {op.client}: {text} -> {result}"


def _explain_failure(
    key: str, ops: Sequence[_KeyOp], full: _Outcome, deadline: float | None
) -> str:
    order = sorted([(op.call, 0, op.index) for op in ops] + [(op.ret, 1, op.index) for op in ops])
    return_positions = [
        pos for pos, (t, is_return, _i) in enumerate(order) if is_return and not math.isinf(t)
    ]
    # Bisect for the smallest k such that the prefix cut after the k-th return fails.
    # Invariant: the prefix for `hi` is known to fail (the whole history does), and the one
    # for `lo - 1` is known to pass (the search of the whole history got that far). Usually
    # the prefix for `lo` fails, so try it first.
    lo, hi = min(full.frontier, len(return_positions) - 1), len(return_positions) - 1
    hi_outcome = full
    hi_ops: Sequence[_KeyOp] = ops
    bisected = True
    first = True
    while lo < hi:
        mid = lo if first else (lo + hi) // 2
        first = False
        candidate = _prefix(ops, order, return_positions[mid])
        outcome = _search(candidate, deadline)
        if outcome.status == _TIMEOUT:
            bisected = False
            break
        if outcome.status == _FAIL:
            hi, hi_outcome, hi_ops = mid, outcome, candidate
        else:
            lo = mid + 1
    culprit = ops[order[return_positions[hi]][2]]

    lines = [
        f"key {key!r} is not linearizable ({len(ops)} operations on this key).",
    ]
    if bisected:
        lines.append(
            f"Smallest failing prefix: up to the return of operation #{culprit.source_index} "
            f"at t={_fmt_time(culprit.ret)} ({hi + 1} of {len(return_positions)} completed "
            f"operations returned by then). It cannot be linearized together with the "
            f"operations before it:"
        )
    else:
        lines.append(
            "Ran out of time while looking for the smallest failing prefix; the failing "
            f"prefix found ends at the return of operation #{culprit.source_index} "
            f"at t={_fmt_time(culprit.ret)}:"
        )
    lines.append("  " + _describe(culprit.source, culprit.source_index))
    listed = sorted(hi_ops, key=lambda o: (o.call, o.source_index))
    lines.append(
        f"Operations on {key!r} in that prefix, by call time ('*' = the operation above, "
        "'~' = no response yet at that point):"
    )
    if len(listed) > _MAX_LISTED:
        lines.append(f"  ... {len(listed) - _MAX_LISTED} earlier operations omitted")
        listed = listed[-_MAX_LISTED:]
    for op in listed:
        if op.source_index == culprit.source_index:
            mark = "*"
        elif not op.completed and op.source.ret is not None:
            mark = "~"
        else:
            mark = " "
        lines.append(f" {mark}{_describe(op.source, op.source_index)}")
    best = [hi_ops[i] for i in hi_outcome.best]
    lines.append(
        f"Longest partial linearization: {len(best)} of {len(hi_ops)} operations, "
        f"leaving {key!r} = {_fmt_state(hi_outcome.best_state)}" + (":" if best else ".")
    )
    if len(best) > _MAX_LINEARIZED_LISTED:
        lines.append(f"  ... {len(best) - _MAX_LINEARIZED_LISTED} earlier operations omitted")
        best = best[-_MAX_LINEARIZED_LISTED:]
    lines.extend("   " + _describe(op.source, op.source_index) for op in best)
    return "\n".join(lines)


def check_history(ops: Sequence[Operation], *, timeout: float | None = None) -> CheckResult:
    """Check that a key-value history is linearizable (see the module docstring).

    Keys are checked independently, in sorted order; the first failing key is reported.
    `timeout` bounds the wall time spent (``time.monotonic``); when it is exceeded the result
    is ``ok=True, timed_out=True`` ("unknown"), unless a failure had already been found.
    Raises `ValueError` / `TypeError` for malformed operations.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    by_key = _prepare(ops)
    for key in sorted(by_key):
        key_ops = by_key[key]
        if deadline is not None and time.monotonic() >= deadline:
            return _timed_out(key, len(ops), len(by_key))
        outcome = _search(key_ops, deadline)
        if outcome.status == _TIMEOUT:
            return _timed_out(key, len(ops), len(by_key))
        if outcome.status == _FAIL:
            return CheckResult(
                ok=False, key=key, explanation=_explain_failure(key, key_ops, outcome, deadline)
            )
    return CheckResult(
        ok=True,
        key=None,
        explanation=f"linearizable: {len(ops)} operations on {len(by_key)} keys",
    )


def _timed_out(key: str, n_ops: int, n_keys: int) -> CheckResult:
    return CheckResult(
        ok=True,
        key=None,
        explanation=(
            f"timed out while checking key {key!r} ({n_ops} operations on {n_keys} keys); "
            "linearizability unknown"
        ),
        timed_out=True,
    )
