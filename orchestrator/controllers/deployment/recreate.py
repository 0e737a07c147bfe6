"""The Recreate strategy (upstream recreate.go): scale every old ReplicaSet to 0, wait until
none of their pods is left running, then create and scale up the new ReplicaSet."""

from __future__ import annotations

from orchestrator.controllers.deployment.sync import DeploymentSync, Sync
from orchestrator.controllers.deployment.util import (
    active_of,
    deployment_complete,
    replicas_of,
    status_of,
    sum_of,
)
from orchestrator.controllers.podutil import Cache, int_value, meta
from orchestrator.controllers.runtime.controller import Result
from orchestrator.controllers.runtime.informer import OWNER_INDEX
from orchestrator.kube.objects import Obj


async def recreate_update(ops: DeploymentSync, sync: Sync, rss: list[Obj]) -> Result:
    """One step of a Recreate rollout (upstream `rolloutRecreate`): scale every old
    ReplicaSet to 0, wait until none of their pods exist, then create/scale the new one."""
    d = sync.d
    new_rs, old_rss = await ops.new_and_old(sync, rss, create=False)
    all_rss = [*old_rss, *([new_rs] if new_rs else [])]
    down, old_rss = await ops.apply_plan(d, [(rs, 0) for rs in active_of(list(old_rss))], old_rss)
    all_rss = [*old_rss, *([new_rs] if new_rs else [])]
    if down or old_pods_running(ops.pods, old_rss):
        return await ops.finish(sync, all_rss, new_rs, rollout=True)
    if new_rs is None:
        new_rs, old_rss = await ops.new_and_old(sync, rss, create=True)
        if new_rs is None:
            return await ops.finish(sync, old_rss, None, rollout=True)
    _, new_rs = await ops.scale(d, new_rs, replicas_of(d))
    all_rss = [*old_rss, new_rs]
    if deployment_complete(d, status_of(d)):
        await ops.cleanup(d, old_rss)
    return await ops.finish(sync, all_rss, new_rs, rollout=True)


def old_pods_running(pods: Cache, old_rss: list[Obj]) -> bool:
    """Old ReplicaSets still count replicas, or some of their pods have not finished."""
    if sum_of(old_rss, lambda r: int_value(status_of(r).get("replicas"))) > 0:
        return True
    for rs in old_rss:
        for pod in pods.by_index(OWNER_INDEX, str(meta(rs).get("uid") or "")):
            if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                return True
    return False
