"""meta/v1 schemas every kind shares (ObjectMeta, LabelSelector, ...) and helpers for kind modules.

`object_schema` wraps a kind's spec/status with apiVersion, kind and metadata; `conditions` builds
the merge-by-`type` condition lists; the small readers (`get`, `label_selector_string`, `go_map`)
let Table cells and validators read objects the way kubectl's printers and apimachinery's
validation print them.

Invariants: the shared nodes here are never mutated; each named struct is built exactly once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from orchestrator.kube.errors import Cause
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.builders import (
    Schema,
    array,
    boolean,
    integer,
    obj,
    preserve_unknown,
    string,
    string_map,
    timestamp,
    with_description,
)
from orchestrator.kube.schema.names import quote
from orchestrator.kube.schema.proto import STRING, ptr, wire

META = "io.k8s.apimachinery.pkg.apis.meta.v1"

OWNER_REFERENCE = obj(
    "Names an object this one depends on; when every owner is gone the garbage collector "
    "deletes this object.",
    {
        "apiVersion": string("API version of the owner."),
        "kind": string("Kind of the owner."),
        "name": string("Name of the owner."),
        "uid": string("UID of the owner."),
        "controller": boolean("True on the one owner that manages this object."),
        "blockOwnerDeletion": boolean(
            "If true, a foreground deletion of the owner waits until this object is gone."
        ),
    },
    required=("apiVersion", "kind", "name", "uid"),
    name=f"{META}.OwnerReference",
    map_type="atomic",
    proto={
        "kind": 1,
        "name": 3,
        "uid": 4,
        "apiVersion": 5,
        "controller": ptr(6),
        "blockOwnerDeletion": ptr(7),
    },
)

MANAGED_FIELDS_ENTRY = obj(
    "Which fields one manager set, and how (server-side apply bookkeeping).",
    {
        "manager": string("The field manager (client) name."),
        "operation": string("Apply or Update.", enum=("Apply", "Update")),
        "apiVersion": string("The API version the fields are expressed in."),
        "time": timestamp("When the entry last changed."),
        "fieldsType": string('Format of fieldsV1; always "FieldsV1".'),
        "fieldsV1": preserve_unknown("The set of owned fields.", name=f"{META}.FieldsV1"),
        "subresource": string('The subresource written through, e.g. "status"; empty for main.'),
    },
    name=f"{META}.ManagedFieldsEntry",
    proto={
        "manager": 1,
        "operation": 2,
        "apiVersion": 3,
        "time": 4,
        "fieldsType": 6,
        "fieldsV1": 7,
        "subresource": 8,
    },
)

OBJECT_META = obj(
    "Standard object metadata: identity, labels, annotations, ownership and lifecycle.",
    {
        "name": string("Unique within the namespace (or cluster, for cluster-scoped kinds)."),
        "generateName": string("Prefix for a server-generated name when name is empty."),
        "namespace": string("The namespace of a namespaced object."),
        "uid": string("Unique id for this incarnation of the object; set by the server."),
        "resourceVersion": string("Opaque version of the object for optimistic concurrency."),
        "generation": integer("Bumped by the server on every spec change.", fmt="int64"),
        "creationTimestamp": timestamp("When the object was created; set by the server."),
        "deletionTimestamp": timestamp("When graceful deletion began; set by the server."),
        "deletionGracePeriodSeconds": integer(
            "Seconds granted for graceful termination.", fmt="int64"
        ),
        "labels": string_map("Key/value pairs for selecting and grouping objects."),
        "annotations": string_map("Key/value pairs for tools and controllers."),
        "finalizers": array(
            {"type": "string"},
            "Names that must be removed before the object is deleted.",
            patch_strategy="merge",
            list_type="set",
        ),
        "ownerReferences": array(
            OWNER_REFERENCE,
            "Objects this one belongs to.",
            patch_strategy="merge",
            merge_key="uid",
            list_type="map",
            map_keys=("uid",),
        ),
        "managedFields": array(
            MANAGED_FIELDS_ENTRY,
            "Field ownership for server-side apply; maintained by the server.",
            list_type="atomic",
        ),
    },
    name=f"{META}.ObjectMeta",
    proto={
        "name": 1,
        "generateName": 2,
        "namespace": 3,
        "selfLink": wire(4, STRING),
        "uid": 5,
        "resourceVersion": 6,
        "generation": 7,
        "creationTimestamp": 8,
        "deletionTimestamp": 9,
        "deletionGracePeriodSeconds": ptr(10),
        "labels": 11,
        "annotations": 12,
        "ownerReferences": 13,
        "finalizers": 14,
        "managedFields": 17,
    },
)

LIST_META = obj(
    "Metadata of a list: its resource version and continue token.",
    {
        "resourceVersion": string("The store version the list was read at."),
        "continue": string("Token for the next page."),
        "remainingItemCount": integer("Items not yet returned.", fmt="int64"),
    },
    name=f"{META}.ListMeta",
)

LABEL_SELECTOR_REQUIREMENT = obj(
    "One set-based label requirement.",
    {
        "key": string("The label key."),
        "operator": string(
            "How the key relates to the values.", enum=("In", "NotIn", "Exists", "DoesNotExist")
        ),
        "values": array(
            {"type": "string"},
            "Values for In/NotIn; must be empty for Exists/DoesNotExist.",
            list_type="atomic",
        ),
    },
    required=("key", "operator"),
    name=f"{META}.LabelSelectorRequirement",
    proto={"key": 1, "operator": 2, "values": 3},
)

LABEL_SELECTOR = obj(
    "Selects objects by labels; all terms must match. An empty selector matches everything.",
    {
        "matchLabels": string_map("Labels that must be present with exactly these values."),
        "matchExpressions": array(
            LABEL_SELECTOR_REQUIREMENT, "Set-based requirements.", list_type="atomic"
        ),
    },
    name=f"{META}.LabelSelector",
    map_type="atomic",
    proto={"matchLabels": 1, "matchExpressions": 2},
)


def label_selector(desc: str) -> Schema:
    return with_description(LABEL_SELECTOR, desc)


def object_meta(desc: str = "Standard object metadata.") -> Schema:
    return with_description(OBJECT_META, desc)


def condition(
    name: str,
    desc: str,
    *times: str,
    extra: Mapping[str, Schema] | None = None,
    proto: Mapping[str, Any] | None = None,
) -> Schema:
    """A condition struct: type, status, reason, message, lastTransitionTime plus `times`;
    `proto` gives its protobuf field numbers (see `schema.proto`)."""
    fields: dict[str, Schema] = {
        "type": string("The condition type, e.g. Ready."),
        "status": string("True, False or Unknown.", enum=("True", "False", "Unknown")),
        "reason": string("Machine-readable CamelCase reason for the last transition."),
        "message": string("Human-readable details."),
    }
    for t in ("lastTransitionTime", *times):
        fields[t] = timestamp(
            "When the status last changed."
            if t == "lastTransitionTime"
            else f"Condition time: {t}."
        )
    fields.update(extra or {})
    return obj(desc, fields, required=("type", "status"), name=name, proto=proto)


def conditions(item: Schema, desc: str = "Current observations of the object's state.") -> Schema:
    """A condition list: one entry per type, merged by `type`."""
    return array(
        item, desc, patch_strategy="merge", merge_key="type", list_type="map", map_keys=("type",)
    )


def object_schema(
    name: str,
    description: str,
    spec: Schema | None,
    status: Schema | None = None,
    *,
    fields: Mapping[str, Schema] | None = None,
    required: Sequence[str] = (),
    proto: Mapping[str, Any] | None = None,
) -> Schema:
    """A whole object: apiVersion, kind, metadata, then spec/status or kind-specific `fields`;
    `proto` gives the protobuf field numbers of the kinds that have a protobuf form."""
    props: dict[str, Schema] = {
        "apiVersion": string("The versioned schema of this object, e.g. apps/v1."),
        "kind": string("The kind of this object, e.g. Deployment."),
        "metadata": object_meta(),
    }
    if spec is not None:
        props["spec"] = spec
    if status is not None:
        props["status"] = status
    props.update(fields or {})
    return obj(description, props, required=required, name=name, proto=proto)


# -- readers used by Table cells, defaults and validation -------------------------------------


def get(o: Any, path: str, default: Any = None) -> Any:
    """`get(pod, "spec.nodeName")`: a dotted path into nested dicts, `default` when absent."""
    cur = o
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur or cur[part] is None:
            return default
        cur = cur[part]
    return cur


def sub(o: Any, key: str) -> Obj:
    """`o[key]` when it is a dict, else an empty dict (for reading only)."""
    v = o.get(key) if isinstance(o, dict) else None
    return v if isinstance(v, dict) else {}


def ensure(o: Obj, key: str) -> Obj:
    """`o[key]` as a dict, created (or replaced if null) when missing."""
    v = o.get(key)
    if not isinstance(v, dict):
        v = o[key] = {}
    return v


def dict_list(o: Any, key: str) -> list[Obj]:
    """`o[key]` when it is a list, keeping only its dict items (robust against bad input)."""
    v = o.get(key) if isinstance(o, dict) else None
    return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []


def format_labels(labels: Mapping[str, str] | None) -> str:
    """labels.FormatLabels: `a=1,b=2` sorted by key, `<none>` when empty."""
    if not labels:
        return "<none>"
    return ",".join(f"{k}={labels[k]}" for k in sorted(labels))


def label_selector_string(sel: Obj | None) -> str:
    """metav1.LabelSelectorAsSelector(sel).String(): requirements sorted by key, "" if empty."""
    if not isinstance(sel, dict):
        return "<none>"
    reqs: list[tuple[str, str]] = []
    for k, v in (sel.get("matchLabels") or {}).items():
        reqs.append((k, f"{k}={v}"))
    for e in dict_list(sel, "matchExpressions"):
        key, op = str(e.get("key", "")), e.get("operator")
        values = ",".join(sorted(str(v) for v in e.get("values") or []))
        text = {
            "In": f"{key} in ({values})",
            "NotIn": f"{key} notin ({values})",
            "Exists": key,
            "DoesNotExist": f"!{key}",
        }.get(str(op), f"{key} {op}")
        reqs.append((key, text))
    reqs.sort(key=lambda r: r[0])
    return ",".join(text for _, text in reqs)


def go_quote(s: str) -> str:
    """Go's %q for ordinary strings."""
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def go_map(m: Mapping[str, Any] | None) -> str:
    """Go's %#v of a map[string]string, as apimachinery prints Invalid values."""
    if not m:
        return "map[string]string(nil)" if m is None else "map[string]string{}"
    inner = ", ".join(f"{go_quote(k)}:{go_quote(str(m[k]))}" for k in sorted(m))
    return f"map[string]string{{{inner}}}"


def go_label_selector(sel: Obj | None) -> str:
    """Go's %#v of a *v1.LabelSelector, for `field is immutable` messages."""
    if not isinstance(sel, dict):
        return "(*v1.LabelSelector)(nil)"
    exprs = dict_list(sel, "matchExpressions")
    if exprs:
        parts = []
        for e in exprs:
            vals = e.get("values")
            vtext = (
                "[]string{" + ", ".join(go_quote(str(v)) for v in vals) + "}"
                if vals
                else "[]string(nil)"
            )
            parts.append(
                f"v1.LabelSelectorRequirement{{Key:{go_quote(str(e.get('key', '')))}, "
                f'Operator:"{e.get("operator", "")}", Values:{vtext}}}'
            )
        expr_text = "[]v1.LabelSelectorRequirement{" + ", ".join(parts) + "}"
    else:
        expr_text = "[]v1.LabelSelectorRequirement(nil)"
    labels = sel.get("matchLabels")
    return (
        f"v1.LabelSelector{{MatchLabels:{go_map(labels if isinstance(labels, dict) else None)}, "
        f"MatchExpressions:{expr_text}}}"
    )


def selector_matches(sel: Obj | None, labels: Mapping[str, str] | None) -> bool:
    """Whether a LabelSelector matches a label set (an empty selector matches everything)."""
    if not isinstance(sel, dict):
        return False
    labels = labels or {}
    for k, v in (sel.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in dict_list(sel, "matchExpressions"):
        key, op, values = e.get("key", ""), e.get("operator"), e.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


# -- field selectors and field errors ---------------------------------------------------------


def field_label(path: str) -> Callable[[Obj], str]:
    """A field selector extractor: the value at `path` as text, "" when absent."""

    def extract(o: Obj) -> str:
        v = get(o, path, "")
        return str(v).lower() if isinstance(v, bool) else str(v)

    return extract


def flag_label(path: str) -> Callable[[Obj], str]:
    """A field selector extractor for a boolean: "true" or "false" (absent)."""
    return lambda o: "true" if get(o, path) is True else "false"


def required(field: str, detail: str = "") -> Cause:
    return Cause(
        field, f"Required value: {detail}" if detail else "Required value", "FieldValueRequired"
    )


def invalid(field: str, value: Any, detail: str) -> Cause:
    return Cause(field, f"Invalid value: {quote(value)}: {detail}")


def duplicate(field: str, value: Any) -> Cause:
    return Cause(field, f"Duplicate value: {quote(value)}", "FieldValueDuplicate")


def not_found(field: str, value: Any) -> Cause:
    return Cause(field, f"Not found: {quote(value)}", "FieldValueNotFound")


def forbidden(field: str, detail: str) -> Cause:
    return Cause(field, f"Forbidden: {detail}", "FieldValueForbidden")


def port_range(field: str, value: Any) -> list[Cause]:
    if isinstance(value, int) and not isinstance(value, bool) and not 1 <= value <= 65535:
        return [invalid(field, value, "must be between 1 and 65535, inclusive")]
    return []
