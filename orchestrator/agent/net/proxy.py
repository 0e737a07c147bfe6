"""The node proxy's driver: Service cache -> `proxyrules` -> `iptables-restore`, incrementally.

Theory of operation
-------------------
`NodeProxy.run` loops: wait until the cache's version changes (or a full sync is due), wait
out `min_sync_period` since the last sync (kube-proxy's minSyncPeriod: a burst of endpoint
changes becomes one sync), build the whole rule set from the cache (pure,
`proxyrules.RuleBuilder`, which redoes only the Services whose objects changed) and apply the
difference to the last applied set with one `iptables-restore --noflush` per changed table.
Each table's restore is one kernel transaction, so there is never a moment without a Service's
rules; only the chains whose rules changed are written, plus the fixed
top-level chains, and chains that went are deleted (kube-proxy's partial sync).

A full sync — every chain written, our chains that `iptables-save` shows but the rule set does
not have deleted, the jumps from the built-in chains checked (`iptables -C`, else `-I`) — is
made first, every `full_sync_period`, and after any failure (the kernel's state is then
unknown). A failure (iptables missing, a rule rejected, a timeout) is logged, counted in
`orchestrator_proxy_sync_errors_total` and retried with back-off; the loop never dies of it.
`orchestrator_proxy_sync_duration_seconds{mode}` times each sync (build + restore).

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
from typing import Protocol

import trio

from orchestrator.agent.net.proxyrender import owned_chains, render
from orchestrator.agent.net.proxyrules import (
    BUILTIN_JUMPS,
    ProxyConfig,
    RuleBuilder,
    Ruleset,
)
from orchestrator.kube.objects import Obj
from orchestrator.metrics import REGISTRY, Registry

__all__ = ["ExecIptables", "Iptables", "IptablesError", "NodeProxy", "ProxyOptions"]

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
        rc, out, err = await self._run(["iptables-save"])
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
    full_sync_period: float = 300.0
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
        self.opts = options
        self.iptables: Iptables = iptables or ExecIptables()
        self.applied: Ruleset | None = None  # what the kernel holds; None: unknown
        self._builder = RuleBuilder(options.config)
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
            full = self.applied is None or trio.current_time() >= next_full
            try:
                await self.sync(full=full)
            except IptablesError as exc:
                self._errors.inc()
                self.failures += 1
                self.applied = None
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
        """Build the rules and apply them (a full or a partial sync)."""
        start = time.perf_counter()
        rules = self._builder.build(self.source.services(), self.source.slices())
        self._report(rules.problems)
        if full:
            stale = owned_chains(await self.iptables.save())
            text = render(rules, None, stale)
        else:
            text = render(rules, self.applied)
        if text:
            await self.iptables.restore(text)
        if full:
            await self.iptables.ensure_jumps(BUILTIN_JUMPS)
        self.applied = rules
        self.syncs += 1
        elapsed = time.perf_counter() - start
        self._duration.labels("full" if full else "partial").observe(elapsed)
        log.debug("node proxy: %s sync in %.1f ms", "full" if full else "partial", elapsed * 1e3)

    def _report(self, problems: list[str]) -> None:
        """Log each problem once while it lasts (a sync a second must not flood the log)."""
        now = set(problems)
        for p in sorted(now - self._problems):
            log.warning("node proxy: %s", p)
        self._problems = now
