"""The DNS server's pure cores (`agent.net.dnscache`): request keys, the TTL rules, expiry,
aging, bounds and LRU eviction (also against a model, with hypothesis)."""

from __future__ import annotations

import struct

import dns.flags
import dns.message
import dns.rcode
import dns.rrset
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.agent.net.dnscache import ResponseCache, cache_ttl, request_key, splice


def query(name: str = "example.com", rdtype: str = "A", **kw: object) -> dns.message.Message:
    return dns.message.make_query(name, rdtype, **kw)  # type: ignore[arg-type]


def response(
    name: str = "example.com", ttl: int = 300, rcode: int = 0, soa: tuple[int, int] | None = None
) -> dns.message.Message:
    resp = dns.message.make_response(query(name))
    resp.set_rcode(dns.rcode.Rcode(rcode))
    if ttl >= 0 and rcode == 0 and soa is None:
        resp.answer.append(dns.rrset.from_text(name + ".", ttl, "IN", "A", "192.0.2.1"))
    if soa is not None:
        soa_ttl, minimum = soa
        resp.authority.append(
            dns.rrset.from_text(
                "com.", soa_ttl, "IN", "SOA", f"a.gtld. nstld. 1 1800 900 604800 {minimum}"
            )
        )
    return resp


# --------------------------------------------------------------------------- request keys
def test_key_ignores_id_and_case() -> None:
    a, b = query("Example.COM"), query("example.com")
    a.id, b.id = 1, 2
    ka, kb = request_key(a.to_wire()), request_key(b.to_wire())
    assert ka is not None
    assert kb is not None
    assert ka.key == kb.key
    assert ka.udp_limit == 512


@pytest.mark.parametrize(
    "other",
    [
        query("example.com", "AAAA"),
        query("example.org"),
        query("example.com", use_edns=0),
        query("example.com", want_dnssec=True),
    ],
)
def test_key_tells_apart_what_changes_the_answer(other: dns.message.Message) -> None:
    base = request_key(query().to_wire())
    key = request_key(other.to_wire())
    assert base is not None
    assert key is not None
    assert base.key != key.key


def test_key_of_rd_flag() -> None:
    q = query()
    q.flags &= ~dns.flags.RD
    assert request_key(q.to_wire()).key != request_key(query().to_wire()).key  # type: ignore[union-attr]


def test_edns_payload_is_the_udp_limit() -> None:
    key = request_key(query(use_edns=0, payload=1232).to_wire())
    assert key is not None
    assert key.udp_limit == 1232
    key = request_key(query(use_edns=0, payload=100).to_wire())
    assert key is not None
    assert key.udp_limit == 512


def test_unusual_queries_have_no_key() -> None:
    resp = response().to_wire()
    two = bytearray(query().to_wire())
    two[4:6] = struct.pack("!H", 2)
    compressed = query().to_wire()[:12] + b"\xc0\x0c" + b"\x00\x01\x00\x01"
    for wire in (
        b"",
        b"\x00" * 11,
        resp,
        bytes(two),
        compressed,
        query().to_wire() + b"junk",
        query().to_wire()[:-2],
        query(use_edns=0).to_wire()[:-3],
    ):
        assert request_key(wire) is None


@given(st.binary(max_size=80))
def test_request_key_never_raises(wire: bytes) -> None:
    request_key(wire)


def test_splice_puts_the_querys_id_and_spelling() -> None:
    q2 = query("EXAMPLE.com")
    q2.id = 4321
    r = response("example.com")
    k = request_key(q2.to_wire())
    assert k is not None
    out = dns.message.from_wire(splice(r.to_wire(), q2.to_wire(), k.question_end))
    assert out.id == q2.id
    assert out.question[0].name.to_text() == "EXAMPLE.com."
    assert [r.to_text() for r in out.answer[0]] == ["192.0.2.1"]


# ----------------------------------------------------------------------------- TTL rules
def test_positive_ttl_is_the_smallest_answer_ttl_capped() -> None:
    resp = response(ttl=300)
    resp.answer.append(dns.rrset.from_text("example.com.", 60, "IN", "AAAA", "2001:db8::1"))
    assert cache_ttl(resp, 3600, 1800) == 60
    assert cache_ttl(response(ttl=86400), 3600, 1800) == 3600


def test_negative_ttl_is_the_soa_minimum() -> None:
    assert cache_ttl(response(rcode=dns.rcode.NXDOMAIN, soa=(900, 60)), 3600, 1800) == 60
    assert cache_ttl(response(rcode=dns.rcode.NXDOMAIN, soa=(30, 600)), 3600, 1800) == 30
    assert cache_ttl(response(soa=(900, 120)), 3600, 1800) == 120  # NODATA
    assert cache_ttl(response(rcode=dns.rcode.NXDOMAIN, soa=(9000, 9000)), 3600, 1800) == 1800


@pytest.mark.parametrize(
    "resp",
    [
        response(rcode=dns.rcode.NXDOMAIN),  # no SOA
        response(rcode=dns.rcode.SERVFAIL),
        response(rcode=dns.rcode.REFUSED),
        response(ttl=0),
    ],
)
def test_not_cacheable(resp: dns.message.Message) -> None:
    assert cache_ttl(resp, 3600, 1800) == 0
    cache = ResponseCache()
    assert not cache.put("k", resp, 0.0)
    assert cache.get("k", 0.0) is None


def test_truncated_is_not_cached() -> None:
    resp = response()
    resp.flags |= dns.flags.TC
    assert cache_ttl(resp, 3600, 1800) == 0


# --------------------------------------------------------------------------- the cache
def test_entry_lives_for_its_ttl_and_ages() -> None:
    cache = ResponseCache()
    assert cache.put("k", response(ttl=10), now=100.0)
    fresh = cache.get("k", 100.0)
    assert fresh is not None
    assert dns.message.from_wire(fresh).answer[0].ttl == 10
    later = cache.get("k", 103.7)
    assert later is not None
    assert dns.message.from_wire(later).answer[0].ttl == 7
    assert cache.get("k", 103.9) is later  # rendered once per second of age
    assert cache.get("k", 110.0) is None  # expired
    assert len(cache) == 0
    assert cache.stats.hits == 3
    assert cache.stats.misses == 1


def test_negative_entries_age_too() -> None:
    cache = ResponseCache()
    cache.put("k", response(rcode=dns.rcode.NXDOMAIN, soa=(900, 30)), now=0.0)
    wire = cache.get("k", 12.0)
    assert wire is not None
    msg = dns.message.from_wire(wire)
    assert msg.rcode() == dns.rcode.NXDOMAIN
    assert msg.authority[0].ttl == 888
    assert cache.get("k", 30.0) is None


def test_bounded_with_lru_eviction() -> None:
    cache = ResponseCache(capacity=2)
    cache.put("a", response(), 0.0)
    cache.put("b", response(), 0.0)
    assert cache.get("a", 1.0) is not None  # a is now the most recent
    cache.put("c", response(), 1.0)
    assert cache.get("b", 1.0) is None
    assert cache.get("a", 1.0) is not None
    assert cache.get("c", 1.0) is not None
    assert cache.stats.evictions == 1


def test_put_replaces() -> None:
    cache = ResponseCache()
    cache.put("k", response(ttl=5), 0.0)
    cache.put("k", response(ttl=50), 1.0)
    assert cache.get("k", 20.0) is not None
    assert len(cache) == 1


def test_expire_drops_dead_entries() -> None:
    cache = ResponseCache()
    cache.put("short", response(ttl=5), 0.0)
    cache.put("long", response(ttl=50), 0.0)
    assert cache.expire(10.0) == 1
    assert len(cache) == 1


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity"):
        ResponseCache(capacity=0)


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["put", "get", "tick"]),
        st.sampled_from("abcde"),
        st.integers(min_value=1, max_value=20),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(_OPS, st.integers(min_value=1, max_value=4))
def test_matches_a_model(ops: list[tuple[str, str, int]], capacity: int) -> None:
    """Against a dict of key -> (expiry, last use): hits, TTLs and LRU eviction agree."""
    cache = ResponseCache(capacity=capacity)
    model: dict[str, tuple[float, float, float]] = {}  # key -> (stored, expires, last use)
    now = 0.0
    use = 0
    for op, key, n in ops:
        use += 1
        if op == "tick":
            now += n / 2
            continue
        if op == "put":
            cache.put(key, response(ttl=n), now)
            model[key] = (now, now + n, use)
            if len(model) > capacity:
                oldest = min(model, key=lambda k: model[k][2])
                del model[oldest]
            continue
        wire = cache.get(key, now)
        entry = model.get(key)
        if entry is None or now >= entry[1]:
            model.pop(key, None)
            assert wire is None
            continue
        assert wire is not None
        assert dns.message.from_wire(wire).answer[0].ttl == int(entry[1] - entry[0]) - int(
            now - entry[0]
        )
        model[key] = (entry[0], entry[1], use)
    assert len(cache) <= capacity
