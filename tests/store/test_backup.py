"""Backup and restore of the replicated store (`orchestrator backup` / `orchestrator restore`).

Fast tests: the file format (round trip; a damaged, truncated or foreign file is refused with a
clear error and nothing is written), refusing a non-empty data directory, the data directory a
restore creates (a Raft snapshot at the backup's index with this server alone as member), and
the `status` overview. Slow tests (real server processes): a backup taken while a writer keeps
writing holds exactly the acknowledged writes up to its revision, and a server started on the
restored directory serves them (and a new server joins it); Kubernetes objects survive the round
trip with their resourceVersion and the old kubeconfig's token still works; a server restored
with another token refuses to start.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import trio
from cluster import CLUSTER_TOKEN, REPO_ROOT, Cluster, admin_tls

from orchestrator.cli import status as status_cli
from orchestrator.cli.main import main
from orchestrator.raft.storage import RaftStorage
from orchestrator.raft.types import Entry, EntryType
from orchestrator.store.backup import (
    MAGIC,
    BackupError,
    decode_backup,
    read_backup,
    write_backup,
)
from orchestrator.store.client import StoreClient
from orchestrator.store.mvcc import MVCCStore
from orchestrator.store.types import encode_put


def _cli(*argv: str) -> tuple[int, str, str]:
    """Run `orchestrator ARGV` in this process (not from inside trio: it runs its own)."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def _make_image(tmp_path: Path, n: int = 20) -> tuple[dict[str, Any], bytes]:
    """A store with `n` keys (entries 1..n), as the server's backup op would send it."""
    store = MVCCStore(tmp_path / "src.db")
    try:
        store.apply(
            [
                Entry(1, i + 1, EntryType.NORMAL, encode_put(f"k{i}", b"v%d" % i, None))
                for i in range(n)
            ]
        )
        index, image = store.snapshot()
        meta = {"revision": store.revision(), "applied_index": index, "raft_term": 3}
    finally:
        store.close()
    return meta, image


# ---------------------------------------------------------------------------------- fast
def test_file_round_trip_and_damage_is_detected(tmp_path: Path) -> None:
    meta, image = _make_image(tmp_path)
    path = tmp_path / "b.bak"
    size = write_backup(path, meta, image)
    data = path.read_bytes()
    assert len(data) == size
    assert data.startswith(MAGIC)
    assert os.stat(path).st_mode & 0o777 == 0o600
    backup = read_backup(path)
    assert (backup.revision, backup.applied_index) == (21, 20)
    assert backup.image == image
    assert "token" in backup.meta["note"]

    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF
    with pytest.raises(BackupError, match="checksum"):
        decode_backup(bytes(flipped))
    with pytest.raises(BackupError, match="truncated"):
        decode_backup(data[:-100])
    with pytest.raises(BackupError, match="magic"):
        decode_backup(b"SQLite format 3\x00" + data[16:])
    # A valid envelope around a damaged image: the SQLite checks catch it.
    bad = bytearray(image)
    bad[len(bad) - 50] ^= 0xFF  # inside the last page
    bad_meta = dict(meta)
    write_backup(path, bad_meta, bytes(bad))
    with pytest.raises(BackupError):
        read_backup(path)
    # Metadata that disagrees with the image.
    write_backup(path, dict(meta, revision=99), image)
    with pytest.raises(BackupError, match="revision"):
        read_backup(path)


def test_restore_refuses_damaged_files_and_non_empty_dirs(tmp_path: Path) -> None:
    meta, image = _make_image(tmp_path)
    good = tmp_path / "good.bak"
    write_backup(good, meta, image)
    damaged = tmp_path / "damaged.bak"
    data = bytearray(good.read_bytes())
    data[200] ^= 0x01
    damaged.write_bytes(bytes(data))

    target = tmp_path / "new"
    rc, _, err = _cli("restore", str(damaged), "--data-dir", str(target))
    assert rc == 1
    assert "checksum" in err
    assert "nothing was restored" in err
    assert not target.exists()
    assert [p.name for p in tmp_path.iterdir() if ".restore." in p.name] == []

    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep").write_text("mine")
    rc, _, err = _cli("restore", str(good), "--data-dir", str(busy))
    assert rc == 1
    assert "not empty" in err
    assert [p.name for p in busy.iterdir()] == ["keep"]

    empty = tmp_path / "empty"
    empty.mkdir()
    rc, out, err = _cli(
        "restore", str(good), "--data-dir", str(empty), "--node-id", "4", "--peer-listen", "h:1"
    )
    assert rc == 0, err
    assert "revision 21" in out
    assert "--token" in err
    assert sorted(p.name for p in empty.iterdir()) == ["node-id", "raft.db", "store.db"]
    assert (empty / "node-id").read_text().strip() == "4"
    storage = RaftStorage(empty / "raft.db")
    try:
        state = storage.load()
        assert state.snapshot is not None
        assert state.entries == []
        snap = state.snapshot.meta
        assert (snap.index, snap.term, set(snap.conf.voters)) == (20, 3, {4})
        assert state.hard_state.commit == 20
        assert state.hard_state.term == 3
        assert storage.load_peers() == {4: "h:1"}
    finally:
        storage.close()
    store = MVCCStore(empty / "store.db")
    try:
        assert (store.applied_index(), store.revision()) == (20, 21)
        kv = store.get("k7")
        assert kv is not None
        assert (kv.value, kv.mod_revision) == (b"v7", 9)
    finally:
        store.close()


def test_status_overview_summarizes_nodes_and_pods() -> None:
    rows = [
        ("a", {"id": 1, "term": 3, "role": "follower", "leader": 2, "commit": 9,
               "voters": [1, 2, 3], "learners": []}),
        ("b", {"error": "connection refused"}),
        ("c", {"id": 2, "term": 3, "role": "leader", "leader": 2, "commit": 9,
               "voters": [1, 2, 3], "learners": [4]}),
    ]  # fmt: skip
    summary = status_cli.raft_summary(rows)
    assert summary == {"leader": 2, "term": 3, "voters": [1, 2, 3], "learners": [4]}

    def node(name: str, ready: str | None, cordoned: bool = False) -> dict[str, Any]:
        conds = [] if ready is None else [{"type": "Ready", "status": ready}]
        return {
            "metadata": {"name": name},
            "spec": {"unschedulable": cordoned},
            "status": {"conditions": conds},
        }

    def pod(phase: str | None, node_name: str = "", deleting: bool = False) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": "p"}
        if deleting:
            meta["deletionTimestamp"] = "2024-01-01T00:00:00Z"
        return {"metadata": meta, "spec": {"nodeName": node_name}, "status": {"phase": phase}}

    kube = status_cli.summarize_nodes(
        [node("b", "False"), node("a", "True", cordoned=True), node("c", None)],
        [pod("Running", "a"), pod("Running", "a", deleting=True), pod(None), pod("Failed", "b")],
    )
    assert kube["nodes"] == [
        {"name": "a", "status": "Ready,SchedulingDisabled", "ready": True, "pods": 2},
        {"name": "b", "status": "NotReady", "ready": False, "pods": 1},
        {"name": "c", "status": "Unknown", "ready": False, "pods": 0},
    ]
    assert kube["pods"] == {
        "total": 4,
        "phases": {"Pending": 1, "Running": 2, "Succeeded": 0, "Failed": 1, "Unknown": 0},
        "terminating": 1,
        "unscheduled": 1,
    }
    out = io.StringIO()
    with redirect_stdout(out):
        status_cli.print_overview(summary, kube)
    text = out.getvalue()
    assert "members 1,2,3 (learners 4); leader 2" in text
    assert "NODES: 1/3 ready" in text
    assert "PODS: 4: Pending 1, Running 2" in text


# ---------------------------------------------------------------------------------- slow
async def _orchestrator(*argv: str, within: float = 120.0) -> str:
    """`python -m orchestrator ARGV` as a process; its stdout (fails on a non-zero exit)."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    with trio.fail_after(within):
        proc = await trio.run_process(
            [sys.executable, "-m", "orchestrator", *argv],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=env,
            cwd=REPO_ROOT,
        )
    assert proc.returncode == 0, proc.stderr.decode()
    return proc.stdout.decode()


async def _restore(backup: Path, target: Cluster, *extra: str) -> None:
    """Restore `backup` into `target`'s first server's data directory (as a process)."""
    s = target.servers[0]
    await _orchestrator(
        "restore", str(backup), "--data-dir", str(s.data_dir),
        "--node-id", str(s.node_id), "--peer-listen", s.peer_addr, *extra,
    )  # fmt: skip


@pytest.mark.slow
async def test_backup_during_live_writes_restores_every_acknowledged_write(
    tmp_path: Path,
) -> None:
    acked: dict[str, tuple[bytes, int]] = {}  # key -> (value, mod_revision)
    acked_before_backup: set[str] = set()
    with (
        trio.fail_after(150),
        Cluster(tmp_path / "old", 3, tick_ms=50, api=False) as old,
        Cluster(tmp_path / "new", 1, tick_ms=50, api=False) as new,
    ):
        old.start()
        await old.wait_leader()
        backup = tmp_path / "store.bak"
        async with (
            StoreClient(old.endpoints, tls=admin_tls()) as kv,
            trio.open_nursery() as nursery,
        ):
            stop = trio.Event()

            async def writer(w: int) -> None:
                i = 0
                while not stop.is_set():
                    key, value = f"w{w}/{i:06d}", os.urandom(64)
                    res = await kv.update(key, value)
                    acked[key] = (value, res.mod_revision)
                    i += 1

            for w in range(4):
                nursery.start_soon(writer, w)

            async def written(n: int) -> bool | None:
                return len(acked) >= n or None

            await old.wait_until(lambda: written(300), within=30, what="300 writes")
            acked_before_backup.update(acked)
            out = await _orchestrator(
                "backup",
                "--out",
                str(backup),
                "--data-dir",
                str(old.servers[0].data_dir),
                "--endpoints",
                ",".join(old.endpoints),
            )
            more = len(acked_before_backup) + 300  # writes kept flowing during the backup
            await old.wait_until(lambda: written(more), within=30, what="more writes")
            stop.set()
        assert "revision" in out
        meta = read_backup(backup).meta
        revision = meta["revision"]

        await _restore(backup, new)
        new.start()
        await new.wait_leader()
        async with StoreClient(new.endpoints, tls=admin_tls()) as kv:
            kvs, rev, token = await kv.range("w")
            assert token is None
            assert rev >= revision
            restored = {k.key: (k.value, k.mod_revision) for k in kvs}
            # Exactly the acknowledged writes at or below the backup's revision, as they were.
            expected = {k: v for k, v in acked.items() if v[1] <= revision}
            assert restored == expected
            assert acked_before_backup <= expected.keys()  # linearizable point
            assert len(expected) < len(acked)  # and the later writes are not in it
            assert await kv.revision() >= revision
            await kv.put("after-restore", b"ok")  # the restored cluster takes writes

            # Another server joins the restored one and gets the store.
            token_text = (new.servers[0].data_dir / "token").read_text().strip()
            assert token_text == CLUSTER_TOKEN  # the server stored the --token it was given
            j = new.add_server(join=True, start=False)
            joiner = new.servers[j]
            new.extra_args = ["--join", new.endpoint(0), "--token", CLUSTER_TOKEN]
            new.start_server(j)
            new.extra_args = []

            async def promoted() -> bool | None:
                st = await new.status(0)
                voters = [] if st is None else st["voters"]
                return sorted(voters) == sorted([1, joiner.node_id]) or None

            await new.wait_until(promoted, within=40, what="the joiner to be promoted")
            await new.wait_caught_up(j)
        async with StoreClient([joiner.endpoint], tls=admin_tls()) as kv:
            probe = next(iter(expected))
            assert await kv.get(probe, linearizable=False) == expected[probe][0]
        new.check_alive()
        old.check_alive()


async def _wait_api(kubeconfig: Path, cfg_server: str | None = None, within: float = 40.0) -> Any:
    from orchestrator.client import ApiConnectionError, ApiException, ConfigError, load_kubeconfig

    with trio.fail_after(within):
        while True:
            try:
                cfg = load_kubeconfig(kubeconfig)
                if cfg_server is not None:
                    cfg = dataclasses.replace(cfg, server=cfg_server)
                from orchestrator.client import RestClient

                async with RestClient(cfg, timeout=5) as c:
                    await c.request("GET", "/api/v1/namespaces/default")
                return cfg
            except (ConfigError, ApiException, ApiConnectionError, OSError):
                await trio.sleep(0.2)


@pytest.mark.slow
async def test_api_objects_survive_the_round_trip(tmp_path: Path) -> None:
    from orchestrator.client import PODS, ResourceInfo, RestClient, load_kubeconfig

    configmaps = ResourceInfo("", "v1", "configmaps", "ConfigMap", True, "configmap")
    with (
        trio.fail_after(150),
        Cluster(tmp_path / "old", 1) as old,
        Cluster(tmp_path / "new", 1) as new,
        Cluster(tmp_path / "wrong", 1, extra_args=["--token", "orch-not-the-token"]) as wrong,
    ):
        old.start()
        old_cfg = await _wait_api(await old.wait_api(0))
        async with RestClient(old_cfg) as c:
            cm = await c.create(
                configmaps, {"metadata": {"name": "settings"}, "data": {"mode": "edge"}}
            )
            pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
            await c.create(PODS, pod)
        backup = tmp_path / "api.bak"
        await _orchestrator(
            "backup",
            "--out",
            str(backup),
            "--data-dir",
            str(old.servers[0].data_dir),
            "--endpoints",
            old.endpoint(0),
        )
        old.stop_all()  # the old cluster is gone

        # A wrong --token is refused by restore itself ...
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
        s = new.servers[0]
        proc = await trio.run_process(
            [sys.executable, "-m", "orchestrator", "restore", str(backup), "--data-dir",
             str(s.data_dir), "--token", "orch-not-the-token"],
            capture_stdout=True, capture_stderr=True, env=env, cwd=REPO_ROOT, check=False,
        )  # fmt: skip
        assert proc.returncode == 1
        assert b"cannot decrypt" in proc.stderr
        assert not s.data_dir.exists()

        await _restore(backup, new, "--token", CLUSTER_TOKEN)
        new.start()
        await new.wait_api(0)
        # The old kubeconfig (its CA and admin token) works against the restored server.
        cfg = await _wait_api(old.servers[0].kubeconfig, f"https://{new.servers[0].api_addr}")
        async with RestClient(cfg) as c:
            got = await c.get(configmaps, "settings")
            assert got["data"] == {"mode": "edge"}
            assert got["metadata"]["resourceVersion"] == cm["metadata"]["resourceVersion"]
            assert got["metadata"]["uid"] == cm["metadata"]["uid"]
            got["data"]["mode"] = "restored"
            updated = await c.replace(configmaps, "settings", got)
            assert int(updated["metadata"]["resourceVersion"]) > int(
                cm["metadata"]["resourceVersion"]
            )
        new_cfg = load_kubeconfig(new.servers[0].kubeconfig)
        assert new_cfg.token == old_cfg.token

        # `status` with the restored server's data dir: Raft table, members, nodes, pods.
        args = ["status", "--endpoints", new.endpoint(0), "--data-dir", str(s.data_dir)]
        rc, out, err = await trio.to_thread.run_sync(lambda: _cli(*args, "-o", "json"))
        assert rc == 0, err
        report = json.loads(out)
        assert report[new.endpoint(0)]["role"] == "leader"
        cluster = report["cluster"]
        assert cluster["voters"] == [1]
        assert cluster["leader"] == 1
        assert cluster["pods"]["total"] == 1
        assert cluster["nodes"] == []
        rc, out, err = await trio.to_thread.run_sync(lambda: _cli(*args))
        assert rc == 0
        assert "CLUSTER: members 1; leader 1" in out
        assert "PODS: 1:" in out

        # ... and a server started on a restored copy with another token refuses to start.
        w = wrong.servers[0]
        await _restore(backup, wrong)
        wrong.start()
        proc_w = w.proc
        assert proc_w is not None
        w.expected_exit = True

        async def exited() -> bool | None:
            return proc_w.poll() is not None or None

        await wrong.wait_until(exited, within=40, what="the wrong-token server to exit")
        assert proc_w.returncode == 1
        assert "cannot decrypt" in wrong.log_text(0)
