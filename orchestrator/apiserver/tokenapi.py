"""The orchestrator's own HTTP endpoints beside the Kubernetes API: the CA, join tokens, joining.

All under `/orchestrator/v1/`, JSON in and out (failures are metav1.Status like the rest):

    GET    /orchestrator/v1/ca            anonymous: the cluster CA certificate (PEM). Public
                                          information; a joining device fetches it without
                                          trusting it and checks it against its token's pin
    GET    /orchestrator/v1/tokens        admin: {"items": [{id, user, groups, expires,
                                          ttlSeconds, description, bootstrap}]} (no secrets)
    POST   /orchestrator/v1/tokens        admin: {ttlSeconds (0 = never; default 24 h),
                                          description, groups} -> 201 {id, token (K10 form,
                                          pinning the CA), expires, groups, description}
    DELETE /orchestrator/v1/tokens/<id>   admin: revoke a bootstrap token id, or every token of
                                          user <id> (e.g. system:node:edge-1); 404 if none
    POST   /orchestrator/v1/join          bootstrappers (and admins): {nodeName} -> 201
                                          {nodeName, user, token}: a node token for
                                          system:node:<nodeName>; with {servingKey (an EC
                                          P-256 public key or CSR, PEM), addresses} also
                                          servingCertificate: the agent's log endpoint
                                          certificate (CA-signed, 1 year, SANs = nodeName +
                                          addresses)
    POST   /orchestrator/v1/node-certificate  a node (system:node:<name>), for its own name:
                                          {servingKey, addresses} -> 201 {nodeName,
                                          servingCertificate}: renewal of the above
    GET    /orchestrator/v1/members       holders of the cluster token (and admins):
                                          {"items": [{id, clientAddress, voter, leader}]}:
                                          the Raft members' store client addresses, what a
                                          server joining with `--server URL` joins through
                                          (`members`, `orchestrator.cluster.join`)
    GET    /orchestrator/v1/bundle        the same callers: the cluster's sealed credentials
                                          bundle (`auth.shared`, encrypted with the cluster
                                          token) as application/octet-stream: a server
                                          joining with `--server URL` adopts the CA from it
                                          before its peer port can talk (404: none yet)

Why HTTP endpoints rather than the store's client port: the CLI then needs only the admin
kubeconfig (the same credentials as `orchestrator get`), every call is authenticated and
authorized by the API server's usual layers (`authz` role table: admin has every path, the
bootstrapper role `post /orchestrator/v1/join`), and agents, which only ever talk HTTPS to
the API server, join the same way.

Members: the cluster token is no API credential (no user holds it), so this endpoint checks
it itself, as the store's client port does for its `join` op: `Authorization: Bearer <cluster
token>`, compared in constant time. Any other bearer token or client certificate goes through
the usual authentication and authorization (admins may; anyone else is a 403, an unknown token
a 401).

Join: the bearer token is confirmed by a linearizable read of its own store key (not the
authentication cache), so a token revoked through any server is refused at once. The node name
must be free, or already joined by the same identity (a re-join after the agent lost its data
rotates its token): a node token owned by another identity, or a Node object that did not join
this way (a server's embedded agent), is a 409 Conflict. The node token is written with
compare-and-swap on what was checked, so two concurrent joins cannot both win.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from collections.abc import Awaitable, Callable
from typing import Any

from orchestrator.apiserver.app import Response
from orchestrator.kube import errors
from orchestrator.kube.schema.names import is_dns1123_subdomain
from orchestrator.security.authn import User, authenticated_user, bearer_token
from orchestrator.security.authz import Attributes, authorize, node_name
from orchestrator.security.clustertokens import USER_PREFIX, ClusterTokens, describe
from orchestrator.security.jointoken import format_token
from orchestrator.security.pki import MAX_SANS, Pki, sign_serving_key
from orchestrator.security.tokens import BOOTSTRAP_TTL, MASTERS, NODE_PREFIX
from orchestrator.store import types as st

PREFIX = "/orchestrator/v1/"
CA_PATH = PREFIX + "ca"
TOKENS_PATH = PREFIX + "tokens"
JOIN_PATH = PREFIX + "join"
NODE_CERT_PATH = PREFIX + "node-certificate"
MEMBERS_PATH = PREFIX + "members"
BUNDLE_PATH = PREFIX + "bundle"
MAX_DESCRIPTION = 256

Headers = list[tuple[bytes, bytes]]


def _body(raw: bytes) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise errors.bad_request(f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise errors.bad_request("the request body must be a JSON object")
    return doc


class OrchestratorRoutes:
    """The `/orchestrator/v1/` endpoints of one API server (module doc)."""

    prefix = PREFIX

    def __init__(
        self,
        tokens: ClusterTokens,
        ca_pem: bytes,
        ca_pin: str,
        node_exists: Callable[[str], Awaitable[bool]],
        pki: Pki | None = None,
        *,
        cluster_token: str = "",
        members: Callable[[], Awaitable[list[dict[str, Any]]]] | None = None,
        bundle: Callable[[], Awaitable[bytes | None]] | None = None,
    ) -> None:
        self.bundle = bundle  # the sealed bundle as stored (`auth.shared.KEY`), for joiners
        self.tokens = tokens
        self.cluster_token = cluster_token  # what a joining server proves (members)
        self.members = members  # the Raft members' client addresses (`members.MemberDirectory`)
        self.pki = pki  # holds the CA key: signs joined agents' serving certificates
        self.ca_pem = ca_pem
        self.ca_pin = ca_pin  # hex SHA-256 of the CA (DER)
        self.node_exists = node_exists

    async def handle(
        self,
        method: str,
        path: str,
        headers: Headers,
        authenticate: Callable[[], User],
        body: bytes,
    ) -> Response:
        path = path.rstrip("/")
        try:
            if path == CA_PATH and method == "GET":
                return Response(200, self.ca_pem, content_type="application/x-pem-file")
            if path == JOIN_PATH and method == "POST":
                user = await self._join_user(headers, authenticate)
                authorize(user, Attributes("post", path=path))
                return await self._join(user, _body(body))
            if path == MEMBERS_PATH and method == "GET":
                self._authorize_server(headers, authenticate, path)
                if self.members is None:
                    raise errors.service_unavailable("this server does not list its members")
                members = await self.members()
                return Response(200, {"kind": "MemberList", "apiVersion": "v1", "items": members})
            if path == BUNDLE_PATH and method == "GET":
                self._authorize_server(headers, authenticate, path)
                sealed = None if self.bundle is None else await self.bundle()
                if sealed is None:
                    raise errors.ApiError(404, "NotFound", "no cluster bundle has been published")
                return Response(200, sealed, content_type="application/octet-stream")
            user = authenticate()
            authorize(user, Attributes(method.lower(), path=path))
            if path == NODE_CERT_PATH and method == "POST":
                return self._node_certificate(user, _body(body))
            if path == TOKENS_PATH and method == "GET":
                items = await self.tokens.list_entries()
                now = self.tokens.clock()
                rows = [describe(e, now) for e in sorted(items, key=lambda e: e.name)]
                return Response(200, {"kind": "TokenList", "apiVersion": "v1", "items": rows})
            if path == TOKENS_PATH and method == "POST":
                return await self._create(_body(body))
            if path.startswith(TOKENS_PATH + "/") and method == "DELETE":
                token_id = path[len(TOKENS_PATH) + 1 :]
                if not await self.tokens.revoke(token_id):
                    raise errors.ApiError(404, "NotFound", f'token "{token_id}" not found')
                return Response(200, {"kind": "Status", "status": "Success", "id": token_id})
        except (st.NoQuorum, st.Unavailable) as exc:
            raise errors.service_unavailable(str(exc)) from exc
        raise errors.route_not_found()

    async def _join_user(self, headers: Headers, authenticate: Callable[[], User]) -> User:
        token = bearer_token(headers)
        if token is None:
            return authenticate()  # a client certificate (an admin's)
        entry = await self.tokens.verify(token)
        if entry is None:
            raise errors.unauthorized("the join token is wrong, expired or revoked")
        return authenticated_user(entry.name, entry.groups)

    def _authorize_server(
        self, headers: Headers, authenticate: Callable[[], User], path: str
    ) -> None:
        """The cluster token as a bearer token (module doc), else an authorized user."""
        token = bearer_token(headers)
        if (
            token is not None
            and self.cluster_token
            and hmac.compare_digest(token.encode(), self.cluster_token.encode())
        ):
            return
        try:
            user = authenticate()
        except errors.ApiError as exc:
            if exc.code != 401:
                raise
            raise errors.unauthorized(
                "wrong cluster token: a joining server needs this cluster's token (the "
                "K10... token in a server's DATA_DIR/server-token)"
            ) from None
        authorize(user, Attributes("get", path=path))

    async def _create(self, body: dict[str, Any]) -> Response:
        ttl = body.get("ttlSeconds", BOOTSTRAP_TTL)
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or ttl < 0:
            raise errors.bad_request("ttlSeconds must be a number >= 0 (0: never expires)")
        description = body.get("description") or ""
        if not isinstance(description, str) or len(description) > MAX_DESCRIPTION:
            raise errors.bad_request(f"description must be a string of <= {MAX_DESCRIPTION}")
        groups = body.get("groups") or []
        if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
            raise errors.bad_request("groups must be a list of strings")
        try:
            token_id, token = await self.tokens.create_bootstrap_token(
                float(ttl) or None, description=description, groups=groups
            )
        except ValueError as exc:
            raise errors.bad_request(str(exc)) from exc
        entry = next(e for e in self.tokens.entries() if e.bootstrap_id == token_id)
        return Response(
            201,
            {
                "kind": "Token",
                "apiVersion": "v1",
                "id": token_id,
                "token": format_token(self.ca_pin, token),
                "expires": entry.expires,
                "groups": list(entry.groups),
                "description": description,
            },
        )

    async def _join(self, user: User, body: dict[str, Any]) -> Response:
        name = body.get("nodeName")
        if not isinstance(name, str) or not name:
            raise errors.bad_request("nodeName is required")
        problems = is_dns1123_subdomain(name)
        if problems:
            raise errors.bad_request(f"nodeName {name!r}: {'; '.join(problems)}")
        key = USER_PREFIX + NODE_PREFIX + name
        entry, revision = await self.tokens.entry_kv(key)
        taken = errors.ApiError(
            409, "AlreadyExists", f'node name "{name}" is taken by another identity'
        )
        if entry is not None and entry.owner != user.name and MASTERS not in user.groups:
            raise taken
        if entry is None and MASTERS not in user.groups and await self.node_exists(name):
            raise taken
        try:
            token = await self.tokens.add_node(
                name, owner=user.name, expected_mod_revision=revision
            )
        except (st.Conflict, st.KeyExists):
            raise errors.ApiError(
                409, "Conflict", f'node "{name}" joined concurrently; retry'
            ) from None
        doc: dict[str, Any] = {
            "kind": "NodeCredentials",
            "apiVersion": "v1",
            "nodeName": name,
            "user": NODE_PREFIX + name,
            "token": token,
        }
        cert = self._serving_certificate(name, body)
        if cert is not None:
            doc["servingCertificate"] = cert
        return Response(201, doc)

    def _node_certificate(self, user: User, body: dict[str, Any]) -> Response:
        """A new serving certificate for the calling node, for its own name only."""
        name = node_name(user)
        if name is None:
            raise errors.ApiError(
                403,
                "Forbidden",
                f'User "{user.name}" is not a node: only nodes get serving certificates',
            )
        if not body.get("servingKey"):
            raise errors.bad_request("servingKey is required")
        cert = self._serving_certificate(name, body)
        return Response(
            201,
            {
                "kind": "NodeCertificate",
                "apiVersion": "v1",
                "nodeName": name,
                "servingCertificate": cert,
            },
        )

    def _serving_certificate(self, name: str, body: dict[str, Any]) -> str | None:
        """The CA-signed serving certificate (PEM) for `body["servingKey"]`, SANs = `name` and
        `body["addresses"]` (IPs or DNS names); None when no key was sent."""
        key = body.get("servingKey")
        if key is None:
            return None
        if not isinstance(key, str) or not key:
            raise errors.bad_request("servingKey must be a PEM public key or CSR")
        addresses = body.get("addresses") or []
        if (
            not isinstance(addresses, list)
            or len(addresses) >= MAX_SANS
            or not all(isinstance(a, str) and _valid_san(a) for a in addresses)
        ):
            raise errors.bad_request(
                f"addresses must be a list of < {MAX_SANS} IP addresses or DNS names"
            )
        if self.pki is None:
            raise errors.service_unavailable("this server cannot sign certificates")
        try:
            pem = sign_serving_key(self.pki, NODE_PREFIX + name, key.encode(), [name, *addresses])
        except ValueError as exc:
            raise errors.bad_request(f"servingKey: {exc}") from exc
        return pem.decode("ascii")


def _valid_san(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return not is_dns1123_subdomain(text)
    return True
