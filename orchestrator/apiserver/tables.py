"""Table responses (meta.k8s.io/v1 Table) for `kubectl get`: columns come from each Kind.

kubectl asks with `Accept: application/json;as=Table;v=v1;g=meta.k8s.io,...` and prints the
cells verbatim, so every cell is formatted here (ages, `<none>`). Rows carry the object as
PartialObjectMetadata (default; kubectl needs `kind` on it), the whole object
(`includeObject=Object`) or nothing (`includeObject=None`). Kinds without columns get Name, Age.
"""

from __future__ import annotations

from typing import Any

from orchestrator.kube import errors
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.columns import AGE, NAME
from orchestrator.kube.schema.kind import Column, Kind


def wants_table(accept: str) -> bool:
    for part in accept.split(","):
        params = {p.strip().partition("=")[0]: p.strip().partition("=")[2] for p in part.split(";")}
        if params.get("as") == "Table" and params.get("g") == "meta.k8s.io":
            return True
    return False


def columns_of(kind: Kind) -> tuple[Column, ...]:
    return kind.columns or (NAME, AGE)


def _definitions(kind: Kind) -> list[Obj]:
    return [
        {
            "name": c.name,
            "type": c.type,
            "format": c.format,
            "description": c.description,
            "priority": c.priority,
        }
        for c in columns_of(kind)
    ]


def _cell(column: Column, obj: Obj, now: float) -> Any:
    try:
        return column.cell(obj, now)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        return "<unknown>"  # a malformed stored object must not break `kubectl get`


def _row_object(obj: Obj, include: str) -> Obj | None:
    if include == "Object":
        return obj
    if include == "None":
        return None
    meta = obj.get("metadata") or {}
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {k: v for k, v in meta.items() if k != "managedFields"},
    }


def include_object(text: str) -> str:
    if text in ("", "Metadata"):
        return "Metadata"
    if text in ("None", "Object"):
        return text
    raise errors.bad_request(
        f'includeObject: Unsupported value: "{text}": supported values: '
        '"None", "Metadata", "Object"'
    )


def row(cols: tuple[Column, ...], obj: Obj, now: float, include: str) -> Obj:
    """The Table row of `obj` (`cols` from `columns_of`, `include` from `include_object`)."""
    out: Obj = {"cells": [_cell(c, obj, now) for c in cols]}
    ro = _row_object(obj, include)
    if ro is not None:
        out["object"] = ro
    return out


def table(
    kind: Kind,
    objs: list[Obj],
    now: float,
    *,
    resource_version: str = "",
    continue_token: str | None = None,
    include: str = "Metadata",
    with_columns: bool = True,
) -> Obj:
    """The Table of `objs`; its last member is `rows` (which `slices.ItemsEncoder` needs)."""
    cols = columns_of(kind)
    meta: Obj = {}
    if resource_version:
        meta["resourceVersion"] = resource_version
    if continue_token:
        meta["continue"] = continue_token
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": _definitions(kind) if with_columns else [],
        "rows": [row(cols, obj, now, include) for obj in objs],
    }
