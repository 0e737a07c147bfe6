"""CustomResourceDefinitions: the Kinds they serve, and the status they get (their validation is
`crd_validation.validate_crd`).

* `kinds_from_crd(crd)` turns a valid CRD into one `Kind` per served version (custom=True); the
  version's `openAPIV3Schema` becomes the Kind's schema, wrapped so apiVersion, kind and metadata
  (the shared ObjectMeta schema) are part of it, and the same validation engine as built-ins
  prunes, defaults and validates its objects.
* `crd_status(crd, now)` is the status the server sets on create/update: NamesAccepted and
  Established, acceptedNames, storedVersions.

Invariants: pure; never mutates its input; `kinds_from_crd` only assumes what `validate_crd`
guarantees and tolerates anything else without raising; user schemas never carry
`x-orchestrator-*` keys into a Kind (they are stripped).
"""

from __future__ import annotations

from typing import Any

from orchestrator.kube.objects import Obj
from orchestrator.kube.schema import jsonpath
from orchestrator.kube.schema.builders import NAME_KEY
from orchestrator.kube.schema.columns import AGE, NAME, age_of
from orchestrator.kube.schema.kind import Column, Kind, ScaleSpec
from orchestrator.kube.schema.meta import object_meta

_ORCHESTRATOR = "x-orchestrator-"


def _dict(v: Any) -> Obj:
    return v if isinstance(v, dict) else {}


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def reversed_group(group: str) -> str:
    """`example.com` -> `com.example`: the prefix of a custom kind's OpenAPI schema name."""
    return ".".join(reversed(group.split(".")))


# -- kinds ----------------------------------------------------------------------------------------


def _strip(node: Any) -> Any:
    """A deep copy without `x-orchestrator-*` keys (user schemas must not name components)."""
    if isinstance(node, dict):
        return {k: _strip(v) for k, v in node.items() if not k.startswith(_ORCHESTRATOR)}
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


def wrap_schema(schema: Any, group: str, version: str, kind: str) -> Obj:
    """The whole-object schema of a custom kind: the user's schema plus apiVersion/kind/metadata."""
    user = _strip(schema) if isinstance(schema, dict) else {}
    props = _dict(user.get("properties"))
    out: Obj = {k: v for k, v in user.items() if k != "properties"}
    out["type"] = "object"
    out["properties"] = {
        "apiVersion": {
            "type": "string",
            "description": "The versioned schema of this object, e.g. example.com/v1.",
        },
        "kind": {"type": "string", "description": "The kind of this object."},
        "metadata": object_meta(),
        **{k: v for k, v in props.items() if k not in ("apiVersion", "kind", "metadata")},
    }
    out[NAME_KEY] = f"{reversed_group(group)}.{version}.{kind}"
    return out


def _cell(path: jsonpath.Path, ctype: str) -> Any:
    def cell(obj: Obj, now: float) -> Any:
        found, value = path.first(obj)
        if not found or value is None:
            return None
        if ctype == "date":
            return age_of(value, now) if isinstance(value, str) else None
        if ctype == "integer":
            if isinstance(value, float) and value.is_integer():
                return int(value)
            return value if isinstance(value, int) and not isinstance(value, bool) else None
        if ctype == "number":
            return value if isinstance(value, int | float) and not isinstance(value, bool) else None
        if ctype == "boolean":
            return value if isinstance(value, bool) else None
        return jsonpath.text(value)

    return cell


def printer_columns(version: Obj) -> tuple[Column, ...]:
    """Name plus the version's additionalPrinterColumns, or Name/Age when it has none."""
    specs = _list(version.get("additionalPrinterColumns"))
    if not specs:
        return (NAME, AGE)
    cols = [NAME]
    for col in specs:
        if not isinstance(col, dict):
            continue
        try:
            path = jsonpath.compile(str(col.get("jsonPath", "")))
        except jsonpath.JSONPathError:
            continue
        ctype = str(col.get("type") or "string")
        priority = col.get("priority", 0)
        cols.append(
            Column(
                name=str(col.get("name", "")),
                type=ctype,
                description=str(col.get("description", "")),
                cell=_cell(path, ctype),
                priority=priority if isinstance(priority, int) else 0,
                format=str(col.get("format", "")),
            )
        )
    return tuple(cols)


def _strings(v: Any) -> tuple[str, ...]:
    return tuple(x for x in _list(v) if isinstance(x, str))


def _dotless(path: Any) -> str:
    return path[1:] if isinstance(path, str) and path.startswith(".") else str(path or "")


def kinds_from_crd(crd: Obj) -> list[Kind]:
    """One custom Kind per served version of a (valid) CRD."""
    spec = _dict(crd.get("spec"))
    names = _dict(spec.get("names"))
    group = str(spec.get("group", ""))
    kind = str(names.get("kind", ""))
    out = []
    for v in _list(spec.get("versions")):
        if not isinstance(v, dict) or v.get("served") is not True:
            continue
        version = str(v.get("name", ""))
        schema = _dict(_dict(v.get("schema")).get("openAPIV3Schema"))
        sub = _dict(v.get("subresources"))
        subresources = {s for s in ("status", "scale") if isinstance(sub.get(s), dict)}
        scale = None
        if "scale" in subresources:
            sc = _dict(sub.get("scale"))
            scale = ScaleSpec(
                spec_replicas=_dotless(sc.get("specReplicasPath")),
                status_replicas=_dotless(sc.get("statusReplicasPath")),
                label_selector=_dotless(sc.get("labelSelectorPath")),
            )
        out.append(
            Kind(
                group=group,
                version=version,
                kind=kind,
                plural=str(names.get("plural", "")),
                singular=str(names.get("singular") or kind.lower()),
                namespaced=spec.get("scope") == "Namespaced",
                schema=wrap_schema(schema, group, version, kind),
                description=str(schema.get("description", "")),
                short_names=_strings(names.get("shortNames")),
                categories=_strings(names.get("categories")),
                subresources=frozenset(subresources),
                columns=printer_columns(v),
                scale=scale,
                custom=True,
            )
        )
    return out


# -- status ---------------------------------------------------------------------------------------


def accepted_names(crd: Obj) -> Obj:
    """spec.names with the server's defaults (singular, listKind) filled in."""
    names = _dict(_dict(crd.get("spec")).get("names"))
    kind = str(names.get("kind", ""))
    out: Obj = {
        "plural": names.get("plural", ""),
        "singular": names.get("singular") or kind.lower(),
        "kind": kind,
        "listKind": names.get("listKind") or f"{kind}List",
    }
    for key in ("shortNames", "categories"):
        if names.get(key):
            out[key] = list(_strings(names.get(key)))
    return out


def crd_status(crd: Obj, now_rfc3339: str) -> Obj:
    """The status after a create/update: names accepted, established, storage version recorded.

    Level-based: a condition already True keeps its lastTransitionTime, and storedVersions keeps
    every version ever stored (the storage version is appended if new).
    """
    old = _dict(crd.get("status"))
    old_conditions = {c.get("type"): c for c in _list(old.get("conditions")) if isinstance(c, dict)}

    def condition(ctype: str, reason: str, message: str) -> Obj:
        prev = _dict(old_conditions.get(ctype))
        since = prev.get("lastTransitionTime") if prev.get("status") == "True" else None
        return {
            "type": ctype,
            "status": "True",
            "lastTransitionTime": since or now_rfc3339,
            "reason": reason,
            "message": message,
        }

    stored = [v for v in _list(old.get("storedVersions")) if isinstance(v, str)]
    for v in _list(_dict(crd.get("spec")).get("versions")):
        if isinstance(v, dict) and v.get("storage") is True and v.get("name") not in stored:
            stored.append(str(v.get("name")))
    return {
        "conditions": [
            condition("NamesAccepted", "NoConflicts", "no conflicts found"),
            condition(
                "Established", "InitialNamesAccepted", "the initial names have been accepted"
            ),
        ],
        "acceptedNames": accepted_names(crd),
        "storedVersions": stored,
    }
