"""A standalone agent's log at INFO: one line per event, none per HTTP request; signals named.

One server (no embedded agent) and one `orchestrator agent --runtime simulated` process joined
with a K10 token, renewing its Lease every 0.2 s through httpx (each renewal was an INFO line
"HTTP Request: PUT ..." before). Once the Lease has been renewed several times, SIGINT stops
the agent: it logs "received SIGINT" (not "received 2") and exits 0, and no line of its log comes
from httpx, httpcore, hpack, h2, h11 or hypercorn's access log. No pod is made: nothing is sent
beyond loopback.
"""

from __future__ import annotations

import re
import signal
import ssl
from pathlib import Path

import httpx
import pytest
import trio
from agentproc import AgentProc
from api.apiharness import read_kubeconfig
from cluster import Cluster

from orchestrator.logsetup import PER_REQUEST

pytestmark = pytest.mark.slow

NODE = "edge-quiet"
LEASE = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{NODE}"
RENEWALS = 5  # distinct renewTimes seen before the agent is stopped
# The text format (`AgentProc` passes --log-format text): `date time LEVEL logger: message`.
RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (?P<level>[A-Z]+) (?P<logger>[\w.]+): ")


def per_request(logger: str) -> bool:
    return any(logger == top or logger.startswith(top + ".") for top in PER_REQUEST)


async def test_agent_logs_no_request_lines_and_names_the_signal(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path / "servers", 1, api=True, agent=False)
    with trio.fail_after(90), cluster:
        cluster.start()
        await cluster.wait_leader()
        await cluster.wait_api(0)
        _, token, ca = read_kubeconfig(cluster.servers[0].kubeconfig)
        api = f"https://127.0.0.1:{cluster.servers[0].api_port}"
        verify = ssl.create_default_context(cadata=ca.decode())
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(verify=verify, headers=headers, timeout=10) as client:
            r = await client.post(api + "/orchestrator/v1/tokens", json={"ttlSeconds": 600})
            assert r.status_code == 201, r.text
            join_token = r.json()["token"]
            with AgentProc(
                tmp_path / "agent", NODE, api, join_token, lease_renew_interval=0.2
            ) as agent:
                agent.start()
                seen: set[str] = set()
                while len(seen) < RENEWALS:  # bounded by the fail_after above
                    cluster.check_alive()
                    assert agent.running, agent.log_tail()
                    r = await client.get(api + LEASE)
                    if r.status_code == 200:
                        seen.add(str(r.json()["spec"].get("renewTime")))
                    await trio.sleep(0.1)
                code = await trio.to_thread.run_sync(lambda: agent.kill(signal.SIGINT, wait=20))
                assert code == 0, agent.log_tail()
                text = agent.log_path.read_text(errors="replace")
    records = [m for m in map(RECORD.match, text.splitlines()) if m]
    assert records, text
    noisy = [m.string for m in records if per_request(m["logger"])]
    assert noisy == [], "\n".join(noisy)
    assert any(m["logger"] == "orchestrator.agent.node" for m in records), text  # it did log
    messages = [m.string[m.end() :] for m in records]
    assert "received SIGINT: stopping (containers keep running)" in messages, text
    assert not any(re.match(r"received \d+", line) for line in messages), text
