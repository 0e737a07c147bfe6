"""Node podCIDRs: the cluster CIDR cut into blocks of `/mask`, one per Node (kube-controller-
manager's range allocator, pure).

`allocate()` hands out the lowest free block, `occupy(cidr)` records one a Node already has (the
allocations are restored from the Nodes at start), `release(cidr)` frees it for the next Node.

Invariants: a block is handed out or occupied at most once until it is released; every block is
an aligned `/mask` network inside the cluster CIDR; `allocate` on a full range raises
`RangeFull` and changes nothing; bad input (`occupy` of a block outside the range, misaligned or
of another size, or of a family other than the range's) raises `ValueError` and changes nothing.
"""

from __future__ import annotations

import ipaddress

from orchestrator.network.errors import AlreadyAllocated, OutOfRange, RangeFull
from orchestrator.network.settings import IPNetwork

__all__ = ["PodCIDRAllocator"]


class PodCIDRAllocator:
    """The blocks of `cluster_cidr` of prefix length `mask`, and which are taken."""

    def __init__(self, cluster_cidr: IPNetwork, mask: int) -> None:
        if not cluster_cidr.prefixlen < mask <= cluster_cidr.max_prefixlen:
            raise ValueError(
                f"the node CIDR mask /{mask} must be longer than the cluster CIDR's "
                f"/{cluster_cidr.prefixlen}"
            )
        self.cidr = cluster_cidr
        self.mask = mask
        self.size = 1 << (mask - cluster_cidr.prefixlen)  # number of blocks
        self._shift = cluster_cidr.max_prefixlen - mask
        self._base = int(cluster_cidr.network_address)
        self._used: set[int] = set()
        # Every block below this index is taken (the lowest free one is at or above it).
        self._low = 0

    def __len__(self) -> int:
        """How many blocks are taken."""
        return len(self._used)

    def free(self) -> int:
        return self.size - len(self._used)

    def block(self, index: int) -> IPNetwork:
        address = self._base + (index << self._shift)
        return ipaddress.ip_network((address, self.mask))

    def index(self, cidr: IPNetwork | str) -> int:
        """The block number of `cidr` (ValueError unless it is one of this range's blocks)."""
        try:
            net = ipaddress.ip_network(cidr, strict=True) if isinstance(cidr, str) else cidr
        except ValueError as exc:
            raise ValueError(f"{cidr!r} is not a network address/prefix: {exc}") from None
        if net.version != self.cidr.version or not net.subnet_of(self.cidr):  # type: ignore[arg-type]  # versions checked first
            raise OutOfRange(f"{net} is not inside the cluster CIDR {self.cidr}")
        if net.prefixlen != self.mask:
            raise OutOfRange(f"{net} is not a /{self.mask} (the node CIDR mask)")
        return (int(net.network_address) - self._base) >> self._shift

    def allocate(self) -> IPNetwork:
        """The lowest free block, now taken (RangeFull when every block is)."""
        i = self._low
        while i in self._used:
            i += 1
        if i >= self.size:
            self._low = self.size
            raise RangeFull(f"the cluster CIDR {self.cidr} has no free /{self.mask} left")
        self._used.add(i)
        self._low = i + 1
        return self.block(i)

    def occupy(self, cidr: IPNetwork | str) -> IPNetwork:
        """Take the given block (AlreadyAllocated if it is taken; ValueError if not ours)."""
        i = self.index(cidr)
        if i in self._used:
            raise AlreadyAllocated(f"{self.block(i)} is already allocated")
        self._used.add(i)
        return self.block(i)

    def release(self, cidr: IPNetwork | str) -> bool:
        """Free the block; False if it was not taken (or is not one of ours)."""
        try:
            i = self.index(cidr)
        except ValueError:
            return False
        if i not in self._used:
            return False
        self._used.discard(i)
        self._low = min(self._low, i)
        return True

    def allocated(self) -> list[IPNetwork]:
        return [self.block(i) for i in sorted(self._used)]
