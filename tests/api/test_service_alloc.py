"""Services get ClusterIPs and NodePorts through the real API (issue 19), with one store key
per allocated value: user choices honoured, collisions and bad values 422 with Kubernetes'
messages, releases on delete and type changes, dry runs keep nothing, concurrent creates never
share a value, and the repair pass restores the keys."""

from __future__ import annotations

import ipaddress
import random
from typing import Any

import httpx
import trio
from apiharness import Harness, api_server

from orchestrator.apiserver.allockeys import IP_PREFIX, PORT_PREFIX, held_keys, ip_key, port_key
from orchestrator.apiserver.handler import Call
from orchestrator.apiserver.resources import Api
from orchestrator.apiserver.services import AllocationRepair, repair_allocations
from orchestrator.apiserver.storage import ObjectStore
from orchestrator.kube.schema.builtin import builtin_registry
from orchestrator.network.settings import NetworkSettings
from orchestrator.testing.apiserver import ADMIN

SVC = "/api/v1/namespaces/default/services"


def service(name: str, **spec: Any) -> dict[str, Any]:
    spec.setdefault("ports", [{"port": 80}])
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": spec}


async def create(h: Harness, body: dict[str, Any], query: str = "") -> httpx.Response:
    return await h.client.post(SVC + query, json=body)


async def keys(h: Harness) -> set[str]:
    store = h.server.store
    out = set()
    for prefix in (IP_PREFIX, PORT_PREFIX):
        res = await store.list(prefix)
        out |= {kv.key for kv in res.kvs}
    return out


async def test_cluster_ip_service_gets_an_address_of_the_service_cidr() -> None:
    async with api_server(controllers=False) as h:
        await h.wait_ready()
        r = await create(h, service("web"))
        assert r.status_code == 201, r.text
        spec = r.json()["spec"]
        ip = ipaddress.ip_address(spec["clusterIP"])
        assert ip in ipaddress.ip_network("10.43.0.0/16")
        assert str(ip) not in ("10.43.0.0", "10.43.0.1", "10.43.0.10", "10.43.255.255")
        assert spec["clusterIPs"] == [spec["clusterIP"]]
        assert spec["ipFamilies"] == ["IPv4"]
        assert spec["ipFamilyPolicy"] == "SingleStack"
        assert "nodePort" not in spec["ports"][0]
        assert ip_key(str(ip)) in await keys(h)
        # kubectl apply of the manifest without clusterIP keeps it (and changes nothing)
        got = (await h.client.get(f"{SVC}/web")).json()
        body = service("web")
        body["metadata"]["resourceVersion"] = got["metadata"]["resourceVersion"]
        body["metadata"]["namespace"] = "default"
        r = await h.client.put(f"{SVC}/web", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["spec"]["clusterIP"] == str(ip)
        assert r.json()["metadata"]["resourceVersion"] == got["metadata"]["resourceVersion"]
        # deleting releases the key
        assert (await h.client.delete(f"{SVC}/web")).status_code == 200
        assert ip_key(str(ip)) not in await keys(h)


async def test_kubernetes_service_has_the_first_address() -> None:
    """`cluster.apiendpoints` publishes `default/kubernetes` (a lone server too) with the
    service CIDR's first address, which only a Service that asks for it gets."""
    async with api_server(controllers=False) as h:
        await h.wait_ready()
        ip = str(h.api.network.kubernetes_service_ip)
        assert ip == "10.43.0.1"
        with trio.fail_after(30):
            while True:
                r = await h.client.get(f"{SVC}/kubernetes")
                if r.status_code != 404:
                    break
                await trio.sleep(0.05)
        assert r.status_code == 200, r.text
        assert r.json()["spec"]["clusterIP"] == "10.43.0.1"
        assert ip_key("10.43.0.1") in await keys(h)
        # nobody else gets it, even when asking for it by name
        r = await create(h, service("other", clusterIP="10.43.0.1"))
        assert r.status_code == 422, r.text


async def test_user_chosen_values_honoured_and_collisions_refused() -> None:
    async with api_server(controllers=False) as h:
        await h.wait_ready()
        r = await create(h, service("a", clusterIP="10.43.0.20"))
        assert r.status_code == 201, r.text
        assert r.json()["spec"]["clusterIPs"] == ["10.43.0.20"]
        r = await create(h, service("b", clusterIP="10.43.0.20"))
        assert r.status_code == 422, r.text
        assert "provided IP is already allocated" in r.json()["message"]
        r = await create(h, service("b", clusterIP="10.99.0.20"))
        assert r.status_code == 422
        assert "not in the valid range" in r.json()["message"]
        r = await create(h, service("b", clusterIP="nonsense"))
        assert r.status_code == 422
        assert "must be a valid IP address" in r.json()["message"]
        # the cluster DNS address is handed out when asked for by name
        r = await create(h, service("dns", clusterIP="10.43.0.10"))
        assert r.status_code == 201, r.text
        ports = [{"port": 80, "nodePort": 30080}]
        r = await create(h, service("np", type="NodePort", ports=ports))
        assert r.status_code == 201, r.text
        assert r.json()["spec"]["ports"][0]["nodePort"] == 30080
        r = await create(h, service("np2", type="NodePort", ports=ports))
        assert r.status_code == 422
        assert "provided port is already allocated" in r.json()["message"]
        r = await create(h, service("np3", type="NodePort", ports=[{"port": 80, "nodePort": 8080}]))
        assert r.status_code == 422
        assert "30000-32767" in r.json()["message"]
        # refused creates left no key behind
        assert {k for k in await keys(h) if "portallocations" in k} == {port_key(30080)}


async def test_node_ports_headless_external_name_and_type_changes() -> None:
    async with api_server(controllers=False) as h:
        await h.wait_ready()
        ports = [{"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "dns-tcp", "port": 53}]
        r = await create(h, service("lb", type="LoadBalancer", ports=ports))
        assert r.status_code == 201, r.text
        node_ports = {p["nodePort"] for p in r.json()["spec"]["ports"]}
        assert len(node_ports) == 1  # TCP and UDP of one number share a node port
        (node_port,) = node_ports
        assert 30000 <= node_port <= 32767
        r = await create(h, service("headless", clusterIP="None"))
        assert r.status_code == 201, r.text
        assert r.json()["spec"]["clusterIPs"] == ["None"]
        r = await create(h, service("bad", clusterIP="None", type="NodePort"))
        assert r.status_code == 422
        r = await create(h, service("ext", type="ExternalName", externalName="example.org"))
        assert r.status_code == 201, r.text
        assert "clusterIP" not in r.json()["spec"]
        # LoadBalancer -> ClusterIP drops the node port; -> ExternalName drops the address
        patch = {"spec": {"type": "ClusterIP"}}
        headers = {"Content-Type": "application/strategic-merge-patch+json"}
        r = await h.client.patch(f"{SVC}/lb", json=patch, headers=headers)
        assert r.status_code == 200, r.text
        assert all("nodePort" not in p for p in r.json()["spec"]["ports"])
        assert port_key(node_port) not in await keys(h)
        ip = r.json()["spec"]["clusterIP"]
        patch2 = {"spec": {"type": "ExternalName", "externalName": "example.org"}}
        r = await h.client.patch(f"{SVC}/lb", json=patch2, headers=headers)
        assert r.status_code == 200, r.text
        assert "clusterIP" not in r.json()["spec"]
        assert ip_key(ip) not in await keys(h)
        # ... and back to NodePort: a new address and node ports
        patch3 = {"spec": {"type": "NodePort", "externalName": None}}
        r = await h.client.patch(f"{SVC}/lb", json=patch3, headers=headers)
        assert r.status_code == 200, r.text
        spec = r.json()["spec"]
        assert spec["clusterIP"]
        assert all(p["nodePort"] for p in spec["ports"])
        assert ip_key(spec["clusterIP"]) in await keys(h)
        # the ClusterIP is immutable
        r = await h.client.patch(
            f"{SVC}/lb", json={"spec": {"clusterIP": "10.43.9.9"}}, headers=headers
        )
        assert r.status_code == 422


async def test_dry_run_keeps_nothing() -> None:
    async with api_server(controllers=False) as h:
        await h.wait_ready()
        before = await keys(h)
        r = await create(h, service("d", type="NodePort"), "?dryRun=All")
        assert r.status_code == 201, r.text
        assert r.json()["spec"]["clusterIP"]
        assert await keys(h) == before
        assert (await h.client.get(f"{SVC}/d")).status_code == 404


async def test_concurrent_creates_never_share_a_value() -> None:
    async with api_server(controllers=False) as h:
        await h.wait_ready()
        results: list[httpx.Response] = []

        async def one(i: int) -> None:
            results.append(await create(h, service(f"s{i}", type="NodePort")))

        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(one, i)
        assert all(r.status_code == 201 for r in results), [r.text for r in results]
        ips = [r.json()["spec"]["clusterIP"] for r in results]
        ports = [r.json()["spec"]["ports"][0]["nodePort"] for r in results]
        assert len(set(ips)) == 20
        assert len(set(ports)) == 20
        held = await keys(h)
        assert {ip_key(i) for i in ips} <= held
        assert {port_key(p) for p in ports} <= held


async def test_a_stale_view_picks_again() -> None:
    """Another API server took the value this one's view thinks free: the create picks
    again instead of failing."""
    async with api_server(controllers=False) as h:
        await h.wait_ready()
        services = h.api.services
        await services.refresh(h.api.objects)
        # What the next automatic pick will be, taken behind the view's back.
        probe = services.assigner.ips.allocate(None)
        services.assigner.ips.release(probe)
        await h.server.store.create(ip_key(str(probe)), b"other")
        services.assigner.rng = None  # lowest free: the probe
        r = await create(h, service("x"))
        assert r.status_code == 201, r.text
        assert r.json()["spec"]["clusterIP"] != str(probe)


async def test_repair_releases_orphans_and_restores_missing_keys() -> None:
    async with api_server(controllers=False) as h:
        await h.wait_ready()
        r = await create(h, service("keep", type="NodePort"))
        spec = r.json()["spec"]
        store = h.server.store
        await store.create(ip_key("10.43.7.7"), b"orphan")
        await store.delete(ip_key(spec["clusterIP"]))
        deleted, created = await repair_allocations(h.api.objects)
        assert (deleted, created) == (1, 1)
        held = await keys(h)
        assert ip_key("10.43.7.7") not in held
        assert ip_key(spec["clusterIP"]) in held
        assert port_key(spec["ports"][0]["nodePort"]) in held
        assert await repair_allocations(h.api.objects) == (0, 0)


async def test_two_api_servers_on_one_store_never_share_a_value() -> None:
    """Two API servers' views of one store, picking alike (same seed): every lost race is
    retried with another value, none is held twice, and the keys are exactly the Services'."""
    async with api_server(controllers=False) as h:
        await h.wait_ready()
        other = Api(ObjectStore(h.server.store), builtin_registry())
        h.api.services.assigner.rng = random.Random(5)
        other.services.assigner.rng = random.Random(5)
        kind = h.api.kind("", "v1", "services")

        async def one(api: Api, i: int) -> None:
            await api.create(Call(ADMIN), kind, "default", service(f"s{i}", type="NodePort"))

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for i in range(24):
                    nursery.start_soon(one, (h.api, other)[i % 2], i)
        every = (await h.client.get(SVC)).json()["items"]
        # a lone server publishes default/kubernetes (10.43.0.1) beside the test's Services
        listed = [s for s in every if s["metadata"]["name"] != "kubernetes"]
        ips = [s["spec"]["clusterIP"] for s in listed]
        ports = [p["nodePort"] for s in listed for p in s["spec"]["ports"]]
        assert len(listed) == 24
        assert len(set(ips)) == 24
        assert len(set(ports)) == 24
        assert await keys(h) == {k for s in every for k in held_keys(s)}
        # a delete through one server frees the value for the other
        r = await h.client.delete(f"{SVC}/s0")
        assert r.status_code == 200
        assert await keys(h) == {
            k for s in every if s["metadata"]["name"] != "s0" for k in held_keys(s)
        }


async def test_the_server_address_plan_reaches_allocation_and_controllers() -> None:
    plan = NetworkSettings.create(
        cluster_cidr="10.52.0.0/16", service_cidr="10.53.0.0/24", cluster_dns="10.53.0.53"
    )
    async with api_server(network=plan) as h:
        await h.wait_ready()
        assert h.server.network is plan
        assert h.api.network is plan
        assert h.server.controllers is not None
        assert h.server.controllers.options.network is plan
        r = await create(h, service("web"))
        assert ipaddress.ip_address(r.json()["spec"]["clusterIP"]) in plan.service_cidr
        r = await create(h, service("dns", clusterIP="10.53.0.53"))
        assert r.status_code == 201, r.text
        # the node IPAM controller runs with the server's cluster CIDR
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "edge-1"}}
        assert (await h.client.post("/api/v1/nodes", json=node)).status_code == 201
        with trio.fail_after(30):
            while True:
                cidr = (await h.client.get("/api/v1/nodes/edge-1")).json()["spec"].get("podCIDR")
                if cidr:
                    break
                await trio.sleep(0.02)
        assert ipaddress.ip_network(cidr).subnet_of(plan.cluster_cidr)


async def test_the_repair_component_runs_its_pass_periodically_and_fenced() -> None:
    async with api_server(controllers=False) as h:
        await h.wait_ready()
        store = h.server.store
        leads, term = h.server.node.leadership()
        assert leads
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                repair = AllocationRepair(h.api.objects, interval=0.05, fence_term=term)
                await nursery.start(repair.run)
                await store.create(ip_key("10.43.8.8"), b"orphan")
                while ip_key("10.43.8.8") in await keys(h):  # noqa: ASYNC110  (store state)
                    await trio.sleep(0.02)
                nursery.cancel_scope.cancel()
            # fenced to a term this server does not lead: its writes are refused, logged
            await store.create(ip_key("10.43.8.9"), b"orphan")
            stale = AllocationRepair(h.api.objects, interval=0.05, fence_term=term - 1)
            with trio.move_on_after(0.5):
                await stale.run()
            assert ip_key("10.43.8.9") in await keys(h)
