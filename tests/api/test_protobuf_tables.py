"""The protobuf codec's message tables, derived from the kinds' schemas (`kube.schema.proto`),
are exactly the hand-written tables they replaced (issue 17): every message reachable from a
root, every field number, json name, kind, pointer flag, sub-message and repetition. The frozen
copy below is the old `protobuf.py`'s tables, flattened by message name; it stays until the
derived tables are the only ones anyone remembers."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.kube import protobuf
from orchestrator.kube.schema.builders import obj, string
from orchestrator.kube.schema.kind import Kind
from orchestrator.kube.schema.proto import Msg, ProtoTableError, message, roots, wire

FROZEN_ROOTS = {
    ("v1", "ConfigMap"): "v1.ConfigMap",
    ("v1", "Namespace"): "v1.Namespace",
    ("v1", "Pod"): "v1.Pod",
    ("v1", "Secret"): "v1.Secret",
    ("v1", "Service"): "v1.Service",
    ("v1", "ServiceAccount"): "v1.ServiceAccount",
    ("apps/v1", "Deployment"): "v1.Deployment",
}
FROZEN_TABLES: dict[str, dict[int, str]] = {
    "v1.Capabilities": {
        1: "add []string",
        2: "drop []string",
    },
    "v1.ClientIPConfig": {
        1: "timeoutSeconds int32*",
    },
    "v1.Condition": {
        1: "type string",
        2: "status string",
        3: "observedGeneration int64",
        4: "lastTransitionTime time",
        5: "reason string",
        6: "message string",
    },
    "v1.ConfigMap": {
        1: "metadata message v1.ObjectMeta",
        2: "data map string",
        3: "binaryData map bytes",
        4: "immutable bool*",
    },
    "v1.ConfigMapEnvSource": {
        1: "localObjectReference inline v1.LocalObjectReference",
        2: "optional bool*",
    },
    "v1.ConfigMapKeySelector": {
        1: "localObjectReference inline v1.LocalObjectReference",
        2: "key string",
        3: "optional bool*",
    },
    "v1.ConfigMapProjection": {
        1: "localObjectReference inline v1.LocalObjectReference",
        2: "items []message v1.KeyToPath",
        4: "optional bool*",
    },
    "v1.ConfigMapVolumeSource": {
        1: "localObjectReference inline v1.LocalObjectReference",
        2: "items []message v1.KeyToPath",
        3: "defaultMode int32*",
        4: "optional bool*",
    },
    "v1.Container": {
        1: "name string",
        2: "image string",
        3: "command []string",
        4: "args []string",
        5: "workingDir string",
        6: "ports []message v1.ContainerPort",
        7: "env []message v1.EnvVar",
        8: "resources message v1.ResourceRequirements",
        9: "volumeMounts []message v1.VolumeMount",
        10: "livenessProbe message v1.Probe",
        11: "readinessProbe message v1.Probe",
        12: "lifecycle message v1.Lifecycle",
        13: "terminationMessagePath string",
        14: "imagePullPolicy string",
        15: "securityContext message v1.SecurityContext",
        16: "stdin bool",
        17: "stdinOnce bool",
        18: "tty bool",
        19: "envFrom []message v1.EnvFromSource",
        20: "terminationMessagePolicy string",
        21: "volumeDevices []message v1.VolumeDevice",
        22: "startupProbe message v1.Probe",
        23: "resizePolicy []message v1.ContainerResizePolicy",
        24: "restartPolicy string*",
    },
    "v1.ContainerPort": {
        1: "name string",
        2: "hostPort int32",
        3: "containerPort int32",
        4: "protocol string",
        5: "hostIP string",
    },
    "v1.ContainerResizePolicy": {
        1: "resourceName string",
        2: "restartPolicy string",
    },
    "v1.Deployment": {
        1: "metadata message v1.ObjectMeta",
        2: "spec message v1.DeploymentSpec",
        3: "status message v1.DeploymentStatus",
    },
    "v1.DeploymentCondition": {
        1: "type string",
        2: "status string",
        4: "reason string",
        5: "message string",
        6: "lastUpdateTime time",
        7: "lastTransitionTime time",
    },
    "v1.DeploymentSpec": {
        1: "replicas int32*",
        2: "selector message v1.LabelSelector",
        3: "template message v1.PodTemplateSpec",
        4: "strategy message v1.DeploymentStrategy",
        5: "minReadySeconds int32",
        6: "revisionHistoryLimit int32*",
        7: "paused bool",
        9: "progressDeadlineSeconds int32*",
        10: "podReplacementPolicy string*",
    },
    "v1.DeploymentStatus": {
        1: "observedGeneration int64",
        2: "replicas int32",
        3: "updatedReplicas int32",
        4: "availableReplicas int32",
        5: "unavailableReplicas int32",
        6: "conditions []message v1.DeploymentCondition",
        7: "readyReplicas int32",
        8: "collisionCount int32*",
        9: "terminatingReplicas int32*",
    },
    "v1.DeploymentStrategy": {
        1: "type string",
        2: "rollingUpdate message v1.RollingUpdateDeployment",
    },
    "v1.DownwardAPIProjection": {
        1: "items []message v1.DownwardAPIVolumeFile",
    },
    "v1.DownwardAPIVolumeFile": {
        1: "path string",
        2: "fieldRef message v1.ObjectFieldSelector",
        3: "resourceFieldRef message v1.ResourceFieldSelector",
        4: "mode int32*",
    },
    "v1.DownwardAPIVolumeSource": {
        1: "items []message v1.DownwardAPIVolumeFile",
        2: "defaultMode int32*",
    },
    "v1.EmptyDirVolumeSource": {
        1: "medium string",
        2: "sizeLimit quantity*",
    },
    "v1.EnvFromSource": {
        1: "prefix string",
        2: "configMapRef message v1.ConfigMapEnvSource",
        3: "secretRef message v1.SecretEnvSource",
    },
    "v1.EnvVar": {
        1: "name string",
        2: "value string",
        3: "valueFrom message v1.EnvVarSource",
    },
    "v1.EnvVarSource": {
        1: "fieldRef message v1.ObjectFieldSelector",
        2: "resourceFieldRef message v1.ResourceFieldSelector",
        3: "configMapKeyRef message v1.ConfigMapKeySelector",
        4: "secretKeyRef message v1.SecretKeySelector",
    },
    "v1.ExecAction": {
        1: "command []string",
    },
    "v1.GRPCAction": {
        1: "port int32",
        2: "service string*",
    },
    "v1.HTTPGetAction": {
        1: "path string",
        2: "port intstr",
        3: "host string",
        4: "scheme string",
        5: "httpHeaders []message v1.HTTPHeader",
    },
    "v1.HTTPHeader": {
        1: "name string",
        2: "value string",
    },
    "v1.HostAlias": {
        1: "ip string",
        2: "hostnames []string",
    },
    "v1.HostIP": {
        1: "ip string",
    },
    "v1.HostPathVolumeSource": {
        1: "path string",
        2: "type string*",
    },
    "v1.KeyToPath": {
        1: "key string",
        2: "path string",
        3: "mode int32*",
    },
    "v1.LabelSelector": {
        1: "matchLabels map string",
        2: "matchExpressions []message v1.LabelSelectorRequirement",
    },
    "v1.LabelSelectorRequirement": {
        1: "key string",
        2: "operator string",
        3: "values []string",
    },
    "v1.Lifecycle": {
        1: "postStart message v1.LifecycleHandler",
        2: "preStop message v1.LifecycleHandler",
        3: "stopSignal string*",
    },
    "v1.LifecycleHandler": {
        1: "exec message v1.ExecAction",
        2: "httpGet message v1.HTTPGetAction",
        3: "tcpSocket message v1.TCPSocketAction",
        4: "sleep message v1.SleepAction",
    },
    "v1.LoadBalancerIngress": {
        1: "ip string",
        2: "hostname string",
        3: "ipMode string*",
        4: "ports []message v1.PortStatus",
    },
    "v1.LoadBalancerStatus": {
        1: "ingress []message v1.LoadBalancerIngress",
    },
    "v1.LocalObjectReference": {
        1: "name string",
    },
    "v1.ManagedFieldsEntry": {
        1: "manager string",
        2: "operation string",
        3: "apiVersion string",
        4: "time time",
        6: "fieldsType string",
        7: "fieldsV1 fieldsv1",
        8: "subresource string",
    },
    "v1.Namespace": {
        1: "metadata message v1.ObjectMeta",
        2: "spec message v1.NamespaceSpec",
        3: "status message v1.NamespaceStatus",
    },
    "v1.NamespaceCondition": {
        1: "type string",
        2: "status string",
        4: "lastTransitionTime time",
        5: "reason string",
        6: "message string",
    },
    "v1.NamespaceSpec": {
        1: "finalizers []string",
    },
    "v1.NamespaceStatus": {
        1: "phase string",
        2: "conditions []message v1.NamespaceCondition",
    },
    "v1.ObjectFieldSelector": {
        1: "apiVersion string",
        2: "fieldPath string",
    },
    "v1.ObjectMeta": {
        1: "name string",
        2: "generateName string",
        3: "namespace string",
        4: "selfLink string",
        5: "uid string",
        6: "resourceVersion string",
        7: "generation int64",
        8: "creationTimestamp time",
        9: "deletionTimestamp time",
        10: "deletionGracePeriodSeconds int64*",
        11: "labels map string",
        12: "annotations map string",
        13: "ownerReferences []message v1.OwnerReference",
        14: "finalizers []string",
        17: "managedFields []message v1.ManagedFieldsEntry",
    },
    "v1.ObjectReference": {
        1: "kind string",
        2: "namespace string",
        3: "name string",
        4: "uid string",
        5: "apiVersion string",
        6: "resourceVersion string",
        7: "fieldPath string",
    },
    "v1.OwnerReference": {
        1: "kind string",
        3: "name string",
        4: "uid string",
        5: "apiVersion string",
        6: "controller bool*",
        7: "blockOwnerDeletion bool*",
    },
    "v1.Pod": {
        1: "metadata message v1.ObjectMeta",
        2: "spec message v1.PodSpec",
        3: "status message v1.PodStatus",
    },
    "v1.PodCondition": {
        1: "type string",
        2: "status string",
        3: "lastProbeTime time",
        4: "lastTransitionTime time",
        5: "reason string",
        6: "message string",
        7: "observedGeneration int64",
    },
    "v1.PodDNSConfig": {
        1: "nameservers []string",
        2: "searches []string",
        3: "options []message v1.PodDNSConfigOption",
    },
    "v1.PodDNSConfigOption": {
        1: "name string",
        2: "value string*",
    },
    "v1.PodIP": {
        1: "ip string",
    },
    "v1.PodOS": {
        1: "name string",
    },
    "v1.PodReadinessGate": {
        1: "conditionType string",
    },
    "v1.PodSchedulingGate": {
        1: "name string",
    },
    "v1.PodSecurityContext": {
        1: "seLinuxOptions message v1.SELinuxOptions",
        2: "runAsUser int64*",
        3: "runAsNonRoot bool*",
        4: "supplementalGroups []int64",
        5: "fsGroup int64*",
        6: "runAsGroup int64*",
        7: "sysctls []message v1.Sysctl",
        9: "fsGroupChangePolicy string*",
        10: "seccompProfile message v1.SeccompProfile",
        12: "supplementalGroupsPolicy string*",
        13: "seLinuxChangePolicy string*",
    },
    "v1.PodSpec": {
        1: "volumes []message v1.Volume",
        2: "containers []message v1.Container",
        3: "restartPolicy string",
        4: "terminationGracePeriodSeconds int64*",
        5: "activeDeadlineSeconds int64*",
        6: "dnsPolicy string",
        7: "nodeSelector map string",
        8: "serviceAccountName string",
        9: "serviceAccount string",
        10: "nodeName string",
        11: "hostNetwork bool",
        12: "hostPID bool",
        13: "hostIPC bool",
        14: "securityContext message v1.PodSecurityContext",
        15: "imagePullSecrets []message v1.LocalObjectReference",
        16: "hostname string",
        17: "subdomain string",
        19: "schedulerName string",
        20: "initContainers []message v1.Container",
        21: "automountServiceAccountToken bool*",
        22: "tolerations []message v1.Toleration",
        23: "hostAliases []message v1.HostAlias",
        24: "priorityClassName string",
        25: "priority int32*",
        26: "dnsConfig message v1.PodDNSConfig",
        27: "shareProcessNamespace bool*",
        28: "readinessGates []message v1.PodReadinessGate",
        29: "runtimeClassName string*",
        30: "enableServiceLinks bool*",
        31: "preemptionPolicy string*",
        32: "overhead map quantity",
        35: "setHostnameAsFQDN bool*",
        36: "os message v1.PodOS",
        37: "hostUsers bool*",
        38: "schedulingGates []message v1.PodSchedulingGate",
    },
    "v1.PodStatus": {
        1: "phase string",
        2: "conditions []message v1.PodCondition",
        3: "message string",
        4: "reason string",
        5: "hostIP string",
        6: "podIP string",
        7: "startTime time",
        9: "qosClass string",
        11: "nominatedNodeName string",
        12: "podIPs []message v1.PodIP",
        14: "resize string",
        16: "hostIPs []message v1.HostIP",
        17: "observedGeneration int64",
    },
    "v1.PodTemplateSpec": {
        1: "metadata message v1.ObjectMeta",
        2: "spec message v1.PodSpec",
    },
    "v1.PortStatus": {
        1: "port int32",
        2: "protocol string",
        3: "error string*",
    },
    "v1.Probe": {
        1: "handler inline v1.ProbeHandler",
        2: "initialDelaySeconds int32",
        3: "timeoutSeconds int32",
        4: "periodSeconds int32",
        5: "successThreshold int32",
        6: "failureThreshold int32",
        7: "terminationGracePeriodSeconds int64*",
    },
    "v1.ProbeHandler": {
        1: "exec message v1.ExecAction",
        2: "httpGet message v1.HTTPGetAction",
        3: "tcpSocket message v1.TCPSocketAction",
        4: "grpc message v1.GRPCAction",
    },
    "v1.ProjectedVolumeSource": {
        1: "sources []message v1.VolumeProjection",
        2: "defaultMode int32*",
    },
    "v1.ResourceClaim": {
        1: "name string",
        2: "request string",
    },
    "v1.ResourceFieldSelector": {
        1: "containerName string",
        2: "resource string",
        3: "divisor quantity",
    },
    "v1.ResourceRequirements": {
        1: "limits map quantity",
        2: "requests map quantity",
        3: "claims []message v1.ResourceClaim",
    },
    "v1.RollingUpdateDeployment": {
        1: "maxUnavailable intstr*",
        2: "maxSurge intstr*",
    },
    "v1.SELinuxOptions": {
        1: "user string",
        2: "role string",
        3: "type string",
        4: "level string",
    },
    "v1.SeccompProfile": {
        1: "type string",
        2: "localhostProfile string*",
    },
    "v1.Secret": {
        1: "metadata message v1.ObjectMeta",
        2: "data map bytes",
        3: "type string",
        4: "stringData map string",
        5: "immutable bool*",
    },
    "v1.SecretEnvSource": {
        1: "localObjectReference inline v1.LocalObjectReference",
        2: "optional bool*",
    },
    "v1.SecretKeySelector": {
        1: "localObjectReference inline v1.LocalObjectReference",
        2: "key string",
        3: "optional bool*",
    },
    "v1.SecretProjection": {
        1: "localObjectReference inline v1.LocalObjectReference",
        2: "items []message v1.KeyToPath",
        4: "optional bool*",
    },
    "v1.SecretVolumeSource": {
        1: "secretName string",
        2: "items []message v1.KeyToPath",
        3: "defaultMode int32*",
        4: "optional bool*",
    },
    "v1.SecurityContext": {
        1: "capabilities message v1.Capabilities",
        2: "privileged bool*",
        3: "seLinuxOptions message v1.SELinuxOptions",
        4: "runAsUser int64*",
        5: "runAsNonRoot bool*",
        6: "readOnlyRootFilesystem bool*",
        7: "allowPrivilegeEscalation bool*",
        8: "runAsGroup int64*",
        9: "procMount string*",
        11: "seccompProfile message v1.SeccompProfile",
    },
    "v1.Service": {
        1: "metadata message v1.ObjectMeta",
        2: "spec message v1.ServiceSpec",
        3: "status message v1.ServiceStatus",
    },
    "v1.ServiceAccount": {
        1: "metadata message v1.ObjectMeta",
        2: "secrets []message v1.ObjectReference",
        3: "imagePullSecrets []message v1.LocalObjectReference",
        4: "automountServiceAccountToken bool*",
    },
    "v1.ServiceAccountTokenProjection": {
        1: "audience string",
        2: "expirationSeconds int64*",
        3: "path string",
    },
    "v1.ServicePort": {
        1: "name string",
        2: "protocol string",
        3: "port int32",
        4: "targetPort intstr",
        5: "nodePort int32",
        6: "appProtocol string*",
    },
    "v1.ServiceSpec": {
        1: "ports []message v1.ServicePort",
        2: "selector map string",
        3: "clusterIP string",
        4: "type string",
        5: "externalIPs []string",
        7: "sessionAffinity string",
        8: "loadBalancerIP string",
        9: "loadBalancerSourceRanges []string",
        10: "externalName string",
        11: "externalTrafficPolicy string",
        12: "healthCheckNodePort int32",
        13: "publishNotReadyAddresses bool",
        14: "sessionAffinityConfig message v1.SessionAffinityConfig",
        17: "ipFamilyPolicy string*",
        18: "clusterIPs []string",
        19: "ipFamilies []string",
        20: "allocateLoadBalancerNodePorts bool*",
        21: "loadBalancerClass string*",
        22: "internalTrafficPolicy string*",
        23: "trafficDistribution string*",
    },
    "v1.ServiceStatus": {
        1: "loadBalancer message v1.LoadBalancerStatus",
        2: "conditions []message v1.Condition",
    },
    "v1.SessionAffinityConfig": {
        1: "clientIP message v1.ClientIPConfig",
    },
    "v1.SleepAction": {
        1: "seconds int64",
    },
    "v1.Sysctl": {
        1: "name string",
        2: "value string",
    },
    "v1.TCPSocketAction": {
        1: "port intstr",
        2: "host string",
    },
    "v1.Toleration": {
        1: "key string",
        2: "operator string",
        3: "value string",
        4: "effect string",
        5: "tolerationSeconds int64*",
    },
    "v1.Volume": {
        1: "name string",
        2: "volumeSource inline v1.VolumeSource",
    },
    "v1.VolumeDevice": {
        1: "name string",
        2: "devicePath string",
    },
    "v1.VolumeMount": {
        1: "name string",
        2: "readOnly bool",
        3: "mountPath string",
        4: "subPath string",
        5: "mountPropagation string*",
        6: "subPathExpr string",
        7: "recursiveReadOnly string*",
    },
    "v1.VolumeProjection": {
        1: "secret message v1.SecretProjection",
        2: "downwardAPI message v1.DownwardAPIProjection",
        3: "configMap message v1.ConfigMapProjection",
        4: "serviceAccountToken message v1.ServiceAccountTokenProjection",
    },
    "v1.VolumeSource": {
        1: "hostPath message v1.HostPathVolumeSource",
        2: "emptyDir message v1.EmptyDirVolumeSource",
        6: "secret message v1.SecretVolumeSource",
        16: "downwardAPI message v1.DownwardAPIVolumeSource",
        19: "configMap message v1.ConfigMapVolumeSource",
        26: "projected message v1.ProjectedVolumeSource",
    },
}


def flatten(roots: dict[tuple[str, str], Msg]) -> dict[str, dict[int, str]]:
    """message name -> {number: "jsonName [](kind)[*] [sub]"}, asserting one table per name."""
    out: dict[str, dict[int, str]] = {}

    def visit(msg: Msg) -> None:
        table: dict[int, str] = {}
        for number, (name, kind, sub, repeated) in sorted(msg.fields.items()):
            text = f"{name} {'[]' if repeated else ''}{kind}"
            if isinstance(sub, Msg):
                text += " " + sub.name
            elif sub:
                text += " " + sub
            table[number] = text
        assert out.setdefault(msg.name, table) == table, msg.name
        for _, _, sub, _ in msg.fields.values():
            if isinstance(sub, Msg):
                visit(sub)

    for msg in roots.values():
        visit(msg)
    return out


def test_roots_are_the_old_roots() -> None:
    assert {key: msg.name for key, msg in protobuf.ROOTS.items()} == FROZEN_ROOTS


@pytest.mark.parametrize("name", sorted(FROZEN_TABLES))
def test_each_old_table_is_derived_the_same(name: str) -> None:
    assert flatten(protobuf.ROOTS).get(name) == FROZEN_TABLES[name]


def test_no_table_is_derived_that_the_old_code_did_not_have() -> None:
    assert sorted(flatten(protobuf.ROOTS)) == sorted(FROZEN_TABLES)


def kind_with(proto: dict[str, Any]) -> Kind:
    schema = obj("A thing.", {"name": string("Its name.")}, name="io.example.v1.Thing", proto=proto)
    return Kind("example.io", "v1", "Thing", "things", "thing", True, schema)


def test_derivation_reads_numbers_kinds_and_wire_only_fields() -> None:
    (msg,) = roots([kind_with({"name": 1, "extra": wire(2, "int64", keep=True)})]).values()
    assert msg.name == "v1.Thing"
    assert msg.fields == {1: ("name", "string", None, False), 2: ("extra", "int64*", None, False)}


@pytest.mark.parametrize(
    ("proto", "error"),
    [
        ({"missing": 1}, "missing is not a property"),
        ({"name": 1, "other": wire(1, "string")}, "field number 1 is used twice"),
        ({"name": wire(1, "message", msg=message("v1.X", {"y": 1}))}, "y is not a property"),
    ],
)
def test_annotations_that_do_not_describe_the_schema_are_refused(
    proto: dict[str, Any], error: str
) -> None:
    with pytest.raises(ProtoTableError, match=error):
        roots([kind_with(proto)])
