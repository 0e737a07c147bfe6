"""Memory housekeeping for the long-running processes (`orchestrator server`, `orchestrator agent`).

Start-up leaves megabytes of freed fragments in the C heap (imports, certificates, the first
Raft entries, the informers' first lists), and so does any burst later (a rollout, a relist).
glibc keeps freed memory for reuse rather than returning it, so an idle process would hold it
resident for good. `trim_heap` hands the free pages back to the kernel with glibc's
`malloc_trim(0)`: the top of the heap is released and free pages inside it are discarded
(MADV_DONTNEED), so an allocation that reuses one later only costs a page fault. `trim_task`
does it once start-up has settled and then every `TRIM_INTERVAL` seconds; a trim walks the free
lists (about a millisecond for an idle process), so it runs in the trio loop.

With a C library that has no `malloc_trim` (musl, macOS) `trim_heap` does nothing.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable

import trio

__all__ = ["SETTLE_DELAY", "TRIM_INTERVAL", "trim_heap", "trim_task"]

log = logging.getLogger(__name__)

SETTLE_DELAY = 10.0  # seconds after start-up before the first trim (the first syncs are done)
TRIM_INTERVAL = 60.0  # seconds between trims after that


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        fn = ctypes.CDLL(None).malloc_trim  # the C library the interpreter itself uses
    except (OSError, AttributeError):  # no dlopen(NULL), or not glibc
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


_TRIM = _malloc_trim()


def trim_heap() -> bool:
    """Return the C heap's free pages to the kernel now; True if memory was released."""
    return bool(_TRIM(0)) if _TRIM is not None else False


async def trim_task(*, settle: float = SETTLE_DELAY, interval: float = TRIM_INTERVAL) -> None:
    """`trim_heap` after `settle` seconds, then every `interval` seconds, until cancelled."""
    if _TRIM is None:
        log.debug("no malloc_trim in this C library: the heap is not trimmed")
        return
    await trio.sleep(settle)
    while True:
        trim_heap()
        await trio.sleep(interval)
