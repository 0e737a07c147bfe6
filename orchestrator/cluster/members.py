"""The members' store client addresses, for a server that joins through an API URL.

`orchestrator server --server https://HOST:6443 --token TOKEN` (`orchestrator.cluster.join`)
knows one server's Kubernetes API, but joining is done on a member's store client port (the
`join` op, which only the Raft leader carries out: a follower redirects to it). So it asks
`GET /orchestrator/v1/members` (`tokenapi`), answered from here, which members there are and
at which client address each one is reached.

Theory of operation
-------------------
Every server with an API runs a `MemberDirectory` beside it (`Server.run`):

* at start it records its own advertised client address (`client_address`: the
  `--client-listen` host, or for a wildcard the API's advertised host, with the bound port)
  under `/orchestrator/members/<node id>` in the replicated store, a key outside the
  Kubernetes key space (no API resource serves it). It reads the record first and writes
  only if it differs — at most one write per start, none on a usual restart — retrying with
  back-off while the store cannot take it (no quorum yet, not a member yet), then it is done;
* `list()` answers with every current Raft member (`member_items`, pure): the leader first,
  then the others by id, each with its recorded address — this server's own address comes
  from memory, so a lone server (the first one others join) answers at once. Records of
  servers that are no longer members are left out (never deleted: a few bytes per removed
  server; ids are never reused).

Invariants: a server writes only its own record; nothing here ever blocks the API (the
directory is a separate task; a failed write is only logged and retried).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

import trio

from orchestrator.apiserver.server import split_host_port
from orchestrator.kube.objects import Obj
from orchestrator.store import types as st

if TYPE_CHECKING:
    from orchestrator.raft.node import RaftNode
    from orchestrator.store.api import Store

__all__ = [
    "KEY_PREFIX",
    "MemberDirectory",
    "client_address",
    "decode_record",
    "encode_record",
    "member_items",
]

log = logging.getLogger(__name__)

KEY_PREFIX = "/orchestrator/members/"
RETRY_INITIAL = 1.0  # seconds before retrying a failed record write (doubling)
RETRY_MAX = 30.0
_WILDCARDS = ("", "0.0.0.0", "::")


# ---------------------------------------------------------------------------------- pure
def client_address(listen: str, port: int, advertised_host: str) -> str:
    """The client address other servers use: the `listen` host (the advertised API host if it
    is a wildcard) with the bound `port`."""
    host, _ = split_host_port(listen)
    host = host.strip("[]")
    if host in _WILDCARDS:
        host = advertised_host.strip("[]")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def encode_record(address: str) -> bytes:
    return json.dumps({"clientAddress": address}, sort_keys=True).encode()


def decode_record(value: bytes) -> str | None:
    """The client address in a record; None if it is unreadable."""
    try:
        doc = json.loads(value)
    except (ValueError, UnicodeDecodeError):
        return None
    address = doc.get("clientAddress") if isinstance(doc, dict) else None
    return address if isinstance(address, str) and address else None


def member_items(
    voters: Iterable[int], learners: Iterable[int], leader: int, recorded: Mapping[int, str]
) -> list[Obj]:
    """The members answer: every member, the leader first, then by id; `clientAddress` is
    None for a member that has recorded none yet."""
    voting = set(voters)
    members = sorted(voting | set(learners), key=lambda nid: (nid != leader, nid))
    return [
        {
            "id": nid,
            "clientAddress": recorded.get(nid),
            "voter": nid in voting,
            "leader": nid == leader,
        }
        for nid in members
    ]


# ---------------------------------------------------------------------------------- driver
class MemberDirectory:
    """This server's record and the members list (module doc)."""

    def __init__(
        self,
        store: Store,
        node_id: int,
        address: str,
        conf: Callable[[], tuple[frozenset[int], frozenset[int]]],
        leader: Callable[[], int],
    ) -> None:
        self.store = store
        self.node_id = node_id
        self.address = address  # this server's advertised client address
        self.conf = conf  # (voters, learners)
        self.leader = leader  # the Raft leader's id, 0 if unknown
        self.recorded = trio.Event()  # set once the store holds this server's record

    @classmethod
    def for_server(cls, store: Store, node: RaftNode, address: str) -> MemberDirectory:
        return cls(
            store,
            node.id,
            address,
            lambda: (node.conf().voters, node.conf().learners),
            lambda: node.leader_id,
        )

    async def list(self) -> list[Obj]:
        """Every member with its client address (module doc). Raises `StoreError`."""
        res = await self.store.list(KEY_PREFIX, linearizable=False)
        recorded: dict[int, str] = {}
        for kv in res.kvs:
            suffix = kv.key[len(KEY_PREFIX) :]
            address = decode_record(kv.value)
            if suffix.isdigit() and address is not None:
                recorded[int(suffix)] = address
        recorded[self.node_id] = self.address
        voters, learners = self.conf()
        return member_items(voters, learners, self.leader(), recorded)

    async def record_once(self) -> bool:
        """Write this server's record unless the store already holds it; True if written.
        Raises `StoreError`."""
        key = f"{KEY_PREFIX}{self.node_id}"
        stored = await self.store.get(key, linearizable=False)
        if stored is not None and decode_record(stored.value) == self.address:
            return False
        await self.store.update(key, encode_record(self.address))
        log.info("recorded client address %s for joining servers", self.address)
        return True

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Record this server's address (retried until done), then return; `started` at once."""
        task_status.started()
        delay = RETRY_INITIAL
        while True:
            try:
                await self.record_once()
                break
            except st.StoreError as exc:
                log.info("client address not recorded yet: %s; retrying", exc)
            await trio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX)
        self.recorded.set()
