"""A stub upstream DNS server for network tests: it knows a few names and nothing else.

The network lab (`orchestrator.testing.netlab`) runs it in its own namespace as the devices'
upstream resolver (their `--resolv-conf` names it), so a test can check that a name outside the
cluster is forwarded by the node-local cluster DNS. It answers over UDP only (what a forwarder
asks first; every answer here is tiny, so none is truncated):

* an A question for a known name: one A record (TTL `TTL`), authoritative;
* any other question for a known name: NOERROR with no answer (NODATA);
* a question for an unknown name: NXDOMAIN;
* a message that is not a DNS query: FORMERR when its header can be read, else dropped.

`answer()` is the pure core (bytes in, bytes out, no I/O); `serve()` is the trio UDP loop.

    python -m orchestrator.testing.stubdns --listen 192.0.2.53 --record ext.example.org=192.0.2.99
"""

from __future__ import annotations

import argparse
import ipaddress
import sys
from collections.abc import Mapping, Sequence

import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset
import trio

__all__ = ["TTL", "answer", "parse_records", "serve"]

TTL = 30


def parse_records(specs: Sequence[str]) -> dict[str, str]:
    """`["name=1.2.3.4", ...]` as {absolute lower-case name: address}; ValueError when bad."""
    records: dict[str, str] = {}
    for spec in specs:
        name, sep, address = spec.partition("=")
        if not sep or not name:
            raise ValueError(f"record {spec!r}: expected NAME=IPV4")
        ipaddress.IPv4Address(address)  # raises ValueError with the address in the message
        records[dns.name.from_text(name).to_text().lower()] = address
    return records


def answer(wire: bytes, records: Mapping[str, str]) -> bytes | None:
    """The response to one query datagram (None: not worth an answer)."""
    try:
        query = dns.message.from_wire(wire)
    except dns.exception.DNSException:
        if len(wire) < 12:
            return None
        # Echo the id with FORMERR, so a confused client stops waiting.
        flags = dns.flags.QR | dns.rcode.FORMERR
        return wire[:2] + flags.to_bytes(2, "big") + bytes(8)
    if query.flags & dns.flags.QR or query.opcode() != dns.opcode.QUERY or not query.question:
        return None
    response = dns.message.make_response(query)
    response.flags |= dns.flags.AA
    question = query.question[0]
    address = records.get(question.name.to_text().lower())
    if address is None:
        response.set_rcode(dns.rcode.NXDOMAIN)
    elif question.rdtype == dns.rdatatype.A and question.rdclass == dns.rdataclass.IN:
        response.answer.append(
            dns.rrset.from_text(question.name, TTL, dns.rdataclass.IN, dns.rdatatype.A, address)
        )
    return response.to_wire()


async def serve(
    host: str,
    port: int,
    records: Mapping[str, str],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Answer queries on UDP host:port until cancelled."""
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    with sock:
        await sock.bind((host, port))
        task_status.started()
        while True:
            data, peer = await sock.recvfrom(4096)
            reply = answer(data, records)
            if reply is not None:
                await sock.sendto(reply, peer)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m orchestrator.testing.stubdns", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--listen", default="127.0.0.1", help="IPv4 address to answer on")
    parser.add_argument("--port", type=int, default=53)
    parser.add_argument("--record", action="append", default=[], help="NAME=IPV4 (repeatable)")
    args = parser.parse_args(argv)
    try:
        records = parse_records(args.record)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(serve, args.listen, args.port, records)
            print(f"stub DNS on {args.listen}:{args.port}: {sorted(records)}", flush=True)

    try:
        trio.run(run)
    except KeyboardInterrupt:
        return 0
    except OSError as e:
        print(f"error: cannot serve on {args.listen}:{args.port}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
