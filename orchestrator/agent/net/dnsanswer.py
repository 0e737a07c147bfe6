"""Cluster DNS answers, as CoreDNS's kubernetes plugin gives them (`pods insecure`, TTL 5 s).

Theory of operation
-------------------
`ClusterRecords.build(services, slices, zone)` turns a snapshot of Services and EndpointSlices
into an index (a dict from owner name to its records, plus PTR targets); `answer(query)` looks a
query up in it and returns the response, or None when the name is not ours and the query must
be forwarded. Pure: no I/O, no clock; the server rebuilds the index when the snapshot's
generation changes.

Names inside the cluster domain `<domain>`:

- `<svc>.<ns>.svc.<domain>`: A/AAAA = the ClusterIP(s); headless (clusterIP None) = the ready
  endpoints' addresses (all of them with `publishNotReadyAddresses`); ExternalName = a CNAME to
  `spec.externalName` (for every type: the resolver follows it).
- `_<port>._<proto>.<svc>.<ns>.svc.<domain>` SRV for each named port (priority 0, weight
  100/n); the bare service name's SRV lists every port. The target is the service name, or for
  a headless service each endpoint's name, whose addresses go to the additional section.
- `<host>.<svc>.<ns>.svc.<domain>` A/AAAA for a headless service's endpoints: `<host>` is the
  endpoint's `hostname` (a StatefulSet pod's, through `subdomain`) or its dashed address
  (`10-42-1-5`, as CoreDNS).
- `<a-b-c-d>.<ns>.pod.<domain>` A → a.b.c.d (an IPv6 address with `-` for `:` → AAAA), for
  any namespace, as CoreDNS's `pods insecure`.
- PTR for ClusterIPs (→ the service name) and a headless service's endpoint addresses (→ the
  endpoint name), in the reverse zones of the service and cluster CIDRs.
- The apex has SOA and NS (`ns.dns.<domain>`, whose A is the cluster DNS address).

A name that does not exist but is inside the domain (or an address in the service/cluster
CIDRs) is NXDOMAIN; an existing name without the asked type is NOERROR with no answer (names
between the apex and a record, such as `<ns>.svc.<domain>`, exist: empty non-terminals); both
carry the zone's SOA in the authority section. Every record has the zone TTL (5 s). Lookups are
case-insensitive (dnspython names compare so); the answer echoes the question's spelling.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.rcode
import dns.rdata
import dns.rdataclass
import dns.rdatatype
import dns.rdtypes.ANY.CNAME
import dns.rdtypes.ANY.NS
import dns.rdtypes.ANY.PTR
import dns.rdtypes.ANY.SOA
import dns.rdtypes.IN.A
import dns.rdtypes.IN.AAAA
import dns.rdtypes.IN.SRV
import dns.reversename
import dns.rrset

from orchestrator.kube.objects import Obj

__all__ = ["DEFAULT_TTL", "ClusterRecords", "Zone", "dashed_name", "records_of"]

DEFAULT_TTL = 5  # seconds, CoreDNS's kubernetes plugin default
IN = dns.rdataclass.IN
A, AAAA, CNAME, SRV, PTR = (
    dns.rdatatype.A,
    dns.rdatatype.AAAA,
    dns.rdatatype.CNAME,
    dns.rdatatype.SRV,
    dns.rdatatype.PTR,
)
SOA, NS, ANY = dns.rdatatype.SOA, dns.rdatatype.NS, dns.rdatatype.ANY
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Zone:
    """The cluster domain and the reverse ranges this server is authoritative for."""

    domain: str = "cluster.local"
    networks: tuple[IPNetwork, ...] = ()  # service and cluster CIDRs
    dns_ip: str = ""  # the cluster DNS address: `ns.dns.<domain>`'s A
    ttl: int = DEFAULT_TTL

    @property
    def origin(self) -> dns.name.Name:
        return dns.name.from_text(self.domain)


@dataclass
class _Node:
    """The records of one owner name."""

    addresses: list[dns.rdata.Rdata] = field(default_factory=list)  # A and AAAA
    cname: dns.rdata.Rdata | None = None
    srv: list[dns.rdata.Rdata] = field(default_factory=list)


def dashed_name(address: str) -> str:
    """An endpoint's DNS label from its address, as CoreDNS writes it (`10-42-1-5`)."""
    if "." in address:
        return address.replace(".", "-")
    label = address.replace(":", "-")
    if label.endswith("-"):
        label += "0"
    if label.startswith("-"):
        label = "0" + label
    return label


def _rd(cls: Any, rdtype: int, *args: object) -> dns.rdata.Rdata:
    """An rdata of class IN (dnspython's rdata constructors carry no type hints)."""
    return cast(dns.rdata.Rdata, cls(IN, rdtype, *args))


def _address_rdata(ip: IPAddress) -> dns.rdata.Rdata:
    if ip.version == 4:
        return _rd(dns.rdtypes.IN.A.A, A, str(ip))
    return _rd(dns.rdtypes.IN.AAAA.AAAA, AAAA, str(ip))


def _ip(text: object) -> IPAddress | None:
    try:
        return ipaddress.ip_address(str(text))
    except ValueError:
        return None


def _label(text: str) -> dns.name.Name | None:
    """A relative one-label name, or None if `text` cannot be one."""
    try:
        name = dns.name.from_text(text, origin=None)
    except dns.exception.DNSException:
        return None
    return name if len(name.labels) == 1 and text else None


@dataclass
class _Endpoint:
    name: str  # the endpoint's label
    ips: list[IPAddress]


def _endpoints(service: Obj, slices: Sequence[Obj]) -> tuple[list[_Endpoint], list[Obj]]:
    """The endpoints a headless service publishes and the slices' ports."""
    publish_all = bool((service.get("spec") or {}).get("publishNotReadyAddresses"))
    out: list[_Endpoint] = []
    ports: list[Obj] = []
    for sl in slices:
        if sl.get("addressType") not in ("IPv4", "IPv6"):
            continue  # FQDN slices have no address records
        for p in sl.get("ports") or []:
            if isinstance(p, dict) and p not in ports:
                ports.append(p)
        for ep in sl.get("endpoints") or []:
            if not isinstance(ep, dict):
                continue
            ready = (ep.get("conditions") or {}).get("ready")
            if ready is False and not publish_all:
                continue  # a nil ready condition means ready (the API's rule)
            ips = [ip for ip in map(_ip, ep.get("addresses") or []) if ip is not None]
            if not ips:
                continue
            host = str(ep.get("hostname") or "") or dashed_name(str(ips[0]))
            out.append(_Endpoint(host, ips))
    return out, ports


def records_of(service: Obj) -> list[IPAddress]:
    """A Service's ClusterIPs (clusterIPs, else clusterIP); empty for headless/unset ones."""
    spec = service.get("spec") or {}
    ips = spec.get("clusterIPs") or ([spec["clusterIP"]] if spec.get("clusterIP") else [])
    return [ip for ip in map(_ip, ips) if ip is not None]


class ClusterRecords:
    """The records of one snapshot (build with `build`); `answer` answers a query from them."""

    def __init__(self, zone: Zone) -> None:
        self.zone = zone
        self.origin = zone.origin
        self.nodes: dict[dns.name.Name, _Node] = {}
        self.ptr: dict[dns.name.Name, list[dns.name.Name]] = {}
        self._reverse = [(net, _reverse_zone(net)) for net in zone.networks]
        self._ns_name = dns.name.from_text("ns.dns", origin=self.origin)
        self._hostmaster = dns.name.from_text("hostmaster", origin=self.origin)
        self.set_serial(0)
        dns_ip = _ip(zone.dns_ip)
        if dns_ip is not None:
            self._node(self._ns_name).addresses.append(_address_rdata(dns_ip))

    def set_serial(self, serial: int) -> None:
        soa = _rd(
            dns.rdtypes.ANY.SOA.SOA,
            SOA,
            self._ns_name,
            self._hostmaster,
            serial % 2**32,
            7200,
            1800,
            86400,
            self.zone.ttl,
        )
        self.soa = dns.rrset.RRset(self.origin, IN, SOA)
        self.soa.update_ttl(self.zone.ttl)
        self.soa.add(soa)

    # ------------------------------------------------------------------------------- building
    @classmethod
    def build(
        cls,
        services: Mapping[tuple[str, str], Obj],
        slices: Mapping[tuple[str, str], Sequence[Obj]],
        zone: Zone,
        serial: int = 0,
    ) -> ClusterRecords:
        """The index of a snapshot; objects that cannot be names (bad labels) are skipped."""
        rec = cls(zone)
        rec.set_serial(serial)
        for (ns, name), svc in services.items():
            ns_label, svc_label = _label(ns), _label(name)
            if ns_label is None or svc_label is None:
                continue
            rec._add_service(svc, svc_label.concatenate(ns_label), slices.get((ns, name), ()))
        return rec

    def _node(self, name: dns.name.Name) -> _Node:
        node = self.nodes.get(name)
        if node is None:
            node = self.nodes[name] = _Node()
            parent = name.parent()  # empty non-terminals up to the apex exist too
            while (
                parent != self.origin
                and parent not in self.nodes
                and parent.is_subdomain(self.origin)
            ):
                self.nodes[parent] = _Node()
                parent = parent.parent()
        return node

    def _add_ptr(self, ip: IPAddress, target: dns.name.Name) -> None:
        rev = dns.reversename.from_address(str(ip))
        targets = self.ptr.setdefault(rev, [])
        if target not in targets:
            targets.append(target)

    def _add_service(self, svc: Obj, relative: dns.name.Name, slices: Sequence[Obj]) -> None:
        spec = svc.get("spec") or {}
        svc_name = relative.concatenate(dns.name.from_text("svc", origin=self.origin))
        node = self._node(svc_name)
        if spec.get("type") == "ExternalName":
            try:
                target = dns.name.from_text(str(spec.get("externalName") or ""))
            except dns.exception.DNSException:
                return
            if target != dns.name.root:
                node.cname = _rd(dns.rdtypes.ANY.CNAME.CNAME, CNAME, target)
            return
        ports: list[tuple[str, str, int, dns.name.Name]] = []  # (name, proto, port, target)
        if spec.get("clusterIP") == "None":
            endpoints, ep_ports = _endpoints(svc, slices)
            for ep in endpoints:
                label = _label(ep.name)
                if label is None:
                    continue
                ep_name = label.concatenate(svc_name)
                ep_node = self._node(ep_name)
                for ip in ep.ips:
                    rdata = _address_rdata(ip)
                    if rdata not in node.addresses:
                        node.addresses.append(rdata)
                    if rdata not in ep_node.addresses:
                        ep_node.addresses.append(rdata)
                    self._add_ptr(ip, ep_name)
                for p in ep_ports:
                    ports.append(
                        (
                            str(p.get("name") or ""),
                            str(p.get("protocol") or "TCP"),
                            int(p.get("port") or 0),
                            ep_name,
                        )
                    )
        else:
            for ip in records_of(svc):
                node.addresses.append(_address_rdata(ip))
                self._add_ptr(ip, svc_name)
            for p in spec.get("ports") or []:
                if isinstance(p, dict):
                    ports.append(
                        (
                            str(p.get("name") or ""),
                            str(p.get("protocol") or "TCP"),
                            int(p.get("port") or 0),
                            svc_name,
                        )
                    )
        by_owner: dict[dns.name.Name, list[tuple[int, dns.name.Name]]] = {}
        for port_name, proto, port, target in ports:
            if not 0 < port < 65536:
                continue
            by_owner.setdefault(svc_name, []).append((port, target))
            pn, pp = _label("_" + port_name.lower()), _label("_" + proto.lower())
            if port_name and pn is not None and pp is not None:
                by_owner.setdefault(pn.concatenate(pp).concatenate(svc_name), []).append(
                    (port, target)
                )
        for owner, items in by_owner.items():
            unique = list(dict.fromkeys(items))
            weight = max(1, 100 // len(unique))
            self._node(owner).srv = [
                _rd(dns.rdtypes.IN.SRV.SRV, SRV, 0, weight, port, target) for port, target in unique
            ]

    # ------------------------------------------------------------------------------ answering
    def answer(self, query: dns.message.Message) -> dns.message.Message | None:
        """The response to `query`, or None when it is not ours to answer (forward it)."""
        if query.opcode() != dns.opcode.QUERY or len(query.question) != 1:
            return None
        q = query.question[0]
        qname, qtype = q.name, q.rdtype
        if qname.is_subdomain(self.origin):
            return self._in_domain(query, qname, qtype)
        if qname.is_subdomain(_ARPA_V4) or qname.is_subdomain(_ARPA_V6):
            return self._reverse_answer(query, qname, qtype)
        return None

    def _response(self, query: dns.message.Message) -> dns.message.Message:
        resp = dns.message.make_response(query)
        resp.flags |= dns.flags.AA | dns.flags.RA
        return resp

    def _negative(
        self, query: dns.message.Message, rcode: dns.rcode.Rcode, soa: dns.rrset.RRset
    ) -> dns.message.Message:
        resp = self._response(query)
        resp.set_rcode(rcode)
        resp.authority.append(soa)
        return resp

    def _in_domain(
        self, query: dns.message.Message, qname: dns.name.Name, qtype: int
    ) -> dns.message.Message:
        resp = self._response(query)
        if query.question[0].rdclass != IN:
            resp.set_rcode(dns.rcode.REFUSED)
            return resp
        if qname == self.origin:
            if qtype in (SOA, ANY):
                resp.answer.append(_rrset(qname, SOA, self.soa[0], self.zone.ttl))
            if qtype in (NS, ANY):
                rdata = _rd(dns.rdtypes.ANY.NS.NS, NS, self._ns_name)
                resp.answer.append(_rrset(qname, NS, rdata, self.zone.ttl))
            if not resp.answer:
                resp.authority.append(self.soa)
            return resp
        node = self.nodes.get(qname) or self._pod(qname)
        if node is None:
            return self._negative(query, dns.rcode.NXDOMAIN, self.soa)
        ttl = self.zone.ttl
        if node.cname is not None:
            resp.answer.append(_rrset(qname, CNAME, node.cname, ttl))
            target = node.cname.target  # type: ignore[attr-defined]  # CNAME rdata
            inside = self.nodes.get(target)
            if qtype not in (CNAME, ANY) and inside is not None:
                resp.answer.extend(_addresses(target, inside, qtype, ttl))
            return resp
        resp.answer.extend(_addresses(qname, node, qtype, ttl))
        if qtype in (SRV, ANY) and node.srv:
            resp.answer.append(_rrset(qname, SRV, node.srv, ttl))
            seen: set[dns.name.Name] = set()
            for srv in node.srv:
                target = srv.target  # type: ignore[attr-defined]  # SRV rdata
                target_node = self.nodes.get(target)
                if target in seen or target_node is None:
                    continue
                seen.add(target)
                resp.additional.extend(_addresses(target, target_node, ANY, ttl))
        if not resp.answer:
            resp.authority.append(self.soa)
        return resp

    def _pod(self, qname: dns.name.Name) -> _Node | None:
        """`<dashed-ip>.<ns>.pod.<domain>` (any namespace, as `pods insecure`), or the
        non-terminals `<ns>.pod.<domain>` and `pod.<domain>`."""
        rel = qname.relativize(self.origin).labels
        if not rel or rel[-1].lower() != b"pod" or len(rel) > 3:
            return None
        if len(rel) < 3:
            return _Node()
        text = rel[0].decode("ascii", "replace")
        ip = _ip(text.replace("-", ".")) if text.count("-") == 3 else None
        if ip is None and "-" in text:
            ip = _ip(text.replace("-", ":"))
        if ip is None:
            return None
        return _Node(addresses=[_address_rdata(ip)])

    def _reverse_answer(
        self, query: dns.message.Message, qname: dns.name.Name, qtype: int
    ) -> dns.message.Message | None:
        targets = self.ptr.get(qname)
        try:
            ip: IPAddress | None = ipaddress.ip_address(dns.reversename.to_address(qname))
        except (dns.exception.DNSException, ValueError):
            ip = None
        zone_soa: dns.rrset.RRset | None = None
        for net, rev_zone in self._reverse:
            if (ip is not None and ip in net) or (ip is None and qname.is_subdomain(rev_zone)):
                zone_soa = self._reverse_soa(rev_zone)
                break
        if zone_soa is None and targets is None:
            return None  # not one of our ranges: forward
        if zone_soa is None:
            zone_soa = self.soa
        if targets is None:
            if ip is None and any(name.is_subdomain(qname) for name in self.ptr):
                return self._negative(query, dns.rcode.NOERROR, zone_soa)
            return self._negative(query, dns.rcode.NXDOMAIN, zone_soa)
        resp = self._response(query)
        if qtype in (PTR, ANY):
            rdatas = [_rd(dns.rdtypes.ANY.PTR.PTR, PTR, t) for t in targets]
            resp.answer.append(_rrset(qname, PTR, rdatas, self.zone.ttl))
        else:
            resp.authority.append(zone_soa)
        return resp

    def _reverse_soa(self, rev_zone: dns.name.Name) -> dns.rrset.RRset:
        rrset = dns.rrset.RRset(rev_zone, IN, SOA)
        rrset.update_ttl(self.zone.ttl)
        rrset.add(self.soa[0])
        return rrset


_ARPA_V4 = dns.name.from_text("in-addr.arpa.")


def _reverse_zone(net: IPNetwork) -> dns.name.Name:
    """The reverse zone covering `net` (its prefix rounded down to whole octets/nibbles)."""
    labels = net.prefixlen // 8 if net.version == 4 else net.prefixlen // 4
    return dns.reversename.from_address(str(net.network_address)).split(labels + 3)[1]


_ARPA_V6 = dns.name.from_text("ip6.arpa.")


def _rrset(
    name: dns.name.Name, rdtype: int, rdatas: dns.rdata.Rdata | Iterable[dns.rdata.Rdata], ttl: int
) -> dns.rrset.RRset:
    rrset = dns.rrset.RRset(name, IN, dns.rdatatype.RdataType.make(rdtype))
    rrset.update_ttl(ttl)
    for rdata in [rdatas] if isinstance(rdatas, dns.rdata.Rdata) else rdatas:
        rrset.add(rdata)
    return rrset


def _addresses(name: dns.name.Name, node: _Node, qtype: int, ttl: int) -> list[dns.rrset.RRset]:
    out = []
    for rdtype in (A, AAAA):
        if qtype in (rdtype, ANY):
            rdatas = [r for r in node.addresses if r.rdtype == rdtype]
            if rdatas:
                out.append(_rrset(name, rdtype, rdatas, ttl))
    return out
