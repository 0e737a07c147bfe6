"""The node DNS server's pure cores: the request key of a query's wire form and the TTL cache of
responses (both without I/O; the clock is an argument).

Theory of operation
-------------------
`request_key(wire)` reads a query's header, question and optional EDNS OPT record without a
full parse. Two queries with the same key get the same response, byte for byte, except the ID
(first two bytes) and the question's spelling (0x20 case randomization): the key holds the
lower-cased question, the RD/CD/AD flags and the EDNS version and DO bit. Anything unusual
(several questions, compression in the question, records other than one OPT, a response) has
no key: the server parses such a query fully and answers it uncached.

`ResponseCache` maps keys to responses (dnspython messages with ID 0), bounded (least recently
used entries go first), each kept for its TTL (RFC 2181/2308):

- positive: the smallest TTL of the answer section, at most `max_ttl`;
- negative (NXDOMAIN, or NOERROR without answers): min(SOA TTL, SOA minimum) of the SOA in the
  authority section, at most `max_negative_ttl`; without an SOA, not cached;
- anything else (SERVFAIL, REFUSED, truncated, TTL 0): not cached.

`get(key, now)` returns the response's wire form with every TTL lowered by the whole seconds
spent in the cache (rendered once per second of age, so a busy name costs a dict lookup), or
None when absent or expired. `splice(cached, query)` makes it the answer to one query: the
query's ID and question bytes in place of the cached ones (same length by construction).
"""

from __future__ import annotations

import math
import struct
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass

import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype

__all__ = ["CacheStats", "RequestKey", "ResponseCache", "cache_ttl", "request_key", "splice"]

_FLAGS_IN_KEY = 0x0100 | 0x0010 | 0x0020  # RD, CD, AD: they change the answer
_QR, _OPCODE, _TC = 0x8000, 0x7800, 0x0200
OPT = 41


@dataclass(frozen=True)
class RequestKey:
    """What identifies a query's response (`key`), where its question ends, and the largest UDP
    response the client accepts."""

    key: Hashable
    question_end: int
    udp_limit: int


def request_key(wire: bytes) -> RequestKey | None:
    """The cache key of a query in wire form, or None when it is unusual (module doc)."""
    if len(wire) < 17:
        return None
    _id, flags, qd, an, ns, ar = struct.unpack_from("!HHHHHH", wire)
    if flags & (_QR | _OPCODE | _TC) or qd != 1 or an or ns or ar > 1:
        return None
    pos = 12
    while True:  # the name: plain labels only (a client has nothing to compress against)
        length = wire[pos]
        if length & 0xC0:
            return None
        pos += 1 + length
        if length == 0:
            break
        if pos >= len(wire):
            return None
    question_end = pos + 4
    if question_end > len(wire):
        return None
    question = wire[12:question_end].lower()
    edns: tuple[int, bool] | None = None
    limit = 512
    if ar:
        # OPT: root name, type 41, class = payload size, ttl = ext-rcode/version/flags
        if len(wire) < question_end + 11 or wire[question_end] != 0:
            return None
        rtype, payload, _ext, version, eflags, rdlen = struct.unpack_from(
            "!HHBBHH", wire, question_end + 1
        )
        if rtype != OPT or question_end + 11 + rdlen != len(wire):
            return None
        edns = (version, bool(eflags & 0x8000))
        limit = max(512, min(payload, 65535))
    elif question_end != len(wire):
        return None
    return RequestKey((question, flags & _FLAGS_IN_KEY, edns), question_end, limit)


def splice(cached: bytes, query: bytes, question_end: int) -> bytes:
    """`cached` (a response with the same key) answering `query`: its ID and question."""
    return query[:2] + cached[2:12] + query[12:question_end] + cached[question_end:]


def cache_ttl(response: dns.message.Message, max_ttl: int, max_negative_ttl: int) -> int:
    """Seconds `response` may be cached (0: not at all), by the rules of the module doc."""
    if response.flags & dns.flags.TC:
        return 0
    rcode = response.rcode()
    if rcode == dns.rcode.NOERROR and response.answer:
        return max(0, min(min(int(r.ttl) for r in response.answer), max_ttl))
    if rcode in (dns.rcode.NOERROR, dns.rcode.NXDOMAIN):
        for rrset in response.authority:
            if rrset.rdtype == dns.rdatatype.SOA and len(rrset):
                minimum = int(rrset[0].minimum)
                return max(0, min(int(rrset.ttl), minimum, max_negative_ttl))
    return 0


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    inserts: int = 0
    evictions: int = 0


@dataclass
class _Entry:
    message: dns.message.Message
    stored: float
    expires: float
    age: int = -1  # whole seconds of age `wire` was rendered for
    wire: bytes = b""


class ResponseCache:
    """A bounded TTL cache of responses by request key (module doc). Not thread-safe."""

    def __init__(
        self, capacity: int = 10_000, max_ttl: int = 3600, max_negative_ttl: int = 1800
    ) -> None:
        if capacity < 1:
            raise ValueError(f"cache capacity must be at least 1, not {capacity}")
        self.capacity = capacity
        self.max_ttl = max_ttl
        self.max_negative_ttl = max_negative_ttl
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self.stats = CacheStats()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, key: Hashable, response: dns.message.Message, now: float) -> bool:
        """Keep `response` for its TTL (False: not cacheable, nothing kept)."""
        ttl = cache_ttl(response, self.max_ttl, self.max_negative_ttl)
        if ttl <= 0:
            return False
        self._entries.pop(key, None)
        self._entries[key] = _Entry(response, now, now + ttl)
        self.stats.inserts += 1
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
            self.stats.evictions += 1
        return True

    def get(self, key: Hashable, now: float) -> bytes | None:
        """The cached response's wire form with TTLs aged (ID 0), or None."""
        entry = self._entries.get(key)
        if entry is None or now >= entry.expires:
            if entry is not None:
                del self._entries[key]
            self.stats.misses += 1
            return None
        self._entries.move_to_end(key)
        age = max(0, math.floor(now - entry.stored))
        if age != entry.age:
            entry.wire = _aged(entry.message, age)
            entry.age = age
        self.stats.hits += 1
        return entry.wire

    def expire(self, now: float) -> int:
        """Drop every expired entry; how many."""
        dead = [k for k, e in self._entries.items() if now >= e.expires]
        for k in dead:
            del self._entries[k]
        return len(dead)


def _aged(message: dns.message.Message, age: int) -> bytes:
    if age == 0:
        return message.to_wire(max_size=65535)
    copy = dns.message.from_wire(message.to_wire(max_size=65535))
    for section in (copy.answer, copy.authority, copy.additional):
        for rrset in section:
            rrset.ttl = max(0, rrset.ttl - age)
    return copy.to_wire(max_size=65535)
