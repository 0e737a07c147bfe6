"""The RuntimeService conformance suite on a real containerd through `CriRuntime`.

Uses the session's private containerd (`cri.containerd_env`): skipped with the reason when it
cannot run here, failed instead under ORCH_REQUIRE_CONTAINERD=1 (as in CI).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from cri.conformance import RuntimeConformance
from cri.containerd_env import containerd, containerd_instance  # noqa: F401 - fixtures

from orchestrator.cri.containerd import CriRuntime

pytestmark = pytest.mark.slow


class TestContainerdRuntime(RuntimeConformance):
    @pytest.fixture
    async def runtime(self, containerd: str) -> AsyncIterator[CriRuntime]:  # noqa: F811
        rt = CriRuntime(containerd, call_timeout=20.0)
        yield rt
        await rt.aclose()
