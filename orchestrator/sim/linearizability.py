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

6. **Explanations.** When a key fails, the checker bisects for the *smallest failing prefix*:
   the history cut right after the k-th return event (operations still running at the cut
   become indeterminate). Non-linearizability is monotone in k, so bisection is exact; the
   operation returning at the cut is the first one that cannot be placed. The explanation
   lists the operations of that prefix and the longest partial linearization found for it.

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
        "prev",
        "value",
    )

    def __init__(self, op: _KeyOp | None, is_call: bool) -> None:
        self.is_call = is_call
        self.match: _Entry = self
        self.prev: _Entry = self
        self.next: _Entry = self
        if op is None:
            self.index = -1
            self.bit = 0
            self.kind = -1
            self.value: _State = None
            self.expected: _State = None
            self.output: object = None
            self.completed = False
        else:
            self.index = op.index
            self.bit = 1 << op.index
            self.kind = op.kind
            self.value = op.value
            self.expected = op.expected
            self.output = op.output
            self.completed = op.completed


@dataclass(slots=True)
class _Outcome:
    status: int
    best: list[int] = field(default_factory=list)  # longest partial linearization (op indices)
    best_state: _State = None


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
    for _time, is_return, index in events:
        if is_return:
            entry = _Entry(None, False)
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

    state: _State = None
    linearized = 0
    stack: list[tuple[_Entry, _State]] = []
    cache: set[tuple[int, _State]] = set()
    best: list[int] = []
    best_state: _State = None
    steps = 0
    monotonic = time.monotonic

    entry = head.next
    while True:
        steps += 1
        if deadline is not None and not steps & _CLOCK_EVERY and monotonic() >= deadline:
            return _Outcome(_TIMEOUT, best, best_state)
        if entry.is_call:
            # Apply the model step for this candidate.
            kind = entry.kind
            if kind == _GET:  # only completed gets reach the search
                accepted = entry.output == state
                new_state = state
            elif kind == _PUT:
                accepted = True
                new_state = entry.value
            elif kind == _DELETE:
                accepted = not entry.completed or entry.output is (state is not None)
                new_state = None
            elif state == entry.expected:  # cas that swaps
                accepted = not entry.completed or entry.output is True
                new_state = entry.value
            else:  # cas that does not swap
                accepted = not entry.completed or entry.output is False
                new_state = state
            if accepted:
                new_linearized = linearized | entry.bit
                config = (new_linearized, new_state)
                if config not in cache:
                    cache.add(config)
                    stack.append((entry, state))
                    state = new_state
                    linearized = new_linearized
                    if entry.completed:
                        remaining -= 1
                        if remaining == 0:
                            return _Outcome(_OK)
                    # Lift the call and its return out of the list.
                    entry.prev.next = entry.next
                    entry.next.prev = entry.prev
                    match = entry.match
                    match.prev.next = match.next
                    match.next.prev = match.prev
                    entry = head.next
                    continue
            entry = entry.next
        else:
            # A return: its operation can no longer be placed. Backtrack.
            if not stack:
                return _Outcome(_FAIL, best, best_state)
            if len(stack) > len(best):  # a local maximum: remember it for the explanation
                best = [e.index for e, _ in stack]
                best_state = state
            entry, state = stack.pop()
            linearized ^= entry.bit
            if entry.completed:
                remaining += 1
            # Unlift: put the return back, then the call.
            match = entry.match
            match.prev.next = match
            match.next.prev = match
            entry.prev.next = entry
            entry.next.prev = entry
            entry = entry.next


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
    # Invariant: the prefix for `hi` is known to fail (the whole history does).
    lo, hi = 0, len(return_positions) - 1
    hi_outcome = full
    hi_ops: Sequence[_KeyOp] = ops
    bisected = True
    while lo < hi:
        mid = (lo + hi) // 2
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
