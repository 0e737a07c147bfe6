"""Backups of the replicated store: the file format, its verification, and restoring a backup
into the data directory of a new single-server cluster.

A backup is one consistent image of the state machine (`MVCCStore.snapshot()`: the SQLite
database checkpointed and serialized on its database thread at exactly the applied index),
taken by a server after a ReadIndex barrier, so it holds every write acknowledged before the
backup was asked for (the client port's "backup" op, `StoreClient.backup`).

File layout (all integers big-endian)::

    MAGIC (8 bytes "ORCHBKP\\n") | format version (u16) | metadata length (u32)
    | metadata (UTF-8 JSON) | image length (u64) | SQLite image | SHA-256 of everything before

The metadata says what the image is (revision, compact revision, applied index, Raft term,
schema version, the source cluster's members, the image's own SHA-256) so that a person can read
it with `head -c 4096`. The file is written atomically (temporary file, fsync, rename, fsync of
the directory): a crash leaves the old file or the new one, never a torn one.

The cluster's credentials (CA key, token table) are in the store, encrypted with the cluster
token (`security/shared.py`): a backup is only useful together with that token, and restoring
it into a server started with another token fails (the server refuses to start).

Restore (`restore_data_dir`) builds the new data directory next to the target and renames it
into place, so a failure leaves nothing behind:

- `store.db`: the image, copied with SQLite's backup API and opened once as an `MVCCStore`
  (schema, applied index and revision checked again);
- `raft.db`: a Raft snapshot record at the backup's applied index whose membership is this
  server alone (metadata only: like every local snapshot here, the state machine's database *is*
  the snapshot), a hard state committed up to that index, an empty log, and the address book.
  On start the node sees a one-voter cluster, campaigns, and leads; servers that join later get
  the store as a Raft snapshot. Nothing from the old cluster's Raft log is reused, so the old
  and the new cluster can never exchange entries by mistake (the new cluster also has new ids
  for every server that joins it).

Invariants: `read_backup` accepts a file only if its checksum, its SQLite image (integrity
check), its schema version and its metadata all agree; `restore_data_dir` never writes into an
existing non-empty directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sqlite3
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.raft.storage import RaftStorage
from orchestrator.raft.types import ConfState, HardState, Snapshot, SnapshotMeta
from orchestrator.store.mvcc import MVCCStore
from orchestrator.store.mvcc_sql import SCHEMA_VERSION

MAGIC = b"ORCHBKP\n"
FORMAT_VERSION = 1
_HEAD = struct.Struct("!8sHI")  # magic, format version, metadata length
_IMAGE_LEN = struct.Struct("!Q")
_DIGEST_LEN = 32  # SHA-256
MAX_METADATA_BYTES = 1 << 20
TOKEN_NOTE = (
    "the cluster's credentials in this backup are encrypted with the cluster token: keep the "
    "token with the backup, and start the restored server with it (--token)"
)
_TABLES = frozenset({"meta", "history", "kv"})


class BackupError(ValueError):
    """A backup file that cannot be used (damaged, truncated, not a backup, wrong version)."""


@dataclass(frozen=True)
class Backup:
    """A verified backup: its metadata and the SQLite image of the store."""

    meta: dict[str, Any]
    image: bytes

    @property
    def revision(self) -> int:
        return int(self.meta["revision"])

    @property
    def applied_index(self) -> int:
        return int(self.meta["applied_index"])


# ---------------------------------------------------------------------------------- writing
def encode_backup(meta: dict[str, Any], image: bytes) -> list[bytes]:
    """The pieces of a backup file, in order (the last one is the SHA-256 of the others)."""
    meta = dict(meta, format_version=FORMAT_VERSION, image_bytes=len(image))
    meta.setdefault("image_sha256", hashlib.sha256(image).hexdigest())
    meta.setdefault("note", TOKEN_NOTE)
    body = json.dumps(meta, sort_keys=True, indent=1).encode()
    if len(body) > MAX_METADATA_BYTES:
        raise ValueError("backup metadata is too large")
    parts = [_HEAD.pack(MAGIC, FORMAT_VERSION, len(body)), body, _IMAGE_LEN.pack(len(image)), image]
    digest = hashlib.sha256()
    for p in parts:
        digest.update(p)
    return [*parts, digest.digest()]


def write_backup(path: Path, meta: dict[str, Any], image: bytes) -> int:
    """Write a backup file atomically (tmp + fsync + rename + fsync of the directory), mode
    0600 (it holds every Secret of the cluster). Returns the file's size."""
    path = Path(path)
    parts = encode_backup(meta, image)
    directory = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            for p in parts:
                f.write(p)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    _fsync_dir(directory)
    return sum(len(p) for p in parts)


def _unlink_quietly(path: str | Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------- reading
def decode_backup(data: bytes) -> Backup:
    """Parse and verify a backup file's bytes; raises BackupError saying what is wrong."""
    if len(data) < _HEAD.size or not data.startswith(MAGIC):
        raise BackupError("not an orchestrator backup file (bad magic)")
    _, version, meta_len = _HEAD.unpack_from(data)
    if version != FORMAT_VERSION:
        raise BackupError(f"backup format version {version}; this release reads {FORMAT_VERSION}")
    if meta_len > MAX_METADATA_BYTES:
        raise BackupError("damaged backup: metadata length is implausible")
    at = _HEAD.size + meta_len
    if len(data) < at + _IMAGE_LEN.size + _DIGEST_LEN:
        raise BackupError("truncated backup file")
    (image_len,) = _IMAGE_LEN.unpack_from(data, at)
    end = at + _IMAGE_LEN.size + image_len
    if len(data) != end + _DIGEST_LEN:
        raise BackupError(
            f"truncated or damaged backup file: {len(data)} bytes, expected {end + _DIGEST_LEN}"
        )
    if hashlib.sha256(memoryview(data)[:end]).digest() != data[end:]:
        raise BackupError("backup checksum mismatch: the file is damaged")
    try:
        meta = json.loads(data[_HEAD.size : at])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BackupError(f"damaged backup metadata: {exc}") from None
    if not isinstance(meta, dict):
        raise BackupError("damaged backup metadata: not an object")
    image = data[at + _IMAGE_LEN.size : end]
    if meta.get("image_sha256") != hashlib.sha256(image).hexdigest():
        raise BackupError("backup image checksum mismatch")
    for field in ("revision", "applied_index"):
        if type(meta.get(field)) is not int or meta[field] < 1:
            raise BackupError(f"backup metadata has no valid {field}")
    backup = Backup(meta, image)
    verify_image(backup)
    return backup


def read_backup(path: Path) -> Backup:
    """Read and verify a backup file (see `decode_backup`)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise BackupError(f"cannot read {path}: {exc.strerror or exc}") from None
    return decode_backup(data)


def _open_image(image: bytes) -> sqlite3.Connection:
    """The image as an in-memory database (read it as a rollback-journal database: an
    in-memory database cannot use WAL, and the image of a WAL database says WAL)."""
    if len(image) < 100 or not image.startswith(b"SQLite format 3\x00"):
        raise BackupError("the backup's image is not an SQLite database")
    buf = bytearray(image)
    buf[18] = buf[19] = 1
    mem = sqlite3.connect(":memory:", isolation_level=None)
    try:
        mem.deserialize(bytes(buf))
    except sqlite3.DatabaseError as exc:
        mem.close()
        raise BackupError(f"the backup's image is not readable: {exc}") from None
    return mem


def verify_image(backup: Backup) -> dict[str, int]:
    """SQLite integrity check, schema, and the store's own counters against the metadata.
    Returns the image's meta row (applied_index, revision, compact_revision, logical_bytes)."""
    mem = _open_image(backup.image)
    try:
        try:
            check = [r[0] for r in mem.execute("PRAGMA integrity_check").fetchall()]
            version = int(mem.execute("PRAGMA user_version").fetchone()[0])
            tables = {
                r[0] for r in mem.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
            row = None
            if version == SCHEMA_VERSION and tables >= _TABLES:
                row = mem.execute(
                    "SELECT applied_index, revision, compact_revision, logical_bytes"
                    " FROM meta WHERE id = 1"
                ).fetchone()
        except sqlite3.DatabaseError as exc:
            raise BackupError(f"the backup's image is damaged: {exc}") from None
    finally:
        mem.close()
    if check != ["ok"]:
        raise BackupError(f"the backup's image fails the integrity check: {'; '.join(check[:3])}")
    if version != SCHEMA_VERSION:
        raise BackupError(f"the backup's store schema is version {version}, not {SCHEMA_VERSION}")
    if row is None:
        raise BackupError("the backup's image is not a store database (tables missing)")
    names = ("applied_index", "revision", "compact_revision", "logical_bytes")
    counters = dict(zip(names, map(int, row), strict=True))
    for field in ("applied_index", "revision"):
        if counters[field] != backup.meta[field]:
            raise BackupError(
                f"the backup's image is at {field} {counters[field]}, its metadata says"
                f" {backup.meta[field]}"
            )
    return counters


def read_bootstrap(backup: Backup, key: str) -> bytes | None:
    """The current value of `key` in the backup's store (e.g. the sealed credentials)."""
    mem = _open_image(backup.image)
    try:
        row = mem.execute(
            "SELECT h.value FROM kv AS k JOIN history AS h ON h.id = k.hid WHERE k.key = ?",
            (key,),
        ).fetchone()
    finally:
        mem.close()
    return None if row is None else bytes(row[0])


# ---------------------------------------------------------------------------------- restoring
def _is_empty_dir(path: Path) -> bool:
    return path.is_dir() and not any(path.iterdir())


def restore_data_dir(
    backup: Backup,
    data_dir: Path,
    *,
    node_id: int,
    peer_addr: str,
    files: dict[str, tuple[str, int]] | None = None,
) -> Path:
    """Create `data_dir` holding a one-server cluster (node `node_id`, reachable by peers at
    `peer_addr`) whose store is `backup`. `files` adds small files (name -> (text, mode)), e.g.
    the node id and token files of `server.py`. Refuses (FileExistsError) if `data_dir` exists
    and is not empty; on any failure nothing is left behind."""
    data_dir = Path(data_dir)
    if data_dir.exists() and not _is_empty_dir(data_dir):
        raise FileExistsError(f"{data_dir} exists and is not empty: restore needs a new directory")
    if node_id < 1:
        raise ValueError("the node id must be >= 1")
    verify_image(backup)
    parent = data_dir.absolute().parent
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{data_dir.name}.restore.", dir=parent))
    try:
        staging.chmod(0o700)
        _write_store(backup, staging / "store.db")
        _write_raft(backup, staging / "raft.db", node_id, peer_addr)
        for name, (text, mode) in (files or {}).items():
            p = staging / name
            p.parent.mkdir(mode=0o700, exist_ok=True)  # e.g. pki/ for the cluster CA
            p.write_text(text)
            p.chmod(mode)
        _fsync_dir(staging)
        if data_dir.exists():
            data_dir.rmdir()  # empty (checked above): replaced by the staged directory
        os.replace(staging, data_dir)
        _fsync_dir(parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return data_dir


def _write_store(backup: Backup, path: Path) -> None:
    mem = _open_image(backup.image)
    try:
        target = sqlite3.connect(path, isolation_level=None)
        try:
            mem.backup(target)
            target.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            target.close()
    finally:
        mem.close()
    store = MVCCStore(path)  # switches it to WAL, checks the schema, loads the counters
    try:
        if (store.applied_index(), store.revision()) != (backup.applied_index, backup.revision):
            raise BackupError(
                f"restored store is at applied index {store.applied_index()}, revision"
                f" {store.revision()}; the backup says {backup.applied_index}, {backup.revision}"
            )
        store.sync()
    finally:
        store.close()


def _write_raft(backup: Backup, path: Path, node_id: int, peer_addr: str) -> None:
    index = backup.applied_index
    term = max(1, int(backup.meta.get("raft_term") or 1))
    storage = RaftStorage(path)
    try:
        meta = SnapshotMeta(index, term, ConfState(frozenset({node_id}), frozenset()))
        storage.save(HardState(term=term, vote=0, commit=index), [], Snapshot(meta))
        storage.save_peers({node_id: peer_addr})
    finally:
        storage.close()
