"""Assembles one server process: the Raft node, the MVCC store on it, and the client port.

Before the store starts (`Server.run`), the server makes sure of its store credentials in
`DATA_DIR/pki` (`security.peercerts`): the cluster CA (kept; on a first start derived from the
cluster token, or, joining with `--server URL`, adopted from the cluster's sealed bundle fetched
through that API), its peer certificate and the admin client certificate. The Raft peer port and
the client port then run mutual TLS with them; `certs` renews both leaves while running and hot-
swaps the peer certificate into both ports' contexts. The bound client address is written to
`DATA_DIR/client-address` (`orchestrator kv|member|status --data-dir` talk to it).

Runs until cancelled or until SIGTERM/SIGINT, then stops in order (`shut_down`):

1. STOPPING=1; drain (`Server.drain`, bounded by `ServerOptions.drain_timeout`): the Kubernetes
   API and the store's client port stop accepting connections, /readyz fails, watches end
   (clients re-watch on another server) and the requests in progress (writes in particular)
   finish and are answered; what is still running when the bound runs out is cut off.
2. The controllers and the embedded agent stop (the agent's containers keep running: the unit
   has `KillMode=process`).
3. A leader hands leadership to the most caught-up voter (bounded by `HANDOVER_TIMEOUT`), so
   the cluster does not wait an election timeout.
4. Everything else is cancelled: the databases close cleanly; the process exits 0.

The whole stop takes at most about `drain_timeout + HANDOVER_TIMEOUT` (7 s by default), well
within the unit's `TimeoutStopSec`. Under systemd (`orchestrator.systemd`): READY=1 once the
store, the API and the embedded agent have started, STATUS= on every role change ("leader term
3", "follower of 2 term 3") and each stop step, WATCHDOG=1 from the trio loop (until the end),
STOPPING=1 on SIGTERM; SIGHUP reloads what can be reloaded (the log level, from the environment
file).
"""

from __future__ import annotations

import gc
import logging
import secrets
import signal
import ssl
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import trio

from orchestrator import looplag
from orchestrator.agent.service import AgentConfig, run_embedded
from orchestrator.apiserver.server import DRAIN_TIMEOUT, ApiOptions, ApiServer
from orchestrator.assembly import controller_manager
from orchestrator.cluster.apiendpoints import ApiEndpointsPublisher
from orchestrator.cluster.members import MemberDirectory, client_address
from orchestrator.controllers.runtime import ControllerManager, ControllerOptions
from orchestrator.listenerrors import naming_listener
from orchestrator.memory import trim_heap, trim_task
from orchestrator.network.settings import NetworkSettings
from orchestrator.raft.node import NodeConfig, RaftError, RaftNode
from orchestrator.raft.progress import ProgressState
from orchestrator.raft.status import Status
from orchestrator.raft.transport import PeerTLS
from orchestrator.raft.types import NONE
from orchestrator.security import peercerts
from orchestrator.security.renewal import CertRenewer, Leaf, RenewalConfig, in_thread
from orchestrator.security.tls import ReloadableContext
from orchestrator.store.mvcc import DEFAULT_QUOTA_BYTES, MVCCStore
from orchestrator.store.raftstore import CompactionPolicy, RaftStore
from orchestrator.store.service import ClientService, ServiceTLS
from orchestrator.systemd import Notifier, reload_log_level, signal_name, watchdog_task

log = logging.getLogger("orchestrator.server")


TOKEN_FILE = "token"
NODE_ID_FILE = "node-id"
CLIENT_ADDRESS_FILE = "client-address"  # HOST:PORT of this server's client port, for the CLI
JOIN_TIMEOUT = 60.0  # seconds a joining server keeps asking before it gives up
HANDOVER_TIMEOUT = 2.0  # seconds a stopping leader tries to hand leadership over


@dataclass
class ServerOptions:
    node: NodeConfig
    client_listen: str
    token: str = ""
    join_url: str | None = None  # client address of a member to ask for admission
    join_servers: list[str] = field(default_factory=list)  # API URLs to join through (--server)
    join_timeout: float = JOIN_TIMEOUT  # seconds to wait while no --server URL answers
    ca_pin: str = ""  # hex SHA-256 of the cluster CA (a K10 token's pin), checked before joining
    quota_bytes: int = DEFAULT_QUOTA_BYTES
    compaction: CompactionPolicy = field(default_factory=CompactionPolicy)
    api: ApiOptions | None = None  # None: no Kubernetes API on this server
    controllers: bool = True  # run the controllers while this server is the Raft leader
    controller_options: ControllerOptions = field(default_factory=ControllerOptions)
    agent: AgentConfig | None = None  # the embedded node agent (needs the API); None: none
    drain_timeout: float = DRAIN_TIMEOUT  # seconds a stopping server lets requests finish
    cert_renewal: RenewalConfig = field(default_factory=RenewalConfig)  # peer and admin certs
    # The cluster's address plan (--cluster-cidr, --service-cidr, --cluster-dns,
    # --cluster-domain): the API server's Service allocators and the controllers use it.
    network: NetworkSettings = field(default_factory=NetworkSettings.create)


def node_identity(data_dir: Path, requested: int | None, *, joining: bool) -> int:
    """This server's Raft id, fixed at its first start (ids must never change or be reused):
    the requested one, else 1 for a founder or a random one for a server that joins."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / NODE_ID_FILE
    if path.exists():
        stored = int(path.read_text().strip())
        if requested is not None and requested != stored:
            raise ValueError(f"{data_dir} belongs to node {stored}, not {requested}")
        return stored
    nid = (
        requested if requested is not None else (secrets.randbelow(2**31 - 2) + 2 if joining else 1)
    )
    path.write_text(f"{nid}\n")
    return nid


def cluster_token(data_dir: Path, given: str | None) -> str:
    """The secret a server must present to join through this one: given, stored, or new."""
    path = data_dir / TOKEN_FILE
    if given:
        token = given
    elif path.exists():
        return path.read_text().strip()
    else:
        token = "orch-" + secrets.token_hex(16)
    path.write_text(token + "\n")
    path.chmod(0o600)
    return token


def open_store(data_dir: Path, *, quota_bytes: int) -> MVCCStore:
    return MVCCStore(data_dir / "store.db", quota_bytes=quota_bytes)


class Server:
    def __init__(self, opts: ServerOptions) -> None:
        self.opts = opts
        # The address plan, for the API server, the controllers and (the lead wires it) the
        # embedded agent: its cluster DNS address, domain and cluster CIDR.
        self.network = opts.network
        # The peer certificate's contexts, built by `run` before the store starts (module doc).
        self._peer_server: ReloadableContext | None = None
        self._peer_client: ReloadableContext | None = None
        self.certs = CertRenewer(opts.cert_renewal)  # the store's leaves: peer, admin
        opts.node.peer_tls = PeerTLS(
            self._server_context, self._client_context, peercerts.server_node_id
        )
        self.store = RaftStore(
            opts.node, partial(open_store, quota_bytes=opts.quota_bytes), compaction=opts.compaction
        )
        self.node = self.store.node
        self.service = ClientService(
            self.store,
            opts.client_listen,
            token=opts.token,
            tls=ServiceTLS(self._server_context, peercerts.client_port_identity),
        )
        self.api = (
            ApiServer(
                self.store,
                opts.api,
                ready=lambda: self.node.leader_id != NONE,
                drain_timeout=opts.drain_timeout,
                network=opts.network,
            )
            if opts.api
            else None
        )
        self.controllers: ControllerManager | None = None
        self._api_users = trio.CancelScope()
        self._api_users_stopped = trio.Event()
        if self.api is not None and opts.controllers:
            controller_options = replace(opts.controller_options, network=opts.network)
            self.controllers = controller_manager(self.api.api, self.node, controller_options)

    def _server_context(self) -> ssl.SSLContext:
        assert self._peer_server is not None, "Server.run prepares the PKI before serving"
        return self._peer_server.current

    def _client_context(self) -> ssl.SSLContext:
        assert self._peer_client is not None, "Server.run prepares the PKI before connecting"
        return self._peer_client.current

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            join_endpoints = await self._prepare_pki()
            await nursery.start(self.certs.run)
            with naming_listener("--peer-listen", self.opts.node.peer_listen):
                await nursery.start(self.store.run)  # the Raft node binds the peer port
            with naming_listener("--client-listen", self.opts.client_listen):
                await nursery.start(self.service.run)
            await trio.to_thread.run_sync(self._write_client_address)
            log.info(
                "server %d ready: peers on %s, clients on port %d",
                self.node.id,
                self.opts.node.peer_listen,
                self.service.port,
            )
            if not self.node.conf().members():
                if self.opts.join_servers:
                    await self._join_through_api(self.opts.join_servers, join_endpoints)
                elif self.opts.join_url is not None:
                    await self._join(self.opts.join_url)
            if self.api is not None:
                # default/kubernetes lists every server's API (agents fail over with it)
                publisher = ApiEndpointsPublisher.for_server(self.api, self.node)
                # the members' client addresses, for servers joining through an API URL
                address = client_address(self.opts.client_listen, self.service.port, publisher.host)
                directory = MemberDirectory.for_server(self.store, self.node, address)
                self.api.members = directory.list
                with naming_listener("--listen", self.api.opts.listen):
                    await nursery.start(self.api.run)
                await nursery.start(publisher.run)
                await nursery.start(directory.run)
            await nursery.start(self._run_api_users)
            task_status.started()

    async def _prepare_pki(self) -> list[str] | None:
        """The store's credentials (module doc), and the contexts and renewal built from them.
        Joining through `--server` with no CA yet: fetch and adopt the cluster's bundle first;
        returns the client addresses learnt on the way (None otherwise)."""
        opts = self.opts
        data_dir = opts.node.data_dir
        paths = peercerts.PeerPki.of(data_dir)
        endpoints: list[str] | None = None
        if opts.join_servers and not paths.ca_cert.exists():
            from orchestrator.cluster.join import join_info
            from orchestrator.security.shared import adopt, unseal

            info = await join_info(
                opts.join_servers, opts.token, opts.ca_pin, wait=opts.join_timeout, bundle=True
            )
            assert info.bundle is not None
            bundle = unseal(info.bundle, opts.token)
            await trio.to_thread.run_sync(adopt, bundle, data_dir)
            log.info("adopted the cluster's CA from %s", info.url)
            endpoints = info.endpoints
        addresses = [
            opts.node.peer_listen,
            opts.node.advertise or "",
            opts.client_listen,
        ]
        hosts = peercerts.peer_hosts(addresses)
        nid = opts.node.node_id
        await trio.to_thread.run_sync(peercerts.prepare, data_dir, opts.token, nid, addresses)
        self._peer_server = await trio.to_thread.run_sync(
            ReloadableContext, partial(peercerts.peer_server_context, data_dir)
        )
        self._peer_client = await trio.to_thread.run_sync(
            ReloadableContext, partial(peercerts.peer_client_context, data_dir)
        )
        issue_peer = partial(peercerts.issue_peer_cert, data_dir, nid, hosts)
        self.certs.add(
            Leaf(peercerts.PEER_LEAF, paths.peer_cert, paths.peer_key, in_thread(issue_peer))
        )
        self.certs.on_reload(peercerts.PEER_LEAF, self._peer_server.reload)
        self.certs.on_reload(peercerts.PEER_LEAF, self._peer_client.reload)
        issue_admin = partial(peercerts.issue_admin_cert, data_dir)
        self.certs.add(
            Leaf(peercerts.ADMIN_LEAF, paths.admin_cert, paths.admin_key, in_thread(issue_admin))
        )
        return endpoints

    def _write_client_address(self) -> None:
        """`DATA_DIR/client-address`: where this server's client port is reachable from this
        host (a wildcard listen address is reached on loopback)."""
        from orchestrator.security.pki import atomic_write

        address = client_address(self.opts.client_listen, self.service.port, "127.0.0.1")
        atomic_write(self.opts.node.data_dir / CLIENT_ADDRESS_FILE, f"{address}\n".encode(), 0o644)

    async def _run_api_users(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """The API's in-process users: the controllers and the embedded agent (`stop_api_users`
        cancels them)."""
        try:
            with self._api_users:
                async with trio.open_nursery() as nursery:
                    if self.controllers is not None:
                        await nursery.start(self.controllers.run)
                    if self.api is not None and self.opts.agent is not None:
                        agent_dir = self.opts.node.data_dir / "agent"
                        await nursery.start(
                            partial(run_embedded, self.api, self.opts.agent, agent_dir)
                        )
                    task_status.started()
        finally:
            self._api_users_stopped.set()

    async def drain(self) -> None:
        """Stop taking requests and answer the ones in progress (module doc, step 1): the API
        and the client port drain side by side. Returns once both have; callers bound it."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.service.drain)
            if self.api is not None:
                nursery.start_soon(self.api.drain)

    async def stop_api_users(self) -> None:
        """Stop the controllers and the embedded agent (its containers keep running)."""
        self._api_users.cancel()
        await self._api_users_stopped.wait()

    async def _join(self, url: str) -> None:
        """Ask a member to add us as a learner; the leader promotes us once we caught up."""
        if not url:
            log.info("server %d waits to be added (member add-learner)", self.node.id)
            return
        await self._join_endpoints([url.split("://", 1)[-1].rstrip("/")])

    async def _join_through_api(self, urls: list[str], endpoints: list[str] | None) -> None:
        """`--server URL`: learn the members' client addresses through a server's API (CA pin
        checked first, `cluster.join`; already done when the bundle was fetched), then join
        through them."""
        from orchestrator.cluster.join import member_endpoints

        if endpoints is None:
            endpoints = await member_endpoints(
                urls, self.opts.token, self.opts.ca_pin, wait=self.opts.join_timeout
            )
        await self._join_endpoints(endpoints)

    async def _join_endpoints(self, endpoints: list[str]) -> None:
        """The store's `join` op through these client addresses (redirected to the leader)."""
        from orchestrator.store.client import ClientError, StoreClient, TLSRefused

        endpoint = ", ".join(endpoints)
        advertise = self.opts.node.advertise or self.opts.node.peer_listen
        with trio.fail_after(JOIN_TIMEOUT):
            # Our peer certificate is our client certificate on the members' client ports.
            async with StoreClient(endpoints, tls=self._client_context()) as client:
                if self.opts.ca_pin:  # the cluster's CA must be the pinned one: else send nothing
                    from orchestrator.security.jointoken import verify_bundle_pin

                    await verify_bundle_pin(client.get, self.opts.token, self.opts.ca_pin)
                while True:
                    try:
                        await client.call("join", self.opts.token, self.node.id, advertise)
                        break
                    except TLSRefused as exc:
                        raise PermissionError(
                            f"join refused by {endpoint} ({exc}): that cluster's CA is not "
                            "derived from this token (a site from before token-derived CAs, or "
                            "another token); join with --server URL (a server's API) and the "
                            "K10... token in a server's DATA_DIR/server-token"
                        ) from None
                    except (OSError, ClientError) as exc:
                        if "token" in str(exc):
                            raise PermissionError(f"join refused by {endpoint}: {exc}") from exc
                        log.warning("join through %s failed (%s); retrying", endpoint, exc)
                        await trio.sleep(1.0)
        log.info("server %d joined through %s as learner %s", self.node.id, endpoint, advertise)


# Cyclic GC: a server allocates many short-lived containers per request (entries, messages,
# dicts); at CPython's default gen-0 threshold (700) the collector took ~8% of a server's CPU
# under write load (perf). Almost nothing here forms cycles, so collect far less often, and
# move everything alive after start-up out of the collector's sight. Then the C heap's free pages
# (start-up garbage) go back to the kernel (`memory`), now and periodically (`trim_task`).
GC_THRESHOLDS = (50_000, 20, 20)


def tune_gc() -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    trim_heap()


def role_status(node: RaftNode) -> str:
    """One line for `systemctl status`: "leader term 3", "follower of 2 term 3", ..."""
    leading, term = node.leadership()
    if leading:
        return f"leader term {term}"
    if node.leader_id:
        return f"follower of {node.leader_id} term {term}"
    return f"no leader, term {term}"


def successor(status: Status) -> int | None:
    """The voter a stopping leader should hand over to: the most caught-up other voter that is
    being replicated to (so it is alive); None if there is none. `status` is a leader's
    `RaftNode.status()`."""
    best: tuple[int, int] | None = None
    for pid, pr in status.progress.items():
        if pid == status.id or pid not in status.voters or pr.learner:
            continue
        if pr.state is not ProgressState.REPLICATE:
            continue
        if best is None or pr.match > best[0]:
            best = (pr.match, pid)
    return None if best is None else best[1]


async def hand_over_leadership(node: RaftNode) -> int | None:
    """If this server leads, transfer leadership to `successor()` and wait until it has taken
    over; returns the new leader, or None (not the leader, no successor, or it did not happen
    in time). Callers bound it (`trio.move_on_after`)."""
    leading, _ = node.leadership()
    if not leading:
        return None
    target = successor(node.status())
    if target is None:
        log.info("server %d: no caught-up voter to hand leadership to", node.id)
        return None
    log.info("server %d: handing leadership to %d before stopping", node.id, target)
    try:
        await node.transfer_leadership(target)
    except RaftError as exc:  # lost the leadership meanwhile, or the target is no voter now
        log.info("server %d: leadership not handed over: %s", node.id, exc)
        return None
    while node.leadership()[0] or not node.leader_id:
        await node.wait_role_change()
    log.info("server %d: %d leads now", node.id, node.leader_id)
    return node.leader_id


async def _report_role(node: RaftNode, notifier: Notifier) -> None:
    while True:
        notifier.status(role_status(node))
        await node.wait_role_change()


def reload_config() -> None:
    """SIGHUP: reload what can be reloaded and log it."""
    changes = reload_log_level()
    if changes:
        log.warning("reloaded: %s", "; ".join(changes))
    else:
        log.info("reload: nothing changed (the log level is the only reloadable setting)")
    log.debug("debug logging is on")


async def serve_until_signalled(opts: ServerOptions, notifier: Notifier | None = None) -> None:
    notifier = notifier if notifier is not None else Notifier.from_env()
    sigs = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    with trio.open_signal_receiver(*sigs) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(watchdog_task, notifier)
            lag_interval = looplag.interval_from_env()
            if lag_interval is not None:  # a diagnostic: what blocks the event loop
                nursery.start_soon(looplag.report_task, lag_interval)
            notifier.status("starting: opening the store")
            server = Server(opts)
            await nursery.start(server.run)
            tune_gc()
            notifier.ready(role_status(server.node))
            nursery.start_soon(_report_role, server.node, notifier)
            nursery.start_soon(trim_task)
            async for signum in signals:
                if signum == signal.SIGHUP:
                    notifier.reloading()
                    reload_config()
                    notifier.ready()
                    continue
                log.info("received %s: shutting down", signal_name(signum))
                await shut_down(server, notifier)
                nursery.cancel_scope.cancel()  # the databases close as the store's task ends
                break


async def shut_down(server: Server, notifier: Notifier) -> None:
    """Steps 1-3 of the ordered stop (module doc); the caller then cancels the server."""
    notifier.stopping("stopping: draining requests")
    with trio.move_on_after(server.opts.drain_timeout) as bound:
        await server.drain()
    if bound.cancelled_caught:
        log.warning(
            "server %d: requests still in progress after %gs are cut off",
            server.node.id,
            server.opts.drain_timeout,
        )
    else:
        log.info("server %d: drained", server.node.id)
    notifier.status("stopping: controllers and agent")
    await server.stop_api_users()
    notifier.status("stopping: handing leadership over")
    with trio.move_on_after(HANDOVER_TIMEOUT):
        await hand_over_leadership(server.node)
    notifier.status("stopping: closing the databases")
