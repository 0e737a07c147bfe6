"""The pod network as part of the agent, against the in-process API server (NodeRestriction
applies): a simulated node's pods take their IPs from the podCIDR the node IPAM controller
gives its Node, and a node may publish its flannel annotations on its own Node (that part
programs a namespace this test makes, so it needs root)."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest
import trio
from agent.agentharness import (
    FACTS,
    NODE,
    admin,
    agent_options,
    as_node,
    container,
    phase,
    pod,
    wait_for,
    wait_pod,
)
from api.apiharness import Harness
from network.netnslab import Lab, can_make_namespaces

from orchestrator.agent import Agent, LocalStore
from orchestrator.agent.net.flags import pod_network
from orchestrator.agent.net.podnet import PodNetwork, PodNetworkOptions
from orchestrator.agent.net.routeplan import ANN_BACKEND_DATA, ANN_BACKEND_TYPE, ANN_PUBLIC_IP
from orchestrator.client.resource import NODES
from orchestrator.controllers.runtime.client import PODS
from orchestrator.cri.simulated import SimulatedRuntime
from orchestrator.network.settings import NetworkSettings

SETTINGS = NetworkSettings.create()


async def test_simulated_pods_take_ips_from_the_node_pod_cidr(h: Harness, tmp_path: Path) -> None:
    runtime = SimulatedRuntime()
    node_client = as_node(h)
    options = agent_options(tmp_path)
    options.components.append(
        pod_network(
            SETTINGS,
            "vxlan",
            NODE,
            FACTS.internal_ip,
            "simulated",
            client=node_client,
            runtime=runtime,
            cni_conf_dir=tmp_path / "net.d",
            cni_bin_dir=tmp_path,
        )
    )
    agent = Agent(node_client, runtime, options, facts=FACTS)
    cluster = admin(h)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(agent.run)
            await agent.reporter.registered.wait()
            # the node IPAM controller gives the Node its podCIDR (set once, for life)
            cidr = ""

            async def assigned() -> bool:
                nonlocal cidr
                cidr = str(
                    ((await cluster.get(NODES, NODE)).get("spec") or {}).get("podCIDR") or ""
                )
                return bool(cidr)

            await wait_for(assigned)
            network = ipaddress.ip_network(cidr)
            assert network.subnet_of(SETTINGS.cluster_cidr)  # type: ignore[arg-type]

            async def configured() -> bool:
                return runtime.ips.network == network

            await wait_for(configured)
            await cluster.create(PODS, pod("web", container("c", "sleep", "3600")))
            got = await wait_pod(cluster, "web", lambda p: phase(p) == "Running")
            assert got["status"]["podIP"] == str(network.network_address + 2)
            node = await cluster.get(NODES, NODE)
            assert ANN_BACKEND_TYPE not in (node["metadata"].get("annotations") or {})
            nursery.cancel_scope.cancel()
    assert not (tmp_path / "net.d").exists()


@pytest.mark.skipif(bool(can_make_namespaces()), reason=can_make_namespaces())
async def test_a_node_publishes_its_flannel_annotations(h: Harness, tmp_path: Path) -> None:
    lab = Lab().start(1)
    store = await LocalStore.open(tmp_path / "agent.db")
    try:
        (n,) = lab.nodes
        cluster = admin(h)
        await cluster.create(
            NODES,
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": NODE},
                "spec": {"podCIDR": n.pod_cidr},
                "status": {"addresses": [{"type": "InternalIP", "address": n.ip}]},
            },
        )
        net = PodNetwork(
            SETTINGS, "vxlan", NODE, n.ip, client=as_node(h), store=store,
            options=PodNetworkOptions(cni_conf_dir=tmp_path / "net.d", netns=n.ns),
        )  # fmt: skip
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                await nursery.start(net.run)

                async def published() -> bool:
                    node = await cluster.get(NODES, NODE)
                    return ANN_BACKEND_DATA in (node["metadata"].get("annotations") or {})

                await wait_for(published)
                annotations = (await cluster.get(NODES, NODE))["metadata"]["annotations"]
                assert json.loads(annotations[ANN_BACKEND_DATA]) == {
                    "VNI": 1,
                    "VtepMAC": net.vtep_mac,
                }
                assert annotations[ANN_PUBLIC_IP] == n.ip
                assert annotations[ANN_BACKEND_TYPE] == "vxlan"
                nursery.cancel_scope.cancel()
    finally:
        await store.aclose()
        lab.close()
