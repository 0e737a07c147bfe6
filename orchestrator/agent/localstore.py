"""The agent's local copy of its desired state, for edge autonomy (SQLite in the data dir).

Theory of operation
-------------------
A kubelet keeps pod specs in memory only, so a node that reboots while its control plane is
unreachable comes back running nothing. This agent instead writes every pod bound to it —
and every ConfigMap and Secret those pods reference — to `DATA_DIR/agent.db` *before* acting on
it (KubeEdge's MetaManager order). Then:

* while the server is unreachable the agent keeps running, restarting and probing the pods it
  has (their workers never needed the server);
* after a host reboot (an agent start with the server down) it starts the pods found here at
  once, with the ConfigMaps/Secrets found here, without waiting for the server;
* on reconnect the agent lists its pods from the server and makes this copy equal to that list
  (pods deleted meanwhile are stopped and forgotten), then reports status.

Tables: `pods(uid PK, namespace, name, body)` — the last pod object seen, JSON, without its
`metadata.managedFields` (which nothing here reads: about half of a pod's bytes);
`objects(kind, namespace, name PK, body)` — ConfigMaps and Secrets (Secret data stays base64,
as in the API), the Services and EndpointSlices the node proxy and DNS serve from
(`net.svccache`, written in batches: `objects_of`, `write_objects`), and what other agent parts
keep for outages and reboots under kinds of their own (`NodeNet`: the pod network's last known
Nodes, see `agent/net/podnet.py`). (Databases written by older agents also hold an unused
`meta` table.)

Invariants: one `DbThread` serializes every call (no lock needed); each write is one
transaction; the database file is mode 0600 (it holds Secrets); `synchronous=FULL`: a pod that
was acknowledged as stored survives a power cut, which is the point of this module.

Flash: every write is an fsynced commit, which costs at least one 4 KiB page of the WAL file
however small it is, plus the pages it touched. The file uses 1 KiB pages (a new file; an old
one keeps its size): a pod's row then dirties about its own size instead of a whole 4 KiB leaf.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.dbthread import DbThread, open_wal
from orchestrator.kube.objects import Obj

__all__ = ["LocalStore", "StoredPod"]


_SCHEMA = """
CREATE TABLE IF NOT EXISTS pods (
    uid TEXT PRIMARY KEY,
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    body TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS objects (
    kind TEXT NOT NULL,
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (kind, namespace, name)
);
"""


@dataclass(frozen=True, slots=True)
class StoredPod:
    uid: str
    namespace: str
    name: str
    pod: Obj


PAGE_SIZE = 1024  # of a new database file (module doc, "Flash")


def _dumps(obj: Obj) -> str:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True)


def _pod_body(pod: Obj) -> str:
    meta = pod.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        pod = {**pod, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    return _dumps(pod)


class LocalStore:
    """The local pod/object copy. `await LocalStore.open(path)`, then `await store.aclose()`."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self._conn = conn
        self.path = path
        self._db = DbThread()

    @classmethod
    async def open(cls, path: str | os.PathLike[str]) -> LocalStore:
        p = Path(path)
        db = DbThread()

        def _open() -> sqlite3.Connection:
            p.parent.mkdir(parents=True, exist_ok=True)
            conn = open_wal(p, synchronous="FULL", page_size=PAGE_SIZE)
            try:
                conn.executescript(_SCHEMA)
                os.chmod(p, 0o600)
            except BaseException:
                conn.close()
                raise
            return conn

        conn = await db.run(_open)
        store = cls(conn, p)
        store._db = db
        return store

    async def aclose(self) -> None:
        await self._db.run(self._conn.close)

    # ------------------------------------------------------------------ pods
    async def put_pod(self, pod: Obj) -> None:
        meta = pod.get("metadata") or {}
        row = (
            str(meta.get("uid") or ""),
            str(meta.get("namespace") or ""),
            str(meta.get("name") or ""),
            _pod_body(pod),
        )
        if not row[0]:
            raise ValueError("a pod without metadata.uid cannot be stored")

        def _put() -> None:
            with self._conn:
                self._conn.execute("BEGIN IMMEDIATE")
                self._conn.execute(
                    "INSERT INTO pods(uid, namespace, name, body) VALUES (?,?,?,?) "
                    "ON CONFLICT(uid) DO UPDATE SET namespace=excluded.namespace, "
                    "name=excluded.name, body=excluded.body",
                    row,
                )

        await self._db.run(_put)

    async def delete_pod(self, uid: str) -> None:
        def _delete() -> None:
            with self._conn:
                self._conn.execute("BEGIN IMMEDIATE")
                self._conn.execute("DELETE FROM pods WHERE uid = ?", (uid,))

        await self._db.run(_delete)

    async def pods(self) -> list[StoredPod]:
        def _all() -> list[StoredPod]:
            rows = self._conn.execute(
                "SELECT uid, namespace, name, body FROM pods ORDER BY namespace, name"
            ).fetchall()
            return [StoredPod(r[0], r[1], r[2], json.loads(r[3])) for r in rows]

        return await self._db.run(_all)

    # ------------------------------------------------------------------ configmaps, secrets
    async def put_object(self, kind: str, obj: Obj) -> None:
        meta = obj.get("metadata") or {}
        row = (kind, str(meta.get("namespace") or ""), str(meta.get("name") or ""), _dumps(obj))

        def _put() -> None:
            with self._conn:
                self._conn.execute("BEGIN IMMEDIATE")
                self._conn.execute(
                    "INSERT INTO objects(kind, namespace, name, body) VALUES (?,?,?,?) "
                    "ON CONFLICT(kind, namespace, name) DO UPDATE SET body=excluded.body",
                    row,
                )

        await self._db.run(_put)

    async def get_object(self, kind: str, namespace: str, name: str) -> Obj | None:
        def _get() -> Obj | None:
            row = self._conn.execute(
                "SELECT body FROM objects WHERE kind=? AND namespace=? AND name=?",
                (kind, namespace, name),
            ).fetchone()
            return json.loads(row[0]) if row else None

        return await self._db.run(_get)

    async def delete_object(self, kind: str, namespace: str, name: str) -> None:
        def _delete() -> None:
            with self._conn:
                self._conn.execute("BEGIN IMMEDIATE")
                self._conn.execute(
                    "DELETE FROM objects WHERE kind=? AND namespace=? AND name=?",
                    (kind, namespace, name),
                )

        await self._db.run(_delete)

    async def prune_objects(
        self, keep: set[tuple[str, str, str]], kinds: tuple[str, ...] = ("ConfigMap", "Secret")
    ) -> int:
        """Forget the objects of `kinds` not in `keep` ((kind, namespace, name)); how many.
        Other kinds belong to other parts of the agent and are left alone."""

        def _prune() -> int:
            rows = self._conn.execute("SELECT kind, namespace, name FROM objects").fetchall()
            gone = [tuple(r) for r in rows if r[0] in kinds and tuple(r) not in keep]
            if gone:
                with self._conn:
                    self._conn.execute("BEGIN IMMEDIATE")
                    self._conn.executemany(
                        "DELETE FROM objects WHERE kind=? AND namespace=? AND name=?", gone
                    )
            return len(gone)

        return await self._db.run(_prune)

    async def objects_of(self, kind: str) -> list[Obj]:
        """Every stored object of `kind`, by namespace and name."""

        def _all() -> list[Obj]:
            rows = self._conn.execute(
                "SELECT body FROM objects WHERE kind=? ORDER BY namespace, name", (kind,)
            ).fetchall()
            return [json.loads(r[0]) for r in rows]

        return await self._db.run(_all)

    async def write_objects(
        self, kind: str, put: list[Obj], delete: Sequence[tuple[str, str]] = ()
    ) -> None:
        """Store `put` and forget `delete` ((namespace, name)) of `kind` in one transaction (one
        fsync for a whole batch of changes: flash)."""
        rows = [
            (
                kind,
                str((o.get("metadata") or {}).get("namespace") or ""),
                str((o.get("metadata") or {}).get("name") or ""),
                _pod_body(o),  # without managedFields, as pods
            )
            for o in put
        ]
        gone = [(kind, ns, name) for ns, name in delete]

        def _write() -> None:
            with self._conn:
                self._conn.execute("BEGIN IMMEDIATE")
                self._conn.executemany(
                    "INSERT INTO objects(kind, namespace, name, body) VALUES (?,?,?,?) "
                    "ON CONFLICT(kind, namespace, name) DO UPDATE SET body=excluded.body",
                    rows,
                )
                self._conn.executemany(
                    "DELETE FROM objects WHERE kind=? AND namespace=? AND name=?", gone
                )

        if rows or gone:
            await self._db.run(_write)
