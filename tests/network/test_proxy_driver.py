"""The node proxy's driver: full sync first, partial syncs after, debounced; failures logged,
counted and retried with a full sync, never fatal."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import trio
import trio.testing

from orchestrator.agent.net.proxy import ExecIptables, IptablesError, NodeProxy, ProxyOptions
from orchestrator.agent.net.proxyrules import BUILTIN_JUMPS, ProxyConfig, build
from orchestrator.metrics import Registry

pytestmark = pytest.mark.trio
CONFIG = ProxyConfig("a", "10.42.0.0/16", "10.43.0.10")


class FakeSource:
    def __init__(self) -> None:
        self.version = 0
        self.svcs: list[dict[str, Any]] = []
        self.sls: list[dict[str, Any]] = []
        self._changed = trio.Event()

    def services(self) -> list[dict[str, Any]]:
        return self.svcs

    def slices(self) -> list[dict[str, Any]]:
        return self.sls

    def bump(self) -> None:
        self.version += 1
        self._changed.set()
        self._changed = trio.Event()

    async def wait_changed(self, version: int) -> int:
        while self.version == version:
            await self._changed.wait()
        return self.version


class FakeIptables:
    def __init__(self) -> None:
        self.restores: list[str] = []
        self.saves = 0
        self.jumps = 0
        self.fail = 0  # the next `fail` restores raise

    async def restore(self, text: str) -> None:
        await trio.lowlevel.checkpoint()
        if self.fail:
            self.fail -= 1
            raise IptablesError("iptables-restore failed (exit 1): line 3 failed")
        self.restores.append(text)

    async def save(self) -> str:
        self.saves += 1
        return "*nat\n:KUBE-SVC-STALESTALESTALE - [0:0]\nCOMMIT\n"

    async def ensure_jumps(self, jumps: Sequence[tuple[str, str, str]]) -> None:
        assert tuple(jumps) == BUILTIN_JUMPS
        self.jumps += 1


def _web(ip: str) -> tuple[dict[str, Any], dict[str, Any]]:
    return (
        {"metadata": {"namespace": "shop", "name": "web"},
         "spec": {"clusterIP": "10.43.0.20", "ports": [{"port": 80}]}},
        {"metadata": {"namespace": "shop", "name": "web-a",
                      "labels": {"kubernetes.io/service-name": "web"}},
         "ports": [{"port": 8080}], "endpoints": [{"addresses": [ip]}]},
    )  # fmt: skip


async def _until(pred: Any) -> None:
    with trio.fail_after(60):
        while not pred():  # noqa: ASYNC110  (polling data with a deadline)
            await trio.sleep(0.01)


async def test_full_then_partial_syncs_and_recovery(
    autojump_clock: trio.testing.MockClock,
) -> None:
    src, ipt, metrics = FakeSource(), FakeIptables(), Registry()
    svc, sl = _web("10.42.0.5")
    src.svcs, src.sls = [svc], [sl]
    proxy = NodeProxy(src, ProxyOptions(CONFIG, min_sync_period=0.5), ipt, metrics=metrics)
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        await _until(lambda: proxy.syncs == 1)
        # the first sync is full: every chain, the stale chain deleted, jumps ensured
        assert (ipt.saves, ipt.jumps) == (1, 1)
        assert "-X KUBE-SVC-STALESTALESTALE" in ipt.restores[0]
        assert "DNAT --to-destination 10.42.0.5:8080" in ipt.restores[0]
        # a burst of changes within min_sync_period is one partial sync
        for ip in ("10.42.0.6", "10.42.0.7"):
            src.sls = [_web(ip)[1]]
            src.bump()
            await trio.sleep(0.1)
        await _until(lambda: proxy.syncs == 2)
        await trio.sleep(1)
        assert len(ipt.restores) == 2  # the burst made one sync
        text = ipt.restores[-1]
        assert "*filter" not in text  # nothing changed there
        assert "10.42.0.7:8080" in text
        assert "10.42.0.6" not in text
        assert "-X KUBE-SEP-" in text  # the 10.42.0.5 endpoint's chain went
        assert ipt.saves == 1
        # a failed restore: counted, retried after a back-off, with a full sync
        ipt.fail = 2
        src.svcs = []
        src.bump()
        await _until(lambda: proxy.syncs == 3)
        assert proxy.failures == 2
        assert ipt.saves == 1  # only the first full sync reads the kernel; the rest know
        assert "-A KUBE-SVC-" not in ipt.restores[-1]
        assert "-X KUBE-SVC-" in ipt.restores[-1]  # the Service's chain went
        nursery.cancel_scope.cancel()


class IncrementalFakeSource(FakeSource):
    """Says which Services changed, as the agent's ServiceCache does."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[int, tuple[str, str]]] = []
        self.full_reads = 0

    def services(self) -> list[dict[str, Any]]:
        self.full_reads += 1
        return self.svcs

    def service(self, namespace: str, name: str) -> dict[str, Any] | None:
        return next((s for s in self.svcs if s["metadata"]["name"] == name), None)

    def slices_for(self, namespace: str, name: str) -> list[dict[str, Any]]:
        return [
            s for s in self.sls if s["metadata"]["labels"]["kubernetes.io/service-name"] == name
        ]

    def changes_since(self, version: int) -> set[tuple[str, str]] | None:
        return {key for v, key in self.log if v > version}

    def touch(self, name: str) -> None:
        self.bump()
        self.log.append((self.version, ("shop", name)))


async def test_partial_syncs_read_only_the_changed_services(
    autojump_clock: trio.testing.MockClock,
) -> None:
    src, ipt = IncrementalFakeSource(), FakeIptables()
    svc, sl = _web("10.42.0.5")
    src.svcs, src.sls = [svc], [sl]
    proxy = NodeProxy(src, ProxyOptions(CONFIG), ipt, metrics=Registry())
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        await _until(lambda: proxy.syncs == 1)
        assert src.full_reads == 1  # the first sync reads everything
        src.sls = [_web("10.42.0.6")[1]]
        src.touch("web")
        await _until(lambda: proxy.syncs == 2)
        assert src.full_reads == 1  # the partial one only the Service that changed
        assert "10.42.0.6:8080" in ipt.restores[-1]
        assert "-X KUBE-SEP-" in ipt.restores[-1]
        src.touch("other")  # a change that changes no rule: no restore at all
        await _until(lambda: proxy.syncs == 3)
        assert len(ipt.restores) == 2
        assert proxy.applied is not None
        assert proxy.applied.tables == build(src.svcs, src.sls, CONFIG).tables
        nursery.cancel_scope.cancel()


async def test_missing_iptables_is_an_error() -> None:
    missing = ExecIptables(prefix=["/nonexistent/iptables-wrapper"])
    with trio.fail_after(30), pytest.raises(IptablesError, match="not installed"):
        await missing.restore("*nat\nCOMMIT\n")
    with trio.fail_after(30), pytest.raises(IptablesError, match="not installed"):
        await missing.save()


class BrokenIptables(FakeIptables):
    async def save(self) -> str:
        await trio.lowlevel.checkpoint()
        raise IptablesError("iptables-save is not installed")


async def test_failing_iptables_is_retried_not_a_crash(
    autojump_clock: trio.testing.MockClock,
) -> None:
    src, metrics = FakeSource(), Registry()
    proxy = NodeProxy(src, ProxyOptions(CONFIG), BrokenIptables(), metrics=metrics)
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        await trio.sleep(100)  # back-off 1, 2, 4, ... 30 s; the loop keeps going
        assert proxy.failures == 8  # at 0, 1, 3, 7, 15, 31, 61, 91 s
        assert proxy.syncs == 0
        assert "orchestrator_proxy_sync_errors_total 8" in metrics.render()
        nursery.cancel_scope.cancel()
