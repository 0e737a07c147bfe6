"""The steps every Deployment sync shares (upstream sync.go): find or create the new
ReplicaSet and keep the revision annotations, scale ReplicaSets (one conditional PUT each),
proportional scaling for a scaling event or a paused Deployment, history cleanup, the paused
conditions, and writing the Deployment's revision and status.

`DeploymentSync` holds the client, caches and clock; the strategies (`rolling`, `recreate`)
and the reconciler (`controller`) call its methods. A `Sync` is one reconcile's working state.
Invariants: only ReplicaSets this Deployment controls are written; every write is conditional
on the cached resourceVersion (a 409 retries the sync); no new ReplicaSet while paused; history
cleanup never deletes a ReplicaSet that still holds replicas."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from orchestrator.controllers.deployment.progress import (
    calculate_status,
    requeue_stuck,
    rollout_conditions,
)
from orchestrator.controllers.deployment.util import (
    API_VERSION,
    DESIRED_REPLICAS_ANNOTATION,
    FOUND_NEW_RS_REASON,
    KIND,
    LAST_APPLIED_ANNOTATION,
    MAX_REPLICAS_ANNOTATION,
    NEW_RS_REASON,
    PAUSED_REASON,
    PROGRESSING,
    RESUMED_REASON,
    REVISION_ANNOTATION,
    REVISION_HISTORY_ANNOTATION,
    ROLLBACK_ANNOTATION,
    TIMED_OUT_REASON,
    active_of,
    annotation_int,
    available_of,
    equal_ignore_hash,
    find_new_and_old,
    has_progress_deadline,
    max_surge,
    new_rs_new_replicas,
    replicas_of,
    revision,
    rolling_params,
    spec_of,
    status_of,
    sum_of,
)
from orchestrator.controllers.podutil import (
    POD_TEMPLATE_HASH_LABEL,
    Cache,
    controller_ref,
    creation_time,
    int_value,
    meta,
    pod_template_hash,
)
from orchestrator.controllers.runtime.client import DEPLOYMENTS, REPLICASETS, Client
from orchestrator.controllers.runtime.controller import Result
from orchestrator.controllers.runtime.events import EventRecorder
from orchestrator.controllers.runtime.informer import controller_of
from orchestrator.kube.conditions import get_condition, new_condition, set_condition
from orchestrator.kube.errors import ApiError
from orchestrator.kube.jsonvalue import copy_json
from orchestrator.kube.objects import Obj

log = logging.getLogger(__name__)

_SKIP_COPY = {
    LAST_APPLIED_ANNOTATION,
    REVISION_ANNOTATION,
    REVISION_HISTORY_ANNOTATION,
    DESIRED_REPLICAS_ANNOTATION,
    MAX_REPLICAS_ANNOTATION,
    ROLLBACK_ANNOTATION,
}


def is_scaling_event(d: Obj, new_rs: Obj | None, old_rss: list[Obj]) -> bool:
    for rs in active_of([*old_rss, new_rs]):
        desired = annotation_int(rs, DESIRED_REPLICAS_ANNOTATION)
        if desired is not None and desired != replicas_of(d):
            return True
    return False


def _go_round(x: float) -> int:
    """Go's math.Round: half away from zero."""
    return math.floor(abs(x) + 0.5) * (1 if x >= 0 else -1)


def _proportion(d: Obj, rs: Obj, to_add: int, added: int) -> int:
    if replicas_of(rs) == 0 or to_add == 0 or to_add == added:
        return 0
    if replicas_of(d) == 0:
        fraction = -replicas_of(rs)
    else:
        annotated = annotation_int(rs, MAX_REPLICAS_ANNOTATION)
        if not annotated:
            annotated = int_value(status_of(d).get("replicas"))
        if not annotated:
            return 0
        target = replicas_of(rs) * (replicas_of(d) + max_surge(d)) / annotated
        fraction = _go_round(target) - replicas_of(rs)
    allowed = to_add - added
    return min(fraction, allowed) if to_add > 0 else max(fraction, allowed)


def scale_plan(d: Obj, new_rs: Obj | None, old_rss: list[Obj]) -> list[tuple[Obj, int]]:
    """The sizes a scaling event gives the ReplicaSets (upstream `scale`): [(rs, size)]."""
    replicas = replicas_of(d)
    newest_first = sorted(
        old_rss, key=lambda r: (creation_time(r), meta(r).get("name") or ""), reverse=True
    )
    active = active_of([*newest_first, new_rs])
    if not active and (new_rs is not None or newest_first):
        latest = new_rs if new_rs is not None else newest_first[0]
        return [] if replicas_of(latest) == replicas else [(latest, replicas)]
    if len(active) == 1:
        return [] if replicas_of(active[0]) == replicas else [(active[0], replicas)]
    if (
        new_rs is not None
        and annotation_int(new_rs, DESIRED_REPLICAS_ANNOTATION) == replicas
        and replicas_of(new_rs) == replicas
        and available_of(new_rs) == replicas
    ):
        return [(rs, 0) for rs in active_of(list(old_rss))]
    if rolling_params(d) is None:
        return []
    allowed = replicas + max_surge(d) if replicas > 0 else 0
    to_add = allowed - sum_of(active, replicas_of)

    def newer(rs: Obj) -> float:
        return creation_time(rs)

    if to_add > 0:  # biggest first, newer first among equals
        ordered = sorted(active, key=lambda r: (-replicas_of(r), -newer(r)))
    else:  # biggest first, older first among equals
        ordered = sorted(active, key=lambda r: (-replicas_of(r), newer(r)))
    sizes: dict[str, int] = {}
    added = 0
    for rs in ordered:
        name = str(meta(rs).get("name"))
        if to_add != 0:
            p = _proportion(d, rs, to_add, added)
            sizes[name] = replicas_of(rs) + p
            added += p
        else:
            sizes[name] = replicas_of(rs)
    if to_add != 0 and ordered:
        first = str(meta(ordered[0]).get("name"))
        sizes[first] = max(0, sizes[first] + to_add - added)
    return [(rs, sizes[str(meta(rs).get("name"))]) for rs in ordered]


def history_to_delete(d: Obj, old_rss: list[Obj]) -> list[Obj]:
    """Old ReplicaSets beyond `revisionHistoryLimit`, oldest revisions first, that hold no
    pods and whose status is current."""
    limit = spec_of(d).get("revisionHistoryLimit")
    if limit is None:
        return []
    alive = [rs for rs in old_rss if not meta(rs).get("deletionTimestamp")]
    diff = len(alive) - int_value(limit)
    if diff <= 0:
        return []
    alive.sort(key=lambda r: (revision(r), creation_time(r), meta(r).get("name") or ""))
    out = []
    for rs in alive[:diff]:
        if (
            int_value(status_of(rs).get("replicas")) != 0
            or replicas_of(rs) != 0
            or int_value(meta(rs).get("generation"))
            > int_value(status_of(rs).get("observedGeneration"))
        ):
            continue
        out.append(rs)
    return out


def same_status(a: Obj, b: Obj) -> bool:
    def norm(s: Obj) -> Obj:
        return {k: v for k, v in s.items() if v not in (None, 0, [])}

    return norm(a) == norm(b)


# ================================================================================== reconciler
@dataclass
class Sync:
    """One sync's working state: the Deployment (latest we wrote) and its status conditions."""

    d: Obj
    conditions: list[Obj]
    revision: str | None = None  # the revision annotation the Deployment should carry
    collision_bump: bool = False


class DeploymentSync:
    """The steps a Deployment sync is made of (upstream sync.go's methods): find or create the
    new ReplicaSet and sync its revision, scale ReplicaSets, clean up history, and write the
    Deployment's status. `rolling_update`, `recreate_update` and `DeploymentReconciler` build
    on these."""

    def __init__(
        self,
        client: Client,
        deployments: Cache,
        replicasets: Cache,
        pods: Cache,
        events: EventRecorder | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.deployments = deployments
        self.replicasets = replicasets
        self.pods = pods
        self.events = events
        self.clock = clock

    def _event(self, obj: Obj, etype: str, reason: str, message: str) -> None:
        if self.events is not None:
            self.events.record(obj, etype, reason, message)

    # ------------------------------------------------------------------ the new ReplicaSet
    async def new_and_old(
        self, sync: Sync, rss: list[Obj], create: bool
    ) -> tuple[Obj | None, list[Obj]]:
        """upstream `getAllReplicaSetsAndSyncRevision`."""
        d = sync.d
        new_rs, old_rss = find_new_and_old(d, rss)
        next_revision = str(max((revision(r) for r in old_rss), default=0) + 1)
        now = self.clock()
        if new_rs is not None:
            new_rs = await self._sync_new_rs_annotations(d, new_rs, next_revision)
            sync.revision = str(
                (meta(new_rs).get("annotations") or {}).get(REVISION_ANNOTATION) or ""
            )
            if (
                has_progress_deadline(d)
                and get_condition({"conditions": sync.conditions}, PROGRESSING) is None
            ):
                holder: Obj = {"conditions": sync.conditions}
                set_condition(
                    holder,
                    new_condition(
                        PROGRESSING,
                        "True",
                        FOUND_NEW_RS_REASON,
                        f'Found new replica set "{meta(new_rs).get("name")}"',
                        now,
                    ),
                )
                sync.conditions = holder.get("conditions") or []
            return new_rs, old_rss
        if not create:
            return None, old_rss
        created = await self._create_new_rs(sync, old_rss, next_revision)
        return created, old_rss

    async def _sync_new_rs_annotations(self, d: Obj, rs: Obj, next_revision: str) -> Obj:
        annotations = dict(meta(rs).get("annotations") or {})
        changed = False
        for k, v in (meta(d).get("annotations") or {}).items():
            if k not in _SKIP_COPY and annotations.get(k) != v:
                annotations[k] = v
                changed = True
        old_revision = annotations.get(REVISION_ANNOTATION)
        if int_value(old_revision, 0) < int(next_revision):
            annotations[REVISION_ANNOTATION] = next_revision
            if old_revision:
                history = [
                    h
                    for h in str(annotations.get(REVISION_HISTORY_ANNOTATION) or "").split(",")
                    if h
                ]
                annotations[REVISION_HISTORY_ANNOTATION] = ",".join([*history, str(old_revision)])
            changed = True
        min_ready = spec_of(d).get("minReadySeconds")
        if int_value(spec_of(rs).get("minReadySeconds")) != int_value(min_ready):
            changed = True
        if not changed:
            return rs
        body = copy_json(rs)
        body["metadata"]["annotations"] = annotations
        body["spec"]["minReadySeconds"] = int_value(min_ready)
        updated: Obj = await self.client.update(REPLICASETS, body)
        return updated

    async def _create_new_rs(
        self, sync: Sync, old_rss: list[Obj], next_revision: str
    ) -> Obj | None:
        d = sync.d
        ns = str(meta(d).get("namespace") or "")
        collision = status_of(d).get("collisionCount")
        template = copy_json(spec_of(d).get("template") or {})
        h = pod_template_hash(template, int_value(collision) if collision is not None else None)
        tmeta = template.setdefault("metadata", {})
        tmeta["labels"] = {**(tmeta.get("labels") or {}), POD_TEMPLATE_HASH_LABEL: h}
        selector = copy_json(spec_of(d).get("selector") or {})
        selector["matchLabels"] = {
            **(selector.get("matchLabels") or {}),
            POD_TEMPLATE_HASH_LABEL: h,
        }
        annotations = {
            k: v for k, v in (meta(d).get("annotations") or {}).items() if k not in _SKIP_COPY
        }
        replicas = replicas_of(d)
        surge = max_surge(d)
        annotations.update(
            {
                REVISION_ANNOTATION: next_revision,
                DESIRED_REPLICAS_ANNOTATION: str(replicas),
                MAX_REPLICAS_ANNOTATION: str(replicas + surge),
            }
        )
        name = f"{meta(d).get('name')}-{h}"
        body: Obj = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": name,
                "namespace": ns,
                "labels": dict(tmeta["labels"]),
                "annotations": annotations,
                "ownerReferences": [controller_ref(d, API_VERSION, KIND)],
            },
            "spec": {
                "replicas": 0,
                "minReadySeconds": int_value(spec_of(d).get("minReadySeconds")),
                "selector": selector,
                "template": template,
            },
        }
        body["spec"]["replicas"] = new_rs_new_replicas(d, [*old_rss, body], body)
        now = self.clock()
        try:
            created: Obj = await self.client.create(REPLICASETS, body, ns)
        except ApiError as exc:
            if exc.code != 409:
                raise
            existing = await self.client.get(REPLICASETS, name, ns)
            ref = controller_of(existing)
            if (
                ref is not None
                and ref.get("uid") == meta(d).get("uid")
                and equal_ignore_hash(spec_of(existing).get("template"), spec_of(d).get("template"))
            ):
                sync.revision = str(
                    (meta(existing).get("annotations") or {}).get(REVISION_ANNOTATION)
                    or next_revision
                )
                return existing  # our cache had not seen it yet
            # A hash collision: another template owns the name. Bump collisionCount and retry.
            sync.collision_bump = True
            log.info("deployment %s/%s: hash collision on %s", ns, meta(d).get("name"), name)
            return None
        sync.revision = next_revision
        if has_progress_deadline(d):
            holder: Obj = {"conditions": sync.conditions}
            set_condition(
                holder,
                new_condition(
                    PROGRESSING, "True", NEW_RS_REASON, f'Created new replica set "{name}"', now
                ),
            )
            sync.conditions = holder.get("conditions") or []
        size = replicas_of(created)
        if size > 0:
            self._event(d, "Normal", "ScalingReplicaSet", f"Scaled up replica set {name} to {size}")
        return created

    # ------------------------------------------------------------------ scaling
    async def scale(self, d: Obj, rs: Obj, size: int) -> tuple[bool, Obj]:
        """Set `rs` to `size` replicas (and the replicas annotations); (size changed, rs)."""
        replicas = replicas_of(d)
        surge = max_surge(d)
        annotations = dict(meta(rs).get("annotations") or {})
        want = {
            DESIRED_REPLICAS_ANNOTATION: str(replicas),
            MAX_REPLICAS_ANNOTATION: str(replicas + surge),
        }
        old_size = replicas_of(rs)
        size_changed = old_size != size
        if not size_changed and all(annotations.get(k) == v for k, v in want.items()):
            return False, rs
        body = copy_json(rs)
        body["spec"]["replicas"] = size
        body["metadata"]["annotations"] = {**annotations, **want}
        updated: Obj = await self.client.update(REPLICASETS, body)
        if size_changed:
            direction = "up" if size > old_size else "down"
            self._event(
                d,
                "Normal",
                "ScalingReplicaSet",
                f"Scaled {direction} replica set {meta(rs).get('name')} to {size}",
            )
        return size_changed, updated

    async def apply_plan(
        self, d: Obj, plan: list[tuple[Obj, int]], rss: list[Obj]
    ) -> tuple[bool, list[Obj]]:
        """Scale per `plan`; returns (anything resized, `rss` with the updated objects)."""
        by_name = {meta(r).get("name"): r for r in rss}
        scaled = False
        for rs, size in plan:
            changed, updated = await self.scale(d, rs, size)
            scaled = scaled or changed
            by_name[meta(rs).get("name")] = updated
        return scaled, [by_name[meta(r).get("name")] for r in rss]

    # ------------------------------------------------------------------ strategies
    async def scale_sync(self, sync: Sync, rss: list[Obj]) -> Result:
        """Paused or a scaling event (upstream `sync`)."""
        d = sync.d
        new_rs, old_rss = await self.new_and_old(sync, rss, create=False)
        all_rss = [*old_rss, *([new_rs] if new_rs else [])]
        _, all_rss = await self.apply_plan(d, scale_plan(d, new_rs, old_rss), all_rss)
        new_rs, old_rss = self.split(all_rss, new_rs)
        if spec_of(d).get("paused"):
            await self.cleanup(d, old_rss)
        return await self.finish(sync, all_rss, new_rs, rollout=False)

    @staticmethod
    def split(all_rss: list[Obj], new_rs: Obj | None) -> tuple[Obj | None, list[Obj]]:
        if new_rs is None:
            return None, all_rss
        name = meta(new_rs).get("name")
        new = next((r for r in all_rss if meta(r).get("name") == name), new_rs)
        return new, [r for r in all_rss if meta(r).get("name") != name]

    async def cleanup(self, d: Obj, old_rss: list[Obj]) -> None:
        for rs in history_to_delete(d, old_rss):
            m = meta(rs)
            try:
                await self.client.delete(
                    REPLICASETS,
                    str(m.get("name")),
                    str(m.get("namespace")),
                    preconditions={"uid": m.get("uid")},
                )
            except ApiError as exc:
                if exc.code not in (404, 409):
                    raise

    def paused_conditions(self, sync: Sync, now: float) -> None:
        """upstream `checkPausedConditions`."""
        d = sync.d
        if not has_progress_deadline(d):
            return
        holder: Obj = {"conditions": sync.conditions}
        cond = get_condition(holder, PROGRESSING)
        if cond is not None and cond.get("reason") == TIMED_OUT_REASON:
            return
        paused_cond = cond is not None and cond.get("reason") == PAUSED_REASON
        if spec_of(d).get("paused") and not paused_cond:
            set_condition(
                holder,
                new_condition(PROGRESSING, "Unknown", PAUSED_REASON, "Deployment is paused", now),
            )
        elif not spec_of(d).get("paused") and paused_cond:
            set_condition(
                holder,
                new_condition(PROGRESSING, "Unknown", RESUMED_REASON, "Deployment is resumed", now),
            )
        sync.conditions = holder.get("conditions") or []

    # ------------------------------------------------------------------ writing the result
    async def finish(
        self, sync: Sync, all_rss: list[Obj], new_rs: Obj | None, *, rollout: bool
    ) -> Result:
        d = sync.d
        now = self.clock()
        if rollout:
            status = rollout_conditions(d, all_rss, new_rs, sync.conditions, now)
        else:
            status = calculate_status(d, all_rss, new_rs, sync.conditions, now)
        if sync.collision_bump:
            status["collisionCount"] = int_value(status_of(d).get("collisionCount")) + 1
        latest = d
        name, ns = str(meta(d).get("name")), str(meta(d).get("namespace"))
        if (
            sync.revision
            and (meta(d).get("annotations") or {}).get(REVISION_ANNOTATION) != sync.revision
        ):
            patch = {
                "metadata": {
                    "annotations": {REVISION_ANNOTATION: sync.revision},
                    "resourceVersion": meta(d).get("resourceVersion"),
                }
            }
            try:
                latest = await self.client.patch(DEPLOYMENTS, name, patch, ns)
            except ApiError as exc:
                if exc.code in (404, 409):
                    return Result(requeue=exc.code == 409)
                raise
        if not same_status(status_of(d), status):
            try:
                await self.client.update(
                    DEPLOYMENTS, {**latest, "status": status}, subresource="status"
                )
            except ApiError as exc:
                if exc.code in (404, 409):
                    return Result(requeue=exc.code == 409)
                raise
        if sync.collision_bump:
            return Result(requeue=True)
        if rollout:
            after = requeue_stuck(d, status, now)
            if after is not None:
                return Result(requeue_after=after)
        return Result()
