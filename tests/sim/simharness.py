"""The in-process API server harness, ready for simulated nodes (its system namespaces exist),
plus small polling helpers shared by the simulated-node and scheduler-driver tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

from orchestrator.apiserver.resources import Api
from orchestrator.testing.apiserver import ADMIN, Harness, api_server

__all__ = ["ADMIN", "api_of", "sim_api_server", "until", "until_async"]


@asynccontextmanager
async def sim_api_server() -> AsyncIterator[Harness]:
    async with api_server() as h:
        await h.wait_namespace("kube-node-lease")
        yield h


def api_of(h: Harness) -> Api:
    return h.api


async def until(predicate: Callable[[], Any]) -> None:
    """Poll a condition (callers hold the deadline with `trio.fail_after`)."""
    while not predicate():  # noqa: ASYNC110  (the condition is data, not an event to wait on)
        await trio.sleep(0.01)


async def until_async(predicate: Callable[[], Awaitable[Any]]) -> None:
    """Poll an async condition (callers hold the deadline with `trio.fail_after`)."""
    while not await predicate():  # noqa: ASYNC110  (polling the server; no event to wait on)
        await trio.sleep(0.02)
