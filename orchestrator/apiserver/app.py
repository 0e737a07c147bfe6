"""The ASGI application: HTTP in, `Api` calls, JSON (or Tables, or watch streams) out.

Order per request: probes and /version (anonymous) -> the orchestrator's own endpoints
(`extra`: /orchestrator/v1/, see `tokenapi`; they authenticate themselves) -> authentication
(401) -> discovery and OpenAPI (any authenticated user) -> resource requests
(`request.parse_path`) dispatched on verb and subresource to `Api`. This is the edge where a
query string becomes typed options (`options.ListOptions`, `WatchOptions`, `WriteOptions`),
once; the verbs never see it. Bodies are read with a hard limit (3 MiB, 413 beyond) and
decoded by `codec` (JSON, YAML, Kubernetes protobuf; malformed input is a 400 Status). A body
of a create, update or patch needs a Content-Type this server reads (415 otherwise, listing
the accepted media types); a body without one is read as JSON, as the apiserver does
(kubectl's scale client sends none), and is a 415 if it is not JSON (a patch without one is
always a 415). A method no route defines is a 405; a URL over `MAX_URL` bytes a 414 and
request headers over `MAX_HEADERS` bytes a 431 (hypercorn's own limit is set above both, see
`security.tls`, so the app answers with a Status).

Invariants: every response is JSON with a Content-Type; every failure is a metav1.Status
(`errors.ApiError`); no exception escapes to hypercorn — an unexpected one is logged and answered
with a 500 Status so the process keeps serving. A watch streams one compact JSON object per
line, flushed per event, and stops when the client goes away, the timeout passes, the store
ends the watch or the server drains (`draining` set: clients re-watch elsewhere, and /readyz
fails from then on).

Every request is counted in `apiserver_request_total{verb,resource,code}` and timed in
`apiserver_request_duration_seconds{verb,resource}` (streams until their response starts);
open HTTP watches are `apiserver_registered_watchers{resource}` (see `observability`). The
overload gate (`flowcontrol`) takes resource requests once read: 429s carry Retry-After.
"""

from __future__ import annotations

import contextlib
import logging
import random
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any, Protocol

import trio

from orchestrator.apiserver import discovery, tables
from orchestrator.apiserver.codec import (
    ACCEPTED_BODY_TYPES,
    BODY_TYPES,
    PROTOBUF,
    decode_body,
    dumps,
    media_type,
)
from orchestrator.apiserver.handler import Call
from orchestrator.apiserver.options import ListOptions, WatchOptions, WriteOptions
from orchestrator.apiserver.request import Query, RequestInfo, parse_path
from orchestrator.apiserver.resources import Api
from orchestrator.apiserver.slices import TimeSlice, encode_json
from orchestrator.apiserver.watch import open_watch
from orchestrator.kube import errors
from orchestrator.kube.errors import ApiError
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.kind import Kind
from orchestrator.metrics import REGISTRY, Registry
from orchestrator.observability import API_WATCHERS, ApiRequestMetrics, api_verb
from orchestrator.security.authn import User

# The OpenAPI documents and the protobuf codec are imported by the first request that needs
# them (the documents are built then, and cached): an idle server does not hold them.
if TYPE_CHECKING:
    from orchestrator.kube.schema.openapi_v2 import SwaggerCache

log = logging.getLogger(__name__)

MAX_BODY = 3 * 1024 * 1024
# Go's net/http allows 1 MiB of request head in all; the app refuses well below hypercorn's
# limit (`security.tls.MAX_REQUEST_HEAD`) so that the refusal is a Status it writes itself.
MAX_URL = 64 * 1024
MAX_HEADERS = 256 * 1024
# Methods some route defines; anything else is a 405 wherever it is sent.
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
ANONYMOUS_PATHS = ("/healthz", "/livez", "/readyz", "/version")
_METRIC_LABELS = "orchestrator.metric_labels"  # scope key: (verb, resource) of a resource request
# The apiserver ends watches after a random 30-60 min (min-request-timeout 1800 s) so load
# spreads after restarts; clients re-watch from their last resourceVersion.
WATCH_TIMEOUT = 1800.0

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class Authenticator(Protocol):
    def authenticate(
        self, headers: list[tuple[bytes, bytes]], client_cert_der: bytes | None
    ) -> User | None: ...


class ExtraRoutes(Protocol):
    """Endpoints outside the Kubernetes API under `prefix` (`tokenapi`); they authenticate
    and authorize themselves (some are anonymous)."""

    prefix: str

    async def handle(
        self,
        method: str,
        path: str,
        headers: list[tuple[bytes, bytes]],
        authenticate: Callable[[], User],
        body: bytes,
    ) -> Response: ...


class LogSource(Protocol):
    """Where container logs come from (the node agent of the pod's node)."""

    async def open_logs(self, pod: Obj, container: str, query: Query) -> AsyncIterator[bytes]: ...


class Response:
    def __init__(
        self,
        status: int,
        body: Any = None,
        *,
        content_type: str = "application/json",
        warnings: list[str] | None = None,
        stream: AsyncIterator[bytes] | None = None,
        timeout: float | None = None,
        headers: dict[str, str] | None = None,
        pieces: list[bytes] | None = None,
    ) -> None:
        self.headers = headers or {}  # extra headers (a 429's Retry-After)
        self.pieces = pieces  # the body already encoded, in pieces (a list; never empty)
        self.status = status
        self.body = body
        self.content_type = content_type
        self.warnings = warnings or []
        self.stream = stream
        self.timeout = timeout


_CONTROL = re.compile("[\x00-\x1f\x7f]")


class ApiApp:
    def __init__(
        self,
        api: Api,
        authenticator: Authenticator | None,
        *,
        server_address: str = "127.0.0.1:6443",
        logs: LogSource | None = None,
        ready: Callable[[], bool] = lambda: True,
        rng: random.Random | None = None,
        extra: ExtraRoutes | None = None,
        draining: trio.Event | None = None,
    ) -> None:
        self.api = api
        self.draining = draining if draining is not None else trio.Event()  # see module doc
        self.extra = extra
        self.authenticator = authenticator
        self.server_address = server_address
        self.logs = logs
        self.ready = ready
        self.rng = rng or random.Random()
        self._openapi_cache: dict[str, tuple[int, Any]] = {}
        self._swagger: SwaggerCache | None = None  # the OpenAPI v2 document, on first request
        self._metrics = ApiRequestMetrics()

    # ------------------------------------------------------------------ ASGI
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        start = time.perf_counter()
        try:
            response = await self._handle(scope, receive)
        except ApiError as exc:
            response = Response(exc.code, exc.status(), headers=exc.headers)
        except Exception as exc:  # the process must keep serving; say what broke
            log.exception("unexpected error serving %s %s", scope.get("method"), scope.get("path"))
            response = Response(500, errors.internal(f"internal error: {exc!r}").status())
        if response.stream is not None:
            self._observe(scope, response.status, start)
        await self._send(response, scope, receive, send)
        if response.stream is None:
            self._observe(scope, response.status, start)

    def _observe(self, scope: Scope, code: int, start: float) -> None:
        labels = scope.get(_METRIC_LABELS)
        verb, resource = labels if labels is not None else (scope.get("method", "GET"), "")
        self._metrics.observe(verb, resource, code, time.perf_counter() - start)

    async def _send(self, response: Response, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", response.content_type.encode())]
        headers += [(b"warning", _warning_header(w)) for w in response.warnings[:50]]
        headers.append((b"cache-control", b"no-cache, private"))
        headers += [(k.lower().encode(), v.encode()) for k, v in response.headers.items()]
        if response.stream is None:
            pieces = (
                response.pieces
                if response.pieces is not None
                else [response.body]
                if isinstance(response.body, bytes)
                else await encode_json(response.body)  # a long list in slices
                if response.body is not None
                else [b""]
            )
            headers.append((b"content-length", str(sum(map(len, pieces))).encode()))
            await send(
                {"type": "http.response.start", "status": response.status, "headers": headers}
            )
            for piece in pieces[:-1]:
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            await send({"type": "http.response.body", "body": pieces[-1]})
            return
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        stream = response.stream
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_cancel_on_disconnect, receive, nursery.cancel_scope)
                nursery.start_soon(_cancel_when_set, self.draining, nursery.cancel_scope)
                with trio.move_on_after(response.timeout or WATCH_TIMEOUT):
                    async for chunk in stream:
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                nursery.cancel_scope.cancel()
        except ApiError as exc:  # e.g. the store became unavailable mid-stream
            log.info("stream ended: %s", exc)
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                with trio.CancelScope(shield=True):
                    await aclose()
        # The client may already be gone; then there is nobody to tell.
        with trio.move_on_after(5), contextlib.suppress(Exception):
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    # ------------------------------------------------------------------ routing
    async def _handle(self, scope: Scope, receive: Receive) -> Response:
        path: str = scope.get("path", "/")
        method: str = scope.get("method", "GET").upper()
        headers: list[tuple[bytes, bytes]] = list(scope.get("headers") or [])
        raw_path: bytes = scope.get("raw_path") or path.encode("utf-8", "replace")
        if len(raw_path) + len(scope.get("query_string", b"")) > MAX_URL:
            raise ApiError(414, "RequestURITooLong", f"the request URL is over {MAX_URL} bytes")
        if sum(len(k) + len(v) + 4 for k, v in headers) > MAX_HEADERS:
            raise ApiError(
                431,
                "RequestHeaderFieldsTooLarge",
                f"the request headers are over {MAX_HEADERS} bytes",
            )
        if method not in KNOWN_METHODS:
            raise errors.method_not_allowed(f"method {method} is not supported")
        hdr = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in headers}
        query = Query(scope.get("query_string", b""))
        probe = path in ANONYMOUS_PATHS or path.startswith(("/healthz/", "/livez/", "/readyz/"))
        if probe and method not in ("GET", "HEAD"):
            raise errors.method_not_allowed(f"method {method} is not allowed on {path}")
        if path in ("/healthz", "/livez") or path.startswith(("/healthz/", "/livez/")):
            return Response(200, b"ok", content_type="text/plain")
        if path == "/readyz" or path.startswith("/readyz/"):
            if self.draining.is_set():
                return Response(
                    500,
                    b"[-]shutdown failed: the server is shutting down\nreadyz check failed",
                    content_type="text/plain",
                )
            if self.ready():
                return Response(200, b"ok", content_type="text/plain")
            return Response(
                500, b"[-]store failed: no leader\nreadyz check failed", content_type="text/plain"
            )
        if path == "/version":
            return Response(200, discovery.VERSION)
        if self.extra is not None and path.startswith(self.extra.prefix):
            body = await _read_body(receive, hdr)
            return await self.extra.handle(
                method, path, headers, lambda: self._authenticate(scope, headers), body
            )
        user = self._authenticate(scope, headers)
        if method == "GET" and path == "/metrics":  # any authenticated user, like discovery
            return Response(200, REGISTRY.render().encode(), content_type=Registry.CONTENT_TYPE)
        if method == "GET" and path.rstrip("/") in ("/openapi/v2", "/swagger-2.0.0.pb-v1"):
            # kubectl < 1.29 unmarshals the body as protobuf whatever it asked for (the legacy
            # path is only asked for protobuf); like kube-openapi, the type is octet-stream, as
            # Go's mime parser rejects the `@` of the protobuf media type.
            from orchestrator.kube.schema.openapi_v2 import SwaggerCache, wants_protobuf

            if self._swagger is None:
                self._swagger = SwaggerCache()
            if path.startswith("/swagger") or wants_protobuf(hdr.get("accept", "")):
                pb = self._swagger.protobuf(self.api.registry)
                return Response(200, pb, content_type="application/octet-stream")
            return Response(200, self._swagger.json(self.api.registry))
        if method == "GET":
            doc = self._discovery(path)
            if doc is not None:
                return Response(200, doc)
        info = parse_path(method, path, query)
        if info is None:
            raise errors.route_not_found()
        scope[_METRIC_LABELS] = (
            api_verb(info.verb, hdr.get("content-type", "")),
            f"{info.resource}/{info.subresource}" if info.subresource else info.resource,
        )
        body = await _read_body(receive, hdr)
        call = Call(user, WriteOptions.parse(query, hdr.get("user-agent", "")))
        # A seat (flowcontrol) while it runs; a stream's ends when the stream starts.
        async with self.api.flowcontrol.seat(user, info.group, info.resource, info.namespace):
            response = await self._resource(call, info, query, hdr, body)
        response.warnings = call.warnings + response.warnings
        return response

    def _authenticate(self, scope: Scope, headers: list[tuple[bytes, bytes]]) -> User:
        if self.authenticator is None:
            return User("system:admin", ("system:masters", "system:authenticated"))
        tls = (scope.get("extensions") or {}).get("tls") or {}
        user = self.authenticator.authenticate(headers, tls.get("client_cert_der"))
        if user is None:
            raise errors.unauthorized()
        return user

    def _openapi_v3(self, path: str) -> Obj:
        """`/openapi/v3` (the index), `/openapi/v3/api/v1`, `/openapi/v3/apis/<group>/<version>`."""
        from orchestrator.kube.schema.openapi import (  # see the imports above
            openapi_document,
            openapi_index,
        )

        registry = self.api.registry
        if path == "/openapi/v3":
            return openapi_index(registry)
        rest = path[len("/openapi/v3/") :].split("/")
        if rest[0] == "api" and len(rest) == 2:
            doc = openapi_document(registry, "", rest[1])
        elif rest[0] == "apis" and len(rest) == 3:
            doc = openapi_document(registry, rest[1], rest[2])
        else:
            doc = None
        if doc is None:
            raise errors.route_not_found()
        return doc

    def _discovery(self, path: str) -> Obj | None:
        path = path.rstrip("/") or "/"
        registry = self.api.registry
        if path == "/api":
            return discovery.api_versions(self.server_address)
        if path == "/apis":
            return discovery.api_group_list(registry)
        if path == "/openapi/v3" or path.startswith("/openapi/v3/"):
            return self._openapi_v3(path)
        parts = path.strip("/").split("/")
        if parts[0] == "api" and len(parts) == 2:
            return discovery.api_resource_list(registry, "", parts[1]) or _raise_404()
        if parts[0] == "apis" and len(parts) == 2:
            return discovery.api_group(registry, parts[1]) or _raise_404()
        if parts[0] == "apis" and len(parts) == 3:
            return discovery.api_resource_list(registry, parts[1], parts[2]) or _raise_404()
        return None

    async def _resource(
        self, call: Call, info: RequestInfo, query: Query, hdr: dict[str, str], raw: bytes
    ) -> Response:
        api = self.api
        kind = api.kind(info.group, info.version, info.resource)
        sub = info.subresource
        if sub and sub not in kind.subresources:
            raise errors.route_not_found()
        ns, name, verb = info.namespace, info.name, info.verb
        given_type = hdr.get("content-type", "").strip()
        if raw and verb in ("create", "update", "patch"):
            # A body must be of a type this server reads (kube-apiserver's
            # NegotiateInputSerializer); a patch's type is checked by `Api.patch`. Without a
            # Content-Type, a patch is a 415 and another body is read as JSON, as the
            # apiserver does (kubectl's scale client sends none): if it is not JSON, a 415.
            if not given_type:
                if verb == "patch":
                    raise errors.unsupported_media_type("")
                try:
                    decode_body(raw, "application/json")
                except ApiError:
                    raise errors.unsupported_media_type("", ACCEPTED_BODY_TYPES) from None
            elif verb != "patch" and media_type(given_type) not in BODY_TYPES:
                raise errors.unsupported_media_type(media_type(given_type), ACCEPTED_BODY_TYPES)
        content_type = (given_type or "application/json").split(";")[0].strip()
        accept = hdr.get("accept", "")
        as_table = tables.wants_table(accept)
        if verb == "get":
            if sub == "scale":
                return Response(200, await api.get_scale(call, kind, ns, name))
            if sub == "log":
                return await self._logs(call, kind, ns, name, query)
            obj = await api.get(call, kind, ns, name, rv=query.get("resourceVersion"))
            if as_table:
                return Response(
                    200, self._table(kind, [obj], query, obj["metadata"]["resourceVersion"])
                )
            return Response(200, obj)
        if verb == "list":
            opts = ListOptions.parse(query)
            # Encoded as the objects are read: a long list is held as bytes, not objects.
            if as_table:
                include = query.get("includeObject")
                pieces = await api.list_table_json(call, kind, ns, opts, include)
                return Response(200, pieces=pieces)
            return Response(200, pieces=await api.list_json(call, kind, ns, opts))
        if verb == "watch":
            watch_opts = WatchOptions.parse(query)
            events = await open_watch(api, call, kind, ns, watch_opts, name=name)
            timeout = watch_opts.timeout_seconds
            return Response(
                200,
                stream=self._watch_lines(kind, events, query, as_table),
                timeout=float(timeout)
                if timeout and timeout > 0
                else WATCH_TIMEOUT * (1 + self.rng.random()),
            )
        if verb == "patch" and content_type.lower() == PROTOBUF:
            raise errors.unsupported_media_type(content_type)  # no protobuf patch type exists
        body = decode_body(raw, content_type)
        if verb == "create":
            if sub == "binding":
                return Response(201, await api.bind(call, kind, ns, name, body))
            if sub or name:
                raise errors.method_not_allowed()
            return Response(201, await api.create(call, kind, ns, body))
        if verb == "update":
            if sub == "scale":
                return Response(200, await api.write_scale(call, kind, ns, name, body, None))
            if sub not in ("", "status"):
                raise errors.method_not_allowed()
            obj, created = await api.update(call, kind, ns, name, body, sub)
            return Response(201 if created else 200, obj)
        if verb == "patch":
            if body is None:
                raise errors.bad_request("the patch body is empty")
            if sub == "scale":
                return Response(
                    200, await api.write_scale(call, kind, ns, name, body, content_type)
                )
            if sub not in ("", "status"):
                raise errors.method_not_allowed()
            obj, created = await api.patch(call, kind, ns, name, content_type, body, sub)
            return Response(201 if created else 200, obj)
        options = _delete_options_from_query(body, query)
        if verb == "delete":
            if sub:
                raise errors.method_not_allowed()
            obj, code = await api.delete(call, kind, ns, name, options)
            return Response(code, obj)
        if verb == "deletecollection":
            opts = ListOptions.parse(query)
            return Response(200, await api.delete_collection(call, kind, ns, opts, options))
        raise errors.method_not_allowed()

    def _table(
        self,
        kind: Kind,
        objs: list[Obj],
        query: Query,
        resource_version: str,
        continue_token: str | None = None,
    ) -> Obj:
        return tables.table(
            kind,
            objs,
            self.api.clock(),
            resource_version=resource_version,
            continue_token=continue_token,
            include=tables.include_object(query.get("includeObject")),
        )

    async def _watch_lines(
        self, kind: Kind, events: AsyncIterator[list[Obj]], query: Query, as_table: bool
    ) -> AsyncIterator[bytes]:
        include = tables.include_object(query.get("includeObject"))
        first = True
        watchers = API_WATCHERS.labels(kind.plural)
        watchers.inc()
        timeslice = TimeSlice()  # a batch may be a long initial state or catch-up
        try:
            async for batch in events:
                lines = []
                for ev in batch:
                    await timeslice.pause()
                    if as_table and ev["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        obj = ev["object"]
                        ev = {
                            "type": ev["type"],
                            "object": tables.table(
                                kind,
                                [obj],
                                self.api.clock(),
                                resource_version=obj["metadata"].get("resourceVersion", ""),
                                include=include,
                                with_columns=first,
                            ),
                        }
                        first = False
                    lines.append(dumps(ev) + b"\n")
                yield b"".join(lines)  # one write for the batch
        finally:
            watchers.dec()
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                with trio.CancelScope(shield=True):
                    await aclose()

    async def _logs(self, call: Call, kind: Kind, ns: str, name: str, query: Query) -> Response:
        pod = await self.api.get(call, kind, ns, name)
        self.api.authorize(call, "get", kind, ns, name, "log")
        containers = [
            c.get("name")
            for c in ((pod.get("spec") or {}).get("containers") or [])
            + ((pod.get("spec") or {}).get("initContainers") or [])
            if isinstance(c, dict)
        ]
        container = query.get("container")
        if not container:
            regular = [
                c.get("name")
                for c in ((pod.get("spec") or {}).get("containers") or [])
                if isinstance(c, dict)
            ]
            if len(regular) != 1:
                raise errors.bad_request(
                    f"a container name must be specified for pod {name}, choose one of: "
                    f"[{' '.join(str(c) for c in regular)}]"
                )
            container = str(regular[0])
        if container not in containers:
            raise errors.bad_request(f"container {container} is not valid for pod {name}")
        if self.logs is None or not (pod.get("spec") or {}).get("nodeName"):
            raise errors.bad_request(
                f'container "{container}" in pod "{name}" is waiting to start: ContainerCreating'
            )
        stream = await self.logs.open_logs(pod, container, query)
        return Response(
            200,
            content_type="text/plain",
            stream=stream,
            timeout=None if query.flag("follow") else 300.0,
        )


def _warning_header(text: str) -> bytes:
    """A `Warning: 299 - "..."` value: one line, UTF-8 (an encode never fails: a warning may
    quote what the client sent)."""
    one_line = _CONTROL.sub(" ", text)  # h11 refuses control characters in a header
    return f'299 - "{one_line}"'.encode("utf-8", "replace")


def _raise_404() -> Obj:
    raise errors.route_not_found()


def _delete_options_from_query(body: Any, query: Query) -> Any:
    options = dict(body) if isinstance(body, dict) else body
    if options is None:
        options = {}
    if isinstance(options, dict):
        for key in ("propagationPolicy",):
            if query.get(key):
                options.setdefault(key, query.get(key))
        grace = query.number("gracePeriodSeconds")
        if grace is not None:
            options.setdefault("gracePeriodSeconds", grace)
        if query.flag("orphanDependents"):
            options.setdefault("orphanDependents", True)
    return options


async def _read_body(receive: Receive, hdr: dict[str, str]) -> bytes:
    length = hdr.get("content-length")
    if length and length.isdigit() and int(length) > MAX_BODY:
        raise errors.too_large(f"the request body is larger than {MAX_BODY} bytes")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise errors.too_large(f"the request body is larger than {MAX_BODY} bytes")
        chunks.append(chunk)
        if not message.get("more_body"):
            break
    return b"".join(chunks)


async def _cancel_on_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


async def _cancel_when_set(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
