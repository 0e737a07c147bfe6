"""The node proxy's rules as `iptables-restore --noflush` text: a full write, or the difference
from the rules applied last (kube-proxy's partial sync, and a little more).

`render(new, old)`: with `old` unknown (None) every chain of ours is written (declaring a chain
flushes it), plus `-X` for `stale` chains found by `iptables-save` (`owned_chains`). With `old`
known only chains whose rules changed are written, `-X` deletes the chains that went, and in
the `UNORDERED` chains (one rule per Service port: order does not change what matches) up to
`EDIT_LIMIT` changed rules are deleted/inserted one by one (`-D`, `-I`) instead of rewriting a
chain of a thousand rules. `render_change(change, builder)` does the same from a
`proxystate.RuleChange` (what one update changed) without comparing whole rule sets: its cost
is the change's. Each table is one `COMMIT`: one kernel transaction, never a moment
without a Service's rules. Pure: text in, text out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from orchestrator.agent.net.proxyrules import FIXED, OWNED_PREFIXES, TABLES, Ruleset
from orchestrator.agent.net.proxystate import RuleBuilder, RuleChange

__all__ = ["EDIT_LIMIT", "UNORDERED", "owned_chains", "render", "render_change"]


# Chains whose rules match disjoint packets (one Service port each) but for a fixed first
# rule (the cluster DNS RETURN) and, in nat KUBE-SERVICES, a fixed last one (the NodePorts
# jump): their order does not matter, so a few changed rules are edited in place (`-D`, `-I`
# after the fixed first rule) instead of rewriting a chain of one rule per Service.
UNORDERED = {
    ("nat", "KUBE-SERVICES"): 2,  # (table, chain): the position new rules are inserted at
    ("nat", "KUBE-NODEPORTS"): 1,
    ("filter", "KUBE-SERVICES"): 1,
    ("filter", "KUBE-EXTERNAL-SERVICES"): 2,
}
EDIT_LIMIT = 64  # more changed rules than this in such a chain: rewrite it


def render(
    new: Ruleset,
    old: Ruleset | None = None,
    stale: Mapping[str, Iterable[str]] | None = None,
) -> str:
    """The `iptables-restore --noflush` text taking the kernel from `old` (None: unknown, write
    everything) to `new`; `stale`: more chains of ours known to exist (from `iptables-save`) to
    delete. Only chains whose rules changed are written; in the `UNORDERED` chains up to
    `EDIT_LIMIT` changed rules are deleted/inserted one by one (kernel order may then differ
    from `new`'s, which does not change what matches). A table whose rules did not change is
    left out; "" when nothing changed."""
    out: list[str] = []
    for table in TABLES:
        chains = new.chains(table)
        before = old.chains(table) if old is not None else None
        gone = set(stale.get(table, ()) if stale else ()) - set(chains)
        if before is None:
            write = [*FIXED[table], *sorted(c for c in chains if c not in FIXED[table])]
            edits: list[str] = []
        else:
            gone.update(c for c in before if c not in chains)
            write, edits = _changes(table, chains, before)
        if not (write or edits or gone):
            continue
        out.append(f"*{table}")
        out.extend(f":{c} - [0:0]" for c in [*write, *sorted(gone)])
        for c in write:
            out.extend(chains.get(c, ()))
        out.extend(edits)
        out.extend(f"-X {c}" for c in sorted(gone))
        out.append("COMMIT")
    return "\n".join(out) + "\n" if out else ""


def render_change(change: RuleChange, builder: RuleBuilder) -> str:
    """The `iptables-restore --noflush` text applying `change` (made by `builder`, whose state
    is the new one) to a kernel holding the rules before it; "" when nothing changed. Removed
    per-port lines are deleted (`-D`) before the chains they jumped to go (`-X`)."""
    out: list[str] = []
    for table in TABLES:
        write = sorted(change.written) if table == "nat" else []
        gone = sorted(change.gone) if table == "nat" else []
        rewrite: list[str] = []
        edits: list[str] = []
        for (t, c), pos in UNORDERED.items():
            added, removed = change.added.get((t, c), set()), change.removed.get((t, c), set())
            if t != table or not (added or removed):
                continue
            if len(added) + len(removed) > EDIT_LIMIT:
                rewrite.append(c)
                continue
            head = f"-A {c} "
            edits.extend(f"-D {c} {r[len(head) :]}" for r in sorted(removed))
            edits.extend(f"-I {c} {pos} {r[len(head) :]}" for r in sorted(added))
        if not (write or gone or rewrite or edits):
            continue
        whole = builder.ruleset().chains(table) if rewrite else {}
        out.append(f"*{table}")
        out.extend(f":{c} - [0:0]" for c in [*rewrite, *write, *gone])
        for c in rewrite:
            out.extend(whole.get(c, ()))
        for c in write:
            out.extend(builder.chain(c))
        out.extend(edits)
        out.extend(f"-X {c}" for c in gone)
        out.append("COMMIT")
    return "\n".join(out) + "\n" if out else ""


def _changes(
    table: str, chains: Mapping[str, tuple[str, ...]], before: Mapping[str, tuple[str, ...]]
) -> tuple[list[str], list[str]]:
    """(chains to rewrite, in-place edits) taking `before` to `chains`."""
    write: list[str] = []
    edits: list[str] = []
    fixed = FIXED[table]
    # identity first: a RuleBuilder hands back the same tuple for an unchanged chain, so the
    # usual change touches a handful of the thousands of chains and only those are compared
    moved = sorted(c for c, rules in chains.items() if before.get(c) is not rules)
    for c in [*fixed, *(c for c in moved if c not in fixed)]:
        rules, old = chains.get(c, ()), before.get(c)
        if old is rules:
            continue
        pos = UNORDERED.get((table, c))
        if pos is None or old is None:
            if old != rules:
                write.append(c)
            continue
        old_set, new_set = set(old), set(rules)
        if old_set == new_set:
            continue
        removed, added = old_set - new_set, new_set - old_set
        if len(removed) + len(added) > EDIT_LIMIT or old[: pos - 1] != rules[: pos - 1]:
            write.append(c)
            continue
        head = f"-A {c} "
        edits.extend(f"-D {c} {r[len(head) :]}" for r in sorted(removed))
        edits.extend(f"-I {c} {pos} {r[len(head) :]}" for r in sorted(added))
    return write, edits


def owned_chains(save_text: str) -> dict[str, set[str]]:
    """Our per-service chains found in `iptables-save` output, by table."""
    found: dict[str, set[str]] = {}
    table = ""
    for line in save_text.splitlines():
        if line.startswith("*"):
            table = line[1:].strip()
        elif line.startswith(":") and line[1:].startswith(OWNED_PREFIXES):
            found.setdefault(table, set()).add(line[1:].split()[0])
    return found
