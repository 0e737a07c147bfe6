"""The `Store` interface the API server programs against, and its small helper types.

One implementation today (`RaftStore`: the embedded Raft-replicated MVCC store); the interface is
kept small (create/update/delete/txn/get/list/watch/compact/status) so an external etcd could
back it later. All methods may raise the `StoreError` subclasses of `types`.

Continue tokens are opaque to callers: base64url(msgpack([revision, last_key])) — a later page
is read at the same revision as the first, so a paginated list is one consistent snapshot (or
fails with `Compacted` if that revision was compacted meanwhile, as in etcd / Kubernetes).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Protocol

import msgpack

from orchestrator.store.types import (
    Compare,
    InvalidRequest,
    KeyValue,
    StoreStatus,
    TxnOp,
    TxnResult,
)
from orchestrator.store.watch import Watcher


@dataclass(frozen=True, slots=True)
class ListResult:
    kvs: list[KeyValue]
    revision: int  # the revision the whole (paginated) list is read at
    continue_token: str | None  # None on the last page
    remaining: int = 0  # keys after this page (at `revision`)


def encode_continue(revision: int, last_key: str) -> str:
    raw = msgpack.packb([revision, last_key])
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_continue(token: str) -> tuple[int, str]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        revision, last_key = msgpack.unpackb(raw)
    except (
        binascii.Error,
        ValueError,
        TypeError,
        msgpack.ExtraData,
        msgpack.FormatError,
        msgpack.StackError,
    ) as exc:
        raise InvalidRequest(f"malformed continue token: {exc}") from exc
    if type(revision) is not int or revision < 1 or not isinstance(last_key, str):
        raise InvalidRequest("malformed continue token")
    return revision, last_key


class Store(Protocol):
    async def create(self, key: str, value: bytes) -> KeyValue:
        """Create `key`; KeyExists if it exists."""

    async def update(
        self, key: str, value: bytes, *, expected_mod_revision: int | None = None
    ) -> KeyValue:
        """Put `key` (unconditionally, or only if its mod_revision matches: Conflict)."""

    async def delete(self, key: str, *, expected_mod_revision: int | None = None) -> KeyValue:
        """Delete `key`, returning its last value; KeyNotFound / Conflict."""

    async def txn(
        self, compares: list[Compare], success: list[TxnOp], failure: list[TxnOp]
    ) -> TxnResult: ...

    async def get(
        self, key: str, *, revision: int = 0, linearizable: bool = True
    ) -> KeyValue | None: ...

    async def list(
        self,
        prefix: str,
        *,
        limit: int = 0,
        continue_token: str | None = None,
        revision: int = 0,
        linearizable: bool = True,
    ) -> ListResult: ...

    def watch(
        self, prefix: str, start_revision: int = 0, *, progress_notify: bool = False
    ) -> Watcher: ...

    async def compact(self, revision: int) -> None: ...

    async def current_revision(self, *, linearizable: bool = True) -> int: ...

    async def status(self) -> StoreStatus: ...
