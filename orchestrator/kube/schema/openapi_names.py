"""Names and facts the OpenAPI v3 document and its paths share: component names of kinds,
group-version paths, the media types of the patch flavours, the standard component names, and
whether a kind advertises strategic merge patch.

Pure functions of a Kind; no I/O.
"""

from __future__ import annotations

from typing import Any

from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.builders import NAME_KEY
from orchestrator.kube.schema.kind import Kind
from orchestrator.kube.schema.meta import META

REF = "#/components/schemas/"
GVK = "x-kubernetes-group-version-kind"
FIELD_META = (
    "x-kubernetes-patch-strategy",
    "x-kubernetes-patch-merge-key",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
)
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
MEDIA = ("application/json", "application/yaml")

STATUS_NAME = f"{META}.Status"
DELETE_OPTIONS_NAME = f"{META}.DeleteOptions"
PATCH_NAME = f"{META}.Patch"
SCALE_NAME = "io.k8s.api.autoscaling.v1.Scale"
BINDING_NAME = "io.k8s.api.core.v1.Binding"


# -- names ----------------------------------------------------------------------------------------


def gv_path(group: str, version: str) -> str:
    """`api/v1`, `apis/apps/v1`: the key of a group-version in the index and in URLs."""
    return f"apis/{group}/{version}" if group else f"api/{version}"


def schema_name(kind: Kind) -> str:
    """The component name of a kind's schema: its own name, or the Kubernetes convention."""
    name = kind.schema.get(NAME_KEY)
    if isinstance(name, str) and name:
        return name
    if kind.custom:
        return f"{'.'.join(reversed(kind.group.split('.')))}.{kind.version}.{kind.kind}"
    package = "core" if not kind.group else kind.group.removesuffix(".k8s.io").split(".")[0]
    return f"io.k8s.api.{package}.{kind.version}.{kind.kind}"


def camel_gv(group: str, version: str) -> str:
    parts = group.removesuffix(".k8s.io").replace("-", ".").split(".") if group else ["core"]
    return "".join(p[:1].upper() + p[1:] for p in parts if p) + version[:1].upper() + version[1:]


def gvk_of(group: str, version: str, kind: str) -> Obj:
    return {"group": group, "version": version, "kind": kind}


def _has_patch_metadata(schema: Any) -> bool:
    if isinstance(schema, dict):
        if "x-kubernetes-patch-strategy" in schema or "x-kubernetes-patch-merge-key" in schema:
            return True
        return any(_has_patch_metadata(v) for v in schema.values())
    if isinstance(schema, list):
        return any(_has_patch_metadata(v) for v in schema)
    return False


def strategic_merge_supported(kind: Kind) -> bool:
    """SMP is advertised for built-in kinds whose schema carries patch metadata."""
    props = kind.schema.get("properties")
    return (
        not kind.custom
        and isinstance(props, dict)
        and "metadata" in props
        and _has_patch_metadata(kind.schema)
    )
