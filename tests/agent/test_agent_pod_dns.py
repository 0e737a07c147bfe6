"""The agent gives pods their resolv.conf (the sandbox's DNS config) and the Service env vars
(from its ClusterView), end to end on the in-process server with the simulated runtime."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import trio
from agent.agentharness import FACTS, admin, agent_options, container, phase, pod, wait_pod
from api.apiharness import Harness

from orchestrator.agent import Agent
from orchestrator.agent.net.clusterview import SnapshotView
from orchestrator.agent.net.poddns import PodDNS, ResolvConf
from orchestrator.controllers.runtime.client import PODS
from orchestrator.cri.runtime import DNSConfig
from orchestrator.cri.simulated import SimulatedRuntime

KUBERNETES = {
    "kind": "Service",
    "metadata": {"namespace": "default", "name": "kubernetes"},
    "spec": {"clusterIP": "10.43.0.1", "ports": [{"name": "https", "port": 443}]},
}


async def test_pods_get_resolv_conf_and_service_env(h: Harness, tmp_path: Path) -> None:
    rt = SimulatedRuntime()
    a = admin(h)
    dns = PodDNS(("10.43.0.10",), "cluster.local", ResolvConf(("192.0.2.53",), ("corp",), ()))
    opts = dataclasses.replace(agent_options(tmp_path), dns=dns, cluster=SnapshotView([KUBERNETES]))
    agent = Agent(a, rt, opts, facts=FACTS)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(agent.run)
            await a.create(PODS, pod("web", container("app", "sleep", "infinity")), "default")
            await a.create(
                PODS,
                pod("host", container("app", "sleep", "infinity"), hostNetwork=True),
                "default",
            )
            await wait_pod(a, "web", lambda p: phase(p) == "Running")
            await wait_pod(a, "host", lambda p: phase(p) == "Running")
            by_name = {s.config.name: s.config for s in rt._sandboxes.values()}
            assert by_name["web"].dns == DNSConfig(
                ("10.43.0.10",),
                ("default.svc.cluster.local", "svc.cluster.local", "cluster.local", "corp"),
                ("ndots:5",),
            )
            assert by_name["host"].dns == DNSConfig(("192.0.2.53",), ("corp",), ())
            envs = [c.config.envs for c in rt._containers.values()]
            assert envs
            assert all(e["KUBERNETES_SERVICE_HOST"] == "10.43.0.1" for e in envs)
            assert all(e["KUBERNETES_PORT"] == "tcp://10.43.0.1:443" for e in envs)
            nursery.cancel_scope.cancel()
