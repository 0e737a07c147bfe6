"""The agent embedded in a server (`ServerOptions.agent`, default on from the CLI) and the
`orchestrator agent` command line."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import trio
from agent.agentharness import container, phase, pod, wait_pod
from sim.simharness import ADMIN

from orchestrator.agent.service import AgentConfig, client_config, parse_labels
from orchestrator.api.apiserver import ApiOptions
from orchestrator.cli.main import _build_parser
from orchestrator.controllers.runtime.client import NODES, PODS, InProcessClient
from orchestrator.raft.node import NodeConfig
from orchestrator.server import Server, ServerOptions


async def test_embedded_agent_runs_pods() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        opts = ServerOptions(
            NodeConfig(
                node_id=1,
                data_dir=root,
                peer_listen="127.0.0.1:0",
                founders={1: "127.0.0.1:0"},
                tick_interval=0.01,
            ),
            "127.0.0.1:0",
            token="t",
            api=ApiOptions(root, "127.0.0.1:0", cluster_token="t"),
            controllers=False,
            agent=AgentConfig(runtime="simulated", node_name="edge-1", kubelet_port=0),
        )
        server = Server(opts)
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                await nursery.start(server.run)
                assert server.api is not None
                admin = InProcessClient(server.api.api, ADMIN)
                spec = pod("hello", container("app", "sleep", "infinity"))
                while True:  # the system namespaces appear just after start
                    try:
                        await admin.create(PODS, spec, "default")
                        break
                    except Exception:
                        await trio.sleep(0.05)
                p = await wait_pod(admin, "hello", lambda p: phase(p) == "Running")
                assert p["status"]["containerStatuses"][0]["ready"]
                node = await admin.get(NODES, "edge-1")
                port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
                assert port > 0
                nursery.cancel_scope.cancel()
        assert (root / "agent" / "agent.db").exists()


def test_agent_command_line(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_bytes(b"-----BEGIN CERTIFICATE-----\n")
    args = _build_parser().parse_args(
        [
            "agent",
            "--server",
            "https://10.0.0.1:6443",
            "--token",
            "tok",
            "--data-dir",
            str(tmp_path / "d"),
            "--ca-file",
            str(ca),
            "--runtime",
            "simulated",
            "--labels",
            "zone=a,tier=edge",
        ]
    )
    cfg = client_config(args)
    assert (cfg.server, cfg.token, cfg.ca_pem) == ("https://10.0.0.1:6443", "tok", ca.read_bytes())
    assert args.labels == {"zone": "a", "tier": "edge"}
    args.ca_file = None
    with pytest.raises(SystemExit, match="--ca-file"):
        client_config(args)
    assert parse_labels("a=1") == {"a": "1"}
