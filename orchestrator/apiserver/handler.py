"""What every verb shares: the `Handler` (kind lookup, authorization, namespace checks,
admission, presentation, CRD bookkeeping) and the `Call` (who asks, with which write options).

The verbs live one family per module, as kube-apiserver's handlers: `get` (get, list),
`create`, `update` (update, and the compare-and-swap loop every write of an existing object
uses), `patch` (the patch types, server-side apply), `delete` (delete, deletecollection),
`scale` and `binding` (subresources), `watch`. Each is a function of the `Handler`;
`resources.Api` is the facade that names them all.

Admission, in order: schema validation (pruning unknown fields, defaults; strict validation
per `fieldValidation`), the kind's defaults, metadata checks (names: DNS-1123 labels for
namespaces and services, subdomains otherwise), the kind's own checks, NodeRestriction.
Invariants: admission never modifies its input (validation builds the object to store anew);
`present` never modifies its input either (the object may be shared with read-only watchers).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.apiserver.allockeys import SERVICES
from orchestrator.apiserver.flowcontrol import FlowControl
from orchestrator.apiserver.options import WriteOptions
from orchestrator.apiserver.services import ServiceAddresses
from orchestrator.apiserver.storage import ObjectStore
from orchestrator.kube import errors
from orchestrator.kube.errors import ApiError, Cause
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.columns import now_rfc3339
from orchestrator.kube.schema.kind import Kind, Registry
from orchestrator.kube.schema.names import NameRule, validate_metadata
from orchestrator.kube.schema.validation import strict_error, validate
from orchestrator.network.settings import NetworkSettings
from orchestrator.security.authn import User
from orchestrator.security.authz import admit_node, authorize_resource, may_write_status

MAX_UPDATE_ATTEMPTS = 16
# Kinds whose names are DNS-1123 labels rather than subdomains.
_LABEL_NAMED = {("", "namespaces"), ("", "services")}
_KEEP_SPEC = ("spec",)
# (group, plural) of the kinds some verb treats specially.
CRD = ("apiextensions.k8s.io", "customresourcedefinitions")
PODS = ("", "pods")
NAMESPACES = ("", "namespaces")


@dataclass
class Call:
    """Who is asking, with which write options; collects the warnings to return.

    `read_only`: the caller (in-process) never modifies the object a write returns, so the
    object may be the one the read-only watches are handed for that write (see
    `ObjectStore.create`'s `share`), which then need not decode it."""

    user: User
    opts: WriteOptions = field(default_factory=lambda: WriteOptions(False, "unknown", "Warn"))
    warnings: list[str] = field(default_factory=list)
    read_only: bool = False


def revision_of(obj: Obj) -> int:
    """The resourceVersion of a stored object (always set, always an integer)."""
    return int(obj["metadata"]["resourceVersion"])


def client_rv(obj: Obj) -> int | None:
    """The resourceVersion a client named in a body (a precondition), if any (400 if bad)."""
    text = (obj.get("metadata") or {}).get("resourceVersion")
    if text in (None, ""):
        return None
    try:
        value = int(str(text))
    except ValueError:
        raise errors.bad_request(f"invalid resourceVersion {text!r}: must be an integer") from None
    if value < 0:
        raise errors.bad_request(f"invalid resourceVersion {text!r}")
    return value


class Handler:
    """The API server's state every verb reads (the objects, the kinds, the clock and the
    random source for generated names) and the checks every verb applies."""

    def __init__(
        self,
        objects: ObjectStore,
        registry: Registry,
        *,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        on_crd_change: Callable[[Obj, bool], None] | None = None,
        flowcontrol: FlowControl | None = None,
        network: NetworkSettings | None = None,
    ) -> None:
        self.objects = objects
        # The overload gate the HTTP app and the in-process clients take a seat from per
        # request (`flowcontrol`); the verbs themselves never see it.
        self.flowcontrol = flowcontrol if flowcontrol is not None else FlowControl()
        self.registry = registry
        self.clock = clock
        self.rng = rng or random.Random()
        self._on_crd_change = on_crd_change
        # Services' ClusterIPs and NodePorts (`services`), from the cluster's address plan.
        self.network = network if network is not None else NetworkSettings.create()
        self.services = ServiceAddresses(self.network, self.rng)

    @staticmethod
    def allocates(kind: Kind) -> bool:
        """Whether objects of `kind` hold allocated values (Services: `services`)."""
        return (kind.group, kind.plural) == SERVICES

    def kind(self, group: str, version: str, plural: str) -> Kind:
        """The kind a URL names (404 when it names none)."""
        kind = self.registry.by_resource(group, version, plural)
        if kind is None:
            raise errors.route_not_found()
        return kind

    def now(self) -> str:
        """The handler's clock as an RFC 3339 timestamp (creation, deletion, managedFields)."""
        return now_rfc3339(self.clock())

    def authorize(
        self, call: Call, verb: str, kind: Kind, ns: str, name: str = "", sub: str = ""
    ) -> None:
        """403 unless `call.user` may do `verb` (writing a status needs its own right)."""
        authorize_resource(call.user, verb, kind.group, kind.plural, sub, ns, name)
        if sub == "status" and verb in ("update", "patch") and not may_write_status(call.user):
            raise errors.forbidden(
                call.user.name, verb, f"{kind.plural}/status", kind.group, ns, name
            )

    def check_namespace_arg(self, kind: Kind, ns: str) -> None:
        """A namespace for a namespaced kind (400), none for a cluster-scoped one (404)."""
        if kind.namespaced and not ns:
            raise errors.bad_request("a namespace must be given for namespaced resources")
        if not kind.namespaced and ns:
            raise errors.route_not_found()

    async def require_namespace(self, ns: str) -> None:
        """404 unless namespace `ns` exists, 403 while it is terminating (creates into it)."""
        ns_kind = self.registry.by_resource("", "v1", "namespaces")
        assert ns_kind is not None
        try:
            live = await self.objects.get_shared(ns_kind, "", ns, stale_ok=True)  # only read
        except ApiError as exc:
            if exc.code == 404:
                raise errors.not_found("namespaces", "", ns) from None
            raise
        if live["metadata"].get("deletionTimestamp"):
            raise ApiError(
                403,
                "Forbidden",
                f"unable to create new content in namespace {ns} because it is being terminated",
                {"name": ns, "kind": "namespaces"},
            )

    def admit(self, call: Call, verb: str, kind: Kind, obj: Obj, old: Obj | None, sub: str) -> Obj:
        """Schema validation (prune, defaults), kind defaults and checks, node restriction."""
        name = str((obj.get("metadata") or {}).get("name", ""))
        checked = validate(
            kind.schema,
            obj,
            strict=call.opts.field_validation == "Strict",
            # A built-in kind's schema is fixed, so what the stored object shares is valid.
            old=None if kind.custom else old,
            # A status write keeps the stored spec (`prepare_update`): shared, not copied. The
            # kind's defaulting below only fills what a stored spec already has.
            keep=_KEEP_SPEC if sub == "status" else (),
        )
        if checked.unknown:
            if call.opts.field_validation == "Strict":
                raise strict_error(checked.unknown)
            if call.opts.field_validation == "Warn":
                call.warnings.extend(f'unknown field "{p}"' for p in checked.unknown)
        if checked.causes:
            raise errors.invalid(kind.kind, kind.group, name, checked.causes)
        out: Obj = checked.obj
        if kind.default is not None:
            kind.default(out)
        rule: NameRule = "label" if (kind.group, kind.plural) in _LABEL_NAMED else "subdomain"
        causes: list[Cause] = validate_metadata(
            out["metadata"], namespaced=kind.namespaced, name_rule=rule
        )
        if kind.validate is not None:
            causes += kind.validate(out, old)
        if causes:
            raise errors.invalid(kind.kind, kind.group, name, causes)
        admit_node(call.user, verb, kind.kind, sub, out, old)
        return out

    def check_body_kind(self, kind: Kind, raw: Any, *, what: str = "") -> Obj:
        """`raw` as an object of `kind` (apiVersion and kind may be empty), with metadata."""
        if not isinstance(raw, dict):
            raise errors.bad_request("the request body must be a JSON object")
        body: Obj = raw
        api_version, kind_name = body.get("apiVersion"), body.get("kind")
        if (api_version or kind_name) and (api_version, kind_name) != (kind.api_version, kind.kind):
            raise errors.bad_request(
                f"the API version in the data ({api_version}) and kind ({kind_name}) do not match "
                f"the expected {kind.api_version} {kind.kind}{what}"
            )
        meta = body.get("metadata")
        if meta is None:
            body = {**body, "metadata": {}}
        elif not isinstance(meta, dict):
            raise errors.bad_request("metadata must be an object")
        return body

    def present(self, kind: Kind, obj: Obj) -> Obj:
        """`obj` as the client asked for it (a custom object in the URL's version)."""
        if kind.custom:  # one stored object serves every version of its CRD
            return {**obj, "apiVersion": kind.api_version}  # `obj` may be shared: not in place
        return obj

    def after_write(self, kind: Kind, obj: Obj, *, deleted: bool = False) -> None:
        """Keep the registry's custom kinds in step with a CRD this server just wrote."""
        if (kind.group, kind.plural) == CRD and self._on_crd_change is not None:
            self._on_crd_change(obj, deleted)
