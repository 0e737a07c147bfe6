"""The agent's Service cache against the real API server: an agent with `service_cache` lists
and watches Services as a node (NodeRestriction and the node role allow it) and keeps them in
its local store for outages and reboots."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import trio
from agent.agentharness import FACTS, admin, agent_options, as_node, wait_for
from api.apiharness import Harness

from orchestrator.agent import Agent
from orchestrator.client.resource import SERVICES
from orchestrator.cri.simulated import SimulatedRuntime


async def test_agent_caches_and_stores_services(h: Harness, tmp_path: Path) -> None:
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"namespace": "default", "name": "web"},
        "spec": {"ports": [{"port": 80, "targetPort": 8080}], "selector": {"app": "web"}},
    }
    await admin(h).create(SERVICES, svc)
    options = dataclasses.replace(agent_options(tmp_path), service_cache=True)
    agent = Agent(as_node(h), SimulatedRuntime(), options, facts=FACTS)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(agent.run)
            cache = agent.services
            assert cache is not None
            assert cache.restored

            async def cached() -> bool:
                return cache.service("default", "web") is not None

            await wait_for(cached)
            assert agent.store is not None
            store = agent.store

            async def stored() -> bool:
                return any(
                    o["metadata"]["name"] == "web" for o in await store.objects_of("Service")
                )

            await wait_for(stored)
            await admin(h).delete(SERVICES, "web", "default")

            async def forgotten() -> bool:
                return cache.service("default", "web") is None and not await stored()

            await wait_for(forgotten)
            nursery.cancel_scope.cancel()
