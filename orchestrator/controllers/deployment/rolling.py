"""The RollingUpdate strategy (upstream rolling.go): scale the new ReplicaSet up while the
total stays within replicas + maxSurge, otherwise scale old ones down (unhealthy pods first)
while at least replicas - maxUnavailable stay available. The plans are pure functions; the
step drives them through `DeploymentSync`."""

from __future__ import annotations

from orchestrator.controllers.deployment.sync import DeploymentSync, Sync
from orchestrator.controllers.deployment.util import (
    available_of,
    by_age,
    deployment_complete,
    max_unavailable,
    new_rs_new_replicas,
    replicas_of,
    status_of,
    sum_of,
)
from orchestrator.controllers.runtime.controller import Result
from orchestrator.kube.objects import Obj


def cleanup_unhealthy(old_rss: list[Obj], max_cleanup: int) -> list[tuple[Obj, int]]:
    """Old ReplicaSets scaled down by their unavailable replicas, oldest first, at most
    `max_cleanup` in total: [(rs, new size)]."""
    out: list[tuple[Obj, int]] = []
    total = 0
    for rs in by_age(old_rss):
        if total >= max_cleanup:
            break
        size = replicas_of(rs)
        # Status may still count more available replicas than the spec now asks for (it lags
        # a scale-down): then there is nothing unhealthy to clean up, and `size - available`
        # would be negative, i.e. a scale-up (upstream refuses that case with an error).
        if size == 0 or size <= available_of(rs):
            continue
        down = min(max_cleanup - total, size - available_of(rs))
        out.append((rs, size - down))
        total += down
    return out


def scale_down_old_for_rolling(
    d: Obj, all_rss: list[Obj], old_rss: list[Obj]
) -> list[tuple[Obj, int]]:
    """Old ReplicaSets scaled down while at least replicas - maxUnavailable stay available."""
    min_available = replicas_of(d) - max_unavailable(d)
    available = sum_of(all_rss, available_of)
    if available <= min_available:
        return []
    budget = available - min_available
    out: list[tuple[Obj, int]] = []
    total = 0
    for rs in by_age(old_rss):
        if total >= budget:
            break
        size = replicas_of(rs)
        if size == 0:
            continue
        down = min(size, budget - total)
        out.append((rs, size - down))
        total += down
    return out


async def rolling_update(ops: DeploymentSync, sync: Sync, rss: list[Obj]) -> Result:
    """One step of a RollingUpdate (upstream `rolloutRolling`): create or find the new
    ReplicaSet, scale it up within maxSurge, else scale old ones down within maxUnavailable
    (their unhealthy pods first); when complete, clean up history."""
    d = sync.d
    new_rs, old_rss = await ops.new_and_old(sync, rss, create=True)
    if new_rs is None:
        return await ops.finish(sync, old_rss, None, rollout=True)
    all_rss = [*old_rss, new_rs]
    replicas = replicas_of(d)
    # scale the new ReplicaSet up (or down to the target)
    if replicas_of(new_rs) != replicas:
        target = (
            replicas if replicas_of(new_rs) > replicas else new_rs_new_replicas(d, all_rss, new_rs)
        )
        scaled, new_rs = await ops.scale(d, new_rs, target)
        all_rss = [*old_rss, new_rs]
        if scaled:
            return await ops.finish(sync, all_rss, new_rs, rollout=True)
    # scale old ReplicaSets down within maxUnavailable
    if sum_of(old_rss, replicas_of) > 0:
        all_pods = sum_of(all_rss, replicas_of)
        min_available = replicas - max_unavailable(d)
        new_unavailable = replicas_of(new_rs) - available_of(new_rs)
        max_down = all_pods - min_available - new_unavailable
        if max_down > 0:
            cleaned, old_rss = await ops.apply_plan(
                d, cleanup_unhealthy(old_rss, max_down), old_rss
            )
            all_rss = [*old_rss, new_rs]
            down, old_rss = await ops.apply_plan(
                d, scale_down_old_for_rolling(d, all_rss, old_rss), old_rss
            )
            all_rss = [*old_rss, new_rs]
            if cleaned or down:
                return await ops.finish(sync, all_rss, new_rs, rollout=True)
    if deployment_complete(d, status_of(d)):
        await ops.cleanup(d, old_rss)
    return await ops.finish(sync, all_rss, new_rs, rollout=True)
