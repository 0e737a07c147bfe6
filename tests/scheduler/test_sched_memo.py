"""The per-node memo of the default framework (`Framework._filter_memo`) decides exactly as the
plain path: the same node, reasons and scores, over sequences of scheduling cycles in which
nodes change, pods are assumed, forgotten, expire and are deleted between cycles."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from schedfixtures import bound, cache_with, expr, node, pod, preferred, taint
from test_sched_framework import cpus, label_maps, mems, taints, tolerations

from orchestrator.scheduler import DEFAULT_FRAMEWORK, Framework, SchedulerCache
from orchestrator.scheduler.framework import DEFAULT_FILTERS, DEFAULT_SCORES, _plain_totals
from orchestrator.scheduler.info import ZONE_LABEL, PodInfo

Obj = dict[str, Any]

# The same plugins in lists: not the defaults by identity, so the memo is off. (tuple() of a
# tuple is the tuple itself.)
PLAIN = Framework(filters=list(DEFAULT_FILTERS), scores=list(DEFAULT_SCORES))

nodes_st = st.builds(
    lambda cpu, mem, labels, node_taints, ready, unschedulable: dict(
        cpu=cpu, memory=mem, labels=labels, taints=node_taints, ready=ready,
        unschedulable=unschedulable, pods="5",
    ),
    st.sampled_from(["1", "2", "4"]),
    st.sampled_from(["1Gi", "4Gi"]),
    st.builds(  # a zone on some nodes: OwnerSpread's zoned formula (no `_plain_totals`)
        lambda labels, zone: {**labels, ZONE_LABEL: zone} if zone else labels,
        label_maps,
        st.sampled_from([None, None, "z1", "z2"]),
    ),
    st.one_of(st.just([]), taints),
    st.sampled_from([True, True, True, False]),
    st.sampled_from([False, False, False, True]),
)  # fmt: skip
# Few shapes, so that successive pods share a memo key.
shapes = st.fixed_dictionaries(
    {"cpu": cpus, "memory": mems, "tolerations": tolerations, "owner": st.sampled_from(["a", "b"])}
)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("schedule"), st.integers(0, 2)),
        st.tuples(st.just("node"), st.integers(0, 5), nodes_st),
        st.tuples(st.just("forget"), st.integers(0, 30)),
        st.tuples(st.just("delete"), st.integers(0, 30)),
        st.tuples(st.just("expire"), st.integers(0, 100)),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(
    first=st.lists(nodes_st, min_size=2, max_size=6),
    pod_shapes=st.lists(shapes, min_size=1, max_size=3),
    plan=steps,
    seed=st.integers(0, 2**16),
)
def test_memo_decides_as_the_plain_path(
    first: list[Obj], pod_shapes: list[Obj], plan: list[tuple[Any, ...]], seed: int
) -> None:
    specs = [node(f"n{i}", **kw) for i, kw in enumerate(first)]
    assert PLAIN.filters is not DEFAULT_FILTERS
    assert PLAIN.scores is not DEFAULT_SCORES
    memo, plain = cache_with(*specs), cache_with(*specs)
    rngs = random.Random(seed), random.Random(seed)
    placed: list[Obj] = []
    clock = 0.0
    for i, step in enumerate(plan):
        clock += 1.0
        if step[0] == "schedule":
            shape = pod_shapes[step[1] % len(pod_shapes)]
            p = pod(f"p{i}", **shape)
            a = DEFAULT_FRAMEWORK.schedule_one(p, memo, rngs[0], clock)
            b = PLAIN.schedule_one(p, plain, rngs[1], clock)
            assert (a.node, dict(a.reasons), a.num_nodes) == (b.node, dict(b.reasons), b.num_nodes)
            assert memo.next_start_index == plain.next_start_index
            if a.node is not None:
                for c in (memo, plain):
                    c.assume(p, a.node, clock)
                placed.append(bound(p, a.node))
        elif step[0] == "node":
            if step[1] < len(specs):
                specs[step[1]] = node(f"n{step[1]}", **step[2])
                for c in (memo, plain):
                    c.update_node(specs[step[1]])
        elif placed and step[0] in ("forget", "delete"):
            p = placed.pop(step[1] % len(placed))
            for c in (memo, plain):
                c.forget(p) if step[0] == "forget" else c.remove_pod(p)
        elif step[0] == "expire":
            for c in (memo, plain):
                c.expire(clock + step[1])


def test_memo_is_reused_and_recomputed_only_for_changed_nodes() -> None:
    cache: SchedulerCache = cache_with(*(node(f"n{i}") for i in range(4)))
    rng = random.Random(1)
    chosen = DEFAULT_FRAMEWORK.schedule_one(pod("a", cpu="1"), cache, rng, 0.0).node
    assert chosen is not None
    (memo,) = cache.shape_memo.values()
    verdicts = list(memo.verdicts)
    cache.assume(pod("a", cpu="1"), chosen, 0.0)
    DEFAULT_FRAMEWORK.schedule_one(pod("b", cpu="1"), cache, rng, 0.0)
    (again,) = cache.shape_memo.values()
    assert again is memo
    for n, before, after in zip(memo.order, verdicts, memo.verdicts, strict=True):
        assert (after is before) == (n.name != chosen)  # only the changed node recomputed
    # A pod the memo does not apply to (it names a node) leaves the memo alone.
    DEFAULT_FRAMEWORK.schedule_one(pod("c", cpu="1", node_name="n0"), cache, rng, 0.0)
    assert list(cache.shape_memo.values()) == [memo]


def test_a_tainted_node_keeps_its_reason_in_the_memo() -> None:
    cache = cache_with(node("n0", taints=[taint("dedicated")]), node("n1"), node("n2"))
    rng = random.Random(0)
    for i in range(3):
        d = DEFAULT_FRAMEWORK.schedule_one(pod(f"p{i}", cpu="100m"), cache, rng, 0.0)
        assert d.node in ("n1", "n2")
        assert d.reasons == {"n0": ("node(s) had untolerated taint {dedicated: }",)}
        cache.assume(pod(f"p{i}", cpu="100m"), d.node, 0.0)


def test_pods_that_differ_in_tolerations_do_not_share_verdicts() -> None:
    cache = cache_with(node("n0", taints=[taint("dedicated")]), node("n1"))
    tolerant = [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]
    rng = random.Random(0)
    for i in range(4):
        p = pod(f"p{i}", cpu="100m", tolerations=tolerant if i % 2 else None)
        d = DEFAULT_FRAMEWORK.schedule_one(p, cache, rng, 0.0)
        assert ("n0" in d.reasons) == (i % 2 == 0)


def test_pods_that_differ_in_requests_do_not_share_verdicts() -> None:
    cache = cache_with(node("n0", cpu="1"), node("n1", cpu="4"))
    rng = random.Random(0)
    for i in range(4):
        p = pod(f"p{i}", cpu="2" if i % 2 else "500m")
        d = DEFAULT_FRAMEWORK.schedule_one(p, cache, rng, 0.0)
        assert ("n0" in d.reasons) == (i % 2 == 1)


@settings(max_examples=200, deadline=None)
@given(
    labels=st.lists(label_maps, min_size=2, max_size=6),
    owners=st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["a", "b"])), max_size=12),
    owner=st.sampled_from([None, "a", "b"]),
    prefer=st.booleans(),
    resource=st.lists(st.integers(0, 200), min_size=6, max_size=6),
)
def test_plain_totals_are_the_default_plugins_sum(
    labels: list[Obj],
    owners: list[tuple[int, str]],
    owner: str | None,
    prefer: bool,
    resource: list[int],
) -> None:
    """Over nodes without soft taints or zones, `_plain_totals` is `_score` of the defaults."""
    cache = cache_with(*(node(f"n{i}", labels=kw) for i, kw in enumerate(labels)))
    for j, (i, o) in enumerate(owners):
        cache.assume(pod(f"q{j}", owner=o), f"n{i % len(labels)}", 0.0)
    nodes = cache.nodes()
    affinity = preferred((3, [expr("disk", "In", "a")]), (5, [expr("gpu", "Exists")]))
    info = PodInfo.from_pod(pod("p", owner=owner, affinity=affinity if prefer else None))
    given_scores = resource[: len(nodes)]
    assert _plain_totals(info, nodes, list(given_scores)) == DEFAULT_FRAMEWORK._score(
        info, nodes, list(given_scores)
    )


def test_a_node_that_gains_a_zone_ends_the_plain_scoring() -> None:
    cache = cache_with(*(node(f"n{i}") for i in range(3)))
    rng = random.Random(0)
    first = DEFAULT_FRAMEWORK.schedule_one(pod("a", cpu="1", owner="a"), cache, rng, 0.0)
    assert first.node is not None
    (memo,) = cache.shape_memo.values()
    assert memo.plain
    cache.update_node(node("n1", labels={ZONE_LABEL: "z1"}))  # still feasible: no re-total
    DEFAULT_FRAMEWORK.schedule_one(pod("b", cpu="1", owner="a"), cache, rng, 0.0)
    assert cache.shape_memo[next(iter(cache.shape_memo))] is memo
    assert not memo.plain
