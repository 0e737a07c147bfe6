"""The agent writes its local store (fsynced: flash wear) only when what it keeps changed: a pod
that starts is written when it arrives and when its worker reports it Running, not a third time
when the server echoes that status back (issue 18)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import trio
from agent.agentharness import admin, container, phase, pod, running_agent, wait_pod
from api.apiharness import Harness

from orchestrator.controllers.runtime.client import PODS
from orchestrator.cri.simulated import SimulatedRuntime


async def test_a_starting_pod_is_written_twice_not_on_the_status_echo(
    h: Harness, tmp_path: Path
) -> None:
    rt = SimulatedRuntime()
    a = admin(h)
    with trio.fail_after(60):
        async with running_agent(a, rt, tmp_path) as agent:
            store = agent.store
            assert store is not None
            writes: Counter[tuple[str, str]] = Counter()
            put_pod = store.put_pod

            async def counting_put(p: dict[str, Any]) -> None:
                name = str(p["metadata"]["name"])
                writes[name, str((p.get("status") or {}).get("phase") or "")] += 1
                await put_pod(p)

            store.put_pod = counting_put  # type: ignore[method-assign]  # counts the writes
            await a.create(PODS, pod("first", container("app", "sleep", "infinity")), "default")
            await wait_pod(a, "first", lambda p: phase(p) == "Running")
            # The agent handles its watch events in order: once the second pod is Running, the
            # echo of the first one's Running status has been handled too.
            await a.create(PODS, pod("second", container("app", "sleep", "infinity")), "default")
            await wait_pod(a, "second", lambda p: phase(p) == "Running")
            first = {k: v for k, v in writes.items() if k[0] == "first"}
            assert sum(first.values()) == 2, first
            assert first.get(("first", "Running")) == 1, first
            stored = {s.name: s.pod for s in await store.pods()}
            assert stored["first"]["status"]["phase"] == "Running"
            assert "managedFields" not in stored["first"]["metadata"]
