"""The cluster-wide token table: token entries (hashes only) in the replicated store.

Every server authenticates the same tokens and a revocation made through any server holds on
all of them. Keys (values are msgpack maps, `TokenEntry.to_dict()`; never a token):

    /orchestrator/tokens/user/<user name>      admin, node, component and other named tokens
                                               (re-adding a name replaces its token: rotation)
    /orchestrator/tokens/bootstrap/<id>        bootstrap (join) tokens `<id>.<secret>`, with
                                               an expiry, a description and extra groups
    /orchestrator/tokens-migrated              marker: the start-up table (the `tokens.yaml`
                                               of the shared bundle, `shared.py`) was copied in

Reads: `lookup` (every request's authentication; synchronous) answers from an in-memory cache
indexed by token hash. `run` keeps the cache current: a linearizable list of the prefix, then
a store watch from the listed revision (changes appear within the local apply latency), and
again a linearizable re-list every `resync` seconds. Each successful re-list proves the cache
held every change committed before it started, so `lookup` trusts the cache only while the
last proof is younger than `max_stale`; beyond that (the server has lost the quorum) token
authentication answers 503 instead of accepting a token that may have been revoked meanwhile.
So a revocation committed at time T denies the token on every server by T + `max_stale` at
the latest, and within milliseconds on a healthy one. Security-relevant actions (issuing node
credentials on join) use `verify`, a linearizable read-through of the token's own key, which
sees a revocation immediately on any server that can reach the quorum.

Writes (`add`, `create_bootstrap_token`, `revoke`) go through the store and are applied to the
local cache as soon as they are committed (read-your-writes on this server); the watch then
delivers them to every server.

Invariants: only SHA-256 hashes are stored; an expired entry never authenticates; the start-up
table is migrated once per cluster (a transaction guarded by the marker), so a server restarted
with an old `tokens.yaml` never resurrects a revoked token.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Iterable
from typing import Any

import msgpack
import trio

from orchestrator.kube import errors
from orchestrator.security.jointoken import BOOTSTRAP_RE, PREFIX, SEPARATOR, new_bootstrap_token
from orchestrator.security.tokens import (
    BOOTSTRAP_PREFIX,
    BOOTSTRAP_TTL,
    BOOTSTRAPPERS,
    NODE_PREFIX,
    NODES,
    TokenEntry,
    TokenStore,
    token_hash,
)
from orchestrator.store import types as st
from orchestrator.store.api import Store

log = logging.getLogger(__name__)

KEY_PREFIX = "/orchestrator/tokens/"
USER_PREFIX = KEY_PREFIX + "user/"
BOOTSTRAP_KEY_PREFIX = KEY_PREFIX + "bootstrap/"
MIGRATED_KEY = "/orchestrator/tokens-migrated"
RESYNC = 5.0  # seconds between linearizable re-lists (freshness proofs)
MAX_STALE = 30.0  # seconds after the last proof beyond which tokens are not trusted
RETRY = 1.0


def key_of(entry: TokenEntry) -> str:
    if entry.bootstrap_id is not None:
        return BOOTSTRAP_KEY_PREFIX + entry.bootstrap_id
    return USER_PREFIX + entry.name


def encode(entry: TokenEntry) -> bytes:
    return msgpack.packb(entry.to_dict(), use_bin_type=True)  # type: ignore[no-any-return]


def decode(value: bytes) -> TokenEntry | None:
    try:
        doc = msgpack.unpackb(value, raw=False)
        return TokenEntry.from_dict(doc) if isinstance(doc, dict) else None
    except (ValueError, TypeError, KeyError, msgpack.UnpackException) as exc:
        log.warning("ignoring a malformed token entry: %s", exc)
        return None


def valid_bootstrap_group(group: str) -> bool:
    """kubeadm's rule: `system:bootstrappers` or `system:bootstrappers:<more>`."""
    if group == BOOTSTRAPPERS:
        return True
    rest = group.removeprefix(BOOTSTRAPPERS + ":")
    return rest != group and bool(rest) and all(c.isalnum() or c in ":-" for c in rest)


class ClusterTokens:
    """The token table in `store` (module doc). Start `run` before serving requests."""

    def __init__(
        self,
        store: Store,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        resync: float = RESYNC,
        max_stale: float = MAX_STALE,
    ) -> None:
        self.store = store
        self.clock = clock
        self.monotonic = monotonic
        self.resync = resync
        self.max_stale = max_stale
        self.ca_pin: str | None = None  # hex CA hash: a presented `K10<pin>::...` must match
        self._entries: dict[str, TokenEntry] = {}  # store key -> entry
        self._by_hash: dict[str, TokenEntry] = {}
        self._verified_at: float | None = None  # monotonic start of the last re-list

    # ------------------------------------------------------------------ cache
    def _reindex(self) -> None:
        self._by_hash = {e.sha256: e for e in self._entries.values()}

    def _apply(self, key: str, entry: TokenEntry | None) -> None:
        if entry is None:
            self._entries.pop(key, None)
        else:
            self._entries[key] = entry
        self._reindex()

    async def _relist(self) -> int:
        started = self.monotonic()
        res = await self.store.list(KEY_PREFIX)
        entries: dict[str, TokenEntry] = {}
        for kv in res.kvs:
            entry = decode(kv.value)
            if entry is not None:
                entries[kv.key] = entry
        self._entries = entries
        self._reindex()
        self._verified_at = started
        return res.revision

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep the cache current (module doc); `started` once it has been loaded."""
        revision = 0
        started = False
        while True:
            try:
                revision = await self._relist()
            except st.StoreError as exc:
                log.info("token table: re-list failed (%s); watching the local copy", exc)
                if revision == 0:
                    await trio.sleep(RETRY)
                    continue
            if not started:
                started = True
                task_status.started()
            with trio.move_on_after(self.resync):
                watcher = self.store.watch(KEY_PREFIX, revision + 1)
                async with watcher:
                    async for response in watcher:
                        if response.canceled:
                            break  # compacted or too slow: re-list
                        for event in response.events:
                            gone = event.type == st.EventType.DELETE
                            self._apply(event.kv.key, None if gone else decode(event.kv.value))
                        revision = response.revision

    def fresh(self) -> bool:
        return (
            self._verified_at is not None and self.monotonic() - self._verified_at <= self.max_stale
        )

    def _credentials(self, token: str) -> str | None:
        """The part of a presented token that is a credential (a K10 pin must be ours)."""
        if token.startswith(PREFIX) and SEPARATOR in token:
            pin, _, creds = token[len(PREFIX) :].partition(SEPARATOR)
            if self.ca_pin is None or pin.lower().removeprefix("sha256:") != self.ca_pin:
                return None
            return creds
        return token

    def _live(self, entry: TokenEntry | None) -> TokenEntry | None:
        if entry is None or (entry.expires is not None and entry.expires <= self.clock()):
            return None
        return entry

    def lookup(self, token: str) -> TokenEntry | None:
        """The entry of `token` if it exists and has not expired (cache; 503 when stale)."""
        creds = self._credentials(token)
        if creds is None:
            return None
        if not self.fresh():
            raise errors.service_unavailable(
                "this server cannot currently confirm tokens with the cluster (no quorum); "
                "retry, or use another server"
            )
        return self._live(self._by_hash.get(token_hash(creds)))

    def entries(self) -> list[TokenEntry]:
        """The cached entries (hashes only)."""
        return list(self._entries.values())

    # ------------------------------------------------------------------ linearizable reads
    async def verify(self, token: str) -> TokenEntry | None:
        """Like `lookup`, but confirmed by a linearizable read of the token's own key."""
        creds = self._credentials(token)
        if creds is None:
            return None
        cached = self._by_hash.get(token_hash(creds))
        m = BOOTSTRAP_RE.match(creds)
        if cached is not None:
            key = key_of(cached)
        elif m is not None:  # a miss: maybe created a moment ago through another server
            key = BOOTSTRAP_KEY_PREFIX + m.group(1)
        else:
            return None
        try:
            kv = await self.store.get(key)
        except (st.NoQuorum, st.Unavailable) as exc:
            raise errors.service_unavailable(f"cannot confirm the token: {exc}") from exc
        entry = decode(kv.value) if kv is not None else None
        self._apply(key, entry)
        if entry is None or entry.sha256 != token_hash(creds):
            return None
        return self._live(entry)

    async def list_entries(self) -> list[TokenEntry]:
        """Every entry, read linearizably (refreshes the cache)."""
        await self._relist()
        return self.entries()

    # ------------------------------------------------------------------ writes
    async def _put(self, entry: TokenEntry, expected_mod_revision: int | None = None) -> None:
        key = key_of(entry)
        if expected_mod_revision is None:
            await self.store.update(key, encode(entry))
        elif expected_mod_revision == 0:
            await self.store.create(key, encode(entry))
        else:
            await self.store.update(key, encode(entry), expected_mod_revision=expected_mod_revision)
        self._apply(key, entry)

    async def add(
        self,
        name: str,
        groups: Iterable[str] = (),
        *,
        ttl: float | None = None,
        owner: str = "",
        description: str = "",
        expected_mod_revision: int | None = None,
    ) -> str:
        """A new token for user `name` (replacing that user's previous token)."""
        if not name:
            raise ValueError("a token needs a user name")
        token = secrets.token_urlsafe(32)
        expires = self.clock() + ttl if ttl is not None else None
        entry = TokenEntry(
            name,
            tuple(groups),
            token_hash(token),
            expires,
            description=description,
            owner=owner,
        )
        await self._put(entry, expected_mod_revision)
        return token

    async def add_node(
        self, node_name: str, *, owner: str = "", expected_mod_revision: int | None = None
    ) -> str:
        """A node token (system:node:<name>, system:nodes); `owner`: who joined the node."""
        return await self.add(
            NODE_PREFIX + node_name,
            [NODES],
            owner=owner,
            expected_mod_revision=expected_mod_revision,
        )

    async def create_bootstrap_token(
        self,
        ttl: float | None = BOOTSTRAP_TTL,
        *,
        description: str = "",
        groups: Iterable[str] = (BOOTSTRAPPERS,),
    ) -> tuple[str, str]:
        """`(id, "<id>.<secret>")`: a new join token (user system:bootstrap:<id>); `ttl` None
        or 0: it never expires. Extra groups must be `system:bootstrappers[:...]`."""
        gs = list(dict.fromkeys(groups)) or [BOOTSTRAPPERS]
        bad = [g for g in gs if not valid_bootstrap_group(g)]
        if bad:
            raise ValueError(f"groups {bad} are not system:bootstrappers or system:bootstrappers:*")
        if BOOTSTRAPPERS not in gs:
            gs.insert(0, BOOTSTRAPPERS)
        await self.prune_expired()
        while True:
            token_id, token = new_bootstrap_token()
            entry = TokenEntry(
                BOOTSTRAP_PREFIX + token_id,
                tuple(gs),
                token_hash(token),
                self.clock() + ttl if ttl else None,
                token_id,
                description=description,
            )
            try:
                await self._put(entry, expected_mod_revision=0)
                return token_id, token
            except st.KeyExists:
                continue  # an id collision (1 in 2 billion): draw again

    async def revoke(self, name: str) -> bool:
        """Forget the token with bootstrap id `name`, or of user `name`."""
        if not name or "/" in name:
            return False
        found = False
        for key in (BOOTSTRAP_KEY_PREFIX + name, USER_PREFIX + name):
            try:
                await self.store.delete(key)
                found = True
            except st.KeyNotFound:
                pass
            self._apply(key, None)
        return found

    async def prune_expired(self) -> int:
        now = self.clock()
        dropped = 0
        for e in await self.list_entries():
            if e.expires is not None and e.expires <= now:
                try:
                    await self.store.delete(key_of(e))
                    dropped += 1
                except st.KeyNotFound:
                    pass
                self._apply(key_of(e), None)
        return dropped

    async def entry_kv(self, key: str) -> tuple[TokenEntry | None, int]:
        """The entry at `key` and its mod_revision (0: absent), read linearizably."""
        kv = await self.store.get(key)
        return (decode(kv.value) if kv is not None else None), (kv.mod_revision if kv else 0)

    # ------------------------------------------------------------------ start-up table
    async def migrate(self, table: TokenStore) -> None:
        """Copy the start-up table into the store, once per cluster (guarded by a marker)."""
        ops = [st.TxnOp(key_of(e), encode(e)) for e in table.entries]
        chunk = st.MAX_TXN_OPS - 1
        for i in range(0, max(len(ops), 1), chunk):
            part = ops[i : i + chunk]
            last = i + chunk >= len(ops)
            if last:
                part = [*part, st.TxnOp(MIGRATED_KEY, b"1")]
            while True:
                try:
                    res = await self.store.txn(
                        [st.Compare(MIGRATED_KEY, st.CompareTarget.CREATE, "=", 0)], part, []
                    )
                    break
                except (st.NoQuorum, st.Unavailable) as exc:
                    log.info("waiting for the store to migrate the token table: %s", exc)
                    await trio.sleep(RETRY)
            if res.error is not None:
                raise res.error
            if not res.succeeded:
                return  # another server (or an earlier start) migrated it
        log.info("token table: %d start-up entries moved into the store", len(ops))


def describe(entry: TokenEntry, now: float) -> dict[str, Any]:
    """What `token list` shows of an entry (never a hash or a secret)."""
    remaining = None if entry.expires is None else max(0.0, entry.expires - now)
    return {
        "id": entry.bootstrap_id or entry.name,
        "user": entry.name,
        "groups": list(entry.groups),
        "expires": entry.expires,
        "ttlSeconds": remaining,
        "description": entry.description,
        "bootstrap": entry.bootstrap_id is not None,
    }
