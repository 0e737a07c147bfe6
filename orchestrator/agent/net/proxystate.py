"""The node proxy's rule set kept up to date Service by Service (pure, no I/O).

`RuleBuilder` holds, per Service, its rules (`proxyrules.port_rules`) with the Service and
slice objects they came from; an update redoes only the Services it is told about (or, given
whole lists, those whose objects are not the same ones as before) and returns a `RuleChange`:
the nat chains to write and delete, and the lines added to and removed from the fixed chains
of one line per Service port. `proxyrender.render_change` turns that into restore text. So the
cost of one endpoint change is that Service's, not the cluster's: nothing here walks every
Service but `sync_all` (identity checks) and `ruleset()` (full syncs, tests).

Invariant: after any sequence of updates, `ruleset()` equals `proxyrules.build` of the Services
and slices last seen, and applying every `RuleChange` in order to the kernel's copy of
`ruleset()` gives the kernel the new one (order within the fixed per-port chains aside).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from orchestrator.agent.net.proxyrules import (
    PORT_CHAINS,
    PortRules,
    ProxyConfig,
    Ruleset,
    ServicePort,
    assemble,
    endpoints_for,
    owner_of,
    port_rules,
    service_ports,
)
from orchestrator.kube.objects import Obj

__all__ = ["RuleBuilder", "RuleChange"]


@dataclass(frozen=True, slots=True)
class _ServiceRules:
    """A Service object, the slice objects it was built with, and the result."""

    svc: Obj
    slices: tuple[Obj, ...]
    ports: tuple[tuple[ServicePort, PortRules], ...]
    problems: tuple[str, ...]
    lines: dict[tuple[str, str], frozenset[str]]  # PORT_CHAINS -> this Service's lines
    chains: dict[str, tuple[str, ...]]  # its nat chains


@dataclass
class RuleChange:
    """What one `RuleBuilder` update changed: nat chains to write (new or changed) and to
    delete, and lines added to / removed from the `PORT_CHAINS` (one line per Service port)."""

    written: set[str] = field(default_factory=set)
    gone: set[str] = field(default_factory=set)
    added: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    removed: dict[tuple[str, str], set[str]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(
            self.written or self.gone or any(self.added.values()) or any(self.removed.values())
        )

    def merge(self, later: RuleChange) -> None:
        """Fold `later` (a change made after this one) into this one."""
        for c in later.written:
            self.written.add(c)
            self.gone.discard(c)
        for c in later.gone:
            self.gone.add(c)
            self.written.discard(c)
        for where, lines in later.added.items():
            for line in lines:
                self._line(where, line, True)
        for where, lines in later.removed.items():
            for line in lines:
                self._line(where, line, False)

    def _line(self, where: tuple[str, str], line: str, add: bool) -> None:
        undo = (self.removed if add else self.added).setdefault(where, set())
        if line in undo:
            undo.discard(line)  # added then removed (or the reverse): nothing to do
        else:
            (self.added if add else self.removed).setdefault(where, set()).add(line)


_NO_LINES: dict[tuple[str, str], frozenset[str]] = {}
_NO_CHAINS: dict[str, tuple[str, ...]] = {}


class RuleBuilder:
    """The rule set, kept up to date Service by Service: `update(keys, ...)` redoes the
    Services named (and nothing else: its cost is the change's, not the cluster's) and returns
    a `RuleChange`; `sync_all(services, slices)` does the same for whole lists (redoing only
    the Services whose object or slice objects are not the ones seen last — by identity:
    informer caches replace objects, never modify them). `ruleset()` materializes the whole,
    sorted rule set (the cost of every Service: full syncs and tests). Pure: no I/O.

    Invariant: the rule set equals `build` of the Services and slices last seen; lines of the
    `PORT_CHAINS` are unique per Service port (they name it), so a set per chain is exact."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self._dns = config.dns_ip
        self._svcs: dict[tuple[str, str], _ServiceRules] = {}
        self._chains: dict[str, tuple[str, ...]] = {}  # every per-service nat chain
        self._problems: dict[tuple[str, str], tuple[str, ...]] = {}

    # ------------------------------------------------------------------ updating
    def build(self, services: Iterable[Obj], slices: Iterable[Obj]) -> Ruleset:
        """`sync_all`, then the whole rule set."""
        self.sync_all(services, slices)
        return self.ruleset()

    def sync_all(self, services: Iterable[Obj], slices: Iterable[Obj]) -> RuleChange:
        """Take the rule set to these Services and slices (every one looked at)."""
        by_service: dict[tuple[str, str], list[Obj]] = {}
        for sl in slices:
            owner = owner_of(sl)
            if owner is not None:
                by_service.setdefault(owner, []).append(sl)
        seen: dict[tuple[str, str], Obj] = {}
        for svc in services:
            meta = svc.get("metadata") or {}
            seen[(str(meta.get("namespace") or ""), str(meta.get("name") or ""))] = svc
        change = RuleChange()
        for key, svc in seen.items():
            self._set(key, svc, by_service.get(key, ()), change)
        for key in [k for k in self._svcs if k not in seen]:
            self._set(key, None, (), change)
        return change

    def update(
        self,
        keys: Iterable[tuple[str, str]],
        service: Callable[[str, str], Obj | None],
        slices_for: Callable[[str, str], Iterable[Obj]],
    ) -> RuleChange:
        """Redo the Services `keys` ((namespace, name)), read through `service` (None: gone)
        and `slices_for`; the others are left as they are."""
        change = RuleChange()
        for key in keys:
            svc = service(*key)
            self._set(key, svc, slices_for(*key) if svc is not None else (), change)
        return change

    def _set(
        self, key: tuple[str, str], svc: Obj | None, own: Iterable[Obj], change: RuleChange
    ) -> None:
        slices = tuple(own)
        old = self._svcs.get(key)
        if (
            old is not None
            and old.svc is svc
            and len(old.slices) == len(slices)
            and all(a is b for a, b in zip(old.slices, slices, strict=True))
        ):
            return
        new = self._service_rules(svc, slices) if svc is not None else None
        if new is None:
            self._svcs.pop(key, None)
            self._problems.pop(key, None)
        else:
            self._svcs[key] = new
            if new.problems:
                self._problems[key] = new.problems
            else:
                self._problems.pop(key, None)
        old_lines = old.lines if old is not None else _NO_LINES
        new_lines = new.lines if new is not None else _NO_LINES
        for where in PORT_CHAINS:
            before, after = old_lines.get(where, frozenset()), new_lines.get(where, frozenset())
            if before != after:
                for line in after - before:
                    change._line(where, line, True)
                for line in before - after:
                    change._line(where, line, False)
        old_chains = old.chains if old is not None else _NO_CHAINS
        new_chains = new.chains if new is not None else _NO_CHAINS
        for c in old_chains:
            if c not in new_chains and self._chains.pop(c, None) is not None:
                change.gone.add(c)
                change.written.discard(c)
        for c, rules in new_chains.items():
            if self._chains.get(c) != rules:
                self._chains[c] = rules
                change.written.add(c)
                change.gone.discard(c)

    def _service_rules(self, svc: Obj, own: tuple[Obj, ...]) -> _ServiceRules:
        problems: list[str] = []
        out: list[tuple[ServicePort, PortRules]] = []
        for sp in service_ports(svc, problems):
            if sp.cluster_ip == self._dns:
                problems.append(f"Service {sp.key}: its ClusterIP is the cluster DNS; skipped")
                continue
            out.append((sp, port_rules(sp, endpoints_for(sp, own), self.config, self._dns)))
        lines: dict[tuple[str, str], set[str]] = {}
        chains: dict[str, tuple[str, ...]] = {}
        for _sp, pr in out:
            for where, got in zip(
                PORT_CHAINS, (pr.services, pr.nodeports, pr.reject, pr.external), strict=True
            ):
                if got:
                    lines.setdefault(where, set()).update(got)
            chains.update(pr.chains)
        return _ServiceRules(
            svc,
            own,
            tuple(out),
            tuple(problems),
            {where: frozenset(v) for where, v in lines.items()},
            chains,
        )

    # ------------------------------------------------------------------ reading
    def problems(self) -> list[str]:
        """What was skipped and why, for every Service (the ones with problems only)."""
        return [p for key in sorted(self._problems) for p in self._problems[key]]

    def chain(self, name: str) -> tuple[str, ...]:
        """The rules of one per-service nat chain (() if there is none)."""
        return self._chains.get(name, ())

    def ruleset(self) -> Ruleset:
        """The whole rule set, sorted (as `build`): costs every Service."""
        ports = [pair for sr in self._svcs.values() for pair in sr.ports]
        ports.sort(key=lambda pair: (pair[0].key, pair[0].protocol))
        return assemble([pr for _sp, pr in ports], self._dns, self.problems())
