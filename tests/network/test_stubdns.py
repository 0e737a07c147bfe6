"""The network lab's stub upstream DNS server (`orchestrator.testing.stubdns`): its pure answer
function, and one round trip over loopback UDP."""

from __future__ import annotations

import dns.message
import dns.rcode
import dns.rdatatype
import pytest
import trio

from orchestrator.testing.stubdns import TTL, answer, parse_records, serve

RECORDS = parse_records(["ext.example.org=192.0.2.99"])


def ask(name: str, rdtype: str = "A") -> dns.message.Message:
    query = dns.message.make_query(name, rdtype)
    wire = answer(query.to_wire(), RECORDS)
    assert wire is not None
    response = dns.message.from_wire(wire)
    assert response.id == query.id
    return response


def test_known_name_gets_its_address() -> None:
    r = ask("EXT.example.org.")
    assert r.rcode() == dns.rcode.NOERROR
    [rrset] = r.answer
    assert rrset.ttl == TTL
    assert [rd.to_text() for rd in rrset] == ["192.0.2.99"]


def test_other_type_of_known_name_is_nodata_unknown_name_nxdomain() -> None:
    r = ask("ext.example.org", "AAAA")
    assert (r.rcode(), r.answer) == (dns.rcode.NOERROR, [])
    assert ask("nope.example.org").rcode() == dns.rcode.NXDOMAIN


def test_garbage_gets_formerr_or_nothing() -> None:
    assert answer(b"\x00", RECORDS) is None
    reply = answer(b"\x12\x34" + b"\xff" * 20, RECORDS)
    assert reply is not None
    assert reply[:2] == b"\x12\x34"
    assert reply[3] & 0x0F == dns.rcode.FORMERR
    # A response is never answered (no loops between two servers).
    response = dns.message.make_response(dns.message.make_query("ext.example.org", "A"))
    assert answer(response.to_wire(), RECORDS) is None


@pytest.mark.parametrize("spec", ["noequals", "=1.2.3.4", "x.org=300.1.1.1", "x.org=::1"])
def test_bad_record_is_a_clear_error(spec: str) -> None:
    with pytest.raises(ValueError, match=r"."):
        parse_records([spec])


async def test_serves_over_udp_on_loopback() -> None:
    with trio.fail_after(10):
        probe = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
        await probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()  # a free port a moment ago
        async with trio.open_nursery() as nursery:
            await nursery.start(serve, "127.0.0.1", port, RECORDS)
            client = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
            with client:
                query = dns.message.make_query("ext.example.org", "A")
                await client.sendto(query.to_wire(), ("127.0.0.1", port))
                data, _ = await client.recvfrom(4096)
            r = dns.message.from_wire(data)
            assert [rd.to_text() for rd in r.answer[0]] == ["192.0.2.99"]
            nursery.cancel_scope.cancel()
