"""`PodNetwork` as the agent runs it, against an in-memory Node API (`fakenodes`): the podCIDR
reaches the runtime, the view follows LIST/WATCH and the local store, survives an unreachable
server and a restart; and, inside namespaces this test makes (`netnslab`), nodes exchange
their flannel annotations and carry pod traffic, for host-gw and vxlan."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import pytest
import trio

from network.fakenodes import FakeNodes, node
from network.netnslab import Lab, can_make_namespaces, dial, ip, listen
from orchestrator.agent.localstore import LocalStore
from orchestrator.agent.net.podnet import PodNetwork, PodNetworkOptions
from orchestrator.agent.net.routeplan import ANN_BACKEND_DATA, ANN_BACKEND_TYPE, NetState
from orchestrator.agent.net.routes import NetlinkThread, RouteDriver
from orchestrator.controllers.runtime import Client
from orchestrator.cri.simulated import SimulatedRuntime
from orchestrator.network.settings import NetworkSettings

SETTINGS = NetworkSettings.create()


async def wait_until(ok: Callable[[], bool], within: float = 30.0) -> None:
    """Poll `ok` until it holds (fails the test after `within` seconds)."""
    with trio.fail_after(within):
        while not ok():  # noqa: ASYNC110  (the condition is data, not an event)
            await trio.sleep(0.05)


async def test_simulated_node_takes_its_pod_cidr_and_keeps_its_view(
    tmp_path: Path, thread_clock: trio.testing.MockClock
) -> None:
    api = FakeNodes()
    api.put(node("a", "10.42.3.0/24", "192.0.2.10"))
    api.put(node("b", "10.42.4.0/24", "192.0.2.11"))
    api.put(node("broken", "10.42.5.1/24", "192.0.2.12"))  # not a network: skipped, logged
    runtime = SimulatedRuntime()
    opts = PodNetworkOptions(program=False, cni_conf_dir=tmp_path / "net.d")
    store = await LocalStore.open(tmp_path / "agent.db")
    try:
        net = PodNetwork(
            SETTINGS, "vxlan", "a", "192.0.2.10", client=cast(Client, api), runtime=runtime,
            store=store, options=opts,
        )  # fmt: skip
        async with trio.open_nursery() as nursery:
            await nursery.start(net.run)
            await wait_until(lambda: runtime.ips.network == ipaddress.ip_network("10.42.3.0/24"))
            await wait_until(lambda: set(net.nodes) == {"a", "b"})
            api.delete("b")
            await wait_until(lambda: "b" not in net.nodes)
            api.cut()  # the server goes away: the view stays as it was
            await trio.sleep(120)
            assert set(net.nodes) == {"a"}
            nursery.cancel_scope.cancel()
        assert api.patches == []  # a simulated node publishes nothing
        assert not (tmp_path / "net.d").exists()  # nor writes CNI config for containerd

        # a reboot with the server still down: the view comes back from the local store
        runtime = SimulatedRuntime()
        again = PodNetwork(
            SETTINGS, "vxlan", "a", "192.0.2.10", client=cast(Client, api), runtime=runtime,
            store=store, options=opts,
        )  # fmt: skip
        async with trio.open_nursery() as nursery:
            await nursery.start(again.run)
            assert set(again.nodes) == {"a"}
            assert runtime.ips.network == ipaddress.ip_network("10.42.3.0/24")
            nursery.cancel_scope.cancel()
    finally:
        await store.aclose()


def test_an_unknown_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="--flannel-backend 'udp'"):
        PodNetwork(SETTINGS, "udp", "a", "192.0.2.10", client=cast(Client, FakeNodes()))


# ---------------------------------------------------------------------------------- namespaces
needs_netns = pytest.mark.skipif(bool(can_make_namespaces()), reason=can_make_namespaces())
PORT = 8080


@pytest.fixture
def lab() -> Iterator[Lab]:
    lab = Lab()
    try:
        yield lab.start(3)
    finally:
        lab.close()


@needs_netns
@pytest.mark.parametrize("backend", ["host-gw", "vxlan"])
async def test_agents_exchange_annotations_and_carry_pod_traffic(
    lab: Lab, tmp_path: Path, backend: str
) -> None:
    a, b, c = lab.nodes
    api = FakeNodes()
    for n in lab.nodes:
        api.put(node(n.name, n.pod_cidr, n.ip))
    stores = {n.name: await LocalStore.open(tmp_path / n.name / "agent.db") for n in lab.nodes}

    def network(n: object, client: FakeNodes) -> PodNetwork:
        name = n.name  # type: ignore[attr-defined]
        opts = PodNetworkOptions(
            cni_conf_dir=tmp_path / name / "net.d",
            netns=n.ns,  # type: ignore[attr-defined]
            resync_interval=1.0,
        )
        return PodNetwork(
            SETTINGS, backend, name, n.ip,  # type: ignore[attr-defined]
            client=cast(Client, client), store=stores[name], options=opts,
        )  # fmt: skip

    server = listen(a.pod_ns, PORT)
    try:
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                nets = {n.name: network(n, api) for n in lab.nodes}
                for net in nets.values():
                    await nursery.start(net.run)
                await wait_until(lambda: all(len(n.nodes) == 3 for n in nets.values()))
                await wait_until(lambda: all(n.healthy for n in nets.values()))
                annotations = api.nodes[a.name]["metadata"]["annotations"]
                assert annotations[ANN_BACKEND_TYPE] == backend
                if backend == "vxlan":
                    assert nets[a.name].vtep_mac in annotations[ANN_BACKEND_DATA]
                assert len(api.patches) == 3  # each node published once, and kept its MAC
                conf = (tmp_path / a.name / "net.d" / "10-orchestrator.conflist").read_text()
                assert a.pod_cidr in conf

                async def reply() -> str:
                    return await trio.to_thread.run_sync(dial, b.pod_ns, a.pod_ip, PORT)

                while await reply() != b.pod_ip:  # noqa: ASYNC110  (B programs A: remote state)
                    await trio.sleep(0.1)

                # the server goes away, B restarts (its routes wiped, as by a reboot): the
                # local store brings them back without the server
                api.cut()
                nets[b.name].opts.resync_interval = 3600.0
                nursery.cancel_scope.cancel()
            wipe = NetlinkThread(netns=b.ns)
            await wipe.call(RouteDriver.sync, NetState())
            await wipe.aclose()
            assert (await reply()).startswith("error")
            async with trio.open_nursery() as nursery:
                await nursery.start(network(b, api).run)
                assert await reply() == b.pod_ip
                nursery.cancel_scope.cancel()

            # back online; A's Node is deleted: its routes go from B
            api.down = False
            api.delete(a.name)
            async with trio.open_nursery() as nursery:
                net_b = network(b, api)
                await nursery.start(net_b.run)
                check = NetlinkThread(netns=b.ns)
                try:
                    with trio.fail_after(30):
                        while True:
                            state = await check.call(RouteDriver.current)
                            if {r.dst for r in state.routes} == {c.pod_cidr}:
                                break
                            await trio.sleep(0.05)
                finally:
                    await check.aclose()
                assert a.name not in net_b.nodes
                assert all(f.dst != a.ip for f in state.fdb)
                assert (await reply()).startswith("error")
                nursery.cancel_scope.cancel()
    finally:
        server.kill()
        server.wait()
        if server.stdout is not None:
            server.stdout.close()
        for store in stores.values():
            await store.aclose()


@needs_netns
async def test_a_recreated_vxlan_device_keeps_the_published_mac_while_offline(
    tmp_path: Path,
) -> None:
    """Node A's flannel.1 is lost (a reboot) or gets another MAC while the server is down: A
    restarts from its local store with the MAC it published, which B's FDB and neighbour
    entries still hold, so pod B reaches pod A without anything new being published."""
    lab = Lab().start(2)
    a, b = lab.nodes
    api = FakeNodes()
    for n in lab.nodes:
        api.put(node(n.name, n.pod_cidr, n.ip))
    stores = {n.name: await LocalStore.open(tmp_path / n.name / "agent.db") for n in lab.nodes}

    def network(n: object) -> PodNetwork:
        name = n.name  # type: ignore[attr-defined]
        opts = PodNetworkOptions(
            cni_conf_dir=None,
            netns=n.ns,  # type: ignore[attr-defined]
            resync_interval=1.0,
        )
        return PodNetwork(
            SETTINGS, "vxlan", name, n.ip,  # type: ignore[attr-defined]
            client=cast(Client, api), store=stores[name], options=opts,
        )  # fmt: skip

    async def reply() -> str:
        return await trio.to_thread.run_sync(dial, b.pod_ns, a.pod_ip, PORT)

    async def restart_a_offline() -> str:
        """A's agent started again with the server down: the MAC of its flannel.1."""
        async with trio.open_nursery() as nursery:
            net_a = network(a)
            await nursery.start(net_a.run)
            nursery.cancel_scope.cancel()
        return net_a.vtep_mac

    server = listen(a.pod_ns, PORT)
    try:
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                nets = {n.name: network(n) for n in lab.nodes}
                for net in nets.values():
                    await nursery.start(net.run)
                # A's MAC published, back in A's own view (so in its local store), and
                # programmed on B
                await wait_until(
                    lambda: (
                        nets[a.name].vtep_mac != ""
                        and nets[a.name].nodes[a.name].vtep_mac == nets[a.name].vtep_mac
                    )
                )
                while await reply() != b.pod_ip:  # noqa: ASYNC110  (B programs A: remote state)
                    await trio.sleep(0.1)
                published = nets[a.name].vtep_mac
                api.cut()
                nursery.cancel_scope.cancel()  # B's entries stay programmed, pointing at A's MAC
            patches = len(api.patches)

            a_netlink = NetlinkThread(netns=a.ns)
            try:
                # a reboot: flannel.1 is gone with its MAC
                await a_netlink.call(RouteDriver.remove_vxlan)
                assert (await reply()).startswith("error")
                assert await restart_a_offline() == published
                assert await reply() == b.pod_ip

                # flannel.1 is there but with another MAC: set back to the published one
                ip("-n", a.ns, "link", "set", "flannel.1", "address", "02:00:5e:10:00:99")
                assert (await reply()).startswith("error")
                assert await restart_a_offline() == published
                assert await reply() == b.pod_ip
            finally:
                await a_netlink.aclose()
            assert len(api.patches) == patches  # nothing could be (or needed to be) published
    finally:
        server.kill()
        server.wait()
        if server.stdout is not None:
            server.stdout.close()
        for store in stores.values():
            await store.aclose()
        lab.close()
