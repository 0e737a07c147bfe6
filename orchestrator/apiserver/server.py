"""The API server component: PKI, tokens and kubeconfig on first start, the ASGI app on
hypercorn's trio worker, the built-in namespaces, and CRD-defined kinds kept in sync.

Custom kinds: the server that writes a CRD updates its registry before answering (kubectl creates
a custom resource right after its CRD); every server also watches the CRD keys, so CRDs written
through another server (or restored from a snapshot) appear everywhere.

Tokens: the cluster-wide table (`ClusterTokens`, the bundle's start-up table migrated into it
once) is loaded before the listener starts and kept current by a watch; the `/orchestrator/v1/`
endpoints (`tokenapi`) serve the CA, join tokens and node joins. `DATA_DIR/server-token` (0600)
holds `K10<CA sha256>::<cluster token>`, what another server joins with (`--server URL --token`,
or `--join HOST:PORT --token`); `GET /orchestrator/v1/members` tells it the members' client
addresses (`members`).

Stopping (`drain`, the server's SIGTERM): /readyz fails and watches end at once (clients
re-watch elsewhere), the listener closes (new connections are refused), and requests in progress
get `drain_timeout` seconds to finish; each connection closes after its response. The in-process
users of `api` (controllers, the embedded agent) are not affected.

Certificates: `certs` (`auth.renewal.CertRenewer`) renews the serving certificate and the
kubelet-client certificate before they expire and picks up pairs rotated on disk
(`orchestrator certs rotate`), hot-swapping them into the listener (`tls.ReloadableContext`),
the log proxy and the embedded agent's log endpoint (which registers itself) — no restart.

Invariants: `run` signals `task_status.started(port)` only when the listener is bound and
`DATA_DIR/kubeconfig.yaml` names that port; the built-in kinds never change at run time.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
import yaml
from hypercorn.config import Config

from orchestrator.apiserver.app import ApiApp
from orchestrator.apiserver.flowcontrol import FlowControl, FlowControlConfig
from orchestrator.apiserver.handler import Call
from orchestrator.apiserver.logproxy import KUBELET_CLIENT_LEAF, AgentLogProxy, kubelet_client_leaf
from orchestrator.apiserver.resources import Api
from orchestrator.apiserver.storage import ObjectStore, prefix_of
from orchestrator.apiserver.tokenapi import OrchestratorRoutes
from orchestrator.kube import errors
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.builtin import builtin_registry
from orchestrator.kube.schema.crd import kinds_from_crd
from orchestrator.kube.schema.kind import Kind, Registry
from orchestrator.network.settings import NetworkSettings
from orchestrator.security.authn import Authenticator
from orchestrator.security.clustertokens import ClusterTokens
from orchestrator.security.jointoken import ca_sha256, format_token
from orchestrator.security.kubeconfig import write_kubeconfig
from orchestrator.security.pki import Pki, atomic_write, ensure_pki
from orchestrator.security.renewal import SERVING, CertRenewer, RenewalConfig, serving_leaf
from orchestrator.security.shared import Bundle, local_bundle, shared_credentials
from orchestrator.security.tls import MAX_REQUEST_HEAD, ReloadableContext, serve, server_ssl_context
from orchestrator.security.tokens import ADMIN_USER, MASTERS, TokenStore
from orchestrator.store.api import Store

log = logging.getLogger(__name__)

SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
DRAIN_TIMEOUT = 5.0  # seconds a stopping server gives the requests in progress
# An idle connection is closed after this long (hypercorn's default is 5 s). Longer than an
# agent's 10 s Lease interval, so agents keep their connection (no TLS handshake per renewal),
# and longer than the clients' idle expiry (`client.rest.KEEPALIVE_EXPIRY`), so a client never
# sends a request on a connection the server is closing (no answer: "Server disconnected").
KEEP_ALIVE_TIMEOUT = 75.0


@dataclass
class ApiOptions:
    data_dir: Path
    listen: str = "127.0.0.1:6443"
    tls: bool = True
    extra_sans: list[str] = field(default_factory=list)
    cluster_token: str = ""  # encrypts the credentials the servers share through the store
    node_name: str = ""  # this server's embedded agent's Node (read like any other node's)
    cert_renewal: RenewalConfig = field(default_factory=RenewalConfig)  # intervals, clock
    # the overload gate: seats (--max-requests-inflight), queue wait, Retry-After
    flowcontrol: FlowControlConfig = field(default_factory=FlowControlConfig)


def split_host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{text!r} is not HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


class CustomKinds:
    """Keeps the registry's custom kinds equal to the stored CRDs."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._owned: dict[str, list[Kind]] = {}  # CRD name -> kinds it serves

    def changed(self, crd: Obj, deleted: bool) -> None:
        name = str(crd.get("metadata", {}).get("name", ""))
        for k in self._owned.pop(name, []):
            self.registry.remove(k.group, k.version, k.plural)
        if deleted or crd.get("metadata", {}).get("deletionTimestamp"):
            return
        try:
            kinds = kinds_from_crd(crd)
        except (errors.ApiError, KeyError, TypeError, ValueError) as exc:
            log.warning("CRD %s cannot be served: %s", name, exc)
            return
        for k in kinds:
            if self.registry.by_resource(k.group, k.version, k.plural) is None:
                self.registry.add(k)
        self._owned[name] = kinds

    def replace_all(self, crds: list[Obj]) -> None:
        names = {str(c.get("metadata", {}).get("name", "")) for c in crds}
        for gone in set(self._owned) - names:
            self.changed({"metadata": {"name": gone}}, True)
        for crd in crds:
            self.changed(crd, False)


class ApiServer:
    def __init__(
        self,
        store: Store,
        opts: ApiOptions,
        *,
        ready: Any = None,
        drain_timeout: float = DRAIN_TIMEOUT,
        network: NetworkSettings | None = None,
    ) -> None:
        self.opts = opts
        self.drain_timeout = drain_timeout
        self.draining = trio.Event()  # set by `drain`
        self._served = trio.Event()  # the listener is closed and every connection finished
        self.registry = builtin_registry()
        self.custom = CustomKinds(self.registry)
        self.objects = ObjectStore(store)
        self.api = Api(
            self.objects,
            self.registry,
            on_crd_change=self.custom.changed,
            flowcontrol=FlowControl(opts.flowcontrol),
            network=network,
        )
        self.port = 0
        self.pki: Pki | None = None
        self.certs = CertRenewer(opts.cert_renewal)  # leaves added by `run`
        self.tokens: ClusterTokens | None = None  # the cluster-wide token table
        # the Raft members' client addresses for joining servers (`members`; set before `run`)
        self.members: Callable[[], Awaitable[list[Obj]]] | None = None
        self._ready = ready

    @property
    def admin(self) -> Call:
        from orchestrator.security.authn import User

        return Call(User("system:apiserver", ("system:masters", "system:authenticated")))

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        host, port = split_host_port(self.opts.listen)
        data_dir = self.opts.data_dir
        sans = [*self.opts.extra_sans]
        if host not in ("0.0.0.0", "::", ""):
            sans.append(host)
        kubeconfig = data_dir / "kubeconfig.yaml"

        def make_local() -> Bundle:
            ensure_pki(data_dir, sans)
            tokens = TokenStore.open(data_dir)
            return local_bundle(data_dir, tokens, _admin_token(tokens, kubeconfig))

        bundle = await shared_credentials(
            self.objects.store, data_dir, self.opts.cluster_token, make_local
        )
        self.pki = pki = ensure_pki(data_dir, sans)  # the serving cert, under the shared CA
        pin = ca_sha256(pki.ca_pem)
        self.tokens = tokens = ClusterTokens(self.objects.store)
        tokens.ca_pin = pin
        await tokens.migrate(TokenStore.open(data_dir))  # once per cluster
        if self.opts.cluster_token:  # k3s' server/token: what other servers join with
            token_file = data_dir / "server-token"
            server_token = format_token(pin, self.opts.cluster_token).encode() + b"\n"
            await trio.to_thread.run_sync(atomic_write, token_file, server_token, 0o600)
        admin_token = bundle.admin_token
        authenticator = Authenticator(tokens, pki.ca_cert)
        routes = OrchestratorRoutes(
            tokens,
            pki.ca_pem,
            pin,
            self._node_exists,
            pki,
            cluster_token=self.opts.cluster_token,
            members=self.members,
            bundle=self._sealed_bundle,
        )
        logs = await AgentLogProxy.for_pki(pki, self._get_node)
        app = ApiApp(
            self.api,
            authenticator,
            server_address=f"{host}:{port}",
            logs=logs,
            ready=self._ready or (lambda: True),
            extra=routes,
            draining=self.draining,
        )
        context = ReloadableContext(lambda: server_ssl_context(pki)) if self.opts.tls else None
        async with trio.open_nursery() as nursery:
            await nursery.start(tokens.run)
            self.port = await nursery.start(self._serve, app, host, port, context)
            self._watch_certificates(pki, sans, context, logs)
            await nursery.start(self.certs.run)
            scheme = "https" if context else "http"
            url_host = (
                "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)
            )
            url = f"{scheme}://{url_host}:{self.port}"
            write_kubeconfig(
                kubeconfig,
                url,
                pki.ca_pem,
                "admin",
                token=admin_token,
            )
            nursery.start_soon(self._bootstrap)
            nursery.start_soon(self._sync_custom_kinds)
            log.info("API server on %s (kubeconfig %s)", url, data_dir / "kubeconfig.yaml")
            task_status.started(self.port)

    async def _sealed_bundle(self) -> bytes | None:
        from orchestrator.security.shared import KEY

        kv = await self.objects.store.get(KEY)
        return None if kv is None else kv.value

    async def _serve(
        self,
        app: ApiApp,
        host: str,
        port: int,
        context: ssl.SSLContext | ReloadableContext | None,
        *,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """hypercorn until drained: `drain_timeout` is its `graceful_timeout`."""
        config = Config()
        config.graceful_timeout = self.drain_timeout
        config.keep_alive_timeout = KEEP_ALIVE_TIMEOUT
        # The app answers over-long URLs and headers with a Status (414/431): let them reach it.
        config.h11_max_incomplete_size = MAX_REQUEST_HEAD
        try:
            await serve(
                app,
                host=host,
                port=port,
                ssl_context=context,
                config=config,
                shutdown_trigger=self.draining.wait,
                task_status=task_status,
            )
        finally:
            self._served.set()

    async def drain(self) -> None:
        """Stop serving gracefully (module doc); returns once every connection has finished,
        within about `drain_timeout`."""
        self.draining.set()
        if self.port:  # else the listener was never started
            await self._served.wait()

    def _watch_certificates(
        self,
        pki: Pki,
        sans: list[str],
        context: ReloadableContext | None,
        logs: AgentLogProxy,
    ) -> None:
        """Renew the serving and kubelet-client certificates while running (module doc)."""
        from orchestrator.observability import CERT_EXPIRATION

        CERT_EXPIRATION.labels("ca").set(pki.ca_cert.not_valid_after_utc.timestamp())
        self.certs.add(serving_leaf(pki, sans))
        self.certs.add(kubelet_client_leaf(pki))
        if context is not None:
            self.certs.on_reload(SERVING, context.reload)
        self.certs.on_reload(KUBELET_CLIENT_LEAF, logs.reload_client_cert)

    async def _get_node(self, name: str) -> Obj | None:
        """The Node object (for the log proxy), or None if there is none by that name."""
        kind = self.registry.by_resource("", "v1", "nodes")
        assert kind is not None
        try:
            return await self.api.get(self.admin, kind, "", name)
        except errors.ApiError as exc:
            if exc.code == 404:
                return None
            raise

    async def _node_exists(self, name: str) -> bool:
        return await self._get_node(name) is not None

    async def _bootstrap(self) -> None:
        """Create the system namespaces (idempotent; retried until the store has quorum)."""
        ns_kind = self.registry.by_resource("", "v1", "namespaces")
        assert ns_kind is not None
        for name in SYSTEM_NAMESPACES:
            while True:
                try:
                    await self.api.create(self.admin, ns_kind, "", {"metadata": {"name": name}})
                    break
                except errors.ApiError as exc:
                    if exc.code == 409:
                        break
                    log.info("creating namespace %s: %s; retrying", name, exc)
                    await trio.sleep(1.0)

    async def _sync_custom_kinds(self) -> None:
        crd_kind = self.registry.by_resource(
            "apiextensions.k8s.io", "v1", "customresourcedefinitions"
        )
        assert crd_kind is not None
        while True:
            try:
                crds, res = await self.objects.list(crd_kind, "", stale_ok=True)
                self.custom.replace_all(crds)
                watcher = self.objects.store.watch(
                    prefix_of(crd_kind), res.revision + 1, progress_notify=False
                )
                async with watcher:
                    async for response in watcher:
                        if response.canceled:
                            break
                        if response.events:
                            crds, _ = await self.objects.list(crd_kind, "", stale_ok=True)
                            self.custom.replace_all(crds)
            except errors.ApiError as exc:
                log.info("CRD sync: %s; retrying", exc)
            await trio.sleep(1.0)


def _admin_token(tokens: TokenStore, kubeconfig: Path) -> str:
    """The admin token: new on first start; later the one in the kubeconfig if it still works
    (so a restart keeps users' copies valid), else a fresh one (the old one is replaced)."""
    token = tokens.ensure_admin()
    if token is not None:
        return token
    try:
        doc = yaml.safe_load(kubeconfig.read_text())
        for user in doc.get("users") or []:
            candidate = (user.get("user") or {}).get("token")
            entry = tokens.lookup(candidate) if candidate else None
            if entry is not None and entry.name == ADMIN_USER:
                return str(candidate)
    except (OSError, yaml.YAMLError, AttributeError, TypeError):
        pass
    return tokens.add(ADMIN_USER, [MASTERS])
