"""core/v1 Pod schemas: PodSpec, PodTemplateSpec and PodStatus, as data.

The patch metadata follows the `k8s.io/api` struct tags (kubectl-compat.md §7): containers and
imagePullSecrets merge by `name`; volumes `merge,retainKeys` by `name`; hostAliases and pod IPs
by `ip`; topologySpreadConstraints by `topologyKey`; tolerations and readinessGates are atomic.
Container schemas live in `core_v1_container`, volumes in
`core_v1_volume`. Workload kinds embed `POD_TEMPLATE_SPEC`.

Invariant: every named struct here is built once and shared; never mutate these dicts.
"""

from __future__ import annotations

from orchestrator.kube.schema.builders import (
    Schema,
    array,
    boolean,
    integer,
    obj,
    preserve_unknown,
    quantity_map,
    string,
    string_map,
    strings,
    timestamp,
    with_description,
)
from orchestrator.kube.schema.core_v1_container import CONTAINER, POD_SECURITY_CONTEXT, V1, by_name
from orchestrator.kube.schema.core_v1_volume import LOCAL_OBJECT_REFERENCE, VOLUME
from orchestrator.kube.schema.meta import condition, conditions, label_selector, object_meta
from orchestrator.kube.schema.proto import (
    BOOL,
    INT64,
    MESSAGE,
    STRING,
    message,
    ptr,
    wire,
)

# -- scheduling ------------------------------------------------------------------------------

NODE_SELECTOR_REQUIREMENT = obj(
    "A requirement on a node label or field.",
    {
        "key": string("Label key or field name."),
        "operator": string(
            "How the key relates to the values.",
            enum=("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"),
        ),
        "values": strings("Values; a single integer for Gt/Lt, none for Exists/DoesNotExist."),
    },
    required=("key", "operator"),
    name=f"{V1}.NodeSelectorRequirement",
)

NODE_SELECTOR_TERM = obj(
    "Requirements that must all hold (terms are ORed).",
    {
        "matchExpressions": array(
            NODE_SELECTOR_REQUIREMENT, "Requirements on node labels.", list_type="atomic"
        ),
        "matchFields": array(
            NODE_SELECTOR_REQUIREMENT, "Requirements on node fields.", list_type="atomic"
        ),
    },
    name=f"{V1}.NodeSelectorTerm",
    map_type="atomic",
)

NODE_AFFINITY = obj(
    "Node constraints for scheduling.",
    {
        "requiredDuringSchedulingIgnoredDuringExecution": obj(
            "The node must match one of these terms.",
            {
                "nodeSelectorTerms": array(
                    NODE_SELECTOR_TERM, "Terms, ORed together.", list_type="atomic"
                )
            },
            required=("nodeSelectorTerms",),
            name=f"{V1}.NodeSelector",
            map_type="atomic",
        ),
        "preferredDuringSchedulingIgnoredDuringExecution": array(
            obj(
                "A weighted preference.",
                {
                    "weight": integer("Weight, 1-100.", minimum=1, maximum=100),
                    "preference": with_description(NODE_SELECTOR_TERM, "The preferred term."),
                },
                required=("weight", "preference"),
                name=f"{V1}.PreferredSchedulingTerm",
            ),
            "Preferred terms; nodes score by the weights they match.",
            list_type="atomic",
        ),
    },
    name=f"{V1}.NodeAffinity",
)

AFFINITY = obj(
    "Scheduling constraints relative to nodes and other pods.",
    {
        "nodeAffinity": NODE_AFFINITY,
        "podAffinity": preserve_unknown("Co-locate with pods matching these terms."),
        "podAntiAffinity": preserve_unknown("Keep apart from pods matching these terms."),
    },
    name=f"{V1}.Affinity",
)

TOLERATION = obj(
    "Lets the pod schedule onto (or stay on) nodes with a matching taint.",
    {
        "key": string("Taint key; empty with Exists matches every taint."),
        "operator": string("Equal (default) or Exists.", enum=("Exists", "Equal")),
        "value": string("Taint value for Equal."),
        "effect": string(
            "Taint effect to match; empty matches all.",
            enum=("NoSchedule", "PreferNoSchedule", "NoExecute"),
        ),
        "tolerationSeconds": integer(
            "For NoExecute: how long the pod stays after the taint appears.", fmt="int64"
        ),
    },
    name=f"{V1}.Toleration",
    proto={"key": 1, "operator": 2, "value": 3, "effect": 4, "tolerationSeconds": ptr(5)},
)

TOPOLOGY_SPREAD_CONSTRAINT = obj(
    "Spread matching pods evenly across a topology domain.",
    {
        "maxSkew": integer("Largest allowed difference in matching pods between domains."),
        "topologyKey": string("Node label whose values define the domains."),
        "whenUnsatisfiable": string(
            "What to do when the skew cannot be met.", enum=("DoNotSchedule", "ScheduleAnyway")
        ),
        "labelSelector": label_selector("Which pods count."),
        "minDomains": integer("Minimum number of eligible domains."),
        "matchLabelKeys": strings("Pod label keys whose values further restrict counted pods."),
        "nodeAffinityPolicy": string("Honor or Ignore node affinity.", enum=("Honor", "Ignore")),
        "nodeTaintsPolicy": string("Honor or Ignore node taints.", enum=("Honor", "Ignore")),
    },
    required=("maxSkew", "topologyKey", "whenUnsatisfiable"),
    name=f"{V1}.TopologySpreadConstraint",
)

HOST_ALIAS = obj(
    "Extra /etc/hosts entries for one IP.",
    {"ip": string("The IP address."), "hostnames": strings("Host names for the IP.")},
    required=("ip",),
    name=f"{V1}.HostAlias",
    proto={"ip": 1, "hostnames": 2},
)

POD_SPEC = obj(
    "What a pod runs and where.",
    {
        "containers": by_name(CONTAINER, "The containers; at least one."),
        "initContainers": by_name(CONTAINER, "Containers run to completion, in order, first."),
        "volumes": array(
            VOLUME,
            "Volumes the containers can mount.",
            patch_strategy="merge,retainKeys",
            merge_key="name",
            list_type="map",
            map_keys=("name",),
        ),
        "restartPolicy": string(
            "Restart containers on exit: Always (default), OnFailure or Never.",
            enum=("Always", "OnFailure", "Never"),
        ),
        "terminationGracePeriodSeconds": integer(
            "Seconds between SIGTERM and SIGKILL on deletion; 30 by default.", fmt="int64"
        ),
        "activeDeadlineSeconds": integer(
            "Seconds the pod may run before it is failed.", fmt="int64", minimum=1
        ),
        "dnsPolicy": string(
            "How the pod's DNS is configured; ClusterFirst by default.",
            enum=("ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"),
        ),
        "dnsConfig": preserve_unknown(
            "Extra DNS settings merged into the generated resolv.conf.",
            proto=message(
                "v1.PodDNSConfig",
                {
                    "nameservers": wire(1, STRING, repeated=True),
                    "searches": wire(2, STRING, repeated=True),
                    "options": wire(
                        3,
                        MESSAGE,
                        repeated=True,
                        msg=message(
                            "v1.PodDNSConfigOption",
                            {"name": wire(1, STRING), "value": wire(2, STRING, keep=True)},
                        ),
                    ),
                },
            ),
        ),
        "nodeSelector": string_map("Node labels the pod's node must have.", map_type="atomic"),
        "serviceAccountName": string("Service account the pod runs as."),
        "serviceAccount": string("Deprecated alias of serviceAccountName."),
        "automountServiceAccountToken": boolean("Mount the service account's token."),
        "nodeName": string("The node the pod is bound to; set by the scheduler."),
        "hostNetwork": boolean("Use the node's network namespace."),
        "hostPID": boolean("Use the node's PID namespace."),
        "hostIPC": boolean("Use the node's IPC namespace."),
        "shareProcessNamespace": boolean("Containers share one PID namespace."),
        "securityContext": POD_SECURITY_CONTEXT,
        "imagePullSecrets": by_name(LOCAL_OBJECT_REFERENCE, "Secrets for pulling images."),
        "hostname": string("Pod host name; the pod name by default."),
        "subdomain": string("Subdomain for the pod's FQDN."),
        "affinity": AFFINITY,
        "schedulerName": string("Scheduler that places the pod; default-scheduler by default."),
        "tolerations": array(TOLERATION, "Taints the pod tolerates.", list_type="atomic"),
        "hostAliases": array(
            HOST_ALIAS,
            "Extra /etc/hosts entries.",
            patch_strategy="merge",
            merge_key="ip",
            list_type="map",
            map_keys=("ip",),
        ),
        "priorityClassName": string("PriorityClass giving the pod's priority."),
        "priority": integer("Priority value, resolved from priorityClassName."),
        "preemptionPolicy": string(
            "Whether the pod may preempt others.", enum=("Never", "PreemptLowerPriority")
        ),
        "readinessGates": array(
            obj(
                "An extra condition the pod needs to be Ready.",
                {"conditionType": string("Pod condition type that must be True.")},
                required=("conditionType",),
                name=f"{V1}.PodReadinessGate",
                proto={"conditionType": 1},
            ),
            "Extra conditions for readiness.",
            list_type="atomic",
        ),
        "runtimeClassName": string("RuntimeClass to run the pod with."),
        "enableServiceLinks": boolean("Inject service environment variables; true by default."),
        "topologySpreadConstraints": array(
            TOPOLOGY_SPREAD_CONSTRAINT,
            "How matching pods spread across domains.",
            patch_strategy="merge",
            merge_key="topologyKey",
            list_type="map",
            map_keys=("topologyKey", "whenUnsatisfiable"),
        ),
        "overhead": quantity_map("Resources the pod sandbox itself uses."),
        "os": obj(
            "The pod's operating system.",
            {"name": string("linux or windows.")},
            required=("name",),
            name=f"{V1}.PodOS",
            proto={"name": 1},
        ),
        "schedulingGates": by_name(
            obj(
                "A gate that must be removed before the pod is scheduled.",
                {"name": string("Name of the gate.")},
                required=("name",),
                name=f"{V1}.PodSchedulingGate",
                proto={"name": 1},
            ),
            "Scheduling holds the pod while any are present.",
        ),
    },
    required=("containers",),
    name=f"{V1}.PodSpec",
    proto={
        "volumes": 1,
        "containers": 2,
        "restartPolicy": 3,
        "terminationGracePeriodSeconds": ptr(4),
        "activeDeadlineSeconds": ptr(5),
        "dnsPolicy": 6,
        "nodeSelector": 7,
        "serviceAccountName": 8,
        "serviceAccount": 9,
        "nodeName": 10,
        "hostNetwork": 11,
        "hostPID": 12,
        "hostIPC": 13,
        "securityContext": 14,
        "imagePullSecrets": 15,
        "hostname": 16,
        "subdomain": 17,
        "schedulerName": 19,
        "initContainers": 20,
        "automountServiceAccountToken": ptr(21),
        "tolerations": 22,
        "hostAliases": 23,
        "priorityClassName": 24,
        "priority": ptr(25),
        "dnsConfig": 26,
        "shareProcessNamespace": ptr(27),
        "readinessGates": 28,
        "runtimeClassName": ptr(29),
        "enableServiceLinks": ptr(30),
        "preemptionPolicy": ptr(31),
        "overhead": 32,
        "setHostnameAsFQDN": wire(35, BOOL, keep=True),
        "os": 36,
        "hostUsers": wire(37, BOOL, keep=True),
        "schedulingGates": 38,
    },
)

POD_TEMPLATE_SPEC = obj(
    "The pods a workload creates: their metadata and spec.",
    {
        "metadata": object_meta("Labels and annotations for the created pods."),
        "spec": with_description(POD_SPEC, "Spec of the created pods."),
    },
    name=f"{V1}.PodTemplateSpec",
    proto={"metadata": 1, "spec": 2},
)

# -- status ----------------------------------------------------------------------------------

CONTAINER_STATE = obj(
    "A container's state; exactly one field is set.",
    {
        "waiting": obj(
            "Not running yet.",
            {
                "reason": string("Why, e.g. ContainerCreating, CrashLoopBackOff."),
                "message": string("Details."),
            },
            name=f"{V1}.ContainerStateWaiting",
        ),
        "running": obj(
            "Running.",
            {"startedAt": timestamp("When the container (last) started.")},
            name=f"{V1}.ContainerStateRunning",
        ),
        "terminated": obj(
            "Exited.",
            {
                "exitCode": integer("Exit status of the last run."),
                "signal": integer("Signal that ended the container."),
                "reason": string("Why, e.g. Completed, Error, OOMKilled."),
                "message": string("Details."),
                "startedAt": timestamp("When the run started."),
                "finishedAt": timestamp("When the run ended."),
                "containerID": string("Runtime id of the container: <runtime>://<id>."),
            },
            required=("exitCode",),
            name=f"{V1}.ContainerStateTerminated",
        ),
    },
    name=f"{V1}.ContainerState",
)

CONTAINER_STATUS = obj(
    "Observed state of one container.",
    {
        "name": string("Container name."),
        "ready": boolean("Passed its readiness probe."),
        "restartCount": integer("Times the container has been restarted."),
        "image": string("Image the container runs."),
        "imageID": string("Resolved image id."),
        "containerID": string("Runtime id: <runtime>://<id>."),
        "started": boolean("Started and passed its startup probe."),
        "state": with_description(CONTAINER_STATE, "Current state."),
        "lastState": with_description(CONTAINER_STATE, "State of the previous run."),
    },
    required=("name", "ready", "restartCount", "image", "imageID"),
    name=f"{V1}.ContainerStatus",
)

POD_IP = obj(
    "An IP of the pod.",
    {"ip": string("The IP.")},
    required=("ip",),
    name=f"{V1}.PodIP",
    proto={"ip": 1},
)
HOST_IP = obj(
    "An IP of the pod's node.",
    {"ip": string("The IP.")},
    required=("ip",),
    name=f"{V1}.HostIP",
    proto={"ip": 1},
)


def _by_ip(item: Schema, desc: str) -> Schema:
    return array(
        item, desc, patch_strategy="merge", merge_key="ip", list_type="map", map_keys=("ip",)
    )


POD_PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")

POD_STATUS = obj(
    "Observed state of a pod, reported by its node.",
    {
        "phase": string("Lifecycle phase.", enum=POD_PHASES),
        "conditions": conditions(
            condition(
                f"{V1}.PodCondition",
                "A pod condition.",
                "lastProbeTime",
                proto={
                    "type": 1,
                    "status": 2,
                    "lastProbeTime": 3,
                    "lastTransitionTime": 4,
                    "reason": 5,
                    "message": 6,
                    "observedGeneration": wire(7, INT64),
                },
            ),
        ),
        "message": string("Why the pod is in its state."),
        "reason": string("CamelCase reason, e.g. Evicted."),
        "nominatedNodeName": string("Node the pod may run on after preemption."),
        "hostIP": string("Primary IP of the node."),
        "hostIPs": _by_ip(HOST_IP, "IPs of the node."),
        "podIP": string("Primary IP of the pod."),
        "podIPs": _by_ip(POD_IP, "IPs of the pod."),
        "startTime": timestamp("When the node accepted the pod."),
        "qosClass": string(
            "Quality of service class from the resources.",
            enum=("Guaranteed", "Burstable", "BestEffort"),
        ),
        "initContainerStatuses": array(
            CONTAINER_STATUS, "Init container states.", list_type="atomic"
        ),
        "containerStatuses": array(CONTAINER_STATUS, "Container states.", list_type="atomic"),
    },
    name=f"{V1}.PodStatus",
    proto={
        "phase": 1,
        "conditions": 2,
        "message": 3,
        "reason": 4,
        "hostIP": 5,
        "podIP": 6,
        "startTime": 7,
        "qosClass": 9,
        "nominatedNodeName": 11,
        "podIPs": 12,
        "resize": wire(14, STRING),
        "hostIPs": 16,
        "observedGeneration": wire(17, INT64),
    },
)
