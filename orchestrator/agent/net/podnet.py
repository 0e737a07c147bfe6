"""The pod network of one node, agent side (flannel's job in k3s): `PodNetwork`.

Theory of operation
-------------------
`PodNetwork.run` keeps a view of every Node's network facts (`routeplan.NodeNet`: podCIDR,
InternalIP, public IP, VTEP MAC) and makes the node match it, level-based:

* **restore** — the view starts from the local store (`NodeNet` objects of `LocalStore`), and
  is programmed before `started`: after a reboot with the servers down, pods reach the other
  nodes' pods as before;
* **source** — LIST Nodes, then WATCH. Every change is written to the local store *before* it
  is programmed, then wakes the reconciler. A LIST replaces the view (Nodes deleted meanwhile
  go). While the servers are unreachable the view and the programmed state stay as they are
  (edge autonomy); the source retries with back-off;
* **reconcile** — on every wake-up and every `resync_interval`:
  1. our own Node's podCIDR goes to the container runtime (CRI `UpdateRuntimeConfig`, once
     per value; the simulated runtime then takes pod IPs from it) and into the CNI conflist in
     `cni_conf_dir` (`cniconf`; only on change);
  2. when `program` is on (a real node; off for the simulated runtime, whose pods have no
     network): the vxlan device (`vxlan`; with the VTEP MAC we last published — from the
     view, so from the local store after a reboot — as flannel does: the other nodes' FDB
     and neighbour entries keep working even when the device was recreated while the server
     was unreachable; a random MAC only for a node that never published one), our flannel
     annotations on our Node when they differ (`backend-type`, `backend-data` with our VTEP
     MAC, `public-ip`), the routes / neighbours / FDB entries of every other node
     (`routeplan.plan` + `routes.RouteDriver.sync`: stale entries of ours go too), masquerade and
     forwarding (`masq`).
  A failed step (runtime down, iptables missing, netlink refusing, API unreachable) is logged
  and retried with back-off; nothing here stops the agent.

`backend="none"` programs nothing (no conflist, routes or iptables: the user brings the
network) but still tells the runtime the podCIDR. `netns` runs the netlink and iptables work
inside that named namespace (the tests'; never the host's own tables in a test).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from orchestrator.agent.localstore import LocalStore
from orchestrator.agent.net import cniconf, masq
from orchestrator.agent.net.routeplan import (
    BACKENDS,
    NodeNet,
    NodeNetError,
    backend_annotations,
    node_net,
    plan,
    reusable_mac,
    vtep_mac,
)
from orchestrator.client.resource import NODES
from orchestrator.controllers.runtime import Client
from orchestrator.cri.runtime import CriError, RuntimeService
from orchestrator.kube.errors import ApiError
from orchestrator.kube.objects import Obj
from orchestrator.network.settings import NetworkSettings

if TYPE_CHECKING:  # pyroute2 is loaded only by a node that programs (not a simulated one)
    from orchestrator.agent.net.routes import NetlinkThread

__all__ = ["STORE_KIND", "PodNetwork", "PodNetworkOptions"]

log = logging.getLogger(__name__)

STORE_KIND = "NodeNet"  # the local store's kind for the last known Nodes' network facts
CNI_PLUGINS = ("bridge", "host-local", "portmap")
VXLAN_OVERHEAD = 50  # bytes of outer Ethernet/IP/UDP/VXLAN headers: pod MTU = 1500 - 50
API_TIMEOUT = 30.0
WATCH_TIMEOUT = 300.0
BACKOFF_INITIAL = 0.5
BACKOFF_MAX = 30.0


@dataclass
class PodNetworkOptions:
    """Knobs of `PodNetwork` (module doc)."""

    cni_conf_dir: Path | None = Path("/etc/cni/net.d")  # None: write no conflist
    cni_bin_dir: Path = Path("/usr/lib/cni")  # only checked: containerd runs the plugins
    ipam_data_dir: str = ""  # host-local's dataDir; "" = the plugin's default
    program: bool = True  # routes, vxlan, annotations, iptables (off: simulated runtime)
    netns: str | None = None  # program inside this named namespace (tests)
    resync_interval: float = 30.0
    mtu: int = 1500  # of the node's uplink


class PodNetwork:
    """The node's pod network (module doc)."""

    def __init__(
        self,
        settings: NetworkSettings,
        backend: str,
        node_name: str,
        node_ip: str,
        *,
        client: Client,
        runtime: RuntimeService | None = None,
        store: LocalStore | None = None,
        options: PodNetworkOptions | None = None,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"--flannel-backend {backend!r}: use one of {', '.join(BACKENDS)}")
        self.settings = settings
        self.backend = backend
        self.node_name = node_name
        self.node_ip = node_ip
        self.client = client
        self.runtime = runtime
        self.store = store
        self.opts = options or PodNetworkOptions()
        self.nodes: dict[str, NodeNet] = {}  # the view (module doc)
        self.vtep_mac = ""  # of our vxlan device, once made
        self.rounds = 0  # completed reconcile rounds (tests wait on it)
        self.healthy = False  # the last round did every step
        self._own_annotations: Mapping[str, str] | None = None  # as last seen on our Node
        self._runtime_cidr = ""  # handed to the runtime already
        self._bad_mac = ""  # an unusable published VtepMAC (logged once)
        self._problems: tuple[str, ...] = ()
        self._bad: dict[str, str] = {}  # node -> why its Node was unusable (logged once)
        self._wake = trio.Event()
        self._netlink: NetlinkThread | None = None

    @property
    def programs(self) -> bool:
        return self.opts.program and self.backend != "none"

    # ------------------------------------------------------------------ running
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Restore and program the last known Nodes, `started`, then follow the API."""
        if self.programs:
            from orchestrator.agent.net.routes import NetlinkThread

            self._netlink = NetlinkThread(netns=self.opts.netns)
            await trio.to_thread.run_sync(self._check_plugins)
        try:
            await self._restore()
            await self.reconcile()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._reconcile_loop)
                nursery.start_soon(self._source_loop)
                task_status.started()
        finally:
            if self._netlink is not None:
                with trio.CancelScope(shield=True):
                    await self._netlink.aclose()

    def _check_plugins(self) -> None:
        missing = [p for p in CNI_PLUGINS if not (self.opts.cni_bin_dir / p).exists()]
        if missing:
            log.warning(
                "pod network: CNI plugins %s not found in %s (--cni-bin-dir); install "
                "containernetworking-plugins or pods will not get a network",
                ", ".join(missing),
                self.opts.cni_bin_dir,
            )

    async def _restore(self) -> None:
        if self.store is None:
            return
        for body in await self.store.objects_of(STORE_KIND):
            try:
                net = NodeNet.from_json(body.get("net") or {})
            except NodeNetError as exc:
                log.warning("pod network: ignoring a local entry: %s", exc)
                continue
            self.nodes[net.name] = net
        if self.nodes:
            log.info("pod network: restored %d nodes from the local store", len(self.nodes))

    # ------------------------------------------------------------------ the view
    async def _remember(self, name: str, net: NodeNet | None) -> None:
        """Set (or, with None, drop) one Node of the view: stored first, then woken."""
        if self.nodes.get(name) == net:
            return
        if self.store is not None:
            if net is None:
                await self.store.delete_object(STORE_KIND, "", name)
            else:
                await self.store.put_object(
                    STORE_KIND, {"metadata": {"name": name}, "net": net.to_json()}
                )
        if net is None:
            self.nodes.pop(name, None)
        else:
            self.nodes[name] = net
        self._wake.set()

    def _parse(self, node: Obj) -> tuple[str, NodeNet | None]:
        meta = node.get("metadata") or {}
        name = str(meta.get("name") or "")
        if name == self.node_name:
            self._own_annotations = dict(meta.get("annotations") or {})
            self._wake.set()
        try:
            net = node_net(node)
        except NodeNetError as exc:
            if self._bad.get(name) != str(exc):
                log.warning("pod network: %s; no routes to it until it is fixed", exc)
            self._bad[name] = str(exc)
            return name, None
        self._bad.pop(name, None)
        return name, net

    async def apply_list(self, nodes: list[Obj]) -> None:
        """Make the view equal to a LIST of Nodes (those not in it were deleted)."""
        listed: dict[str, NodeNet | None] = dict(self._parse(n) for n in nodes)
        for name in list(self.nodes):
            if name not in listed:
                await self._remember(name, None)
        for name, net in listed.items():
            await self._remember(name, net)

    async def apply_event(self, etype: str, node: Obj) -> None:
        name, net = self._parse(node)
        await self._remember(name, None if etype == "DELETED" else net)

    async def _source_loop(self) -> None:
        delay = BACKOFF_INITIAL
        while True:
            try:
                with trio.fail_after(API_TIMEOUT):
                    listed = await self.client.list(NODES)
                await self.apply_list(list(listed.get("items") or []))
                delay = BACKOFF_INITIAL
                rv = str((listed.get("metadata") or {}).get("resourceVersion") or "")
                async with self.client.watch(
                    NODES, resource_version=rv, timeout_seconds=WATCH_TIMEOUT, read_only=True
                ) as events:
                    async for etype, obj in events:
                        if etype in ("ADDED", "MODIFIED", "DELETED"):
                            await self.apply_event(etype, obj)
                continue  # a watch that ended cleanly: relist
            except ApiError as exc:
                log.info("pod network: cannot follow Nodes (%s); keeping the routes", exc)
            except trio.TooSlowError:
                log.info("pod network: listing Nodes timed out; keeping the routes")
            await trio.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX)

    # ------------------------------------------------------------------ reconcile
    async def _reconcile_loop(self) -> None:
        delay = BACKOFF_INITIAL
        while True:
            wait = self.opts.resync_interval if self.healthy else delay
            with trio.move_on_after(wait):
                await self._wake.wait()
            self._wake = trio.Event()
            await self.reconcile()
            delay = BACKOFF_INITIAL if self.healthy else min(delay * 2, BACKOFF_MAX)

    async def reconcile(self) -> bool:
        """One level-based round (module doc); whether every step succeeded."""
        own = self.nodes.get(self.node_name)
        ok = True
        if own is not None:
            ok = await self._runtime_config(own) and ok
            ok = await self._conflist(own) and ok
        if self.programs:
            ok = await self._program(own) and ok
        self.healthy = ok
        self.rounds += 1
        return ok

    async def _runtime_config(self, own: NodeNet) -> bool:
        if self.runtime is None or own.pod_cidr == self._runtime_cidr:
            return True
        try:
            with trio.fail_after(API_TIMEOUT):
                await self.runtime.update_runtime_config(own.pod_cidr)
        except (CriError, trio.TooSlowError) as exc:
            log.warning("pod network: UpdateRuntimeConfig(%s) failed: %s", own.pod_cidr, exc)
            return False
        log.info("pod network: podCIDR %s handed to the container runtime", own.pod_cidr)
        self._runtime_cidr = own.pod_cidr
        return True

    async def _conflist(self, own: NodeNet) -> bool:
        conf_dir = self.opts.cni_conf_dir
        if conf_dir is None or not self.programs:
            return True
        mtu = self.opts.mtu - VXLAN_OVERHEAD if self.backend == "vxlan" else self.opts.mtu
        text = cniconf.render(
            cniconf.conflist(own.pod_cidr, ipam_data_dir=self.opts.ipam_data_dir, mtu=mtu)
        )
        try:
            written = await trio.to_thread.run_sync(cniconf.write_conflist, conf_dir, text)
        except OSError as exc:
            log.warning("pod network: cannot write the CNI config in %s: %s", conf_dir, exc)
            return False
        if written:
            log.info("pod network: wrote %s", conf_dir / cniconf.CONFLIST_NAME)
        return True

    async def _program(self, own: NodeNet | None) -> bool:
        from pyroute2.netlink.exceptions import NetlinkError

        from orchestrator.agent.net.routes import RouteDriver

        assert self._netlink is not None
        ok = True
        try:
            if self.backend == "vxlan" and own is not None:
                self.vtep_mac = await self._netlink.call(
                    RouteDriver.ensure_vxlan, self.node_ip, own.pod_cidr, self._published_mac(own)
                )
            ok = await self._publish() and ok
            if self.backend == "vxlan" and not self.vtep_mac:
                return False  # no device before we have a podCIDR: nothing to route through
            planned = plan(
                self.backend, self.node_name, self.nodes.values(), self.settings.cluster_cidr
            )
            if planned.problems != self._problems:
                for problem in planned.problems:
                    log.warning("pod network: %s", problem)
                self._problems = planned.problems
            changes = await self._netlink.call(RouteDriver.sync, planned.state)
            if changes:
                log.info(
                    "pod network: %d routes added, %d removed",
                    len(changes.add_routes),
                    len(changes.del_routes),
                )
        except (NetlinkError, OSError, RuntimeError) as exc:
            log.warning("pod network: programming routes failed: %s", exc)
            ok = False
        try:
            await masq.enable_forwarding(netns=self.opts.netns)
            await masq.apply_masquerade(self.settings.cluster_cidr, netns=self.opts.netns)
        except (masq.MasqueradeError, OSError) as exc:
            log.warning("pod network: masquerade: %s", exc)
            ok = False
        return ok

    def _published_mac(self, own: NodeNet) -> str:
        """The VTEP MAC the other nodes know us by, for our vxlan device: the one in our Node
        as last seen (the view, kept in the local store: it survives a reboot with the server
        down), else the live annotation (just patched, not yet back through the watch), else
        "" (a brand-new node: a random one, then published)."""
        candidates = [own.vtep_mac]
        if self._own_annotations is not None:
            with contextlib.suppress(NodeNetError):  # logged by `_parse` when it came in
                candidates.append(vtep_mac(self._own_annotations, self.node_name))
        for mac in candidates:
            if mac and reusable_mac(mac):
                return mac
            if mac and self._bad_mac != mac:
                log.warning(
                    "pod network: our published VtepMAC %s is not usable; replacing it", mac
                )
                self._bad_mac = mac
        return ""

    async def _publish(self) -> bool:
        """Our flannel annotations on our Node, when they differ from what it has."""
        if self._own_annotations is None:
            return True  # not seen our Node yet: the watch will wake us
        if self.backend == "vxlan" and not self.vtep_mac:
            return True  # no device yet (no podCIDR): an empty MAC would black-hole peers
        want = backend_annotations(self.backend, self.node_ip, self.vtep_mac)
        if all(self._own_annotations.get(k) == v for k, v in want.items()):
            return True
        try:
            with trio.fail_after(API_TIMEOUT):
                await self.client.patch(NODES, self.node_name, {"metadata": {"annotations": want}})
        except (ApiError, trio.TooSlowError) as exc:
            log.info("pod network: cannot publish our annotations yet: %s", exc)
            return False
        self._own_annotations = {**self._own_annotations, **want}
        return True

    def statistics(self) -> dict[str, float]:
        return {
            "nodes": len(self.nodes),
            "rounds": self.rounds,
            "healthy": 1.0 if self.healthy else 0.0,
            "problems": len(self._problems),
        }
