"""The node proxy's rules: Services + EndpointSlices -> `iptables-restore` text (pure, no I/O).

Theory of operation
-------------------
kube-proxy's iptables mode, chain for chain, so anyone who knows it can read `iptables-save`:

nat table (jumped to from PREROUTING and OUTPUT -> KUBE-SERVICES, POSTROUTING ->
KUBE-POSTROUTING; `BUILTIN_JUMPS`):

* `KUBE-SERVICES`: first `-d <cluster DNS> -j RETURN` (the node-local DNS answers on that
  address itself and must never be NATed), then per Service port with endpoints its ClusterIP
  -> `KUBE-SVC-<h>`, its external IPs and LoadBalancer ingress IPs -> `KUBE-EXT-<h>`; last
  `-m addrtype --dst-type LOCAL -j KUBE-NODEPORTS` (NodePorts on every node address).
* `KUBE-SVC-<h>`: `! -s <cluster CIDR> -d <ClusterIP>` -> KUBE-MARK-MASQ (traffic from outside
  the pod network is masqueraded, masqueradeAll off); with `sessionAffinity: ClientIP` one
  `-m recent --rcheck --reap` jump per endpoint; then the endpoints at random
  (`--probability 1/n, 1/(n-1), ...`, the last unconditional).
* `KUBE-SEP-<h>`: `-s <endpoint>` -> KUBE-MARK-MASQ (hairpin: a pod reaching itself), then DNAT
  (with `-m recent --set` under affinity).
* `KUBE-EXT-<h>` (NodePort/LB/external IP): `externalTrafficPolicy: Cluster` marks for
  masquerade and goes to KUBE-SVC; `Local` sends pod traffic and node-local traffic (masqueraded)
  to KUBE-SVC and the rest to `KUBE-SVL-<h>`: local endpoints only, source kept. Without local
  endpoints the external traffic is dropped in filter (below).
* `KUBE-MARK-MASQ` sets mark 0x4000; `KUBE-POSTROUTING` masquerades marked packets.

filter table (INPUT -> KUBE-EXTERNAL-SERVICES; FORWARD -> KUBE-FORWARD, KUBE-SERVICES,
KUBE-EXTERNAL-SERVICES; OUTPUT -> KUBE-SERVICES): a Service port without endpoints is REJECTed
(ClusterIP in KUBE-SERVICES; NodePort/LB/external IPs in KUBE-EXTERNAL-SERVICES), one with
`Local` policy and no local endpoint DROPs external traffic; KUBE-FORWARD accepts marked and
established traffic.

Endpoints (kube-proxy's CategorizeEndpoints without topology): the ready ones; when none is
ready, the serving-and-terminating ones. Local endpoints: the same rule among those on this
node. A slice belongs to its Service by the `kubernetes.io/service-name` label; ports match by
name and protocol; endpoints are deduplicated by (ip, port).

Names: `KUBE-SVC-` + base32(sha256("ns/name:port" + protocol))[:16], SEP adds "ip:port" — as
kube-proxy, so chain names are stable across restarts and versions.

`build` returns a `Ruleset` (table -> chain -> rule lines); `proxystate.RuleBuilder` keeps the
same result up to date one Service at a time from the parts here (`port_rules`, `assemble`);
`proxyrender.render(new, old)` turns it into `iptables-restore --noflush` text. Everything is
sorted: the same input gives the same rules.

Invariants: no rule names the cluster DNS address except the RETURNs (nat KUBE-SERVICES and
filter KUBE-EXTERNAL-SERVICES, whose `--dst-type LOCAL` rules would otherwise see it); every
chain a rule jumps to is declared in the same text or survives from `old`; bad objects
(no/invalid ClusterIP, bad ports) are skipped with a message in `Ruleset.problems`, never an
exception.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.network.settings import DEFAULT_CLUSTER_CIDR, DEFAULT_CLUSTER_DNS

__all__ = [
    "BUILTIN_JUMPS",
    "FIXED",
    "OWNED_PREFIXES",
    "PORT_CHAINS",
    "TABLES",
    "Endpoint",
    "PortRules",
    "ProxyConfig",
    "Ruleset",
    "ServicePort",
    "assemble",
    "build",
    "build_from_ports",
    "chain_name",
    "endpoints_for",
    "owner_of",
    "port_rules",
    "service_ports",
]

Obj = dict[str, Any]

MASQ_MARK = "0x4000"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
TABLES = ("filter", "nat")
NAT_FIXED = ("KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-MARK-MASQ")
FILTER_FIXED = ("KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-FORWARD")
FIXED = {"nat": NAT_FIXED, "filter": FILTER_FIXED}
OWNED_PREFIXES = ("KUBE-SVC-", "KUBE-SEP-", "KUBE-EXT-", "KUBE-SVL-")
_NEW = "-m conntrack --ctstate NEW"

# (table, built-in chain, rule spec): the jumps into our chains; the driver makes sure each
# exists once (`iptables -C` / `-I`), since `--noflush` restores cannot do that idempotently.
BUILTIN_JUMPS: tuple[tuple[str, str, str], ...] = (
    ("nat", "PREROUTING", '-m comment --comment "kubernetes service portals" -j KUBE-SERVICES'),
    ("nat", "OUTPUT", '-m comment --comment "kubernetes service portals" -j KUBE-SERVICES'),
    ("nat", "POSTROUTING", '-m comment --comment "kubernetes postrouting" -j KUBE-POSTROUTING'),
    ("filter", "INPUT", f"{_NEW} -j KUBE-EXTERNAL-SERVICES"),
    ("filter", "FORWARD", "-j KUBE-FORWARD"),
    ("filter", "FORWARD", f"{_NEW} -j KUBE-SERVICES"),
    ("filter", "FORWARD", f"{_NEW} -j KUBE-EXTERNAL-SERVICES"),
    ("filter", "OUTPUT", f"{_NEW} -j KUBE-SERVICES"),
)


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    """What the rules depend on besides Services and slices."""

    node_name: str
    cluster_cidr: str  # "10.42.0.0/16"
    cluster_dns: str  # "10.43.0.10": never NATed

    @classmethod
    def create(
        cls, node_name: str, cluster_cidr: str | None = None, cluster_dns: str | None = None
    ) -> ProxyConfig:
        """Checked settings (k3s's defaults for what is None); ValueError naming the flag."""
        cidr = cluster_cidr or DEFAULT_CLUSTER_CIDR
        dns = (cluster_dns or DEFAULT_CLUSTER_DNS).split(",")[0]
        try:
            net = ipaddress.ip_network(cidr, strict=True)
        except ValueError as exc:
            raise ValueError(f"--cluster-cidr {cidr!r} is not a network: {exc}") from None
        ip = _ip(dns)
        if ip is None:
            raise ValueError(f"--cluster-dns {dns!r} is not an IP address")
        return cls(node_name, str(net), ip)

    @property
    def dns_ip(self) -> str:
        """`cluster_dns` in canonical form (the rules compare addresses as text)."""
        return _ip(self.cluster_dns) or self.cluster_dns


@dataclass(frozen=True, slots=True)
class ServicePort:
    """One port of one Service, as the rules need it."""

    namespace: str
    name: str
    port_name: str
    protocol: str  # "tcp", "udp", "sctp"
    cluster_ip: str
    port: int
    node_port: int = 0  # 0: none
    external_ips: tuple[str, ...] = ()  # spec.externalIPs and status.loadBalancer.ingress
    local_external: bool = False  # externalTrafficPolicy: Local
    affinity_seconds: int = 0  # sessionAffinity: ClientIP timeout; 0: none

    @property
    def key(self) -> str:
        """kube-proxy's ServicePortName: `ns/name:port` (`ns/name` for an unnamed port)."""
        base = f"{self.namespace}/{self.name}"
        return f"{base}:{self.port_name}" if self.port_name else base


@dataclass(frozen=True, slots=True)
class Endpoint:
    ip: str
    port: int
    ready: bool = True
    serving: bool = True
    terminating: bool = False
    node: str = ""

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"


@dataclass
class Ruleset:
    """table -> chain -> rule lines (`-A CHAIN ...`); `problems`: what was skipped and why."""

    tables: dict[str, dict[str, tuple[str, ...]]]
    problems: list[str] = field(default_factory=list)

    def chains(self, table: str) -> dict[str, tuple[str, ...]]:
        return self.tables.get(table, {})


def chain_name(prefix: str, sp: ServicePort, endpoint: str = "") -> str:
    """`KUBE-SVC-...` and friends: kube-proxy's base32 sha256 names (stable)."""
    digest = hashlib.sha256((sp.key + sp.protocol + endpoint).encode()).digest()
    return prefix + base64.b32encode(digest[:10]).decode()  # 10 bytes: the first 16 characters


# ---------------------------------------------------------------------------------- parsing
@functools.lru_cache(maxsize=65536)
def _ip_text(text: str) -> str | None:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


def _ip(value: Any) -> str | None:
    """The address in canonical form, or None if `value` is not one (memoized: hot)."""
    return _ip_text(value) if isinstance(value, str) else _ip_text(str(value))


def _port(value: Any) -> int | None:
    return value if isinstance(value, int) and 0 < value < 65536 else None


def service_ports(svc: Obj, problems: list[str] | None = None) -> list[ServicePort]:
    """The proxied ports of a Service (none for headless/ExternalName ones or bad ones)."""
    meta = svc.get("metadata") or {}
    spec = svc.get("spec") or {}
    ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    where = f"Service {ns}/{name}"
    if spec.get("type") == "ExternalName":
        return []
    raw_ip = spec.get("clusterIP")
    if raw_ip in (None, "", "None"):
        return []  # headless: DNS only
    cluster_ip = _ip(raw_ip)
    if cluster_ip is None:
        if problems is not None:
            problems.append(f"{where}: spec.clusterIP {raw_ip!r} is not an IP address; skipped")
        return []
    extra: list[str] = []
    for raw in spec.get("externalIPs") or []:
        ip = _ip(raw)
        if ip is None and problems is not None:
            problems.append(f"{where}: externalIPs entry {raw!r} is not an IP address")
        elif ip is not None:
            extra.append(ip)
    for ing in ((svc.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []:
        ip = _ip((ing or {}).get("ip")) if isinstance(ing, dict) and ing.get("ip") else None
        if ip is not None:
            extra.append(ip)
    externals = tuple(sorted(set(extra)))
    local = spec.get("externalTrafficPolicy") == "Local" and spec.get("type") in (
        "NodePort",
        "LoadBalancer",
    )
    affinity = 0
    if spec.get("sessionAffinity") == "ClientIP":
        cfg = (spec.get("sessionAffinityConfig") or {}).get("clientIP") or {}
        timeout = cfg.get("timeoutSeconds", 10800)
        affinity = timeout if isinstance(timeout, int) and 0 < timeout <= 86400 else 10800
    out: list[ServicePort] = []
    for p in spec.get("ports") or []:
        if not isinstance(p, dict):
            continue
        port = _port(p.get("port"))
        proto = str(p.get("protocol") or "TCP").lower()
        if port is None or proto not in ("tcp", "udp", "sctp"):
            if problems is not None:
                problems.append(f"{where}: port {p!r} has a bad port or protocol; skipped")
            continue
        node_port = (
            _port(p.get("nodePort")) if spec.get("type") in ("NodePort", "LoadBalancer") else None
        )
        out.append(
            ServicePort(
                ns,
                name,
                str(p.get("name") or ""),
                proto,
                cluster_ip,
                port,
                node_port or 0,
                externals,
                local,
                affinity,
            )
        )
    return out


def endpoints_for(sp: ServicePort, slices: Iterable[Obj]) -> tuple[Endpoint, ...]:
    """The endpoints of `sp` in `slices` (the Service's own slices), deduplicated and sorted."""
    found: dict[tuple[str, int], Endpoint] = {}
    for sl in slices:
        if sl.get("addressType", "IPv4") not in ("IPv4", "IPv6"):
            continue
        port = None
        for p in sl.get("ports") or []:
            if not isinstance(p, dict):
                continue
            proto = str(p.get("protocol") or "TCP").lower()
            if str(p.get("name") or "") == sp.port_name and proto == sp.protocol:
                port = _port(p.get("port"))
                break
        if port is None:
            continue
        for ep in sl.get("endpoints") or []:
            if not isinstance(ep, dict):
                continue
            addresses = ep.get("addresses") or []
            ip = _ip(addresses[0]) if addresses else None
            if ip is None:
                continue
            cond = ep.get("conditions") or {}
            ready = cond.get("ready") is not False  # nil means ready (API docs)
            serving = cond.get("serving", ready) is not False
            terminating = cond.get("terminating") is True
            e = Endpoint(ip, port, ready, serving, terminating, str(ep.get("nodeName") or ""))
            found.setdefault((ip, port), e)
    return tuple(found[k] for k in sorted(found))


def usable(endpoints: Iterable[Endpoint]) -> list[Endpoint]:
    """Ready endpoints, else serving-and-terminating ones (kube-proxy's fallback)."""
    eps = list(endpoints)
    ready = [e for e in eps if e.ready]
    return ready or [e for e in eps if e.serving and e.terminating]


# ---------------------------------------------------------------------------------- building
def _match(sp: ServicePort, port: int) -> str:
    return f"-p {sp.protocol} -m {sp.protocol} --dport {port}"


def _endpoint_chains(
    chain: str, sp: ServicePort, eps: list[Endpoint], out: dict[str, list[str]], head: list[str]
) -> None:
    """`chain` balancing over `eps` (after the `head` rules), and each endpoint's SEP chain."""
    rules = list(head)
    seps = [(chain_name("KUBE-SEP-", sp, e.address), e) for e in eps]
    if sp.affinity_seconds:
        for sep, e in seps:
            rules.append(
                f'-A {chain} -m comment --comment "{sp.key} -> {e.address}" -m recent --name '
                f"{sep} --mask 255.255.255.255 --rsource --rcheck --seconds "
                f"{sp.affinity_seconds} --reap -j {sep}"
            )
    n = len(seps)
    for i, (sep, e) in enumerate(seps):
        stat = (
            f" -m statistic --mode random --probability {1.0 / (n - i):0.10f}" if i < n - 1 else ""
        )
        rules.append(f'-A {chain} -m comment --comment "{sp.key} -> {e.address}"{stat} -j {sep}')
        recent = (
            f" -m recent --set --name {sep} --mask 255.255.255.255 --rsource"
            if sp.affinity_seconds
            else ""
        )
        out[sep] = [
            f'-A {sep} -s {e.ip}/32 -m comment --comment "{sp.key}" -j KUBE-MARK-MASQ',
            f'-A {sep} -p {sp.protocol} -m comment --comment "{sp.key}"{recent} -m {sp.protocol}'
            f" -j DNAT --to-destination {e.address}",
        ]
    out[chain] = rules


def build(
    services: Iterable[Obj],
    slices: Iterable[Obj],
    config: ProxyConfig,
) -> Ruleset:
    """The full rule set for these Services and EndpointSlices (see the module doc); the
    incremental `proxystate.RuleBuilder` keeps the same result up to date."""
    by_service: dict[tuple[str, str], list[Obj]] = {}
    for sl in slices:
        owner = owner_of(sl)
        if owner is not None:
            by_service.setdefault(owner, []).append(sl)
    problems: list[str] = []
    ports: list[tuple[ServicePort, tuple[Endpoint, ...]]] = []
    for svc in services:
        for sp in service_ports(svc, problems):
            own = by_service.get((sp.namespace, sp.name), ())
            ports.append((sp, endpoints_for(sp, own)))
    ports.sort(key=lambda pair: (pair[0].key, pair[0].protocol))
    return build_from_ports(ports, config, problems)


@dataclass(frozen=True, slots=True)
class PortRules:
    """What one Service port adds: lines of the fixed chains, and its own nat chains."""

    services: tuple[str, ...] = ()  # nat KUBE-SERVICES
    nodeports: tuple[str, ...] = ()  # nat KUBE-NODEPORTS
    reject: tuple[str, ...] = ()  # filter KUBE-SERVICES
    external: tuple[str, ...] = ()  # filter KUBE-EXTERNAL-SERVICES
    chains: tuple[tuple[str, tuple[str, ...]], ...] = ()


# the fixed chains one line per Service port goes to, in `PortRules` field order
PORT_CHAINS = (
    ("nat", "KUBE-SERVICES"),
    ("nat", "KUBE-NODEPORTS"),
    ("filter", "KUBE-SERVICES"),
    ("filter", "KUBE-EXTERNAL-SERVICES"),
)


def owner_of(sl: Obj) -> tuple[str, str] | None:
    """(namespace, Service name) of an EndpointSlice, by its service-name label."""
    meta = sl.get("metadata") or {}
    owner = (meta.get("labels") or {}).get(SERVICE_NAME_LABEL)
    return (str(meta.get("namespace") or ""), str(owner)) if owner else None


def build_from_ports(
    ports: Iterable[tuple[ServicePort, tuple[Endpoint, ...]]],
    config: ProxyConfig,
    problems: list[str] | None = None,
) -> Ruleset:
    """`build` from parsed Service ports and their endpoints, in the given order."""
    dns = _ip(config.cluster_dns) or config.cluster_dns
    found = problems if problems is not None else []
    rules: list[PortRules] = []
    for sp, eps in ports:
        if sp.cluster_ip == dns:
            found.append(f"Service {sp.key}: its ClusterIP is the cluster DNS; skipped")
        else:
            rules.append(port_rules(sp, eps, config, dns))
    return assemble(rules, dns, found)


def assemble(ports: list[PortRules], dns: str, problems: list[str]) -> Ruleset:
    """The tables: the fixed chains around the Service ports' lines, and their chains."""
    dns_return = f'-d {dns}/32 -m comment --comment "cluster DNS is node-local" -j RETURN'
    nat_services = [f"-A KUBE-SERVICES {dns_return}"]
    nodeports: list[str] = []
    reject: list[str] = []
    external = [f"-A KUBE-EXTERNAL-SERVICES {dns_return}"]
    chains: dict[str, tuple[str, ...]] = {}
    for pr in ports:
        nat_services.extend(pr.services)
        nodeports.extend(pr.nodeports)
        reject.extend(pr.reject)
        external.extend(pr.external)
        chains.update(pr.chains)
    nat_services.append(
        '-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports" '
        "-m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"
    )
    nat = {
        "KUBE-SERVICES": tuple(nat_services),
        "KUBE-NODEPORTS": tuple(nodeports),
        "KUBE-POSTROUTING": (
            f"-A KUBE-POSTROUTING -m mark ! --mark {MASQ_MARK}/{MASQ_MARK} -j RETURN",
            f"-A KUBE-POSTROUTING -j MARK --xor-mark {MASQ_MARK}",
            '-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring '
            'SNAT" -j MASQUERADE --random-fully',
        ),
        "KUBE-MARK-MASQ": (f"-A KUBE-MARK-MASQ -j MARK --or-mark {MASQ_MARK}",),
        **chains,
    }
    flt = {
        "KUBE-SERVICES": tuple(reject),
        "KUBE-EXTERNAL-SERVICES": tuple(external),
        "KUBE-FORWARD": (
            f"-A KUBE-FORWARD -m mark --mark {MASQ_MARK}/{MASQ_MARK} -j ACCEPT",
            "-A KUBE-FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
        ),
    }
    return Ruleset({"filter": flt, "nat": nat}, problems)


def port_rules(
    sp: ServicePort, all_eps: tuple[Endpoint, ...], config: ProxyConfig, dns: str
) -> PortRules:
    """The rules of one Service port (module doc)."""
    cidr = config.cluster_cidr
    externals = [ip for ip in sp.external_ips if ip != dns]
    cluster_eps = usable(all_eps)
    comment = f'-m comment --comment "{sp.key}'
    if not cluster_eps:
        reject = [
            f'-A KUBE-SERVICES -d {sp.cluster_ip}/32 {comment} has no endpoints" '
            f"{_match(sp, sp.port)} -j REJECT"
        ]
        external = [
            f'-A KUBE-EXTERNAL-SERVICES -d {ip}/32 {comment} has no endpoints" '
            f"{_match(sp, sp.port)} -j REJECT"
            for ip in externals
        ]
        if sp.node_port:
            external.append(
                f"-A KUBE-EXTERNAL-SERVICES -m addrtype --dst-type LOCAL {comment} has no "
                f'endpoints" {_match(sp, sp.node_port)} -j REJECT'
            )
        return PortRules(reject=tuple(reject), external=tuple(external))
    chains: dict[str, list[str]] = {}
    svc = chain_name("KUBE-SVC-", sp)
    services = [
        f'-A KUBE-SERVICES -d {sp.cluster_ip}/32 {comment} cluster IP" '
        f"{_match(sp, sp.port)} -j {svc}"
    ]
    masq = (
        f'-A {svc} ! -s {cidr} -d {sp.cluster_ip}/32 {comment} cluster IP" '
        f"{_match(sp, sp.port)} -j KUBE-MARK-MASQ"
    )
    _endpoint_chains(svc, sp, cluster_eps, chains, [masq])
    nodeports: list[str] = []
    drop: list[str] = []
    if externals or sp.node_port:
        ext = chain_name("KUBE-EXT-", sp)
        for ip in externals:
            services.append(
                f'-A KUBE-SERVICES -d {ip}/32 {comment} external IP" {_match(sp, sp.port)} -j {ext}'
            )
        if sp.node_port:
            nodeports.append(f'-A KUBE-NODEPORTS {comment}" {_match(sp, sp.node_port)} -j {ext}')
        if not sp.local_external:
            chains[ext] = [
                f'-A {ext} {comment} external destinations" -j KUBE-MARK-MASQ',
                f"-A {ext} -j {svc}",
            ]
        else:
            chains[ext] = [
                f'-A {ext} -s {cidr} {comment} pod traffic for external destinations" -j {svc}',
                f'-A {ext} {comment} masquerade LOCAL traffic" -m addrtype --src-type LOCAL '
                "-j KUBE-MARK-MASQ",
                f'-A {ext} {comment} LOCAL traffic to the service chain" -m addrtype '
                f"--src-type LOCAL -j {svc}",
            ]
            local_eps = usable(e for e in all_eps if e.node == config.node_name)
            if local_eps:
                svl = chain_name("KUBE-SVL-", sp)
                chains[ext].append(f"-A {ext} -j {svl}")
                _endpoint_chains(svl, sp, local_eps, chains, [])
            else:
                for ip in externals:
                    drop.append(
                        f"-A KUBE-EXTERNAL-SERVICES -d {ip}/32 {comment} has no local "
                        f'endpoints" {_match(sp, sp.port)} -j DROP'
                    )
                if sp.node_port:
                    drop.append(
                        f"-A KUBE-EXTERNAL-SERVICES -m addrtype --dst-type LOCAL {comment} has "
                        f'no local endpoints" {_match(sp, sp.node_port)} -j DROP'
                    )
    return PortRules(
        tuple(services),
        tuple(nodeports),
        (),
        tuple(drop),
        tuple((c, tuple(lines)) for c, lines in chains.items()),
    )
