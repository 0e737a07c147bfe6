"""`orchestrator backup` and `orchestrator restore`: disaster recovery of the replicated store.

    orchestrator backup --out FILE [--endpoints HOST:PORT,...]
    orchestrator restore FILE --data-dir DIR [--node-id 1] [--peer-listen HOST:PORT] [--token T]
    orchestrator server --data-dir DIR --token <the old cluster token> ...   # then others --join

`backup` asks a server for a consistent online snapshot (the store as of a linearizable point:
every write acknowledged before the command started is in it) and writes it atomically as a
self-describing file (`orchestrator.store.backup`). `restore` verifies a file (checksum, SQLite
integrity, schema) and creates a NEW data directory holding a one-server cluster whose store is
the backup; it refuses a directory that is not empty. Other servers then join the restored one
with `server --join`.

The cluster's CA key and tokens are in the store encrypted with the cluster token: the backup is
useless without that token, and the restored server must be started with it (`--token`, or
`restore --token`, which checks it against the backup and stores it in the data directory). A
server started with a different token refuses to start.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import trio

COMMANDS = frozenset({"backup", "restore"})


def add_parsers(sub: Any, endpoints: argparse.ArgumentParser) -> None:
    """Add `backup` and `restore` to the `orchestrator` subcommands (`endpoints`: the shared
    --endpoints/--timeout parent parser)."""
    b = sub.add_parser(
        "backup",
        parents=[endpoints],
        help="write a consistent snapshot of the cluster's store to a file",
        description="Write a consistent online snapshot of the store to FILE (atomically). "
        "Keep the cluster token with it: the credentials inside are encrypted with it.",
    )
    b.add_argument("--out", type=Path, required=True, metavar="FILE", help="the backup file")
    b.set_defaults(timeout=300.0)
    r = sub.add_parser(
        "restore",
        help="create a new single-server cluster's data directory from a backup",
        description="Verify a backup and create DIR holding a one-server cluster whose store is "
        "the backup. Start it with `orchestrator server --data-dir DIR --token <old token>`; "
        "other servers then join it with --join.",
    )
    r.add_argument("file", type=Path, help="a file written by `orchestrator backup`")
    r.add_argument("--data-dir", type=Path, required=True, help="the new (empty) data directory")
    r.add_argument("--node-id", type=int, default=1, help="the restored server's Raft id")
    r.add_argument(
        "--peer-listen",
        default="127.0.0.1:7001",
        help="HOST:PORT the restored server will listen on for other servers",
    )
    r.add_argument(
        "--token",
        default=os.environ.get("ORCHESTRATOR_TOKEN"),
        help="the backed-up cluster's token (env ORCHESTRATOR_TOKEN): checked against the "
        "backup and stored in the data directory",
    )


def main(args: argparse.Namespace) -> int:
    if args.command == "backup":
        return trio.run(_backup, args)
    return _restore(args)


async def _backup(args: argparse.Namespace) -> int:
    from orchestrator.cli import storecreds
    from orchestrator.store.backup import write_backup
    from orchestrator.store.client import StoreClient

    endpoints, tls, cluster = storecreds.resolve(args)
    print(f"cluster: {cluster} (servers {', '.join(endpoints)})", file=sys.stderr, flush=True)
    with trio.fail_after(args.timeout):
        async with StoreClient(endpoints, tls=tls) as client:
            meta, image = await client.backup()
    size = await trio.to_thread.run_sync(write_backup, args.out, meta, image)
    print(
        f"backup written to {args.out}: revision {meta['revision']}, applied index "
        f"{meta['applied_index']}, {size} bytes (from node {meta.get('source_node', '?')})"
    )
    print(
        "note: the credentials in it are encrypted with the cluster token; keep the token "
        "with the backup (restore with `orchestrator restore FILE --data-dir DIR --token ...`)",
        file=sys.stderr,
    )
    return 0


def _restore(args: argparse.Namespace) -> int:
    from orchestrator.raft.node import parse_addr
    from orchestrator.security.shared import KEY, unseal
    from orchestrator.server import NODE_ID_FILE, TOKEN_FILE
    from orchestrator.store.backup import BackupError, read_backup, read_bootstrap, restore_data_dir

    if args.node_id < 1:
        raise SystemExit("error: --node-id must be >= 1")
    try:
        parse_addr(args.peer_listen)
    except ValueError as exc:
        raise SystemExit(f"error: --peer-listen: {exc}") from None
    data_dir: Path = args.data_dir
    if data_dir.exists() and (not data_dir.is_dir() or any(data_dir.iterdir())):
        print(
            f"error: {data_dir} is not empty: restore creates a new data directory", file=sys.stderr
        )
        return 1
    try:
        backup = read_backup(args.file)
    except BackupError as exc:
        print(f"error: {args.file}: {exc}; nothing was restored", file=sys.stderr)
        return 1
    files: dict[str, tuple[str, int]] = {NODE_ID_FILE: (f"{args.node_id}\n", 0o644)}
    sealed = read_bootstrap(backup, KEY)
    if args.token:
        if sealed is not None:
            try:
                bundle = unseal(sealed, args.token)
                # The cluster's CA, so the restored server's store ports use it from the start
                # (not one derived from the token: the backed-up site's may be older).
                files["pki/ca.crt"] = (bundle.ca_crt.decode("ascii"), 0o644)
                files["pki/ca.key"] = (bundle.ca_key.decode("ascii"), 0o600)
            except PermissionError:
                print(
                    "error: --token cannot decrypt the credentials in this backup: it is not "
                    "the backed-up cluster's token; nothing was restored",
                    file=sys.stderr,
                )
                return 1
        files[TOKEN_FILE] = (args.token + "\n", 0o600)
    try:
        restore_data_dir(
            backup, data_dir, node_id=args.node_id, peer_addr=args.peer_listen, files=files
        )
    except (BackupError, FileExistsError) as exc:
        print(f"error: {exc}; nothing was restored", file=sys.stderr)
        return 1
    print(
        f"restored revision {backup.revision} (applied index {backup.applied_index}) into "
        f"{data_dir} as node {args.node_id} of a new one-server cluster"
    )
    token_hint = "" if args.token else " --token <the backed-up cluster's token>"
    print(
        f"start it: orchestrator server --data-dir {data_dir} --node-id {args.node_id} "
        f"--peer-listen {args.peer_listen}{token_hint}; other servers join it with --join",
        file=sys.stderr,
    )
    if not args.token and sealed is not None:
        print(
            "note: the credentials in the backup are encrypted with the old cluster token: a "
            "server started with another token refuses to start",
            file=sys.stderr,
        )
    return 0
