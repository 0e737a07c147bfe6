"""core/v1 Pod schemas: Container, Volume, PodSpec, PodTemplateSpec and PodStatus, as data.

The patch metadata follows the `k8s.io/api` struct tags (kubectl-compat.md §7): containers, env,
imagePullSecrets merge by `name`; ports by `containerPort` (SSA keys containerPort+protocol);
volumeMounts by `mountPath`; volumes `merge,retainKeys` by `name`; hostAliases and pod IPs by
`ip`; topologySpreadConstraints by `topologyKey`; tolerations, command, args, envFrom and
readinessGates are atomic. Workload kinds embed `POD_TEMPLATE_SPEC`.

Invariant: every named struct here is built once and shared; never mutate these dicts.
"""

from __future__ import annotations

from .builders import (
    Schema,
    array,
    boolean,
    int_or_string,
    integer,
    obj,
    preserve_unknown,
    quantity,
    quantity_map,
    string,
    string_map,
    strings,
    timestamp,
    with_description,
)
from .meta import condition, conditions, label_selector, object_meta

V1 = "io.k8s.api.core.v1"


def by_name(item: Schema, desc: str) -> Schema:
    """A list of structs merged by `name` (containers, env, imagePullSecrets...)."""
    return array(
        item, desc, patch_strategy="merge", merge_key="name", list_type="map", map_keys=("name",)
    )


LOCAL_OBJECT_REFERENCE = obj(
    "Names an object in the same namespace.",
    {"name": string("Name of the referent.")},
    name=f"{V1}.LocalObjectReference",
    map_type="atomic",
)

# -- containers ------------------------------------------------------------------------------

CONTAINER_PORT = obj(
    "A network port the container listens on.",
    {
        "name": string("Optional IANA service name for the port, unique in the pod."),
        "containerPort": integer("Port number on the pod's IP (1-65535)."),
        "hostPort": integer("Port to expose on the node's IP; rarely needed."),
        "hostIP": string("Node IP to bind the host port to."),
        "protocol": string("Transport protocol; TCP by default.", enum=("TCP", "UDP", "SCTP")),
    },
    required=("containerPort",),
    name=f"{V1}.ContainerPort",
)

_KEY_SELECTOR_FIELDS: dict[str, Schema] = {
    "name": string("Name of the object."),
    "key": string("The key to read."),
    "optional": boolean("If true, a missing object or key is not an error."),
}

ENV_VAR_SOURCE = obj(
    "Where an environment variable's value comes from.",
    {
        "configMapKeyRef": obj(
            "A key of a ConfigMap.",
            _KEY_SELECTOR_FIELDS,
            required=("key",),
            name=f"{V1}.ConfigMapKeySelector",
            map_type="atomic",
        ),
        "secretKeyRef": obj(
            "A key of a Secret.",
            _KEY_SELECTOR_FIELDS,
            required=("key",),
            name=f"{V1}.SecretKeySelector",
            map_type="atomic",
        ),
        "fieldRef": obj(
            "A field of the pod, e.g. metadata.name or status.podIP.",
            {
                "apiVersion": string("API version the path is written in; v1 by default."),
                "fieldPath": string("Path of the field to read."),
            },
            required=("fieldPath",),
            name=f"{V1}.ObjectFieldSelector",
            map_type="atomic",
        ),
        "resourceFieldRef": obj(
            "A resource limit or request of a container, e.g. limits.cpu.",
            {
                "containerName": string("Container to read; this one by default."),
                "resource": string("The resource, e.g. limits.memory."),
                "divisor": quantity("Unit to express the value in; 1 by default."),
            },
            required=("resource",),
            name=f"{V1}.ResourceFieldSelector",
            map_type="atomic",
        ),
    },
    name=f"{V1}.EnvVarSource",
)

ENV_VAR = obj(
    "An environment variable for a container.",
    {
        "name": string("Variable name."),
        "value": string("Literal value; `$(VAR)` expands earlier variables."),
        "valueFrom": with_description(ENV_VAR_SOURCE, "Read the value from another source."),
    },
    required=("name",),
    name=f"{V1}.EnvVar",
)

_ENV_SOURCE_FIELDS: dict[str, Schema] = {
    "name": string("Name of the object."),
    "optional": boolean("If true, a missing object is not an error."),
}

ENV_FROM_SOURCE = obj(
    "Every key of a ConfigMap or Secret as environment variables.",
    {
        "prefix": string("Prefix added to every variable name."),
        "configMapRef": obj(
            "The ConfigMap to read.", _ENV_SOURCE_FIELDS, name=f"{V1}.ConfigMapEnvSource"
        ),
        "secretRef": obj("The Secret to read.", _ENV_SOURCE_FIELDS, name=f"{V1}.SecretEnvSource"),
    },
    name=f"{V1}.EnvFromSource",
)

RESOURCE_REQUIREMENTS = obj(
    "Compute resources for a container.",
    {
        "limits": quantity_map("Most the container may use, e.g. cpu: 500m, memory: 128Mi."),
        "requests": quantity_map("What the scheduler reserves for the container."),
    },
    name=f"{V1}.ResourceRequirements",
)

VOLUME_MOUNT = obj(
    "Where a pod volume appears in the container's filesystem.",
    {
        "name": string("Name of a volume of the pod."),
        "mountPath": string("Absolute path in the container; must not contain ':'."),
        "readOnly": boolean("Mount read-only."),
        "subPath": string("Mount only this path inside the volume."),
        "subPathExpr": string("Like subPath, with $(VAR) expansion."),
        "mountPropagation": string(
            "How mounts propagate between host and container.",
            enum=("None", "HostToContainer", "Bidirectional"),
        ),
    },
    required=("name", "mountPath"),
    name=f"{V1}.VolumeMount",
)

EXEC_ACTION = obj(
    "Run a command in the container; exit status 0 means success.",
    {"command": strings("The command and its arguments (not run in a shell).")},
    name=f"{V1}.ExecAction",
)

HTTP_GET_ACTION = obj(
    "An HTTP GET request; a status of 200-399 means success.",
    {
        "path": string("Path to request."),
        "port": int_or_string("Port number or named container port."),
        "host": string("Host to connect to; the pod IP by default."),
        "scheme": string("HTTP or HTTPS; HTTP by default.", enum=("HTTP", "HTTPS")),
        "httpHeaders": array(
            obj(
                "One HTTP header.",
                {"name": string("Header name."), "value": string("Header value.")},
                required=("name", "value"),
                name=f"{V1}.HTTPHeader",
            ),
            "Extra request headers.",
            list_type="atomic",
        ),
    },
    required=("port",),
    name=f"{V1}.HTTPGetAction",
)

TCP_SOCKET_ACTION = obj(
    "A TCP connection attempt; connecting means success.",
    {
        "port": int_or_string("Port number or named container port."),
        "host": string("Host to connect to; the pod IP by default."),
    },
    required=("port",),
    name=f"{V1}.TCPSocketAction",
)

GRPC_ACTION = obj(
    "A gRPC health check.",
    {
        "port": integer("Port of the gRPC service."),
        "service": string("Service name sent in the HealthCheckRequest."),
    },
    required=("port",),
    name=f"{V1}.GRPCAction",
)

PROBE = obj(
    "A periodic health check of a container; set exactly one of exec, httpGet, tcpSocket, grpc.",
    {
        "exec": EXEC_ACTION,
        "httpGet": HTTP_GET_ACTION,
        "tcpSocket": TCP_SOCKET_ACTION,
        "grpc": GRPC_ACTION,
        "initialDelaySeconds": integer("Seconds after start before the first probe."),
        "periodSeconds": integer("Seconds between probes; 10 by default.", minimum=1),
        "timeoutSeconds": integer("Seconds before a probe times out; 1 by default.", minimum=1),
        "successThreshold": integer(
            "Consecutive successes to count as healthy; 1 by default.", minimum=1
        ),
        "failureThreshold": integer(
            "Consecutive failures to count as unhealthy; 3 by default.", minimum=1
        ),
        "terminationGracePeriodSeconds": integer(
            "Grace period when a failing liveness probe kills the container.", fmt="int64"
        ),
    },
    name=f"{V1}.Probe",
)

LIFECYCLE_HANDLER = obj(
    "An action run at a container lifecycle event; set exactly one field.",
    {
        "exec": EXEC_ACTION,
        "httpGet": HTTP_GET_ACTION,
        "tcpSocket": TCP_SOCKET_ACTION,
        "sleep": obj(
            "Sleep before continuing.",
            {"seconds": integer("Seconds to sleep.", fmt="int64")},
            required=("seconds",),
            name=f"{V1}.SleepAction",
        ),
    },
    name=f"{V1}.LifecycleHandler",
)

LIFECYCLE = obj(
    "Actions run after a container starts and before it stops.",
    {
        "postStart": with_description(LIFECYCLE_HANDLER, "Run right after the container starts."),
        "preStop": with_description(LIFECYCLE_HANDLER, "Run before the container is stopped."),
    },
    name=f"{V1}.Lifecycle",
)

SECCOMP_PROFILE = obj(
    "The seccomp profile to apply.",
    {
        "type": string("Which profile kind.", enum=("RuntimeDefault", "Unconfined", "Localhost")),
        "localhostProfile": string("Profile file on the node, for type Localhost."),
    },
    required=("type",),
    name=f"{V1}.SeccompProfile",
)

_ID_FIELDS: dict[str, Schema] = {
    "runAsUser": integer("UID to run the entrypoint as.", fmt="int64"),
    "runAsGroup": integer("GID to run the entrypoint as.", fmt="int64"),
    "runAsNonRoot": boolean("Refuse to start if the image would run as root."),
    "seccompProfile": SECCOMP_PROFILE,
    "seLinuxOptions": preserve_unknown("SELinux labels to apply."),
}

SECURITY_CONTEXT = obj(
    "Container-level security settings; override the pod's.",
    {
        **_ID_FIELDS,
        "privileged": boolean("Run with full host privileges."),
        "readOnlyRootFilesystem": boolean("Mount the root filesystem read-only."),
        "allowPrivilegeEscalation": boolean("Whether a process may gain more privileges."),
        "capabilities": obj(
            "Linux capabilities to add and drop.",
            {
                "add": strings("Capabilities to add."),
                "drop": strings("Capabilities to drop."),
            },
            name=f"{V1}.Capabilities",
        ),
        "procMount": string("Proc mount type: Default or Unmasked."),
    },
    name=f"{V1}.SecurityContext",
)

POD_SECURITY_CONTEXT = obj(
    "Pod-level security settings applied to every container.",
    {
        **_ID_FIELDS,
        "fsGroup": integer("Group that owns mounted volumes.", fmt="int64"),
        "fsGroupChangePolicy": string(
            "When to change volume ownership.", enum=("OnRootMismatch", "Always")
        ),
        "supplementalGroups": array(
            {"type": "integer", "format": "int64"},
            "Extra groups for the first process of each container.",
            list_type="atomic",
        ),
        "sysctls": array(
            obj(
                "A kernel parameter to set.",
                {"name": string("Parameter name."), "value": string("Parameter value.")},
                required=("name", "value"),
                name=f"{V1}.Sysctl",
            ),
            "Namespaced sysctls for the pod.",
            list_type="atomic",
        ),
    },
    name=f"{V1}.PodSecurityContext",
)

CONTAINER = obj(
    "One container of a pod.",
    {
        "name": string("Name of the container, a DNS label unique within the pod."),
        "image": string("Container image reference, e.g. nginx:1.27."),
        "command": strings("Entrypoint; replaces the image's ENTRYPOINT."),
        "args": strings("Arguments; replace the image's CMD."),
        "workingDir": string("Working directory; the image's by default."),
        "ports": array(
            CONTAINER_PORT,
            "Ports the container exposes (informational, plus named-port lookups).",
            patch_strategy="merge",
            merge_key="containerPort",
            list_type="map",
            map_keys=("containerPort", "protocol"),
        ),
        "env": by_name(ENV_VAR, "Environment variables."),
        "envFrom": array(
            ENV_FROM_SOURCE, "Import whole ConfigMaps or Secrets as variables.", list_type="atomic"
        ),
        "resources": with_description(RESOURCE_REQUIREMENTS, "CPU and memory requests/limits."),
        "volumeMounts": array(
            VOLUME_MOUNT,
            "Pod volumes to mount into the container.",
            patch_strategy="merge",
            merge_key="mountPath",
            list_type="map",
            map_keys=("mountPath",),
        ),
        "livenessProbe": with_description(PROBE, "Restart the container when this fails."),
        "readinessProbe": with_description(PROBE, "Remove the pod from endpoints when this fails."),
        "startupProbe": with_description(PROBE, "Hold other probes until this succeeds once."),
        "lifecycle": LIFECYCLE,
        "imagePullPolicy": string(
            "When to pull the image; Always for :latest or untagged, else IfNotPresent.",
            enum=("Always", "Never", "IfNotPresent"),
        ),
        "securityContext": SECURITY_CONTEXT,
        "restartPolicy": string(
            "For init containers only: Always makes it a sidecar.", enum=("Always",)
        ),
        "stdin": boolean("Keep a stdin buffer open for the container."),
        "stdinOnce": boolean("Close stdin after the first attach ends."),
        "tty": boolean("Allocate a TTY."),
        "terminationMessagePath": string(
            "File the container may write its termination message to."
        ),
        "terminationMessagePolicy": string(
            "Where the termination message comes from.", enum=("File", "FallbackToLogsOnError")
        ),
    },
    required=("name",),
    name=f"{V1}.Container",
)

# -- volumes ---------------------------------------------------------------------------------

KEY_TO_PATH = obj(
    "Project one key to a file path.",
    {
        "key": string("The key to project."),
        "path": string("Relative file path to write it to."),
        "mode": integer("File mode bits (0000-0777)."),
    },
    required=("key", "path"),
    name=f"{V1}.KeyToPath",
)

VOLUME_SOURCES: dict[str, Schema] = {
    "hostPath": obj(
        "A file or directory on the node.",
        {
            "path": string("Path on the node."),
            "type": string(
                "What must exist at path; empty means no check.",
                enum=(
                    "",
                    "DirectoryOrCreate",
                    "Directory",
                    "FileOrCreate",
                    "File",
                    "Socket",
                    "CharDevice",
                    "BlockDevice",
                ),
            ),
        },
        required=("path",),
        name=f"{V1}.HostPathVolumeSource",
    ),
    "emptyDir": obj(
        "A scratch directory that lives as long as the pod.",
        {
            "medium": string('Storage medium: "" (node disk) or "Memory".'),
            "sizeLimit": quantity("Most the volume may hold."),
        },
        name=f"{V1}.EmptyDirVolumeSource",
    ),
    "configMap": obj(
        "The keys of a ConfigMap as files.",
        {
            "name": string("Name of the ConfigMap."),
            "items": array(KEY_TO_PATH, "Project only these keys.", list_type="atomic"),
            "defaultMode": integer("File mode bits; 0644 by default."),
            "optional": boolean("If true, a missing ConfigMap is not an error."),
        },
        name=f"{V1}.ConfigMapVolumeSource",
    ),
    "secret": obj(
        "The keys of a Secret as files.",
        {
            "secretName": string("Name of the Secret."),
            "items": array(KEY_TO_PATH, "Project only these keys.", list_type="atomic"),
            "defaultMode": integer("File mode bits; 0644 by default."),
            "optional": boolean("If true, a missing Secret is not an error."),
        },
        name=f"{V1}.SecretVolumeSource",
    ),
    "persistentVolumeClaim": obj(
        "A PersistentVolumeClaim in the pod's namespace.",
        {
            "claimName": string("Name of the claim."),
            "readOnly": boolean("Mount read-only."),
        },
        required=("claimName",),
        name=f"{V1}.PersistentVolumeClaimVolumeSource",
    ),
    "downwardAPI": preserve_unknown("Pod fields as files."),
    "projected": preserve_unknown("Several sources projected into one directory."),
}

VOLUME = obj(
    "A named volume the pod's containers can mount; set exactly one source.",
    {"name": string("Volume name, a DNS label unique within the pod."), **VOLUME_SOURCES},
    required=("name",),
    name=f"{V1}.Volume",
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
        "dnsConfig": preserve_unknown("Extra DNS settings merged into the generated resolv.conf."),
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
        ),
        "schedulingGates": by_name(
            obj(
                "A gate that must be removed before the pod is scheduled.",
                {"name": string("Name of the gate.")},
                required=("name",),
                name=f"{V1}.PodSchedulingGate",
            ),
            "Scheduling holds the pod while any are present.",
        ),
    },
    required=("containers",),
    name=f"{V1}.PodSpec",
)

POD_TEMPLATE_SPEC = obj(
    "The pods a workload creates: their metadata and spec.",
    {
        "metadata": object_meta("Labels and annotations for the created pods."),
        "spec": with_description(POD_SPEC, "Spec of the created pods."),
    },
    name=f"{V1}.PodTemplateSpec",
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

POD_IP = obj("An IP of the pod.", {"ip": string("The IP.")}, required=("ip",), name=f"{V1}.PodIP")
HOST_IP = obj(
    "An IP of the pod's node.", {"ip": string("The IP.")}, required=("ip",), name=f"{V1}.HostIP"
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
            condition(f"{V1}.PodCondition", "A pod condition.", "lastProbeTime"),
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
)
