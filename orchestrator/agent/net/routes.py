"""The pod network's netlink driver: programs a `routeplan.NetState` through pyroute2.

Theory of operation
-------------------
`RouteDriver` owns, in one network namespace (the agent's own, or a named one for tests):

* the routes it adds, marked with routing protocol `RTPROT_ORCHESTRATOR` in the main table, so
  that `current()` finds exactly ours (stale ones from an earlier run included) and never
  touches a route the administrator or DHCP made;
* for `vxlan`, the device `flannel.1` (VNI 1, UDP 8472, no learning, local = the node's
  address, and the MAC this node published, which the other nodes' entries point at) with the
  podCIDR's network address /32 on it, and its permanent neighbour and FDB entries (the device
  is ours: every such entry on it is ours).

`sync(desired)` reads what is programmed, diffs (`routeplan.diff`) and applies removals then
additions — level-based, so a start after a crash or reboot removes stale entries and a
deleted Node's entries go.

Threads: every `RouteDriver` method blocks (netlink round trips), and pyroute2's synchronous
API keeps an asyncio loop per calling thread (a driver used from changing threads leaks one
loop per thread). `NetlinkThread` therefore runs one driver on one thread of its own for its
whole life: `await nl.call(RouteDriver.sync, state)`. A named namespace is entered only by that
thread and only while the netlink socket is opened (`pushns`/`popns`): the socket stays in the
namespace, the thread does not.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Concatenate, ParamSpec, TypeVar

import trio
from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import ndmsg
from pyroute2.netns import popns, pushns

from orchestrator.agent.net.routeplan import (
    VXLAN_DEVICE,
    VXLAN_PORT,
    VXLAN_VNI,
    Changes,
    Fdb,
    Neighbour,
    NetState,
    Route,
    diff,
)

__all__ = ["RTPROT_ORCHESTRATOR", "NetlinkThread", "RouteDriver", "RouteError"]

T = TypeVar("T")
P = ParamSpec("P")

RTPROT_ORCHESTRATOR = 111  # our routes' `proto` (free in iproute2's rt_protos)
_RTNH_F_ONLINK = 4
_NTF_SELF = 2
_ENOENT = 2
_ESRCH = 3
_EEXIST = 17


class RouteError(RuntimeError):
    """Entries the kernel refused (the message names each, with the kernel's reason)."""


class RouteDriver:
    """Routes/neighbours/FDB of the pod network in one namespace (module doc)."""

    def __init__(self, *, netns: str | None = None, device: str = VXLAN_DEVICE) -> None:
        self.netns = netns
        self.device = device
        if netns:
            pushns(netns)
            try:
                self._ipr: Any = IPRoute()
            finally:
                popns()
        else:
            self._ipr = IPRoute()

    def close(self) -> None:
        self._ipr.close()

    # ------------------------------------------------------------------ vxlan device
    def _index(self, name: str) -> int | None:
        found = self._ipr.link_lookup(ifname=name)
        return int(found[0]) if found else None

    def ensure_vxlan(self, local_ip: str, pod_cidr: str, mac: str = "") -> str:
        """Make `flannel.1` as flannel would (module doc); its MAC. A device with other
        parameters (VNI, port, local address) is replaced; an existing right one is kept.

        `mac` is the VTEP MAC this node published (the other nodes' neighbour and FDB entries
        point at it): a new device gets it, and an existing one with another MAC is set back
        to it — so a reboot or a deleted device while the server is unreachable (nothing new
        can be published) does not cut the other nodes off our pods. "" (a node that never
        published one) lets the kernel pick a random MAC, or keeps the existing device's."""
        network = ipaddress.ip_network(pod_cidr)
        index = self._index(self.device)
        if index is not None and not self._vxlan_matches(index, local_ip):
            self._ipr.link("del", index=index)
            index = None
        if index is None:
            extra = {"address": mac} if mac else {}
            self._ipr.link(
                "add",
                ifname=self.device,
                kind="vxlan",
                vxlan_id=VXLAN_VNI,
                vxlan_port=VXLAN_PORT,
                vxlan_local=local_ip,
                vxlan_learning=0,
                **extra,
            )
            index = self._index(self.device)
            assert index is not None
        elif mac and self._mac(index) != mac.lower():
            self._ipr.link("set", index=index, address=mac)
        want = (str(network.network_address), network.max_prefixlen)
        for addr in self._ipr.get_addr(index=index):
            have = (addr.get("IFA_ADDRESS"), addr["prefixlen"])
            if have != want:
                self._ipr.addr("del", index=index, address=have[0], prefixlen=have[1])
        try:
            self._ipr.addr("add", index=index, address=want[0], prefixlen=want[1])
        except NetlinkError as exc:
            if exc.code != _EEXIST:
                raise
        self._ipr.link("set", index=index, state="up")
        return self._mac(index)

    def _mac(self, index: int) -> str:
        return str(self._ipr.link("get", index=index)[0].get("IFLA_ADDRESS")).lower()

    def _vxlan_matches(self, index: int, local_ip: str) -> bool:
        link = self._ipr.link("get", index=index)[0]
        info = link.get(("IFLA_LINKINFO", "IFLA_INFO_DATA"))
        if link.get(("IFLA_LINKINFO", "IFLA_INFO_KIND")) != "vxlan" or info is None:
            return False
        return bool(
            info.get("IFLA_VXLAN_ID") == VXLAN_VNI
            and info.get("IFLA_VXLAN_PORT") == VXLAN_PORT
            and info.get("IFLA_VXLAN_LOCAL") == local_ip
            and not info.get("IFLA_VXLAN_LEARNING")
        )

    def remove_vxlan(self) -> None:
        """Delete `flannel.1` (and with it its routes, neighbours and FDB), if present."""
        index = self._index(self.device)
        if index is not None:
            self._ipr.link("del", index=index)

    # ------------------------------------------------------------------ state
    def current(self) -> NetState:
        """What is programmed: our routes, and the entries on our vxlan device."""
        vx = self._index(self.device)
        routes = set()
        for r in self._ipr.route("dump", family=socket.AF_INET, proto=RTPROT_ORCHESTRATOR):
            if r.get("RTA_TABLE") != 254 or r["proto"] != RTPROT_ORCHESTRATOR:
                continue
            dst = f"{r.get('RTA_DST')}/{r['dst_len']}"
            device = self.device if vx is not None and r.get("RTA_OIF") == vx else ""
            routes.add(Route(dst, str(r.get("RTA_GATEWAY") or ""), device))
        neighbours = set()
        fdb = set()
        if vx is not None:
            for n in self._ipr.neigh("dump", ifindex=vx, family=socket.AF_INET):
                if n["ifindex"] == vx and n["state"] & ndmsg.NUD_PERMANENT:
                    neighbours.add(Neighbour(str(n.get("NDA_DST")), str(n.get("NDA_LLADDR"))))
            for f in self._ipr.fdb("dump", ifindex=vx):
                if f["ifindex"] == vx and f.get("NDA_DST") and f.get("NDA_LLADDR"):
                    fdb.add(Fdb(str(f.get("NDA_LLADDR")), str(f.get("NDA_DST"))))
        return NetState(frozenset(routes), frozenset(neighbours), frozenset(fdb))

    def sync(self, desired: NetState) -> Changes:
        """Make the programmed state equal to `desired`; what was changed."""
        changes = diff(desired, self.current())
        self.apply(changes)
        return changes

    def apply(self, changes: Changes) -> None:
        """Removals, then additions; an entry the kernel refuses (a host-gw gateway off our
        subnet, say) does not stop the others: `RouteError` names every refused one after."""
        vx = self._index(self.device)
        failed: list[str] = []

        def attempt(what: object, op: Any, command: str, item: Any, *, gone_ok: bool) -> None:
            try:
                op(command, item, vx)
            except NetlinkError as exc:
                if not (gone_ok and exc.code in (_ENOENT, _ESRCH)):
                    failed.append(f"{command} {what}: {exc}")
            except RuntimeError as exc:
                failed.append(f"{command} {what}: {exc}")

        for route in changes.del_routes:
            attempt(route, self._route, "del", route, gone_ok=True)
        if vx is not None:
            for neigh in changes.del_neighbours:
                attempt(neigh, self._neigh, "del", neigh, gone_ok=True)
            for entry in changes.del_fdb:
                attempt(entry, self._fdb, "del", entry, gone_ok=True)
        for entry in changes.add_fdb:
            attempt(entry, self._fdb, "replace", entry, gone_ok=False)
        for neigh in changes.add_neighbours:
            attempt(neigh, self._neigh, "replace", neigh, gone_ok=False)
        for route in changes.add_routes:
            attempt(route, self._route, "replace", route, gone_ok=False)
        if failed:
            raise RouteError("; ".join(failed))

    def _need(self, vx: int | None) -> int:
        if vx is None:
            raise RuntimeError(f"the vxlan device {self.device} does not exist (ensure_vxlan)")
        return vx

    def _route(self, command: str, route: Route, vx: int | None) -> None:
        kwargs: dict[str, Any] = {
            "dst": route.dst,
            "gateway": route.gateway,
            "proto": RTPROT_ORCHESTRATOR,
        }
        if route.device:
            kwargs.update(oif=self._need(vx), flags=_RTNH_F_ONLINK)
        self._ipr.route(command, **kwargs)

    def _neigh(self, command: str, neigh: Neighbour, vx: int | None) -> None:
        self._ipr.neigh(
            command,
            dst=neigh.ip,
            lladdr=neigh.mac,
            ifindex=self._need(vx),
            state=ndmsg.NUD_PERMANENT,
        )

    def _fdb(self, command: str, entry: Fdb, vx: int | None) -> None:
        self._ipr.fdb(
            command,
            ifindex=self._need(vx),
            lladdr=entry.mac,
            dst=entry.dst,
            state=ndmsg.NUD_PERMANENT,
            flags=_NTF_SELF,
        )


class NetlinkThread:
    """One `RouteDriver` on one thread of its own (module doc, "Threads")."""

    def __init__(self, *, netns: str | None = None, device: str = VXLAN_DEVICE) -> None:
        self.netns = netns
        self.device = device
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="netlink")
        self._driver: RouteDriver | None = None

    async def call(
        self, fn: Callable[Concatenate[RouteDriver, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """`fn(driver, *args)` on the driver's thread (the driver is made by the first call)."""

        def job() -> T:
            if self._driver is None:
                self._driver = RouteDriver(netns=self.netns, device=self.device)
            return fn(self._driver, *args, **kwargs)

        future = self._executor.submit(job)
        return await trio.to_thread.run_sync(future.result)

    async def aclose(self) -> None:
        def close() -> None:
            if self._driver is not None:
                self._driver.close()
                self._driver = None

        await trio.to_thread.run_sync(self._executor.submit(close).result)
        self._executor.shutdown(wait=False)
