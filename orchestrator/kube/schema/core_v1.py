"""core/v1 kinds: Namespace, Event, ConfigMap, Secret, ServiceAccount here; Pod, Node, Service
and Endpoints in their own modules. `CORE_V1_KINDS` lists them all.

Invariants: defaults are idempotent; a Secret's `stringData` is folded into `data` (base64) by its
default hook, so stored Secrets never carry `stringData`; ConfigMap and Secret `immutable: true`
freezes data and the flag itself.
"""

from __future__ import annotations

import base64

from orchestrator.kube.errors import Cause
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.builders import (
    array,
    boolean,
    integer,
    map_of,
    micro_timestamp,
    obj,
    string,
    string_map,
    strings,
    timestamp,
    with_description,
)
from orchestrator.kube.schema.columns import AGE, NAME, age_of, parse_rfc3339
from orchestrator.kube.schema.core_v1_container import V1
from orchestrator.kube.schema.core_v1_node import NODE
from orchestrator.kube.schema.core_v1_pod import POD
from orchestrator.kube.schema.core_v1_service import ENDPOINTS, OBJECT_REFERENCE, SERVICE
from orchestrator.kube.schema.core_v1_volume import LOCAL_OBJECT_REFERENCE
from orchestrator.kube.schema.kind import Column, Kind
from orchestrator.kube.schema.meta import (
    condition,
    conditions,
    dict_list,
    ensure,
    field_label,
    forbidden,
    get,
    invalid,
    object_schema,
    sub,
)
from orchestrator.kube.schema.proto import ptr

# -- Namespace -------------------------------------------------------------------------------


def _default_namespace(ns: Obj) -> None:
    spec = ensure(ns, "spec")
    if not isinstance(spec.get("finalizers"), list):
        spec["finalizers"] = ["kubernetes"]
    ensure(ns, "status").setdefault("phase", "Active")


NAMESPACE = Kind(
    group="",
    version="v1",
    kind="Namespace",
    plural="namespaces",
    singular="namespace",
    namespaced=False,
    schema=object_schema(
        f"{V1}.Namespace",
        "A scope for names; deleting it deletes everything in it.",
        obj(
            "Namespace settings.",
            {
                "finalizers": strings(
                    "Finalizers that must finish before the namespace is removed.",
                    list_type="atomic",
                )
            },
            name=f"{V1}.NamespaceSpec",
            proto={"finalizers": 1},
        ),
        obj(
            "Observed state of the namespace.",
            {
                "phase": string("Active or Terminating.", enum=("Active", "Terminating")),
                "conditions": conditions(
                    condition(
                        f"{V1}.NamespaceCondition",
                        "A namespace condition.",
                        proto={
                            "type": 1,
                            "status": 2,
                            "lastTransitionTime": 4,
                            "reason": 5,
                            "message": 6,
                        },
                    )
                ),
            },
            name=f"{V1}.NamespaceStatus",
            proto={"phase": 1, "conditions": 2},
        ),
        proto={"metadata": 1, "spec": 2, "status": 3},
    ),
    description="A scope for names.",
    short_names=("ns",),
    subresources=frozenset({"status"}),
    columns=(
        NAME,
        Column(
            "Status",
            "string",
            "Phase of the namespace.",
            lambda o, n: str(get(o, "status.phase", "")),
        ),
        AGE,
    ),
    field_labels={"status.phase": field_label("status.phase")},
    default=_default_namespace,
)


# -- Event -----------------------------------------------------------------------------------

EVENT_SOURCE = obj(
    "The component that reported the event.",
    {"component": string("Component name."), "host": string("Node name.")},
    name=f"{V1}.EventSource",
)

EVENT_SERIES = obj(
    "A series of repeats of the same event.",
    {
        "count": integer("Occurrences in the series."),
        "lastObservedTime": micro_timestamp("Time of the last occurrence."),
    },
    name=f"{V1}.EventSeries",
)


def _event_times(ev: Obj, now: float) -> tuple[str, str]:
    """(Last Seen, First Seen) as kubectl's printEvent computes them."""
    first_ts = ev.get("firstTimestamp")
    first = age_of(first_ts, now) if first_ts else age_of(ev.get("eventTime"), now)
    last = age_of(ev.get("lastTimestamp"), now) if ev.get("lastTimestamp") else first
    series = ev.get("series")
    if isinstance(series, dict):
        last = age_of(series.get("lastObservedTime"), now)
    return last, first


def _event_count(ev: Obj, now: float) -> int:
    series = ev.get("series")
    if isinstance(series, dict):
        return int(series.get("count") or 0)
    return int(ev.get("count") or 0) or 1


def _event_object(ev: Obj, now: float) -> str:
    ref = sub(ev, "involvedObject")
    kind = str(ref.get("kind", "")).lower()
    return f"{kind}/{ref['name']}" if ref.get("name") else kind


def _event_source(ev: Obj, now: float) -> str:
    component = get(ev, "source.component") or ev.get("reportingComponent") or ""
    host = get(ev, "source.host") or ev.get("reportingInstance") or ""
    return f"{component}, {host}" if host else str(component)


EVENT_COLUMNS = (
    Column(
        "Last Seen", "string", "Time since the last occurrence.", lambda o, n: _event_times(o, n)[0]
    ),
    Column("Type", "string", "Normal or Warning.", lambda o, n: str(o.get("type", ""))),
    Column(
        "Reason", "string", "Short machine-readable reason.", lambda o, n: str(o.get("reason", ""))
    ),
    Column("Object", "string", "The object the event is about.", _event_object),
    Column(
        "Subobject",
        "string",
        "The part of the object, e.g. a container.",
        lambda o, n: str(get(o, "involvedObject.fieldPath", "")),
        priority=1,
    ),
    Column("Source", "string", "Who reported the event.", _event_source, priority=1),
    Column(
        "Message",
        "string",
        "Human-readable description.",
        lambda o, n: str(o.get("message", "")).strip(),
    ),
    Column(
        "First Seen",
        "string",
        "Time since the first occurrence.",
        lambda o, n: _event_times(o, n)[1],
        priority=1,
    ),
    Column("Count", "string", "Number of occurrences.", _event_count, priority=1),
    Column(
        "Name",
        "string",
        "Name of the event object.",
        lambda o, n: str(get(o, "metadata.name", "")),
        priority=1,
        format="name",
    ),
)

EVENT_FIELD_LABELS = {
    f"involvedObject.{k}": field_label(f"involvedObject.{k}")
    for k in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")
}
EVENT_FIELD_LABELS.update(
    {
        "reason": field_label("reason"),
        "reportingComponent": field_label("reportingComponent"),
        "source": field_label("source.component"),
        "type": field_label("type"),
    }
)


def event_sort_key(ev: Obj) -> float:
    """When an event last happened (for sorting), 0 when unknown."""
    for ts in (ev.get("lastTimestamp"), get(ev, "series.lastObservedTime"), ev.get("eventTime")):
        if ts and (t := parse_rfc3339(str(ts))) is not None:
            return t
    return 0.0


EVENT = Kind(
    group="",
    version="v1",
    kind="Event",
    plural="events",
    singular="event",
    namespaced=True,
    schema=object_schema(
        f"{V1}.Event",
        "A report of something that happened to an object.",
        None,
        fields={
            "involvedObject": with_description(OBJECT_REFERENCE, "The object this is about."),
            "reason": string("Short CamelCase reason, e.g. Scheduled, Pulled, BackOff."),
            "message": string("Human-readable description."),
            "type": string("Normal or Warning."),
            "source": EVENT_SOURCE,
            "firstTimestamp": timestamp("First occurrence."),
            "lastTimestamp": timestamp("Most recent occurrence."),
            "count": integer("Number of occurrences."),
            "eventTime": micro_timestamp("When the event first happened (new-style events)."),
            "series": EVENT_SERIES,
            "action": string("What was done, or failed, e.g. Binding."),
            "related": with_description(OBJECT_REFERENCE, "A second object involved."),
            "reportingComponent": string("Controller that emitted the event."),
            "reportingInstance": string("Instance of that controller."),
        },
        required=("metadata", "involvedObject"),
    ),
    description="A report of something that happened to an object.",
    short_names=("ev",),
    columns=EVENT_COLUMNS,
    field_labels=EVENT_FIELD_LABELS,
)

# -- ConfigMap and Secret --------------------------------------------------------------------


def validate_immutable_data(new: Obj, old: Obj | None) -> list[Cause]:
    """ConfigMap/Secret: once `immutable: true`, data and the flag itself cannot change."""
    if old is None or old.get("immutable") is not True:
        return []
    return [
        forbidden(field, "field is immutable when `immutable` is set")
        for field in ("immutable", "data", "binaryData", "type")
        if new.get(field) != old.get(field)
    ]


MAX_DATA_BYTES = 1024 * 1024  # corev1.MaxSecretSize: a ConfigMap's or Secret's data, summed
_TOO_LONG = f"Too long: must have at most {MAX_DATA_BYTES} bytes"


def _utf8_size(text: str) -> int:
    # len() is a lower bound; encode only when it might matter (big values are rare).
    return len(text) if text.isascii() else len(text.encode("utf-8", "replace"))


def _base64_size(text: str) -> int:
    """The decoded size of a base64 value (already checked by the schema's `byte` format)."""
    return len(text) * 3 // 4 - text[-2:].count("=")


def validate_config_map(new: Obj, old: Obj | None) -> list[Cause]:
    """Immutability, and the data size limit as `ValidateConfigMap`: keys and values of
    `data` and `binaryData` (decoded) together at most 1 MiB."""
    causes = validate_immutable_data(new, old)
    total = 0
    for k, v in sub(new, "data").items():
        total += _utf8_size(str(k)) + (_utf8_size(v) if isinstance(v, str) else 0)
    for k, v in sub(new, "binaryData").items():
        total += _utf8_size(str(k)) + (_base64_size(v) if isinstance(v, str) else 0)
    if total > MAX_DATA_BYTES:
        causes.append(Cause("data", _TOO_LONG, "FieldValueTooLong"))
    return causes


def validate_secret(new: Obj, old: Obj | None) -> list[Cause]:
    """Immutability (the `type` always), and the data size limit as `ValidateSecret`: keys and
    decoded values of `data` (stringData is folded in by then) together at most 1 MiB."""
    causes = validate_immutable_data(new, old)
    if old is not None and new.get("type") != old.get("type") and old.get("immutable") is not True:
        causes.append(invalid("type", new.get("type"), "field is immutable"))
    total = 0
    for k, v in sub(new, "data").items():
        total += _utf8_size(str(k)) + (_base64_size(v) if isinstance(v, str) else 0)
    if total > MAX_DATA_BYTES:
        causes.append(Cause("data", _TOO_LONG, "FieldValueTooLong"))
    return causes


CONFIG_MAP = Kind(
    group="",
    version="v1",
    kind="ConfigMap",
    plural="configmaps",
    singular="configmap",
    namespaced=True,
    schema=object_schema(
        f"{V1}.ConfigMap",
        "Non-secret configuration as key/value pairs.",
        None,
        fields={
            "data": string_map("UTF-8 values by key."),
            "binaryData": map_of(
                {"type": "string", "format": "byte"}, "Binary values by key, base64-encoded."
            ),
            "immutable": boolean("If true, the data can no longer change."),
        },
        proto={"metadata": 1, "data": 2, "binaryData": 3, "immutable": ptr(4)},
    ),
    description="Non-secret configuration as key/value pairs.",
    short_names=("cm",),
    columns=(
        NAME,
        Column(
            "Data",
            "integer",
            "Number of keys.",
            lambda o, n: len(sub(o, "data")) + len(sub(o, "binaryData")),
        ),
        AGE,
    ),
    validate=validate_config_map,
)


def _default_secret(secret: Obj) -> None:
    secret.setdefault("type", "Opaque")
    string_data = secret.pop("stringData", None)
    if isinstance(string_data, dict) and string_data:
        data = ensure(secret, "data")
        for k, v in string_data.items():
            data[k] = base64.b64encode(str(v).encode()).decode()


SECRET = Kind(
    group="",
    version="v1",
    kind="Secret",
    plural="secrets",
    singular="secret",
    namespaced=True,
    schema=object_schema(
        f"{V1}.Secret",
        "Sensitive data (passwords, tokens, keys) as key/value pairs.",
        None,
        fields={
            "data": map_of({"type": "string", "format": "byte"}, "Values by key, base64-encoded."),
            "stringData": string_map("Write-only plain-text values, merged into data."),
            "type": string("How the data is used; Opaque by default."),
            "immutable": boolean("If true, the data can no longer change."),
        },
        proto={"metadata": 1, "data": 2, "type": 3, "stringData": 4, "immutable": ptr(5)},
    ),
    description="Sensitive data as key/value pairs.",
    columns=(
        NAME,
        Column("Type", "string", "The secret type.", lambda o, n: str(o.get("type", ""))),
        Column("Data", "integer", "Number of keys.", lambda o, n: len(sub(o, "data"))),
        AGE,
    ),
    field_labels={"type": field_label("type")},
    validate=validate_secret,
    default=_default_secret,
)

# -- ServiceAccount --------------------------------------------------------------------------

SERVICE_ACCOUNT = Kind(
    group="",
    version="v1",
    kind="ServiceAccount",
    plural="serviceaccounts",
    singular="serviceaccount",
    namespaced=True,
    schema=object_schema(
        f"{V1}.ServiceAccount",
        "An identity for processes that run in pods.",
        None,
        fields={
            "secrets": array(
                with_description(OBJECT_REFERENCE, "A secret."),
                "Secrets pods of this account may use.",
                patch_strategy="merge",
                merge_key="name",
                list_type="atomic",
            ),
            "imagePullSecrets": array(
                LOCAL_OBJECT_REFERENCE, "Secrets for pulling images.", list_type="atomic"
            ),
            "automountServiceAccountToken": boolean("Mount the account's token into pods."),
        },
        proto={
            "metadata": 1,
            "secrets": 2,
            "imagePullSecrets": 3,
            "automountServiceAccountToken": ptr(4),
        },
    ),
    description="An identity for processes that run in pods.",
    short_names=("sa",),
    columns=(
        NAME,
        Column(
            "Secrets", "integer", "Number of secrets.", lambda o, n: len(dict_list(o, "secrets"))
        ),
        AGE,
    ),
)

CORE_V1_KINDS: list[Kind] = [
    NAMESPACE,
    POD,
    NODE,
    EVENT,
    CONFIG_MAP,
    SECRET,
    SERVICE,
    ENDPOINTS,
    SERVICE_ACCOUNT,
]
