"""The agent embedded in a server (`ServerOptions.agent`, default on from the CLI), the
`orchestrator agent` command line, and where the agents' log endpoints listen: on the node's
address and `--kubelet-port` (the port bound is the one advertised; a taken one stops start-up
with one line)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import trio
from agent.agentharness import container, phase, pod, wait_pod
from sim.simharness import ADMIN

from orchestrator.agent.logs import EndpointTLS, LogEndpoint
from orchestrator.agent.service import (
    AgentConfig,
    client_config,
    embedded_node_ip,
    parse_labels,
    start_endpoint,
)
from orchestrator.apiserver.server import ApiOptions
from orchestrator.cli.main import _build_parser
from orchestrator.controllers.runtime.client import NODES, PODS
from orchestrator.controllers.runtime.inprocess import InProcessClient
from orchestrator.listenerrors import ListenerError
from orchestrator.raft.node import NodeConfig
from orchestrator.security.pki import ensure_pki
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
                # The server listens on loopback: so does its agent, and its Node says so.
                assert {"type": "InternalIP", "address": "127.0.0.1"} in node["status"]["addresses"]
                with socket.socket() as probe:  # the advertised port is bound there ...
                    probe.bind(("127.0.0.1", 0))
                    assert probe.connect_ex(("127.0.0.1", port)) == 0
                bound = _listening_addresses(port)
                assert bound == {"127.0.0.1"}, bound  # ... and nowhere else (no wildcard)
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


def _listening_addresses(port: int) -> set[str]:
    """The local IPv4 addresses with a TCP socket listening on `port` (from /proc/net/tcp)."""
    found: set[str] = set()
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(socket.inet_ntoa(bytes.fromhex(addr)[::-1]))
    return found


def test_kubelet_port_flag_on_both_commands(tmp_path: Path) -> None:
    parser = _build_parser()
    base = ["--server", "https://10.0.0.1:6443", "--token", "t", "--data-dir", str(tmp_path)]
    assert parser.parse_args(["agent", *base]).kubelet_port == 10250
    assert parser.parse_args(["agent", *base, "--kubelet-port", "0"]).kubelet_port == 0
    assert parser.parse_args(["agent", *base, "--log-port", "7"]).kubelet_port == 7  # old name
    server = ["server", "--data-dir", str(tmp_path)]
    assert parser.parse_args(server).kubelet_port == 10250
    assert parser.parse_args([*server, "--kubelet-port", "10251"]).kubelet_port == 10251
    with pytest.raises(SystemExit):
        parser.parse_args([*server, "--kubelet-port", "70000"])
    assert "--kubelet-port" in parser._subparsers._group_actions[0].choices["server"].format_help()  # type: ignore[union-attr]  # argparse internals: the subparser's help


def test_embedded_node_ip() -> None:
    assert embedded_node_ip("", "127.0.0.1:6443") == "127.0.0.1"
    assert embedded_node_ip("", "localhost:6443") == "127.0.0.1"
    assert embedded_node_ip("", "[::1]:6443") == "::1"
    assert embedded_node_ip("", "192.0.2.7:6443") == "192.0.2.7"
    assert embedded_node_ip("10.1.1.1", "127.0.0.1:6443") == "10.1.1.1"  # --node-ip wins
    wildcard = embedded_node_ip("", "0.0.0.0:6443")  # the outbound address, never the wildcard
    assert wildcard not in ("0.0.0.0", "")


async def test_a_taken_port_is_one_clear_error(tmp_path: Path) -> None:
    pki = ensure_pki(tmp_path, [])
    tls = EndpointTLS.issue(pki, "n1", ["127.0.0.1"], tmp_path / "agent")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        endpoint = LogEndpoint(tmp_path, lambda ns, n: None, tls=tls, host="127.0.0.1", port=port)
        failures: list[BaseException] = []
        with trio.fail_after(10):
            try:
                async with trio.open_nursery() as nursery:
                    await start_endpoint(nursery, endpoint)
            except* ListenerError as group:
                failures.extend(group.exceptions)
    assert len(failures) == 1
    assert isinstance(failures[0], ListenerError)
    assert str(failures[0]) == (
        f"--kubelet-port 127.0.0.1:{port}: port {port} is already in use (by another process, "
        "or by another listener of this one); free it or choose another port with --kubelet-port"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_server_with_a_taken_kubelet_port_exits_with_one_line(tmp_path: Path) -> None:
    """A real `orchestrator server` whose --kubelet-port is taken: exit status 1 and one line
    that names the flag and the port; no traceback, no ExceptionGroup."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        argv = [
            *(sys.executable, "-m", "orchestrator", "--log-level", "warning", "--log-format"),
            *("text", "server", "--data-dir", str(tmp_path / "d"), "--runtime", "simulated"),
            *("--peer-listen", f"127.0.0.1:{_free_port()}"),
            *("--client-listen", f"127.0.0.1:{_free_port()}"),
            *("--listen", f"127.0.0.1:{_free_port()}", "--kubelet-port", str(port)),
            *("--node-name", "clash"),
        ]
        res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, res.stderr[-3000:]
    expected = (
        f"error: --kubelet-port 127.0.0.1:{port}: port {port} is already in use (by another "
        "process, or by another listener of this one); free it or choose another port with "
        "--kubelet-port"
    )
    lines = res.stderr.splitlines()
    assert lines[-1] == expected, res.stderr[-3000:]
    assert lines.count(expected) == 1
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    assert "ExceptionGroup" not in res.stderr
