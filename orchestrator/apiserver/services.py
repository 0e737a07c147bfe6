"""ClusterIPs and NodePorts of Services, as the API server allocates them: the in-memory view,
the create retry loop, and the repair pass.

Theory of operation
-------------------
The store is the truth: one key per allocated ClusterIP and NodePort (`allockeys`), created
only if absent in the same transaction as the Service (`storage.ObjectStore`), deleted with it.
Each API server keeps a view of the taken values (`servicefields.Assigner`'s allocators), loaded
from those keys on first use and reloaded when an allocator says "full" (the view may hold
values another server freed, or picks of writes that failed). A value picked from the view that
another server took meanwhile fails the write with `ClaimTaken`; the verb then picks again
(`create` here, `update.guaranteed_update` for updates). A value the user chose that is taken
is a 422 ("provided IP is already allocated"). A dry run picks values but keeps none.

`AllocationRepair` (run on the leader, `assembly`): a pass over one snapshot of the Services
and the keys deletes keys no Service holds and re-creates keys a Service holds but lacks
(each conditional on what the pass read), then waits `interval`. In a healthy store it finds
nothing and writes nothing.
"""

from __future__ import annotations

import logging
import random

import trio

from orchestrator.apiserver.allockeys import (
    IP_PREFIX,
    PORT_PREFIX,
    held_keys,
    owner_value,
    value_of_key,
)
from orchestrator.apiserver.servicefields import Assigner, new_ip_allocator
from orchestrator.apiserver.storage import ClaimTaken, ObjectStore, decode, key_of, prefix_of
from orchestrator.kube import errors
from orchestrator.kube.errors import ApiError
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.core_v1_service import SERVICE
from orchestrator.kube.schema.kind import Kind
from orchestrator.network.settings import NetworkSettings
from orchestrator.network.svcalloc import NodePortAllocator
from orchestrator.store import types as st
from orchestrator.store.api import Store
from orchestrator.store.fencing import fenced
from orchestrator.store.types import KeyValue

__all__ = ["AllocationRepair", "ServiceAddresses", "repair_allocations"]

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 16  # picks of a create before giving up (each lost to another API server)
PAGE = 500
REPAIR_INTERVAL = 180.0  # seconds between repair passes (Kubernetes' repair loop: 3 minutes)


class ServiceAddresses:
    """One API server's allocation of Service addresses and node ports (module doc)."""

    def __init__(self, settings: NetworkSettings, rng: random.Random) -> None:
        self.settings = settings
        self.assigner = Assigner(settings, rng)
        self._loaded = False

    async def refresh(self, objects: ObjectStore) -> None:
        """Load the view from the store's keys, the first time and whenever it went stale."""
        if self._loaded and not self.assigner.stale:
            return
        ips = new_ip_allocator(self.settings)
        ports = NodePortAllocator()
        for kv in await _list_all(objects.store, IP_PREFIX, linearizable=False):
            ips.occupy(value_of_key(kv.key))
        for kv in await _list_all(objects.store, PORT_PREFIX, linearizable=False):
            text = value_of_key(kv.key)
            if text.isdigit():
                ports.occupy(int(text))
        self.assigner.ips, self.assigner.ports = ips, ports
        self.assigner.stale = False
        self._loaded = True

    async def create(
        self, objects: ObjectStore, kind: Kind, obj: Obj, *, share: bool, dry_run: bool
    ) -> Obj:
        """Fill `obj`'s allocated fields and store it with its allocation keys (module doc);
        with `dry_run`, the filled object, stored nowhere and holding nothing."""
        for _ in range(MAX_ATTEMPTS):
            await self.refresh(objects)
            filled, auto = self.assigner.assign(obj, None)
            if dry_run:
                self.assigner.forget(auto)
                return filled
            try:
                return await objects.create(kind, filled, share=share)
            except ClaimTaken as exc:
                self.assigner.forget(auto - exc.keys)  # the taken ones stay taken in the view
                if exc.keys <= auto:
                    continue  # another API server took what we picked: pick again
                raise
            except ApiError:
                self.assigner.forget(auto)
                raise
        raise errors.service_unavailable(
            f"could not allocate addresses for service {obj['metadata'].get('name')!r}: "
            "other writers took every pick; retry"
        )

    def written(self, old: Obj | None, new: Obj | None) -> None:
        """A Service write went through: free in the view what `old` held and `new` does not."""
        before = held_keys(old) if old is not None else frozenset()
        after = held_keys(new) if new is not None else frozenset()
        self.assigner.forget(before - after)


async def _list_all(
    store: Store, prefix: str, *, revision: int = 0, linearizable: bool = True
) -> list[KeyValue]:
    out: list[KeyValue] = []
    token: str | None = None
    while True:
        res = await store.list(
            prefix, limit=PAGE, continue_token=token, revision=revision, linearizable=linearizable
        )
        out.extend(res.kvs)
        token = res.continue_token
        if token is None:
            return out


async def repair_allocations(objects: ObjectStore) -> tuple[int, int]:
    """One repair pass (module doc); returns (keys deleted, keys re-created)."""
    store = objects.store
    revision = await store.current_revision()
    services = await _list_all(store, prefix_of(SERVICE), revision=revision)
    keys = {
        kv.key: kv
        for prefix in (IP_PREFIX, PORT_PREFIX)
        for kv in await _list_all(store, prefix, revision=revision)
    }
    wanted: dict[str, tuple[Obj, int]] = {}  # key -> (the Service holding it, its revision)
    for kv in services:
        svc = decode(kv)
        for key in held_keys(svc):
            if key in wanted:
                other = wanted[key][0]["metadata"]
                log.error(
                    "services %s/%s and %s/%s both hold %s; leaving it to the first",
                    other.get("namespace"),
                    other.get("name"),
                    svc["metadata"].get("namespace"),
                    svc["metadata"].get("name"),
                    value_of_key(key),
                )
                continue
            wanted[key] = (svc, kv.mod_revision)
    deleted = created = 0
    for key, kv in keys.items():
        if key in wanted:
            continue
        try:
            await store.delete(key, expected_mod_revision=kv.mod_revision)
        except (st.Conflict, st.KeyNotFound):
            continue  # taken again (or freed) since the snapshot: not ours to judge now
        deleted += 1
        log.warning("released %s: no service holds it", value_of_key(key))
    for key, (svc, mod) in wanted.items():
        if key in keys:
            continue
        meta = svc["metadata"]
        res = await store.txn(
            [
                st.Compare(
                    key_of(SERVICE, meta.get("namespace", ""), meta["name"]),
                    st.CompareTarget.MOD,
                    "=",
                    mod,
                ),
                st.Compare(key, st.CompareTarget.CREATE, "=", 0),
            ],
            [st.TxnOp(key, owner_value(svc))],
            [],
        )
        if res.succeeded:
            created += 1
            log.warning(
                "re-registered %s for service %s/%s",
                value_of_key(key),
                meta.get("namespace"),
                meta["name"],
            )
    return deleted, created


class AllocationRepair:
    """The repair pass, every `interval` seconds while this server leads (module doc)."""

    def __init__(
        self,
        objects: ObjectStore,
        *,
        interval: float = REPAIR_INTERVAL,
        fence_term: int | None = None,
    ) -> None:
        self.objects = objects
        self.interval = interval
        self.fence_term = fence_term  # its writes count only while this term's leader leads

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            try:
                with fenced(self.fence_term):
                    await repair_allocations(self.objects)
            except st.StoreError as exc:
                log.warning("service allocation repair failed (retried): %s", exc)
            await trio.sleep(self.interval)
