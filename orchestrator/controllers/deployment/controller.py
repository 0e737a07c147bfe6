"""The Deployment controller itself (upstream deployment_controller.go): the reconciler that
picks a sync path (deleting, paused or scaling, Recreate, RollingUpdate) and the wiring to the
Deployment, ReplicaSet and Pod informers (owned ReplicaSets, orphans to adopt, pod deletions
that Recreate waits for)."""

from __future__ import annotations

import logging
from typing import Any

from orchestrator.controllers.adoption import claim_dependents, watch_orphans
from orchestrator.controllers.deployment.recreate import recreate_update
from orchestrator.controllers.deployment.rolling import rolling_update
from orchestrator.controllers.deployment.sync import DeploymentSync, Sync, is_scaling_event
from orchestrator.controllers.deployment.util import (
    API_VERSION,
    KIND,
    find_new_and_old,
    spec_of,
    status_of,
)
from orchestrator.controllers.podutil import ensure_orphan_index, meta
from orchestrator.controllers.runtime.client import DEPLOYMENTS, PODS, REPLICASETS
from orchestrator.controllers.runtime.controller import Controller, Result, enqueue_owner
from orchestrator.controllers.runtime.informer import (
    SharedInformer,
    controller_of,
    deleted_object,
)
from orchestrator.controllers.runtime.manager import ControllerContext
from orchestrator.kube.errors import ApiError
from orchestrator.kube.jsonvalue import copy_json
from orchestrator.kube.selectors import from_label_selector_object

log = logging.getLogger(__name__)

DEFAULT_WORKERS = 5  # --concurrent-deployment-syncs


class DeploymentReconciler(DeploymentSync):
    """Level-based Deployment sync (see the package doc)."""

    async def reconcile(self, key: str) -> Result:
        try:
            return await self._reconcile(key)
        except ApiError as exc:
            if exc.code == 409:  # a write based on a stale cache: retry on fresher data
                log.debug("deployment %s: %s; retrying", key, exc)
                return Result(requeue=True)
            raise

    async def _reconcile(self, key: str) -> Result:
        cached = self.deployments.get(key)
        if cached is None:
            return Result()
        d = copy_json(cached)
        try:
            selector = from_label_selector_object(spec_of(d).get("selector"))
        except ApiError as exc:
            log.warning("deployment %s: invalid selector: %s", key, exc)
            return Result()
        if selector.empty():
            self._event(
                d,
                "Warning",
                "SelectingAll",
                "This deployment is selecting all pods. A non-empty selector is required.",
            )
            return Result()
        rss = await claim_dependents(
            self.client, d, DEPLOYMENTS, selector, self.replicasets, REPLICASETS
        )
        sync = Sync(d, copy_json(status_of(d).get("conditions") or []))
        now = self.clock()
        if meta(d).get("deletionTimestamp"):
            new_rs, old_rss = find_new_and_old(d, rss)
            return await self.finish(
                sync, [*old_rss, *([new_rs] if new_rs else [])], new_rs, rollout=False
            )
        self.paused_conditions(sync, now)
        if spec_of(d).get("paused"):
            return await self.scale_sync(sync, rss)
        new_rs, old_rss = find_new_and_old(d, rss)
        if is_scaling_event(d, new_rs, old_rss):
            return await self.scale_sync(sync, rss)
        strategy = (spec_of(d).get("strategy") or {}).get("type") or "RollingUpdate"
        if strategy == "Recreate":
            return await recreate_update(self, sync, rss)
        return await rolling_update(self, sync, rss)


# ================================================================================== wiring
def deployment_controller(ctx: ControllerContext, *, workers: int = DEFAULT_WORKERS) -> Controller:
    """The Deployment controller for one term of leadership (see the package doc)."""
    deployments = ctx.informers.informer(DEPLOYMENTS)
    replicasets = ctx.informers.informer(REPLICASETS)
    ensure_orphan_index(replicasets)
    pods = ctx.informers.informer(PODS)
    reconciler = DeploymentReconciler(ctx.client, deployments, replicasets, pods, ctx.events)
    controller = Controller("deployment", reconciler, workers, metrics=ctx.metrics)
    controller.watches(deployments)
    controller.watches(replicasets, enqueue_owner(KIND, API_VERSION))
    watch_orphans(controller, deployments, replicasets)
    _watch_pod_deletions(controller, replicasets, pods)
    return controller


def _watch_pod_deletions(
    controller: Controller, replicasets: SharedInformer, pods: SharedInformer
) -> None:
    """A deleted pod enqueues its ReplicaSet's Deployment (Recreate waits for old pods)."""

    def deleted(obj: Any) -> None:
        pod = deleted_object(obj)
        ref = controller_of(pod)
        if ref is None or ref.get("kind") != "ReplicaSet":
            return
        ns = str(meta(pod).get("namespace") or "")
        rs = replicasets.get(f"{ns}/{ref.get('name')}")
        owner = controller_of(rs) if rs is not None else None
        if owner is not None and owner.get("kind") == KIND:
            controller.enqueue(f"{ns}/{owner.get('name')}")

    pods.add_event_handler(on_delete=deleted)
