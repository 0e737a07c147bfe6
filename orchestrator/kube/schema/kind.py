"""`Kind`: everything the API server knows about one resource kind, and the `Registry` of kinds.

A Kind's `schema` is a structural OpenAPI v3 schema (the same dialect as a CRD's
`openAPIV3Schema`, with the `x-kubernetes-*` extensions) and is the single source of truth for
validation, defaulting, pruning, OpenAPI documents, strategic-merge-patch keys and server-side
apply list types. Named sub-schemas carry `"x-orchestrator-name": "io.k8s.api.core.v1.Container"`
so OpenAPI generation can emit them once under `components.schemas` and `$ref` them.

Invariants: a Registry maps each (group, version, plural) and each (apiVersion, kind) to exactly
one Kind; built-in kinds never change after start; custom kinds come and go with their CRDs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.kube.errors import Cause
from orchestrator.kube.objects import Obj


@dataclass(frozen=True, slots=True)
class Column:
    """One Table column (`kubectl get`); `cell(obj, now)` gives the cell, `now` in epoch seconds."""

    name: str
    type: str  # string | integer | number | boolean | date
    description: str
    cell: Callable[[Obj, float], Any]
    priority: int = 0  # 1 = only with `-o wide`
    format: str = ""  # "name" for the Name column


@dataclass(frozen=True, slots=True)
class ScaleSpec:
    """Where the scale subresource reads and writes (dotted paths into the object)."""

    spec_replicas: str = "spec.replicas"
    status_replicas: str = "status.replicas"
    label_selector: str = "status.selector"  # or "spec.selector" (a LabelSelector object)


@dataclass(frozen=True)
class Kind:
    group: str  # "" for core
    version: str
    kind: str
    plural: str
    singular: str
    namespaced: bool
    schema: Obj  # structural schema of the whole object
    description: str = ""
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: frozenset[str] = frozenset()  # "status", "scale", "binding", "log"
    columns: tuple[Column, ...] = ()
    # Supported field selectors besides metadata.name / metadata.namespace: label -> extractor.
    field_labels: Mapping[str, Callable[[Obj], str | None]] = field(default_factory=dict)
    scale: ScaleSpec | None = None
    # Kind-specific checks beyond the schema: (new object, old object or None) -> causes.
    validate: Callable[[Obj, Obj | None], list[Cause]] | None = None
    # Kind-specific defaults beyond the schema's `default` values (mutates the object).
    default: Callable[[Obj], None] | None = None
    custom: bool = False  # served from a CRD: no strategic merge patch, schema from the CRD
    verbs: tuple[str, ...] = (
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch",
    )

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def resource(self) -> str:
        """`deployments.apps`, `pods`: how errors name the resource."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


class Registry:
    """Built-in kinds plus custom kinds from CRDs, looked up by URL or by apiVersion and kind."""

    def __init__(self, kinds: list[Kind] | None = None) -> None:
        self._by_resource: dict[tuple[str, str, str], Kind] = {}
        self._by_gvk: dict[tuple[str, str], Kind] = {}
        for k in kinds or []:
            self.add(k)

    def add(self, kind: Kind) -> None:
        self._by_resource[(kind.group, kind.version, kind.plural)] = kind
        self._by_gvk[(kind.api_version, kind.kind)] = kind

    def remove(self, group: str, version: str, plural: str) -> None:
        kind = self._by_resource.pop((group, version, plural), None)
        if kind is not None:
            self._by_gvk.pop((kind.api_version, kind.kind), None)

    def by_resource(self, group: str, version: str, plural: str) -> Kind | None:
        return self._by_resource.get((group, version, plural))

    def by_gvk(self, api_version: str, kind: str) -> Kind | None:
        return self._by_gvk.get((api_version, kind))

    def __iter__(self) -> Iterator[Kind]:
        return iter(list(self._by_resource.values()))

    def group_versions(self) -> dict[str, list[str]]:
        """group -> versions served ("" is the core group)."""
        out: dict[str, list[str]] = {}
        for k in self._by_resource.values():
            vs = out.setdefault(k.group, [])
            if k.version not in vs:
                vs.append(k.version)
        return out
