"""The node-local cluster DNS server: UDP and TCP on the cluster DNS address (port 53), answering
cluster names from the agent's Service cache and forwarding the rest, with a cache.

Theory of operation
-------------------
A query goes through `DnsServer.try_local` synchronously, in the receiving task:

1. `request_key` (`dnscache`): a query with the same key as an earlier one is answered from the
   memo of cluster answers (valid for one `ClusterView.generation`) or from the forwarding
   cache (`ResponseCache`, TTL-aged), spliced with the query's ID and question: no parse.
2. Otherwise the query is parsed (malformed: FORMERR when the header is readable, else dropped)
   and `ClusterRecords.answer` (`dnsanswer`) answers names of the cluster domain and of the
   service/cluster CIDRs' reverse zones from the snapshot; the answer is memoized.
3. Anything else is forwarded (`Forwarder`, in a task of its own, at most `max_inflight` at
   once, further ones dropped: a client retries): UDP to the node's nameservers, TCP when the
   answer is truncated, the next server on a timeout or error, SERVFAIL (not cached) when all
   fail. An ExternalName's CNAME to an outside name is followed the same way, as CoreDNS does.

UDP answers larger than the client's limit (512 bytes, or its EDNS payload size) are sent
truncated (TC, no records), so the client retries over TCP.

The server only reads the local `ClusterView` (rebuilding its index when the generation
changes), so it keeps answering cluster names while the API servers are unreachable.

Upstreams (`upstreams_from`): the nameservers of the node's resolv.conf (`--resolv-conf`), port
53. The server runs in the host's network namespace, so a loopback nameserver (systemd-resolved's
127.0.0.53) is reachable and kept — unlike inside a pod; only a nameserver that is this server's
own address would loop (CoreDNS's `loop` plugin's concern) and is dropped.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import dns.asyncbackend
import dns.asyncquery
import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.rcode
import dns.rdatatype
import trio

from orchestrator.agent.net.clusterview import ClusterView
from orchestrator.agent.net.dnsanswer import ClusterRecords, Zone
from orchestrator.agent.net.dnscache import RequestKey, ResponseCache, request_key, splice
from orchestrator.agent.net.poddns import ResolvConf
from orchestrator.metrics import REGISTRY

__all__ = [
    "DnsServer",
    "DnsStats",
    "ForwardError",
    "Forwarder",
    "upstreams_from",
]

log = logging.getLogger(__name__)

UPSTREAM_TIMEOUT = 2.0  # seconds one upstream has to answer before the next is tried
TCP_IDLE_TIMEOUT = 10.0  # seconds a TCP client may stay silent
MAX_TCP_CLIENTS = 256  # TCP connections served at once; more are closed at once
EDNS_PAYLOAD = 1232  # bytes: the DNS flag day 2020 size, for our queries and answers
MEMO_CAPACITY = 20_000  # cluster answers memoized per generation
UDP_BATCH = 64  # datagrams handled per wake-up before yielding to other tasks

_QUERIES = REGISTRY.counter(
    "agent_dns_queries_total", "DNS queries received by the node DNS server", ("protocol",)
)
_HITS = REGISTRY.counter(
    "agent_dns_cache_hits_total", "DNS queries answered from the cache or the memo of answers"
)
_FORWARDS = REGISTRY.counter("agent_dns_forwards_total", "DNS queries forwarded upstream")
_FAILURES = REGISTRY.counter(
    "agent_dns_forward_failures_total", "forwarded DNS queries no upstream answered (SERVFAIL)"
)
_MALFORMED = REGISTRY.counter(
    "agent_dns_malformed_total", "DNS packets that could not be parsed (FORMERR or dropped)"
)


class ForwardError(Exception):
    """No upstream nameserver answered."""


def upstreams_from(resolv: ResolvConf, own: tuple[str, int]) -> list[tuple[str, int]]:
    """The upstream servers (address, 53) of `resolv`, without this server's own address."""
    out: list[tuple[str, int]] = []
    for text in resolv.nameservers:
        try:
            ip = ipaddress.ip_address(text.split("%", 1)[0])
        except ValueError:
            log.warning("resolv.conf: ignoring nameserver %r (not an IP address)", text)
            continue
        if (str(ip), 53) == (own[0], own[1]) or (ip.is_unspecified and own[1] == 53):
            log.info("resolv.conf: skipping nameserver %s: it is this DNS server (a loop)", ip)
            continue
        if (str(ip), 53) not in out:
            out.append((str(ip), 53))
    return out


class Forwarder:
    """Sends a query to the upstream servers in turn (UDP, TCP on truncation); the one that
    answered last is asked first next time."""

    def __init__(self, upstreams: list[tuple[str, int]], timeout: float = UPSTREAM_TIMEOUT) -> None:
        self.upstreams = list(upstreams)
        self.timeout = timeout
        self._first = 0
        self._backend = dns.asyncbackend.get_backend("trio")

    async def resolve(self, query: dns.message.Message) -> dns.message.Message:
        if not self.upstreams:
            raise ForwardError("no upstream nameservers (the node's resolv.conf has none)")
        errors: list[str] = []
        n = len(self.upstreams)
        for i in range(n):
            index = (self._first + i) % n
            host, port = self.upstreams[index]
            try:
                with trio.fail_after(self.timeout):
                    resp = await _udp_exchange(query, host, port)
                if resp.flags & dns.flags.TC:
                    resp = await dns.asyncquery.tcp(
                        query, host, timeout=self.timeout, port=port, backend=self._backend
                    )
            except trio.TooSlowError:
                errors.append(f"{host}:{port}: no answer within {self.timeout}s")
                continue
            except (dns.exception.DNSException, OSError, EOFError) as exc:
                errors.append(f"{host}:{port}: {exc or type(exc).__name__}")
                continue
            self._first = index
            return resp
        raise ForwardError("; ".join(errors))


async def _udp_exchange(query: dns.message.Message, host: str, port: int) -> dns.message.Message:
    """`query` to (host, port) over UDP from a fresh socket (a random source port per query,
    against spoofed answers); datagrams that are not its answer are ignored. dnspython's async
    `udp()` does the same but costs several times more per query under concurrency."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.setblocking(False)
        sock.connect((host, port))  # only the upstream's datagrams reach this socket
        sock.send(query.to_wire())
        while True:
            await trio.lowlevel.wait_readable(sock)
            try:
                data = sock.recv(65535)
            except BlockingIOError:
                continue
            try:
                resp = dns.message.from_wire(data, ignore_trailing=True)
            except dns.exception.DNSException:
                continue  # junk: keep waiting for the real answer
            if query.is_response(resp):
                return resp


@dataclass
class DnsStats:
    queries: int = 0
    cache_hits: int = 0
    local_answers: int = 0
    forwarded: int = 0
    forward_failures: int = 0
    malformed: int = 0
    dropped: int = 0


@dataclass
class _Forward:
    """A query that needs an upstream: its key (if any), the parsed query, and for a followed
    CNAME the local part of the answer."""

    key: RequestKey | None
    query: dns.message.Message
    local: dns.message.Message | None = None


@dataclass
class DnsServer:
    """The node DNS server (module doc). `run` binds UDP and TCP on (`host`, `port`; 0 = any
    free port, the same for both) and reports the address bound."""

    view: ClusterView
    zone: Zone
    forwarder: Forwarder
    host: str = "127.0.0.1"
    port: int = 53
    cache: ResponseCache = field(default_factory=ResponseCache)
    max_inflight: int = 1000
    clock: Callable[[], float] = trio.current_time
    stats: DnsStats = field(default_factory=DnsStats)

    def __post_init__(self) -> None:
        self._generation: int | None = None
        self._records = ClusterRecords(self.zone)
        self._memo: dict[object, bytes] = {}
        self._inflight = 0
        self._tcp_clients = 0

    # ------------------------------------------------------------------------ the sync part
    def records(self) -> ClusterRecords:
        """The index of the current snapshot (rebuilt when the view's generation changed)."""
        gen = self.view.generation
        if gen != self._generation:
            self._records = ClusterRecords.build(
                self.view.services(), self.view.endpoint_slices(), self.zone, serial=gen
            )
            self._memo = {}
            self._generation = gen
        return self._records

    def try_local(self, data: bytes, limit: int | None) -> bytes | _Forward | None:
        """The answer to `data` if it needs no upstream, a `_Forward` if it does, None to drop
        it. `limit`: the largest answer the transport takes (None: the client's UDP limit)."""
        self.stats.queries += 1
        records = self.records()
        key = request_key(data)
        if key is not None:
            max_size = limit or key.udp_limit
            wire = self._memo.get(key.key)
            if wire is None:
                wire = self.cache.get(key.key, self.clock())
            if wire is not None:
                self.stats.cache_hits += 1
                _HITS.inc()
                return self._fit(splice(wire, data, key.question_end), data, max_size)
        try:
            query = dns.message.from_wire(data)
        except Exception:
            self.stats.malformed += 1
            _MALFORMED.inc()
            return _formerr(data)
        if query.flags & dns.flags.QR:
            self.stats.dropped += 1
            return None  # a response: never answer those (reflection loops)
        if query.opcode() != dns.opcode.QUERY:
            return _rcode(query, dns.rcode.NOTIMP)  # NOTIFY, UPDATE...: not a cache's job
        if len(query.question) != 1:
            self.stats.malformed += 1
            return _rcode(query, dns.rcode.FORMERR)
        try:
            resp = records.answer(query)
        except Exception:
            log.exception("answering %s failed", query.question)
            return _rcode(query, dns.rcode.SERVFAIL)
        if resp is None:
            return _Forward(key, query)
        if _needs_chase(resp, query, self._records.origin):
            return _Forward(key, query, resp)
        self.stats.local_answers += 1
        wire = resp.to_wire(max_size=65535)
        if key is not None:
            if len(self._memo) >= MEMO_CAPACITY:
                self._memo.clear()
            self._memo[key.key] = _zero_id(wire)
        return self._fit(wire, data, limit or (key.udp_limit if key else _udp_limit(query)))

    def _fit(self, wire: bytes, data: bytes, max_size: int) -> bytes:
        if len(wire) <= max_size:
            return wire
        try:
            query = dns.message.from_wire(data)
        except Exception:
            return wire[:12]
        resp = dns.message.make_response(query)
        resp.flags |= dns.flags.TC | dns.flags.RA
        return resp.to_wire()

    # ----------------------------------------------------------------------- the async part
    def _guarded(self, data: bytes, limit: int | None) -> bytes | _Forward | None:
        """`try_local`, where a bug drops the query instead of stopping the server."""
        try:
            return self.try_local(data, limit)
        except Exception:
            log.exception("node DNS: handling a query failed (dropped)")
            self.stats.dropped += 1
            return None

    async def _forward_guarded(self, fw: _Forward, limit: int | None) -> bytes:
        """`forward`, where a bug is a SERVFAIL instead of stopping the server."""
        try:
            return await self.forward(fw, limit)
        except Exception:
            log.exception("node DNS: forwarding %s failed", fw.query.question)
            return _rcode(fw.query, dns.rcode.SERVFAIL)

    async def forward(self, fw: _Forward, limit: int | None) -> bytes:
        """The answer to a query that needs an upstream (SERVFAIL when none answers)."""
        q = fw.query
        qname, qtype = q.question[0].name, q.question[0].rdtype
        if fw.local is not None:
            qname = fw.local.answer[-1][0].target
        upstream_q = dns.message.make_query(
            qname,
            qtype,
            q.question[0].rdclass,
            use_edns=0 if q.edns >= 0 else False,
            want_dnssec=bool(q.ednsflags & dns.flags.DO),
            payload=EDNS_PAYLOAD,
        )
        upstream_q.flags = q.flags & (dns.flags.RD | dns.flags.CD | dns.flags.AD)
        self.stats.forwarded += 1
        _FORWARDS.inc()
        try:
            resp = await self.forwarder.resolve(upstream_q)
        except ForwardError as exc:
            self.stats.forward_failures += 1
            _FAILURES.inc()
            log.debug("forwarding %s failed: %s", qname, exc)
            return _rcode(q, dns.rcode.SERVFAIL)
        if fw.local is not None:
            out = fw.local
            out.answer.extend(r for r in resp.answer if r.rdtype in (qtype, dns.rdatatype.CNAME))
            return self._fit(out.to_wire(max_size=65535), q.to_wire(), limit or _udp_limit(q))
        resp.id = q.id
        resp.question = q.question
        if q.edns >= 0:
            resp.use_edns(0, resp.ednsflags & dns.flags.DO, EDNS_PAYLOAD, options=[])
        else:
            resp.use_edns(False)
        if fw.key is not None:  # the cached copy's ID does not matter: `splice` sets it
            self.cache.put(fw.key.key, resp, self.clock())
        try:
            wire = resp.to_wire(max_size=65535)
        except dns.exception.DNSException:
            return _rcode(q, dns.rcode.SERVFAIL)
        return self._fit(wire, q.to_wire(), limit or _udp_limit(q))

    async def run(
        self, *, task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # A plain non-blocking socket read in batches after one `wait_readable`: a trio socket
        # checkpoints on every datagram, which halves the rate of cache hits.
        udp = socket.socket(family, socket.SOCK_DGRAM)
        with udp:
            udp.setblocking(False)
            udp.bind((self.host, self.port))
            port = udp.getsockname()[1]
            listeners = await trio.open_tcp_listeners(port, host=self.host)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._serve_udp, udp, nursery)
                nursery.start_soon(trio.serve_listeners, self._serve_tcp, listeners)
                log.info("node DNS server on %s port %d (UDP and TCP)", self.host, port)
                task_status.started((self.host, port))

    async def _serve_udp(self, sock: socket.socket, nursery: trio.Nursery) -> None:
        while True:
            await trio.lowlevel.wait_readable(sock)
            for _ in range(UDP_BATCH):
                try:
                    data, addr = sock.recvfrom(65535)
                except BlockingIOError:
                    break
                except OSError as exc:  # e.g. an ICMP error for an earlier answer: keep serving
                    log.debug("DNS UDP receive: %s", exc)
                    continue
                _QUERIES.labels("udp").inc()
                result = self._guarded(data, None)
                if isinstance(result, _Forward):
                    if self._inflight >= self.max_inflight:
                        self.stats.dropped += 1
                        continue
                    self._inflight += 1
                    nursery.start_soon(self._forward_udp, sock, result, addr)
                elif result is not None:
                    await self._sendto(sock, result, addr)
            await trio.lowlevel.checkpoint()  # a flood must not starve the other tasks

    async def _forward_udp(self, sock: socket.socket, fw: _Forward, addr: Any) -> None:
        try:
            wire = await self._forward_guarded(fw, None)
        finally:
            self._inflight -= 1
        await self._sendto(sock, wire, addr)

    async def _sendto(self, sock: socket.socket, wire: bytes, addr: Any) -> None:
        try:
            try:
                sock.sendto(wire, addr)
            except BlockingIOError:  # the send buffer is full: wait once, else drop
                with trio.move_on_after(1.0):
                    await trio.lowlevel.wait_writable(sock)
                    sock.sendto(wire, addr)
        except OSError as exc:  # the client went away, or still full: it will retry
            self.stats.dropped += 1
            log.debug("DNS UDP send to %s: %s", addr, exc)

    async def _serve_tcp(self, stream: trio.abc.Stream) -> None:
        if self._tcp_clients >= MAX_TCP_CLIENTS:  # a flood of connections must not eat all fds
            self.stats.dropped += 1
            await trio.aclose_forcefully(stream)
            return
        self._tcp_clients += 1
        buffer = bytearray()
        try:
            while True:
                with trio.move_on_after(TCP_IDLE_TIMEOUT) as idle:
                    while True:
                        if len(buffer) >= 2:
                            (length,) = struct.unpack_from("!H", buffer)
                            if len(buffer) >= 2 + length:
                                break
                        chunk = await stream.receive_some(65536)
                        if not chunk:
                            return
                        buffer += chunk
                if idle.cancelled_caught:
                    return
                data = bytes(buffer[2 : 2 + length])
                del buffer[: 2 + length]
                _QUERIES.labels("tcp").inc()
                result = self._guarded(data, 65535)
                if isinstance(result, _Forward):
                    result = await self._forward_guarded(result, 65535)
                if result is None:
                    continue
                await stream.send_all(struct.pack("!H", len(result)) + result)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return
        finally:
            self._tcp_clients -= 1
            await trio.aclose_forcefully(stream)


def _udp_limit(query: dns.message.Message) -> int:
    return max(512, query.payload) if query.edns >= 0 else 512


def _zero_id(wire: bytes) -> bytes:
    return b"\0\0" + wire[2:]


def _needs_chase(
    resp: dns.message.Message, query: dns.message.Message, origin: dns.name.Name
) -> bool:
    """An ExternalName's CNAME to a name outside the cluster domain, asked for an address."""
    qtype = query.question[0].rdtype
    if qtype in (dns.rdatatype.CNAME, dns.rdatatype.ANY) or len(resp.answer) != 1:
        return False
    rrset = resp.answer[0]
    return rrset.rdtype == dns.rdatatype.CNAME and not rrset[0].target.is_subdomain(origin)


def _rcode(query: dns.message.Message, rcode: dns.rcode.Rcode) -> bytes:
    resp = dns.message.make_response(query)
    resp.flags |= dns.flags.RA
    resp.set_rcode(rcode)
    return resp.to_wire()


def _formerr(data: bytes) -> bytes | None:
    """FORMERR for a packet whose header is readable and that is a query; else None (drop)."""
    if len(data) < 12:
        return None
    ident, flags = struct.unpack_from("!HH", data)
    if flags & 0x8000:
        return None
    out_flags = 0x8000 | (flags & 0x7800) | (flags & 0x0100) | 0x0080 | dns.rcode.FORMERR
    return struct.pack("!HHHHHH", ident, out_flags, 0, 0, 0, 0)
