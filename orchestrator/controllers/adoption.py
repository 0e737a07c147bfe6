"""Adopting and releasing dependents: the I/O around `podutil.claim`, shared by the controllers
that own objects by label selector (Deployment -> ReplicaSets, ReplicaSet -> Pods), and the
informer handler that sends orphans to the owners that may adopt them (`watch_orphans`).

Invariants (upstream's ControllerRefManager): an orphan is adopted only after a direct, uncached
read shows the owner still exists with the same uid and is not being deleted; every adopt or
release is a patch conditional on the dependent's resourceVersion, so a dependent changed
meanwhile is left alone (a 409 is for the next sync); a dependent already gone is skipped.
"""

from __future__ import annotations

from typing import Any

from orchestrator.client.resource import ResourceInfo
from orchestrator.controllers.podutil import ORPHAN_INDEX, claim, controller_ref, labels_of, meta
from orchestrator.controllers.runtime.client import Client
from orchestrator.controllers.runtime.controller import Controller
from orchestrator.controllers.runtime.informer import (
    NAMESPACE_INDEX,
    OWNER_INDEX,
    SharedInformer,
    controller_of,
    deleted_object,
    object_key,
)
from orchestrator.kube.errors import ApiError
from orchestrator.kube.objects import Obj
from orchestrator.kube.selectors import LabelSelector, from_label_selector_object


async def claim_dependents(
    client: Client,
    owner: Obj,
    owner_res: ResourceInfo,
    selector: LabelSelector,
    dependents: Any,  # a SharedInformer of the dependents with OWNER_INDEX and ORPHAN_INDEX
    dependent_res: ResourceInfo,
) -> list[Obj]:
    """The dependents `owner` controls after adopting matching orphans and releasing owned
    objects that no longer match `selector`."""
    uid = str(meta(owner).get("uid") or "")
    ns = str(meta(owner).get("namespace") or "")
    candidates = {object_key(o): o for o in dependents.by_index(OWNER_INDEX, uid)}
    for orphan in dependents.by_index(ORPHAN_INDEX, ns):
        candidates.setdefault(object_key(orphan), orphan)
    claims = claim(owner, selector, candidates.values())
    adopted = {id(o) for o in claims.adopt}
    if claims.adopt:
        fresh = await client.get(owner_res, str(meta(owner).get("name")), ns)
        if meta(fresh).get("uid") != uid or meta(fresh).get("deletionTimestamp"):
            return [o for o in claims.owned if id(o) not in adopted]
    ref = controller_ref(owner, owner_res.api_version, owner_res.kind)
    owned: list[Obj] = []
    for obj in claims.owned:
        if id(obj) in adopted:
            patched = await _patch_refs(
                client, dependent_res, obj, [*(meta(obj).get("ownerReferences") or []), ref]
            )
            if patched is None:
                continue
            obj = patched
        owned.append(obj)
    for obj in claims.release:
        refs = [r for r in meta(obj).get("ownerReferences") or [] if r.get("uid") != uid]
        await _patch_refs(client, dependent_res, obj, refs)
    return owned


async def _patch_refs(client: Client, res: ResourceInfo, obj: Obj, refs: list[Obj]) -> Obj | None:
    m = meta(obj)
    body = {
        "metadata": {"ownerReferences": refs or None, "resourceVersion": m.get("resourceVersion")}
    }
    try:
        return await client.patch(res, str(m.get("name")), body, str(m.get("namespace")))
    except ApiError as exc:
        if exc.code == 404:
            return None
        raise


def selector_of(owner: Obj) -> LabelSelector | None:
    """An owner's `spec.selector`, None when it is invalid or empty (selects nothing to adopt)."""
    try:
        sel = from_label_selector_object((owner.get("spec") or {}).get("selector"))
    except ApiError:
        return None
    return None if sel.empty() else sel


def watch_orphans(
    controller: Controller, owners: SharedInformer, dependents: SharedInformer
) -> None:
    """Dependents without a controller enqueue every owner of their namespace whose selector
    matches them (so orphans are adopted, and dependents whose labels changed are released).
    `owners` needs the NAMESPACE_INDEX."""

    def enqueue_matching(obj: Obj) -> None:
        if controller_of(obj) is not None:
            return
        labels = labels_of(obj)
        for owner in owners.by_index(NAMESPACE_INDEX, str(meta(obj).get("namespace") or "")):
            sel = selector_of(owner)
            if sel is not None and sel.matches(labels):
                controller.enqueue(object_key(owner))

    def updated(old: Obj, new: Obj) -> None:
        enqueue_matching(new)
        if labels_of(old) != labels_of(new):
            enqueue_matching(old)

    dependents.add_event_handler(
        on_add=enqueue_matching,
        on_update=updated,
        on_delete=lambda obj: enqueue_matching(deleted_object(obj)),
    )
