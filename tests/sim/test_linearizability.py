"""Tests for the key-value linearizability checker."""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from orchestrator.testing.linearizability import CheckResult, Operation, check_history

# --- helpers -------------------------------------------------------------------------------


def put(key: str, value: bytes, call: float, ret: float | None, client: int = 0) -> Operation:
    return Operation(client, "put", key, value, None, call, ret, True)


def get(key: str, out: bytes | None, call: float, ret: float | None, client: int = 0) -> Operation:
    return Operation(client, "get", key, None, None, call, ret, out)


def delete(key: str, existed: bool, call: float, ret: float | None, client: int = 0) -> Operation:
    return Operation(client, "delete", key, None, None, call, ret, existed)


def cas(
    key: str,
    expected: bytes | None,
    new: bytes | None,
    swapped: bool,
    call: float,
    ret: float | None,
    client: int = 0,
) -> Operation:
    return Operation(client, "cas", key, new, expected, call, ret, swapped)


def assert_ok(ops: list[Operation]) -> CheckResult:
    result = check_history(ops)
    assert result.ok, result.explanation
    assert not result.timed_out
    assert result.key is None
    return result


def assert_not_ok(ops: list[Operation], key: str = "x") -> CheckResult:
    result = check_history(ops)
    assert not result.ok
    assert not result.timed_out
    assert result.key == key
    assert repr(key) in result.explanation
    return result


# --- hand-written histories ----------------------------------------------------------------


def test_empty_history() -> None:
    assert_ok([])


def test_sequential_put_get() -> None:
    assert_ok([put("x", b"1", 0, 1), get("x", b"1", 2, 3), get("y", None, 4, 5)])


def test_read_of_absent_key() -> None:
    assert_ok([get("x", None, 0, 1)])


def test_stale_read_after_completed_write() -> None:
    ops = [put("x", b"1", 0, 1), put("x", b"2", 2, 3), get("x", b"1", 4, 5, client=1)]
    result = assert_not_ok(ops)
    # The explanation names the stale read, with its times.
    assert "get() -> b'1'" in result.explanation
    assert "[4.000000, 5.000000]" in result.explanation


def test_read_concurrent_with_write_may_see_either_value() -> None:
    assert_ok([put("x", b"1", 0, 1), put("x", b"2", 2, 6), get("x", b"1", 3, 4, client=1)])
    assert_ok([put("x", b"1", 0, 1), put("x", b"2", 2, 6), get("x", b"2", 3, 4, client=1)])


def test_lost_write() -> None:
    assert_not_ok([put("x", b"1", 0, 1), get("x", None, 2, 3, client=1)])
    # Two sequential writes, the second one is lost.
    assert_not_ok(
        [put("x", b"1", 0, 1), put("x", b"2", 2, 3, client=1), get("x", b"1", 4, 5, client=2)]
    )


def test_concurrent_writes_observed_in_inconsistent_orders() -> None:
    writes = [put("x", b"1", 0, 10, client=0), put("x", b"2", 0, 10, client=1)]
    # Reader A sees 1 then 2; reader B, strictly later, sees 2 then 1.
    assert_not_ok(
        [
            *writes,
            get("x", b"1", 1, 2, client=2),
            get("x", b"2", 3, 4, client=2),
            get("x", b"2", 5, 6, client=3),
            get("x", b"1", 7, 8, client=3),
        ]
    )
    # Both readers see the same order: fine.
    assert_ok(
        [
            *writes,
            get("x", b"1", 1, 2, client=2),
            get("x", b"2", 3, 4, client=2),
            get("x", b"1", 1, 2.5, client=3),
            get("x", b"2", 7, 8, client=3),
        ]
    )
    # Overlapping readers disagreeing on the order: still fine, reads may interleave.
    assert_ok(
        [
            *writes,
            get("x", b"1", 1, 5, client=2),
            get("x", b"2", 1, 5, client=3),
            get("x", b"1", 1, 5, client=4),
        ]
    )


def test_cas_success_and_failure() -> None:
    assert_ok(
        [
            cas("x", None, b"a", True, 0, 1),
            cas("x", None, b"b", False, 2, 3),
            cas("x", b"a", b"b", True, 4, 5),
            get("x", b"b", 6, 7),
            cas("x", b"a", b"c", False, 8, 9),
            get("x", b"b", 10, 11),
        ]
    )


def test_cas_succeeds_twice_from_same_value() -> None:
    assert_not_ok(
        [put("x", b"a", 0, 1), cas("x", b"a", b"b", True, 2, 3), cas("x", b"a", b"c", True, 4, 5)]
    )


def test_concurrent_cas_both_succeed() -> None:
    assert_not_ok(
        [
            put("x", b"a", 0, 1),
            cas("x", b"a", b"b", True, 2, 5, client=1),
            cas("x", b"a", b"c", True, 2, 5, client=2),
        ]
    )
    # Exactly one of them winning is fine, whichever it is.
    assert_ok(
        [
            put("x", b"a", 0, 1),
            cas("x", b"a", b"b", False, 2, 5, client=1),
            cas("x", b"a", b"c", True, 2, 5, client=2),
            get("x", b"c", 6, 7),
        ]
    )


def test_cas_fails_although_it_should_have_swapped() -> None:
    assert_not_ok([put("x", b"a", 0, 1), cas("x", b"a", b"b", False, 2, 3)])


def test_cas_swap_not_visible() -> None:
    assert_not_ok([put("x", b"a", 0, 1), cas("x", b"a", b"b", True, 2, 3), get("x", b"a", 4, 5)])


def test_delete() -> None:
    assert_ok(
        [
            put("x", b"1", 0, 1),
            delete("x", True, 2, 3),
            delete("x", False, 4, 5),
            get("x", None, 6, 7),
            cas("x", None, b"2", True, 8, 9),
            get("x", b"2", 10, 11),
        ]
    )
    assert_not_ok([delete("x", True, 0, 1)])
    assert_not_ok([put("x", b"1", 0, 1), delete("x", False, 2, 3)])
    assert_not_ok([put("x", b"1", 0, 1), delete("x", True, 2, 3), get("x", b"1", 4, 5)])


def test_indeterminate_put_later_seen_is_ok() -> None:
    assert_ok([put("x", b"1", 0, None), get("x", b"1", 5, 6, client=1)])
    # It may take effect long after its call, between two reads.
    assert_ok(
        [put("x", b"1", 0, None), get("x", None, 1, 2, client=1), get("x", b"1", 3, 4, client=1)]
    )


def test_indeterminate_put_never_seen_is_ok() -> None:
    assert_ok([put("x", b"1", 0, None), get("x", None, 5, 6, client=1)])
    assert_ok([put("x", b"0", 0, 1), put("x", b"1", 2, None), get("x", b"0", 5, 6, client=1)])


def test_indeterminate_put_cannot_take_effect_twice() -> None:
    assert_not_ok(
        [
            put("x", b"1", 0, None),
            get("x", b"1", 1, 2, client=1),
            get("x", None, 3, 4, client=1),
        ]
    )


def test_indeterminate_put_cannot_take_effect_before_its_call() -> None:
    assert_not_ok([get("x", b"1", 0, 1, client=1), put("x", b"1", 2, None)])


def test_indeterminate_ops_ignore_output() -> None:
    assert_ok(
        [
            put("x", b"1", 0, 1),
            cas("x", b"1", b"2", False, 2, None),  # output is meaningless: it swapped
            delete("x", False, 3, None),  # output is meaningless; it never happened
            get("x", b"garbage", 4, None),
            get("x", b"2", 10, 11),
        ]
    )


def test_read_of_value_nobody_wrote() -> None:
    result = assert_not_ok([put("x", b"1", 0, 1), get("x", b"nobody", 2, 3, client=1)])
    assert "b'nobody'" in result.explanation


def test_equal_timestamps_are_concurrent() -> None:
    # The put returns at t=1 and the get is invoked at t=1: treated as concurrent.
    assert_ok([put("x", b"1", 0, 1), get("x", None, 1, 2, client=1)])
    assert_not_ok([put("x", b"1", 0, 1), get("x", None, 1.5, 2, client=1)])
    # Zero-length windows are fine.
    assert_ok([put("x", b"1", 1, 1), get("x", b"1", 1, 1)])


def test_keys_are_independent_and_first_failing_key_reported() -> None:
    ops = [
        put("a", b"1", 0, 1),
        get("a", b"1", 2, 3),
        put("b", b"1", 0, 1),
        get("b", None, 2, 3),  # lost write on b
        put("c", b"1", 0, 1),
        get("c", b"2", 2, 3),  # bad read on c too
    ]
    result = check_history(ops)
    assert not result.ok
    assert result.key == "b"
    # A value written to another key does not make a read linearizable.
    assert_not_ok([put("y", b"1", 0, 1), get("x", b"1", 2, 3)], key="x")


def test_explanation_narrows_to_smallest_failing_prefix() -> None:
    ops = [put("x", b"0", 0, 1)]
    t = 2.0
    for i in range(50):
        ops.append(put("x", str(i).encode(), t, t + 1))
        ops.append(get("x", str(i).encode(), t + 2, t + 3, client=1))
        t += 4
    bad_index = len(ops)
    ops.append(get("x", b"0", t, t + 1, client=2))  # stale
    for i in range(50):
        t += 4
        ops.append(put("x", str(i).encode(), t, t + 1))
    result = assert_not_ok(ops)
    culprit_line = next(line for line in result.explanation.splitlines() if line.startswith(" *"))
    assert f"#{bad_index} " in culprit_line
    assert "earlier operations omitted" in result.explanation


def test_timeout_reports_unknown() -> None:
    ops = [put("x", b"1", 0, 1), get("x", b"2", 2, 3)]
    result = check_history(ops, timeout=0.0)
    assert result.ok
    assert result.timed_out
    assert "timed out" in result.explanation


def test_hard_history_times_out_quickly() -> None:
    # Many concurrent indeterminate puts of distinct values make the state space huge, and a
    # final read of a value nobody wrote forces the search to explore all of it.
    ops = [put("x", bytes([i]), 0, None, client=i) for i in range(40)]
    ops += [get("x", bytes([i]), 1 + i, 1.5 + i, client=100) for i in range(0, 40, 3)]
    ops.append(get("x", b"never", 100, 101, client=100))
    result = check_history(ops, timeout=0.2)
    assert result.ok
    assert result.timed_out


def test_malformed_operations_rejected() -> None:
    with pytest.raises(ValueError, match="unknown kind"):
        check_history([Operation(0, "append", "x", b"1", None, 0, 1, True)])
    with pytest.raises(ValueError, match="before call"):
        check_history([put("x", b"1", 2, 1)])
    with pytest.raises(TypeError, match="bool"):
        check_history([delete("x", "yes", 0, 1)])  # type: ignore[arg-type]


# --- generated histories -------------------------------------------------------------------

KEYS = ["a", "b", "c"]
VALUES = [b"1", b"2", b"3"]


@dataclasses.dataclass
class _Model:
    state: dict[str, bytes | None] = dataclasses.field(default_factory=dict)

    def apply(self, kind: str, key: str, value: bytes | None, expected: bytes | None) -> object:
        current = self.state.get(key)
        if kind == "put":
            self.state[key] = value
            return True
        if kind == "get":
            return current
        if kind == "delete":
            self.state[key] = None
            return current is not None
        if current == expected:
            self.state[key] = value
            return True
        return False


def sequential_history(
    rng: random.Random,
    n: int,
    keys: list[str],
    values: list[bytes],
    spread: float,
    p_indeterminate: float,
) -> list[Operation]:
    """A sequential execution against the model (op i takes effect at t=i), with windows
    widened around the true linearization point to create concurrency."""
    model = _Model()
    ops: list[Operation] = []
    for i in range(n):
        kind = rng.choice(["put", "get", "get", "delete", "cas"])
        key = rng.choice(keys)
        value = rng.choice(values) if kind in ("put", "cas") else None
        expected = rng.choice([None, *values]) if kind == "cas" else None
        point = float(i)
        call = point - rng.uniform(0, spread)
        ret: float | None = point + rng.uniform(0, spread)
        if rng.random() < p_indeterminate:
            # Crashed client: it either took effect (at `point`) or never did.
            ret = None
            output: object = None
            if rng.random() < 0.5:
                model.apply(kind, key, value, expected)
        else:
            output = model.apply(kind, key, value, expected)
        ops.append(Operation(rng.randrange(10), kind, key, value, expected, call, ret, output))
    rng.shuffle(ops)  # the checker must not depend on the order of the input
    return ops


history_params = st.tuples(
    st.integers(min_value=0, max_value=2**32 - 1),  # seed
    st.integers(min_value=1, max_value=60),  # ops
    st.floats(min_value=0.0, max_value=8.0),  # spread
    st.sampled_from([0.0, 0.05, 0.2]),  # indeterminate fraction
)


@settings(max_examples=200, deadline=None)
@given(history_params)
def test_generated_linearizable_histories_pass(params: tuple[int, int, float, float]) -> None:
    seed, n, spread, p_indeterminate = params
    ops = sequential_history(random.Random(seed), n, KEYS, VALUES, spread, p_indeterminate)
    result = check_history(ops)
    assert result.ok, result.explanation


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(history_params, st.integers(min_value=0))
def test_corrupted_read_fails(params: tuple[int, int, float, float], pick: int) -> None:
    seed, n, spread, p_indeterminate = params
    ops = sequential_history(random.Random(seed), n, KEYS, VALUES, spread, p_indeterminate)
    gets = [i for i, op in enumerate(ops) if op.kind == "get" and op.ret is not None]
    assume(gets)
    victim = gets[pick % len(gets)]
    ops[victim] = dataclasses.replace(ops[victim], output=b"never-written")
    result = check_history(ops)
    assert not result.ok
    assert result.key == ops[victim].key
    assert f"#{victim} " in result.explanation


def test_large_history_checks() -> None:
    # 2,000 operations over 10 keys, ~10 operations in flight at any time.
    rng = random.Random(1234)
    keys = [f"k{i}" for i in range(10)]
    values = [str(i).encode() for i in range(5)]
    ops = sequential_history(rng, 2000, keys, values, spread=5.0, p_indeterminate=0.02)
    result = check_history(ops, timeout=60)
    assert result.ok, result.explanation
    assert not result.timed_out

    victim = next(i for i, op in enumerate(ops) if op.kind == "get" and op.ret is not None)
    ops[victim] = dataclasses.replace(ops[victim], output=b"never-written")
    result = check_history(ops, timeout=60)
    assert not result.ok
    assert result.key == ops[victim].key


def test_large_single_key_history_checks() -> None:
    rng = random.Random(99)
    ops = sequential_history(rng, 2000, ["k"], [b"1", b"2", b"3"], spread=5.0, p_indeterminate=0)
    result = check_history(ops, timeout=60)
    assert result.ok, result.explanation


# --- differential test against brute force -------------------------------------------------


def brute_force_linearizable(ops: list[Operation]) -> bool:
    """Try every order of the operations of each key (tiny histories only)."""
    inf = float("inf")
    for key in {op.key for op in ops}:
        key_ops = [op for op in ops if op.key == key]
        found = False
        for order in itertools.permutations(key_ops):
            # Real-time order: an op that returned before another was called comes first.
            if any(
                (b.ret if b.ret is not None else inf) < a.call
                for i, a in enumerate(order)
                for b in order[i + 1 :]
            ):
                continue
            model = _Model()
            if all(
                model.apply(op.kind, op.key, op.value, op.expected) == op.output
                or op.ret is None
                or op.kind == "put"
                for op in order
            ):
                found = True
                break
        if not found:
            return False
    return True


small_op = st.builds(
    lambda kind, key, value, expected, call, length, indeterminate, out, flag: Operation(
        0,
        kind,
        key,
        value if kind in ("put", "cas") else None,
        expected if kind == "cas" else None,
        float(call),
        None if indeterminate else float(call + length),
        out if kind == "get" else (True if kind == "put" else flag),
    ),
    st.sampled_from(["put", "get", "delete", "cas"]),
    st.sampled_from(["x", "y"]),
    st.sampled_from([b"1", b"2"]),
    st.sampled_from([None, b"1", b"2"]),
    st.integers(min_value=0, max_value=6),
    st.integers(min_value=0, max_value=3),
    st.integers(min_value=0, max_value=4).map(lambda i: i == 0),  # ~20% indeterminate
    st.sampled_from([None, b"1", b"2"]),
    st.booleans(),
)


@settings(max_examples=500, deadline=None)
@given(st.lists(small_op, max_size=6))
def test_agrees_with_brute_force(ops: list[Operation]) -> None:
    expected = brute_force_linearizable(ops)
    event("linearizable" if expected else "not linearizable")
    result = check_history(ops)
    assert result.ok == expected, result.explanation
