"""The RuntimeService conformance suite on `SimulatedRuntime`, under trio's MockClock (autojump),
so sleeps and grace periods take no real time."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio.testing
from cri.conformance import Pods, RuntimeConformance

from orchestrator.cri import RuntimeFailure
from orchestrator.cri.simstate import PodIps
from orchestrator.cri.simulated import SimulatedRuntime


class TestSimulatedRuntime(RuntimeConformance):
    @pytest.fixture
    def clock(self) -> trio.testing.MockClock:
        return trio.testing.MockClock(autojump_threshold=0)

    @pytest.fixture
    async def runtime(self) -> AsyncIterator[SimulatedRuntime]:
        rt = SimulatedRuntime()
        yield rt
        await rt.aclose()

    async def test_pod_ips_come_from_the_node_pod_cidr(
        self, clock: trio.testing.MockClock, runtime: SimulatedRuntime, pods: Pods
    ) -> None:
        a, _ = await pods.sandbox("before", host_network=False)
        await runtime.update_runtime_config("10.42.3.0/24")
        b, _ = await pods.sandbox("after-1", host_network=False)
        c, _ = await pods.sandbox("after-2", host_network=False)
        ips = [(await runtime.pod_sandbox_status(s)).ip for s in (a, b, c)]
        assert ips == ["10.88.0.2", "10.42.3.2", "10.42.3.3"]  # a keeps its address
        with pytest.raises(RuntimeFailure, match="not a network"):
            await runtime.update_runtime_config("10.42.3.1/24")


def test_pod_ips_never_hand_out_an_address_twice() -> None:
    ips = PodIps("10.42.0.0/30")  # room for one pod: .2
    assert ips.allocate() == "10.42.0.2"
    with pytest.raises(RuntimeFailure, match="exhausted"):
        ips.allocate()
    ips.set_network("10.42.0.0/29")
    assert [ips.allocate() for _ in range(4)] == [f"10.42.0.{i}" for i in (3, 4, 5, 6)]
    ips.release("10.42.0.4")
    ips.release("10.42.0.4")  # twice: still one free entry
    assert ips.allocate() == "10.42.0.4"
    with pytest.raises(RuntimeFailure):
        ips.allocate()
    ips.set_network("10.42.1.0/24")
    ips.release("10.42.0.2")  # from the old network: not reused
    assert ips.allocate() == "10.42.1.2"
