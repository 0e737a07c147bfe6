"""The per-node shape memo (`Framework._filter_memo`) decides exactly as the plain path: the same
node, reasons and scores, over sequences of scheduling cycles in which nodes change, pods are
assumed, forgotten, expire and are deleted between cycles; with the default plugins and weights
or others. It applies when the plugins say their results can be cached (`cache_key`)."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from schedfixtures import bound, cache_with, node, pod, taint
from test_sched_framework import cpus, label_maps, mems, taints, tolerations

from orchestrator.scheduler import DEFAULT_FRAMEWORK, Framework, SchedulerCache
from orchestrator.scheduler.info import ZONE_LABEL, NodeInfo, PodInfo
from orchestrator.scheduler.plugins import (
    DEFAULT_FILTERS,
    DEFAULT_SCORES,
    LeastAllocated,
    NodeAffinityScore,
    NodeFilter,
)

Obj = dict[str, Any]

PLAIN = Framework(memo=False)

nodes_st = st.builds(
    lambda cpu, mem, labels, node_taints, ready, unschedulable: dict(
        cpu=cpu, memory=mem, labels=labels, taints=node_taints, ready=ready,
        unschedulable=unschedulable, pods="5",
    ),
    st.sampled_from(["1", "2", "4"]),
    st.sampled_from(["1Gi", "4Gi"]),
    st.builds(  # a zone on some nodes: OwnerSpread's zoned formula
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
    weights=st.one_of(st.none(), st.lists(st.integers(0, 4), min_size=5, max_size=5)),
)
def test_memo_decides_as_the_plain_path(
    first: list[Obj],
    pod_shapes: list[Obj],
    plan: list[tuple[Any, ...]],
    seed: int,
    weights: list[int] | None,
) -> None:
    specs = [node(f"n{i}", **kw) for i, kw in enumerate(first)]
    framework, plain_framework = DEFAULT_FRAMEWORK, PLAIN
    if weights is not None:  # the configured weights, not the defaults, in both paths
        scores = [(plugin, w) for (plugin, _), w in zip(DEFAULT_SCORES, weights, strict=True)]
        framework = Framework(scores=scores)
        plain_framework = Framework(scores=scores, memo=False)
    memo, plain = cache_with(*specs), cache_with(*specs)
    rngs = random.Random(seed), random.Random(seed)
    placed: list[Obj] = []
    clock = 0.0
    for i, step in enumerate(plan):
        clock += 1.0
        if step[0] == "schedule":
            shape = pod_shapes[step[1] % len(pod_shapes)]
            p = pod(f"p{i}", **shape)
            a = framework.schedule_one(p, memo, rngs[0], clock)
            b = plain_framework.schedule_one(p, plain, rngs[1], clock)
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


def test_memo_sums_the_cacheable_scores_with_their_weights() -> None:
    cache = cache_with(node("small", cpu="2", memory="2Gi"), node("big", cpu="8", memory="8Gi"))
    heavy = Framework(scores=[(LeastAllocated(), 5), (NodeAffinityScore(), 2)])
    d = heavy.schedule_one(pod("a", cpu="1"), cache, random.Random(0), 0.0)
    assert d.node == "big"
    (memo,) = cache.shape_memo.values()
    nodes = {n.name: n for n in cache.nodes()}
    info = PodInfo.from_pod(pod("a", cpu="1"))
    expected = [5 * LeastAllocated().score(info, [nodes[n.name]])[0] for n in memo.feasible]
    assert memo.resource == expected
    assert [p for p, _ in memo.memoized] == [LeastAllocated()]  # NodeAffinity: normalised


class _Opaque:
    """A filter that does not say its verdicts can be reused."""

    name = "Opaque"

    def prepare(self, pod: PodInfo) -> NodeFilter | None:
        def run(nodes: list[NodeInfo], reasons: dict[str, tuple[str, ...]]) -> list[NodeInfo]:
            return nodes

        return run

    def cache_key(self, pod: PodInfo) -> None:
        return None


def test_a_filter_without_a_cache_key_turns_the_memo_off() -> None:
    cache = cache_with(*(node(f"n{i}") for i in range(3)))
    opaque = Framework(filters=[*DEFAULT_FILTERS, _Opaque()])
    assert opaque.schedule_one(pod("a", cpu="1"), cache, random.Random(0), 0.0).node
    assert not cache.shape_memo
    same = Framework(filters=list(DEFAULT_FILTERS))  # the same plugins in a list: memoized
    assert same.schedule_one(pod("a", cpu="1"), cache, random.Random(0), 0.0).node
    assert len(cache.shape_memo) == 1


def test_two_frameworks_keep_apart_memos() -> None:
    cache = cache_with(*(node(f"n{i}") for i in range(3)))
    other = Framework(scores=[(LeastAllocated(), 3)])
    for framework in (DEFAULT_FRAMEWORK, other, DEFAULT_FRAMEWORK):
        framework.schedule_one(pod("a", cpu="1"), cache, random.Random(0), 0.0)
    owners = sorted(id(m.framework) for m in cache.shape_memo.values())
    assert owners == sorted([id(DEFAULT_FRAMEWORK), id(other)])


def test_a_node_that_gains_a_zone_is_rescored_by_owner_spread() -> None:
    cache = cache_with(*(node(f"n{i}") for i in range(3)))
    rng = random.Random(0)
    first = DEFAULT_FRAMEWORK.schedule_one(pod("a", cpu="1", owner="a"), cache, rng, 0.0)
    assert first.node is not None
    (memo,) = cache.shape_memo.values()
    cache.update_node(node("n1", labels={ZONE_LABEL: "z1"}))  # still feasible: no re-total
    DEFAULT_FRAMEWORK.schedule_one(pod("b", cpu="1", owner="a"), cache, rng, 0.0)
    assert cache.shape_memo[next(iter(cache.shape_memo))] is memo
