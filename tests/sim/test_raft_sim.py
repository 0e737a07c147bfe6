"""The seeded whole-cluster simulation, run over a slice of seeds, and proof that it has teeth.

CI runs many more seeds through `benches/raft_sim.py --seeds N`; here a few seeds keep the
ordinary test run fast, plus mutation checks: a core with a known safety bug must be caught.
"""

from __future__ import annotations

import pytest

from orchestrator.raft.raftlog import RaftLog
from orchestrator.sim.raft_sim import SimFailure, run_seed


@pytest.mark.parametrize("seed", range(25))
def test_seed_passes(seed: int) -> None:
    res = run_seed(seed)
    assert res.leaders >= 1
    assert res.ops_ok > 0


def test_same_seed_replays_identically() -> None:
    a, b = run_seed(7), run_seed(7)
    assert (a.events, a.ops_ok, a.leaders, a.notes) == (b.events, b.ops_ok, b.leaders, b.notes)


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
