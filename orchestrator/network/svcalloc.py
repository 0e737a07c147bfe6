"""Service ClusterIPs and NodePorts: pure allocators (kube-apiserver's ipallocator and
portallocator, without storage: the API server keeps one store key per allocated value, these
are its in-memory view).

Both are a `_Range` of consecutive values, split as Kubernetes splits them since 1.27/1.28
(KEP-3070, KEP-3668): a small lower band that values picked automatically use only when the
upper band is full, so users who choose a value themselves (`spec.clusterIP`, `nodePort`) pick
from the lower band with little risk of a collision.

- `ClusterIPAllocator`: the service CIDR without its network address (and, for IPv4, without
  its broadcast address). Some addresses are `reserved`: the kubernetes Service's (the first
  one) and the cluster DNS address are never handed out automatically, only when asked for by
  name (`allocate_specific`).
- `NodePortAllocator`: 30000-32767 by default (`--service-node-port-range`'s default).

Choice: `allocate(rng)` scans from a random offset of the band with a `random.Random` the
caller passes (seeded in tests), or from the band's start (lowest free) when `rng` is None.

Invariants: a value is handed out at most once until released; `allocate` never returns a
reserved value; a full range raises `RangeFull` ("range is full"), a taken value
`AlreadyAllocated`, a value outside the range `OutOfRange`, and a failed call changes nothing.
"""

from __future__ import annotations

import ipaddress
import random

from orchestrator.network.errors import AlreadyAllocated, OutOfRange, RangeFull
from orchestrator.network.settings import IPNetwork

__all__ = [
    "DEFAULT_NODE_PORT_RANGE",
    "ClusterIPAllocator",
    "IPAddress",
    "NodePortAllocator",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
DEFAULT_NODE_PORT_RANGE = (30000, 32767)


class _Range:
    """Offsets 0..size-1; taken ones in a set; the lower band `[0, band)` is used by automatic
    choices only when `[band, size)` is full."""

    def __init__(self, size: int, band: int, reserved: frozenset[int]) -> None:
        if size <= 0:
            raise ValueError("the range is empty")
        self.size = size
        self.band = band if band < size else 0
        self.reserved = reserved
        self.used: set[int] = set()

    def pick(self, rng: random.Random | None) -> int | None:
        for lo, hi in ((self.band, self.size), (0, self.band)):
            found = self._scan(lo, hi, rng)
            if found is not None:
                return found
        return None

    def _scan(self, lo: int, hi: int, rng: random.Random | None) -> int | None:
        n = hi - lo
        if n <= 0:
            return None
        start = rng.randrange(n) if rng is not None else 0
        for k in range(n):
            offset = lo + (start + k) % n
            if offset not in self.used and offset not in self.reserved:
                return offset
        return None


def _band(size: int, divisor: int, low: int, high: int) -> int:
    """Kubernetes' lower band: size/divisor, at least `low`, at most `high`."""
    return min(max(low, size // divisor), high)


class ClusterIPAllocator:
    """ClusterIPs of one service CIDR (see the module doc)."""

    def __init__(self, cidr: IPNetwork, *, reserved: tuple[IPAddress, ...] = ()) -> None:
        self.cidr = cidr
        self._first = int(cidr.network_address) + 1
        last = int(cidr.broadcast_address) - (1 if cidr.version == 4 else 0)
        size = last - self._first + 1
        if size <= 0:
            raise ValueError(f"the service CIDR {cidr} has no usable address")
        offsets = frozenset(
            int(ip) - self._first for ip in reserved if self._first <= int(ip) <= last
        )
        self._range = _Range(size, _band(size, 16, 16, 256), offsets)

    @property
    def size(self) -> int:
        return self._range.size

    def __len__(self) -> int:
        return len(self._range.used)

    def free(self) -> int:
        return self._range.size - len(self._range.used)

    def __contains__(self, ip: object) -> bool:
        return isinstance(ip, IPAddress) and self._offset_or_none(ip) in self._range.used

    def _offset_or_none(self, ip: IPAddress) -> int | None:
        if ip.version != self.cidr.version:
            return None
        offset = int(ip) - self._first
        return offset if 0 <= offset < self._range.size else None

    def check(self, ip: IPAddress | str) -> IPAddress:
        """`ip` as an address of this range (ValueError/OutOfRange otherwise)."""
        address = ipaddress.ip_address(ip) if isinstance(ip, str) else ip
        if self._offset_or_none(address) is None:
            raise OutOfRange(
                f"the provided IP ({address}) is not in the valid range. "
                f"The range of valid IPs is {self.cidr}"
            )
        return address

    def allocate(self, rng: random.Random | None = None) -> IPAddress:
        """A free address that is not reserved, now taken (RangeFull if none)."""
        offset = self._range.pick(rng)
        if offset is None:
            raise RangeFull(f"range is full: no ClusterIP left in {self.cidr}")
        self._range.used.add(offset)
        return ipaddress.ip_address(self._first + offset)

    def allocate_specific(self, ip: IPAddress | str) -> IPAddress:
        """Take `ip`, reserved or not (OutOfRange, AlreadyAllocated)."""
        address = self.check(ip)
        offset = int(address) - self._first
        if offset in self._range.used:
            raise AlreadyAllocated("provided IP is already allocated")
        self._range.used.add(offset)
        return address

    def occupy(self, ip: IPAddress | str) -> bool:
        """Mark `ip` taken if it is in the range (restoring from the store); True if it is."""
        try:
            address = self.check(ip)
        except ValueError:
            return False
        self._range.used.add(int(address) - self._first)
        return True

    def release(self, ip: IPAddress | str) -> bool:
        """Free `ip`; False if it was not taken or is not in the range."""
        try:
            address = self.check(ip)
        except ValueError:
            return False
        offset = int(address) - self._first
        if offset not in self._range.used:
            return False
        self._range.used.discard(offset)
        return True

    def clear(self) -> None:
        self._range.used.clear()


class NodePortAllocator:
    """NodePorts of one port range, `first..last` inclusive (see the module doc)."""

    def __init__(
        self, first: int = DEFAULT_NODE_PORT_RANGE[0], last: int = DEFAULT_NODE_PORT_RANGE[1]
    ) -> None:
        if not 0 < first <= last <= 65535:
            raise ValueError(f"bad node port range {first}-{last}")
        self.first, self.last = first, last
        size = last - first + 1
        self._range = _Range(size, _band(size, 32, 16, 128), frozenset())

    @property
    def size(self) -> int:
        return self._range.size

    def __len__(self) -> int:
        return len(self._range.used)

    def free(self) -> int:
        return self._range.size - len(self._range.used)

    def __contains__(self, port: object) -> bool:
        return isinstance(port, int) and port - self.first in self._range.used

    def check(self, port: int) -> int:
        if type(port) is not int or not self.first <= port <= self.last:
            raise OutOfRange(
                f"provided port is not in the valid range. The range of valid ports is "
                f"{self.first}-{self.last}"
            )
        return port

    def allocate(self, rng: random.Random | None = None) -> int:
        offset = self._range.pick(rng)
        if offset is None:
            raise RangeFull(f"range is full: no node port left in {self.first}-{self.last}")
        self._range.used.add(offset)
        return self.first + offset

    def allocate_specific(self, port: int) -> int:
        offset = self.check(port) - self.first
        if offset in self._range.used:
            raise AlreadyAllocated("provided port is already allocated")
        self._range.used.add(offset)
        return port

    def occupy(self, port: int) -> bool:
        try:
            offset = self.check(port) - self.first
        except ValueError:
            return False
        self._range.used.add(offset)
        return True

    def release(self, port: int) -> bool:
        try:
            offset = self.check(port) - self.first
        except ValueError:
            return False
        if offset not in self._range.used:
            return False
        self._range.used.discard(offset)
        return True

    def clear(self) -> None:
        self._range.used.clear()
