"""Kubernetes protobuf request bodies (`application/vnd.kubernetes.protobuf`) as JSON-shaped dicts.

kubectl's generator commands (`create namespace|configmap|secret|serviceaccount|deployment|
service`) post their objects through typed clients that speak only protobuf. This module turns
such a body into the dict the JSON path would have produced (camelCase names, ints, bools,
base64 for bytes, IntOrString as int or str, Quantity as str, Time as RFC 3339), so validation
and defaulting downstream are the same for both encodings.

Wire format: the 4-byte magic `k8s\\x00`, then a `runtime.Unknown` message (typeMeta=1
{apiVersion=1, kind=2}, raw=2 = the object's own message, contentEncoding=3, contentType=4).
The object is decoded by a table per message type, `{field number: (json name, kind, sub,
repeated)}`, with the field numbers of the upstream `generated.proto` files (k8s.io/api core/v1
and apps/v1, k8s.io/apimachinery meta/v1, util/intstr, api/resource). A kind ending in `*` is a
Go pointer (or otherwise meaningful at zero): its zero value is kept; any other scalar at its
zero value is dropped, as Go's `omitempty` JSON would. `inline` merges a submessage into its
parent (Go's embedded structs: Volume's VolumeSource, Probe's ProbeHandler, the
LocalObjectReference of key selectors); `map` is a repeated entry message (key=1, value=2)
whose `sub` is the value kind.

Refusals never guess: a field number a described message does not list is a 415 naming it, an
object kind without a table is a 415 listing the accepted ones (clients can send JSON instead),
and bytes that are not valid protobuf are a 400. Nothing else escapes `decode`.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from orchestrator.kube import errors
from orchestrator.kube.errors import ApiError

MEDIA_TYPE: Final = "application/vnd.kubernetes.protobuf"
MAGIC: Final = b"k8s\x00"

# Field kinds. A trailing "*" means: keep the zero value (the Go field is a pointer).
STRING, BYTES, BOOL, INT32, INT64 = "string", "bytes", "bool", "int32", "int64"
MESSAGE, INLINE, MAP = "message", "inline", "map"
INTSTR, QUANTITY, TIME, MICROTIME, FIELDSV1 = "intstr", "quantity", "time", "microtime", "fieldsv1"

_VARINT_KINDS = frozenset({BOOL, INT32, INT64})
_WIRE_VARINT, _WIRE_FIXED64, _WIRE_LEN, _WIRE_FIXED32 = 0, 1, 2, 5

Field = tuple[str, str, "Msg | str | None", bool]


@dataclass(frozen=True)
class Msg:
    name: str  # as in error messages: "v1.PodSpec"
    fields: dict[int, Field]


def one(json_name: str, kind: str, sub: Msg | str | None = None) -> Field:
    return (json_name, kind, sub, False)


def many(json_name: str, kind: str, sub: Msg | str | None = None) -> Field:
    return (json_name, kind, sub, True)


# ----------------------------------------------------------------------- apimachinery
TIMESTAMP = Msg("v1.Time", {1: one("seconds", INT64), 2: one("nanos", INT32)})
INT_OR_STRING = Msg(
    "intstr.IntOrString",
    {1: one("type", INT64 + "*"), 2: one("intVal", INT32 + "*"), 3: one("strVal", STRING + "*")},
)
QUANTITY_MSG = Msg("resource.Quantity", {1: one("string", STRING + "*")})
FIELDS_V1 = Msg("v1.FieldsV1", {1: one("Raw", BYTES + "*")})

OWNER_REFERENCE = Msg(
    "v1.OwnerReference",
    {
        1: one("kind", STRING),
        3: one("name", STRING),
        4: one("uid", STRING),
        5: one("apiVersion", STRING),
        6: one("controller", BOOL + "*"),
        7: one("blockOwnerDeletion", BOOL + "*"),
    },
)
MANAGED_FIELDS_ENTRY = Msg(
    "v1.ManagedFieldsEntry",
    {
        1: one("manager", STRING),
        2: one("operation", STRING),
        3: one("apiVersion", STRING),
        4: one("time", TIME),
        6: one("fieldsType", STRING),
        7: one("fieldsV1", FIELDSV1),
        8: one("subresource", STRING),
    },
)
OBJECT_META = Msg(
    "v1.ObjectMeta",
    {
        1: one("name", STRING),
        2: one("generateName", STRING),
        3: one("namespace", STRING),
        4: one("selfLink", STRING),
        5: one("uid", STRING),
        6: one("resourceVersion", STRING),
        7: one("generation", INT64),
        8: one("creationTimestamp", TIME),
        9: one("deletionTimestamp", TIME),
        10: one("deletionGracePeriodSeconds", INT64 + "*"),
        11: one("labels", MAP, STRING),
        12: one("annotations", MAP, STRING),
        13: many("ownerReferences", MESSAGE, OWNER_REFERENCE),
        14: many("finalizers", STRING),
        17: many("managedFields", MESSAGE, MANAGED_FIELDS_ENTRY),
    },
)
LABEL_SELECTOR_REQUIREMENT = Msg(
    "v1.LabelSelectorRequirement",
    {1: one("key", STRING), 2: one("operator", STRING), 3: many("values", STRING)},
)
LABEL_SELECTOR = Msg(
    "v1.LabelSelector",
    {
        1: one("matchLabels", MAP, STRING),
        2: many("matchExpressions", MESSAGE, LABEL_SELECTOR_REQUIREMENT),
    },
)
CONDITION = Msg(
    "v1.Condition",
    {
        1: one("type", STRING),
        2: one("status", STRING),
        3: one("observedGeneration", INT64),
        4: one("lastTransitionTime", TIME),
        5: one("reason", STRING),
        6: one("message", STRING),
    },
)

# ----------------------------------------------------------------------- core/v1: references
LOCAL_OBJECT_REFERENCE = Msg("v1.LocalObjectReference", {1: one("name", STRING)})
OBJECT_REFERENCE = Msg(
    "v1.ObjectReference",
    {
        1: one("kind", STRING),
        2: one("namespace", STRING),
        3: one("name", STRING),
        4: one("uid", STRING),
        5: one("apiVersion", STRING),
        6: one("resourceVersion", STRING),
        7: one("fieldPath", STRING),
    },
)

# ----------------------------------------------------------------------- core/v1: containers
OBJECT_FIELD_SELECTOR = Msg(
    "v1.ObjectFieldSelector", {1: one("apiVersion", STRING), 2: one("fieldPath", STRING)}
)
RESOURCE_FIELD_SELECTOR = Msg(
    "v1.ResourceFieldSelector",
    {1: one("containerName", STRING), 2: one("resource", STRING), 3: one("divisor", QUANTITY)},
)
CONFIG_MAP_KEY_SELECTOR = Msg(
    "v1.ConfigMapKeySelector",
    {
        1: one("localObjectReference", INLINE, LOCAL_OBJECT_REFERENCE),
        2: one("key", STRING),
        3: one("optional", BOOL + "*"),
    },
)
SECRET_KEY_SELECTOR = Msg(
    "v1.SecretKeySelector",
    {
        1: one("localObjectReference", INLINE, LOCAL_OBJECT_REFERENCE),
        2: one("key", STRING),
        3: one("optional", BOOL + "*"),
    },
)
ENV_VAR_SOURCE = Msg(
    "v1.EnvVarSource",
    {
        1: one("fieldRef", MESSAGE, OBJECT_FIELD_SELECTOR),
        2: one("resourceFieldRef", MESSAGE, RESOURCE_FIELD_SELECTOR),
        3: one("configMapKeyRef", MESSAGE, CONFIG_MAP_KEY_SELECTOR),
        4: one("secretKeyRef", MESSAGE, SECRET_KEY_SELECTOR),
    },
)
ENV_VAR = Msg(
    "v1.EnvVar",
    {1: one("name", STRING), 2: one("value", STRING), 3: one("valueFrom", MESSAGE, ENV_VAR_SOURCE)},
)
CONFIG_MAP_ENV_SOURCE = Msg(
    "v1.ConfigMapEnvSource",
    {
        1: one("localObjectReference", INLINE, LOCAL_OBJECT_REFERENCE),
        2: one("optional", BOOL + "*"),
    },
)
SECRET_ENV_SOURCE = Msg(
    "v1.SecretEnvSource",
    {
        1: one("localObjectReference", INLINE, LOCAL_OBJECT_REFERENCE),
        2: one("optional", BOOL + "*"),
    },
)
ENV_FROM_SOURCE = Msg(
    "v1.EnvFromSource",
    {
        1: one("prefix", STRING),
        2: one("configMapRef", MESSAGE, CONFIG_MAP_ENV_SOURCE),
        3: one("secretRef", MESSAGE, SECRET_ENV_SOURCE),
    },
)
CONTAINER_PORT = Msg(
    "v1.ContainerPort",
    {
        1: one("name", STRING),
        2: one("hostPort", INT32),
        3: one("containerPort", INT32),
        4: one("protocol", STRING),
        5: one("hostIP", STRING),
    },
)
RESOURCE_CLAIM = Msg("v1.ResourceClaim", {1: one("name", STRING), 2: one("request", STRING)})
RESOURCE_REQUIREMENTS = Msg(
    "v1.ResourceRequirements",
    {
        1: one("limits", MAP, QUANTITY),
        2: one("requests", MAP, QUANTITY),
        3: many("claims", MESSAGE, RESOURCE_CLAIM),
    },
)
VOLUME_MOUNT = Msg(
    "v1.VolumeMount",
    {
        1: one("name", STRING),
        2: one("readOnly", BOOL),
        3: one("mountPath", STRING),
        4: one("subPath", STRING),
        5: one("mountPropagation", STRING + "*"),
        6: one("subPathExpr", STRING),
        7: one("recursiveReadOnly", STRING + "*"),
    },
)
VOLUME_DEVICE = Msg("v1.VolumeDevice", {1: one("name", STRING), 2: one("devicePath", STRING)})
EXEC_ACTION = Msg("v1.ExecAction", {1: many("command", STRING)})
HTTP_HEADER = Msg("v1.HTTPHeader", {1: one("name", STRING), 2: one("value", STRING)})
HTTP_GET_ACTION = Msg(
    "v1.HTTPGetAction",
    {
        1: one("path", STRING),
        2: one("port", INTSTR),
        3: one("host", STRING),
        4: one("scheme", STRING),
        5: many("httpHeaders", MESSAGE, HTTP_HEADER),
    },
)
TCP_SOCKET_ACTION = Msg("v1.TCPSocketAction", {1: one("port", INTSTR), 2: one("host", STRING)})
GRPC_ACTION = Msg("v1.GRPCAction", {1: one("port", INT32), 2: one("service", STRING + "*")})
PROBE_HANDLER = Msg(
    "v1.ProbeHandler",
    {
        1: one("exec", MESSAGE, EXEC_ACTION),
        2: one("httpGet", MESSAGE, HTTP_GET_ACTION),
        3: one("tcpSocket", MESSAGE, TCP_SOCKET_ACTION),
        4: one("grpc", MESSAGE, GRPC_ACTION),
    },
)
PROBE = Msg(
    "v1.Probe",
    {
        1: one("handler", INLINE, PROBE_HANDLER),
        2: one("initialDelaySeconds", INT32),
        3: one("timeoutSeconds", INT32),
        4: one("periodSeconds", INT32),
        5: one("successThreshold", INT32),
        6: one("failureThreshold", INT32),
        7: one("terminationGracePeriodSeconds", INT64 + "*"),
    },
)
SLEEP_ACTION = Msg("v1.SleepAction", {1: one("seconds", INT64)})
LIFECYCLE_HANDLER = Msg(
    "v1.LifecycleHandler",
    {
        1: one("exec", MESSAGE, EXEC_ACTION),
        2: one("httpGet", MESSAGE, HTTP_GET_ACTION),
        3: one("tcpSocket", MESSAGE, TCP_SOCKET_ACTION),
        4: one("sleep", MESSAGE, SLEEP_ACTION),
    },
)
LIFECYCLE = Msg(
    "v1.Lifecycle",
    {
        1: one("postStart", MESSAGE, LIFECYCLE_HANDLER),
        2: one("preStop", MESSAGE, LIFECYCLE_HANDLER),
        3: one("stopSignal", STRING + "*"),
    },
)
CAPABILITIES = Msg("v1.Capabilities", {1: many("add", STRING), 2: many("drop", STRING)})
SE_LINUX_OPTIONS = Msg(
    "v1.SELinuxOptions",
    {
        1: one("user", STRING),
        2: one("role", STRING),
        3: one("type", STRING),
        4: one("level", STRING),
    },
)
SECCOMP_PROFILE = Msg(
    "v1.SeccompProfile", {1: one("type", STRING), 2: one("localhostProfile", STRING + "*")}
)
SECURITY_CONTEXT = Msg(
    "v1.SecurityContext",
    {
        1: one("capabilities", MESSAGE, CAPABILITIES),
        2: one("privileged", BOOL + "*"),
        3: one("seLinuxOptions", MESSAGE, SE_LINUX_OPTIONS),
        4: one("runAsUser", INT64 + "*"),
        5: one("runAsNonRoot", BOOL + "*"),
        6: one("readOnlyRootFilesystem", BOOL + "*"),
        7: one("allowPrivilegeEscalation", BOOL + "*"),
        8: one("runAsGroup", INT64 + "*"),
        9: one("procMount", STRING + "*"),
        11: one("seccompProfile", MESSAGE, SECCOMP_PROFILE),
    },
)
CONTAINER_RESIZE_POLICY = Msg(
    "v1.ContainerResizePolicy", {1: one("resourceName", STRING), 2: one("restartPolicy", STRING)}
)
CONTAINER = Msg(
    "v1.Container",
    {
        1: one("name", STRING),
        2: one("image", STRING),
        3: many("command", STRING),
        4: many("args", STRING),
        5: one("workingDir", STRING),
        6: many("ports", MESSAGE, CONTAINER_PORT),
        7: many("env", MESSAGE, ENV_VAR),
        8: one("resources", MESSAGE, RESOURCE_REQUIREMENTS),
        9: many("volumeMounts", MESSAGE, VOLUME_MOUNT),
        10: one("livenessProbe", MESSAGE, PROBE),
        11: one("readinessProbe", MESSAGE, PROBE),
        12: one("lifecycle", MESSAGE, LIFECYCLE),
        13: one("terminationMessagePath", STRING),
        14: one("imagePullPolicy", STRING),
        15: one("securityContext", MESSAGE, SECURITY_CONTEXT),
        16: one("stdin", BOOL),
        17: one("stdinOnce", BOOL),
        18: one("tty", BOOL),
        19: many("envFrom", MESSAGE, ENV_FROM_SOURCE),
        20: one("terminationMessagePolicy", STRING),
        21: many("volumeDevices", MESSAGE, VOLUME_DEVICE),
        22: one("startupProbe", MESSAGE, PROBE),
        23: many("resizePolicy", MESSAGE, CONTAINER_RESIZE_POLICY),
        24: one("restartPolicy", STRING + "*"),
    },
)

# ----------------------------------------------------------------------- core/v1: volumes
KEY_TO_PATH = Msg(
    "v1.KeyToPath", {1: one("key", STRING), 2: one("path", STRING), 3: one("mode", INT32 + "*")}
)
HOST_PATH_VOLUME_SOURCE = Msg(
    "v1.HostPathVolumeSource", {1: one("path", STRING), 2: one("type", STRING + "*")}
)
EMPTY_DIR_VOLUME_SOURCE = Msg(
    "v1.EmptyDirVolumeSource", {1: one("medium", STRING), 2: one("sizeLimit", QUANTITY + "*")}
)
SECRET_VOLUME_SOURCE = Msg(
    "v1.SecretVolumeSource",
    {
        1: one("secretName", STRING),
        2: many("items", MESSAGE, KEY_TO_PATH),
        3: one("defaultMode", INT32 + "*"),
        4: one("optional", BOOL + "*"),
    },
)
CONFIG_MAP_VOLUME_SOURCE = Msg(
    "v1.ConfigMapVolumeSource",
    {
        1: one("localObjectReference", INLINE, LOCAL_OBJECT_REFERENCE),
        2: many("items", MESSAGE, KEY_TO_PATH),
        3: one("defaultMode", INT32 + "*"),
        4: one("optional", BOOL + "*"),
    },
)
DOWNWARD_API_VOLUME_FILE = Msg(
    "v1.DownwardAPIVolumeFile",
    {
        1: one("path", STRING),
        2: one("fieldRef", MESSAGE, OBJECT_FIELD_SELECTOR),
        3: one("resourceFieldRef", MESSAGE, RESOURCE_FIELD_SELECTOR),
        4: one("mode", INT32 + "*"),
    },
)
DOWNWARD_API_VOLUME_SOURCE = Msg(
    "v1.DownwardAPIVolumeSource",
    {1: many("items", MESSAGE, DOWNWARD_API_VOLUME_FILE), 2: one("defaultMode", INT32 + "*")},
)
SECRET_PROJECTION = Msg(
    "v1.SecretProjection",
    {
        1: one("localObjectReference", INLINE, LOCAL_OBJECT_REFERENCE),
        2: many("items", MESSAGE, KEY_TO_PATH),
        4: one("optional", BOOL + "*"),
    },
)
CONFIG_MAP_PROJECTION = Msg(
    "v1.ConfigMapProjection",
    {
        1: one("localObjectReference", INLINE, LOCAL_OBJECT_REFERENCE),
        2: many("items", MESSAGE, KEY_TO_PATH),
        4: one("optional", BOOL + "*"),
    },
)
DOWNWARD_API_PROJECTION = Msg(
    "v1.DownwardAPIProjection", {1: many("items", MESSAGE, DOWNWARD_API_VOLUME_FILE)}
)
SERVICE_ACCOUNT_TOKEN_PROJECTION = Msg(
    "v1.ServiceAccountTokenProjection",
    {
        1: one("audience", STRING),
        2: one("expirationSeconds", INT64 + "*"),
        3: one("path", STRING),
    },
)
VOLUME_PROJECTION = Msg(
    "v1.VolumeProjection",
    {
        1: one("secret", MESSAGE, SECRET_PROJECTION),
        2: one("downwardAPI", MESSAGE, DOWNWARD_API_PROJECTION),
        3: one("configMap", MESSAGE, CONFIG_MAP_PROJECTION),
        4: one("serviceAccountToken", MESSAGE, SERVICE_ACCOUNT_TOKEN_PROJECTION),
    },
)
PROJECTED_VOLUME_SOURCE = Msg(
    "v1.ProjectedVolumeSource",
    {1: many("sources", MESSAGE, VOLUME_PROJECTION), 2: one("defaultMode", INT32 + "*")},
)
VOLUME_SOURCE = Msg(
    "v1.VolumeSource",
    {
        1: one("hostPath", MESSAGE, HOST_PATH_VOLUME_SOURCE),
        2: one("emptyDir", MESSAGE, EMPTY_DIR_VOLUME_SOURCE),
        6: one("secret", MESSAGE, SECRET_VOLUME_SOURCE),
        16: one("downwardAPI", MESSAGE, DOWNWARD_API_VOLUME_SOURCE),
        19: one("configMap", MESSAGE, CONFIG_MAP_VOLUME_SOURCE),
        26: one("projected", MESSAGE, PROJECTED_VOLUME_SOURCE),
    },
)
VOLUME = Msg("v1.Volume", {1: one("name", STRING), 2: one("volumeSource", INLINE, VOLUME_SOURCE)})

# ----------------------------------------------------------------------- core/v1: pods
SYSCTL = Msg("v1.Sysctl", {1: one("name", STRING), 2: one("value", STRING)})
POD_SECURITY_CONTEXT = Msg(
    "v1.PodSecurityContext",
    {
        1: one("seLinuxOptions", MESSAGE, SE_LINUX_OPTIONS),
        2: one("runAsUser", INT64 + "*"),
        3: one("runAsNonRoot", BOOL + "*"),
        4: many("supplementalGroups", INT64),
        5: one("fsGroup", INT64 + "*"),
        6: one("runAsGroup", INT64 + "*"),
        7: many("sysctls", MESSAGE, SYSCTL),
        9: one("fsGroupChangePolicy", STRING + "*"),
        10: one("seccompProfile", MESSAGE, SECCOMP_PROFILE),
        12: one("supplementalGroupsPolicy", STRING + "*"),
        13: one("seLinuxChangePolicy", STRING + "*"),
    },
)
TOLERATION = Msg(
    "v1.Toleration",
    {
        1: one("key", STRING),
        2: one("operator", STRING),
        3: one("value", STRING),
        4: one("effect", STRING),
        5: one("tolerationSeconds", INT64 + "*"),
    },
)
HOST_ALIAS = Msg("v1.HostAlias", {1: one("ip", STRING), 2: many("hostnames", STRING)})
POD_DNS_CONFIG_OPTION = Msg(
    "v1.PodDNSConfigOption", {1: one("name", STRING), 2: one("value", STRING + "*")}
)
POD_DNS_CONFIG = Msg(
    "v1.PodDNSConfig",
    {
        1: many("nameservers", STRING),
        2: many("searches", STRING),
        3: many("options", MESSAGE, POD_DNS_CONFIG_OPTION),
    },
)
POD_READINESS_GATE = Msg("v1.PodReadinessGate", {1: one("conditionType", STRING)})
POD_SCHEDULING_GATE = Msg("v1.PodSchedulingGate", {1: one("name", STRING)})
POD_OS = Msg("v1.PodOS", {1: one("name", STRING)})
POD_SPEC = Msg(
    "v1.PodSpec",
    {
        1: many("volumes", MESSAGE, VOLUME),
        2: many("containers", MESSAGE, CONTAINER),
        3: one("restartPolicy", STRING),
        4: one("terminationGracePeriodSeconds", INT64 + "*"),
        5: one("activeDeadlineSeconds", INT64 + "*"),
        6: one("dnsPolicy", STRING),
        7: one("nodeSelector", MAP, STRING),
        8: one("serviceAccountName", STRING),
        9: one("serviceAccount", STRING),
        10: one("nodeName", STRING),
        11: one("hostNetwork", BOOL),
        12: one("hostPID", BOOL),
        13: one("hostIPC", BOOL),
        14: one("securityContext", MESSAGE, POD_SECURITY_CONTEXT),
        15: many("imagePullSecrets", MESSAGE, LOCAL_OBJECT_REFERENCE),
        16: one("hostname", STRING),
        17: one("subdomain", STRING),
        19: one("schedulerName", STRING),
        20: many("initContainers", MESSAGE, CONTAINER),
        21: one("automountServiceAccountToken", BOOL + "*"),
        22: many("tolerations", MESSAGE, TOLERATION),
        23: many("hostAliases", MESSAGE, HOST_ALIAS),
        24: one("priorityClassName", STRING),
        25: one("priority", INT32 + "*"),
        26: one("dnsConfig", MESSAGE, POD_DNS_CONFIG),
        27: one("shareProcessNamespace", BOOL + "*"),
        28: many("readinessGates", MESSAGE, POD_READINESS_GATE),
        29: one("runtimeClassName", STRING + "*"),
        30: one("enableServiceLinks", BOOL + "*"),
        31: one("preemptionPolicy", STRING + "*"),
        32: one("overhead", MAP, QUANTITY),
        35: one("setHostnameAsFQDN", BOOL + "*"),
        36: one("os", MESSAGE, POD_OS),
        37: one("hostUsers", BOOL + "*"),
        38: many("schedulingGates", MESSAGE, POD_SCHEDULING_GATE),
    },
)
POD_CONDITION = Msg(
    "v1.PodCondition",
    {
        1: one("type", STRING),
        2: one("status", STRING),
        3: one("lastProbeTime", TIME),
        4: one("lastTransitionTime", TIME),
        5: one("reason", STRING),
        6: one("message", STRING),
        7: one("observedGeneration", INT64),
    },
)
POD_IP = Msg("v1.PodIP", {1: one("ip", STRING)})
HOST_IP = Msg("v1.HostIP", {1: one("ip", STRING)})
POD_STATUS = Msg(
    "v1.PodStatus",
    {
        1: one("phase", STRING),
        2: many("conditions", MESSAGE, POD_CONDITION),
        3: one("message", STRING),
        4: one("reason", STRING),
        5: one("hostIP", STRING),
        6: one("podIP", STRING),
        7: one("startTime", TIME),
        9: one("qosClass", STRING),
        11: one("nominatedNodeName", STRING),
        12: many("podIPs", MESSAGE, POD_IP),
        14: one("resize", STRING),
        16: many("hostIPs", MESSAGE, HOST_IP),
        17: one("observedGeneration", INT64),
    },
)
POD = Msg(
    "v1.Pod",
    {
        1: one("metadata", MESSAGE, OBJECT_META),
        2: one("spec", MESSAGE, POD_SPEC),
        3: one("status", MESSAGE, POD_STATUS),
    },
)
POD_TEMPLATE_SPEC = Msg(
    "v1.PodTemplateSpec",
    {1: one("metadata", MESSAGE, OBJECT_META), 2: one("spec", MESSAGE, POD_SPEC)},
)

# ----------------------------------------------------------------------- core/v1: the rest
NAMESPACE_CONDITION = Msg(
    "v1.NamespaceCondition",
    {
        1: one("type", STRING),
        2: one("status", STRING),
        4: one("lastTransitionTime", TIME),
        5: one("reason", STRING),
        6: one("message", STRING),
    },
)
NAMESPACE = Msg(
    "v1.Namespace",
    {
        1: one("metadata", MESSAGE, OBJECT_META),
        2: one("spec", MESSAGE, Msg("v1.NamespaceSpec", {1: many("finalizers", STRING)})),
        3: one(
            "status",
            MESSAGE,
            Msg(
                "v1.NamespaceStatus",
                {1: one("phase", STRING), 2: many("conditions", MESSAGE, NAMESPACE_CONDITION)},
            ),
        ),
    },
)
CONFIG_MAP = Msg(
    "v1.ConfigMap",
    {
        1: one("metadata", MESSAGE, OBJECT_META),
        2: one("data", MAP, STRING),
        3: one("binaryData", MAP, BYTES),
        4: one("immutable", BOOL + "*"),
    },
)
SECRET = Msg(
    "v1.Secret",
    {
        1: one("metadata", MESSAGE, OBJECT_META),
        2: one("data", MAP, BYTES),
        3: one("type", STRING),
        4: one("stringData", MAP, STRING),
        5: one("immutable", BOOL + "*"),
    },
)
SERVICE_ACCOUNT = Msg(
    "v1.ServiceAccount",
    {
        1: one("metadata", MESSAGE, OBJECT_META),
        2: many("secrets", MESSAGE, OBJECT_REFERENCE),
        3: many("imagePullSecrets", MESSAGE, LOCAL_OBJECT_REFERENCE),
        4: one("automountServiceAccountToken", BOOL + "*"),
    },
)
SERVICE_PORT = Msg(
    "v1.ServicePort",
    {
        1: one("name", STRING),
        2: one("protocol", STRING),
        3: one("port", INT32),
        4: one("targetPort", INTSTR),
        5: one("nodePort", INT32),
        6: one("appProtocol", STRING + "*"),
    },
)
SESSION_AFFINITY_CONFIG = Msg(
    "v1.SessionAffinityConfig",
    {
        1: one(
            "clientIP",
            MESSAGE,
            Msg("v1.ClientIPConfig", {1: one("timeoutSeconds", INT32 + "*")}),
        )
    },
)
SERVICE_SPEC = Msg(
    "v1.ServiceSpec",
    {
        1: many("ports", MESSAGE, SERVICE_PORT),
        2: one("selector", MAP, STRING),
        3: one("clusterIP", STRING),
        4: one("type", STRING),
        5: many("externalIPs", STRING),
        7: one("sessionAffinity", STRING),
        8: one("loadBalancerIP", STRING),
        9: many("loadBalancerSourceRanges", STRING),
        10: one("externalName", STRING),
        11: one("externalTrafficPolicy", STRING),
        12: one("healthCheckNodePort", INT32),
        13: one("publishNotReadyAddresses", BOOL),
        14: one("sessionAffinityConfig", MESSAGE, SESSION_AFFINITY_CONFIG),
        17: one("ipFamilyPolicy", STRING + "*"),
        18: many("clusterIPs", STRING),
        19: many("ipFamilies", STRING),
        20: one("allocateLoadBalancerNodePorts", BOOL + "*"),
        21: one("loadBalancerClass", STRING + "*"),
        22: one("internalTrafficPolicy", STRING + "*"),
        23: one("trafficDistribution", STRING + "*"),
    },
)
PORT_STATUS = Msg(
    "v1.PortStatus",
    {1: one("port", INT32), 2: one("protocol", STRING), 3: one("error", STRING + "*")},
)
LOAD_BALANCER_INGRESS = Msg(
    "v1.LoadBalancerIngress",
    {
        1: one("ip", STRING),
        2: one("hostname", STRING),
        3: one("ipMode", STRING + "*"),
        4: many("ports", MESSAGE, PORT_STATUS),
    },
)
SERVICE_STATUS = Msg(
    "v1.ServiceStatus",
    {
        1: one(
            "loadBalancer",
            MESSAGE,
            Msg("v1.LoadBalancerStatus", {1: many("ingress", MESSAGE, LOAD_BALANCER_INGRESS)}),
        ),
        2: many("conditions", MESSAGE, CONDITION),
    },
)
SERVICE = Msg(
    "v1.Service",
    {
        1: one("metadata", MESSAGE, OBJECT_META),
        2: one("spec", MESSAGE, SERVICE_SPEC),
        3: one("status", MESSAGE, SERVICE_STATUS),
    },
)

# ----------------------------------------------------------------------- apps/v1
ROLLING_UPDATE_DEPLOYMENT = Msg(
    "v1.RollingUpdateDeployment",
    {1: one("maxUnavailable", INTSTR + "*"), 2: one("maxSurge", INTSTR + "*")},
)
DEPLOYMENT_STRATEGY = Msg(
    "v1.DeploymentStrategy",
    {1: one("type", STRING), 2: one("rollingUpdate", MESSAGE, ROLLING_UPDATE_DEPLOYMENT)},
)
DEPLOYMENT_SPEC = Msg(
    "v1.DeploymentSpec",
    {
        1: one("replicas", INT32 + "*"),
        2: one("selector", MESSAGE, LABEL_SELECTOR),
        3: one("template", MESSAGE, POD_TEMPLATE_SPEC),
        4: one("strategy", MESSAGE, DEPLOYMENT_STRATEGY),
        5: one("minReadySeconds", INT32),
        6: one("revisionHistoryLimit", INT32 + "*"),
        7: one("paused", BOOL),
        9: one("progressDeadlineSeconds", INT32 + "*"),
        10: one("podReplacementPolicy", STRING + "*"),
    },
)
DEPLOYMENT_CONDITION = Msg(
    "v1.DeploymentCondition",
    {
        1: one("type", STRING),
        2: one("status", STRING),
        4: one("reason", STRING),
        5: one("message", STRING),
        6: one("lastUpdateTime", TIME),
        7: one("lastTransitionTime", TIME),
    },
)
DEPLOYMENT_STATUS = Msg(
    "v1.DeploymentStatus",
    {
        1: one("observedGeneration", INT64),
        2: one("replicas", INT32),
        3: one("updatedReplicas", INT32),
        4: one("availableReplicas", INT32),
        5: one("unavailableReplicas", INT32),
        6: many("conditions", MESSAGE, DEPLOYMENT_CONDITION),
        7: one("readyReplicas", INT32),
        8: one("collisionCount", INT32 + "*"),
        9: one("terminatingReplicas", INT32 + "*"),
    },
)
DEPLOYMENT = Msg(
    "v1.Deployment",
    {
        1: one("metadata", MESSAGE, OBJECT_META),
        2: one("spec", MESSAGE, DEPLOYMENT_SPEC),
        3: one("status", MESSAGE, DEPLOYMENT_STATUS),
    },
)

# (apiVersion, kind) of the Unknown envelope -> the message of `raw`.
ROOTS: Final[dict[tuple[str, str], Msg]] = {
    ("v1", "ConfigMap"): CONFIG_MAP,
    ("v1", "Namespace"): NAMESPACE,
    ("v1", "Pod"): POD,
    ("v1", "Secret"): SECRET,
    ("v1", "Service"): SERVICE,
    ("v1", "ServiceAccount"): SERVICE_ACCOUNT,
    ("apps/v1", "Deployment"): DEPLOYMENT,
}


_UNKNOWN = Msg("runtime.Unknown", {})  # decoded by hand in `_decode`; named in errors
_TYPE_META = Msg("runtime.TypeMeta", {})


# ----------------------------------------------------------------------- errors
class _Malformed(Exception):
    """Bytes that are not valid protobuf (or not a valid value): becomes a 400."""


def _unsupported_field(number: int, msg: Msg) -> ApiError:
    return ApiError(
        415,
        "UnsupportedMediaType",
        f"unsupported field {number} in protobuf {msg.name}; send JSON instead",
    )


def _unsupported_kind(api_version: str, kind: str) -> ApiError:
    accepted = ", ".join(f"{av} {k}" for av, k in sorted(ROOTS, key=lambda r: (r[1], r[0])))
    return ApiError(
        415,
        "UnsupportedMediaType",
        f"protobuf bodies are accepted only for {accepted}; send application/json "
        f"(got {api_version or '<no apiVersion>'} {kind or '<no kind>'})",
    )


# ----------------------------------------------------------------------- wire format
def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = 0
    for i in range(10):
        if pos >= len(data):
            raise _Malformed("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            if result >= 1 << 64:
                raise _Malformed("varint overflows 64 bits")
            return result, pos
    raise _Malformed("varint longer than 10 bytes")


def _fields(data: bytes) -> list[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of each field: an int for varint/fixed, bytes for
    length-delimited."""
    out: list[tuple[int, int, int | bytes]] = []
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if number == 0 or number > 0x1FFFFFFF:
            raise _Malformed(f"invalid field number {number}")
        value: int | bytes
        if wire == _WIRE_VARINT:
            value, pos = _varint(data, pos)
        elif wire == _WIRE_LEN:
            length, pos = _varint(data, pos)
            if length > len(data) - pos:
                raise _Malformed(f"field {number} runs past the end of its message")
            value, pos = data[pos : pos + length], pos + length
        elif wire in (_WIRE_FIXED64, _WIRE_FIXED32):
            size = 8 if wire == _WIRE_FIXED64 else 4
            if size > len(data) - pos:
                raise _Malformed(f"field {number} runs past the end of its message")
            value, pos = int.from_bytes(data[pos : pos + size], "little"), pos + size
        else:
            raise _Malformed(f"field {number} has unsupported wire type {wire}")
        out.append((number, wire, value))
    return out


def _signed(value: int, bits: int) -> int:
    if value >= 1 << 63:
        value -= 1 << 64
    if not -(1 << (bits - 1)) <= value < 1 << (bits - 1):
        raise _Malformed(f"{value} does not fit in int{bits}")
    return value


# ----------------------------------------------------------------------- values
def _rfc3339(ts: dict[str, Any], micro: bool) -> str | None:
    seconds, nanos = ts.get("seconds", 0), ts.get("nanos", 0)
    if seconds == 0 and nanos == 0:
        return None  # Go's zero time: JSON null, and never sent by a client
    if not 0 <= nanos < 1_000_000_000:
        raise _Malformed(f"timestamp nanos {nanos} out of range")
    try:
        t = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(
            seconds=seconds, microseconds=nanos // 1000
        )
    except OverflowError:
        raise _Malformed(f"timestamp {seconds}s out of range") from None
    text = f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:{t.second:02d}"
    return f"{text}.{t.microsecond:06d}Z" if micro else f"{text}Z"


_MISSING: Final = object()
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def _scalar(kind: str, wire: int, value: int | bytes, msg: Msg, number: int) -> Any:
    if kind in _VARINT_KINDS:
        if not isinstance(value, int) or wire != _WIRE_VARINT:
            raise _Malformed(f"field {number} of {msg.name} is not a varint")
        if kind == BOOL:
            return value != 0
        return _signed(value, 32 if kind == INT32 else 64)
    if not isinstance(value, bytes):
        raise _Malformed(f"field {number} of {msg.name} is not length-delimited")
    if kind == STRING:
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise _Malformed(f"field {number} of {msg.name} is not UTF-8") from None
    if kind == BYTES:
        return base64.b64encode(value).decode("ascii")
    if kind in (TIME, MICROTIME):
        return _rfc3339(_message(TIMESTAMP, value), micro=kind == MICROTIME)
    if kind == INTSTR:
        ios = _message(INT_OR_STRING, value)
        if ios.get("type", 0) == 1:
            return ios.get("strVal", "")
        return ios.get("intVal", 0)
    if kind == QUANTITY:
        return _message(QUANTITY_MSG, value).get("string", "")
    if kind == FIELDSV1:
        raw = _message(FIELDS_V1, value).get("Raw", "")
        if not raw:
            return {}
        try:
            return json.loads(base64.b64decode(raw))
        except (ValueError, RecursionError):
            raise _Malformed(f"field {number} of {msg.name} is not JSON") from None
    raise AssertionError(f"unknown field kind {kind!r}")  # a table bug, not input


def _is_zero(value: Any) -> bool:
    return value is None or value == "" or value == 0 or value is False


def _map_entry(entry: bytes, value_kind: str, msg: Msg, number: int) -> tuple[str, Any]:
    key: Any = ""
    value: Any = _MISSING
    for n, wire, v in _fields(entry):
        if n == 1:
            key = _scalar(STRING, wire, v, msg, number)
        elif n == 2:
            value = _scalar(value_kind, wire, v, msg, number)
        else:
            raise _Malformed(f"map entry of field {number} of {msg.name} has field {n}")
    if value is _MISSING:
        value = 0 if value_kind in _VARINT_KINDS else ""
    return key, value


def _message(msg: Msg, data: bytes) -> dict[str, Any]:
    out: dict[str, Any] = {}
    chunks: dict[int, list[bytes]] = {}
    for number, wire, value in _fields(data):
        spec = msg.fields.get(number)
        if spec is None:
            raise _unsupported_field(number, msg)
        name, kind, sub, repeated = spec
        keep = kind.endswith("*")
        kind = kind.rstrip("*")
        if repeated:
            items = out.setdefault(name, [])
            if kind in _VARINT_KINDS and isinstance(value, bytes):  # packed
                pos = 0
                while pos < len(value):
                    item, pos = _varint(value, pos)
                    items.append(_scalar(kind, _WIRE_VARINT, item, msg, number))
            elif kind == MESSAGE:
                assert isinstance(sub, Msg)
                items.append(_message(sub, _len_delimited(value, msg, number)))
            else:
                items.append(_scalar(kind, wire, value, msg, number))
        elif kind == MAP:
            assert isinstance(sub, str)
            key, item = _map_entry(_len_delimited(value, msg, number), sub, msg, number)
            out.setdefault(name, {})[key] = item
        elif kind in (MESSAGE, INLINE):
            # Repeated occurrences of a message merge, as protobuf says: decode their
            # concatenation once, after the loop (the key keeps its first position).
            chunks.setdefault(number, []).append(_len_delimited(value, msg, number))
            if kind == MESSAGE:
                out.setdefault(name, {})
        else:
            item = _scalar(kind, wire, value, msg, number)
            if (keep and item is not None) or not _is_zero(item):
                out[name] = item
            else:
                out.pop(name, None)  # the last occurrence wins, and it is Go's zero value
    for number, parts in chunks.items():
        name, kind, sub, _ = msg.fields[number]
        assert isinstance(sub, Msg)
        decoded = _message(sub, b"".join(parts))
        if kind == INLINE:
            out.update(decoded)
        else:
            out[name] = decoded
    return out


def _len_delimited(value: int | bytes, msg: Msg, number: int) -> bytes:
    if not isinstance(value, bytes):
        raise _Malformed(f"field {number} of {msg.name} is not length-delimited")
    return value


# ----------------------------------------------------------------------- entry point
def decode(body: bytes) -> dict[str, Any]:
    """A Kubernetes protobuf request body as the JSON-shaped object. Raises only ApiError:
    400 for malformed bytes, 415 for kinds or fields this decoder does not describe."""
    try:
        return _decode(body)
    except _Malformed as exc:
        raise errors.bad_request(f"the protobuf request body is malformed: {exc}") from None


def _decode(body: bytes) -> dict[str, Any]:
    if not body.startswith(MAGIC):
        raise _Malformed("it does not start with the Kubernetes protobuf magic k8s\\x00")
    api_version = kind = encoding = content_type = ""
    raw = b""
    for number, wire, value in _fields(body[len(MAGIC) :]):
        if not isinstance(value, bytes) or wire != _WIRE_LEN:
            raise _Malformed(f"field {number} of runtime.Unknown is not length-delimited")
        if number == 1:
            for n, w, v in _fields(value):
                if not isinstance(v, bytes) or w != _WIRE_LEN or n not in (1, 2):
                    raise _Malformed(f"field {n} of runtime.TypeMeta is not a string")
                text = _scalar(STRING, w, v, _TYPE_META, n)
                api_version, kind = (text, kind) if n == 1 else (api_version, text)
        elif number == 2:
            raw = value
        elif number in (3, 4):
            text = _scalar(STRING, wire, value, _UNKNOWN, number)
            encoding, content_type = (text, content_type) if number == 3 else (encoding, text)
        else:
            raise _Malformed(f"runtime.Unknown has no field {number}")
    if encoding:
        raise ApiError(
            415,
            "UnsupportedMediaType",
            f"protobuf bodies with content encoding {encoding!r} are not supported; "
            "send application/json",
        )
    if content_type not in ("", MEDIA_TYPE):
        raise ApiError(
            415,
            "UnsupportedMediaType",
            f"the protobuf envelope holds {content_type!r}; send application/json",
        )
    root = ROOTS.get((api_version, kind))
    if root is None:
        raise _unsupported_kind(api_version, kind)
    return {"apiVersion": api_version, "kind": kind, **_message(root, raw)}
