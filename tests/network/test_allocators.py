"""The pure allocators: node podCIDRs, ClusterIPs, NodePorts. Unit tests for the edges, and
Hypothesis state machines against a model (a set): no value handed out twice, releases reused,
restore from a list, full ranges a clear error that changes nothing."""

from __future__ import annotations

import ipaddress
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from orchestrator.network.errors import AlreadyAllocated, OutOfRange, RangeFull
from orchestrator.network.podcidrs import PodCIDRAllocator
from orchestrator.network.settings import NetworkSettings
from orchestrator.network.svcalloc import ClusterIPAllocator, NodePortAllocator

# ------------------------------------------------------------------------------- podCIDRs


def test_pod_cidrs_lowest_free_release_reuse_and_full() -> None:
    a = PodCIDRAllocator(ipaddress.ip_network("10.42.0.0/22"), 24)
    assert a.size == 4
    got = [str(a.allocate()) for _ in range(4)]
    assert got == ["10.42.0.0/24", "10.42.1.0/24", "10.42.2.0/24", "10.42.3.0/24"]
    with pytest.raises(RangeFull, match="no free /24"):
        a.allocate()
    assert a.release("10.42.1.0/24")
    assert not a.release("10.42.1.0/24")
    assert str(a.allocate()) == "10.42.1.0/24"  # the freed block is the next one handed out


def test_pod_cidrs_occupy_checks_the_block() -> None:
    a = PodCIDRAllocator(ipaddress.ip_network("10.42.0.0/16"), 24)
    a.occupy("10.42.0.0/24")
    a.occupy(ipaddress.ip_network("10.42.5.0/24"))
    with pytest.raises(AlreadyAllocated):
        a.occupy("10.42.5.0/24")
    with pytest.raises(OutOfRange, match="not inside"):
        a.occupy("10.99.0.0/24")
    with pytest.raises(OutOfRange, match="not a /24"):
        a.occupy("10.42.6.0/25")
    with pytest.raises(ValueError, match="not a network"):
        a.occupy("10.42.6.1/24")  # host bits set
    with pytest.raises(OutOfRange):
        a.occupy("fd00::/64")
    assert [str(n) for n in a.allocated()] == ["10.42.0.0/24", "10.42.5.0/24"]
    assert str(a.allocate()) == "10.42.1.0/24"


def test_pod_cidrs_ipv6() -> None:
    a = PodCIDRAllocator(ipaddress.ip_network("fd00:42::/56"), 64)
    assert str(a.allocate()) == "fd00:42::/64"
    assert str(a.allocate()) == "fd00:42:0:1::/64"


class PodCIDRMachine(RuleBasedStateMachine):
    """Against a model: the set of taken block indexes."""

    def __init__(self) -> None:
        super().__init__()
        self.a = PodCIDRAllocator(ipaddress.ip_network("10.42.0.0/20"), 24)  # 16 blocks
        self.model: set[int] = set()

    @rule()
    def allocate(self) -> None:
        if len(self.model) == 16:
            with pytest.raises(RangeFull):
                self.a.allocate()
            return
        i = self.a.index(self.a.allocate())
        assert i not in self.model
        assert i == min(set(range(16)) - self.model)  # the lowest free one
        self.model.add(i)

    @rule(i=st.integers(0, 15))
    def occupy(self, i: int) -> None:
        if i in self.model:
            with pytest.raises(AlreadyAllocated):
                self.a.occupy(self.a.block(i))
        else:
            self.a.occupy(self.a.block(i))
            self.model.add(i)

    @rule(i=st.integers(0, 15))
    def release(self, i: int) -> None:
        assert self.a.release(self.a.block(i)) == (i in self.model)
        self.model.discard(i)

    @invariant()
    def same_as_model(self) -> None:
        assert [self.a.index(n) for n in self.a.allocated()] == sorted(self.model)
        assert len(self.a) == len(self.model)


TestPodCIDRMachine = PodCIDRMachine.TestCase
TestPodCIDRMachine.settings = settings(max_examples=60, stateful_step_count=60, deadline=None)

# ------------------------------------------------------------------------------ ClusterIPs


def test_cluster_ips_skip_network_broadcast_and_reserved() -> None:
    s = NetworkSettings.create(service_cidr="10.43.0.0/28", cluster_dns="10.43.0.10")
    a = ClusterIPAllocator(s.service_cidr, reserved=(s.kubernetes_service_ip, s.cluster_dns))
    assert a.size == 14  # .1 .. .14
    got = {str(a.allocate(random.Random(i))) for i in range(12)}
    assert got == {f"10.43.0.{i}" for i in range(2, 15)} - {"10.43.0.10"}
    with pytest.raises(RangeFull, match="range is full"):
        a.allocate(random.Random(0))
    # the reserved ones only when asked for by name
    assert str(a.allocate_specific("10.43.0.1")) == "10.43.0.1"
    assert str(a.allocate_specific("10.43.0.10")) == "10.43.0.10"
    with pytest.raises(AlreadyAllocated, match="provided IP is already allocated"):
        a.allocate_specific("10.43.0.10")
    for bad in ("10.43.0.0", "10.43.0.15", "10.44.0.1", "fd00::1"):
        with pytest.raises(OutOfRange, match="not in the valid range"):
            a.allocate_specific(bad)
    assert a.release("10.43.0.5")
    assert str(a.allocate(random.Random(3))) == "10.43.0.5"  # a release is reused


def test_cluster_ips_prefer_the_upper_band() -> None:
    a = ClusterIPAllocator(ipaddress.ip_network("10.43.0.0/16"))
    rng = random.Random(1)
    for _ in range(200):
        ip = a.allocate(rng)
        assert int(ip) - int(ipaddress.ip_address("10.43.0.1")) >= 256
    assert str(ClusterIPAllocator(ipaddress.ip_network("10.43.0.0/16")).allocate()) == ("10.43.1.1")


def test_cluster_ips_ipv6_keeps_the_last_address() -> None:
    a = ClusterIPAllocator(ipaddress.ip_network("fd00:43::/124"))
    assert a.size == 15
    assert str(a.allocate_specific("fd00:43::f")) == "fd00:43::f"
    with pytest.raises(OutOfRange):
        a.allocate_specific("fd00:43::")


class ClusterIPMachine(RuleBasedStateMachine):
    """Random and lowest-free picks against a model; restore (occupy) and release."""

    def __init__(self) -> None:
        super().__init__()
        self.cidr = ipaddress.ip_network("10.43.0.0/26")  # 62 usable, band 16
        self.reserved = (ipaddress.ip_address("10.43.0.1"), ipaddress.ip_address("10.43.0.10"))
        self.a = ClusterIPAllocator(self.cidr, reserved=self.reserved)
        self.model: set[ipaddress.IPv4Address | ipaddress.IPv6Address] = set()
        self.rng = random.Random(0)
        self.usable = set(self.cidr.hosts())

    def _free_auto(self) -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
        return self.usable - self.model - set(self.reserved)

    @rule(lowest=st.booleans())
    def allocate(self, lowest: bool) -> None:
        if not self._free_auto():
            with pytest.raises(RangeFull):
                self.a.allocate(None if lowest else self.rng)
            return
        ip = self.a.allocate(None if lowest else self.rng)
        assert ip in self._free_auto()
        self.model.add(ip)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        ip = data.draw(st.sampled_from(sorted(self.model)))
        assert self.a.release(ip)
        self.model.discard(ip)

    @rule(n=st.integers(1, 62))
    def specific(self, n: int) -> None:
        ip = self.cidr.network_address + n
        if ip not in self.usable:
            with pytest.raises(OutOfRange):
                self.a.allocate_specific(ip)
        elif ip in self.model:
            with pytest.raises(AlreadyAllocated):
                self.a.allocate_specific(ip)
        else:
            self.a.allocate_specific(ip)
            self.model.add(ip)

    @rule()
    def restore(self) -> None:
        """A new view loaded from the taken values (an API server's restart)."""
        fresh = ClusterIPAllocator(self.cidr, reserved=self.reserved)
        for ip in self.model:
            assert fresh.occupy(ip)
        self.a = fresh

    @invariant()
    def same_as_model(self) -> None:
        assert len(self.a) == len(self.model)
        assert all(ip in self.a for ip in self.model)


TestClusterIPMachine = ClusterIPMachine.TestCase
TestClusterIPMachine.settings = settings(max_examples=60, stateful_step_count=80, deadline=None)

# ------------------------------------------------------------------------------- NodePorts


def test_node_ports_range_and_messages() -> None:
    a = NodePortAllocator()
    assert a.size == 2768
    assert 30000 + 86 <= a.allocate(random.Random(0)) <= 32767  # upper band first
    assert a.allocate_specific(30000) == 30000
    with pytest.raises(AlreadyAllocated, match="provided port is already allocated"):
        a.allocate_specific(30000)
    with pytest.raises(OutOfRange, match="30000-32767"):
        a.allocate_specific(8080)
    small = NodePortAllocator(30000, 30003)
    assert sorted(small.allocate(random.Random(i)) for i in range(4)) == list(range(30000, 30004))
    with pytest.raises(RangeFull, match="range is full"):
        small.allocate()
    assert small.release(30002)
    assert small.allocate() == 30002


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32))
def test_node_ports_never_repeat(seed: int) -> None:
    a = NodePortAllocator(30000, 30099)
    rng = random.Random(seed)
    taken: list[int] = []
    for step in range(400):
        if taken and rng.random() < 0.3:
            port = taken.pop(rng.randrange(len(taken)))
            assert a.release(port)
        elif len(taken) < 100:
            port = a.allocate(rng if step % 2 else None)
            assert port not in taken
            taken.append(port)
        else:
            with pytest.raises(RangeFull):
                a.allocate(rng)
        assert len(a) == len(taken)
