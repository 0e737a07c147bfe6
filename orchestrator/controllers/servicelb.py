"""ServiceLB: LoadBalancer Services on bare metal, as k3s's klipper-lb does it, without the
DaemonSet: the load balancer is every Ready node, and the node proxy serves the Service's port
on each of them.

Theory of operation
-------------------
A `Controller` over Service keys. A Service is enqueued on its own changes; a Node change that
can move its addresses in or out of the set (added, deleted, Ready flipped, addresses or the
exclusion label changed) enqueues every Service this controller looks after; an EndpointSlice
change enqueues its Service (for `externalTrafficPolicy: Local`). The reconcile is
level-based, from the caches, around the pure `desired_ingress(service, nodes)`:

* a Service of type LoadBalancer whose `spec.loadBalancerClass` is unset or `CLASS` gets
  `status.loadBalancer.ingress` = one `{"ip": ...}` per Ready node (not being deleted, not
  labelled `node.kubernetes.io/exclude-from-external-load-balancers`), the node's ExternalIP
  when it has one, else its InternalIP; unique, sorted as addresses (IPv4 first). With
  `externalTrafficPolicy: Local` only the nodes that host a ready endpoint of the Service
  (from its EndpointSlices' `nodeName`s) are listed: the others would drop the traffic. No
  such node: an empty ingress (kubectl shows `<pending>`);
* a Service of type LoadBalancer with another class belongs to another implementation: left
  alone (`None`);
* any other Service that still carries an ingress (it stopped being a LoadBalancer) gets it
  cleared; one without is left alone.

The status is written with a merge patch of `/status`, only when it differs from the cached
one (an unchanged result writes nothing); a 404 means the Service went meanwhile.

Invariants: the controller only ever writes `status.loadBalancer` of Services; never those of
another load balancer class.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable
from typing import Any

from orchestrator.client.resource import ENDPOINT_SLICES, NODES, SERVICES
from orchestrator.controllers.runtime.client import Client
from orchestrator.controllers.runtime.controller import Controller, Result
from orchestrator.controllers.runtime.informer import (
    LABEL_INDEX,
    InformerFactory,
    deleted_object,
    object_key,
)
from orchestrator.controllers.runtime.manager import ControllerContext
from orchestrator.kube.conditions import condition_true
from orchestrator.kube.errors import ApiError
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.discovery_v1 import LABEL_SERVICE_NAME
from orchestrator.metrics import REGISTRY, Registry

__all__ = [
    "CLASS",
    "EXCLUDE_LABEL",
    "ServiceLBController",
    "desired_ingress",
    "endpoint_nodes",
    "servicelb_controller",
]

log = logging.getLogger(__name__)

CLASS = "orchestrator.dev/servicelb"  # spec.loadBalancerClass this controller answers to
EXCLUDE_LABEL = "node.kubernetes.io/exclude-from-external-load-balancers"
WORKERS = 2


def _is_ours(service: Obj) -> bool:
    spec = service.get("spec") or {}
    return spec.get("type") == "LoadBalancer" and spec.get("loadBalancerClass") in (None, "", CLASS)


def node_address(node: Obj) -> str | None:
    """The node's ExternalIP when it has one, else its InternalIP (None: neither)."""
    addresses = [
        a for a in (node.get("status") or {}).get("addresses") or [] if isinstance(a, dict)
    ]
    for kind in ("ExternalIP", "InternalIP"):
        for a in addresses:
            if a.get("type") == kind and a.get("address"):
                return str(a["address"])
    return None


def _serves(node: Obj) -> bool:
    meta = node.get("metadata") or {}
    if meta.get("deletionTimestamp") or EXCLUDE_LABEL in (meta.get("labels") or {}):
        return False
    return condition_true(node.get("status"), "Ready")


def _sort_key(ip: str) -> tuple[int, int, str]:
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return (2, 0, ip)  # not an address (a name): after the addresses
    return (addr.version == 6, int(addr), ip)


def endpoint_nodes(slices: Iterable[Obj]) -> set[str]:
    """The nodes that host a ready endpoint in `slices`."""
    return {
        str(ep["nodeName"])
        for s in slices
        for ep in s.get("endpoints") or []
        if isinstance(ep, dict)
        and ep.get("nodeName")
        and (ep.get("conditions") or {}).get("ready") is not False
    }


def desired_ingress(
    service: Obj, nodes: Iterable[Obj], slices: Iterable[Obj] = ()
) -> list[Obj] | None:
    """The `status.loadBalancer.ingress` `service` should have, given the nodes and the
    Service's EndpointSlices; None: not this controller's business (module doc)."""
    spec = service.get("spec") or {}
    if spec.get("type") == "LoadBalancer" and not _is_ours(service):
        return None
    if not _is_ours(service):
        return []
    if spec.get("externalTrafficPolicy") == "Local":
        local = endpoint_nodes(slices)
        nodes = [n for n in nodes if (n.get("metadata") or {}).get("name") in local]
    ips = {ip for n in nodes if _serves(n) and (ip := node_address(n)) is not None}
    return [{"ip": ip} for ip in sorted(ips, key=_sort_key)]


def _ingress_of(service: Obj) -> list[Any]:
    lb = (service.get("status") or {}).get("loadBalancer") or {}
    return list(lb.get("ingress") or [])


class ServiceLBController:
    """The reconciler (module doc); `controller()` wraps it in a `Controller`."""

    def __init__(self, client: Client, informers: InformerFactory) -> None:
        self.client = client
        self.services = informers.informer(SERVICES)
        self.nodes = informers.informer(NODES)
        self.slices = informers.informer(ENDPOINT_SLICES)

    def controller(self, *, workers: int = WORKERS, metrics: Registry = REGISTRY) -> Controller:
        c = Controller("servicelb", self, workers, metrics=metrics)
        c.watches(self.services)

        def nodes_changed(*objs: Any) -> None:
            if len(objs) == 2:
                old, new = objs
                if (_serves(old), node_address(old)) == (_serves(new), node_address(new)):
                    return  # a heartbeat: the set of addresses did not move
            for svc in self.services.list():
                if _is_ours(svc):
                    c.enqueue(object_key(svc))

        self.nodes.add_event_handler(
            on_add=nodes_changed,
            on_update=nodes_changed,
            on_delete=lambda obj: nodes_changed(deleted_object(obj)),
        )

        def slice_changed(*objs: Any) -> None:  # (new), (old, new) or (deleted)
            for o in objs:
                meta = deleted_object(o).get("metadata") or {}
                name = (meta.get("labels") or {}).get(LABEL_SERVICE_NAME)
                key = f"{meta.get('namespace', '')}/{name}"
                svc = self.services.get(key) if name else None
                if svc is not None and _is_ours(svc):
                    c.enqueue(key)

        self.slices.add_event_handler(
            on_add=slice_changed, on_update=slice_changed, on_delete=slice_changed
        )
        return c

    def _slices_of(self, key: str) -> list[Obj]:
        ns, _, name = key.partition("/")
        return [
            s
            for s in self.slices.by_index(LABEL_INDEX, f"{LABEL_SERVICE_NAME}={name}")
            if (s.get("metadata") or {}).get("namespace") == ns
        ]

    async def reconcile(self, key: str) -> Result:
        svc = self.services.get(key)
        if svc is None:
            return Result()
        want = desired_ingress(svc, self.nodes.list(), self._slices_of(key))
        if want is None or want == _ingress_of(svc):
            return Result()
        ns, _, name = key.partition("/")
        body = {"status": {"loadBalancer": {"ingress": want or None}}}  # null removes the field
        try:
            await self.client.patch(SERVICES, name, body, ns, subresource="status")
        except ApiError as exc:
            if exc.code != 404:
                raise
            return Result()
        log.info("service %s: load balancer ingress %s", key, [i["ip"] for i in want] or "none")
        return Result()


def servicelb_controller(ctx: ControllerContext, *, workers: int = WORKERS) -> Controller:
    return ServiceLBController(ctx.client, ctx.informers).controller(
        workers=workers, metrics=ctx.metrics
    )
