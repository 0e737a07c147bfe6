"""Kubernetes protobuf request bodies: the bytes kubectl 1.32's generators really send (captured
once from `kubectl create ...` against a recording plain-HTTP proxy in front of a server) decode
to the JSON the same command would have posted; hand-encoded messages exercise the rest of the
tables (volumes, probes, env sources, quantities, times, owner references); unknown fields and
kinds are a 415 naming them, broken bytes a 400, and nothing else ever escapes (Hypothesis)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from apiharness import Harness, api_server
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.apiserver.codec import decode_body
from orchestrator.kube import protobuf
from orchestrator.kube.errors import ApiError

PB = protobuf.MEDIA_TYPE

# ------------------------------------------------------------------ captured from kubectl 1.32.4
# kubectl create namespace foo
NAMESPACE_HEX = (
    "6b3873000a0f0a02763112094e616d657370616365121b0a130a03666f6f12001a0022002a003200380042001200"
    "1a020a001a002200"
)
# kubectl create configmap cm1 --from-literal=a=b --from-literal=c=d
CONFIGMAP_HEX = (
    "6b3873000a0f0a0276311209436f6e6669674d617012250a130a03636d3112001a0022002a003200380042001206"
    "0a016112016212060a01631201641a002200"
)
# kubectl create configmap bin --from-file=blob=<bytes 00 ff fe 'bin'> --from-literal=x=y
BINARY_CONFIGMAP_HEX = (
    "6b3873000a0f0a0276311209436f6e6669674d6170122d0a130a0362696e12001a0022002a003200380042001206"
    "0a01781201791a0e0a04626c6f62120600fffe62696e1a002200"
)
# kubectl create secret generic s1 --from-literal=user=admin --from-literal=pw=s3cr3t
SECRET_HEX = (
    "6b3873000a0c0a027631120653656372657412330a120a02733112001a0022002a00320038004200120c0a027077"
    "1206733363723374120d0a0475736572120561646d696e1a001a002200"
)
# kubectl create secret generic typed --type=example.com/t --from-literal=k=v
TYPED_SECRET_HEX = (
    "6b3873000a0c0a0276311206536563726574122e0a150a05747970656412001a0022002a0032003800420012060a"
    "016b1201761a0d6578616d706c652e636f6d2f741a002200"
)
# kubectl create secret docker-registry d1 --docker-server=r.io --docker-username=u
#   --docker-password=p
DOCKER_SECRET_HEX = (
    "6b3873000a0c0a0276311206536563726574128b010a120a02643112001a0022002a003200380042001255"
    "0a112e646f636b6572636f6e6669676a736f6e12407b226175746873223a7b22722e696f223a7b22757365726e"
    "616d65223a2275222c2270617373776f7264223a2270222c2261757468223a2264547077227d7d7d1a1e6b7562"
    "65726e657465732e696f2f646f636b6572636f6e6669676a736f6e1a002200"
)
# kubectl create serviceaccount sa1
SERVICEACCOUNT_HEX = (
    "6b3873000a140a027631120e536572766963654163636f756e7412150a130a0373613112001a0022002a00320038"
    "0042001a002200"
)
# kubectl create deployment dep1 --image=nginx --replicas=2 --port=80
DEPLOYMENT_HEX = (
    "6b3873000a150a07617070732f7631120a4465706c6f796d656e7412bc010a210a046465703112001a0022002a00"
    "3200380042005a0b0a036170701204646570311288010802120d0a0b0a036170701204646570311a6d0a1d0a0012"
    "001a0022002a003200380042005a0b0a03617070120464657031124c122e0a056e67696e7812056e67696e782a00"
    "320a0a001000185022002a0042006a007200800100880100900100a201001a00320042004a005200580060006800"
    "8201008a01009a0100c2010022020a00280038001a0c0800100018002000280038001a002200"
)
# kubectl create deployment zero --image=busybox --replicas=0 -- sleep 3600
ZERO_DEPLOYMENT_HEX = (
    "6b3873000a150a07617070732f7631120a4465706c6f796d656e7412c1010a210a047a65726f12001a0022002a00"
    "3200380042005a0b0a0361707012047a65726f128d010800120d0a0b0a0361707012047a65726f1a720a1d0a0012"
    "001a0022002a003200380042005a0b0a0361707012047a65726f125112330a0762757379626f78120762757379"
    "626f781a05736c6565701a04333630302a0042006a007200800100880100900100a201001a00320042004a005200"
    "5800600068008201008a01009a0100c2010022020a00280038001a0c0800100018002000280038001a002200"
)
# kubectl create service clusterip svc1 --tcp=80:8080
SERVICE_HEX = (
    "6b3873000a0d0a027631120753657276696365126c0a210a047376633112001a0022002a003200380042005a0b0a"
    "0361707012047376633112430a1b0a0738302d38303830120354435018502207080010903f1a002800120b0a0361"
    "70701204737663311a002209436c757374657249503a00420052005a00600068001a020a001a002200"
)
# kubectl create service nodeport np1 --tcp=80:8080
NODEPORT_HEX = (
    "6b3873000a0d0a02763112075365727669636512680a1f0a036e703112001a0022002a003200380042005a0a0a03"
    "61707012036e703112410a1b0a0738302d38303830120354435018502207080010903f1a002800120a0a03617070"
    "12036e70311a0022084e6f6465506f72743a00420052005a00600068001a020a001a002200"
)
# kubectl create service clusterip headless --clusterip=None --tcp=5678:8080
HEADLESS_HEX = (
    "6b3873000a0d0a027631120753657276696365127f0a290a08686561646c65737312001a0022002a003200380042"
    "005a0f0a036170701208686561646c657373124e0a1e0a09353637382d38303830120354435018ae2c2207080010"
    "903f1a002800120f0a036170701208686561646c6573731a044e6f6e652209436c757374657249503a0042005200"
    "5a00600068001a020a001a002200"
)
# kubectl create service externalname en1 --external-name=example.com
EXTERNALNAME_HEX = (
    "6b3873000a0d0a027631120753657276696365125a0a1f0a03656e3112001a0022002a003200380042005a0a0a03"
    "6170701203656e311233120a0a036170701203656e311a00220c45787465726e616c4e616d653a004200520b6578"
    "616d706c652e636f6d5a00600068001a020a001a002200"
)
# kubectl create job j1 --image=busybox (a kind this decoder does not describe)
JOB_HEX = (
    "6b3873000a0f0a0862617463682f763112034a6f62127a0a120a026a3112001a0022002a00320038004200125a32"
    "580a100a0012001a0022002a00320038004200124412210a026a31120762757379626f782a0042006a0072008001"
    "00880100900100a201001a054e65766572320042004a0052005800600068008201008a01009a0100c201001a0820"
    "00280030003a001a002200"
)


def meta(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, **extra}


CAPTURED: list[tuple[str, str, dict[str, Any]]] = [
    (
        "namespace",
        NAMESPACE_HEX,
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": meta("foo"),
            "spec": {},
            "status": {},
        },
    ),
    (
        "configmap",
        CONFIGMAP_HEX,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": meta("cm1"),
            "data": {"a": "b", "c": "d"},
        },
    ),
    (
        "configmap-binary",
        BINARY_CONFIGMAP_HEX,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": meta("bin"),
            "data": {"x": "y"},
            "binaryData": {"blob": "AP/+Ymlu"},
        },
    ),
    (
        "secret",
        SECRET_HEX,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": meta("s1"),
            "data": {"pw": "czNjcjN0", "user": "YWRtaW4="},
        },
    ),
    (
        "secret-typed",
        TYPED_SECRET_HEX,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": meta("typed"),
            "data": {"k": "dg=="},
            "type": "example.com/t",
        },
    ),
    (
        "secret-docker-registry",
        DOCKER_SECRET_HEX,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": meta("d1"),
            "data": {
                ".dockerconfigjson": "eyJhdXRocyI6eyJyLmlvIjp7InVzZXJuYW1lIjoidSIsInBhc3N3b3JkIjoi"
                "cCIsImF1dGgiOiJkVHB3In19fQ=="
            },
            "type": "kubernetes.io/dockerconfigjson",
        },
    ),
    (
        "serviceaccount",
        SERVICEACCOUNT_HEX,
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta("sa1")},
    ),
    (
        "deployment",
        DEPLOYMENT_HEX,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta("dep1", labels={"app": "dep1"}),
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "dep1"}},
                "template": {
                    "metadata": {"labels": {"app": "dep1"}},
                    "spec": {
                        "containers": [
                            {
                                "name": "nginx",
                                "image": "nginx",
                                "ports": [{"containerPort": 80}],
                                "resources": {},
                            }
                        ]
                    },
                },
                "strategy": {},
            },
            "status": {},
        },
    ),
    (
        "deployment-zero-replicas-with-command",
        ZERO_DEPLOYMENT_HEX,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta("zero", labels={"app": "zero"}),
            "spec": {
                "replicas": 0,  # a pointer in Go: zero is sent and kept
                "selector": {"matchLabels": {"app": "zero"}},
                "template": {
                    "metadata": {"labels": {"app": "zero"}},
                    "spec": {
                        "containers": [
                            {
                                "name": "busybox",
                                "image": "busybox",
                                "command": ["sleep", "3600"],
                                "resources": {},
                            }
                        ]
                    },
                },
                "strategy": {},
            },
            "status": {},
        },
    ),
    (
        "service-clusterip",
        SERVICE_HEX,
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta("svc1", labels={"app": "svc1"}),
            "spec": {
                "ports": [{"name": "80-8080", "protocol": "TCP", "port": 80, "targetPort": 8080}],
                "selector": {"app": "svc1"},
                "type": "ClusterIP",
            },
            "status": {"loadBalancer": {}},
        },
    ),
    (
        "service-nodeport",
        NODEPORT_HEX,
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta("np1", labels={"app": "np1"}),
            "spec": {
                "ports": [{"name": "80-8080", "protocol": "TCP", "port": 80, "targetPort": 8080}],
                "selector": {"app": "np1"},
                "type": "NodePort",
            },
            "status": {"loadBalancer": {}},
        },
    ),
    (
        "service-headless",
        HEADLESS_HEX,
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta("headless", labels={"app": "headless"}),
            "spec": {
                "ports": [
                    {"name": "5678-8080", "protocol": "TCP", "port": 5678, "targetPort": 8080}
                ],
                "selector": {"app": "headless"},
                "clusterIP": "None",
                "type": "ClusterIP",
            },
            "status": {"loadBalancer": {}},
        },
    ),
    (
        "service-externalname",
        EXTERNALNAME_HEX,
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta("en1", labels={"app": "en1"}),
            "spec": {
                "selector": {"app": "en1"},
                "type": "ExternalName",
                "externalName": "example.com",
            },
            "status": {"loadBalancer": {}},
        },
    ),
]


@pytest.mark.parametrize(
    ("hex_body", "expected"), [c[1:] for c in CAPTURED], ids=[c[0] for c in CAPTURED]
)
def test_captured_kubectl_bodies_decode_to_the_json_kubectl_would_send(
    hex_body: str, expected: dict[str, Any]
) -> None:
    body = bytes.fromhex(hex_body)
    assert protobuf.decode(body) == expected
    # decode_body dispatches on the media type, parameters and case notwithstanding
    assert decode_body(body, "Application/vnd.kubernetes.protobuf; charset=binary") == expected


# ------------------------------------------------------------------ a tiny encoder for the rest
def varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative ints are ten-byte two's complement, as Go writes them
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def v(num: int, n: int) -> bytes:
    return varint(num << 3) + varint(n)


def s(num: int, data: str | bytes) -> bytes:
    raw = data.encode() if isinstance(data, str) else data
    return varint(num << 3 | 2) + varint(len(raw)) + raw


def m(num: int, *parts: bytes) -> bytes:
    return s(num, b"".join(parts))


def envelope(api_version: str, kind: str, *fields: bytes, extra: bytes = b"") -> bytes:
    return protobuf.MAGIC + m(1, s(1, api_version), s(2, kind)) + m(2, *fields) + extra


def entry(num: int, key: str, value: bytes) -> bytes:
    return m(num, s(1, key), value)


POD_META = m(
    1,
    s(1, "web"),
    s(3, "demo"),
    v(7, 0),
    m(8, v(1, 1_700_000_000), v(2, 5)),
    entry(11, "app", s(2, "web")),
    entry(12, "note", s(2, "")),  # map values keep their empty strings
    m(13, s(1, "ReplicaSet"), s(3, "web-abc"), s(4, "uid-1"), s(5, "apps/v1"), v(6, 1), v(7, 0)),
    s(14, "example.com/keep"),
    m(
        17,
        s(1, "kubectl"),
        s(2, "Update"),
        s(3, "v1"),
        m(4, v(1, 1_700_000_000)),
        s(6, "FieldsV1"),
        m(7, s(1, b'{"f:metadata":{"f:labels":{}}}')),
    ),
)
POD_CONTAINER = m(
    2,
    s(1, "web"),
    s(2, "nginx:1.27"),
    s(3, "nginx"),
    s(4, "-g"),
    s(4, "daemon off;"),
    m(6, s(1, "http"), v(3, 8080), s(4, "TCP")),
    m(7, s(1, "MODE"), s(2, "prod")),
    m(7, s(1, "DB_PASS"), m(3, m(4, m(1, s(1, "db")), s(2, "password")))),
    m(7, s(1, "LEVEL"), m(3, m(3, m(1, s(1, "app-config")), s(2, "level"), v(3, 1)))),
    m(7, s(1, "POD_IP"), m(3, m(1, s(1, "v1"), s(2, "status.podIP")))),
    m(7, s(1, "CPU"), m(3, m(2, s(2, "limits.cpu"), m(3, s(1, "1m"))))),
    m(8, entry(1, "cpu", m(2, s(1, "500m"))), entry(2, "memory", m(2, s(1, "64Mi")))),
    m(9, s(1, "scratch"), s(3, "/scratch"), v(2, 1)),
    m(10, m(1, m(2, s(1, "/healthz"), m(2, v(1, 1), s(3, "http")))), v(2, 3), v(4, 10)),
    m(11, m(1, m(3, m(1, v(1, 0), v(2, 8080)))), v(6, 0)),  # failureThreshold 0: omitted
    m(22, m(1, m(1, s(1, "true"))), v(7, 0)),  # terminationGracePeriodSeconds is a pointer
    m(15, v(2, 0), v(4, -1)),  # privileged: false kept (pointer); runAsUser negative
    v(16, 0),
)
POD_SPEC = m(
    2,
    m(1, s(1, "scratch"), m(2, m(2))),  # emptyDir: {} is the whole point of the volume
    m(
        1,
        s(1, "cfg"),
        m(2, m(19, m(1, s(1, "app-config")), v(3, 420), m(2, s(1, "a"), s(2, "a.txt")))),
    ),
    m(1, s(1, "creds"), m(2, m(6, s(1, "db"), v(4, 1)))),
    m(1, s(1, "logs"), m(2, m(1, s(1, "/var/log"), s(2, "")))),
    POD_CONTAINER,
    s(3, "Always"),
    v(4, 30),
    s(6, ""),
    v(21, 0),
    m(22, s(1, "dedicated"), s(2, "Exists"), s(4, "NoSchedule")),
    entry(7, "disk", s(2, "ssd")),
)
POD_BODY = envelope("v1", "Pod", POD_META, POD_SPEC, m(3, s(1, "Pending")))
POD_JSON: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "web",
        "namespace": "demo",
        "creationTimestamp": "2023-11-14T22:13:20Z",
        "labels": {"app": "web"},
        "annotations": {"note": ""},
        "ownerReferences": [
            {
                "kind": "ReplicaSet",
                "name": "web-abc",
                "uid": "uid-1",
                "apiVersion": "apps/v1",
                "controller": True,
                "blockOwnerDeletion": False,
            }
        ],
        "finalizers": ["example.com/keep"],
        "managedFields": [
            {
                "manager": "kubectl",
                "operation": "Update",
                "apiVersion": "v1",
                "time": "2023-11-14T22:13:20Z",
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:labels": {}}},
            }
        ],
    },
    "spec": {
        "volumes": [
            {"name": "scratch", "emptyDir": {}},
            {
                "name": "cfg",
                "configMap": {
                    "name": "app-config",
                    "defaultMode": 420,
                    "items": [{"key": "a", "path": "a.txt"}],
                },
            },
            {"name": "creds", "secret": {"secretName": "db", "optional": True}},
            {"name": "logs", "hostPath": {"path": "/var/log", "type": ""}},
        ],
        "containers": [
            {
                "name": "web",
                "image": "nginx:1.27",
                "command": ["nginx"],
                "args": ["-g", "daemon off;"],
                "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                "env": [
                    {"name": "MODE", "value": "prod"},
                    {
                        "name": "DB_PASS",
                        "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}},
                    },
                    {
                        "name": "LEVEL",
                        "valueFrom": {
                            "configMapKeyRef": {
                                "name": "app-config",
                                "key": "level",
                                "optional": True,
                            }
                        },
                    },
                    {
                        "name": "POD_IP",
                        "valueFrom": {
                            "fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}
                        },
                    },
                    {
                        "name": "CPU",
                        "valueFrom": {
                            "resourceFieldRef": {"resource": "limits.cpu", "divisor": "1m"}
                        },
                    },
                ],
                "resources": {"limits": {"cpu": "500m"}, "requests": {"memory": "64Mi"}},
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch", "readOnly": True}],
                "livenessProbe": {
                    "httpGet": {"path": "/healthz", "port": "http"},
                    "initialDelaySeconds": 3,
                    "periodSeconds": 10,
                },
                "readinessProbe": {"tcpSocket": {"port": 8080}},
                "startupProbe": {"exec": {"command": ["true"]}, "terminationGracePeriodSeconds": 0},
                "securityContext": {"privileged": False, "runAsUser": -1},
            }
        ],
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "automountServiceAccountToken": False,
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        "nodeSelector": {"disk": "ssd"},
    },
    "status": {"phase": "Pending"},
}


def test_hand_encoded_pod_covers_volumes_probes_env_sources_quantities_and_times() -> None:
    assert protobuf.decode(POD_BODY) == POD_JSON


def test_int_or_string_and_pointer_zeroes_in_a_rolling_update() -> None:
    strategy = m(4, s(1, "RollingUpdate"), m(2, m(1, v(1, 1), s(3, "25%")), m(2, v(2, 0))))
    body = envelope("apps/v1", "Deployment", m(1, s(1, "d")), m(2, strategy, v(6, 0), v(9, 60)))
    assert protobuf.decode(body)["spec"] == {
        "strategy": {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": 0},
        },
        "revisionHistoryLimit": 0,
        "progressDeadlineSeconds": 60,
    }


def test_times_are_rfc3339_in_utc_and_micro_times_keep_microseconds() -> None:
    assert protobuf._rfc3339({"seconds": 1_700_000_000, "nanos": 987_654_321}, micro=False) == (
        "2023-11-14T22:13:20Z"
    )
    assert protobuf._rfc3339({"seconds": 1_700_000_000, "nanos": 987_654_321}, micro=True) == (
        "2023-11-14T22:13:20.987654Z"
    )
    assert protobuf._rfc3339({"seconds": -62135596800}, micro=False) == "0001-01-01T00:00:00Z"
    assert protobuf._rfc3339({}, micro=False) is None  # Go's zero time: omitted


def test_packed_and_unpacked_repeated_varints_both_decode() -> None:
    groups = varint(4 << 3 | 2) + varint(3) + varint(1) + varint(2) + varint(3)
    spec = m(2, m(2, s(1, "c")), m(14, groups, v(4, 7)))
    body = envelope("v1", "Pod", m(1, s(1, "p")), spec)
    assert protobuf.decode(body)["spec"]["securityContext"] == {"supplementalGroups": [1, 2, 3, 7]}


def test_the_last_occurrence_of_a_scalar_wins_and_messages_merge() -> None:
    body = envelope("v1", "Namespace", m(1, s(1, "a")), m(1, s(1, "b"), s(3, "x")), m(1, s(3, "")))
    assert protobuf.decode(body)["metadata"] == {"name": "b"}


# ------------------------------------------------------------------ refusals
def refused(body: bytes) -> ApiError:
    with pytest.raises(ApiError) as info:
        protobuf.decode(body)
    return info.value


def test_an_unknown_field_of_a_described_message_is_a_415_naming_it() -> None:
    affinity = m(18, m(1))  # PodSpec.affinity: not described, so refused rather than dropped
    err = refused(envelope("v1", "Pod", m(1, s(1, "p")), m(2, affinity)))
    assert (err.code, err.reason) == (415, "UnsupportedMediaType")
    assert err.message == "unsupported field 18 in protobuf v1.PodSpec; send JSON instead"
    err = refused(envelope("v1", "Namespace", m(1, v(99, 1))))
    assert err.message == "unsupported field 99 in protobuf v1.ObjectMeta; send JSON instead"


def test_a_kind_without_a_table_is_a_415_listing_the_accepted_kinds() -> None:
    err = refused(bytes.fromhex(JOB_HEX))
    assert (err.code, err.reason) == (415, "UnsupportedMediaType")
    assert err.message == (
        "protobuf bodies are accepted only for v1 ConfigMap, apps/v1 Deployment, v1 Namespace, "
        "v1 Pod, v1 Secret, v1 Service, v1 ServiceAccount; send application/json "
        "(got batch/v1 Job)"
    )
    assert refused(envelope("", "", m(1))).code == 415


def test_an_encoded_envelope_is_a_415() -> None:
    body = envelope("v1", "Namespace", m(1, s(1, "a")), extra=s(3, "gzip"))
    err = refused(body)
    assert err.code == 415
    assert "content encoding 'gzip'" in err.message


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (b"{}", "magic"),
        (b"k8s", "magic"),
        (bytes.fromhex(NAMESPACE_HEX)[:-9], "past the end"),
        (protobuf.MAGIC + b"\x0a\x80", "truncated varint"),
        (protobuf.MAGIC + b"\x0b", "wire type 3"),
        (protobuf.MAGIC + b"\x08\x01", "not length-delimited"),
        (protobuf.MAGIC + b"\x02\x00", "invalid field number 0"),
        (protobuf.MAGIC + b"\x12" + b"\xff" * 11, "longer than 10 bytes"),
        (envelope("v1", "Namespace", m(1, s(1, b"\xff"))), "not UTF-8"),
        (envelope("v1", "Namespace", m(1, s(7, "x"))), "not a varint"),
        (envelope("v1", "Namespace", m(1, v(1, 5))), "not length-delimited"),
        (envelope("apps/v1", "Deployment", m(2, v(1, 1 << 40))), "does not fit in int32"),
        (envelope("v1", "Namespace", m(1, m(8, v(1, 1 << 62)))), "out of range"),
        (envelope("v1", "Namespace", m(1, m(8, v(1, 1), v(2, -1)))), "nanos"),
        (envelope("v1", "Namespace", m(1, m(11, v(3, 1)))), "map entry"),
        (envelope("v1", "Pod", m(1, m(17, m(7, s(1, "{nope"))))), "not JSON"),
    ],
)
def test_malformed_bytes_are_a_400(body: bytes, detail: str) -> None:
    err = refused(body)
    assert (err.code, err.reason) == (400, "BadRequest"), err
    assert err.message.startswith("the protobuf request body is malformed: ")
    assert detail in err.message


def check_only_api_errors(body: bytes) -> None:
    code = 0
    try:
        json.dumps(protobuf.decode(body))  # whatever decodes is plain JSON
    except ApiError as exc:
        code = exc.code
    assert code in (0, 400, 415)


FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.binary(max_size=300))
def test_random_bytes_raise_only_api_errors(data: bytes) -> None:
    check_only_api_errors(data)
    check_only_api_errors(protobuf.MAGIC + data)


@FUZZ
@given(
    root=st.sampled_from(sorted(protobuf.ROOTS)),
    raw=st.binary(max_size=300),
)
def test_random_objects_of_every_described_kind_raise_only_api_errors(
    root: tuple[str, str], raw: bytes
) -> None:
    check_only_api_errors(protobuf.MAGIC + m(1, s(1, root[0]), s(2, root[1])) + s(2, raw))


@FUZZ
@given(
    base=st.sampled_from([c[1] for c in CAPTURED] + [POD_BODY.hex()]),
    edits=st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), max_size=6),
    cut=st.integers(min_value=0),
)
def test_mutated_real_bodies_raise_only_api_errors(
    base: str, edits: list[tuple[int, int]], cut: int
) -> None:
    body = bytearray(bytes.fromhex(base))
    for at, byte in edits:
        body[at % len(body)] = byte
    check_only_api_errors(bytes(body))
    check_only_api_errors(bytes(body[: cut % (len(body) + 1)]))


# ------------------------------------------------------------------ through the HTTP server
@pytest.fixture
async def h() -> Any:
    async with api_server() as harness:
        yield harness


async def test_protobuf_posts_create_objects_and_get_json_back(h: Harness) -> None:
    headers = {"content-type": PB, "accept": f"{PB},application/json"}
    ns = envelope("v1", "Namespace", m(1, s(1, "demo")))
    r = await h.client.post("/api/v1/namespaces", content=ns, headers=headers)
    assert r.status_code == 201, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert r.json()["status"] == {"phase": "Active"}

    pod = envelope("v1", "Pod", m(1, s(1, "web")), POD_SPEC)
    r = await h.client.post("/api/v1/namespaces/demo/pods", content=pod, headers=headers)
    assert r.status_code == 201, r.text
    created = r.json()
    assert created["spec"]["volumes"][0] == {"name": "scratch", "emptyDir": {}}
    assert created["spec"]["containers"][0]["readinessProbe"]["tcpSocket"] == {"port": 8080}

    dep = bytes.fromhex(DEPLOYMENT_HEX)
    r = await h.client.post(
        "/apis/apps/v1/namespaces/demo/deployments", content=dep, headers=headers
    )
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["replicas"] == 2

    job = bytes.fromhex(JOB_HEX)
    r = await h.client.post("/api/v1/namespaces/demo/configmaps", content=job, headers=headers)
    assert r.status_code == 415, r.text
    assert r.json()["reason"] == "UnsupportedMediaType"

    r = await h.client.post("/api/v1/namespaces", content=ns[:-3], headers=headers)
    assert r.status_code == 400, r.text

    r = await h.client.patch("/api/v1/namespaces/demo", content=ns, headers=headers)
    assert r.status_code == 415, r.text
