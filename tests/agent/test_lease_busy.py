"""The node's Lease renewal under a busy server: a 429 is retried no sooner than its
Retry-After and within the renewal interval, the reporter keeps running, and it forces no
extra status report when the server answers again (the server is busy, not unreachable)."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from orchestrator.agent.node import HostFacts, NodeReporter
from orchestrator.cri.runtime import CriError
from orchestrator.kube.errors import too_many_requests

FACTS = HostFacts("h", "10.0.0.1", 2, 2 << 30, "amd64", "6.1", "Linux", "m", "b")


class BusyClient:
    """Answers the lease patches with 429 (Retry-After 3 s) `busy` times, then succeeds."""

    def __init__(self, busy: int) -> None:
        self.busy = busy
        self.lease_patches: list[float] = []
        self.status_patches = 0

    async def create(self, res: Any, body: Any, namespace: str = "", **kw: Any) -> Any:
        await trio.lowlevel.checkpoint()
        return {**body, "metadata": {**body["metadata"], "uid": "u1"}}

    async def patch(self, res: Any, name: str, body: Any, namespace: str = "", **kw: Any) -> Any:
        await trio.lowlevel.checkpoint()
        if res.plural == "leases":
            self.lease_patches.append(trio.current_time())
            if len(self.lease_patches) > 1 and self.busy:  # the first, at registration, passes
                self.busy -= 1
                raise too_many_requests(3)
        elif kw.get("subresource") == "status":
            self.status_patches += 1
        return body


class NoRuntime:
    async def version(self) -> Any:
        raise CriError("no runtime in this test")

    async def status(self) -> Any:
        raise CriError("no runtime in this test")


async def test_a_busy_server_delays_the_renewal_by_retry_after(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client = BusyClient(busy=3)
    reporter = NodeReporter(
        client,  # type: ignore[arg-type]  # a fake of the two calls a reporter makes
        "n1",
        NoRuntime(),  # type: ignore[arg-type]
        FACTS,
        clock=trio.current_time,
    )
    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            t0 = trio.current_time()
            await nursery.start(reporter.run)
            await trio.sleep(40)
            nursery.cancel_scope.cancel()
    times = [round(t - t0, 3) for t in client.lease_patches]
    # Registration at 0, renewal at 10: busy; each retry after 3 s (Retry-After beats the
    # back-off of 0.5, 1, 2 s); the fourth attempt passes; then every 10 s again.
    assert times[:6] == [0.0, 10.0, 13.0, 16.0, 19.0, 29.0]
    assert reporter.connected
    assert client.status_patches == 0  # no forced report after the 429s (status unchanged)
