"""The RuntimeService conformance suite on `SimulatedRuntime`, under trio's MockClock (autojump),
so sleeps and grace periods take no real time."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio.testing
from cri.conformance import RuntimeConformance

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
