"""`kubectl logs` for a pod on a joined, standalone agent: one server (no embedded agent) and one
`orchestrator agent --runtime simulated` process joined with a K10 token.

The agent makes its serving key itself and gets the certificate from the join answer
(`orchestrator.agent.servingcert`); the API server's log proxy dials the node's InternalIP and
verifies that certificate against the cluster CA. A restart reuses the stored pair.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import trio
from agentproc import AgentProc
from api.apiharness import read_kubeconfig
from cluster import Cluster
from cryptography import x509

from orchestrator.agent.servingcert import CERT_FILE, KEY_FILE

pytestmark = pytest.mark.slow

T = TypeVar("T")

PODS = "/api/v1/namespaces/default/pods"
NODE = "edge-1"


def pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "talker", "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "containers": [
                {
                    "name": "c",
                    "image": "busybox",
                    "command": ["sh", "-c", "echo hello from the edge; echo line two; sleep 3600"],
                }
            ],
        },
    }


async def test_logs_of_a_pod_on_a_joined_agent(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path / "servers", 1, api=True, agent=False)
    with trio.fail_after(60), cluster, contextlib.ExitStack() as stack:
        cluster.start()
        await cluster.wait_leader()
        await cluster.wait_api(0)
        _, token, ca = read_kubeconfig(cluster.servers[0].kubeconfig)
        api = f"https://127.0.0.1:{cluster.servers[0].api_port}"
        verify = ssl.create_default_context(cadata=ca.decode())
        headers = {"Authorization": f"Bearer {token}"}
        agent: AgentProc | None = None
        async with httpx.AsyncClient(verify=verify, headers=headers, timeout=10) as client:

            async def poll(fn: Callable[[], Awaitable[T | None]], what: str) -> T:
                with trio.move_on_after(30):
                    while True:
                        cluster.check_alive()
                        if agent is not None:
                            assert agent.running, f"agent died\n{agent.log_tail()}"
                        try:
                            value = await fn()
                        except httpx.TransportError:
                            value = None
                        if value:
                            return value
                        await trio.sleep(0.2)
                tail = agent.log_tail() if agent is not None else ""
                raise AssertionError(f"timed out waiting for {what}\n{tail}")

            async def api_up() -> bool:
                return (await client.get(api + "/api/v1/namespaces/default")).status_code == 200

            await poll(api_up, "the API")
            r = await client.post(api + "/orchestrator/v1/tokens", json={"ttlSeconds": 600})
            assert r.status_code == 201, r.text
            join_token = r.json()["token"]
            data = tmp_path / "agent"
            agent = stack.enter_context(
                AgentProc(data, NODE, api, join_token, extra_args=["--node-ip", "127.0.0.1"])
            )
            agent.start()

            async def node_port() -> int | None:
                r = await client.get(f"{api}/api/v1/nodes/{NODE}")
                if r.status_code != 200:
                    return None
                st = r.json().get("status") or {}
                port = ((st.get("daemonEndpoints") or {}).get("kubeletEndpoint") or {}).get("Port")
                return int(port) if port else None

            assert await poll(node_port, "the node's log port") > 0
            # The key stayed on the device (0600); the certificate is the CA's, for the node.
            assert stat.S_IMODE(os.stat(data / KEY_FILE).st_mode) == 0o600
            cert_pem = (data / CERT_FILE).read_bytes()
            cert = x509.load_pem_x509_certificate(cert_pem)
            assert cert.issuer == x509.load_pem_x509_certificate(ca).subject
            sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            assert NODE in sans.get_values_for_type(x509.DNSName)
            assert "127.0.0.1" in {str(a) for a in sans.get_values_for_type(x509.IPAddress)}

            r = await client.post(api + PODS, json=pod())
            assert r.status_code == 201, r.text

            async def logs() -> str | None:
                r = await client.get(f"{api}{PODS}/talker/log")
                return r.text if r.status_code == 200 and "line two" in r.text else None

            text = await poll(logs, "the pod's logs through the proxy")
            assert text == "hello from the edge\nline two\n"

            # A restart reuses the stored certificate and serves again.
            agent.stop()
            agent.start()
            await poll(logs, "the logs after the agent restarted")
            assert (data / CERT_FILE).read_bytes() == cert_pem
