"""The overload gate on a real server: an HTTP request over a tiny configured limit is a 429
with `Retry-After` and a TooManyRequests Status, a queued one times out the same way, a node's
Lease renewal (in process, as the embedded agent's) is still admitted while the admins' level
is saturated, and the server answers normally once the load is gone."""

from __future__ import annotations

import trio
from api.apiharness import api_server

from orchestrator.agent import node_client
from orchestrator.apiserver.flowcontrol import FlowControlConfig, LevelConfig
from orchestrator.client.resource import LEASES
from orchestrator.testing.apiserver import ADMIN

LEVELS = (
    LevelConfig("exempt", 0, exempt=True, queues=0),
    LevelConfig("node-high", 1, 0, queues=4, hand_size=1),
    LevelConfig("workload-high", 1, 0, queues=1, hand_size=1, queue_length_limit=1),
)
PODS = "/api/v1/namespaces/default/pods"


async def test_429_with_retry_after_while_a_lease_renewal_is_admitted() -> None:
    config = FlowControlConfig(max_requests_inflight=2, levels=LEVELS, queue_wait=0.5)
    async with api_server(controllers=False, flowcontrol=config) as h:
        await h.wait_namespace("kube-node-lease")
        gate = h.api.flowcontrol
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                held, release = trio.Event(), trio.Event()

                async def saturate() -> None:  # the admins' only seat, held
                    async with gate.seat(ADMIN, "", "pods", bounded=False):
                        held.set()
                        await release.wait()

                nursery.start_soon(saturate)
                await held.wait()
                answers: list[tuple[int, dict[str, str], dict[str, object]]] = []

                async def get() -> None:
                    r = await h.client.get(PODS)
                    answers.append((r.status_code, dict(r.headers), r.json()))

                nursery.start_soon(get)  # waits in the only queue, then times out
                with trio.fail_after(10):
                    while gate.statistics()["workload-high"].waiting < 1:  # noqa: ASYNC110
                        await trio.sleep(0.01)
                await get()  # the queue is full: refused at once
                # A node's Lease renewal has its own level: admitted while admins are refused.
                node = node_client(h.api, "n1")
                lease = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": "n1", "namespace": "kube-node-lease"},
                    "spec": {"holderIdentity": "n1", "leaseDurationSeconds": 40},
                }
                await node.create(LEASES, lease, "kube-node-lease")
                await node.patch(
                    LEASES, "n1", {"spec": {"holderIdentity": "n1"}}, "kube-node-lease"
                )
                with trio.fail_after(10):
                    while len(answers) < 2:  # noqa: ASYNC110
                        await trio.sleep(0.01)
                release.set()
        for code, headers, body in answers:
            assert code == 429
            assert headers["retry-after"] == "1"
            assert body["kind"] == "Status"
            assert body["reason"] == "TooManyRequests"
            assert body["details"] == {"retryAfterSeconds": 1}
        reasons = [str(body["message"]) for _, _, body in answers]
        assert any("queue-full" in m for m in reasons)
        assert any("time-out" in m for m in reasons)
        # The load is gone: the same request is served.
        assert (await h.client.get(PODS)).status_code == 200
        metrics = (await h.client.get("/metrics")).text
        assert (
            'apiserver_flowcontrol_rejected_requests_total{priority_level="workload-high",'
            'flow_schema="workload-high",reason="queue-full"}'
        ) in metrics
        stats = gate.statistics()
        assert all(s.in_use == 0 and s.waiting == 0 for s in stats.values())


async def test_a_users_http_watch_holds_no_seat_once_it_streams() -> None:
    levels = (
        LevelConfig("exempt", 0, exempt=True, queues=0),
        LevelConfig("workload-high", 1, 0, queues=0),
    )
    config = FlowControlConfig(max_requests_inflight=1, levels=levels)
    async with api_server(controllers=False, flowcontrol=config) as h:
        with trio.fail_after(30):
            async with h.client.stream("GET", PODS, params={"watch": "true"}) as watch:
                assert watch.status_code == 200
                # The one seat is free again: a plain request is served beside the stream.
                assert (await h.client.get(PODS)).status_code == 200
        assert h.api.flowcontrol.statistics()["workload-high"].in_use == 0
