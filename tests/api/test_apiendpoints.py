"""`default/kubernetes`: the advertised address, the id -> URL map each server keeps in it, its
rendering as Endpoints (pure), and publishers of two "servers" against one real API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from api.apiharness import api_server

from orchestrator.client.endpoints import urls_from_endpoints
from orchestrator.cluster.apiendpoints import (
    ANNOTATION,
    ApiEndpointsPublisher,
    advertised_host,
    desired_servers,
    endpoints_object,
    published_servers,
)


def outbound() -> str:
    return "192.0.2.7"


def test_advertised_host_prefers_what_other_devices_can_reach() -> None:
    assert advertised_host("10.0.0.1", "10.0.0.9", [], outbound) == "10.0.0.1"
    assert advertised_host("0.0.0.0", "10.0.0.1", ["10.0.0.5"], outbound) == "10.0.0.1"
    assert advertised_host("::", "[fd00::1]", [], outbound) == "fd00::1"
    # a loopback or wildcard peer address says nothing: the first IP SAN, else outbound
    assert advertised_host("0.0.0.0", "127.0.0.1", ["edge.local", "10.0.0.5"], outbound) == (
        "10.0.0.5"
    )
    assert advertised_host("0.0.0.0", "0.0.0.0", ["edge.local"], outbound) == "192.0.2.7"
    assert advertised_host("0.0.0.0", "localhost", [], outbound) == "192.0.2.7"


def test_desired_servers_own_entry_and_leader_prunes_non_members() -> None:
    published = {1: "https://a:1", 2: "https://b:2", 9: "https://gone:9"}
    # a follower adds or corrects only its own entry, removes nothing
    assert desired_servers(published, 3, "https://c:3", frozenset({1, 2, 3}), leader=False) == {
        1: "https://a:1",
        2: "https://b:2",
        3: "https://c:3",
        9: "https://gone:9",
    }
    assert desired_servers(published, 2, "https://b2:2", frozenset({1, 2}), leader=False)[2] == (
        "https://b2:2"
    )
    # the leader also drops servers that are no longer members (down ones stay)
    assert desired_servers(published, 1, "https://a:1", frozenset({1, 2, 3}), leader=True) == {
        1: "https://a:1",
        2: "https://b:2",
    }
    # a server that is not (or no longer) a member does not add itself
    assert 4 not in desired_servers(published, 4, "https://d:4", frozenset({1, 2}), leader=False)


def test_endpoints_object_round_trips_through_the_client_parser() -> None:
    servers = {
        3: "https://10.0.0.3:6443",
        1: "https://10.0.0.1:6443",
        2: "https://127.0.0.1:7444",
        4: "https://[fd00::4]:6443",
    }
    ep = endpoints_object(servers)
    assert ep["metadata"]["name"] == "kubernetes"
    assert ep["metadata"]["namespace"] == "default"
    assert published_servers(ep) == servers
    assert ep["subsets"] == [
        {
            "addresses": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.3"}, {"ip": "fd00::4"}],
            "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}],
        },
        {
            "addresses": [{"ip": "127.0.0.1"}],
            "ports": [{"name": "https", "port": 7444, "protocol": "TCP"}],
        },
    ]
    assert urls_from_endpoints(ep) == [
        "https://10.0.0.1:6443",
        "https://10.0.0.3:6443",
        "https://[fd00::4]:6443",
        "https://127.0.0.1:7444",
    ]
    assert endpoints_object(dict(reversed(servers.items()))) == ep  # order-independent


def test_published_servers_tolerates_junk() -> None:
    assert published_servers(None) == {}
    assert published_servers({"metadata": {"annotations": {ANNOTATION: "not json"}}}) == {}
    junk = '{"1": "https://a:1", "x": "https://b:2", "3": 7}'
    assert published_servers({"metadata": {"annotations": {ANNOTATION: junk}}}) == {
        1: "https://a:1"
    }


async def test_publishers_of_two_servers_share_one_object(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def idle(self: ApiEndpointsPublisher, *, task_status: Any) -> None:
        task_status.started()
        await trio.sleep_forever()

    # the server's own publisher stays out of the way: the test drives two by hand
    monkeypatch.setattr(ApiEndpointsPublisher, "run", idle)
    async with api_server(tmp_path) as h:
        await h.wait_ready()
        api = h.server.api
        assert api is not None
        members = {1}
        leader = {1}

        def publisher(node_id: int, host: str) -> ApiEndpointsPublisher:
            return ApiEndpointsPublisher(
                api, node_id, lambda: frozenset(members), lambda: node_id in leader, host
            )

        one, two = publisher(1, "127.0.0.1"), publisher(2, "127.0.0.2")
        path = "/api/v1/namespaces/default/endpoints/kubernetes"
        with trio.fail_after(30):
            members.clear()
            assert not await one.reconcile_once()  # not a member yet: nothing to publish
            assert (await h.client.get(path)).status_code == 404
            members.add(1)
            assert await one.reconcile_once()  # a lone server publishes itself (issue 19)
            assert not await one.reconcile_once()  # unchanged: not written again
            lone = (await h.client.get(path)).json()
            assert urls_from_endpoints(lone) == [f"https://127.0.0.1:{api.port}"]

            members.add(2)
            assert not await one.reconcile_once()  # 2 has not written its own entry yet
            assert await two.reconcile_once()
            r = await h.client.get(path)
            assert r.status_code == 200, r.text
            port = api.port
            assert urls_from_endpoints(r.json()) == [
                f"https://127.0.0.1:{port}",
                f"https://127.0.0.2:{port}",
            ]
            svc = (await h.client.get("/api/v1/namespaces/default/services/kubernetes")).json()
            assert "selector" not in svc["spec"]  # the endpoints controller leaves it alone

            members.discard(2)  # server 2 is removed: only the leader drops it
            assert not await two.reconcile_once()
            assert await one.reconcile_once()
            r = await h.client.get(path)
            assert urls_from_endpoints(r.json()) == [f"https://127.0.0.1:{port}"]


async def test_a_single_server_publishes_itself(tmp_path: Path) -> None:
    """Issue 19: the node proxy routes the `kubernetes` Service to the API on one server too."""
    async with api_server(tmp_path) as h:
        api = h.server.api
        assert api is not None
        path = "/api/v1/namespaces/default/endpoints/kubernetes"
        with trio.fail_after(30):
            while (r := await h.client.get(path)).status_code == 404:  # noqa: ASYNC110  (remote)
                await trio.sleep(0.02)
        assert r.status_code == 200, r.text
        (url,) = urls_from_endpoints(r.json())
        assert url.startswith("https://")
        assert url.endswith(f":{api.port}")
        svc = (await h.client.get("/api/v1/namespaces/default/services/kubernetes")).json()
        assert svc["spec"]["ports"] == [
            {"name": "https", "port": 443, "protocol": "TCP", "targetPort": api.port}
        ]
