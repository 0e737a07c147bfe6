"""The agent's Service cache: follows the API, persists to the local store, serves the stored
copy while the API is away and after a restart, and tells readers when anything changed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from orchestrator.agent.localstore import LocalStore
from orchestrator.agent.net.svccache import ServiceCache
from orchestrator.client.resource import ENDPOINT_SLICES, NODES, SERVICES
from orchestrator.controllers.runtime.informer import SharedInformer, strip_managed_fields
from orchestrator.metrics import Registry
from tests.network.fakeapi import FakeApi

pytestmark = pytest.mark.trio


def _svc(name: str, ip: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "shop", "name": name, "managedFields": [{"x": 1}]},
        "spec": {"clusterIP": ip, "ports": [{"port": 80}]},
    }


def _slice(service: str, name: str, ip: str) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "shop",
            "name": name,
            "labels": {"kubernetes.io/service-name": service},
        },
        "addressType": "IPv4",
        "ports": [{"port": 8080}],
        "endpoints": [{"addresses": [ip]}],
    }


def _cache(api: FakeApi, store: LocalStore | None) -> ServiceCache:
    metrics = Registry()
    return ServiceCache(
        api,  # type: ignore[arg-type]  # the fake has the two methods informers call
        store,
        informer=lambda res: SharedInformer(
            api,  # type: ignore[arg-type]  # as above
            res,
            metrics=metrics,
            backoff_initial=0.1,
            backoff_max=0.5,
            transform=strip_managed_fields,
        ),
    )


async def _until(pred: Any) -> None:
    with trio.fail_after(60):
        while not pred():  # noqa: ASYNC110  (polling data with a deadline)
            await trio.sleep(0.05)


def _names(objs: list[dict[str, Any]]) -> list[str]:
    return sorted(o["metadata"]["name"] for o in objs)


async def test_follows_the_api_and_restores_from_the_store(
    tmp_path: Path, thread_clock: trio.testing.MockClock
) -> None:
    api = FakeApi()
    api.put(SERVICES, _svc("web", "10.43.0.20"))
    api.put(ENDPOINT_SLICES, _slice("web", "web-a", "10.42.0.5"))
    api.put(NODES, {"metadata": {"name": "a"}, "status": {"addresses": [
        {"type": "InternalIP", "address": "192.0.2.1"}]}})  # fmt: skip
    store = await LocalStore.open(tmp_path / "agent.db")
    try:
        cache = _cache(api, store)
        async with trio.open_nursery() as nursery:
            await nursery.start(cache.run)
            await _until(lambda: cache.synced("Service") and cache.synced("EndpointSlice"))
            assert _names(cache.services()) == ["web"]
            assert "managedFields" not in cache.services()[0]["metadata"]
            assert _names(cache.slices_for("shop", "web")) == ["web-a"]
            assert cache.slices_for("shop", "other") == []
            await _until(lambda: cache.synced("Node"))
            assert cache.node_addresses("a") == [("InternalIP", "192.0.2.1")]
            # a change wakes a reader waiting on the version
            v = cache.version
            api.put(ENDPOINT_SLICES, _slice("web", "web-b", "10.42.1.5"))
            with trio.fail_after(10):
                assert await cache.wait_changed(v) > v
            assert _names(cache.slices_for("shop", "web")) == ["web-a", "web-b"]
            await cache.flush()
            nursery.cancel_scope.cancel()
        assert _names(await store.objects_of("Service")) == ["web"]
        assert _names(await store.objects_of("EndpointSlice")) == ["web-a", "web-b"]

        # a restart with the API down: the stored copy is served at once
        api.set_up(False)
        cache = _cache(api, store)
        async with trio.open_nursery() as nursery:
            await nursery.start(cache.run)
            assert cache.restored
            assert not cache.synced("Service")
            assert _names(cache.services()) == ["web"]
            assert cache.service("shop", "web") is not None
            assert _names(cache.slices_for("shop", "web")) == ["web-a", "web-b"]
            await trio.sleep(5)  # informers retry meanwhile; nothing changes, nothing crashes
            assert _names(cache.services()) == ["web"]
            # the API comes back without the Service: readers and store follow
            api.delete(SERVICES, "shop", "web")
            api.delete(ENDPOINT_SLICES, "shop", "web-a")
            api.put(SERVICES, _svc("api", "10.43.0.21"))
            api.set_up(True)
            await _until(lambda: cache.synced("Service") and cache.synced("EndpointSlice"))
            assert _names(cache.services()) == ["api"]
            assert _names(cache.slices()) == ["web-b"]
            await cache.flush()
            nursery.cancel_scope.cancel()
        assert _names(await store.objects_of("Service")) == ["api"]
        assert _names(await store.objects_of("EndpointSlice")) == ["web-b"]
        # ConfigMap/Secret pruning by the agent leaves these alone
        await store.prune_objects(set())
        assert _names(await store.objects_of("Service")) == ["api"]
    finally:
        await store.aclose()


async def test_a_missing_kind_does_not_stop_the_others(
    thread_clock: trio.testing.MockClock,
) -> None:
    api = FakeApi()
    api.missing.add("endpointslices")  # a server without discovery.k8s.io (yet)
    api.put(SERVICES, _svc("web", "10.43.0.20"))
    cache = _cache(api, None)
    async with trio.open_nursery() as nursery:
        await nursery.start(cache.run)
        await _until(lambda: cache.synced("Service"))
        assert _names(cache.services()) == ["web"]
        assert cache.slices() == []
        nursery.cancel_scope.cancel()


async def test_after_a_reboot_with_the_api_down_the_proxy_programs_the_stored_rules(
    tmp_path: Path, thread_clock: trio.testing.MockClock
) -> None:
    """Edge autonomy end to end (minus the kernel): the stored copy -> cache -> node proxy."""
    from orchestrator.agent.net.proxy import NodeProxy, ProxyOptions
    from orchestrator.agent.net.proxyrules import ProxyConfig
    from tests.network.test_proxy_driver import FakeIptables

    store = await LocalStore.open(tmp_path / "agent.db")
    try:
        await store.write_objects("Service", [_svc("web", "10.43.0.20")])
        await store.write_objects("EndpointSlice", [_slice("web", "web-a", "10.42.0.5")])
        api = FakeApi()
        api.set_up(False)
        cache = _cache(api, store)
        iptables = FakeIptables()
        proxy = NodeProxy(
            cache, ProxyOptions(ProxyConfig("a", "10.42.0.0/16", "10.43.0.10")), iptables,
            metrics=Registry(),
        )  # fmt: skip
        async with trio.open_nursery() as nursery:
            await nursery.start(cache.run)
            await nursery.start(proxy.run)
            await _until(lambda: proxy.syncs >= 1)
            assert "DNAT --to-destination 10.42.0.5:8080" in iptables.restores[0]
            # the API answers with an empty cluster: the rules go
            api.set_up(True)
            await _until(lambda: cache.synced("Service") and cache.synced("EndpointSlice"))
            await _until(lambda: "-X KUBE-SVC-" in iptables.restores[-1])
            nursery.cancel_scope.cancel()
    finally:
        await store.aclose()


async def test_changes_since_names_the_services_changed(
    thread_clock: trio.testing.MockClock,
) -> None:
    """Service and slice events name their Service (a slice's old and new one when its label
    moves); the switch from the stored copy and a too old version say "unknown" (None)."""
    from orchestrator.agent.net import svccache

    api = FakeApi()
    api.put(SERVICES, _svc("web", "10.43.0.20"))
    cache = _cache(api, None)
    async with trio.open_nursery() as nursery:
        await nursery.start(cache.run)
        assert cache.changes_since(0) is None  # before the stored copy was loaded
        await _until(lambda: cache.synced("Service") and cache.synced("EndpointSlice"))
        await _until(lambda: cache.synced("Node"))
        v = cache.version
        assert cache.changes_since(v) == set()
        api.put(ENDPOINT_SLICES, _slice("web", "web-a", "10.42.0.5"))
        await _until(lambda: cache.version > v)
        assert cache.changes_since(v) == {("shop", "web")}
        v2 = cache.version
        api.put(SERVICES, _svc("api", "10.43.0.21"))
        moved = _slice("api", "web-a", "10.42.0.5")  # the slice now belongs to "api"
        api.put(ENDPOINT_SLICES, moved)
        await _until(lambda: cache.slices_for("shop", "api") != [])
        assert cache.changes_since(v2) == {("shop", "web"), ("shop", "api")}
        assert cache.changes_since(v) == {("shop", "web"), ("shop", "api")}
        assert cache.slices_for("shop", "web") == []
        api.put(NODES, {"metadata": {"name": "a"}})  # no Service changes with a Node
        v3 = cache.version
        await _until(lambda: cache.version > v3)
        assert cache.changes_since(v3) == set()
        # more changes than the log keeps: the oldest versions are no longer answerable
        for i in range(svccache.CHANGE_LOG + 1):
            api.put(SERVICES, _svc("web", f"10.43.1.{i % 200 + 2}"))
            if i % 500 == 0:
                await trio.sleep(0.01)  # the fake's watch buffer holds 1,000 events
        await _until(lambda: cache.changes_since(v) is None)
        assert cache.changes_since(cache.version) == set()
        nursery.cancel_scope.cancel()
