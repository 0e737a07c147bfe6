"""`open_wal`: how every database of the project is opened (WAL, chosen fsync, bounded WAL)."""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.dbthread import WAL_SIZE_LIMIT, open_wal


def test_open_wal_settings(tmp_path: Path) -> None:
    conn = open_wal(tmp_path / "a.db", synchronous="NORMAL")
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
        assert conn.execute("PRAGMA journal_size_limit").fetchone()[0] == WAL_SIZE_LIMIT
    finally:
        conn.close()


def test_wal_is_cut_back_to_its_limit_after_a_burst(tmp_path: Path) -> None:
    """One transaction larger than the limit grows the WAL past it; once SQLite has
    checkpointed it (automatically, at 1,000 pages) the next write restarts the WAL and cuts
    the file back, instead of leaving it at its high-water mark for good."""
    path = tmp_path / "b.db"
    conn = open_wal(path, synchronous="FULL")
    try:
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB)")
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "INSERT INTO t (v) VALUES (?)",
            ((os.urandom(1000),) for _ in range(3 * WAL_SIZE_LIMIT // 1000)),
        )
        conn.execute("COMMIT")
        assert os.path.getsize(f"{path}-wal") > WAL_SIZE_LIMIT
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t (v) VALUES (x'00')")
        conn.execute("COMMIT")
        assert os.path.getsize(f"{path}-wal") <= WAL_SIZE_LIMIT
        assert (
            conn.execute("SELECT count(*) FROM t").fetchone()[0] == 3 * WAL_SIZE_LIMIT // 1000 + 1
        )
    finally:
        conn.close()
