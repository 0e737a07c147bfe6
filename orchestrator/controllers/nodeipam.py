"""The node IPAM controller: every Node gets a podCIDR (kube-controller-manager's range
allocator, as k3s runs it).

Theory of operation
-------------------
A `Controller` over Node names, one worker. The blocks come from `network.podcidrs`
(`--cluster-cidr` cut into `/node_cidr_mask_size` blocks, 24 by default); which block each
Node holds is in memory, restored from the Nodes in the cache before the first reconcile (a
new leader, a restart), so it never hands out a block a Node already has. Reconcile:

* the Node is gone: release its block (the next Node without one gets the lowest free block,
  so a freed block is reused);
* it has `spec.podCIDR`: record it; a block outside the cluster CIDR, not a block of it, or
  held by another Node gets a Warning event `CIDRNotAvailable` and is left alone;
* it has none: take the lowest free block and patch `spec.podCIDR` and `spec.podCIDRs`; a
  failed patch releases the block (and the key is retried), a full range is an event and a
  rate-limited retry (and the Nodes waiting are enqueued as soon as a deletion frees a block).

Invariants: a Node's podCIDR is never changed once set (the Node kind refuses it too, so a
late write of a deposed leader cannot change one); no two Nodes are given the same block by
this controller; the controller writes only `spec.podCIDR` and `spec.podCIDRs`.
"""

from __future__ import annotations

import logging

from orchestrator.client.resource import NODES
from orchestrator.controllers.runtime.client import Client
from orchestrator.controllers.runtime.controller import Controller, Result
from orchestrator.controllers.runtime.events import EventRecorder
from orchestrator.controllers.runtime.informer import InformerFactory
from orchestrator.controllers.runtime.manager import ControllerContext
from orchestrator.kube.errors import ApiError
from orchestrator.kube.objects import Obj
from orchestrator.metrics import REGISTRY, Registry
from orchestrator.network.errors import RangeFull
from orchestrator.network.podcidrs import PodCIDRAllocator
from orchestrator.network.settings import NetworkSettings

__all__ = ["NodeIpamController", "node_ipam_controller"]

log = logging.getLogger(__name__)


def _pod_cidr(node: Obj) -> str:
    spec = node.get("spec")
    value = spec.get("podCIDR") if isinstance(spec, dict) else None
    return value if isinstance(value, str) else ""


class NodeIpamController:
    """The reconciler (see the module doc); `controller()` wraps it in a `Controller`."""

    def __init__(
        self,
        client: Client,
        informers: InformerFactory,
        events: EventRecorder,
        settings: NetworkSettings,
    ) -> None:
        self.client = client
        self.events = events
        self.nodes = informers.informer(NODES)
        self.cidrs = PodCIDRAllocator(settings.cluster_cidr, settings.node_cidr_mask_size)
        self._held: dict[str, str] = {}  # node name -> the block it holds (as recorded here)
        self._refused: dict[str, str] = {}  # node name -> its podCIDR we could not record
        self._restored = False
        self._controller: Controller | None = None

    def controller(self, *, metrics: Registry = REGISTRY) -> Controller:
        c = Controller("nodeipam", self, 1, metrics=metrics)
        c.watches(self.nodes)
        self._controller = c
        return c

    def _restore(self) -> None:
        """Record every block the Nodes in the (synced) cache hold, before any allocation."""
        self._restored = True
        for node in self.nodes.list():
            self._record(node)

    def _record(self, node: Obj) -> str | None:
        """Record the Node's podCIDR as its block; the reason it cannot be, or None."""
        name = str(node["metadata"]["name"])
        cidr = _pod_cidr(node)
        if self._held.get(name) == cidr:
            return None
        try:
            block = self.cidrs.occupy(cidr)
        except ValueError as exc:  # AllocationError included: taken, outside, not a block
            return str(exc)
        self._held[name] = str(block)
        return None

    def _wake_waiting(self) -> None:
        """A block was freed: the Nodes still without one ask again now (not after their
        backoff)."""
        if self._controller is None:
            return
        for node in self.nodes.list():
            if not _pod_cidr(node):
                self._controller.enqueue(str(node["metadata"]["name"]))

    async def reconcile(self, key: str) -> Result:
        if not self._restored:
            self._restore()
        node = self.nodes.get(key)
        if node is None:
            self._refused.pop(key, None)
            block = self._held.pop(key, None)
            if block is not None:
                self.cidrs.release(block)
                log.info("node %s is gone: podCIDR %s released", key, block)
                self._wake_waiting()
            return Result()
        if _pod_cidr(node):
            why = self._record(node)
            # Told once per Node and block: a Node is updated often (its status), and a
            # repeated event is a write each time.
            if why is not None and self._refused.get(key) != _pod_cidr(node):
                self._refused[key] = _pod_cidr(node)
                self.events.record(
                    node,
                    "Warning",
                    "CIDRNotAvailable",
                    f"podCIDR {_pod_cidr(node)} is not managed by this cluster's IPAM: {why} "
                    f"(--cluster-cidr {self.cidrs.cidr}); left as it is",
                )
            return Result()
        block = self._held.get(key)  # recorded for a Node of this name (deleted, re-created)
        if block is None:
            try:
                block = str(self.cidrs.allocate())
            except RangeFull as exc:
                self.events.record(node, "Warning", "CIDRNotAvailable", f"{exc}; retrying")
                # Backing off (a big site of simulated nodes may outgrow a /16 by far); a
                # deletion that frees a block wakes the waiting Nodes at once.
                return Result(requeue=True)
            self._held[key] = block
        patch = {"spec": {"podCIDR": block, "podCIDRs": [block]}}
        try:
            await self.client.patch(NODES, key, patch)  # a merge patch: the list replaced
        except ApiError as exc:
            self._held.pop(key, None)
            self.cidrs.release(block)
            if exc.code == 404:
                return Result()
            raise
        log.info("node %s: podCIDR %s", key, block)
        self.events.record(node, "Normal", "CIDRAssignmentSucceeded", f"podCIDR {block}")
        return Result()


def node_ipam_controller(ctx: ControllerContext) -> Controller:
    return NodeIpamController(
        ctx.client, ctx.informers, ctx.events, ctx.options.network
    ).controller(metrics=ctx.metrics)
