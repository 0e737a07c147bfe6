"""The create verb (kube-apiserver's create.go): a new object from a body.

Name: the body's, or one generated from `generateName` (random suffix from the handler's
RNG). A namespaced object goes into an existing namespace that is not terminating. The
object stored is built by `strategy.prepare_create` (server-owned metadata: uid,
creationTimestamp, generation...) and admission; a CRD gets its status computed here, and
the registry learns its kinds once it is stored (`Handler.after_write`).
"""

from __future__ import annotations

from typing import Any

from orchestrator.apiserver.handler import CRD, Call, Handler
from orchestrator.apiserver.strategy import prepare_create
from orchestrator.kube import errors
from orchestrator.kube.errors import Cause
from orchestrator.kube.objects import Obj
from orchestrator.kube.patch.apply import track_update
from orchestrator.kube.schema import crd as crds
from orchestrator.kube.schema.kind import Kind
from orchestrator.kube.schema.names import generate_name


async def create_object(h: Handler, call: Call, kind: Kind, ns: str, body: Any) -> Obj:
    h.check_namespace_arg(kind, ns)
    body = h.check_body_kind(kind, body)
    meta = body["metadata"]
    body_ns = meta.get("namespace")
    if kind.namespaced and body_ns and body_ns != ns:
        raise errors.bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
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
        name = generate_name(prefix, h.rng)
    h.authorize(call, "create", kind, ns, name)
    if kind.namespaced:
        body = {**body, "metadata": {**meta, "namespace": ns}}
        await h.require_namespace(ns)
    # Not copied: admission's validation makes the object to store a new one.
    obj = prepare_create(kind, body, now=h.now(), name=name, copy=False)
    obj = h.admit(call, "create", kind, obj, None, "")
    if (kind.group, kind.plural) == CRD:
        obj["status"] = crds.crd_status(obj, h.now())
    obj = track_update(
        None,
        obj,
        manager=call.opts.field_manager,
        schema=kind.schema,
        api_version=kind.api_version,
        now=h.now(),
        copy=False,
        share=call.read_only,
    )
    if h.allocates(kind):  # a Service: its ClusterIP and node ports, claimed with it
        stored = await h.services.create(
            h.objects, kind, obj, share=call.read_only, dry_run=call.opts.dry_run
        )
        if call.opts.dry_run:
            return stored
    elif call.opts.dry_run:
        return obj
    else:
        stored = await h.objects.create(kind, obj, share=call.read_only)
    h.after_write(kind, stored)
    return h.present(kind, stored)
