"""The EndpointSlice controller and its mirroring half: `discovery.k8s.io/v1` EndpointSlices
for every Service, which the node proxy and the node-local DNS read.

Theory of operation
-------------------
One `Controller` over Service keys (`ns/name`). A Service is enqueued on its own changes; a pod
change enqueues every Service of the pod's namespace whose selector matches the pod's old or new
labels; an Endpoints change enqueues the Service of that name (mirroring); a slice change
enqueues the Service its `kubernetes.io/service-name` label names (so a hand-edited or deleted
slice is put back). The reconcile is level-based, from the caches:

* no Service, or an ExternalName one: delete the slices either manager wrote for that name;
* a Service with a selector: `slicecore.desired_slices(service, pods, slices)`, managed by
  `endpointslice-controller.k8s.io` (and any mirrored slices of that name are deleted);
* a Service without a selector whose Endpoints exist (someone else writes them: the endpoints
  controller leaves selector-less Services alone), unless the Endpoints carry
  `endpointslice.kubernetes.io/skip-mirror: "true"`: `slicecore.mirrored_slices`, managed by
  `endpointslicemirroring-controller.k8s.io`, as upstream's mirroring controller
  (`default/kubernetes` gets its slice this way); otherwise its slices are deleted.

The plan is carried out deletes first, then updates (conditional on the resourceVersion read:
a 409 is retried by the runtime with backoff), then creates (`generateName: <service>-`).

Stale caches: every write is recorded in `podutil.Expectations` (the resourceVersion of
creates and updates, the uid of deletes); while the slice cache has not seen them the key is
not planned again (it is requeued: the slice's own watch event enqueues it again anyway), so a
lagging cache can never make the controller create the same slices twice.

Invariants: the controller only writes slices labelled with one of its two manager names and
the name of an existing Service; an unchanged Service, pod set and slice set write nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from orchestrator.client.resource import ENDPOINT_SLICES, ENDPOINTS, PODS, SERVICES
from orchestrator.controllers.podutil import Expectations, enqueue_selecting_services
from orchestrator.controllers.runtime.client import Client
from orchestrator.controllers.runtime.controller import Controller, Result
from orchestrator.controllers.runtime.informer import (
    NAMESPACE_INDEX,
    InformerFactory,
    deleted_object,
)
from orchestrator.controllers.runtime.manager import ControllerContext
from orchestrator.controllers.slicecore import (
    CONTROLLER_NAME,
    MIRROR_NAME,
    SKIP_MIRROR_LABEL,
    Plan,
    desired_slices,
    mirrored_slices,
    plan,
)
from orchestrator.kube.errors import ApiError
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.discovery_v1 import LABEL_MANAGED_BY, LABEL_SERVICE_NAME
from orchestrator.metrics import REGISTRY, Registry

__all__ = ["EndpointSliceController", "endpointslice_controller"]

log = logging.getLogger(__name__)

WORKERS = 5  # --concurrent-service-endpoint-syncs
SERVICE_NAME_INDEX = "endpointslice-service"  # "ns/service" of a slice's service-name label


def _service_of(slice_: Obj) -> list[str]:
    meta = slice_.get("metadata") or {}
    name = (meta.get("labels") or {}).get(LABEL_SERVICE_NAME)
    return [f"{meta.get('namespace', '')}/{name}"] if name else []


def _meta(o: Obj) -> Obj:
    return o.get("metadata") or {}


class EndpointSliceController:
    """The reconciler (module doc); `controller()` wraps it in a `Controller`."""

    def __init__(
        self,
        client: Client,
        informers: InformerFactory,
        *,
        expectations: Expectations | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.services = informers.informer(SERVICES)
        self.pods = informers.informer(PODS)
        self.endpoints = informers.informer(ENDPOINTS)
        self.slices = informers.informer(ENDPOINT_SLICES)
        self.slices.add_indexer(SERVICE_NAME_INDEX, _service_of)
        self.expectations = expectations or Expectations()
        self.clock = clock

    def controller(self, *, workers: int = WORKERS, metrics: Registry = REGISTRY) -> Controller:
        c = Controller("endpointslice", self, workers, metrics=metrics)
        c.watches(self.services)
        c.watches(self.endpoints)  # an Endpoints' ns/name is its Service's key

        def slice_changed(*objs: Any) -> None:  # (new), (old, new) or (deleted)
            for key in {k for o in objs for k in _service_of(deleted_object(o))}:
                c.enqueue(key)

        self.slices.add_event_handler(
            on_add=slice_changed, on_update=slice_changed, on_delete=slice_changed
        )

        enqueue_selecting_services(self.pods, self.services, c.enqueue)
        return c

    def _plan(self, key: str, svc: Obj | None, slices: list[Obj]) -> Plan:
        ours = [
            s
            for s in slices
            if (_meta(s).get("labels") or {}).get(LABEL_MANAGED_BY)
            in (CONTROLLER_NAME, MIRROR_NAME)
        ]
        spec = (svc or {}).get("spec") or {}
        if svc is None or spec.get("type") == "ExternalName":
            return Plan(delete=ours)
        if spec.get("selector"):
            out = desired_slices(svc, self.pods.by_index(NAMESPACE_INDEX, _ns(key)), slices)
            other = MIRROR_NAME
        else:
            ep = self.endpoints.get(key)
            skip = ep is not None and (_meta(ep).get("labels") or {}).get(SKIP_MIRROR_LABEL)
            if ep is None or skip == "true":
                out = plan(svc, {}, slices, MIRROR_NAME, "IPv4", placeholder=False)
            else:
                out = mirrored_slices(svc, ep, slices)
            other = CONTROLLER_NAME
        out.delete.extend(
            s for s in ours if (_meta(s).get("labels") or {}).get(LABEL_MANAGED_BY) == other
        )
        return out

    async def reconcile(self, key: str) -> Result:
        now = self.clock()
        svc = self.services.get(key)
        if not self.expectations.satisfied(key, self.slices, now):
            expires = self.expectations.expires_in(key, now)
            return Result(requeue_after=max(0.001, expires or 0.0))
        slices = self.slices.by_index(SERVICE_NAME_INDEX, key)
        todo = self._plan(key, svc, slices)
        if svc is None and not todo.delete:
            self.expectations.forget(key)
        await self._apply(key, todo)
        return Result()

    async def _apply(self, key: str, todo: Plan) -> None:
        ns = _ns(key)
        for s in todo.delete:
            name = str(_meta(s).get("name", ""))
            try:
                await self.client.delete(ENDPOINT_SLICES, name, ns)
            except ApiError as exc:
                if exc.code != 404:
                    raise
            self.expectations.deleted(key, f"{ns}/{name}", str(_meta(s).get("uid")), self.clock())
        for s in todo.update:
            try:
                written = await self.client.update(ENDPOINT_SLICES, s)
            except ApiError as exc:
                if exc.code != 404:
                    raise  # 409: a newer slice is on its way; the runtime retries
                continue
            self._wrote(key, written)
        for s in todo.create:
            written = await self.client.create(ENDPOINT_SLICES, s, ns)
            self._wrote(key, written)
        if not todo.empty:
            log.debug(
                "endpointslices of %s: %d created, %d updated, %d deleted",
                key,
                len(todo.create),
                len(todo.update),
                len(todo.delete),
            )

    def _wrote(self, key: str, obj: Obj) -> None:
        self.expectations.created(key, str(_meta(obj).get("resourceVersion") or ""), self.clock())


def _ns(key: str) -> str:
    return key.partition("/")[0]


def endpointslice_controller(ctx: ControllerContext, *, workers: int = WORKERS) -> Controller:
    return EndpointSliceController(ctx.client, ctx.informers).controller(
        workers=workers, metrics=ctx.metrics
    )
