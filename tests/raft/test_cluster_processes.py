"""End-to-end tests of real `orchestrator server` processes (Raft over SQLite + TCP).

Every test starts its own cluster of separate OS processes on loopback ports (see
`tests/cluster.py`), drives it through `StoreClient`, raw sockets or the CLI, and checks what a
client can observe: acknowledged writes survive leader crashes and snapshot catch-up, hostile
input on either port changes nothing, and membership changes through the CLI take effect.

Conditions are polled with a deadline (never a fixed sleep), every test body runs under
`trio.fail_after`, and the cluster context manager kills every process at the end (dumping the
server logs if the test failed).

The tests at the end pin down bugs found in the server code (now fixed): each docstring says
what used to go wrong.
"""

from __future__ import annotations

import json
import socket
import struct
import sys
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio
from cluster import Cluster, admin_tls, check_reads, raw_request

from orchestrator.raft.codec import encode_message
from orchestrator.raft.framing import FrameDecoder, encode_frame
from orchestrator.raft.types import Message, MsgType
from orchestrator.store.client import Indeterminate, StoreClient

pytestmark = pytest.mark.slow

HUGE_TERM = 10**9
OUTSIDER = 99  # a node id that is never a member


# ---------------------------------------------------------------------------------- helpers
def value_for(key: str) -> bytes:
    return f"value:{key}".encode()


async def wait_for(predicate: Any, *, within: float, what: str) -> None:
    """Poll a plain predicate with a deadline."""
    deadline = trio.current_time() + within
    while True:
        if predicate():
            return
        if trio.current_time() >= deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await trio.sleep(0.02)


async def settled_request(
    endpoint: str, op: str, *args: Any, within: float = 10.0
) -> tuple[str, Any]:
    """A raw request retried while the server answers "unavailable" (a new leader refuses
    membership changes until it has applied an entry of its own term), as clients do."""
    deadline = trio.current_time() + within
    while True:
        status, detail = await raw_request(endpoint, op, *args)
        if status != "unavailable" or trio.current_time() >= deadline:
            return status, detail
        await trio.sleep(0.05)


async def wait_for_log(cluster: Any, i: int, text: str, *, within: float = 10.0) -> None:
    async def seen() -> bool:
        return text in cluster.log_text(i)

    await cluster.wait_until(seen, within=within, what=f"{text!r} in the log of server {i}")


async def writer(
    kv: StoreClient,
    prefix: str,
    stop: trio.Event,
    acked: dict[str, bytes],
    indeterminate: dict[str, bytes],
) -> None:
    """Write unique keys until `stop`; a write whose outcome is unknown is kept apart."""
    seq = 0
    while not stop.is_set():
        key = f"{prefix}-{seq}"
        seq += 1
        value = value_for(key)
        with trio.move_on_after(10) as cs:
            try:
                await kv.put(key, value)
            except Indeterminate:
                indeterminate[key] = value
                continue
        if cs.cancelled_caught:
            indeterminate[key] = value
        else:
            acked[key] = value


async def write_keys(kv: StoreClient, keys: list[str], concurrency: int = 16) -> None:
    limiter = trio.CapacityLimiter(concurrency)

    async def one(key: str) -> None:
        async with limiter:
            assert await kv.put(key, value_for(key))

    async with trio.open_nursery() as nursery:
        for key in keys:
            nursery.start_soon(one, key)


def hello(node_id: int, port: int = 1) -> bytes:
    """The first frame a peer sends on a connection (see `transport`)."""
    return encode_frame(msgpack.packb({"id": node_id, "addr": ["127.0.0.1", port]}))


async def expect_closed(
    stream: trio.abc.Stream, *, within: float = 5.0, may_write: bool = False
) -> None:
    """The server closes the connection (EOF or reset) without writing anything (but a TLS
    alert or a refusal frame, with `may_write`)."""
    with trio.fail_after(within):
        try:
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    return
                if not may_write:
                    raise AssertionError(f"the peer port wrote {data!r}")
        except (trio.BrokenResourceError, ConnectionResetError):
            return


async def open_peer(cluster: Any, i: int) -> trio.SocketStream:
    return await trio.open_tcp_stream("127.0.0.1", cluster.servers[i].peer_port)


async def open_peer_as(cluster: Any, i: int, data_dir: Path) -> trio.SSLStream[Any]:
    """A TLS connection to server i's peer port with the peer certificate in data_dir/pki."""
    from pkikit import client_context

    pki = data_dir / "pki"
    ctx = client_context(data_dir, pki / "peer.crt", pki / "peer.key")
    stream = trio.SSLStream(await open_peer(cluster, i), ctx, server_hostname=None)
    await stream.do_handshake()
    return stream


async def open_client(cluster: Any, i: int) -> trio.SSLStream[trio.SocketStream]:
    """An admin's TLS connection to server i's client port (handshake done)."""
    sock = await trio.open_tcp_stream("127.0.0.1", cluster.servers[i].client_port)
    stream = trio.SSLStream(sock, admin_tls(), server_hostname=None)
    await stream.do_handshake()
    return stream


async def read_responses(stream: trio.abc.Stream, count: int) -> list[list[Any]]:
    """Read `count` response frames (fewer if the server closes the connection)."""
    decoder = FrameDecoder(64 << 20)
    out: list[list[Any]] = []
    while len(out) < count:
        try:
            data = await stream.receive_some(65536)
        except (trio.BrokenResourceError, ConnectionResetError):
            break
        if not data:
            break
        out += [msgpack.unpackb(f, strict_map_key=False) for f in decoder.receive_data(data)]
    return out


async def cli(*args: str) -> str:
    """Run `python -m orchestrator ARGS`; returns stdout, fails on a non-zero exit."""
    proc = await trio.run_process(
        [sys.executable, "-m", "orchestrator", *args],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert proc.returncode == 0, f"orchestrator {' '.join(args)} -> {proc.returncode}\n{out}{err}"
    return out


async def terms(cluster: Any) -> dict[int, int]:
    sts = await cluster.statuses()
    assert len(sts) == len(cluster.running()), "a running server did not answer status"
    return {i: st["term"] for i, st in sts.items()}


# ---------------------------------------------------------------------------------- a
async def test_acknowledged_writes_survive_leader_kills(tmp_path: Path) -> None:
    """8 concurrent writers; the leader is SIGKILLed mid-stream, twice. Every acknowledged write
    is readable afterwards, linearizably and from the restarted server's local copy."""
    with trio.fail_after(100), Cluster(tmp_path, 3, api=False) as cluster:
        cluster.start()
        await cluster.wait_leader()
        acked: dict[str, bytes] = {}
        indeterminate: dict[str, bytes] = {}
        async with StoreClient(cluster.endpoints, tls=admin_tls()) as kv:
            for cycle in range(2):
                stop = trio.Event()
                async with trio.open_nursery() as nursery:
                    for w in range(8):
                        nursery.start_soon(writer, kv, f"c{cycle}w{w}", stop, acked, indeterminate)

                    async def progress(n: int) -> None:
                        target = len(acked) + n
                        await wait_for(
                            lambda: len(acked) >= target,
                            within=20,
                            what=f"{n} more acknowledged writes",
                        )

                    await progress(100)
                    old = await cluster.wait_leader()
                    cluster.kill(old)
                    new = await cluster.wait_leader(within=20)
                    assert new != old
                    await progress(100)  # writers found the new leader
                    cluster.restart(old)
                    await cluster.wait_ready(old)
                    await progress(50)
                    stop.set()
                cluster.check_alive()
                assert acked, "no write was acknowledged"
                await check_reads(kv, acked, indeterminate)
                st = await cluster.wait_caught_up(old)
                assert st["role"] == "follower"
                await check_reads(kv, acked, indeterminate, stale_endpoint=cluster.endpoint(old))
        # The cluster kept serving through both crashes: a handful of writes were in flight at
        # each kill, but nearly all of them were acknowledged.
        assert len(indeterminate) < len(acked) // 4, (len(indeterminate), len(acked))
        cluster.check_alive()


async def test_killed_leader_is_replaced_in_one_election_without_a_timeout(
    tmp_path: Path,
) -> None:
    """kill -9 closes the leader's connections at once: both survivors hear that it is down
    (not from an election timeout, made long here) and the next term's election is the only
    one: they campaign in turn, so they do not split the vote."""
    with (
        trio.fail_after(60),
        Cluster(tmp_path, 3, tick_ms=50, election_ticks=60, api=False) as cluster,
    ):
        cluster.start()
        old = await cluster.wait_leader(within=30)
        st = await cluster.status(old)
        assert st is not None
        old_term = st["term"]
        cluster.kill(old)
        survivors = [i for i in range(3) if i != old]
        for i in survivors:
            await wait_for_log(cluster, i, f"leader {cluster.node_id(old)} is down", within=10)
        new = await cluster.wait_leader(within=30)
        assert new in survivors
        assert set((await terms(cluster)).values()) == {old_term + 1}


# ---------------------------------------------------------------------------------- b
async def test_follower_catches_up_from_a_snapshot(tmp_path: Path) -> None:
    """A follower that was down while the leader compacted its log past the follower's position
    is brought back with InstallSnapshot and then serves every value locally."""
    with (
        trio.fail_after(60),
        Cluster(tmp_path, 3, snapshot_every=50, keep_tail=10, api=False) as cluster,
    ):
        cluster.start()
        leader = await cluster.wait_leader()
        follower = (leader + 1) % 3
        async with StoreClient(cluster.endpoints, tls=admin_tls()) as kv:
            await write_keys(kv, [f"early-{i}" for i in range(5)])
            before = await cluster.wait_caught_up(follower)
            cluster.kill(follower)

            # The leader keeps pipelining appends to the dead follower until `max_inflight` (64)
            # are unacknowledged, and its transport queues them for the restart; one write at a
            # time makes those 64 appends cover only the next ~64 entries, so what follows can
            # only reach the follower as a snapshot.
            keys = [f"early-{i}" for i in range(5)] + [f"snap-{i}" for i in range(400)]
            await write_keys(kv, keys[5:105], concurrency=1)
            await write_keys(kv, keys[105:])
            leader = await cluster.wait_leader()
            lst = await cluster.status(leader)
            assert lst is not None
            assert lst["snapshot_index"] > 0, lst
            # The entries the follower needs next are gone from the leader's log.
            assert lst["first_index"] > before["applied"] + 1, (lst, before)

            cluster.restart(follower)
            st = await cluster.wait_caught_up(follower)
            assert st["snapshot_index"] > 0, st
            assert "installed snapshot" in cluster.log_text(follower)
            acked = {k: value_for(k) for k in keys}
            await check_reads(kv, acked, {}, stale_endpoint=cluster.endpoint(follower))
            # And it keeps replicating normally after the snapshot.
            await write_keys(kv, ["after-0", "after-1"])
            await cluster.wait_caught_up(follower)
            await check_reads(
                kv,
                {k: value_for(k) for k in ["after-0", "after-1"]},
                {},
                stale_endpoint=cluster.endpoint(follower),
            )
        cluster.check_alive()


# ---------------------------------------------------------------------------------- c
async def test_hostile_input_on_the_peer_port_changes_nothing(tmp_path: Path) -> None:
    """Garbage and plain TCP (no TLS), a non-member's CA-signed peer certificate, then on a
    member's own (stolen) certificate oversized, undecodable and misrouted frames: every server
    keeps running, no term jumps and writes keep succeeding."""
    from cluster import CLUSTER_TOKEN
    from pkikit import server_pki

    with trio.fail_after(60), Cluster(tmp_path, 3, tick_ms=100, api=False) as cluster:
        cluster.start()
        leader = await cluster.wait_leader()
        follower = (leader + 1) % 3
        async with StoreClient(cluster.endpoints, tls=admin_tls()) as kv:
            await write_keys(kv, ["stable-0", "stable-1"])
            terms_before = await terms(cluster)

            # Streams the server must close: none of them is TLS (it may answer an alert).
            for payload in (
                b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
                b"\xff\xff\xff\xff" + b"\x00" * 64,
                encode_frame(b"\xc1\xc1\xc1"),
                hello(OUTSIDER) + b"\xff\xff\xff\xff",
            ):
                s = await open_peer(cluster, follower)
                async with s:
                    await s.send_all(payload)
                    await expect_closed(s, may_write=True)
                await cluster.wait_ready(follower, within=5)  # raises ServerDied if it crashed

            # A non-member with a certificate of this cluster's CA, calling with a huge term:
            # refused after its hello, nothing reaches Raft.
            outsider = tmp_path / "outsider"
            server_pki(outsider, OUTSIDER, CLUSTER_TOKEN)
            for i in range(3):
                me = cluster.node_id(i)
                vote = Message(
                    MsgType.VOTE, me, OUTSIDER, HUGE_TERM, log_term=HUGE_TERM, index=HUGE_TERM
                )
                s2 = await open_peer_as(cluster, i, outsider)
                async with s2:
                    await s2.send_all(hello(OUTSIDER) + encode_frame(encode_message(vote)))
                    await expect_closed(s2, may_write=True)
                await wait_for_log(cluster, i, f"node {OUTSIDER} is not a member")

            # Bad frames on a member's certificate: dropped one by one on a connection that
            # survives (the misrouted message after them is seen; at most 5 complaints per
            # connection are logged at WARNING).
            bad_frames = [
                msgpack.packb("just a string"),
                msgpack.packb([999, 1, 2, 1, 0, 0, [], 0, False, 0, None, b""]),  # type 999
                msgpack.packb([1, 1, 2, -5, 0, 0, [], 0, False, 0, None, b""]),  # bad term
                b"\xc1",  # not msgpack
            ]
            i = follower
            j = (follower + 1) % 3
            member = cluster.servers[j].data_dir
            misrouted = Message(MsgType.HEARTBEAT, OUTSIDER, cluster.node_id(j), 1)
            s3 = await open_peer_as(cluster, i, member)
            async with s3:
                await s3.send_all(
                    hello(cluster.node_id(j))
                    + b"".join(encode_frame(f) for f in bad_frames)
                    + encode_frame(encode_message(misrouted))
                )
                await wait_for_log(cluster, i, "dropping HEARTBEAT from")
            assert "dropping undecodable frame" in cluster.log_text(i)
            cluster.check_alive()
            assert await terms(cluster) == terms_before
            await write_keys(kv, ["after-peer-garbage"])
            assert await kv.get("after-peer-garbage") == value_for("after-peer-garbage")
            assert await kv.get("stable-0") == value_for("stable-0")
        cluster.check_alive()


# ---------------------------------------------------------------------------------- d
async def test_membership_changes_through_the_cli(tmp_path: Path) -> None:
    """Join a 4th server as a learner, promote it, remove one of the founders, all with the
    `orchestrator member` command; writes keep working and status shows the new membership."""
    with trio.fail_after(60), Cluster(tmp_path, 3, api=False) as cluster:
        cluster.start()
        leader = await cluster.wait_leader()
        founders = ",".join(cluster.endpoints)
        async with StoreClient(cluster.endpoints, tls=admin_tls()) as kv:
            early = [f"early-{i}" for i in range(20)]
            await write_keys(kv, early)

            admin_dir = str(cluster.servers[0].data_dir)  # its admin certificate, for the CLI
            new = cluster.add_server(join=True)
            new_id = cluster.node_id(new)
            st = await cluster.wait_ready(new)
            assert st["voters"] == []
            assert st["role"] == "follower"

            out = await cli(
                "member",
                "add-learner",
                str(new_id),
                cluster.peer_addr(new),
                "--data-dir",
                str(cluster.servers[0].data_dir),
                "--endpoints",
                founders,
            )
            assert out.strip() == "OK"
            st = await cluster.wait_caught_up(new)
            assert st["learners"] == [new_id], st
            assert st["voters"] == [1, 2, 3], st
            await check_reads(
                kv, {k: value_for(k) for k in early}, {}, stale_endpoint=cluster.endpoint(new)
            )

            await cli(
                "member", "promote", str(new_id), "--data-dir", admin_dir, "--endpoints", founders
            )

            async def voters_are(expected: list[int]) -> bool:
                lead = await cluster.leader_index()
                st = None if lead is None else await cluster.status(lead)
                return st is not None and st["voters"] == expected and st["learners"] == []

            await cluster.wait_until(
                lambda: voters_are([1, 2, 3, new_id]),
                within=15,
                what="the learner to become a voter",
            )

            # Remove a founder that is not the leader (the leader hands over nothing here).
            leader = await cluster.wait_leader()
            victim = next(i for i in range(3) if i != leader)
            victim_id = cluster.node_id(victim)
            await cli(
                "member",
                "remove",
                str(victim_id),
                "--data-dir",
                admin_dir,
                "--endpoints",
                ",".join(cluster.endpoints),
            )
            remaining = sorted({1, 2, 3, new_id} - {victim_id})
            await cluster.wait_until(
                lambda: voters_are(remaining), within=15, what=f"node {victim_id} to be removed"
            )
            cluster.stop(victim)

            later = [f"later-{i}" for i in range(20)]
            await write_keys(kv, later)
            assert await kv.get("later-19") == value_for("later-19")

            # Every remaining server reports the new membership through `status -o json`.
            live = [cluster.endpoint(i) for i in cluster.running()]
            for i in cluster.running():
                await cluster.wait_caught_up(i)
            out = await cli(
                "status", "--data-dir", admin_dir, "--endpoints", ",".join(live), "-o", "json"
            )
            report = json.loads(out)
            assert set(report) == set(live)
            for ep, st in report.items():
                assert "error" not in st, (ep, st)
                assert st["voters"] == remaining, (ep, st)
                assert st["learners"] == [], (ep, st)
            assert sum(st["role"] == "leader" for st in report.values()) == 1
            await check_reads(
                kv,
                {k: value_for(k) for k in early + later},
                {},
                stale_endpoint=cluster.endpoint(new),
            )
        cluster.check_alive()


# ---------------------------------------------------------------------------------- c (2)
async def test_hostile_input_on_the_client_port_changes_nothing(tmp_path: Path) -> None:
    """Malformed requests (wrong arity, wrong types, unknown op, not msgpack) are answered
    "error"; garbage, oversized frames, a truncated frame and a connection reset close the
    connection. The server keeps running, nothing is committed, and writes keep succeeding.
    (Store-only servers: the API server's own background writes would move the commit index.)"""
    with trio.fail_after(60), Cluster(tmp_path, 3, tick_ms=100, api=False) as cluster:
        cluster.start()
        leader = await cluster.wait_leader()
        follower = (leader + 1) % 3
        async with StoreClient(cluster.endpoints, tls=admin_tls()) as kv:
            await write_keys(kv, ["stable-0", "stable-1"])
            terms_before = await terms(cluster)
            await cluster.wait_caught_up(follower)
            # Every malformed request is answered "error" and changes nothing.
            lst = await cluster.status(leader)
            assert lst is not None
            commit_before = lst["commit"]
            requests = [
                msgpack.packb([1, "put", ["k-arity"]]),  # wrong arity
                msgpack.packb([2, "put", [123, b"v"]]),  # key not a string
                msgpack.packb([3, "put", ["k-type", "a str, not bytes"]]),
                msgpack.packb([4, "frobnicate", []]),  # unknown op
                msgpack.packb([5, 42, []]),  # op not a string
                msgpack.packb([6, "get", []]),  # no key
                msgpack.packb([7, "cas", ["k-cas", 5, b"v"]]),  # expected not bytes
                msgpack.packb([8, "delete", [None]]),
                msgpack.packb([9, "add_learner", ["four", "127.0.0.1:1"]]),
                msgpack.packb([10, "promote", [-1]]),
                msgpack.packb([11, "remove", [True]]),
                msgpack.packb([12, "transfer", []]),
                msgpack.packb([13, "put", "not a list"]),  # args not an array
                msgpack.packb({"id": 14}),  # not an array
                msgpack.packb([15, "put"]),  # two fields
                b"\xc1",  # not msgpack
                b"\x01\x02",  # msgpack with trailing bytes
                b"",  # empty frame
            ]
            s = await open_client(cluster, leader)
            async with s:
                await s.send_all(b"".join(encode_frame(r) for r in requests))
                with trio.fail_after(10):
                    responses = await read_responses(s, len(requests))
            assert len(responses) == len(requests), responses
            assert all(r[1] == "error" for r in responses), responses
            # Requests that are not [id, op, [args]] cannot be matched: they are answered with id
            # nil.
            assert sorted(r[0] for r in responses if r[0] is not None) == list(range(1, 13))

            for payload in (
                b"\xff\xff\xff\xff",  # oversized length header
                b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
            ):
                s = await open_client(cluster, follower)
                async with s:
                    await s.send_all(payload)
                    with trio.fail_after(5):
                        assert await read_responses(s, 1) == []  # closed without an answer
                await cluster.wait_ready(follower, within=5)  # raises ServerDied if it crashed
            s = await open_client(cluster, follower)
            async with s:
                await s.send_all(encode_frame(msgpack.packb([1, "put", ["k", b"v"]]))[:7])
            # (a truncated frame and a hang-up: nothing to answer, nothing to do)
            await cluster.wait_ready(follower, within=5)

            # A client that resets its connection (SO_LINGER 0) with a request in flight.
            s = await open_client(cluster, follower)
            raw = s.transport_stream
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            await s.send_all(encode_frame(msgpack.packb([1, "status", []])))
            raw.socket.close()  # RST instead of FIN
            # Its answer is lost; the next client is served as usual.
            await cluster.wait_ready(follower, within=5)

            cluster.check_alive()
            lst = await cluster.status(leader)
            assert lst is not None
            assert lst["commit"] == commit_before, "a bad request was committed"
            for key in ("k-arity", "k-type", "k-cas", "k"):
                assert await kv.get(key) is None
            assert await kv.get("stable-0") == value_for("stable-0")
            await write_keys(kv, ["after-client-garbage"])
            assert await kv.get("after-client-garbage") == value_for("after-client-garbage")
            assert await terms(cluster) == terms_before
        cluster.check_alive()


# ---------------------------------------------------------------------------------- known bugs
async def test_heartbeat_from_a_non_member_does_not_raise_the_term(tmp_path: Path) -> None:
    with trio.fail_after(30), Cluster(tmp_path, 3, tick_ms=100, api=False) as cluster:
        cluster.start()
        leader = await cluster.wait_leader()
        follower = (leader + 1) % 3
        before = await terms(cluster)
        beat = Message(MsgType.HEARTBEAT, cluster.node_id(follower), OUTSIDER, HUGE_TERM)
        from cluster import CLUSTER_TOKEN
        from pkikit import server_pki

        server_pki(tmp_path / "outsider", OUTSIDER, CLUSTER_TOKEN)  # the cluster CA's, even
        s = await open_peer_as(cluster, follower, tmp_path / "outsider")
        async with s:
            await s.send_all(hello(OUTSIDER) + encode_frame(encode_message(beat)))

            async def handled() -> bool:  # refused (mTLS), dropped (the fix) or obeyed (the bug)
                text = cluster.log_text(follower)
                return (
                    f"node {OUTSIDER} is not a member" in text
                    or f"from non-member {OUTSIDER}" in text
                    or f"leader is now {OUTSIDER}" in text
                )

            await cluster.wait_until(handled, within=5, what="the heartbeat to be handled")
        assert await terms(cluster) == before


async def test_a_term_beyond_64_bits_does_not_crash_the_server(tmp_path: Path) -> None:
    with trio.fail_after(30), Cluster(tmp_path, 3, tick_ms=100, api=False) as cluster:
        cluster.start()
        leader = await cluster.wait_leader()
        follower = (leader + 1) % 3
        member = (follower + 1) % 3  # on a member's certificate: non-members are refused
        sender = cluster.node_id(member)
        beat = Message(MsgType.HEARTBEAT, cluster.node_id(follower), sender, 2**63)
        s = await open_peer_as(cluster, follower, cluster.servers[member].data_dir)
        async with s:
            await s.send_all(hello(sender) + encode_frame(encode_message(beat)))
            # Refused at decoding: terms and indexes must fit SQLite's signed 64-bit INTEGER.
            await wait_for_log(cluster, follower, "dropping undecodable frame", within=3)
        await cluster.wait_leader()
        cluster.check_alive()


async def test_add_learner_with_a_bad_address_is_refused(tmp_path: Path) -> None:
    with trio.fail_after(30), Cluster(tmp_path, 3, tick_ms=100, api=False) as cluster:
        cluster.start()
        leader = await cluster.wait_leader()
        status, _ = await settled_request(cluster.endpoint(leader), "add_learner", 5, "nonsense")
        assert status == "error"
        await cluster.wait_leader()
        cluster.check_alive()


async def test_removing_a_non_member_is_an_error(tmp_path: Path) -> None:
    with trio.fail_after(30), Cluster(tmp_path, 3, tick_ms=100, api=False) as cluster:
        cluster.start()
        leader = await cluster.wait_leader()
        status, detail = await settled_request(cluster.endpoint(leader), "remove", OUTSIDER)
        assert status == "error", (status, detail)
