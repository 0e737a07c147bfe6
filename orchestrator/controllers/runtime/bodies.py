"""The request bodies both `Client` transports send for a delete and a bind (DeleteOptions,
Binding), built from the protocol's typed arguments, so the HTTP and in-process clients send
the server the same thing.
"""

from __future__ import annotations

from orchestrator.kube.objects import Obj, metadata_of

__all__ = ["binding", "delete_options"]


def delete_options(
    propagation_policy: str | None, preconditions: Obj | None, grace_period_seconds: int | None
) -> Obj:
    """A v1 DeleteOptions with the fields that are set."""
    opts: Obj = {"kind": "DeleteOptions", "apiVersion": "v1"}
    if propagation_policy:
        opts["propagationPolicy"] = propagation_policy
    if preconditions:
        opts["preconditions"] = dict(preconditions)
    if grace_period_seconds is not None:
        opts["gracePeriodSeconds"] = grace_period_seconds
    return opts


def binding(pod: Obj, node: str) -> Obj:
    """The v1 Binding of `pod` (its namespace, name and uid) to `node`."""
    meta = metadata_of(pod)
    binding_meta: Obj = {"name": meta.get("name", ""), "namespace": meta.get("namespace", "")}
    if meta.get("uid"):
        binding_meta["uid"] = meta["uid"]
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": binding_meta,
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
