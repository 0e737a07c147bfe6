"""The endpoints controller: each Service with a selector gets an Endpoints object of the same
name listing the pods behind it.

Theory of operation
-------------------
A `Controller` over Service keys. A Service is enqueued on its own changes; a pod change
enqueues every Service in the pod's namespace whose selector matches the pod's old or new
labels; a change to an Endpoints object enqueues its Service (so a hand-edited or deleted
Endpoints is put back). The reconcile is level-based, from the caches:

* no Service: delete the Endpoints of that name (404 is fine); a Service without a selector:
  leave its Endpoints alone (the user manages them);
* otherwise `desired_subsets(service, pods)` (pure): the pods matching the selector that have a
  `status.podIP`, are not terminating and not finished; ready ones (condition Ready=True, or any
  pod when `publishNotReadyAddresses`) go to `addresses`, the others to `notReadyAddresses`,
  each with `ip`, `nodeName` and a `targetRef` to the pod. Each service port's `targetPort` is
  resolved per pod: a number is taken as is, a name is looked up among the pod's containers'
  ports (a pod without that named port is left out of that port). Pods with the same resolved
  ports share a subset; everything is sorted, so equal inputs give equal objects;
* create the Endpoints, or update it when its subsets or labels (the Service's) differ; an
  unchanged result writes nothing.

Invariant: the controller only writes Endpoints named after a Service with a selector, and
only deletes those of Services that are gone.
"""

from __future__ import annotations

import logging

from orchestrator.client.resource import ENDPOINTS, PODS, SERVICES
from orchestrator.controllers.podutil import (
    enqueue_selecting_services,
    is_pod_ready,
    selector_matches,
    target_port,
)
from orchestrator.controllers.runtime.client import Client
from orchestrator.controllers.runtime.controller import Controller, Result
from orchestrator.controllers.runtime.informer import (
    NAMESPACE_INDEX,
    InformerFactory,
)
from orchestrator.controllers.runtime.manager import ControllerContext
from orchestrator.kube.errors import ApiError
from orchestrator.kube.objects import Obj
from orchestrator.metrics import REGISTRY, Registry

__all__ = ["EndpointsController", "desired_subsets", "endpoints_controller"]

log = logging.getLogger(__name__)

WORKERS = 5  # --concurrent-endpoint-syncs


def _address(pod: Obj) -> Obj:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    addr: Obj = {
        "ip": (pod.get("status") or {}).get("podIP"),
        "targetRef": {
            "kind": "Pod",
            "namespace": meta.get("namespace", ""),
            "name": meta.get("name", ""),
            "uid": meta.get("uid", ""),
        },
    }
    if spec.get("nodeName"):
        addr["nodeName"] = spec["nodeName"]
    return addr


def desired_subsets(service: Obj, pods: list[Obj]) -> list[Obj]:
    """The Endpoints subsets for `service` over candidate `pods` (see the module doc)."""
    spec = service.get("spec") or {}
    selector = spec.get("selector") or {}
    publish_not_ready = bool(spec.get("publishNotReadyAddresses"))
    svc_ports = [p for p in spec.get("ports") or [] if isinstance(p, dict)]
    groups: dict[tuple[tuple[str, int, str], ...], tuple[list[Obj], list[Obj]]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        if not selector_matches(selector, meta.get("labels") or {}):
            continue
        if not status.get("podIP") or meta.get("deletionTimestamp"):
            continue
        if status.get("phase") in ("Succeeded", "Failed"):
            continue
        ports = []
        for sp in svc_ports:
            port = target_port(pod, sp.get("targetPort", sp.get("port")))
            if port is not None:
                ports.append((str(sp.get("name") or ""), port, str(sp.get("protocol") or "TCP")))
        if svc_ports and not ports:
            continue
        ready, not_ready = groups.setdefault(tuple(sorted(ports)), ([], []))
        (ready if publish_not_ready or is_pod_ready(pod) else not_ready).append(_address(pod))
    subsets = []
    for ports_key in sorted(groups):
        ready, not_ready = groups[ports_key]
        subset: Obj = {}
        if ready:
            subset["addresses"] = sorted(ready, key=lambda a: (a["ip"], a["targetRef"]["name"]))
        if not_ready:
            subset["notReadyAddresses"] = sorted(
                not_ready, key=lambda a: (a["ip"], a["targetRef"]["name"])
            )
        if ports_key:
            subset["ports"] = [
                {**({"name": n} if n else {}), "port": p, "protocol": proto}
                for n, p, proto in ports_key
            ]
        subsets.append(subset)
    return subsets


class EndpointsController:
    """The reconciler (see the module doc); `controller()` wraps it in a `Controller`."""

    def __init__(self, client: Client, informers: InformerFactory) -> None:
        self.client = client
        self.services = informers.informer(SERVICES)
        self.pods = informers.informer(PODS)
        self.endpoints = informers.informer(ENDPOINTS)

    def controller(self, *, workers: int = WORKERS, metrics: Registry = REGISTRY) -> Controller:
        c = Controller("endpoints", self, workers, metrics=metrics)
        c.watches(self.services)
        c.watches(self.endpoints)  # Endpoints ns/name is its Service's key

        enqueue_selecting_services(self.pods, self.services, c.enqueue)
        return c

    async def reconcile(self, key: str) -> Result:
        ns, _, name = key.partition("/")
        svc = self.services.get(key)
        if svc is None:
            if self.endpoints.get(key) is not None:
                try:
                    await self.client.delete(ENDPOINTS, name, ns)
                except ApiError as exc:
                    if exc.code != 404:
                        raise
            return Result()
        if not (svc.get("spec") or {}).get("selector"):
            return Result()
        pods = self.pods.by_index(NAMESPACE_INDEX, ns)
        subsets = desired_subsets(svc, pods)
        labels = dict((svc.get("metadata") or {}).get("labels") or {})
        current = self.endpoints.get(key)
        if current is None:
            body: Obj = {
                "apiVersion": "v1",
                "kind": "Endpoints",
                "metadata": {
                    "name": name,
                    "namespace": ns,
                    **({"labels": labels} if labels else {}),
                },
                "subsets": subsets,
            }
            try:
                await self.client.create(ENDPOINTS, body, ns)
                return Result()
            except ApiError as exc:
                if exc.code != 409:
                    raise
                current = await self.client.get(ENDPOINTS, name, ns)  # the cache lagged
        if (current.get("subsets") or []) == subsets and (
            (current.get("metadata") or {}).get("labels") or {}
        ) == labels:
            return Result()
        updated = {**current, "subsets": subsets}
        meta = dict(current.get("metadata") or {})
        if labels:
            meta["labels"] = labels
        else:
            meta.pop("labels", None)
        updated["metadata"] = meta
        await self.client.update(ENDPOINTS, updated)  # conditional: a 409 is retried
        return Result()


def endpoints_controller(ctx: ControllerContext, *, workers: int = WORKERS) -> Controller:
    return EndpointsController(ctx.client, ctx.informers).controller(
        workers=workers, metrics=ctx.metrics
    )
