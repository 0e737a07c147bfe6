"""The node proxy's rule generator: golden cases, a model test, and `iptables-restore --test`.

The model test: random Services and EndpointSlices -> `proxyrules.build` -> restore text ->
`iptinterp` (a tiny interpreter of those rules) says, for packets aimed at every ClusterIP,
external/LB IP and NodePort from pod, node and outside sources, which endpoints each can reach
and whether it is masqueraded; that must equal what `model` says from the objects directly.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.agent.net import proxyrender
from orchestrator.agent.net.proxyrender import UNORDERED, owned_chains, render, render_change
from orchestrator.agent.net.proxyrules import (
    ProxyConfig,
    Ruleset,
    ServicePort,
    build,
    chain_name,
    endpoints_for,
)
from orchestrator.agent.net.proxystate import RuleBuilder
from tests.network.iptinterp import Interpreter, Outcome, Packet

CIDR = "10.42.0.0/16"
DNS = "10.43.0.10"
NODE = "a"
NODE_IPS = {"192.0.2.1", "10.42.0.1"}  # this node's LAN address and its cni0 gateway
LOCAL = NODE_IPS | {DNS, "127.0.0.1"}
CONFIG = ProxyConfig(NODE, CIDR, DNS)


def svc(
    name: str,
    ip: str,
    ports: list[dict[str, Any]],
    *,
    ns: str = "shop",
    type_: str = "ClusterIP",
    local: bool = False,
    affinity: bool = False,
    external: list[str] | None = None,
    ingress: list[str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"type": type_, "clusterIP": ip, "ports": ports}
    if local:
        spec["externalTrafficPolicy"] = "Local"
    if affinity:
        spec["sessionAffinity"] = "ClientIP"
        spec["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": 60}}
    if external:
        spec["externalIPs"] = external
    out: dict[str, Any] = {"metadata": {"namespace": ns, "name": name}, "spec": spec}
    if ingress:
        out["status"] = {"loadBalancer": {"ingress": [{"ip": i} for i in ingress]}}
    return out


def ep(ip: str, node: str = NODE, **cond: bool) -> dict[str, Any]:
    return {"addresses": [ip], "conditions": {"ready": True, **cond}, "nodeName": node}


def slice_(
    service: str, ports: list[dict[str, Any]], eps: list[dict[str, Any]], *, ns: str = "shop"
) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": ns,
            "name": f"{service}-x",
            "labels": {"kubernetes.io/service-name": service},
        },
        "addressType": "IPv4",
        "ports": ports,
        "endpoints": eps,
    }


# ---------------------------------------------------------------------------------- golden
def test_chain_names_are_kube_proxys() -> None:
    # kube-proxy: "KUBE-SVC-" + base32(sha256("ns/name:port" + "tcp"))[:16]
    sp = ServicePort("ns1", "svc1", "p80", "tcp", "172.30.0.41", 80)
    assert chain_name("KUBE-SVC-", sp) == "KUBE-SVC-XPGD46QRK7WJZT7O"
    assert chain_name("KUBE-SEP-", sp, "10.180.0.1:80") == "KUBE-SEP-SXIVWICOYRO3J4NJ"


GOLDEN_CLUSTER_IP = """\
*filter
:KUBE-SERVICES - [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-FORWARD - [0:0]
-A KUBE-EXTERNAL-SERVICES -d 10.43.0.10/32 -m comment --comment "cluster DNS is node-local" -j \
RETURN
-A KUBE-FORWARD -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
COMMIT
*nat
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-SEP-2KSBFBJDVQQCI3BS - [0:0]
:KUBE-SEP-KEPDGM244S7NJYJD - [0:0]
:KUBE-SVC-E3PXEPMWAWIUT6ZV - [0:0]
-A KUBE-SERVICES -d 10.43.0.10/32 -m comment --comment "cluster DNS is node-local" -j RETURN
-A KUBE-SERVICES -d 10.43.0.20/32 -m comment --comment "shop/web cluster IP" -p tcp -m tcp \
--dport 80 -j KUBE-SVC-E3PXEPMWAWIUT6ZV
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports" -m addrtype --dst-type \
LOCAL -j KUBE-NODEPORTS
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j \
MASQUERADE --random-fully
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-SEP-2KSBFBJDVQQCI3BS -s 10.42.1.5/32 -m comment --comment "shop/web" -j KUBE-MARK-MASQ
-A KUBE-SEP-2KSBFBJDVQQCI3BS -p tcp -m comment --comment "shop/web" -m tcp -j DNAT \
--to-destination 10.42.1.5:8080
-A KUBE-SEP-KEPDGM244S7NJYJD -s 10.42.0.5/32 -m comment --comment "shop/web" -j KUBE-MARK-MASQ
-A KUBE-SEP-KEPDGM244S7NJYJD -p tcp -m comment --comment "shop/web" -m tcp -j DNAT \
--to-destination 10.42.0.5:8080
-A KUBE-SVC-E3PXEPMWAWIUT6ZV ! -s 10.42.0.0/16 -d 10.43.0.20/32 -m comment --comment "shop/web \
cluster IP" -p tcp -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SVC-E3PXEPMWAWIUT6ZV -m comment --comment "shop/web -> 10.42.0.5:8080" -m statistic \
--mode random --probability 0.5000000000 -j KUBE-SEP-KEPDGM244S7NJYJD
-A KUBE-SVC-E3PXEPMWAWIUT6ZV -m comment --comment "shop/web -> 10.42.1.5:8080" -j \
KUBE-SEP-2KSBFBJDVQQCI3BS
COMMIT
"""


def _web(n_eps: int = 2, **kw: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    eps = [ep("10.42.0.5"), ep("10.42.1.5", "b"), ep("10.42.1.6", "b")][:n_eps]
    return (
        svc("web", "10.43.0.20", [{"port": 80, "protocol": "TCP"}], **kw),
        slice_("web", [{"port": 8080, "protocol": "TCP"}], eps),
    )


def test_golden_cluster_ip() -> None:
    s, sl = _web()
    assert render(build([s], [sl], CONFIG)) == GOLDEN_CLUSTER_IP


def test_golden_no_endpoints_rejects_in_filter() -> None:
    s = svc(
        "db", "10.43.0.30", [{"port": 5432, "nodePort": 30432, "protocol": "UDP"}], type_="NodePort"
    )
    text = render(build([s], [], CONFIG))
    assert (
        '-A KUBE-SERVICES -d 10.43.0.30/32 -m comment --comment "shop/db has no endpoints" '
        "-p udp -m udp --dport 5432 -j REJECT"
    ) in text
    assert (
        "-A KUBE-EXTERNAL-SERVICES -m addrtype --dst-type LOCAL -m comment --comment "
        '"shop/db has no endpoints" -p udp -m udp --dport 30432 -j REJECT'
    ) in text
    assert "KUBE-SVC-" not in text


def test_golden_affinity_and_local_policy() -> None:
    s, sl = _web(3, type_="NodePort", local=True, affinity=True)
    s["spec"]["ports"][0]["nodePort"] = 30080
    rs = build([s], [sl], CONFIG)
    nat = rs.chains("nat")
    sp = ServicePort("shop", "web", "", "tcp", "10.43.0.20", 80, 30080, (), True, 60)
    svc_chain, ext, svl = (chain_name(p, sp) for p in ("KUBE-SVC-", "KUBE-EXT-", "KUBE-SVL-"))
    sep = chain_name("KUBE-SEP-", sp, "10.42.0.5:8080")
    # three endpoints: a recent check each, then 1/3, 1/2, the rest
    assert [r.split(" -j ")[0].split("-m statistic ")[-1] for r in nat[svc_chain][4:]] == [
        "--mode random --probability 0.3333333333",
        "--mode random --probability 0.5000000000",
        f'-A {svc_chain} -m comment --comment "shop/web -> 10.42.1.6:8080"',
    ]
    assert (
        f"--name {sep} --mask 255.255.255.255 --rsource --rcheck --seconds 60 --reap"
        in (nat[svc_chain][1])
    )
    assert "-m recent --set --name " + sep in nat[sep][1]
    # Local: only the local endpoint in the SVL chain, no masquerade there
    assert nat[svl] == (
        f'-A {svl} -m comment --comment "shop/web -> 10.42.0.5:8080" -m recent --name {sep} '
        f"--mask 255.255.255.255 --rsource --rcheck --seconds 60 --reap -j {sep}",
        f'-A {svl} -m comment --comment "shop/web -> 10.42.0.5:8080" -j {sep}',
    )
    assert nat[ext][-1] == f"-A {ext} -j {svl}"
    assert f"-j {ext}" in nat["KUBE-NODEPORTS"][0]


def test_cluster_dns_is_never_nated() -> None:
    s = svc("dns", DNS, [{"port": 53, "protocol": "UDP"}], external=[DNS])
    sl = slice_("dns", [{"port": 53, "protocol": "UDP"}], [ep("10.42.0.9")])
    rs = build([s], [sl], CONFIG)
    assert rs.problems
    assert "cluster DNS" in rs.problems[0]
    lines = [r for t in rs.tables.values() for rules in t.values() for r in rules]
    assert [r for r in lines if DNS in r] == [
        f'-A {c} -d {DNS}/32 -m comment --comment "cluster DNS is node-local" -j RETURN'
        for c in ("KUBE-EXTERNAL-SERVICES", "KUBE-SERVICES")
    ]


def test_bad_objects_are_skipped_with_a_problem() -> None:
    good, sl = _web()
    bad_ip = svc("x", "10.43.999.1", [{"port": 80}])
    bad_port = svc("y", "10.43.0.40", [{"port": 0}, {"port": 80, "protocol": "ICMP"}])
    headless = svc("h", "None", [{"port": 80}])
    rs = build([bad_ip, bad_port, headless, good], [sl], CONFIG)
    assert len(rs.problems) == 3
    assert "spec.clusterIP '10.43.999.1'" in rs.problems[0]
    assert render(rs) == GOLDEN_CLUSTER_IP


def test_endpoint_selection_ready_then_terminating_and_dedup() -> None:
    sp = ServicePort("shop", "web", "", "tcp", "10.43.0.20", 80)
    ports = [{"port": 8080, "protocol": "TCP"}]
    sl1 = slice_("web", ports, [ep("10.42.0.5", ready=False, serving=True, terminating=True)])
    sl2 = slice_("web", ports, [ep("10.42.0.6", ready=False), ep("10.42.0.5")])
    eps = endpoints_for(sp, [sl1, sl2])
    assert [(e.ip, e.ready) for e in eps] == [("10.42.0.5", False), ("10.42.0.6", False)]
    rs = build([svc("web", "10.43.0.20", [{"port": 80}])], [sl1, sl2], CONFIG)
    # no ready endpoint: the serving+terminating one is used, the merely unready one is not
    dnats = [r for c in rs.chains("nat").values() for r in c if "DNAT" in r]
    assert [r.split()[-1] for r in dnats] == ["10.42.0.5:8080"]


def test_partial_render_rewrites_only_what_changed() -> None:
    s1, sl1 = _web()
    s2 = svc("api", "10.43.0.21", [{"port": 81}])
    sl2 = slice_("api", [{"port": 9090, "protocol": "TCP"}], [ep("10.42.0.7")])
    old = build([s1, s2], [sl1, sl2], CONFIG)
    assert render(old, old) == ""
    sl2b = slice_("api", [{"port": 9090, "protocol": "TCP"}], [ep("10.42.0.8")])
    new = build([s1, s2], [sl1, sl2b], CONFIG)
    text = render(new, old)
    assert "*filter" not in text  # filter did not change
    declared = {line[1:].split()[0] for line in text.splitlines() if line.startswith(":")}
    sp2 = ServicePort("shop", "api", "", "tcp", "10.43.0.21", 81)
    gone_sep = chain_name("KUBE-SEP-", sp2, "10.42.0.7:9090")
    assert declared == {
        chain_name("KUBE-SVC-", sp2),
        chain_name("KUBE-SEP-", sp2, "10.42.0.8:9090"),
        gone_sep,
    }  # fmt: skip  (KUBE-SERVICES and the other fixed chains did not change: not written)
    assert f"-X {gone_sep}" in text
    assert chain_name("KUBE-SVC-", ServicePort("shop", "web", "", "tcp", "", 80)) not in declared
    # a full render with stale chains from iptables-save deletes them
    stale = owned_chains("*nat\n:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]\n:KUBE-SERVICES - [0:0]\n")
    assert stale == {"nat": {"KUBE-SVC-AAAAAAAAAAAAAAAA"}}
    assert "-X KUBE-SVC-AAAAAAAAAAAAAAAA" in render(new, None, stale)


# ---------------------------------------------------------------------------------- model test
def _usable(eps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def cond(e: dict[str, Any], k: str, default: bool) -> bool:
        v = e["conditions"].get(k)
        return default if v is None else bool(v)

    ready = [e for e in eps if cond(e, "ready", True)]
    if ready:
        return ready
    return [
        e
        for e in eps
        if cond(e, "serving", cond(e, "ready", True)) and cond(e, "terminating", False)
    ]


def model(
    services: list[dict[str, Any]], slices: list[dict[str, Any]], pkt: Packet, from_local: bool
) -> set[Outcome]:
    """What should happen to `pkt`, from the objects directly (kube-proxy's semantics)."""
    if pkt.dst == DNS:
        return {("pass", "", False)}
    cidr = ipaddress.ip_network(CIDR)
    src_pod = ipaddress.ip_address(pkt.src) in cidr

    def endpoints(s: dict[str, Any], port: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        out = []
        for sl in slices:
            if sl["metadata"]["labels"]["kubernetes.io/service-name"] != s["metadata"]["name"]:
                continue
            for p in sl["ports"]:
                if p.get("name", "") == port.get("name", "") and p["protocol"] == port["protocol"]:
                    out += [(f"{e['addresses'][0]}:{p['port']}", e) for e in sl["endpoints"]]
        return out

    def dnat(eps: list[tuple[str, dict[str, Any]]], masq: bool) -> set[Outcome]:
        return {("dnat", a, masq or pkt.src == e["addresses"][0]) for a, e in eps}

    def usable(eps: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
        keep = {id(e) for e in _usable([e for _, e in eps])}
        return [(a, e) for a, e in eps if id(e) in keep]

    def external(s: dict[str, Any], port: dict[str, Any]) -> set[Outcome]:
        eps = usable(endpoints(s, port))
        if not eps:
            blocked = pkt.dst in LOCAL or not from_local
            return {("REJECT", "", False)} if blocked else {("pass", "", False)}
        if s["spec"].get("externalTrafficPolicy") != "Local":
            return dnat(eps, True)
        if src_pod:
            return dnat(eps, False)
        if pkt.src in LOCAL:
            return dnat(eps, True)
        local = usable([(a, e) for a, e in endpoints(s, port) if e["nodeName"] == NODE])
        if local:
            return dnat(local, False)
        return {("DROP", "", False)}

    for s in services:
        for port in s["spec"]["ports"]:
            if (port["protocol"].lower(), port["port"]) != (pkt.proto, pkt.dport):
                continue
            if s["spec"]["clusterIP"] == pkt.dst:
                eps = usable(endpoints(s, port))
                return dnat(eps, not src_pod) if eps else {("REJECT", "", False)}
            ext = s["spec"].get("externalIPs", []) + [
                i["ip"] for i in s.get("status", {}).get("loadBalancer", {}).get("ingress", [])
            ]
            if pkt.dst in ext:
                return external(s, port)
    if pkt.dst in LOCAL:
        for s in services:
            for port in s["spec"]["ports"]:
                if (port["protocol"].lower(), port.get("nodePort")) == (pkt.proto, pkt.dport):
                    return external(s, port)
    return {("pass", "", False)}


CONDITIONS: list[dict[str, bool]] = [
    {},  # nil: ready (and serving)
    {"ready": False},
    {"ready": False, "serving": True, "terminating": True},  # the fallback when none is ready
    {"ready": False, "serving": False, "terminating": True},
    {"ready": False, "serving": True},  # serving but not terminating: never used
]
POD_IPS = ["10.42.0.2", "10.42.0.3", "10.42.0.4", "10.42.1.2", "10.42.1.3", "10.42.1.4"]
EXTERNAL_IPS = ["192.0.2.1", "192.0.2.2", "198.51.100.7"]  # this node's, another's, elsewhere


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    n = draw(st.integers(0, 5))
    ips = draw(st.lists(st.integers(1, 200).filter(lambda i: i != 10), min_size=n, max_size=n,
                        unique=True))  # fmt: skip
    services, slices = [], []
    next_port, next_node_port = 1, 30000
    for i, host in enumerate(ips):
        type_ = draw(st.sampled_from(["ClusterIP", "NodePort", "LoadBalancer"]))
        nports = draw(st.integers(1, 2))
        ports = []
        for j in range(nports):
            p: dict[str, Any] = {
                "port": next_port,
                "protocol": draw(st.sampled_from(["TCP", "UDP"])),
            }
            next_port += 1
            if nports > 1:
                p["name"] = f"p{j}"
            if type_ != "ClusterIP":
                p["nodePort"] = next_node_port
                next_node_port += 1
            ports.append(p)
        name = f"s{i}"
        s = svc(
            name,
            f"10.43.0.{host}",
            ports,
            type_=type_,
            local=type_ != "ClusterIP" and draw(st.booleans()),
            affinity=draw(st.booleans()),
            external=draw(st.lists(st.sampled_from(EXTERNAL_IPS), max_size=1, unique=True)),
            ingress=["192.0.2.1"] if type_ == "LoadBalancer" else None,
        )
        services.append(s)
        eps = []
        for ip in draw(st.lists(st.sampled_from(POD_IPS), max_size=4, unique=True)):
            cond = draw(st.sampled_from(CONDITIONS))
            e = ep(ip, NODE if ip.startswith("10.42.0.") else "b")
            e["conditions"] = cond
            eps.append(e)
        slice_ports = [
            {**({"name": p["name"]} if "name" in p else {}), "port": 8000 + k,
             "protocol": p["protocol"]} for k, p in enumerate(ports)
        ]  # fmt: skip
        cut = draw(st.integers(0, len(eps)))
        for part, chunk in enumerate((eps[:cut], eps[cut:])):
            if chunk or part == 0:
                sl = slice_(name, slice_ports, chunk)
                sl["metadata"]["name"] = f"{name}-{part}"
                slices.append(sl)
    return services, slices


def _packets(services: list[dict[str, Any]]) -> list[Packet]:
    targets = {(DNS, "udp", 53), (DNS, "tcp", 30000), ("192.0.2.1", "tcp", 29999)}
    for s in services:
        for p in s["spec"]["ports"]:
            proto = p["protocol"].lower()
            other = "udp" if proto == "tcp" else "tcp"
            targets.add((s["spec"]["clusterIP"], proto, p["port"]))
            targets.add((s["spec"]["clusterIP"], other, p["port"]))
            for ip in EXTERNAL_IPS:
                targets.add((ip, proto, p["port"]))
            if "nodePort" in p:
                for ip in [*NODE_IPS, "192.0.2.2", DNS]:
                    targets.add((ip, proto, p["nodePort"]))
    sources = ["10.42.0.3", "10.42.1.2", "203.0.113.9", "192.0.2.1"]
    return [Packet(src, d, proto, port) for d, proto, port in sorted(targets) for src in sources]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_rules_match_the_model(scenario: tuple[list[dict[str, Any]], list[dict[str, Any]]]) -> None:
    services, slices = scenario
    rs = build(services, slices, CONFIG)
    assert rs.problems == []
    interp = Interpreter(render(rs), LOCAL)
    for pkt in _packets(services):
        from_local = pkt.src in LOCAL
        got = interp.outcomes(pkt, from_local=from_local)
        assert got == model(services, slices, pkt, from_local), (pkt, render(rs))


@settings(max_examples=50, deadline=None)
@given(scenarios(), scenarios())
def test_partial_render_applied_to_old_gives_new(
    a: tuple[list[dict[str, Any]], list[dict[str, Any]]],
    b: tuple[list[dict[str, Any]], list[dict[str, Any]]],
) -> None:
    """Applying render(new, old) on top of the kernel state of `old` yields exactly `new`."""
    old, new = build(*a, CONFIG), build(*b, CONFIG)
    kernel = {t: {c: list(r) for c, r in chains.items()} for t, chains in old.tables.items()}
    _apply(kernel, render(new, old))
    _assert_holds(kernel, new)


def _apply(kernel: dict[str, dict[str, list[str]]], text: str) -> None:
    """`iptables-restore --noflush` of `text` on `kernel` (table -> chain -> rules)."""
    table = ""
    for line in text.splitlines():
        op, _, rest = line.partition(" ")
        if line.startswith("*"):
            table = line[1:]
        elif line.startswith(":"):
            kernel.setdefault(table, {})[line[1:].split()[0]] = []
        elif op == "-A":
            kernel[table][rest.split()[0]].append(line)
        elif op == "-D":
            chain, _, spec = rest.partition(" ")
            kernel[table][chain].remove(f"-A {chain} {spec}")  # ValueError: no such rule
        elif op == "-I":
            chain, pos, spec = rest.split(" ", 2)
            kernel[table][chain].insert(int(pos) - 1, f"-A {chain} {spec}")
        elif op == "-X":
            assert not any(f"-j {rest}" in r for c in kernel[table].values() for r in c)
            del kernel[table][rest]


def _assert_holds(kernel: dict[str, dict[str, list[str]]], new: Ruleset) -> None:
    """The kernel holds `new` (in the `UNORDERED` chains: in any order after the fixed rules)."""
    for t, chains in new.tables.items():
        assert set(kernel[t]) == set(chains)
        for c, rules in chains.items():
            if (t, c) in UNORDERED:  # same rules, same fixed first (and last) ones
                assert sorted(kernel[t][c]) == sorted(rules)
                fixed = UNORDERED[t, c] - 1
                assert kernel[t][c][:fixed] == list(rules[:fixed])
                if (t, c) == ("nat", "KUBE-SERVICES"):
                    assert kernel[t][c][-1] == rules[-1]
            else:
                assert kernel[t][c] == list(rules)


def _keyed(objs: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for o in objs:
        meta = o["metadata"]
        owner = meta["name"] if "spec" in o else meta["labels"]["kubernetes.io/service-name"]
        out.setdefault((meta["namespace"], owner), []).append(o)
    return out


@settings(max_examples=60, deadline=None)
@given(
    st.lists(scenarios(), min_size=2, max_size=4),
    st.sampled_from([1, 64]),
    st.booleans(),
)
def test_rule_changes_applied_in_turn_give_each_state(
    steps: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]], limit: int, by_keys: bool
) -> None:
    """A RuleBuilder fed a sequence of states (all of it, or only the Services that changed),
    each `render_change` applied to the kernel in turn: the kernel holds each state's `build`
    (with a tiny EDIT_LIMIT the per-port chains are rewritten instead of edited)."""
    builder = RuleBuilder(CONFIG)
    kernel: dict[str, dict[str, list[str]]] = {}
    _apply(kernel, render(builder.build([], []), None))
    before: tuple[list[dict[str, Any]], list[dict[str, Any]]] = ([], [])
    saved = proxyrender.EDIT_LIMIT
    proxyrender.EDIT_LIMIT = limit
    try:
        for services, slices in steps:
            if by_keys:
                old_svcs, new_svcs = _keyed(before[0]), _keyed(services)
                old_sls, new_sls = _keyed(before[1]), _keyed(slices)
                keys = {
                    k
                    for k in {*old_svcs, *new_svcs, *old_sls, *new_sls}
                    if old_svcs.get(k) != new_svcs.get(k) or old_sls.get(k) != new_sls.get(k)
                }
                change = builder.update(
                    keys,
                    lambda ns, name, svcs=new_svcs: (svcs.get((ns, name)) or [None])[0],
                    lambda ns, name, sls=new_sls: sls.get((ns, name), []),
                )
            else:
                change = builder.sync_all(services, slices)
            _apply(kernel, render_change(change, builder))
            want = build(services, slices, CONFIG)
            assert builder.ruleset().tables == want.tables
            _assert_holds(kernel, want)
            before = (services, slices)
    finally:
        proxyrender.EDIT_LIMIT = saved


# ---------------------------------------------------------------------------------- the kernel
def _netns_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create a network namespace (unshare -n)"
    for tool in ("unshare", "iptables-restore"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


@pytest.mark.skipif(_netns_reason() is not None, reason=str(_netns_reason()))
@settings(max_examples=5, deadline=None)
@given(scenarios())
def test_iptables_restore_accepts_the_rules(
    scenario: tuple[list[dict[str, Any]], list[dict[str, Any]]],
) -> None:
    text = render(build(*scenario, CONFIG))
    done = subprocess.run(
        ["unshare", "-n", "iptables-restore", "--test", "--noflush"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, (done.stderr, text)


@settings(max_examples=50, deadline=None)
@given(st.lists(scenarios(), min_size=2, max_size=4), st.randoms(use_true_random=False))
def test_rule_builder_memory_never_changes_the_result(
    steps: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]], rnd: Any
) -> None:
    """A RuleBuilder fed a sequence of states (objects kept, replaced or new, as an informer
    does) gives what a fresh `build` gives for each."""
    builder = RuleBuilder(CONFIG)
    previous: dict[str, dict[str, Any]] = {}
    for services, slices in steps:
        objs = []
        for o in [*services, *slices]:
            key = o["metadata"]["name"] + str("spec" in o)
            kept = previous.get(key)
            objs.append(kept if kept == o and rnd.random() < 0.8 else o)  # same object reused
        previous = {o["metadata"]["name"] + str("spec" in o): o for o in objs}
        svcs, sls = objs[: len(services)], objs[len(services) :]
        assert builder.build(svcs, sls).tables == build(services, slices, CONFIG).tables
