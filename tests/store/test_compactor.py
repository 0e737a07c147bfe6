"""`Compactor`: when automatic compaction compacts. Pure: simulated clocks and revisions."""

from __future__ import annotations

from orchestrator.store.raftstore import CompactionPolicy, Compactor


def run(
    policy: CompactionPolicy, seconds: float, writes_per_s: float
) -> list[tuple[float, int, int]]:
    """Drive a compactor as `RaftStore._auto_compact` does, with the store at `writes_per_s`
    revisions a second and every due compaction succeeding: [(time, revision, target)]."""
    compactor = Compactor(policy, 0.0)
    compacted = 1
    made = []
    t = 0.0
    while t < seconds:
        t += policy.interval
        revision = 1 + int(t * writes_per_s)
        target = compactor.due(t, revision, compacted)
        if target is not None:
            assert compacted < target <= revision
            compacted = target
            compactor.compacted(t)
            made.append((t, revision, target))
    return made


def test_idle_periodic_compacts_once_per_retention_period() -> None:
    # The idle all-in-one server: the node Lease renewed every 10 s, nothing else.
    policy = CompactionPolicy.parse("5m")
    assert policy.interval == 30.0
    made = run(policy, 3600, 0.1)
    times = [t for t, _, _ in made]
    assert times == [330.0 + 300 * i for i in range(11)]  # was every 30 s: 110 an hour
    for t, _, target in made:
        # never history younger than the retention; never more than about twice it
        assert target <= 1 + int((t - 300) * 0.1)
        assert target >= 1 + int((t - 2 * 300 - policy.interval) * 0.1)


def test_busy_periodic_compacts_every_interval() -> None:
    policy = CompactionPolicy.parse("5m")
    made = run(policy, 900, 100.0)  # 3,000 revisions per check: a batch each time
    times = [t for t, _, _ in made]
    assert times == [330.0 + 30 * i for i in range(20)]
    for t, _, target in made:
        assert target == 1 + int((t - 300) * 100)  # exactly the retention window kept


def test_periodic_compacts_a_small_batch_once_it_is_a_retention_period_old() -> None:
    policy = CompactionPolicy("periodic", 60.0, 6.0)
    compactor = Compactor(policy, 0.0)
    assert compactor.due(6.0, 10, 1) is None  # nothing behind the window yet
    assert compactor.due(60.0, 20, 1) is None  # the first sample is not 60 s old yet
    assert compactor.due(66.0, 21, 1) == 10  # 9 revisions only, but 66 s since the start
    compactor.compacted(66.0)
    assert compactor.due(72.0, 22, 10) is None  # 20 - 10: small, and just compacted
    assert compactor.due(120.0, 29, 10) is None  # 20 behind the window, 54 s since
    assert compactor.due(126.0, 30, 10) == 21  # 60 s since: the sample of t=66 is 60 s old


def test_revision_mode_keeps_retention_plus_at_most_one_batch() -> None:
    policy = CompactionPolicy.parse("10000")
    assert (policy.mode, policy.interval) == ("revision", 5.0)
    compactor = Compactor(policy, 0.0)
    assert compactor.due(5.0, 10_500, 1) is None  # 10,499 behind: less than a batch of 1,000
    assert compactor.due(10.0, 11_001, 1) == 1_001
    compactor.compacted(10.0)
    assert compactor.due(15.0, 11_900, 1_001) is None
    assert compactor.due(3600.0, 11_900, 1_001) is None  # no time rule in revision mode
    assert compactor.due(3605.0, 12_001, 1_001) == 2_001


def test_revision_mode_with_a_small_retention_compacts_by_that_many() -> None:
    compactor = Compactor(CompactionPolicy.parse("50"), 0.0)
    assert compactor.due(5.0, 100, 1) is None  # 49 behind
    assert compactor.due(10.0, 101, 1) == 51
    assert compactor.due(15.0, 150, 51) is None
    assert compactor.due(20.0, 151, 51) == 101


def test_nothing_to_compact() -> None:
    compactor = Compactor(CompactionPolicy("periodic", 10.0, 1.0), 0.0)
    for t in range(1, 100):
        assert compactor.due(float(t), 1, 1) is None  # an empty store: revision 1
