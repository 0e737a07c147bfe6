"""`default/kubernetes`: the Service and Endpoints through which clients find every API server.

As in Kubernetes (and how k3s agents learn the servers), the Endpoints `default/kubernetes`
lists the API servers' addresses; standalone agents read it (`orchestrator.client.endpoints`)
to fail over from the server they joined through to any other.

Theory of operation
-------------------
Every server runs an `ApiEndpointsPublisher` beside its API (`Server.run` starts it). Each
round — at start, then every `interval`, sooner (back-off from `RETRY_INITIAL`) after a failed
one — it:

1. makes sure the Service `default/kubernetes` exists (no selector, port `https` 443 -> the API
   port): the endpoints controller deletes the Endpoints of a Service that does not exist and
   leaves those of a selector-less Service alone;
2. reads the Endpoints `default/kubernetes` and computes (pure `desired_servers`) the map Raft
   node id -> API URL it should hold: the stored map (the `orchestrator.dev/apiservers`
   annotation, JSON), with this server's own entry set to its advertised URL while it is a Raft
   member and, on the Raft leader only, the entries of servers that are no longer members
   removed;
3. writes the object (`endpoints_object`: the annotation plus one subset per scheme and port,
   addresses sorted) when it differs — created, or updated conditionally on the
   resourceVersion it read; a conflict (another server wrote meanwhile) waits for the next
   round (soon: failures retry after `RETRY_INITIAL`).

So the object lists the API address of every current member, live or not (a member that is
down is expected back; clients skip it while it fails): a server appears within one round of
starting as a member and is dropped within one round of the leader's applying its removal.
A cluster of one server publishes too (issue 19): the Service gets a ClusterIP (the first
address of the service CIDR, allocated by the API server on create) that the node proxy routes
to these addresses, through the EndpointSlice the mirroring controller makes of this object.
Nothing is written before this server is a member (an empty object would say "no servers").

The advertised address (`advertised_host`): the `--listen` host when it is a specific
address, else the peer advertise host when it is specific and not loopback, else the first IP
address among `--tls-san`, else the host's outbound address. `for_server` also adds it to the
serving certificate's names, so clients verify the server under the address they are given.

Invariants: a server only adds or changes its own entry; only the Raft leader removes entries,
and only those of non-members; every write is a compare-and-swap on what was read; nothing
here ever blocks the API (the publisher is a separate task and failures are only logged).
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import trio

from orchestrator.apiserver.server import split_host_port
from orchestrator.kube import errors
from orchestrator.kube.objects import Obj

if TYPE_CHECKING:
    from orchestrator.apiserver.server import ApiServer
    from orchestrator.raft.node import RaftNode

__all__ = [
    "ANNOTATION",
    "NAME",
    "NAMESPACE",
    "ApiEndpointsPublisher",
    "advertised_host",
    "desired_servers",
    "endpoints_object",
    "published_servers",
    "service_object",
]

log = logging.getLogger(__name__)


NAMESPACE = "default"
NAME = "kubernetes"
ANNOTATION = "orchestrator.dev/apiservers"  # JSON {"<raft node id>": "<API URL>"}
INTERVAL = 10.0  # seconds between rounds
RETRY_INITIAL = 1.0  # after a failed round (doubling up to INTERVAL)
_WILDCARDS = ("", "0.0.0.0", "::")


# ---------------------------------------------------------------------------------- pure
def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    return _is_ip(host) and ipaddress.ip_address(host).is_loopback


def advertised_host(
    listen_host: str, peer_advertise_host: str, tls_sans: list[str], outbound: Callable[[], str]
) -> str:
    """The address other devices reach this server's API at (module doc); `outbound()` is the
    last resort (the host's outbound address)."""
    listen_host = listen_host.strip("[]")
    if listen_host not in _WILDCARDS:
        return listen_host
    peer = peer_advertise_host.strip("[]")
    if peer not in _WILDCARDS and not _is_loopback(peer):
        return peer
    for san in tls_sans:
        if _is_ip(san.strip("[]")):
            return san.strip("[]")
    return outbound()


def api_url(scheme: str, host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}:{port}"


def published_servers(endpoints: Mapping[str, Any] | None) -> dict[int, str]:
    """The node id -> URL map an Endpoints object carries (empty if none or unreadable)."""
    if not endpoints:
        return {}
    text = ((endpoints.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION)
    try:
        doc = json.loads(text) if isinstance(text, str) else {}
    except ValueError:
        return {}
    out: dict[int, str] = {}
    if isinstance(doc, dict):
        for key, url in doc.items():
            if str(key).isdigit() and isinstance(url, str) and url:
                out[int(key)] = url
    return out


def desired_servers(
    published: Mapping[int, str],
    me: int,
    url: str,
    members: frozenset[int],
    *,
    leader: bool,
) -> dict[int, str]:
    """What the map should be after this server's round (module doc, step 2)."""
    out = dict(published)
    if me in members:
        out[me] = url
    if leader:
        out = {nid: u for nid, u in out.items() if nid in members}
    return dict(sorted(out.items()))


def _split_url(url: str) -> tuple[str, str, int] | None:
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None
    try:
        host, port = split_host_port(rest.rstrip("/"))
    except ValueError:
        return None
    return scheme, host, port


def endpoints_object(servers: Mapping[int, str]) -> Obj:
    """The Endpoints `default/kubernetes` for `servers` (node id -> URL): the map as an
    annotation, the addresses as subsets (one per scheme and port, so servers on different
    ports are all listed), everything sorted so equal maps give equal objects."""
    by_port: dict[tuple[str, int], set[str]] = {}
    for url in servers.values():
        parts = _split_url(url)
        if parts is not None:
            scheme, host, port = parts
            by_port.setdefault((scheme, port), set()).add(host)
    subsets = [
        {
            "addresses": [{"ip": host} for host in sorted(hosts)],
            "ports": [{"name": scheme, "port": port, "protocol": "TCP"}],
        }
        for (scheme, port), hosts in sorted(by_port.items())
    ]
    annotation = json.dumps({str(k): v for k, v in sorted(servers.items())}, sort_keys=True)
    return {
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "annotations": {ANNOTATION: annotation}},
        "subsets": subsets,
    }


def service_object(port: int, cluster_ip: str = "") -> Obj:
    """The selector-less Service `default/kubernetes` (its Endpoints are written here), with
    `cluster_ip` (the service CIDR's first address, only ever handed out when asked for)."""
    spec: Obj = {
        "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": port}],
        "sessionAffinity": "None",
        "type": "ClusterIP",
    }
    if cluster_ip:
        spec["clusterIP"] = cluster_ip
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": {"component": "apiserver"}},
        "spec": spec,
    }


def _same(stored: Obj | None, wanted: Obj) -> bool:
    if stored is None:
        return False
    annotations = (stored.get("metadata") or {}).get("annotations") or {}
    same_map = annotations.get(ANNOTATION) == wanted["metadata"]["annotations"][ANNOTATION]
    return bool(same_map and (stored.get("subsets") or []) == wanted["subsets"])


# ---------------------------------------------------------------------------------- driver
class ApiEndpointsPublisher:
    """Keeps this server's entry in `default/kubernetes` (module doc)."""

    def __init__(
        self,
        api_server: ApiServer,
        node_id: int,
        members: Callable[[], frozenset[int]],
        leading: Callable[[], bool],
        host: str,
        *,
        interval: float = INTERVAL,
    ) -> None:
        self.api_server = api_server
        self.node_id = node_id
        self.members = members
        self.leading = leading
        self.host = host
        self.interval = interval

    @classmethod
    def for_server(cls, api_server: ApiServer, node: RaftNode) -> ApiEndpointsPublisher:
        """The publisher of a server's API (call before `api_server.run`: it adds the advertised
        address to the serving certificate's names)."""
        from orchestrator.agent.node import default_ip

        opts = api_server.opts
        listen_host, _ = split_host_port(opts.listen)
        peer_host, _ = split_host_port(node.cfg.advertise or node.cfg.peer_listen)
        host = advertised_host(listen_host, peer_host, opts.extra_sans, default_ip)
        if host not in opts.extra_sans:
            opts.extra_sans = [*opts.extra_sans, host]
        return cls(
            api_server,
            node.id,
            lambda: node.conf().members(),
            lambda: node.leadership()[0],
            host,
        )

    @property
    def url(self) -> str:
        scheme = "https" if self.api_server.opts.tls else "http"
        return api_url(scheme, self.host, self.api_server.port)

    def _kind(self, plural: str) -> Any:
        kind = self.api_server.registry.by_resource("", "v1", plural)
        assert kind is not None
        return kind

    async def _ensure_service(self) -> None:
        api, admin, kind = self.api_server.api, self.api_server.admin, self._kind("services")
        try:
            await api.get(admin, kind, NAMESPACE, NAME, rv="0")
            return
        except errors.ApiError as exc:
            if exc.code != 404:
                raise
        try:
            ip = str(api.network.kubernetes_service_ip)
            await api.create(admin, kind, NAMESPACE, service_object(self.api_server.port, ip))
        except errors.ApiError as exc:
            if exc.code != 409:
                raise

    async def reconcile_once(self) -> bool:
        """One round (module doc); True if it wrote the Endpoints. Raises `ApiError`."""
        api, admin, kind = self.api_server.api, self.api_server.admin, self._kind("endpoints")
        stored: Obj | None
        try:
            stored = await api.get(admin, kind, NAMESPACE, NAME, rv="0")
        except errors.ApiError as exc:
            if exc.code != 404:
                raise
            stored = None
        servers = desired_servers(
            published_servers(stored),
            self.node_id,
            self.url,
            self.members(),
            leader=self.leading(),
        )
        if stored is None and not servers:
            return False  # not a member yet: nothing to publish
        await self._ensure_service()
        wanted = endpoints_object(servers)
        if _same(stored, wanted):
            return False
        if stored is None:
            await api.create(admin, kind, NAMESPACE, wanted)
        else:
            meta = stored.get("metadata") or {}
            labels = meta.get("labels")
            wanted["metadata"]["resourceVersion"] = meta.get("resourceVersion")
            if labels:
                wanted["metadata"]["labels"] = labels
            await api.update(admin, kind, NAMESPACE, NAME, wanted)
        log.info("default/kubernetes endpoints: %s", ", ".join(servers.values()) or "none")
        return True

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Rounds until cancelled; `started` at once (the API never waits for this)."""
        task_status.started()
        delay = RETRY_INITIAL
        while True:
            try:
                await self.reconcile_once()
            except errors.ApiError as exc:
                # 409: another server wrote first (routine); 503: no quorum; 404: no namespace yet
                level = logging.DEBUG if exc.code == 409 else logging.INFO
                log.log(level, "default/kubernetes endpoints not updated: %s; retrying", exc)
                await trio.sleep(delay)
                delay = min(delay * 2, self.interval)
                continue
            delay = RETRY_INITIAL
            await trio.sleep(self.interval)
