"""Fixtures of the network tests."""

from __future__ import annotations

import pytest
import trio.testing


@pytest.fixture
def thread_clock() -> trio.testing.MockClock:
    """A mocked clock that jumps only after 50 ms of real idleness, for tests whose tasks wait
    on worker threads (SQLite, netlink): an idle loop waiting on a thread would otherwise let
    the clock race through a test's deadline while the thread still works (a slow CI disk)."""
    return trio.testing.MockClock(autojump_threshold=0.05)
