"""A tiny interpreter of the iptables rules `proxyrules` writes, for the model test.

It knows only the matches and targets the generator uses. For one packet it follows every
path through the chains (a `-m statistic` or `-m recent --rcheck` match may or may not match,
so both branches are taken) and returns the set of outcomes: `("dnat", "ip:port", masq)`,
`("REJECT"|"DROP", "", False)` or `("pass", "", False)` — which endpoints the packet can reach
and whether it is masqueraded, or what the filter table does with it.
"""

from __future__ import annotations

import ipaddress
import shlex
from collections.abc import Iterator
from dataclasses import dataclass

Outcome = tuple[str, str, bool]


@dataclass(frozen=True)
class Packet:
    src: str
    dst: str
    proto: str
    dport: int


def parse(text: str) -> dict[str, dict[str, list[list[str]]]]:
    """restore text -> table -> chain -> rules (token lists after `-A CHAIN`)."""
    tables: dict[str, dict[str, list[list[str]]]] = {}
    table = ""
    for line in text.splitlines():
        if line.startswith("*"):
            table = line[1:]
            tables[table] = {}
        elif line.startswith(":"):
            tables[table].setdefault(line[1:].split()[0], [])
        elif line.startswith("-A "):
            tokens = shlex.split(line)
            tables[table][tokens[1]].append(tokens[2:])
        elif line.startswith("-X ") or line == "COMMIT":
            continue
        else:
            raise AssertionError(f"unexpected line {line!r}")
    return tables


def _in(addr: str, net: str) -> bool:
    return ipaddress.ip_address(addr) in ipaddress.ip_network(net, strict=False)


class Interpreter:
    def __init__(self, text: str, local: set[str]) -> None:
        self.tables = parse(text)
        self.local = local

    def _matches(self, rule: list[str], pkt: Packet, mark: bool) -> Iterator[bool]:
        """Yields once per way the rule's matches can go (True: all matched)."""
        i, neg, forks = 0, False, 0
        ok = True
        while i < len(rule):
            tok = rule[i]
            if tok == "!":
                neg = True
                i += 1
                continue
            if tok == "-j":
                break
            if tok in ("-s", "-d"):
                addr = pkt.src if tok == "-s" else pkt.dst
                hit = _in(addr, rule[i + 1])
                ok &= hit != neg
                i += 2
            elif tok == "-p":
                ok &= (pkt.proto == rule[i + 1]) != neg
                i += 2
            elif tok == "--dport":
                ok &= (pkt.dport == int(rule[i + 1])) != neg
                i += 2
            elif tok == "-m":
                i += 2  # the module's options follow
            elif tok == "--comment":
                i += 2
            elif tok in ("--dst-type", "--src-type"):
                addr = pkt.dst if tok == "--dst-type" else pkt.src
                assert rule[i + 1] == "LOCAL"
                ok &= (addr in self.local) != neg
                i += 2
            elif tok == "--mode":
                i += 2
            elif tok == "--probability":
                if float(rule[i + 1]) < 1.0:
                    forks += 1
                i += 2
            elif tok == "--rcheck":
                forks += 1
                i += 1
            elif tok in ("--name", "--mask", "--seconds"):
                i += 2
            elif tok in ("--rsource", "--reap", "--set"):
                i += 1
            elif tok == "--mark":
                ok &= mark != neg
                i += 2
            elif tok == "--ctstate":
                ok &= ("NEW" in rule[i + 1].split(",")) != neg  # every packet here is NEW
                i += 2
            else:
                raise AssertionError(f"unknown match {tok!r} in {rule}")
            neg = False
        if not ok:
            yield False
            return
        if forks:
            yield False
        yield True

    def walk(
        self, table: str, chain: str, pkt: Packet, mark: bool
    ) -> Iterator[tuple[str, Outcome]]:
        """("return", (.., .., mark)) when the chain falls through, ("final", outcome)."""
        yield from self._walk(table, chain, pkt, mark, 0, 0)

    def _walk(
        self, table: str, chain: str, pkt: Packet, mark: bool, start: int, depth: int
    ) -> Iterator[tuple[str, Outcome]]:
        assert depth < 20, "a jump loop"
        rules = self.tables[table][chain]
        for idx in range(start, len(rules)):
            rule = rules[idx]
            jump = rule.index("-j")
            target = rule[jump + 1]
            outcomes = list(self._matches(rule, pkt, mark))
            if outcomes == [False]:
                continue
            if False in outcomes:  # the not-matched branch continues with the next rule
                yield from self._walk(table, chain, pkt, mark, idx + 1, depth)
            if target == "RETURN":
                yield ("return", ("", "", mark))
            elif target == "DNAT":
                yield ("final", ("dnat", rule[jump + 3], mark))
            elif target in ("REJECT", "DROP", "ACCEPT"):
                yield ("final", (target, "", False))
            elif target == "MARK":
                mark = rule[jump + 2] == "--or-mark"
                continue
            elif target == "MASQUERADE":
                yield ("final", ("masquerade", "", mark))
            else:
                for kind, res in self._walk(table, target, pkt, mark, 0, depth + 1):
                    if kind == "final":
                        yield (kind, res)
                    else:
                        yield from self._walk(table, chain, pkt, res[2], idx + 1, depth)
            return
        yield ("return", ("", "", mark))

    def outcomes(self, pkt: Packet, *, from_local: bool = False) -> set[Outcome]:
        """What happens to `pkt` arriving (or, `from_local`, sent by the node)."""
        result: set[Outcome] = set()
        for kind, res in self.walk("nat", "KUBE-SERVICES", pkt, False):
            if kind == "final":
                result.add(res)
                continue
            # not NATed: the filter table decides
            if pkt.dst in self.local:
                chains = ["KUBE-EXTERNAL-SERVICES"]
            elif from_local:
                chains = ["KUBE-SERVICES"]
            else:
                chains = ["KUBE-FORWARD", "KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES"]
            verdicts: set[Outcome] = set()
            for c in chains:
                finals = [r for k, r in self.walk("filter", c, pkt, res[2]) if k == "final"]
                if finals:
                    verdicts.update(finals)
                    break
            result |= verdicts or {("pass", "", False)}
        return result
