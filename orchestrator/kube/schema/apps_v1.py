"""apps/v1 workload kinds: Deployment, ReplicaSet, DaemonSet, StatefulSet, as `APPS_V1_KINDS`.

Each has a required LabelSelector that must match its pod template's labels and may not change
after creation, a pod template defaulted and validated exactly like a Pod's spec (under
`spec.template.spec`), and a status written by its controller (conditions merge by `type`).
Deployment's `strategy` is a `retainKeys` union. Deployment, ReplicaSet and StatefulSet serve the
scale subresource (selector from `spec.selector`); DaemonSet does not.

Invariants: defaults are idempotent; Table cells follow kubectl's printers (`printDeployment`,
`printReplicaSet`, `printDaemonSet`, `printStatefulSet`).
"""

from __future__ import annotations

from collections.abc import Callable

from orchestrator.kube.errors import Cause
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.builders import (
    Schema,
    array,
    boolean,
    int_or_string,
    integer,
    obj,
    string,
    with_description,
)
from orchestrator.kube.schema.columns import AGE, NAME
from orchestrator.kube.schema.core_v1_pod import default_pod_template, validate_pod_spec
from orchestrator.kube.schema.core_v1_pod_schema import POD_TEMPLATE_SPEC
from orchestrator.kube.schema.kind import Column, Kind, ScaleSpec
from orchestrator.kube.schema.meta import (
    condition,
    conditions,
    dict_list,
    ensure,
    format_labels,
    get,
    go_label_selector,
    go_map,
    label_selector,
    label_selector_string,
    object_schema,
    required,
    selector_matches,
    sub,
)
from orchestrator.kube.schema.proto import INT32, STRING, ProtoField, ptr, wire

APPS = "io.k8s.api.apps.v1"


def _replicas(desc: str) -> Schema:
    return integer(desc, minimum=0)


def _common_spec(kind: str) -> dict[str, Schema]:
    return {
        "selector": label_selector(f"Which pods belong to the {kind}; must match the template."),
        "template": with_description(POD_TEMPLATE_SPEC, "The pods to create."),
        "minReadySeconds": integer("Seconds a new pod must be ready to count as available."),
    }


def _history(desc: str = "Old revisions to keep for rollback; 10 by default.") -> Schema:
    return integer(desc, minimum=0)


def _conditions(kind: str, *times: str, proto: dict[str, ProtoField] | None = None) -> Schema:
    return conditions(
        condition(f"{APPS}.{kind}Condition", f"A {kind} condition.", *times, proto=proto)
    )


# -- Deployment ------------------------------------------------------------------------------

DEPLOYMENT_SPEC = obj(
    "The desired state: a replicated pod template and how to roll out changes to it.",
    {
        "replicas": _replicas("Desired number of pods; 1 by default."),
        **_common_spec("deployment"),
        "strategy": obj(
            "How old pods are replaced by new ones.",
            {
                "type": string(
                    "Recreate or RollingUpdate (default).", enum=("Recreate", "RollingUpdate")
                ),
                "rollingUpdate": obj(
                    "Bounds for a rolling update.",
                    {
                        "maxUnavailable": int_or_string(
                            "Pods that may be unavailable during the update: a number or "
                            "percent; 25% by default."
                        ),
                        "maxSurge": int_or_string(
                            "Pods that may exist above the desired count: a number or percent; "
                            "25% by default."
                        ),
                    },
                    name=f"{APPS}.RollingUpdateDeployment",
                    proto={"maxUnavailable": ptr(1), "maxSurge": ptr(2)},
                ),
            },
            name=f"{APPS}.DeploymentStrategy",
            patch_strategy="retainKeys",
            proto={"type": 1, "rollingUpdate": 2},
        ),
        "revisionHistoryLimit": _history(),
        "paused": boolean("Stop rolling out template changes."),
        "progressDeadlineSeconds": integer(
            "Seconds without progress before the rollout is reported failed; 600 by default."
        ),
    },
    required=("selector", "template"),
    name=f"{APPS}.DeploymentSpec",
    proto={
        "replicas": ptr(1),
        "selector": 2,
        "template": 3,
        "strategy": 4,
        "minReadySeconds": 5,
        "revisionHistoryLimit": ptr(6),
        "paused": 7,
        "progressDeadlineSeconds": ptr(9),
        "podReplacementPolicy": wire(10, STRING, keep=True),
    },
)

DEPLOYMENT_STATUS = obj(
    "Observed state of the deployment, written by its controller.",
    {
        "observedGeneration": integer("Generation the controller last acted on.", fmt="int64"),
        "replicas": integer("Pods targeted by this deployment."),
        "updatedReplicas": integer("Pods with the current template."),
        "readyReplicas": integer("Pods that are ready."),
        "availableReplicas": integer("Pods ready for at least minReadySeconds."),
        "unavailableReplicas": integer("Pods still needed for full availability."),
        "conditions": _conditions(
            "Deployment",
            "lastUpdateTime",
            proto={
                "type": 1,
                "status": 2,
                "reason": 4,
                "message": 5,
                "lastUpdateTime": 6,
                "lastTransitionTime": 7,
            },
        ),
        "collisionCount": integer("Hash collisions of the template; bumped to rename."),
    },
    name=f"{APPS}.DeploymentStatus",
    proto={
        "observedGeneration": 1,
        "replicas": 2,
        "updatedReplicas": 3,
        "availableReplicas": 4,
        "unavailableReplicas": 5,
        "conditions": 6,
        "readyReplicas": 7,
        "collisionCount": ptr(8),
        "terminatingReplicas": wire(9, INT32, keep=True),
    },
)


def _default_template_owner(o: Obj) -> Obj:
    spec = ensure(o, "spec")
    default_pod_template(ensure(spec, "template"))
    return spec


def default_deployment(d: Obj) -> None:
    spec = _default_template_owner(d)
    spec.setdefault("replicas", 1)
    strategy = ensure(spec, "strategy")
    strategy.setdefault("type", "RollingUpdate")
    if strategy["type"] == "RollingUpdate":
        rolling = ensure(strategy, "rollingUpdate")
        rolling.setdefault("maxUnavailable", "25%")
        rolling.setdefault("maxSurge", "25%")
    spec.setdefault("revisionHistoryLimit", 10)
    spec.setdefault("progressDeadlineSeconds", 600)


def default_replica_set(rs: Obj) -> None:
    _default_template_owner(rs).setdefault("replicas", 1)


def default_daemon_set(ds: Obj) -> None:
    spec = _default_template_owner(ds)
    strategy = ensure(spec, "updateStrategy")
    strategy.setdefault("type", "RollingUpdate")
    if strategy["type"] == "RollingUpdate":
        rolling = ensure(strategy, "rollingUpdate")
        rolling.setdefault("maxUnavailable", 1)
        rolling.setdefault("maxSurge", 0)
    spec.setdefault("revisionHistoryLimit", 10)


def default_stateful_set(sts: Obj) -> None:
    spec = _default_template_owner(sts)
    spec.setdefault("replicas", 1)
    spec.setdefault("podManagementPolicy", "OrderedReady")
    spec.setdefault("serviceName", "")
    strategy = ensure(spec, "updateStrategy")
    strategy.setdefault("type", "RollingUpdate")
    if strategy["type"] == "RollingUpdate":
        ensure(strategy, "rollingUpdate").setdefault("partition", 0)
    spec.setdefault("revisionHistoryLimit", 10)
    retention = ensure(spec, "persistentVolumeClaimRetentionPolicy")
    retention.setdefault("whenDeleted", "Retain")
    retention.setdefault("whenScaled", "Retain")


# -- validation ------------------------------------------------------------------------------


def validate_workload(new: Obj, old: Obj | None, *, noun: str) -> list[Cause]:
    """Selector present, non-empty and matching the template labels; selector immutable; the pod
    template valid as a pod spec."""
    spec = sub(new, "spec")
    causes: list[Cause] = []
    selector = spec.get("selector")
    if not isinstance(selector, dict):
        causes.append(required("spec.selector"))
    elif not selector.get("matchLabels") and not selector.get("matchExpressions"):
        causes.append(
            Cause(
                "spec.selector",
                f"Invalid value: {go_label_selector(selector)}: empty selector is invalid for "
                "deployment",
            )
        )
    template = spec.get("template")
    if isinstance(template, dict):
        labels = get(template, "metadata.labels")
        if isinstance(selector, dict) and not selector_matches(selector, labels):
            causes.append(
                Cause(
                    "spec.template.metadata.labels",
                    f"Invalid value: {go_map(labels if isinstance(labels, dict) else None)}: "
                    "`selector` does not match template `labels`",
                )
            )
        causes.extend(validate_pod_spec(template.get("spec"), "spec.template.spec"))
        policy = get(template, "spec.restartPolicy")
        if policy is not None and policy != "Always":
            causes.append(
                Cause(
                    "spec.template.spec.restartPolicy",
                    f'Unsupported value: "{policy}": supported values: "Always"',
                    "FieldValueNotSupported",
                )
            )
    else:
        causes.append(required("spec.template"))
    if old is not None:
        old_selector = get(old, "spec.selector")
        if isinstance(selector, dict) and selector != old_selector:
            causes.append(
                Cause(
                    "spec.selector",
                    f"Invalid value: {go_label_selector(selector)}: field is immutable",
                )
            )
    return causes


def _validator(noun: str) -> Callable[[Obj, Obj | None], list[Cause]]:
    def validate(new: Obj, old: Obj | None) -> list[Cause]:
        return validate_workload(new, old, noun=noun)

    return validate


# -- tables ----------------------------------------------------------------------------------


def _int(path: str) -> Callable[[Obj, float], int]:
    return lambda o, n: int(get(o, path, 0) or 0)


def _containers(o: Obj, n: float) -> str:
    return ",".join(
        str(c.get("name", "")) for c in dict_list(get(o, "spec.template.spec"), "containers")
    )


def _images(o: Obj, n: float) -> str:
    return ",".join(
        str(c.get("image", "")) for c in dict_list(get(o, "spec.template.spec"), "containers")
    )


def _selector(o: Obj, n: float) -> str:
    return label_selector_string(get(o, "spec.selector"))


WIDE_COLUMNS = (
    Column("Containers", "string", "Names of the template's containers.", _containers, priority=1),
    Column("Images", "string", "Images of the template's containers.", _images, priority=1),
    Column("Selector", "string", "Label selector for the pods.", _selector, priority=1),
)


def _ready_of_desired(o: Obj, n: float) -> str:
    return f"{int(get(o, 'status.readyReplicas', 0) or 0)}/{int(get(o, 'spec.replicas', 0) or 0)}"


DEPLOYMENT = Kind(
    group="apps",
    version="v1",
    kind="Deployment",
    plural="deployments",
    singular="deployment",
    namespaced=True,
    schema=object_schema(
        f"{APPS}.Deployment",
        "Runs a replicated set of pods and rolls out changes to them declaratively.",
        DEPLOYMENT_SPEC,
        DEPLOYMENT_STATUS,
        proto={"metadata": 1, "spec": 2, "status": 3},
    ),
    description="Runs a replicated set of pods and rolls out changes declaratively.",
    short_names=("deploy",),
    categories=("all",),
    subresources=frozenset({"status", "scale"}),
    columns=(
        NAME,
        Column("Ready", "string", "Ready pods out of desired pods.", _ready_of_desired),
        Column(
            "Up-to-date",
            "integer",
            "Pods with the current template.",
            _int("status.updatedReplicas"),
        ),
        Column(
            "Available", "integer", "Pods available to serve.", _int("status.availableReplicas")
        ),
        AGE,
        *WIDE_COLUMNS,
    ),
    scale=ScaleSpec(label_selector="spec.selector"),
    validate=_validator("deployment"),
    default=default_deployment,
)

# -- ReplicaSet ------------------------------------------------------------------------------

REPLICA_SET = Kind(
    group="apps",
    version="v1",
    kind="ReplicaSet",
    plural="replicasets",
    singular="replicaset",
    namespaced=True,
    schema=object_schema(
        f"{APPS}.ReplicaSet",
        "Keeps a number of identical pods running; normally managed by a Deployment.",
        obj(
            "The desired pods.",
            {
                "replicas": _replicas("Desired number of pods; 1 by default."),
                **_common_spec("replica set"),
            },
            required=("selector",),
            name=f"{APPS}.ReplicaSetSpec",
        ),
        obj(
            "Observed state of the replica set.",
            {
                "replicas": integer("Pods that exist."),
                "fullyLabeledReplicas": integer("Pods whose labels match the template's."),
                "readyReplicas": integer("Pods that are ready."),
                "availableReplicas": integer("Pods ready for at least minReadySeconds."),
                "observedGeneration": integer("Generation last acted on.", fmt="int64"),
                "conditions": _conditions("ReplicaSet"),
            },
            required=("replicas",),
            name=f"{APPS}.ReplicaSetStatus",
        ),
    ),
    description="Keeps a number of identical pods running.",
    short_names=("rs",),
    categories=("all",),
    subresources=frozenset({"status", "scale"}),
    columns=(
        NAME,
        Column("Desired", "integer", "Desired pods.", _int("spec.replicas")),
        Column("Current", "integer", "Pods that exist.", _int("status.replicas")),
        Column("Ready", "integer", "Pods that are ready.", _int("status.readyReplicas")),
        AGE,
        *WIDE_COLUMNS,
    ),
    field_labels={"status.replicas": lambda o: str(get(o, "status.replicas", 0) or 0)},
    scale=ScaleSpec(label_selector="spec.selector"),
    validate=_validator("deployment"),  # sic: upstream words it so for replica sets
    default=default_replica_set,
)

# -- DaemonSet -------------------------------------------------------------------------------

DAEMON_SET = Kind(
    group="apps",
    version="v1",
    kind="DaemonSet",
    plural="daemonsets",
    singular="daemonset",
    namespaced=True,
    schema=object_schema(
        f"{APPS}.DaemonSet",
        "Runs one copy of a pod on every eligible node.",
        obj(
            "The pod to run on each node and how to update it.",
            {
                **_common_spec("daemon set"),
                "updateStrategy": obj(
                    "How pods are replaced when the template changes.",
                    {
                        "type": string(
                            "RollingUpdate (default) or OnDelete.",
                            enum=("RollingUpdate", "OnDelete"),
                        ),
                        "rollingUpdate": obj(
                            "Bounds for a rolling update.",
                            {
                                "maxUnavailable": int_or_string(
                                    "Nodes whose pod may be unavailable; 1 by default."
                                ),
                                "maxSurge": int_or_string(
                                    "Nodes that may run an extra new pod; 0 by default."
                                ),
                            },
                            name=f"{APPS}.RollingUpdateDaemonSet",
                        ),
                    },
                    name=f"{APPS}.DaemonSetUpdateStrategy",
                ),
                "revisionHistoryLimit": _history(),
            },
            required=("selector", "template"),
            name=f"{APPS}.DaemonSetSpec",
        ),
        obj(
            "Observed state of the daemon set.",
            {
                "currentNumberScheduled": integer("Nodes running a pod that should."),
                "desiredNumberScheduled": integer("Nodes that should run a pod."),
                "numberMisscheduled": integer("Nodes running a pod that should not."),
                "numberReady": integer("Nodes whose pod is ready."),
                "updatedNumberScheduled": integer("Nodes running the current template."),
                "numberAvailable": integer("Nodes whose pod is available."),
                "numberUnavailable": integer("Nodes whose pod is not available."),
                "observedGeneration": integer("Generation last acted on.", fmt="int64"),
                "collisionCount": integer("Template hash collisions."),
                "conditions": _conditions("DaemonSet"),
            },
            required=(
                "currentNumberScheduled",
                "desiredNumberScheduled",
                "numberMisscheduled",
                "numberReady",
            ),
            name=f"{APPS}.DaemonSetStatus",
        ),
    ),
    description="Runs one copy of a pod on every eligible node.",
    short_names=("ds",),
    categories=("all",),
    subresources=frozenset({"status"}),
    columns=(
        NAME,
        Column(
            "Desired",
            "integer",
            "Nodes that should run the pod.",
            _int("status.desiredNumberScheduled"),
        ),
        Column(
            "Current", "integer", "Nodes running the pod.", _int("status.currentNumberScheduled")
        ),
        Column("Ready", "integer", "Nodes whose pod is ready.", _int("status.numberReady")),
        Column(
            "Up-to-date",
            "integer",
            "Nodes running the current template.",
            _int("status.updatedNumberScheduled"),
        ),
        Column(
            "Available", "integer", "Nodes whose pod is available.", _int("status.numberAvailable")
        ),
        Column(
            "Node Selector",
            "string",
            "The template's node selector.",
            lambda o, n: format_labels(get(o, "spec.template.spec.nodeSelector")),
        ),
        AGE,
        *WIDE_COLUMNS,
    ),
    validate=_validator("daemonset"),
    default=default_daemon_set,
)

# -- StatefulSet -----------------------------------------------------------------------------

STATEFUL_SET = Kind(
    group="apps",
    version="v1",
    kind="StatefulSet",
    plural="statefulsets",
    singular="statefulset",
    namespaced=True,
    schema=object_schema(
        f"{APPS}.StatefulSet",
        "Runs pods with stable names and storage, created and updated in order.",
        obj(
            "The desired pods and how they are managed.",
            {
                "replicas": _replicas("Desired number of pods; 1 by default."),
                **_common_spec("stateful set"),
                "serviceName": string("Headless service giving the pods stable DNS names."),
                "podManagementPolicy": string(
                    "OrderedReady (default) or Parallel pod creation.",
                    enum=("OrderedReady", "Parallel"),
                ),
                "updateStrategy": obj(
                    "How pods are replaced when the template changes.",
                    {
                        "type": string(
                            "RollingUpdate (default) or OnDelete.",
                            enum=("RollingUpdate", "OnDelete"),
                        ),
                        "rollingUpdate": obj(
                            "Bounds for a rolling update.",
                            {
                                "partition": integer(
                                    "Only pods with an ordinal at least this are updated.",
                                    minimum=0,
                                ),
                                "maxUnavailable": int_or_string("Pods that may be unavailable."),
                            },
                            name=f"{APPS}.RollingUpdateStatefulSetStrategy",
                        ),
                    },
                    name=f"{APPS}.StatefulSetUpdateStrategy",
                ),
                "revisionHistoryLimit": _history(),
                "volumeClaimTemplates": array(
                    {
                        "type": "object",
                        "description": "A PersistentVolumeClaim template.",
                        "x-kubernetes-embedded-resource": True,
                        "x-kubernetes-preserve-unknown-fields": True,
                    },
                    "Claims each pod gets, named <claim>-<pod>.",
                    list_type="atomic",
                ),
                "persistentVolumeClaimRetentionPolicy": obj(
                    "What happens to claims when pods go away.",
                    {
                        "whenDeleted": string("Retain or Delete.", enum=("Retain", "Delete")),
                        "whenScaled": string("Retain or Delete.", enum=("Retain", "Delete")),
                    },
                    name=f"{APPS}.StatefulSetPersistentVolumeClaimRetentionPolicy",
                ),
                "ordinals": obj(
                    "Numbering of the pods.",
                    {"start": integer("First ordinal; 0 by default.", minimum=0)},
                    name=f"{APPS}.StatefulSetOrdinals",
                ),
            },
            required=("selector", "template"),
            name=f"{APPS}.StatefulSetSpec",
        ),
        obj(
            "Observed state of the stateful set.",
            {
                "observedGeneration": integer("Generation last acted on.", fmt="int64"),
                "replicas": integer("Pods that exist."),
                "readyReplicas": integer("Pods that are ready."),
                "currentReplicas": integer("Pods at currentRevision."),
                "updatedReplicas": integer("Pods at updateRevision."),
                "availableReplicas": integer("Pods ready for at least minReadySeconds."),
                "currentRevision": string("Revision of the pods before the update."),
                "updateRevision": string("Revision being rolled out."),
                "collisionCount": integer("Template hash collisions."),
                "conditions": _conditions("StatefulSet"),
            },
            required=("replicas",),
            name=f"{APPS}.StatefulSetStatus",
        ),
    ),
    description="Runs pods with stable names and storage.",
    short_names=("sts",),
    categories=("all",),
    subresources=frozenset({"status", "scale"}),
    columns=(
        NAME,
        Column("Ready", "string", "Ready pods out of desired pods.", _ready_of_desired),
        AGE,
        *WIDE_COLUMNS[:2],
    ),
    scale=ScaleSpec(label_selector="spec.selector"),
    validate=_validator("statefulset"),
    default=default_stateful_set,
)

APPS_V1_KINDS: list[Kind] = [DEPLOYMENT, REPLICA_SET, DAEMON_SET, STATEFUL_SET]
