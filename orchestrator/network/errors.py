"""The allocators' errors: all `ValueError`s, with messages meant for people (the API server
turns them into 422s with Kubernetes' wording)."""

from __future__ import annotations

__all__ = ["AllocationError", "AlreadyAllocated", "OutOfRange", "RangeFull"]


class AllocationError(ValueError):
    """An address, block or port could not be allocated."""


class RangeFull(AllocationError):
    """Every value of the range is taken."""


class AlreadyAllocated(AllocationError):
    """The value asked for is taken."""


class OutOfRange(AllocationError):
    """The value asked for is not in the range (or not one of its blocks)."""
