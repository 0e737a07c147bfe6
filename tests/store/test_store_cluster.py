"""The replicated store under faults, end to end, against real `orchestrator server` processes.

1. Three servers under concurrent put/cas/delete/get load on a few keys, with two watchers,
   while leaders are SIGKILLed and restarted, a follower is SIGKILLed and restarted and the
   leader is cut off from the others with the fault-injection op. The recorded history must be
   linearizable, and both watchers must have seen every revision exactly once, in order.
2. A follower that was down while the cluster snapshotted and auto-compacted catches up through
   a snapshot and then serves exactly the leader's data (current and historical) locally.
3. Power loss at an edge site: all three servers SIGKILLed at once under write load; after a
   restart every acknowledged write is there.
4. Regression: a watch served by a follower across and after its snapshot install delivers
   every revision (it used to skip the revisions the snapshot covered).

The last test pins a client bug (now fixed): writes did not fail over away from an isolated
leader.

Clusters are started with `tests/cluster.py`. Every test body runs under `trio.fail_after`;
conditions are polled against deadlines, never waited for with a fixed sleep.
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
import random
import signal
import sys
import time
from contextlib import aclosing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
from cluster import Cluster, admin_tls, check_reads

from orchestrator.store.client import Indeterminate, RequestFailed, StoreClient
from orchestrator.store.types import Compacted, Event, EventType, NoQuorum, Unavailable
from orchestrator.testing.linearizability import Operation, check_history

pytestmark = pytest.mark.slow

QUORUM_TIMEOUT = 5.0  # RaftStore's default quorum_timeout: a request without quorum gives up
OP_TIMEOUT = 15.0  # a client operation still running after this is recorded as indeterminate


# ---------------------------------------------------------------------------------- helpers
async def wait_for(predicate: Any, *, within: float, what: str, interval: float = 0.02) -> None:
    """Poll a plain predicate against a deadline."""
    deadline = trio.current_time() + within
    while not predicate():
        if trio.current_time() >= deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await trio.sleep(interval)


@dataclass
class Recorder:
    """The history of one test: every operation with its call/return times and output."""

    ops: list[Operation] = field(default_factory=list)
    acked_writes: int = 0
    last_value: dict[str, bytes | None] = field(default_factory=dict)  # for plausible cas

    def record(self, op: Operation) -> None:
        self.ops.append(op)
        if op.ret is None:
            return
        if op.kind != "get":
            self.acked_writes += 1
        if op.kind == "get":
            self.last_value[op.key] = op.output if isinstance(op.output, bytes) else None
        elif op.kind == "put" or (op.kind == "cas" and op.output):
            self.last_value[op.key] = op.value
        elif op.kind == "delete":
            self.last_value[op.key] = None

    async def progress(self, n: int, *, within: float = 30.0) -> None:
        """Until `n` more writes have been acknowledged."""
        target = self.acked_writes + n
        await wait_for(
            lambda: self.acked_writes >= target,
            within=within,
            what=f"{n} more acknowledged writes (at {self.acked_writes})",
        )


async def run_op(
    kv: StoreClient,
    rec: Recorder,
    client: int,
    kind: str,
    key: str,
    value: bytes | None = None,
    expected: bytes | None = None,
) -> None:
    """One client operation, recorded; an unknown outcome is recorded with ret=None."""
    call = time.monotonic()
    ret: float | None = None
    output: object = None
    with trio.move_on_after(OP_TIMEOUT):
        try:
            if kind == "put":
                assert value is not None
                output = await kv.put(key, value)
            elif kind == "cas":
                assert value is not None
                output = await kv.cas(key, expected, value)
            elif kind == "delete":
                output = await kv.delete(key)
            else:
                output = await kv.get(key)
            ret = time.monotonic()
        except Indeterminate:
            pass
    rec.record(Operation(client, kind, key, value, expected, call, ret, output))


async def load_writer(
    kv: StoreClient, rec: Recorder, client: int, keys: list[str], stop: trio.Event
) -> None:
    rng = random.Random(client)
    seq = 0
    while not stop.is_set():
        key = rng.choice(keys)
        seq += 1
        value = f"c{client}-{seq}".encode()  # unique: a value names its write
        r = rng.random()
        if r < 0.45:
            await run_op(kv, rec, client, "put", key, value)
        elif r < 0.8:
            expected = rec.last_value.get(key) if rng.random() < 0.85 else None
            await run_op(kv, rec, client, "cas", key, value, expected)
        else:
            await run_op(kv, rec, client, "delete", key)


async def load_reader(
    kv: StoreClient, rec: Recorder, client: int, keys: list[str], stop: trio.Event
) -> None:
    rng = random.Random(client)
    while not stop.is_set():
        await run_op(kv, rec, client, "get", rng.choice(keys))


@dataclass
class WatchLog:
    events: list[Event] = field(default_factory=list)
    revision: int = 0  # the watcher has seen every event up to here
    batches: int = 0


async def watch_into(endpoints: list[str], prefix: str, start: int, log: WatchLog) -> None:
    async with StoreClient(endpoints, tls=admin_tls()) as w:
        async for events, revision in w.watch(prefix, start):
            log.events.extend(events)
            log.revision = max(log.revision, revision)
            log.batches += 1


async def faults_all(ctl: StoreClient, cluster: Any, *args: Any) -> None:
    """Send a fault-injection op to every server (each one filters its own outbound traffic)."""
    for ep in cluster.endpoints:
        with trio.fail_after(5):
            assert await ctl.call_once(ep, "faults", *args) is True


async def put_surely(kv: StoreClient, key: str, value: bytes) -> None:
    """A put retried until acknowledged (idempotent: the same value again). A write on a
    connection to a server that was just killed can come back Indeterminate."""
    while True:
        try:
            assert await kv.put(key, value) is True
            return
        except Indeterminate:
            continue


async def delete_surely(kv: StoreClient, key: str) -> None:
    """Delete an existing key; after an Indeterminate attempt the retry may find it gone."""
    retried = False
    while True:
        try:
            assert await kv.delete(key) or retried
            return
        except Indeterminate:
            retried = True


async def watch_until(endpoint: str, prefix: str, start: int, end: int) -> list[Event]:
    """The events a watch on one server from `start` delivers up to revision `end`."""
    got: list[Event] = []
    async with (
        StoreClient([endpoint], tls=admin_tls()) as w,
        aclosing(w.watch(prefix, start)) as stream,
    ):
        with trio.fail_after(10):
            async for events, revision in stream:
                got.extend(events)
                if revision >= end:
                    break
    return [e for e in got if e.kv.mod_revision <= end]


async def drain_watch(client: StoreClient, prefix: str, start: int) -> None:
    """Consume a watch until it raises (it never ends on its own)."""
    async with aclosing(client.watch(prefix, start)) as stream:
        async for _ in stream:
            pass


def event_summary(e: Event) -> tuple[int, str, int, bytes]:
    return (e.kv.mod_revision, e.kv.key, int(e.type), e.kv.value)


async def wait_rejoined(cluster: Any, i: int, *, within: float = 30.0) -> dict[str, Any]:
    """Until server i follows the current leader and has applied everything the leader had
    committed a moment before (usable while writes go on, unlike `wait_caught_up`)."""

    async def rejoined() -> dict[str, Any] | None:
        lead = await cluster.leader_index()
        if lead is None or lead == i:
            return None
        ls = await cluster.status(lead)
        st = await cluster.status(i)
        if ls is None or st is None:
            return None
        ok = st["role"] == "follower" and st["term"] == ls["term"] and st["applied"] >= ls["commit"]
        return st if ok else None

    return await cluster.wait_until(rejoined, within=within, what=f"server {i} to rejoin")


@dataclass
class Probe:
    answer: str | None = None
    elapsed: float = 0.0


async def nemesis(cluster: Any, ctl: StoreClient, rec: Recorder, keys: list[str]) -> Probe:
    """The faults of test 1, each followed by proof that writes still get through."""
    await rec.progress(30)

    # The leader crashes and comes back, three times.
    for _ in range(3):
        old = await cluster.wait_leader()
        cluster.kill(old)
        await cluster.wait_leader(exclude=[old])
        await rec.progress(20)
        cluster.restart(old)
        await cluster.wait_ready(old)
        await wait_rejoined(cluster, old)
        await rec.progress(20)

    # A follower crashes and comes back.
    lead = await cluster.wait_leader()
    follower = (lead + 1) % 3
    cluster.kill(follower)
    await rec.progress(20)
    cluster.restart(follower)
    await cluster.wait_ready(follower)
    await wait_rejoined(cluster, follower)
    await rec.progress(20)

    # The leader is cut off (every server drops its messages to/from it): it stops accepting
    # writes within the quorum timeout, and the majority elects a new leader that accepts them.
    old = await cluster.wait_leader()
    await faults_all(ctl, cluster, "isolate", cluster.node_id(old))
    probe = Probe()
    probe_value = b"sent-to-the-isolated-leader"
    call = time.monotonic()
    with trio.fail_after(QUORUM_TIMEOUT + 3):
        try:
            await ctl.call_once(cluster.endpoint(old), "put", keys[0], probe_value)
            probe.answer = "ok"
        except (NoQuorum, Unavailable) as exc:
            probe.answer = exc.code
        except RequestFailed as exc:
            probe.answer = exc.status
        except Indeterminate as exc:
            probe.answer = f"connection lost: {exc}"
    probe.elapsed = time.monotonic() - call
    # Not acknowledged: as far as the history goes, its outcome is unknown.
    rec.record(Operation(99, "put", keys[0], probe_value, None, call, None, None))
    assert probe.answer in ("timeout", "no_quorum", "not_leader", "unavailable", "lost"), (
        f"the isolated leader answered {probe.answer!r} to a write"
    )
    assert probe.elapsed <= QUORUM_TIMEOUT + 2, probe.elapsed

    new = await cluster.wait_leader(exclude=[old], within=20)
    majority_value = b"sent-to-the-majority-leader"
    while True:  # a write sent straight to the new leader is accepted
        call = time.monotonic()
        try:
            with trio.fail_after(QUORUM_TIMEOUT + 3):
                ok = await ctl.call_once(cluster.endpoint(new), "put", keys[1], majority_value)
        except RequestFailed as exc:
            if exc.status != "not_leader":  # (not_leader: leadership moved on meanwhile)
                raise
            new = await cluster.wait_leader(exclude=[old], within=20)
            continue
        rec.record(Operation(98, "put", keys[1], majority_value, None, call, time.monotonic(), ok))
        break
    await rec.progress(20)
    st_old, st_new = await cluster.status(old), await cluster.status(new)
    assert st_old is not None
    assert st_new is not None
    assert st_new["term"] > st_old["term"], (st_old, st_new)

    await faults_all(ctl, cluster, "heal")
    await wait_rejoined(cluster, old)
    await rec.progress(20)
    return probe


# ---------------------------------------------------------------------------------- 1
async def test_linearizable_and_watchers_complete_under_crashes_and_partition(
    tmp_path: Path,
) -> None:
    prefix = "lin/"
    keys = [f"{prefix}k{i}" for i in range(4)]
    rec = Recorder()
    watch_logs = [WatchLog(), WatchLog()]
    with (
        trio.fail_after(150),
        Cluster(
            tmp_path, 3, tick_ms=50, extra_args=["--enable-fault-injection"], api=False
        ) as cluster,
    ):
        cluster.start()
        await cluster.wait_leader()
        async with (
            StoreClient(cluster.endpoints, tls=admin_tls()) as kv,
            StoreClient(cluster.endpoints, tls=admin_tls()) as ctl,
        ):
            start_rev = await kv.revision()
            stop = trio.Event()
            async with trio.open_nursery() as watchers:
                # Watchers from the first revision, starting on different servers.
                eps = cluster.endpoints
                watchers.start_soon(watch_into, eps, prefix, 1, watch_logs[0])
                watchers.start_soon(watch_into, eps[2:] + eps[:2], prefix, 1, watch_logs[1])
                async with trio.open_nursery() as load:
                    for c in range(4):
                        load.start_soon(load_writer, kv, rec, c, keys, stop)
                    for c in range(4, 6):
                        load.start_soon(load_reader, kv, rec, c, keys, stop)
                    probe = await nemesis(cluster, ctl, rec, keys)
                    stop.set()  # the load tasks finish their current operation and return
                cluster.check_alive()
                # Final linearizable reads of every key, after every write has returned: the
                # checker then proves the final state is the one the history implies.
                for key in keys:
                    await run_op(kv, rec, 97, "get", key)
                final_rev = await kv.revision()
                final_kvs, range_rev, _ = await kv.range(prefix, revision=final_rev)
                assert range_rev == final_rev

                async def watchers_done() -> bool:
                    return all(w.revision >= final_rev for w in watch_logs)

                await cluster.wait_until(
                    watchers_done, within=30, what=f"both watchers to reach revision {final_rev}"
                )
                watchers.cancel_scope.cancel()

        # ---- linearizability of the whole history (includes final-state visibility, since
        # reads ran until the end).
        completed = sum(op.ret is not None for op in rec.ops)
        indeterminate = [op for op in rec.ops if op.ret is None]
        assert completed > 200, completed
        result = check_history(rec.ops, timeout=60)
        assert not result.timed_out, result.explanation
        assert result.ok, result.explanation

        # ---- watchers: every revision from the start to the end, once, in order.
        expected_revs = list(range(start_rev + 1, final_rev + 1))
        summaries = []
        for i, w in enumerate(watch_logs):
            seen = [e for e in w.events if e.kv.mod_revision <= final_rev]
            revs = [e.kv.mod_revision for e in seen]
            assert revs == expected_revs, (
                f"watcher {i}: revisions {start_rev + 1}..{final_rev} expected; "
                f"missing {sorted(set(expected_revs) - set(revs))[:10]}, "
                f"duplicated {sorted({r for r in revs if revs.count(r) > 1})[:10]}, "
                f"out of order: {[(a, b) for a, b in itertools.pairwise(revs) if b <= a][:10]}"
            )
            summaries.append([event_summary(e) for e in seen])
        assert summaries[0] == summaries[1], "the two watchers saw different events"

        # The state replayed from the watch stream is the store's final state.
        state: dict[str, tuple[bytes, int]] = {}
        for e in watch_logs[0].events:
            if e.kv.mod_revision > final_rev:
                continue
            if e.type == EventType.PUT:
                state[e.kv.key] = (e.kv.value, e.kv.mod_revision)
            else:
                state.pop(e.kv.key, None)
        assert state == {k.key: (k.value, k.mod_revision) for k in final_kvs}

        # Every acknowledged write is in the watch stream; every write in it was issued; and
        # the order of revisions respects real time (a write that returned before another was
        # called has a lower revision).
        put_rev = {
            (e.kv.key, e.kv.value): e.kv.mod_revision
            for e in watch_logs[0].events
            if e.type == EventType.PUT
        }
        issued = {(op.key, op.value) for op in rec.ops if op.kind in ("put", "cas")}
        assert set(put_rev) <= issued, set(put_rev) - issued
        writes = []
        for op in rec.ops:
            if op.ret is None or op.kind not in ("put", "cas") or op.output is not True:
                continue
            assert (op.key, op.value) in put_rev, f"acknowledged {op} is not in the watch stream"
            writes.append((op.call, op.ret, put_rev[(op.key, op.value)]))
        by_ret = sorted(writes, key=lambda w: w[1])
        rets = [w[1] for w in by_ret]
        max_rev_before: list[int] = []
        top = 0
        for w in by_ret:
            top = max(top, w[2])
            max_rev_before.append(top)
        for call, _ret, rev in writes:
            j = bisect.bisect_left(rets, call)  # writes that returned strictly before `call`
            if j:
                assert max_rev_before[j - 1] < rev, (call, rev, max_rev_before[j - 1])
        print(
            f"history: {len(rec.ops)} operations ({completed} completed, "
            f"{len(indeterminate)} indeterminate), revisions {start_rev}..{final_rev}, "
            f"watch batches {[w.batches for w in watch_logs]}, probe answer {probe.answer!r} "
            f"after {probe.elapsed:.2f}s"
        )


# ---------------------------------------------------------------------------------- 2
async def test_follower_restarted_after_compaction_catches_up_by_snapshot(tmp_path: Path) -> None:
    prefix = "cmp/"
    nkeys, workers = 24, 8
    keys = [f"{prefix}k{i:02d}" for i in range(nkeys)]
    with (
        trio.fail_after(100),
        Cluster(
            tmp_path,
            3,
            snapshot_every=50,
            keep_tail=10,
            extra_args=["--auto-compaction", "50"],
            api=False,
        ) as cluster,
    ):
        cluster.start()
        leader = await cluster.wait_leader()
        follower = (leader + 1) % 3
        model: dict[str, bytes] = {}
        async with StoreClient(cluster.endpoints, tls=admin_tls()) as kv:
            for k in keys[:4]:
                await put_surely(kv, k, b"early")
                model[k] = b"early"
            before = await cluster.wait_caught_up(follower)
            cluster.kill(follower)

            async def worker(w: int, rounds: int, tag: str) -> None:
                # Worker w owns the keys i with i % workers == w, so the model is exact.
                mine = keys[w::workers]
                for r in range(rounds):
                    key = mine[r % len(mine)]
                    if key in model and r % 5 == 4:
                        await delete_surely(kv, key)
                        del model[key]
                    else:
                        value = f"{tag}-{w}-{r}".encode()
                        await put_surely(kv, key, value)
                        model[key] = value

            # One write at a time first: the leader pipelines at most a window of appends to
            # the dead follower, so what comes after can only reach it as a snapshot.
            await worker(0, 100, "seq")
            async with trio.open_nursery() as n:
                for w in range(workers):
                    n.start_soon(worker, w, 40, "par")

            # Automatic compaction (keep the last 50 revisions) runs on the leader.
            async def compacted() -> dict[str, Any] | None:
                lead = await cluster.leader_index()
                st = None if lead is None else await cluster.status(lead)
                return st if st is not None and st["compact_revision"] > 0 else None

            lst = await cluster.wait_until(
                compacted, within=45, what="automatic compaction", interval=0.2
            )
            assert lst["compact_revision"] >= lst["revision"] - 50 - 400, lst
            # More writes after the compaction, so the next snapshot contains it.
            async with trio.open_nursery() as n:
                for w in range(workers):
                    n.start_soon(worker, w, 10, "post")
            leader = await cluster.wait_leader()
            lst = await cluster.status(leader)
            assert lst is not None
            assert lst["snapshot_index"] > 0, lst
            assert lst["first_index"] > before["applied"] + 1, (lst, before)

            cluster.restart(follower)
            fst = await cluster.wait_caught_up(follower, within=30)
            lst = await cluster.status(leader)
            assert lst is not None
            assert fst["snapshot_index"] > 0, fst
            assert "installed snapshot" in cluster.log_text(follower)
            assert fst["applied"] == lst["applied"], (fst, lst)
            assert fst["revision"] == lst["revision"], (fst, lst)
            assert fst["compact_revision"] == lst["compact_revision"], (fst, lst)
            compact_rev, current = lst["compact_revision"], lst["revision"]
            assert 0 < compact_rev < current

            lep, fep = cluster.endpoint(leader), cluster.endpoint(follower)
            # Stale (local) reads on the follower match the leader's and the model.
            for k in keys:
                lv = await kv.call_once(lep, "get", k, False)
                fv = await kv.call_once(fep, "get", k, False)
                assert fv == lv, (k, fv, lv)
                assert (None if lv is None else bytes(lv)) == model.get(k), (k, lv)
            # A stale range at the current revision, and one at the oldest revision kept.
            for rev in (current, compact_rev + 1):
                lr = await kv.call_once(lep, "range", prefix, 0, None, rev, False)
                fr = await kv.call_once(fep, "range", prefix, 0, None, rev, False)
                assert fr[:2] == lr[:2], (rev, fr, lr)
            lr = await kv.call_once(lep, "range", prefix, 0, None, current, False)
            assert {k: bytes(v) for k, v, *_ in lr[0]} == model

            # Below the compact revision the history is gone, on both servers.
            for ep in (lep, fep):
                with pytest.raises(Compacted):
                    await kv.call_once(ep, "range", prefix, 0, None, compact_rev - 1, False)

            # A watch from a compacted revision raises Compacted (on the follower as well).
            for eps in ([fep], cluster.endpoints):
                async with StoreClient(eps, tls=admin_tls()) as w:
                    with trio.fail_after(10), pytest.raises(Compacted) as info:
                        await drain_watch(w, prefix, 2)
                    assert info.value.compact_revision == compact_rev

            # The history kept above the compact revision is complete, on both servers: a
            # watch from just after it replays every revision up to the current one.
            replays = []
            for ep in (lep, fep):
                got = await watch_until(ep, prefix, compact_rev + 1, current)
                replays.append([event_summary(e) for e in got])
            assert [r[0] for r in replays[0]] == list(range(compact_rev + 1, current + 1))
            assert replays[1] == replays[0]

        # The status command agrees: every server applied the same index.
        proc = await trio.run_process(
            [
                sys.executable,
                "-m",
                "orchestrator",
                "status",
                "--data-dir",
                str(cluster.servers[0].data_dir),
                "--endpoints",
                ",".join(cluster.endpoints),
                "-o",
                "json",
            ],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr.decode()
        report = json.loads(proc.stdout)
        # (The leader's automatic compaction may have applied one more entry since `lst`.)
        applied = {st["applied"] for st in report.values()}
        assert len(applied) == 1, report
        assert applied.pop() >= lst["applied"], (report, lst)
        assert sum(st["role"] == "leader" for st in report.values()) == 1, report
        cluster.check_alive()


# ---------------------------------------------------------------------------------- 3
async def test_power_loss_of_every_server_keeps_acknowledged_writes(tmp_path: Path) -> None:
    with trio.fail_after(90), Cluster(tmp_path, 3, api=False) as cluster:
        cluster.start()
        await cluster.wait_leader()
        acked: dict[str, bytes] = {}
        unknown: dict[str, bytes] = {}

        async with StoreClient(cluster.endpoints, tls=admin_tls()) as kv:

            async def writer(w: int) -> None:
                for seq in range(10**9):
                    key = f"pl/w{w}-{seq}"
                    value = f"value-of-{key}".encode()
                    unknown[key] = value  # until acknowledged (or forever, if cut off)
                    try:
                        await kv.put(key, value)
                    except Indeterminate:
                        continue
                    del unknown[key]
                    acked[key] = value

            async with trio.open_nursery() as load:
                for w in range(8):
                    load.start_soon(writer, w)
                await wait_for(lambda: len(acked) >= 300, within=30, what="300 acknowledged writes")
                # Power cut: every server dies at the same instant.
                pids = [cluster.pid(i) for i in range(3)]
                for pid in pids:
                    assert pid is not None
                    os.kill(pid, signal.SIGKILL)
                for i in range(3):
                    cluster.kill(i)
                load.cancel_scope.cancel()
            acked_at_cut = dict(acked)
            assert acked_at_cut

            cluster.start()
            await cluster.wait_leader(within=30)

            async def check_all(endpoint: str | None) -> None:
                await check_reads(kv, acked_at_cut, unknown, stale_endpoint=endpoint)

            await check_all(None)
            # The cluster takes writes again, and every server has every acknowledged write.
            await put_surely(kv, "pl/after", b"after")
            for i in range(3):
                await cluster.wait_caught_up(i)
                await check_all(cluster.endpoint(i))
        cluster.check_alive()


# ---------------------------------------------------------------------------------- 4
async def test_watch_on_a_follower_that_installed_a_snapshot_misses_no_event(
    tmp_path: Path,
) -> None:
    """Regression: the follower's watch hub used to keep its pre-snapshot ring after a snapshot
    install, so a watch it served from a revision inside the snapshot silently skipped every
    revision the snapshot covered. A watch open on the follower across the install, and one
    opened afterwards, must both deliver every revision."""
    prefix = "snapw/"
    with (
        trio.fail_after(60),
        Cluster(tmp_path, 3, snapshot_every=50, keep_tail=10, api=False) as cluster,
    ):
        cluster.start()
        leader = await cluster.wait_leader()
        follower = (leader + 1) % 3
        async with StoreClient(cluster.endpoints, tls=admin_tls()) as kv:
            for i in range(3):
                await put_surely(kv, f"{prefix}early-{i}", b"early")
            before = await cluster.wait_caught_up(follower)
            cluster.kill(follower)
            for i in range(100):  # one at a time: the rest can only reach it as a snapshot
                await put_surely(kv, f"{prefix}seq-{i}", b"x")
            limiter = trio.CapacityLimiter(8)

            async def put(key: str) -> None:
                async with limiter:
                    await put_surely(kv, key, b"y")

            async with trio.open_nursery() as n:
                for i in range(200):
                    n.start_soon(put, f"{prefix}par-{i}")
            # From the first revision the follower did not have before it went down.
            start = before["revision"] + 1
            cluster.restart(follower)
            await cluster.wait_ready(follower)
            across = WatchLog()  # most likely open before the snapshot arrives
            async with trio.open_nursery() as n:
                n.start_soon(watch_into, [cluster.endpoint(follower)], prefix, start, across)
                await cluster.wait_caught_up(follower)
                assert "installed snapshot" in cluster.log_text(follower)
                leader = await cluster.wait_leader()
                lst = await cluster.status(leader)
                assert lst is not None
                current = lst["revision"]
                await wait_for(
                    lambda: across.revision >= current,
                    within=10,
                    what="the watch across the install to catch up",
                )
                n.cancel_scope.cancel()
            expected = list(range(start, current + 1))
            assert [e.kv.mod_revision for e in across.events] == expected
            on_leader = await watch_until(cluster.endpoint(leader), prefix, start, current)
            assert [e.kv.mod_revision for e in on_leader] == expected
            on_follower = await watch_until(cluster.endpoint(follower), prefix, start, current)
            revs = [e.kv.mod_revision for e in on_follower]
            assert revs == expected, (
                f"the follower's watch from {start} skipped "
                f"{len(set(expected) - set(revs))} revisions, e.g. "
                f"{sorted(set(expected) - set(revs))[:5]}; it started at {revs[:1]}"
            )


async def test_client_writes_fail_over_from_an_isolated_leader(tmp_path: Path) -> None:
    with (
        trio.fail_after(60),
        Cluster(
            tmp_path, 3, tick_ms=50, extra_args=["--enable-fault-injection"], api=False
        ) as cluster,
    ):
        cluster.start()
        old = await cluster.wait_leader()
        others = [cluster.endpoint(i) for i in range(3) if i != old]
        async with (
            StoreClient([cluster.endpoint(old), *others], tls=admin_tls()) as kv,
            StoreClient(cluster.endpoints, tls=admin_tls()) as ctl,
        ):
            assert await kv.put("iso/before", b"1") is True  # the client talks to the leader
            await faults_all(ctl, cluster, "isolate", cluster.node_id(old))
            await cluster.wait_leader(exclude=[old], within=20)
            outcomes: list[str] = []
            # The first write may go to the isolated server and come back indeterminate after
            # the quorum timeout; the client must then find the majority's leader.
            with trio.move_on_after(2 * QUORUM_TIMEOUT + 4):
                for i in itertools.count():
                    try:
                        await kv.put(f"iso/during-{i}", b"2")
                    except Indeterminate:
                        outcomes.append("indeterminate")
                        continue
                    outcomes.append("ok")
                    break
            await faults_all(ctl, cluster, "heal")
            assert "ok" in outcomes, f"no write got through to the majority: {outcomes}"
