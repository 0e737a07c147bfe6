from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from api.apiharness import Harness
from sim.simharness import sim_api_server


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    async with sim_api_server() as harness:
        yield harness
