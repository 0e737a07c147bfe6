"""The node proxy's driver: Service cache -> `proxyrules` -> `iptables-restore`, incrementally.

Theory of operation
-------------------
`NodeProxy.run` loops: wait until the cache's version changes (or a full sync is due), wait
out `min_sync_period` since the last sync (kube-proxy's minSyncPeriod: a burst of endpoint
changes becomes one sync), bring the rule set up to date (`proxystate.RuleBuilder`: only the
Services the cache says changed since the last sync, `IncrementalSource.changes_since`; every
Service, by identity, from a source that cannot say) and apply the resulting `RuleChange` with
one `iptables-restore --noflush` (`proxyrender.render_change`). Each table's restore is one
kernel transaction, so there is never a moment without a Service's rules; only the chains
whose rules changed are written, chains that went are deleted, and the one-line-per-Service
fixed chains are edited in place (kube-proxy's partial sync). Nothing in a partial sync walks
every Service: its cost is the change's.

A full sync writes every chain from memory and checks the jumps from the built-in chains
(`iptables -C`, else `-I`): first, every `full_sync_period` (hourly, as kube-proxy; it repairs
rules someone else changed) and after any failure (what the kernel holds is then unknown). Only
the first one reads the kernel (`iptables-save`, seconds at 30,000 rules on nf_tables) to
delete chains of ours an earlier run left; later ones know from memory which chains may linger
(those a failed sync was to delete). A failure (iptables missing, a rule rejected, a timeout)
is logged, counted in `orchestrator_proxy_sync_errors_total` and retried with back-off; the
loop never dies of it. `orchestrator_proxy_sync_duration_seconds{mode}` times each sync
(build + restore).

`Iptables` is the boundary (a Protocol): `ExecIptables` runs the binaries, optionally under a
command prefix (e.g. `ip netns exec NS`, as the tests and the bench do).
"""

from __future__ import annotations

import logging
import math
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import trio

from orchestrator.agent.net.proxyrender import owned_chains, render, render_change
from orchestrator.agent.net.proxyrules import BUILTIN_JUMPS, ProxyConfig, Ruleset
from orchestrator.agent.net.proxystate import RuleBuilder, RuleChange
from orchestrator.kube.objects import Obj
from orchestrator.metrics import REGISTRY, Registry

__all__ = [
    "ExecIptables",
    "IncrementalSource",
    "Iptables",
    "IptablesError",
    "NodeProxy",
    "ProxyOptions",
    "ServiceSource",
]

log = logging.getLogger(__name__)

SYNC_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class IptablesError(Exception):
    """iptables is missing, timed out or refused the rules (the message says which)."""


class Iptables(Protocol):
    async def restore(self, text: str) -> None: ...

    async def save(self) -> str: ...

    async def ensure_jumps(self, jumps: Sequence[tuple[str, str, str]]) -> None: ...


class ServiceSource(Protocol):
    """What the proxy reads (`svccache.ServiceCache` is one)."""

    version: int

    def services(self) -> list[Obj]: ...

    def slices(self) -> list[Obj]: ...

    async def wait_changed(self, version: int) -> int: ...


@runtime_checkable
class IncrementalSource(ServiceSource, Protocol):
    """A source that can say which Services changed (`svccache.ServiceCache` is one)."""

    def service(self, namespace: str, name: str) -> Obj | None: ...

    def slices_for(self, namespace: str, name: str) -> list[Obj]: ...

    def changes_since(self, version: int) -> set[tuple[str, str]] | None:
        """(namespace, name) of the Services whose Service or slices changed after `version`
        (None: not known, e.g. too long ago: read everything)."""
        ...


class ExecIptables:
    """The iptables binaries, run with trio's subprocess API (after `prefix`, if given)."""

    def __init__(self, prefix: Sequence[str] = (), *, timeout: float = 30.0) -> None:
        self.prefix = list(prefix)
        self.timeout = timeout

    async def _run(self, args: list[str], stdin: bytes = b"") -> tuple[int, str, str]:
        cmd = [*self.prefix, *args]
        try:
            with trio.fail_after(self.timeout):
                done = await trio.run_process(
                    cmd, stdin=stdin, capture_stdout=True, capture_stderr=True, check=False
                )
        except FileNotFoundError as exc:
            raise IptablesError(f"{cmd[0]} is not installed: {exc}") from None
        except OSError as exc:
            raise IptablesError(f"cannot run {cmd[0]}: {exc}") from None
        except trio.TooSlowError:
            raise IptablesError(f"{' '.join(args[:2])} took over {self.timeout:g}s") from None
        return (
            done.returncode,
            done.stdout.decode(errors="replace"),
            done.stderr.decode(errors="replace"),
        )

    async def restore(self, text: str) -> None:
        rc, _out, err = await self._run(["iptables-restore", "-w", "5", "--noflush"], text.encode())
        if rc != 0:
            raise IptablesError(f"iptables-restore failed (exit {rc}): {err.strip()}")

    async def save(self) -> str:
        # nat only: our per-service chains live there, and on nf_tables every saved rule costs
        rc, out, err = await self._run(["iptables-save", "-t", "nat"])
        if rc != 0:
            raise IptablesError(f"iptables-save failed (exit {rc}): {err.strip()}")
        return out

    async def ensure_jumps(self, jumps: Sequence[tuple[str, str, str]]) -> None:
        for table, chain, spec in jumps:
            rule = shlex.split(spec)
            rc, _out, _err = await self._run(
                ["iptables", "-w", "5", "-t", table, "-C", chain, *rule]
            )
            if rc == 0:
                continue
            rc, _out, err = await self._run(
                ["iptables", "-w", "5", "-t", table, "-I", chain, *rule]
            )
            if rc != 0:
                raise IptablesError(f"iptables -t {table} -I {chain} failed: {err.strip()}")


@dataclass
class ProxyOptions:
    """The proxy's knobs (seconds)."""

    config: ProxyConfig
    min_sync_period: float = 0.25  # kube-proxy: 1 s; shorter here, one node's Services are few
    full_sync_period: float = 3600.0  # kube-proxy's full resync: hourly
    backoff_initial: float = 1.0
    backoff_max: float = 30.0


class NodeProxy:
    """Keeps the node's iptables rules equal to the Service cache (module doc)."""

    def __init__(
        self,
        source: ServiceSource,
        options: ProxyOptions,
        iptables: Iptables | None = None,
        *,
        metrics: Registry = REGISTRY,
    ) -> None:
        self.source = source
        # (an isinstance of a runtime Protocol costs more than a whole partial update)
        self._incremental = source if isinstance(source, IncrementalSource) else None
        self.opts = options
        self.iptables: Iptables = iptables or ExecIptables()
        self._builder = RuleBuilder(options.config)
        self.in_sync = False  # the kernel holds the builder's rules
        self._kernel_unknown = True  # nothing known of the kernel's chains: read them once
        self._pending = RuleChange()  # built but not yet applied (after a failure)
        self._seen_version = -1  # the source version the builder has seen
        self.syncs = 0  # successful syncs
        self.failures = 0  # failed ones
        self.synced_version = -1
        self._problems: set[str] = set()
        self._duration = metrics.histogram(
            "orchestrator_proxy_sync_duration_seconds",
            "Time to build and apply the node proxy's rules, by mode (full or partial).",
            ["mode"],
            buckets=SYNC_BUCKETS,
        )
        self._errors = metrics.counter(
            "orchestrator_proxy_sync_errors_total", "Failed syncs of the node proxy's rules."
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Sync until cancelled; `started` at once (the first sync follows)."""
        task_status.started()
        backoff = self.opts.backoff_initial
        next_full = -math.inf
        last = -math.inf
        while True:
            version = self.source.version
            full = not self.in_sync or trio.current_time() >= next_full
            try:
                await self.sync(full=full)
            except IptablesError as exc:
                self._errors.inc()
                self.failures += 1
                self.in_sync = False
                log.error("node proxy: %s; retrying in %.1fs", exc, backoff)
                await trio.sleep(backoff)
                backoff = min(backoff * 2, self.opts.backoff_max)
                continue
            backoff = self.opts.backoff_initial
            self.synced_version = version
            last = trio.current_time()
            if full:
                next_full = last + self.opts.full_sync_period
            with trio.move_on_at(next_full):
                await self.source.wait_changed(version)
            await trio.sleep_until(last + self.opts.min_sync_period)

    async def sync(self, *, full: bool) -> None:
        """Bring the rule set up to date and apply it (a full or a partial sync)."""
        start = time.perf_counter()
        version = self.source.version
        change = self._update()
        self._seen_version = version
        self._report()
        self._pending.merge(change)  # a failed sync's change is applied by the next full one
        if full:
            stale: dict[str, set[str]] = {}
            if self._kernel_unknown:  # start: whatever an earlier run left behind
                stale = owned_chains(await self.iptables.save())
            stale.setdefault("nat", set()).update(self._pending.gone)
            text = render(self._builder.ruleset(), None, stale)
        else:
            text = render_change(self._pending, self._builder)
        if text:
            await self.iptables.restore(text)
        if full:
            await self.iptables.ensure_jumps(BUILTIN_JUMPS)
            self._kernel_unknown = False
        self._pending = RuleChange()
        self.in_sync = True
        self.syncs += 1
        elapsed = time.perf_counter() - start
        self._duration.labels("full" if full else "partial").observe(elapsed)
        log.debug("node proxy: %s sync in %.1f ms", "full" if full else "partial", elapsed * 1e3)

    def _update(self) -> RuleChange:
        """The builder brought to the source's state: only the Services changed since the
        last update when the source can say which (`IncrementalSource`), else every one."""
        src = self._incremental
        if src is not None and self._seen_version >= 0:
            keys = src.changes_since(self._seen_version)
            if keys is not None:
                return self._builder.update(keys, src.service, src.slices_for)
        return self._builder.sync_all(self.source.services(), self.source.slices())

    @property
    def applied(self) -> Ruleset | None:
        """The rules the kernel holds (None: unknown, e.g. after a failure); costs every
        Service (tests, benchmarks)."""
        return self._builder.ruleset() if self.in_sync else None

    def _report(self) -> None:
        """Log each problem once while it lasts (a sync a second must not flood the log)."""
        now = set(self._builder.problems())
        for p in sorted(now - self._problems):
            log.warning("node proxy: %s", p)
        self._problems = now
