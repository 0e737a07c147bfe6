"""The verbs on resources: get, list, create, update, patch, delete, deletecollection, and the
status, scale and binding subresources. Transport-free: the HTTP app and the in-process client
both call `Api`, so every caller goes through authorization, admission and validation.

Theory of operation
-------------------
A write is: authorize -> build the proposed object (body, or patch applied to the live object)
-> `strategy` (server-owned metadata, spec/status split, generation) -> admission (schema
validation with pruning and defaults, kind defaults, metadata and kind checks, node restriction)
-> managedFields -> store. Updates and patches run in a compare-and-swap loop
(`_guaranteed_update`, like the apiserver's GuaranteedUpdate): the write is conditional on the
revision the live object was read at; on a conflict the loop re-reads and recomputes, unless
the client itself named a resourceVersion, in which case the 409 is the client's. The first
read is local (serializable, like the apiserver's watch-cache read): the compare-and-swap is what
makes the write safe, so a stale read costs a retry, never a wrong write. Whatever would answer
without a write (a 404, a precondition mismatch, a no-op, a dry run) is decided on a
linearizable read, so a stale copy never answers a client.

Invariants: nothing is stored unless the whole pipeline accepted it (every failure leaves the
store unchanged); a write that would change nothing is not stored (the resourceVersion stays);
an object with a deletionTimestamp is removed exactly when its last finalizer goes (for a
Namespace: the last of `metadata.finalizers` and `spec.finalizers`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.apiserver.request import Query, WriteOptions
from orchestrator.apiserver.storage import ObjectStore
from orchestrator.apiserver.strategy import prepare_create, prepare_update, same_object
from orchestrator.kube import errors
from orchestrator.kube.errors import ApiError, Cause
from orchestrator.kube.jsonvalue import copy_json
from orchestrator.kube.objects import Obj
from orchestrator.kube.patch.apply import server_side_apply, track_update
from orchestrator.kube.patch.jsonpatch import apply_json_patch
from orchestrator.kube.patch.mergepatch import apply_merge_patch
from orchestrator.kube.patch.strategic import apply_strategic_merge_patch
from orchestrator.kube.schema import crd as crds
from orchestrator.kube.schema.columns import now_rfc3339
from orchestrator.kube.schema.kind import Kind, Registry
from orchestrator.kube.schema.names import NameRule, generate_name, validate_metadata
from orchestrator.kube.schema.validation import strict_error, validate
from orchestrator.kube.selectors import (
    check_field_labels,
    parse_field_selector,
    parse_label_selector,
    selector_to_string,
)
from orchestrator.security.authn import User
from orchestrator.security.authz import admit_node, authorize_resource, may_write_status

MAX_UPDATE_ATTEMPTS = 16
PATCH_TYPES = {
    "application/json-patch+json": "json",
    "application/merge-patch+json": "merge",
    "application/strategic-merge-patch+json": "strategic",
    "application/apply-patch+yaml": "apply",
}
# Kinds whose names are DNS-1123 labels rather than subdomains.
_LABEL_NAMED = {("", "namespaces"), ("", "services")}
_CRD = ("apiextensions.k8s.io", "customresourcedefinitions")
_KEEP_SPEC = ("spec",)
_PODS = ("", "pods")
_NAMESPACES = ("", "namespaces")


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


def get_path(obj: Obj, dotted: str) -> Any:
    cur: Any = obj
    for part in dotted.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def set_path(obj: Obj, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    cur = obj
    for part in parts[:-1]:
        nxt = cur.get(part)
        if not isinstance(nxt, dict):
            nxt = cur[part] = {}
        cur = nxt
    cur[parts[-1]] = value


def _rv(obj: Obj) -> int:
    return int(obj["metadata"]["resourceVersion"])


def _client_rv(obj: Obj) -> int | None:
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


def _status_success(kind: Kind, name: str, uid: str, code: int = 200) -> Obj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": name, "group": kind.group, "kind": kind.plural, "uid": uid},
        "code": code,
    }


class Api:
    def __init__(
        self,
        objects: ObjectStore,
        registry: Registry,
        *,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        on_crd_change: Callable[[Obj, bool], None] | None = None,
    ) -> None:
        self.objects = objects
        self.registry = registry
        self.clock = clock
        self.rng = rng or random.Random()
        self._on_crd_change = on_crd_change

    # ------------------------------------------------------------------ helpers
    def kind(self, group: str, version: str, plural: str) -> Kind:
        kind = self.registry.by_resource(group, version, plural)
        if kind is None:
            raise errors.route_not_found()
        return kind

    def now(self) -> str:
        return now_rfc3339(self.clock())

    def _authorize(
        self, call: Call, verb: str, kind: Kind, ns: str, name: str = "", sub: str = ""
    ) -> None:
        authorize_resource(call.user, verb, kind.group, kind.plural, sub, ns, name)
        if sub == "status" and verb in ("update", "patch") and not may_write_status(call.user):
            raise errors.forbidden(
                call.user.name, verb, f"{kind.plural}/status", kind.group, ns, name
            )

    def _check_namespace_arg(self, kind: Kind, ns: str) -> None:
        if kind.namespaced and not ns:
            raise errors.bad_request("a namespace must be given for namespaced resources")
        if not kind.namespaced and ns:
            raise errors.route_not_found()

    async def _require_namespace(self, ns: str) -> None:
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

    def _admit(self, call: Call, verb: str, kind: Kind, obj: Obj, old: Obj | None, sub: str) -> Obj:
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

    def _check_body_kind(self, kind: Kind, raw: Any, *, what: str = "") -> Obj:
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

    # ------------------------------------------------------------------ reads
    async def get(self, call: Call, kind: Kind, ns: str, name: str, *, rv: str = "") -> Obj:
        self._check_namespace_arg(kind, ns)
        self._authorize(call, "get", kind, ns, name)
        obj = await self.objects.get(kind, ns, name, stale_ok=rv == "0")
        return self._present(kind, obj)

    def _present(self, kind: Kind, obj: Obj) -> Obj:
        if kind.custom:  # one stored object serves every version of its CRD
            return {**obj, "apiVersion": kind.api_version}  # `obj` may be shared: not in place
        return obj

    async def list_objects(self, call: Call, kind: Kind, ns: str, query: Query) -> Obj:
        if not kind.namespaced and ns:
            raise errors.route_not_found()
        self._authorize(call, "list", kind, ns)
        objs, revision, token = await self.select(kind, ns, query)
        meta: Obj = {"resourceVersion": str(revision)}
        if token:
            meta["continue"] = token
        return {
            "kind": f"{kind.kind}List",
            "apiVersion": kind.api_version,
            "metadata": meta,
            "items": objs,
        }

    def matcher(self, kind: Kind, query: Query) -> Callable[[Obj], bool]:
        labels = parse_label_selector(query.get("labelSelector"))
        fields = parse_field_selector(query.get("fieldSelector"))
        check_field_labels(fields, set(kind.field_labels))

        def matches(obj: Obj) -> bool:
            meta = obj.get("metadata") or {}
            if not labels.matches(meta.get("labels") or {}):
                return False

            def getter(label: str) -> str | None:
                if label == "metadata.name":
                    return str(meta.get("name", ""))
                if label == "metadata.namespace":
                    return str(meta.get("namespace", ""))
                fn = kind.field_labels.get(label)
                return fn(obj) if fn else None

            return fields.matches(getter)

        return matches

    async def select(self, kind: Kind, ns: str, query: Query) -> tuple[list[Obj], int, str | None]:
        """Matching objects, the list revision and a continue token (limit/continue honoured)."""
        matches = self.matcher(kind, query)
        limit = query.number("limit", 0) or 0
        if limit < 0:
            raise errors.bad_request("limit must not be negative")
        token = query.get("continue") or None
        stale = query.get("resourceVersion") == "0" and not token
        out: list[Obj] = []
        while True:
            page, res = await self.objects.list(
                kind, ns, limit=max(limit - len(out), 0), continue_token=token, stale_ok=stale
            )
            out.extend(self._present(kind, o) for o in page if matches(o))
            token = res.continue_token
            if token is None or (limit and len(out) >= limit):
                return out, res.revision, token

    # ------------------------------------------------------------------ create
    async def create(self, call: Call, kind: Kind, ns: str, body: Any) -> Obj:
        self._check_namespace_arg(kind, ns)
        body = self._check_body_kind(kind, body)
        meta = body["metadata"]
        body_ns = meta.get("namespace")
        if kind.namespaced and body_ns and body_ns != ns:
            raise errors.bad_request(
                "the namespace of the provided object does not match the namespace sent on the "
                "request"
            )
        name = meta.get("name") or ""
        if not isinstance(name, str):
            raise errors.bad_request("metadata.name must be a string")
        if not name:
            prefix = meta.get("generateName")
            if not prefix or not isinstance(prefix, str):
                raise errors.invalid(
                    kind.kind,
                    kind.group,
                    "",
                    [
                        Cause(
                            "metadata.name",
                            "name or generateName is required",
                            "FieldValueRequired",
                        )
                    ],
                )
            name = generate_name(prefix, self.rng)
        self._authorize(call, "create", kind, ns, name)
        if kind.namespaced:
            body = {**body, "metadata": {**meta, "namespace": ns}}
            await self._require_namespace(ns)
        # Not copied: admission's validation makes the object to store a new one.
        obj = prepare_create(kind, body, now=self.now(), name=name, copy=False)
        obj = self._admit(call, "create", kind, obj, None, "")
        if (kind.group, kind.plural) == _CRD:
            obj["status"] = crds.crd_status(obj, self.now())
        obj = track_update(
            None,
            obj,
            manager=call.opts.field_manager,
            schema=kind.schema,
            api_version=kind.api_version,
            now=self.now(),
            copy=False,
            share=call.read_only,
        )
        if call.opts.dry_run:
            return obj
        stored = await self.objects.create(kind, obj, share=call.read_only)
        self._after_write(kind, stored)
        return self._present(kind, stored)

    def _after_write(self, kind: Kind, obj: Obj, *, deleted: bool = False) -> None:
        """Keep the registry's custom kinds in step with a CRD this server just wrote."""
        if (kind.group, kind.plural) == _CRD and self._on_crd_change is not None:
            self._on_crd_change(obj, deleted)

    # ------------------------------------------------------------------ update / patch
    async def update(
        self, call: Call, kind: Kind, ns: str, name: str, body: Any, sub: str = ""
    ) -> tuple[Obj, bool]:
        self._check_namespace_arg(kind, ns)
        self._authorize(call, "update", kind, ns, name, sub)
        body = self._check_body_kind(kind, body)
        meta = body["metadata"]
        if meta.get("name") not in (None, "", name):
            raise errors.bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the "
                f"URL ({name})"
            )
        if kind.namespaced and meta.get("namespace") not in (None, "", ns):
            raise errors.bad_request(
                "the namespace of the provided object does not match the namespace sent on the "
                "request"
            )
        precondition = _client_rv(body)

        def mutate(live: Obj) -> Obj:
            fresh: Obj = copy_json(body)
            return fresh

        obj = await self._guaranteed_update(call, kind, ns, name, sub, mutate, precondition)
        return obj, False

    async def patch(
        self,
        call: Call,
        kind: Kind,
        ns: str,
        name: str,
        content_type: str,
        patch: Any,
        sub: str = "",
    ) -> tuple[Obj, bool]:
        self._check_namespace_arg(kind, ns)
        self._authorize(call, "patch", kind, ns, name, sub)
        ptype = PATCH_TYPES.get(content_type)
        if ptype is None or (ptype == "strategic" and kind.custom):
            raise errors.unsupported_media_type(content_type)
        if ptype == "json" and not isinstance(patch, list):
            raise errors.bad_request("a JSON patch must be a list of operations")
        if ptype != "json" and not isinstance(patch, dict):
            raise errors.bad_request("the patch must be a JSON object")
        if ptype == "apply":
            return await self._apply(call, kind, ns, name, patch, sub)

        def mutate(live: Obj) -> Obj:
            if ptype == "json":
                out: Obj = apply_json_patch(live, patch)
            elif ptype == "merge":  # only read until admission copies it: share `live`
                out = apply_merge_patch(live, patch, share=True)
            else:
                out = apply_strategic_merge_patch(live, patch, kind.schema)
            if not isinstance(out, dict):
                raise errors.bad_request("the patched object is not a JSON object")
            meta = self._check_body_kind(kind, out)["metadata"]
            # As for an update (and whatever the subresource: a status write would otherwise
            # drop the change silently and answer 200).
            if meta.get("name") != name:
                raise errors.bad_request(
                    f"the name of the object ({meta.get('name')}) does not match the name on "
                    f"the URL ({name})"
                )
            if kind.namespaced and meta.get("namespace") != ns:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent "
                    "on the request"
                )
            return out

        obj = await self._guaranteed_update(call, kind, ns, name, sub, mutate, None)
        return obj, False

    async def _apply(
        self, call: Call, kind: Kind, ns: str, name: str, config: Obj, sub: str
    ) -> tuple[Obj, bool]:
        config = self._check_body_kind(kind, config, what=" (server-side apply)")
        if not config.get("apiVersion") or not config.get("kind"):
            raise errors.bad_request("apiVersion and kind must be set for server-side apply")
        if config["metadata"].get("name") not in (None, name):
            raise errors.bad_request(
                f"the name of the object ({config['metadata'].get('name')}) does not match the "
                f"name on the URL ({name})"
            )
        if "managedFields" in config["metadata"]:
            raise errors.bad_request("metadata.managedFields must be nil for server-side apply")
        config = {**config, "metadata": {**config["metadata"], "name": name}}
        if kind.namespaced:
            config["metadata"]["namespace"] = ns

        def apply(live: Obj | None) -> Obj:
            out: Obj = server_side_apply(
                live,
                config,
                manager=call.opts.field_manager,
                schema=kind.schema,
                force=call.opts.force,
                api_version=kind.api_version,
                now=self.now(),
            )
            return out

        try:
            obj = await self._guaranteed_update(
                call, kind, ns, name, sub, apply, _client_rv(config), managed=True
            )
        except ApiError as exc:
            if exc.code != 404 or sub:
                raise
        else:
            return obj, False
        # Apply to a missing object creates it.
        self._authorize(call, "create", kind, ns, name)
        created = apply(None)
        if kind.namespaced:
            await self._require_namespace(ns)
        obj = prepare_create(kind, created, now=self.now(), name=name)
        obj["metadata"]["managedFields"] = created["metadata"].get("managedFields", [])
        obj = self._admit(call, "create", kind, obj, None, "")
        if (kind.group, kind.plural) == _CRD:
            obj["status"] = crds.crd_status(obj, self.now())
        if call.opts.dry_run:
            return obj, True
        stored = await self.objects.create(kind, obj)
        self._after_write(kind, stored)
        return self._present(kind, stored), True

    async def _guaranteed_update(
        self,
        call: Call,
        kind: Kind,
        ns: str,
        name: str,
        sub: str,
        mutate: Callable[[Obj], Obj],
        precondition: int | None,
        *,
        managed: bool = False,
    ) -> Obj:
        """Read, mutate, admit and compare-and-swap until it sticks (see the module doc).
        `mutate(live)` returns the proposed object; it must not modify `live` (the patch
        engines copy what they change, an update ignores it). Nothing below modifies `live`
        either, so for a `read_only` caller (who may be handed `live` or parts of it) it is
        the shared decoded object the read-only watches were handed."""
        read = self.objects.get_shared if call.read_only else self.objects.get
        fresh = False  # read linearizably (after a local read fell short)
        for _ in range(MAX_UPDATE_ATTEMPTS):
            try:
                live = await read(kind, ns, name, stale_ok=not fresh)
                obj = self._updated(call, kind, sub, live, mutate, precondition, managed)
            except ApiError:
                if fresh:
                    raise
                fresh = True  # a 404, a failed check or a mismatch: only the latest state says
                continue
            noop = same_object(obj, live)
            if not fresh and (noop or call.opts.dry_run):
                fresh = True  # answered without a write: only from the latest state
                continue
            if noop:
                return self._present(kind, live)
            if call.opts.dry_run:
                return self._present(kind, obj)
            meta = obj["metadata"]
            try:
                if (
                    meta.get("deletionTimestamp")
                    and _finalizing(kind, live)
                    and not _finalizing(kind, obj)
                ):
                    # This update removed the last finalizer: the deletion completes. (A pod
                    # being deleted gracefully has none to remove: updates leave it in place.)
                    await self.objects.delete(kind, ns, name, _rv(live))
                    self._after_write(kind, obj, deleted=True)
                    return self._present(kind, obj)
                stored = await self.objects.update(kind, obj, _rv(live), share=call.read_only)
            except ApiError as exc:
                if (
                    exc.code == 409
                    and exc.reason == "Conflict"
                    and (precondition is None or not fresh)
                ):
                    # Someone else wrote meanwhile (or the local read was stale): recompute on
                    # the new state. A patch that named a resourceVersion fails the check above
                    # on the next round (the live one moved on); one that did not just
                    # inherited the live one.
                    fresh = True
                    continue
                raise
            self._after_write(kind, stored)
            return self._present(kind, stored)
        raise errors.conflict(kind.plural, kind.group, name, "too many concurrent writers")

    def _updated(
        self,
        call: Call,
        kind: Kind,
        sub: str,
        live: Obj,
        mutate: Callable[[Obj], Obj],
        precondition: int | None,
        managed: bool,
    ) -> Obj:
        """The object `_guaranteed_update` would store over `live` (raises ApiError)."""
        proposed = mutate(live)
        wanted = precondition if precondition is not None else _client_rv(proposed)
        if wanted is not None and wanted != _rv(live):
            raise errors.conflict(kind.plural, kind.group, str(live["metadata"].get("name")))
        # Not copied: admission's validation makes the object to store a new one.
        obj = prepare_update(kind, proposed, live, subresource=sub, copy=False)
        if managed:
            obj["metadata"]["managedFields"] = proposed["metadata"].get("managedFields", [])
        obj = self._admit(call, "update", kind, obj, live, sub)
        if (kind.group, kind.plural) == _CRD:
            obj["status"] = crds.crd_status(obj, self.now())
        if not managed:
            obj = track_update(
                live,
                obj,
                manager=call.opts.field_manager,
                schema=kind.schema,
                api_version=kind.api_version,
                now=self.now(),
                subresource=sub,
                copy=False,
            )
        obj["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]
        return obj

    # ------------------------------------------------------------------ delete
    async def delete(
        self, call: Call, kind: Kind, ns: str, name: str, options: Any
    ) -> tuple[Obj, int]:
        """Delete (or start deleting) one object; returns the reply and its HTTP code."""
        self._check_namespace_arg(kind, ns)
        self._authorize(call, "delete", kind, ns, name)
        opts = _delete_options(options, call)
        for _ in range(MAX_UPDATE_ATTEMPTS):
            live = await self.objects.get(kind, ns, name)
            admit_node(call.user, "delete", kind.kind, "", live, live)
            meta = live["metadata"]
            pre = opts.get("preconditions") or {}
            if pre.get("uid") not in (None, meta.get("uid")):
                raise errors.conflict(
                    kind.plural,
                    kind.group,
                    name,
                    f"Precondition failed: UID in precondition: {pre['uid']}, UID in object meta: "
                    f"{meta.get('uid')}",
                )
            if pre.get("resourceVersion") not in (None, meta.get("resourceVersion")):
                raise errors.conflict(
                    kind.plural,
                    kind.group,
                    name,
                    f"Precondition failed: ResourceVersion in precondition: "
                    f"{pre['resourceVersion']}, ResourceVersion in object meta: "
                    f"{meta.get('resourceVersion')}",
                )
            updated = self._deleting(kind, live, opts)
            try:
                if updated is None:
                    if not call.opts.dry_run:
                        await self.objects.delete(kind, ns, name, _rv(live))
                        self._after_write(kind, live, deleted=True)
                        if (kind.group, kind.plural) == _CRD:
                            await self._delete_custom_objects(live)
                    return self._present(kind, live), 200
                if same_object(updated, live) or call.opts.dry_run:
                    return self._present(kind, updated), 202 if updated is not live else 200
                stored = await self.objects.update(kind, updated, _rv(live))
            except ApiError as exc:
                if exc.code == 409 and exc.reason == "Conflict":
                    continue
                raise
            return self._present(kind, stored), 202
        raise errors.conflict(kind.plural, kind.group, name, "too many concurrent writers")

    def _deleting(self, kind: Kind, live: Obj, opts: Obj) -> Obj | None:
        """The object marked for deletion, or None when it can go right away."""
        obj: Obj = copy_json(live)
        meta = obj["metadata"]
        finalizers = list(meta.get("finalizers") or [])
        policy = opts.get("propagationPolicy")
        if policy == "Foreground" and "foregroundDeletion" not in finalizers:
            finalizers.append("foregroundDeletion")
        elif policy == "Orphan" and "orphan" not in finalizers:
            finalizers.append("orphan")
        grace = opts.get("gracePeriodSeconds")
        graceful = False
        if (kind.group, kind.plural) == _PODS and (obj.get("spec") or {}).get("nodeName"):
            if grace is None:
                grace = (obj.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
            graceful = grace > 0 and not _finished(obj)
        if (kind.group, kind.plural) == _NAMESPACES and (obj.get("spec") or {}).get("finalizers"):
            obj.setdefault("status", {})["phase"] = "Terminating"
            finalizers = finalizers or []
            graceful = True
        if not finalizers and not graceful:
            return None
        if finalizers:
            meta["finalizers"] = finalizers
        if not meta.get("deletionTimestamp"):
            meta["deletionTimestamp"] = now_rfc3339(
                self.clock() + ((grace or 0) if graceful else 0)
            )
            meta["deletionGracePeriodSeconds"] = int(grace or 0) if graceful else 0
        elif graceful and grace is not None and grace < meta.get("deletionGracePeriodSeconds", 0):
            meta["deletionGracePeriodSeconds"] = int(grace)
        if not graceful and not finalizers:
            return None
        return obj

    async def _delete_custom_objects(self, crd: Obj) -> None:
        """A deleted CRD takes its objects with it (the apiserver's customresourcecleanup)."""
        group = (crd.get("spec") or {}).get("group", "")
        plural = ((crd.get("spec") or {}).get("names") or {}).get("plural", "")
        for k in list(self.registry):
            if k.custom and k.group == group and k.plural == plural:
                objs, _ = await self.objects.list(k, "")
                for o in objs:
                    meta = o["metadata"]
                    try:
                        await self.objects.delete(
                            k, meta.get("namespace", ""), meta["name"], _rv(o)
                        )
                    except ApiError as exc:
                        if exc.code not in (404, 409):
                            raise
                break

    async def delete_collection(
        self, call: Call, kind: Kind, ns: str, query: Query, options: Any
    ) -> Obj:
        self._authorize(call, "deletecollection", kind, ns)
        objs, revision, _ = await self.select(kind, ns, query)
        deleted = []
        for o in objs:
            meta = o["metadata"]
            try:
                reply, _code = await self.delete(
                    call, kind, meta.get("namespace", ""), meta["name"], options
                )
            except ApiError as exc:
                if exc.code == 404:
                    continue
                raise
            deleted.append(reply)
        return {
            "kind": f"{kind.kind}List",
            "apiVersion": kind.api_version,
            "metadata": {"resourceVersion": str(revision)},
            "items": deleted,
        }

    # ------------------------------------------------------------------ scale
    def _scale(self, kind: Kind, obj: Obj) -> Obj:
        assert kind.scale is not None
        meta = obj["metadata"]
        selector = get_path(obj, kind.scale.label_selector)
        if isinstance(selector, dict):
            selector = selector_to_string(selector)
        status: Obj = {"replicas": int(get_path(obj, kind.scale.status_replicas) or 0)}
        if selector:
            status["selector"] = selector
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                k: meta[k]
                for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                if k in meta
            },
            "spec": {"replicas": int(get_path(obj, kind.scale.spec_replicas) or 0)},
            "status": status,
        }

    async def get_scale(self, call: Call, kind: Kind, ns: str, name: str) -> Obj:
        if kind.scale is None:
            raise errors.route_not_found()
        self._authorize(call, "get", kind, ns, name, "scale")
        return self._scale(kind, await self.objects.get(kind, ns, name))

    async def write_scale(
        self,
        call: Call,
        kind: Kind,
        ns: str,
        name: str,
        body: Any,
        content_type: str | None,
    ) -> Obj:
        """PUT (content_type None) or PATCH of the scale subresource."""
        if kind.scale is None:
            raise errors.route_not_found()
        scale_spec = kind.scale
        self._authorize(call, "patch" if content_type else "update", kind, ns, name, "scale")
        ptype = PATCH_TYPES.get(content_type or "", "") if content_type else "put"
        if not ptype or ptype == "apply":
            raise errors.unsupported_media_type(content_type or "")
        if ptype == "put":
            _check_scale(body, name)  # before any read: a wrong body never reaches the loop
        elif ptype == "json" and not isinstance(body, list):
            raise errors.bad_request("a JSON patch must be a list of operations")
        elif ptype == "merge" and not isinstance(body, dict):
            raise errors.bad_request("the patch must be a JSON object")

        def mutate(live: Obj) -> Obj:
            current = self._scale(kind, live)
            if ptype == "put":
                wanted = body
            elif ptype == "json":
                wanted = apply_json_patch(current, body)
            else:
                wanted = apply_merge_patch(current, body)
            _check_scale(wanted, name)
            replicas = get_path(wanted, "spec.replicas")
            if replicas is None:
                replicas = 0
            if type(replicas) is not int or replicas < 0:
                raise errors.invalid(
                    "Scale",
                    "autoscaling",
                    name,
                    [Cause("spec.replicas", f"Invalid value: {replicas!r}: must be >= 0")],
                )
            rv = (wanted.get("metadata") or {}).get("resourceVersion")
            if rv not in (None, "") and str(rv) != live["metadata"]["resourceVersion"]:
                raise errors.conflict(kind.plural, kind.group, name)
            out: Obj = copy_json(live)
            set_path(out, scale_spec.spec_replicas, replicas)
            return out

        obj = await self._guaranteed_update(call, kind, ns, name, "", mutate, None)
        return self._scale(kind, obj)

    # ------------------------------------------------------------------ binding
    async def bind(self, call: Call, kind: Kind, ns: str, name: str, body: Any) -> Obj:
        if (kind.group, kind.plural) != _PODS:
            raise errors.route_not_found()
        self._authorize(call, "create", kind, ns, name, "binding")
        if not isinstance(body, dict) or not isinstance(body.get("target"), dict):
            raise errors.bad_request("a Binding needs a target")
        node = body["target"].get("name")
        if not node or not isinstance(node, str):
            raise errors.invalid(
                "Binding", "", name, [Cause("target.name", "Required value", "FieldValueRequired")]
            )
        fresh = False  # as in `_guaranteed_update`: a local read first, refusals on the latest
        for _ in range(MAX_UPDATE_ATTEMPTS):
            try:
                # Shared (not modified below, nor returned): usually the object the scheduler's
                # informer was handed, so a bind does not decode the pod again.
                live = await self.objects.get_shared(kind, ns, name, stale_ok=not fresh)
            except ApiError:
                if fresh:
                    raise
                fresh = True
                continue
            refusal = None
            if live["metadata"].get("deletionTimestamp"):
                refusal = "pod is being deleted, cannot be assigned to a host"
            elif current := (live.get("spec") or {}).get("nodeName"):
                refusal = f'pod {name} is already assigned to node "{current}"'
            if refusal is not None or call.opts.dry_run:
                if not fresh:
                    fresh = True
                    continue
                if refusal is not None:
                    raise errors.conflict(kind.plural, "", name, refusal)
                break
            bound = {**live, "spec": {**(live.get("spec") or {}), "nodeName": node}}
            try:
                # `bound` goes nowhere else: the watches may be handed it as it is.
                await self.objects.update(kind, bound, _rv(live), share=True)
            except ApiError as exc:
                if exc.code == 409 and exc.reason == "Conflict":
                    fresh = True
                    continue
                raise
            break
        else:
            raise errors.conflict(kind.plural, "", name, "too many concurrent writers")
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "code": 201,
        }


def _check_scale(scale: Any, name: str) -> None:
    """A Scale body (PUT, or the result of a patch): an autoscaling/v1 Scale of this object
    (an empty apiVersion and kind mean that one, as the apiserver's decoder defaults them)."""
    if not isinstance(scale, dict):
        raise errors.bad_request("the scale must be a JSON object")
    api_version, kind_name = scale.get("apiVersion"), scale.get("kind")
    if (api_version or kind_name) and (api_version, kind_name) != ("autoscaling/v1", "Scale"):
        raise errors.bad_request(
            f"the API version in the data ({api_version}) and kind ({kind_name}) do not match "
            "the expected autoscaling/v1 Scale"
        )
    meta = scale.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise errors.bad_request("metadata must be an object")
    if meta and meta.get("name") not in (None, "", name):
        raise errors.bad_request(
            f"the name of the object ({meta.get('name')}) does not match the name on the "
            f"URL ({name})"
        )
    spec = scale.get("spec")
    if spec is not None and not isinstance(spec, dict):
        raise errors.bad_request("spec must be an object")


def _namespace_finalizers(kind: Kind, obj: Obj) -> bool:
    """A terminating Namespace also waits for its `spec.finalizers` (the namespace controller
    empties it, then removes "kubernetes"); it goes once both lists are empty."""
    return (kind.group, kind.plural) == _NAMESPACES and bool(
        (obj.get("spec") or {}).get("finalizers")
    )


def _finalizing(kind: Kind, obj: Obj) -> bool:
    """Whether finalizers still hold the object (its metadata's, or a Namespace's spec's)."""
    return bool(obj["metadata"].get("finalizers")) or _namespace_finalizers(kind, obj)


def _finished(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _delete_options(raw: Any, call: Call) -> Obj:
    if raw in (None, b"", ""):
        return {}
    if not isinstance(raw, dict):
        raise errors.bad_request("DeleteOptions must be a JSON object")
    options: Obj = raw
    policy = options.get("propagationPolicy")
    if policy not in (None, "Background", "Foreground", "Orphan"):
        raise errors.bad_request(
            f'Unsupported value: "{policy}": supported values: "Foreground", "Background", "Orphan"'
        )
    if options.get("orphanDependents") is True and policy is None:
        options = {**options, "propagationPolicy": "Orphan"}
    grace = options.get("gracePeriodSeconds")
    if grace is not None and (type(grace) is not int or grace < 0):
        raise errors.bad_request("gracePeriodSeconds must be a non-negative integer")
    pre = options.get("preconditions")
    if pre is not None and not isinstance(pre, dict):
        raise errors.bad_request("preconditions must be an object")
    dry = options.get("dryRun")
    if dry:
        if dry != ["All"]:
            raise errors.bad_request(f"unsupported dryRun value {dry!r}: only 'All' is supported")
        call.opts = WriteOptions(True, call.opts.field_manager, call.opts.field_validation)
    return options
