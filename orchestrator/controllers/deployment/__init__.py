"""The Deployment controller: rolls a Deployment's pod template out through ReplicaSets.

Laid out as upstream's pkg/controller/deployment: `util` (names, fenceposts, new/old
ReplicaSets, sizes), `progress` (status and the rollout conditions), `sync` (the steps every
sync shares: new ReplicaSet and revision, scaling, history, writing status; proportional
scaling), `rolling` and `recreate` (the two strategies), `controller` (the reconciler's
dispatch and the informer wiring).

Theory of operation
-------------------
A Deployment owns ReplicaSets (controller ownerReferences, claimed by selector like the
ReplicaSet controller claims pods). The **new** ReplicaSet is the one whose pod template equals
the Deployment's, ignoring the `pod-template-hash` label; all others are **old**. A new one is
named `<deployment>-<pod-template-hash>` (`podutil.pod_template_hash` of the template and
`status.collisionCount`), carries the hash as a label, in its selector and in its template, and
the annotations `deployment.kubernetes.io/revision` (1 + the highest old revision),
`desired-replicas` and `max-replicas` (replicas + maxSurge, used by proportional scaling).
Rolling back (`kubectl rollout undo` writes an old template back) or restarting (a template
annotation) is just a template change: an old ReplicaSet with an equal template becomes the
new one again and gets the next revision.

`reconcile("ns/name")` is level-based, reads the caches, acts, and returns; like upstream's
`syncDeployment` each sync does one step and the ReplicaSets' status changes bring it back:

* being deleted: only status;
* `spec.paused`, or a **scaling event** (an active ReplicaSet's desired-replicas annotation
  differs from `spec.replicas`): scale proportionally (`scale_plan`: a single active
  ReplicaSet takes the new size; otherwise the difference to `replicas + maxSurge` is spread in
  proportion to each ReplicaSet's share of its max-replicas, rounding leftovers onto the
  largest), no new ReplicaSet while paused, history cleanup, status;
* **RollingUpdate**: create/find the new ReplicaSet; scale it up so the total stays within
  `replicas + maxSurge`; otherwise scale old ones down so at least
  `replicas - maxUnavailable` stay available (their unhealthy pods first); when complete,
  delete old ReplicaSets with 0 replicas beyond `revisionHistoryLimit`;
* **Recreate**: scale every old ReplicaSet to 0, wait until none of their pods exist, then
  create/scale the new one.

Every ReplicaSet write is a PUT conditional on the cached resourceVersion, so a stale cache
fails with 409 and the sync is retried instead of acting twice on old numbers.

maxSurge/maxUnavailable (int or percent of replicas; 25 % by default): surge rounds up,
unavailable rounds down, and if both come to 0 unavailable is 1 (`resolve_fenceposts`).

Status (`calculate_status`): observedGeneration, replicas (pods of all ReplicaSets),
updatedReplicas (of the new one), ready, available, unavailable, collisionCount, and the
conditions `kubectl rollout status` reads (`rollout_conditions`):

    Available    True  MinimumReplicasAvailable   available >= replicas - maxUnavailable
                 False MinimumReplicasUnavailable
    Progressing  True  NewReplicaSetCreated       a new ReplicaSet was just created
                 True  FoundNewReplicaSet         the new ReplicaSet existed, no condition yet
                 True  ReplicaSetUpdated          progress (more updated/ready/available pods,
                                                  fewer old): lastUpdateTime refreshed
                 True  NewReplicaSetAvailable     complete: every replica updated and available
                 False ProgressDeadlineExceeded   no progress for progressDeadlineSeconds
                 Unknown DeploymentPaused / DeploymentResumed
    ReplicaFailure  copied from a ReplicaSet's ReplicaFailure condition

A progressing deployment is requeued for when its deadline would pass. The revision
annotation is mirrored onto the Deployment (kubectl rollout history/undo read it).

Invariants: only the controller owner's ReplicaSets are scaled or deleted; no new ReplicaSet is
created while paused; a ReplicaSet still holding replicas is never deleted by history cleanup.
"""

from orchestrator.controllers.deployment.controller import (
    DEFAULT_WORKERS,
    DeploymentReconciler,
    deployment_controller,
)
from orchestrator.controllers.deployment.progress import calculate_status, rollout_conditions
from orchestrator.controllers.deployment.rolling import cleanup_unhealthy
from orchestrator.controllers.deployment.sync import history_to_delete, scale_plan
from orchestrator.controllers.deployment.util import (
    DESIRED_REPLICAS_ANNOTATION,
    MAX_REPLICAS_ANNOTATION,
    REVISION_ANNOTATION,
    max_surge,
    max_unavailable,
    new_rs_new_replicas,
    resolve_fenceposts,
    scaled_value,
)

__all__ = [
    "DEFAULT_WORKERS",
    "DESIRED_REPLICAS_ANNOTATION",
    "MAX_REPLICAS_ANNOTATION",
    "REVISION_ANNOTATION",
    "DeploymentReconciler",
    "calculate_status",
    "cleanup_unhealthy",
    "deployment_controller",
    "history_to_delete",
    "max_surge",
    "max_unavailable",
    "new_rs_new_replicas",
    "resolve_fenceposts",
    "rollout_conditions",
    "scale_plan",
    "scaled_value",
]
