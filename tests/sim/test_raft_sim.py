"""The seeded whole-cluster simulation, run over a slice of seeds, and proof that it has teeth.

CI runs many more seeds through `benches/raft_sim.py --seeds N`; here a few seeds keep the
ordinary test run fast, plus mutation checks: a core with a known safety bug, or a store that
acknowledges a batched write it did not apply, must be caught.
"""

from __future__ import annotations

import msgpack
import pytest

from orchestrator.raft.raftlog import RaftLog
from orchestrator.raft.statemachine import unpack_batch
from orchestrator.store.mvcc import MVCCStore
from orchestrator.store.types import Event, TxnResult, WriteResult
from orchestrator.testing.machines import MemoryKV
from orchestrator.testing.raft_sim import SimFailure, SimResult, run_seed


@pytest.mark.parametrize("seed", range(25))
def test_seed_passes(seed: int) -> None:
    res = run_seed(seed)
    assert res.leaders >= 1
    assert res.ops_ok > 0
    assert res.batched_ops >= 2 * res.batches


def _replay_key(r: SimResult) -> tuple[object, ...]:
    return (r.events, r.ops_ok, r.ops_indeterminate, r.leaders, r.notes, r.batches, r.batched_ops)


@pytest.mark.parametrize("seed", [7, 24])
def test_same_seed_replays_identically(seed: int) -> None:
    a, b = run_seed(seed), run_seed(seed)
    assert _replay_key(a) == _replay_key(b)


@pytest.mark.parametrize("seed", [1, 2, 24])
def test_mvcc_seeds_make_batch_entries(seed: int) -> None:
    # Seeds whose draw holds writes for batches, with several clients at a time: many of their
    # writes go through batch entries (proposed and forwarded), and all checks pass.
    res = run_seed(seed)
    assert res.batches > 10
    assert res.batched_ops > 2 * res.batches


@pytest.mark.parametrize("seed", range(5))
def test_kv_machine_makes_no_batch_entries(seed: int) -> None:
    res = run_seed(seed, sm_factory=MemoryKV)
    assert (res.batches, res.batched_ops) == (0, 0)


def _first_failure(seeds: range) -> str | None:
    for seed in seeds:
        try:
            run_seed(seed)
        except SimFailure as exc:
            return str(exc)
    return None


def test_catches_votes_for_stale_logs(monkeypatch: pytest.MonkeyPatch) -> None:
    # Granting votes without the §5.4.1 up-to-date check elects leaders missing committed data.
    monkeypatch.setattr(RaftLog, "is_up_to_date", lambda self, index, term: True)
    failure = _first_failure(range(200))
    assert failure is not None
    assert "seed" in failure


def test_catches_a_batched_write_acknowledged_but_not_applied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A store that skips a batch's last command yet reports it done (a well-typed success):
    # only the history's linearizability can tell.
    def execute_batch(
        self: MVCCStore, data: bytes, events: list[Event]
    ) -> list[WriteResult | TxnResult]:
        commands = unpack_batch(data)
        results = [self._execute(c, events) for c in commands[:-1]]
        last = msgpack.unpackb(commands[-1])
        results.append(TxnResult(True, self._rev) if last[0] == "txn" else WriteResult(self._rev))
        return results

    monkeypatch.setattr(MVCCStore, "_execute_batch", execute_batch)
    failure = _first_failure(range(1, 30))
    assert failure is not None
    assert "linearizability" in failure


def test_catches_a_batch_without_one_result_per_command(monkeypatch: pytest.MonkeyPatch) -> None:
    def execute_batch(
        self: MVCCStore, data: bytes, events: list[Event]
    ) -> list[WriteResult | TxnResult]:
        return [self._execute(c, events) for c in unpack_batch(data)][:-1]

    monkeypatch.setattr(MVCCStore, "_execute_batch", execute_batch)
    failure = _first_failure(range(1, 30))
    assert failure is not None
    assert "not one result per command" in failure
