"""The MVCC store's snapshot: the whole SQLite database as one image, and its installation.

A snapshot is the database file itself (`sqlite3.Connection.serialize`, after a TRUNCATE
checkpoint so everything is in the main file). Installing one checks it in memory first
(SQLite format, integrity, schema version, applied index, page size): on any mismatch it
raises ValueError and changes nothing; then SQLite's backup API copies it over the live
database in one write transaction.
"""

from __future__ import annotations

import sqlite3

from orchestrator.store.mvcc_sql import SCHEMA_VERSION, SQL_CHECKPOINT, SQL_META_LOAD


def database_image(conn: sqlite3.Connection) -> bytes:
    """The whole database (no transaction may be open on `conn`)."""
    conn.execute(SQL_CHECKPOINT)  # everything in the main file; WAL back to zero
    return conn.serialize()


def install_image(conn: sqlite3.Connection, index: int, data: bytes) -> None:
    """Replace the database behind `conn` with `data`, a `database_image` whose applied index
    is `index`; ValueError (and no change) if it is not one."""
    image = bytearray(data)
    if len(image) < 100 or not image.startswith(b"SQLite format 3\x00"):
        raise ValueError("snapshot is not an SQLite database image")
    # The image of a WAL database says so in its header (bytes 18-19 = 2); an in-memory
    # database cannot use WAL, so present it as a rollback-journal database.
    image[18] = image[19] = 1
    mem = sqlite3.connect(":memory:", isolation_level=None)
    try:
        try:
            mem.deserialize(bytes(image))
            check = mem.execute("PRAGMA quick_check").fetchone()[0]
            version = int(mem.execute("PRAGMA user_version").fetchone()[0])
            page_size = int(mem.execute("PRAGMA page_size").fetchone()[0])
            row = mem.execute(SQL_META_LOAD).fetchone() if version == SCHEMA_VERSION else None
        except sqlite3.DatabaseError as exc:
            raise ValueError(f"snapshot is not a readable store database: {exc}") from exc
        if check != "ok":
            raise ValueError(f"snapshot fails the integrity check: {check}")
        if row is None:
            raise ValueError(f"snapshot has schema version {version}, not {SCHEMA_VERSION}")
        if int(row[0]) != index:
            raise ValueError(f"snapshot is at applied index {row[0]}, expected {index}")
        own = int(conn.execute("PRAGMA page_size").fetchone()[0])
        if page_size != own:
            raise ValueError(f"snapshot page size {page_size} differs from ours ({own})")
        mem.backup(conn)  # pages=-1: one step, one write transaction on `conn`
    finally:
        mem.close()
