"""The namespace controller: empties a terminating namespace, then lets it go.

Theory of operation
-------------------
Deleting a Namespace whose `spec.finalizers` holds "kubernetes" (every namespace gets it) does
not remove it: the API server sets its deletionTimestamp and `status.phase: Terminating`, and
refuses new content in it. This controller reconciles such a namespace (key = its name):

1. for every namespaced kind the server serves (custom kinds included, Events too; read from
   `kinds()` on each pass, so a CRD created a moment ago counts), LIST the namespace and DELETE
   each object not already being deleted (default options: pods get their grace period,
   owners' finalizers run as usual);
2. if anything is left (objects waiting for a grace period or a finalizer), set the
   `NamespaceContentRemaining` condition and requeue after `recheck` seconds — the pass is
   idempotent, so repeating it is how the controller waits;
3. once a pass finds nothing, remove "kubernetes" from `spec.finalizers` (a conditional update
   of the namespace; upstream uses the `/finalize` subresource). With no finalizers left and a
   deletionTimestamp, the API server removes the namespace.

Reads for decisions are live LISTs, never the informer cache: the cache only says which
namespaces to look at. Invariant: the "kubernetes" finalizer is removed only after a LIST of
every namespaced kind found the namespace empty. A delete that fails (other than 404/409) is
counted in `NamespaceDeletionContentFailure` and retried on the next pass.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from orchestrator.client import NAMESPACES, ResourceInfo
from orchestrator.controllers.runtime.client import Client
from orchestrator.controllers.runtime.controller import Controller, Result
from orchestrator.controllers.runtime.informer import InformerFactory
from orchestrator.controllers.runtime.manager import ControllerContext
from orchestrator.controllers.writes import update_retrying
from orchestrator.kube.errors import ApiError
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.columns import now_rfc3339
from orchestrator.metrics import REGISTRY, Registry

__all__ = ["KUBERNETES_FINALIZER", "NamespaceController", "namespace_controller"]

log = logging.getLogger(__name__)


KUBERNETES_FINALIZER = "kubernetes"
WORKERS = 10  # --concurrent-namespace-syncs
RECHECK = 1.0  # seconds between passes while content remains


class NamespaceController:
    """The reconciler (see the module doc); `controller()` wraps it in a `Controller`."""

    def __init__(
        self,
        client: Client,
        informers: InformerFactory,
        kinds: Callable[[], Iterable[ResourceInfo]],
        *,
        recheck: float = RECHECK,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.client = client
        self.cache = informers.informer(NAMESPACES)
        self.kinds = kinds
        self.recheck = recheck
        self.clock = clock or time.time

    def controller(self, *, workers: int = WORKERS, metrics: Registry = REGISTRY) -> Controller:
        c = Controller("namespace", self, workers, metrics=metrics)
        c.watches(self.cache)
        return c

    async def reconcile(self, key: str) -> Result:
        ns = self.cache.get(key)
        if ns is None or not (ns.get("metadata") or {}).get("deletionTimestamp"):
            return Result()
        if KUBERNETES_FINALIZER not in ((ns.get("spec") or {}).get("finalizers") or []):
            return Result()
        remaining, failures = await self._delete_content(key)
        if remaining:
            await self._set_conditions(key, remaining, failures)
            return Result(requeue_after=self.recheck)
        await self._finalize(key)
        log.info("namespace %s: empty; finalized", key)
        return Result()

    async def _delete_content(self, namespace: str) -> tuple[dict[str, int], list[str]]:
        """One pass: delete what is there; return what was left (resource -> count) and the
        deletes that failed."""
        remaining: dict[str, int] = {}
        failures: list[str] = []
        for res in self.kinds():
            if not res.namespaced:
                continue
            listed = await self.client.list(res, namespace)
            items = listed.get("items") or []
            if not items:
                continue
            remaining[res.group_resource] = len(items)
            for obj in items:
                meta = obj.get("metadata") or {}
                if meta.get("deletionTimestamp"):
                    continue  # already on its way (grace period, finalizers)
                try:
                    await self.client.delete(
                        res, str(meta.get("name")), namespace, preconditions={"uid": meta["uid"]}
                    )
                except ApiError as exc:
                    if exc.code not in (404, 409):
                        failures.append(f"{res.group_resource}/{meta.get('name')}: {exc}")
        return remaining, failures

    async def _finalize(self, name: str) -> None:
        def change(ns: Obj) -> bool:
            spec = ns.setdefault("spec", {})
            finalizers = list(spec.get("finalizers") or [])
            if KUBERNETES_FINALIZER not in finalizers:
                return False
            spec["finalizers"] = [f for f in finalizers if f != KUBERNETES_FINALIZER]
            return True

        await update_retrying(self.client, NAMESPACES, name, change)

    async def _set_conditions(
        self, name: str, remaining: dict[str, int], failures: list[str]
    ) -> None:
        content = ", ".join(f"{r} has {n} resource instances" for r, n in sorted(remaining.items()))
        wanted = [
            (
                "NamespaceContentRemaining",
                "SomeResourcesRemain",
                f"Some resources are remaining: {content}",
            ),
            (
                "NamespaceDeletionContentFailure",
                "ContentDeletionFailed",
                "; ".join(failures) if failures else "",
            ),
        ]

        def change(ns: Obj) -> bool:
            status = ns.setdefault("status", {})
            conditions = [c for c in status.get("conditions") or [] if isinstance(c, dict)]
            changed = False
            for ctype, reason, message in wanted:
                current = next((c for c in conditions if c.get("type") == ctype), None)
                cstatus = "True" if message else "False"
                if current is None:
                    current = {"type": ctype}
                    conditions.append(current)
                elif current.get("status") == cstatus and current.get("message", "") == message:
                    continue
                if current.get("status") != cstatus:
                    current["lastTransitionTime"] = now_rfc3339(self.clock())
                current.update(
                    status=cstatus, reason=reason if message else "ContentDeleted", message=message
                )
                changed = True
            status["conditions"] = conditions
            return changed

        try:
            await update_retrying(self.client, NAMESPACES, name, change, subresource="status")
        except ApiError as exc:
            log.info("namespace %s: conditions not written: %s", name, exc)


def namespace_controller(
    ctx: ControllerContext, *, recheck: float = RECHECK, workers: int = WORKERS
) -> Controller:
    """The namespace `Controller` over this server's API (every namespaced kind it serves,
    Events included, is emptied)."""
    from orchestrator.controllers.gc.kinds import served_resources

    registry = ctx.client.api.registry
    return NamespaceController(
        ctx.client,
        ctx.informers,
        lambda: served_resources(registry, namespaced_only=True, events=True),
        recheck=recheck,
    ).controller(workers=workers, metrics=ctx.metrics)
