"""core/v1 Container schemas: ports, env, resources, mounts, probes, lifecycle, security.

Patch metadata per the `k8s.io/api` struct tags (kubectl-compat.md §7): env merges by `name`;
ports by `containerPort` (SSA keys containerPort+protocol); volumeMounts by `mountPath`;
command, args and envFrom are atomic. `CONTAINER` serves both containers and initContainers.

Invariant: every named struct here is built once and shared; never mutate these dicts.
"""

from __future__ import annotations

from orchestrator.kube.schema.builders import (
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
    strings,
    with_description,
)
from orchestrator.kube.schema.proto import MESSAGE, STRING, inline, message, ptr, wire

V1 = "io.k8s.api.core.v1"


def by_name(item: Schema, desc: str) -> Schema:
    """A list of structs merged by `name` (containers, env, imagePullSecrets...)."""
    return array(
        item, desc, patch_strategy="merge", merge_key="name", list_type="map", map_keys=("name",)
    )


# -- containers ------------------------------------------------------------------------------

CONTAINER_PORT = obj(
    "A network port the container listens on.",
    {
        "name": string("Optional IANA service name for the port, unique in the pod."),
        "containerPort": integer("Port number on the pod's IP (1-65535)."),
        "hostPort": integer("Port to expose on the node's IP; rarely needed."),
        "hostIP": string("Node IP to bind the host port to."),
        # A list-map key: its schema default lets server-side apply match an item without it.
        "protocol": string(
            "Transport protocol; TCP by default.", default="TCP", enum=("TCP", "UDP", "SCTP")
        ),
    },
    required=("containerPort",),
    name=f"{V1}.ContainerPort",
    proto={"name": 1, "hostPort": 2, "containerPort": 3, "protocol": 4, "hostIP": 5},
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
            proto={
                "localObjectReference": inline(1, message("v1.LocalObjectReference", {"name": 1})),
                "key": 2,
                "optional": ptr(3),
            },
        ),
        "secretKeyRef": obj(
            "A key of a Secret.",
            _KEY_SELECTOR_FIELDS,
            required=("key",),
            name=f"{V1}.SecretKeySelector",
            map_type="atomic",
            proto={
                "localObjectReference": inline(1, message("v1.LocalObjectReference", {"name": 1})),
                "key": 2,
                "optional": ptr(3),
            },
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
            proto={"apiVersion": 1, "fieldPath": 2},
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
            proto={"containerName": 1, "resource": 2, "divisor": 3},
        ),
    },
    name=f"{V1}.EnvVarSource",
    proto={"fieldRef": 1, "resourceFieldRef": 2, "configMapKeyRef": 3, "secretKeyRef": 4},
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
    proto={"name": 1, "value": 2, "valueFrom": 3},
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
            "The ConfigMap to read.",
            _ENV_SOURCE_FIELDS,
            name=f"{V1}.ConfigMapEnvSource",
            proto={
                "localObjectReference": inline(1, message("v1.LocalObjectReference", {"name": 1})),
                "optional": ptr(2),
            },
        ),
        "secretRef": obj(
            "The Secret to read.",
            _ENV_SOURCE_FIELDS,
            name=f"{V1}.SecretEnvSource",
            proto={
                "localObjectReference": inline(1, message("v1.LocalObjectReference", {"name": 1})),
                "optional": ptr(2),
            },
        ),
    },
    name=f"{V1}.EnvFromSource",
    proto={"prefix": 1, "configMapRef": 2, "secretRef": 3},
)

RESOURCE_REQUIREMENTS = obj(
    "Compute resources for a container.",
    {
        "limits": quantity_map("Most the container may use, e.g. cpu: 500m, memory: 128Mi."),
        "requests": quantity_map("What the scheduler reserves for the container."),
    },
    name=f"{V1}.ResourceRequirements",
    proto={
        "limits": 1,
        "requests": 2,
        "claims": wire(
            3,
            MESSAGE,
            repeated=True,
            msg=message("v1.ResourceClaim", {"name": wire(1, STRING), "request": wire(2, STRING)}),
        ),
    },
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
    proto={
        "name": 1,
        "readOnly": 2,
        "mountPath": 3,
        "subPath": 4,
        "mountPropagation": ptr(5),
        "subPathExpr": 6,
        "recursiveReadOnly": wire(7, STRING, keep=True),
    },
)

EXEC_ACTION = obj(
    "Run a command in the container; exit status 0 means success.",
    {"command": strings("The command and its arguments (not run in a shell).")},
    name=f"{V1}.ExecAction",
    proto={"command": 1},
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
                proto={"name": 1, "value": 2},
            ),
            "Extra request headers.",
            list_type="atomic",
        ),
    },
    required=("port",),
    name=f"{V1}.HTTPGetAction",
    proto={"path": 1, "port": 2, "host": 3, "scheme": 4, "httpHeaders": 5},
)

TCP_SOCKET_ACTION = obj(
    "A TCP connection attempt; connecting means success.",
    {
        "port": int_or_string("Port number or named container port."),
        "host": string("Host to connect to; the pod IP by default."),
    },
    required=("port",),
    name=f"{V1}.TCPSocketAction",
    proto={"port": 1, "host": 2},
)

GRPC_ACTION = obj(
    "A gRPC health check.",
    {
        "port": integer("Port of the gRPC service."),
        "service": string("Service name sent in the HealthCheckRequest."),
    },
    required=("port",),
    name=f"{V1}.GRPCAction",
    proto={"port": 1, "service": ptr(2)},
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
    proto={
        "handler": inline(
            1, message("v1.ProbeHandler", {"exec": 1, "httpGet": 2, "tcpSocket": 3, "grpc": 4})
        ),
        "initialDelaySeconds": 2,
        "timeoutSeconds": 3,
        "periodSeconds": 4,
        "successThreshold": 5,
        "failureThreshold": 6,
        "terminationGracePeriodSeconds": ptr(7),
    },
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
            proto={"seconds": 1},
        ),
    },
    name=f"{V1}.LifecycleHandler",
    proto={"exec": 1, "httpGet": 2, "tcpSocket": 3, "sleep": 4},
)

LIFECYCLE = obj(
    "Actions run after a container starts and before it stops.",
    {
        "postStart": with_description(LIFECYCLE_HANDLER, "Run right after the container starts."),
        "preStop": with_description(LIFECYCLE_HANDLER, "Run before the container is stopped."),
    },
    name=f"{V1}.Lifecycle",
    proto={"postStart": 1, "preStop": 2, "stopSignal": wire(3, STRING, keep=True)},
)

SECCOMP_PROFILE = obj(
    "The seccomp profile to apply.",
    {
        "type": string("Which profile kind.", enum=("RuntimeDefault", "Unconfined", "Localhost")),
        "localhostProfile": string("Profile file on the node, for type Localhost."),
    },
    required=("type",),
    name=f"{V1}.SeccompProfile",
    proto={"type": 1, "localhostProfile": ptr(2)},
)

_ID_FIELDS: dict[str, Schema] = {
    "runAsUser": integer("UID to run the entrypoint as.", fmt="int64"),
    "runAsGroup": integer("GID to run the entrypoint as.", fmt="int64"),
    "runAsNonRoot": boolean("Refuse to start if the image would run as root."),
    "seccompProfile": SECCOMP_PROFILE,
    "seLinuxOptions": preserve_unknown(
        "SELinux labels to apply.",
        proto=message(
            "v1.SELinuxOptions",
            {
                "user": wire(1, STRING),
                "role": wire(2, STRING),
                "type": wire(3, STRING),
                "level": wire(4, STRING),
            },
        ),
    ),
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
            proto={"add": 1, "drop": 2},
        ),
        "procMount": string("Proc mount type: Default or Unmasked."),
    },
    name=f"{V1}.SecurityContext",
    proto={
        "capabilities": 1,
        "privileged": ptr(2),
        "seLinuxOptions": 3,
        "runAsUser": ptr(4),
        "runAsNonRoot": ptr(5),
        "readOnlyRootFilesystem": ptr(6),
        "allowPrivilegeEscalation": ptr(7),
        "runAsGroup": ptr(8),
        "procMount": ptr(9),
        "seccompProfile": 11,
    },
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
                proto={"name": 1, "value": 2},
            ),
            "Namespaced sysctls for the pod.",
            list_type="atomic",
        ),
    },
    name=f"{V1}.PodSecurityContext",
    proto={
        "seLinuxOptions": 1,
        "runAsUser": ptr(2),
        "runAsNonRoot": ptr(3),
        "supplementalGroups": 4,
        "fsGroup": ptr(5),
        "runAsGroup": ptr(6),
        "sysctls": 7,
        "fsGroupChangePolicy": ptr(9),
        "seccompProfile": 10,
        "supplementalGroupsPolicy": wire(12, STRING, keep=True),
        "seLinuxChangePolicy": wire(13, STRING, keep=True),
    },
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
    proto={
        "name": 1,
        "image": 2,
        "command": 3,
        "args": 4,
        "workingDir": 5,
        "ports": 6,
        "env": 7,
        "resources": 8,
        "volumeMounts": 9,
        "livenessProbe": 10,
        "readinessProbe": 11,
        "lifecycle": 12,
        "terminationMessagePath": 13,
        "imagePullPolicy": 14,
        "securityContext": 15,
        "stdin": 16,
        "stdinOnce": 17,
        "tty": 18,
        "envFrom": 19,
        "terminationMessagePolicy": 20,
        "volumeDevices": wire(
            21,
            MESSAGE,
            repeated=True,
            msg=message(
                "v1.VolumeDevice", {"name": wire(1, STRING), "devicePath": wire(2, STRING)}
            ),
        ),
        "startupProbe": 22,
        "resizePolicy": wire(
            23,
            MESSAGE,
            repeated=True,
            msg=message(
                "v1.ContainerResizePolicy",
                {"resourceName": wire(1, STRING), "restartPolicy": wire(2, STRING)},
            ),
        ),
        "restartPolicy": ptr(24),
    },
)
