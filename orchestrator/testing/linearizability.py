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
from dataclasses import dataclass

from orchestrator.testing.linsearch import (
    CAS,
    DELETE,
    FAIL,
    GET,
    KINDS,
    TIMEOUT,
    KeyOp,
    Operation,
    Outcome,
    State,
    search,
)

__all__ = ["CheckResult", "Operation", "check_history"]

# At most this many operations are listed in a failure explanation.
_MAX_LISTED = 60
# At most this many operations of the longest partial linearization are listed.
_MAX_LINEARIZED_LISTED = 15


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


def _as_state(value: object, what: str) -> State:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"{what} must be bytes or None, got {type(value).__name__}")


def _prepare(ops: Sequence[Operation]) -> dict[str, list[KeyOp]]:
    """Validate and normalise the history, partitioned by key (indices are per key)."""
    by_key: dict[str, list[KeyOp]] = {}
    for source_index, op in enumerate(ops):
        kind = KINDS.get(op.kind)
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
        if kind == GET and not completed:
            continue  # an indeterminate read changes nothing and observed nothing
        output: object = None
        if completed:
            if kind == GET:
                output = _as_state(op.output, f"operation #{source_index}: get output")
            elif kind in (DELETE, CAS):
                if not isinstance(op.output, bool):
                    raise TypeError(
                        f"operation #{source_index}: {op.kind} output must be a bool, "
                        f"got {type(op.output).__name__}"
                    )
                output = op.output
        key_ops = by_key.setdefault(op.key, [])
        key_ops.append(
            KeyOp(
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


def _prefix(ops: Sequence[KeyOp], order: Sequence[tuple[float, int, int]], cut: int) -> list[KeyOp]:
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
    result: list[KeyOp] = []
    for index in called:
        op = ops[index]
        completed = index in returned
        if not completed and op.kind == GET:
            continue
        result.append(
            KeyOp(
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


def _explain_failure(key: str, ops: Sequence[KeyOp], full: Outcome, deadline: float | None) -> str:
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
    hi_ops: Sequence[KeyOp] = ops
    bisected = True
    first = True
    while lo < hi:
        mid = lo if first else (lo + hi) // 2
        first = False
        candidate = _prefix(ops, order, return_positions[mid])
        outcome = search(candidate, deadline)
        if outcome.status == TIMEOUT:
            bisected = False
            break
        if outcome.status == FAIL:
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
        outcome = search(key_ops, deadline)
        if outcome.status == TIMEOUT:
            return _timed_out(key, len(ops), len(by_key))
        if outcome.status == FAIL:
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
