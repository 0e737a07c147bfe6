"""The pod network for real, inside namespaces this test makes (see `netnslab`): routes
programmed by `RouteDriver` in each node namespace carry a pod's connection to a pod on
another node, for `host-gw` and for `vxlan`; the peer sees the pod's own address (no
masquerade between pods) while traffic to the LAN is masqueraded; a deleted Node's entries go.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator

import pytest
import trio

from network.netnslab import LAN_HOST, Lab, Node, can_make_namespaces, dial, listen
from orchestrator.agent.net.masq import apply_masquerade, enable_forwarding
from orchestrator.agent.net.routeplan import NetState, NodeNet, plan
from orchestrator.agent.net.routes import NetlinkThread, RouteDriver, RouteError

pytestmark = pytest.mark.skipif(bool(can_make_namespaces()), reason=can_make_namespaces())

CLUSTER = ipaddress.ip_network("10.42.0.0/16")
PORT = 8080


@pytest.fixture
def lab() -> Iterator[Lab]:
    lab = Lab()
    try:
        yield lab.start(3)
    finally:
        lab.close()


async def _program(
    drivers: dict[str, NetlinkThread], lab: Lab, backend: str, present: list[Node]
) -> dict[str, str]:
    """Program every node of the lab for the Nodes `present`; the VTEP MACs."""
    macs = {}
    for n in lab.nodes:
        if backend == "vxlan":
            macs[n.name] = await drivers[n.name].call(RouteDriver.ensure_vxlan, n.ip, n.pod_cidr)
    nets = [NodeNet(n.name, n.pod_cidr, n.ip, n.ip, macs.get(n.name, "")) for n in present]
    for n in lab.nodes:
        desired = plan(backend, n.name, nets, CLUSTER)
        assert desired.problems == ()
        await drivers[n.name].call(RouteDriver.sync, desired.state)
    return macs


async def _masquerade(lab: Lab) -> None:
    for n in lab.nodes:
        await enable_forwarding(netns=n.ns)
        await apply_masquerade(CLUSTER, netns=n.ns)
        await apply_masquerade(CLUSTER, netns=n.ns)  # again: idempotent, one jump


@pytest.mark.parametrize("backend", ["host-gw", "vxlan"])
async def test_pods_reach_pods_on_other_nodes(lab: Lab, backend: str) -> None:
    a, b, c = lab.nodes
    drivers = {n.name: NetlinkThread(netns=n.ns) for n in lab.nodes}
    servers = [listen(a.pod_ns, PORT), listen(lab.lan, PORT)]
    try:
        with trio.fail_after(120):
            await _masquerade(lab)
            await _program(drivers, lab, backend, [a, b, c])
            # pod B -> pod A across nodes, seen with its own address (not masqueraded)
            assert await trio.to_thread.run_sync(dial, b.pod_ns, a.pod_ip, PORT) == b.pod_ip
            assert await trio.to_thread.run_sync(dial, c.pod_ns, a.pod_ip, PORT) == c.pod_ip
            # pod B -> outside the cluster CIDR: masqueraded to node B's address
            assert await trio.to_thread.run_sync(dial, b.pod_ns, LAN_HOST, PORT) == b.ip

            # a Node the kernel cannot route to (host-gw gateway off our subnet) is refused
            # with its reason, and does not stop the others
            if backend == "host-gw":
                far = NodeNet("far", "10.42.9.0/24", "198.51.100.5", "198.51.100.5")
                nets = [NodeNet(m.name, m.pod_cidr, m.ip, m.ip) for m in lab.nodes] + [far]
                state = plan(backend, b.name, nets, CLUSTER).state
                wiped = NetState(routes=frozenset())
                await drivers[b.name].call(RouteDriver.sync, wiped)
                with pytest.raises(RouteError, match=r"10\.42\.9\.0/24.*unreachable"):
                    await drivers[b.name].call(RouteDriver.sync, state)
                assert await trio.to_thread.run_sync(dial, b.pod_ns, a.pod_ip, PORT) == b.pod_ip
                await _program(drivers, lab, backend, [a, b, c])

            # programming the same Nodes again changes nothing (level-based)
            current = await drivers[b.name].call(RouteDriver.current)
            assert len(current.routes) == 2
            assert not await drivers[b.name].call(RouteDriver.sync, current)

            # node A deleted: its entries go from B and C, and A is unreachable from B
            await _program(drivers, lab, backend, [b, c])
            for n in (b, c):
                state = await drivers[n.name].call(RouteDriver.current)
                assert [r.dst for r in state.routes] == [(c if n is b else b).pod_cidr]
                assert all(nb.ip != "10.42.0.0" for nb in state.neighbours)
                assert all(f.dst != a.ip for f in state.fdb)
            reply = await trio.to_thread.run_sync(dial, b.pod_ns, a.pod_ip, PORT)
            assert reply.startswith("error")
            # a restarted agent that knows of no Node removes every stale entry of ours
            fresh = NetlinkThread(netns=b.ns)
            try:
                changes = await fresh.call(RouteDriver.sync, NetState())
                assert len(changes.del_routes) == 1
                assert await fresh.call(RouteDriver.current) == NetState()
            finally:
                await fresh.aclose()
    finally:
        for server in servers:
            server.kill()
            server.wait()
            if server.stdout is not None:
                server.stdout.close()
        for d in drivers.values():
            await d.aclose()
