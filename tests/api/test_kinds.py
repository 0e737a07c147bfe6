"""The built-in kinds: registry shape, schema well-formedness, kubectl columns, defaults, checks."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from orchestrator.kube.schema.builders import (
    LIST_TYPES,
    MAP_TYPES,
    NAME_KEY,
    NODE_KEYS,
    PATCH_STRATEGIES,
    TYPES,
    walk,
)
from orchestrator.kube.schema.builtin import builtin_kinds, builtin_registry
from orchestrator.kube.schema.columns import parse_rfc3339
from orchestrator.kube.schema.kind import Kind
from orchestrator.kube.schema.validation import validate

Obj = dict[str, Any]
KINDS = builtin_kinds()
REG = builtin_registry()
NOW = parse_rfc3339("2025-01-01T01:00:00Z") or 0.0
CREATED = "2025-01-01T00:55:00Z"  # 5m before NOW


def kind(api_version: str, name: str) -> Kind:
    k = REG.by_gvk(api_version, name)
    assert k is not None
    return k


def row(k: Kind, o: Obj, wide: bool = False) -> list[Any]:
    return [c.cell(o, NOW) for c in k.columns if wide or c.priority == 0]


def node_at(schema: Obj, path: str) -> Obj:
    """`spec.template.spec.containers[].ports` -> that schema node."""
    cur = schema
    for part in path.split("."):
        name, items = (part[:-2], True) if part.endswith("[]") else (part, False)
        cur = cur["properties"][name]
        if items:
            cur = cur["items"]
    return cur


# -- registry --------------------------------------------------------------------------------


def test_every_kind_is_registered_once() -> None:
    assert len(KINDS) == 16
    assert len({(k.group, k.plural) for k in KINDS}) == len(KINDS)
    assert len({(k.api_version, k.kind) for k in KINDS}) == len(KINDS)
    for k in KINDS:
        assert REG.by_resource(k.group, k.version, k.plural) is k
        assert REG.by_gvk(k.api_version, k.kind) is k
    assert REG.group_versions() == {
        "": ["v1"],
        "apps": ["v1"],
        "coordination.k8s.io": ["v1"],
        "discovery.k8s.io": ["v1"],
        "apiextensions.k8s.io": ["v1"],
    }


def test_discovery_facts() -> None:
    all_cat = {k.plural for k in KINDS if "all" in k.categories}
    assert all_cat == {
        "pods",
        "services",
        "deployments",
        "replicasets",
        "daemonsets",
        "statefulsets",
    }
    short = {s: k.plural for k in KINDS for s in k.short_names}
    assert short["po"] == "pods"
    assert short["deploy"] == "deployments"
    assert short["ns"] == "namespaces"
    assert {k.plural for k in KINDS if not k.namespaced} == {
        "namespaces",
        "nodes",
        "customresourcedefinitions",
    }
    assert kind("v1", "Pod").subresources == {"status", "binding", "log"}
    scaled = {k.plural for k in KINDS if "scale" in k.subresources}
    assert scaled == {"deployments", "replicasets", "statefulsets"}
    for k in KINDS:
        assert ("scale" in k.subresources) == (k.scale is not None)
        assert k.scale is None or k.scale.label_selector == "spec.selector"


# -- schemas ---------------------------------------------------------------------------------


def _strip_desc(node: Obj) -> Obj:
    return {k: v for k, v in node.items() if k != "description"}


def test_schema_nodes_are_well_formed() -> None:
    named: dict[str, Obj] = {}
    for k in KINDS:
        top = k.schema
        assert top[NAME_KEY].endswith("." + k.kind)
        assert {"apiVersion", "kind", "metadata"} <= set(top["properties"])
        for path, node in walk(top, k.kind):
            where = f"{path}: {node}"
            assert set(node) <= NODE_KEYS, where
            assert node.get("description") or path.endswith(("[]", "{}")), where
            if "type" in node:
                assert node["type"] in TYPES, where
                assert not node.get("x-kubernetes-int-or-string"), where
            else:
                assert node.get("x-kubernetes-int-or-string"), where
            if node.get("type") == "array":
                assert isinstance(node["items"], dict), where
            for key in node.get("required", []):
                assert key in node["properties"], where
            for value in node.get("enum", []):
                assert isinstance(value, str), where
            strategy = node.get("x-kubernetes-patch-strategy")
            assert strategy is None or strategy in PATCH_STRATEGIES, where
            list_type = node.get("x-kubernetes-list-type")
            assert list_type is None or list_type in LIST_TYPES, where
            map_type = node.get("x-kubernetes-map-type")
            assert map_type is None or map_type in MAP_TYPES, where
            merge_key = node.get("x-kubernetes-patch-merge-key")
            if merge_key is not None:
                assert node["type"] == "array", where
                assert "merge" in (strategy or ""), where
                assert merge_key in node["items"]["properties"], where
            if list_type == "map":
                keys = node["x-kubernetes-list-map-keys"]
                assert keys, where
                assert all(key in node["items"]["properties"] for key in keys), where
            else:
                assert "x-kubernetes-list-map-keys" not in node, where
            if NAME_KEY in node:
                name = node[NAME_KEY]
                if name in named:
                    assert _strip_desc(named[name]) == _strip_desc(node), f"{name} differs"
                named[name] = node
    assert "io.k8s.api.core.v1.Container" in named
    assert "io.k8s.apimachinery.pkg.api.resource.Quantity" in named


def test_schemas_are_json_and_acyclic() -> None:
    for k in KINDS:
        assert json.loads(json.dumps(k.schema)) == k.schema


@pytest.mark.parametrize(
    ("gvk", "path", "strategy", "merge_key", "list_type", "map_keys"),
    [
        (("v1", "Pod"), "spec.containers", "merge", "name", "map", ["name"]),
        (("v1", "Pod"), "spec.initContainers", "merge", "name", "map", ["name"]),
        (("v1", "Pod"), "spec.containers[].env", "merge", "name", "map", ["name"]),
        (
            ("v1", "Pod"),
            "spec.containers[].ports",
            "merge",
            "containerPort",
            "map",
            ["containerPort", "protocol"],
        ),
        (("v1", "Pod"), "spec.containers[].volumeMounts", "merge", "mountPath", "map", None),
        (("v1", "Pod"), "spec.volumes", "merge,retainKeys", "name", "map", ["name"]),
        (("v1", "Pod"), "spec.imagePullSecrets", "merge", "name", "map", ["name"]),
        (("v1", "Pod"), "spec.hostAliases", "merge", "ip", "map", ["ip"]),
        (("v1", "Pod"), "spec.topologySpreadConstraints", "merge", "topologyKey", "map", None),
        (("v1", "Pod"), "spec.tolerations", None, None, "atomic", None),
        (("v1", "Pod"), "spec.readinessGates", None, None, "atomic", None),
        (("v1", "Pod"), "spec.containers[].command", None, None, "atomic", None),
        (("v1", "Pod"), "spec.containers[].envFrom", None, None, "atomic", None),
        (("v1", "Pod"), "status.conditions", "merge", "type", "map", ["type"]),
        (("v1", "Pod"), "status.podIPs", "merge", "ip", "map", ["ip"]),
        (("v1", "Pod"), "metadata.ownerReferences", "merge", "uid", "map", ["uid"]),
        (("v1", "Pod"), "metadata.finalizers", "merge", None, "set", None),
        (("v1", "Node"), "spec.taints", None, None, "atomic", None),
        (("v1", "Node"), "status.conditions", "merge", "type", "map", ["type"]),
        (("v1", "Node"), "status.addresses", "merge", "type", None, None),
        (("v1", "Service"), "spec.ports", "merge", "port", "map", ["port", "protocol"]),
        (("apps/v1", "Deployment"), "status.conditions", "merge", "type", "map", ["type"]),
        (
            ("apps/v1", "Deployment"),
            "spec.template.spec.containers",
            "merge",
            "name",
            "map",
            ["name"],
        ),
        (("apps/v1", "DaemonSet"), "status.conditions", "merge", "type", "map", ["type"]),
    ],
)
def test_patch_metadata(
    gvk: tuple[str, str],
    path: str,
    strategy: str | None,
    merge_key: str | None,
    list_type: str | None,
    map_keys: list[str] | None,
) -> None:
    node = node_at(kind(*gvk).schema, path)
    assert node.get("x-kubernetes-patch-strategy") == strategy
    assert node.get("x-kubernetes-patch-merge-key") == merge_key
    if list_type is not None:
        assert node.get("x-kubernetes-list-type") == list_type
    if map_keys is not None:
        assert node.get("x-kubernetes-list-map-keys") == map_keys


def test_strategy_is_retain_keys_and_quantities_are_int_or_string() -> None:
    deploy = kind("apps/v1", "Deployment").schema
    assert node_at(deploy, "spec.strategy")["x-kubernetes-patch-strategy"] == "retainKeys"
    limits = node_at(kind("v1", "Pod").schema, "spec.containers[].resources.limits")
    assert limits["additionalProperties"]["x-kubernetes-int-or-string"] is True
    crd = kind("apiextensions.k8s.io/v1", "CustomResourceDefinition").schema
    props = node_at(crd, "spec.versions[].schema.openAPIV3Schema")
    assert props["type"] == "object"
    assert props["x-kubernetes-preserve-unknown-fields"] is True


DEPLOYMENT: Obj = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "nginx", "namespace": "default", "labels": {"app": "nginx"}},
    "spec": {
        "replicas": 3,
        "selector": {"matchLabels": {"app": "nginx"}},
        "template": {
            "metadata": {"labels": {"app": "nginx"}},
            "spec": {
                "containers": [
                    {
                        "name": "nginx",
                        "image": "nginx:1.26",
                        "ports": [{"containerPort": 80}],
                        "resources": {"limits": {"cpu": "500m", "memory": "128Mi"}},
                        "env": [{"name": "A", "value": "1"}],
                        "readinessProbe": {"httpGet": {"path": "/", "port": 80}},
                    }
                ],
                "volumes": [{"name": "data", "emptyDir": {}}],
                "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}],
            },
        },
    },
}


def test_manifests_pass_the_schema_engine_with_defaults_applied() -> None:
    k = kind("apps/v1", "Deployment")
    d = copy.deepcopy(DEPLOYMENT)
    assert k.default is not None
    assert k.validate is not None
    k.default(d)
    result = validate(k.schema, d, strict=True)
    assert result.causes == []
    assert result.unknown == []
    assert k.validate(result.obj, None) == []
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": "http"}]},
    }
    ks = kind("v1", "Service")
    assert ks.default is not None
    ks.default(svc)
    result = validate(ks.schema, svc, strict=True)
    assert result.causes == []
    assert result.unknown == []


def test_schema_engine_rejects_negative_replicas() -> None:
    d = copy.deepcopy(DEPLOYMENT)
    d["spec"]["replicas"] = -1
    causes = validate(kind("apps/v1", "Deployment").schema, d, strict=True).causes
    assert [c.field for c in causes] == ["spec.replicas"]


# -- columns ---------------------------------------------------------------------------------


def _pod(statuses: list[Obj], *, phase: str = "Running", containers: int | None = None) -> Obj:
    n = containers if containers is not None else len(statuses)
    return {
        "metadata": {"name": "web", "creationTimestamp": CREATED},
        "spec": {"containers": [{"name": f"c{i}", "image": "x"} for i in range(n)]},
        "status": {"phase": phase, "containerStatuses": statuses},
    }


RUNNING = {"running": {"startedAt": CREATED}}


def test_pod_columns() -> None:
    pods = kind("v1", "Pod")
    ready = {"name": "c0", "ready": True, "restartCount": 0, "state": RUNNING}
    not_ready = {"name": "c1", "ready": False, "restartCount": 0, "state": RUNNING}
    assert row(pods, _pod([ready, not_ready])) == ["web", "1/2", "Running", "0", "5m"]
    assert row(pods, _pod([], phase="Pending", containers=1))[1:3] == ["0/1", "Pending"]
    creating = {"name": "c0", "ready": False, "restartCount": 0}
    creating["state"] = {"waiting": {"reason": "ContainerCreating"}}
    assert row(pods, _pod([creating], phase="Pending"))[2] == "ContainerCreating"
    crash = {
        "name": "c0",
        "ready": False,
        "restartCount": 4,
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 1, "finishedAt": "2025-01-01T00:59:00Z"}},
    }
    assert row(pods, _pod([crash]))[1:4] == ["0/1", "CrashLoopBackOff", "4 (60s ago)"]
    done = {"name": "c0", "ready": False, "restartCount": 0}
    done["state"] = {"terminated": {"exitCode": 0, "reason": "Completed"}}
    assert row(pods, _pod([done], phase="Succeeded"))[2] == "Completed"
    deleting = _pod([ready])
    deleting["metadata"]["deletionTimestamp"] = CREATED
    assert row(pods, deleting)[2] == "Terminating"
    init = _pod([], phase="Pending", containers=1)
    init["spec"]["initContainers"] = [{"name": "i0", "image": "x"}]
    init["status"]["initContainerStatuses"] = [
        {"name": "i0", "ready": False, "restartCount": 0, "state": {"waiting": {}}}
    ]
    assert row(pods, init)[2] == "Init:0/1"
    wide = _pod([ready])
    wide["spec"]["nodeName"] = "n1"
    wide["status"]["podIPs"] = [{"ip": "10.0.0.5"}]
    assert row(pods, wide, wide=True)[5:] == ["10.0.0.5", "n1", "<none>", "<none>"]
    assert [c.name for c in pods.columns] == [
        "Name",
        "Ready",
        "Status",
        "Restarts",
        "Age",
        "IP",
        "Node",
        "Nominated Node",
        "Readiness Gates",
    ]


def test_workload_columns() -> None:
    d = copy.deepcopy(DEPLOYMENT)
    d["metadata"]["creationTimestamp"] = CREATED
    d["status"] = {"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2}
    assert row(kind("apps/v1", "Deployment"), d, wide=True) == [
        "nginx",
        "2/3",
        3,
        2,
        "5m",
        "nginx",
        "nginx:1.26",
        "app=nginx",
    ]
    rs = copy.deepcopy(d)
    rs["spec"]["selector"]["matchExpressions"] = [
        {"key": "tier", "operator": "In", "values": ["web", "api"]}
    ]
    rs["status"] = {"replicas": 3, "readyReplicas": 1}
    assert row(kind("apps/v1", "ReplicaSet"), rs, wide=True) == [
        "nginx",
        3,
        3,
        1,
        "5m",
        "nginx",
        "nginx:1.26",
        "app=nginx,tier in (api,web)",
    ]
    ds = copy.deepcopy(d)
    ds["status"] = {"desiredNumberScheduled": 2, "currentNumberScheduled": 2, "numberReady": 1}
    assert row(kind("apps/v1", "DaemonSet"), ds) == ["nginx", 2, 2, 1, 0, 0, "<none>", "5m"]
    assert row(kind("apps/v1", "StatefulSet"), d) == ["nginx", "2/3", "5m"]


def test_node_columns() -> None:
    node: Any = {
        "metadata": {
            "name": "n1",
            "creationTimestamp": CREATED,
            "labels": {"node-role.kubernetes.io/control-plane": "", "kubernetes.io/os": "linux"},
        },
        "spec": {"unschedulable": True},
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "addresses": [{"type": "InternalIP", "address": "192.168.1.2"}],
            "nodeInfo": {"kubeletVersion": "v1.32.0", "osImage": "Debian"},
        },
    }
    assert row(kind("v1", "Node"), node, wide=True) == [
        "n1",
        "Ready,SchedulingDisabled",
        "control-plane",
        "5m",
        "v1.32.0",
        "192.168.1.2",
        "<none>",
        "Debian",
        "<unknown>",
        "<unknown>",
    ]
    node["status"]["conditions"] = [{"type": "Ready", "status": "Unknown"}]
    node["spec"] = {}
    node["metadata"]["labels"] = {}
    assert row(kind("v1", "Node"), node)[1:3] == ["NotReady", "<none>"]


def test_other_columns() -> None:
    svc: Any = {
        "metadata": {"name": "web", "creationTimestamp": CREATED},
        "spec": {
            "type": "NodePort",
            "clusterIP": "10.96.0.10",
            "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}, {"port": 53}],
            "selector": {"app": "web"},
        },
    }
    assert row(kind("v1", "Service"), svc, wide=True) == [
        "web",
        "NodePort",
        "10.96.0.10",
        "<none>",
        "80:30080/TCP,53/TCP",
        "5m",
        "app=web",
    ]
    svc["spec"]["type"] = "LoadBalancer"
    assert row(kind("v1", "Service"), svc)[3] == "<pending>"
    meta = {"name": "x", "creationTimestamp": CREATED}
    cm = {"metadata": meta, "data": {"a": "1", "b": "2"}, "binaryData": {"c": "AA=="}}
    assert row(kind("v1", "ConfigMap"), cm) == ["x", 3, "5m"]
    secret = {"metadata": meta, "type": "Opaque", "data": {"a": "MQ=="}}
    assert row(kind("v1", "Secret"), secret) == ["x", "Opaque", 1, "5m"]
    ns = {"metadata": meta, "status": {"phase": "Active"}}
    assert row(kind("v1", "Namespace"), ns) == ["x", "Active", "5m"]
    ep = {
        "metadata": meta,
        "subsets": [
            {
                "addresses": [{"ip": f"10.0.0.{i}"} for i in range(1, 4)],
                "ports": [{"port": 80}, {"port": 443}],
            }
        ],
    }
    assert row(kind("v1", "Endpoints"), ep) == [
        "x",
        "10.0.0.1:80,10.0.0.2:80,10.0.0.3:80 + 3 more...",
        "5m",
    ]
    assert row(kind("v1", "Endpoints"), {"metadata": meta}) == ["x", "<none>", "5m"]
    sa = {"metadata": meta, "secrets": [{"name": "t"}]}
    assert row(kind("v1", "ServiceAccount"), sa) == ["x", 1, "5m"]
    lease = {"metadata": meta, "spec": {"holderIdentity": "node-1"}}
    assert row(kind("coordination.k8s.io/v1", "Lease"), lease) == ["x", "node-1", "5m"]
    crd = {"metadata": meta}
    assert row(kind("apiextensions.k8s.io/v1", "CustomResourceDefinition"), crd) == [
        "x",
        CREATED,
    ]
    ev = {
        "metadata": {"name": "web.1"},
        "involvedObject": {"kind": "Pod", "name": "web", "fieldPath": "spec.containers{c}"},
        "reason": "Pulled",
        "message": " pulled \n",
        "type": "Normal",
        "source": {"component": "kubelet", "host": "n1"},
        "firstTimestamp": CREATED,
        "lastTimestamp": "2025-01-01T00:59:50Z",
        "count": 2,
    }
    assert row(kind("v1", "Event"), ev, wide=True) == [
        "10s",
        "Normal",
        "Pulled",
        "pod/web",
        "spec.containers{c}",
        "kubelet, n1",
        "pulled",
        "5m",
        2,
        "web.1",
    ]


def test_field_labels() -> None:
    pod = _pod([])
    pod["spec"]["nodeName"] = "n1"
    labels = kind("v1", "Pod").field_labels
    assert labels["spec.nodeName"](pod) == "n1"
    assert labels["status.phase"](pod) == "Running"
    assert labels["status.podIP"](pod) == ""
    assert labels["spec.hostNetwork"](pod) == "false"
    ev = {"involvedObject": {"uid": "u1", "kind": "Pod"}, "source": {"component": "kubelet"}}
    ev_labels = kind("v1", "Event").field_labels
    assert ev_labels["involvedObject.uid"](ev) == "u1"
    assert ev_labels["source"](ev) == "kubelet"
    assert kind("v1", "Node").field_labels["spec.unschedulable"]({"spec": {}}) == "false"
    assert kind("v1", "Secret").field_labels["type"]({"type": "Opaque"}) == "Opaque"
    assert kind("apps/v1", "ReplicaSet").field_labels["status.replicas"]({}) == "0"
    assert "status.phase" in kind("v1", "Namespace").field_labels


# -- defaults --------------------------------------------------------------------------------


def _defaulted(k: Kind, o: Obj) -> Obj:
    assert k.default is not None
    once = copy.deepcopy(o)
    k.default(once)
    twice = copy.deepcopy(once)
    k.default(twice)
    assert twice == once, f"{k.kind} defaults are not idempotent"
    return once


def test_pod_defaults() -> None:
    pod = {
        "metadata": {"name": "p"},
        "spec": {
            "containers": [
                {"name": "a", "image": "nginx", "ports": [{"containerPort": 80}]},
                {"name": "b", "image": "registry:5000/app:1.2"},
                {"name": "c", "image": "busybox@sha256:abc"},
                {"name": "d", "image": "x:latest", "resources": {"limits": {"cpu": "1"}}},
            ],
            "volumes": [{"name": "v"}, {"name": "s", "secret": {"secretName": "s"}}],
        },
    }
    p = _defaulted(kind("v1", "Pod"), pod)
    spec = p["spec"]
    assert spec["restartPolicy"] == "Always"
    assert spec["dnsPolicy"] == "ClusterFirst"
    assert spec["terminationGracePeriodSeconds"] == 30
    assert spec["schedulerName"] == "default-scheduler"
    assert spec["securityContext"] == {}
    assert spec["enableServiceLinks"] is True
    policies = [c["imagePullPolicy"] for c in spec["containers"]]
    assert policies == ["Always", "IfNotPresent", "IfNotPresent", "Always"]
    a = spec["containers"][0]
    assert a["terminationMessagePath"] == "/dev/termination-log"
    assert a["terminationMessagePolicy"] == "File"
    assert a["ports"] == [{"containerPort": 80, "protocol": "TCP"}]
    assert spec["containers"][3]["resources"]["requests"] == {"cpu": "1"}
    assert spec["volumes"][0] == {"name": "v", "emptyDir": {}}
    assert spec["volumes"][1]["secret"]["defaultMode"] == 0o644
    assert p["status"] == {"phase": "Pending", "qosClass": "Burstable"}


def test_workload_defaults() -> None:
    d = _defaulted(kind("apps/v1", "Deployment"), DEPLOYMENT)["spec"]
    assert d["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"},
    }
    assert (d["revisionHistoryLimit"], d["progressDeadlineSeconds"]) == (10, 600)
    assert d["template"]["spec"]["containers"][0]["imagePullPolicy"] == "IfNotPresent"
    assert d["template"]["spec"]["restartPolicy"] == "Always"
    recreate = copy.deepcopy(DEPLOYMENT)
    recreate["spec"]["strategy"] = {"type": "Recreate"}
    del recreate["spec"]["replicas"]
    r = _defaulted(kind("apps/v1", "Deployment"), recreate)["spec"]
    assert r["strategy"] == {"type": "Recreate"}
    assert r["replicas"] == 1
    base: Obj = {"spec": {"selector": {}, "template": {"spec": {"containers": []}}}}
    assert _defaulted(kind("apps/v1", "ReplicaSet"), base)["spec"]["replicas"] == 1
    ds = _defaulted(kind("apps/v1", "DaemonSet"), base)["spec"]
    assert ds["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0},
    }
    assert ds["revisionHistoryLimit"] == 10
    sts = _defaulted(kind("apps/v1", "StatefulSet"), base)["spec"]
    assert sts["replicas"] == 1
    assert sts["podManagementPolicy"] == "OrderedReady"
    assert sts["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}


def test_other_defaults() -> None:
    svc = {"spec": {"ports": [{"port": 80}, {"port": 53, "protocol": "UDP", "targetPort": 5353}]}}
    s = _defaulted(kind("v1", "Service"), svc)["spec"]
    assert s["type"] == "ClusterIP"
    assert s["sessionAffinity"] == "None"
    assert s["ports"] == [
        {"port": 80, "protocol": "TCP", "targetPort": 80},
        {"port": 53, "protocol": "UDP", "targetPort": 5353},
    ]
    secret = _defaulted(kind("v1", "Secret"), {"stringData": {"pw": "hunter2"}, "data": {}})
    assert secret == {"type": "Opaque", "data": {"pw": "aHVudGVyMg=="}}
    ns = _defaulted(kind("v1", "Namespace"), {"metadata": {"name": "x"}})
    assert ns["spec"] == {"finalizers": ["kubernetes"]}
    assert ns["status"] == {"phase": "Active"}
    crd = _defaulted(
        kind("apiextensions.k8s.io/v1", "CustomResourceDefinition"),
        {"spec": {"names": {"plural": "widgets", "kind": "Widget"}}},
    )
    assert crd["spec"]["names"]["singular"] == "widget"
    assert crd["spec"]["names"]["listKind"] == "WidgetList"
    for k in KINDS:
        if k.default is not None:
            _defaulted(k, {})


# -- validation ------------------------------------------------------------------------------


def _check(k: Kind, new: Obj, old: Obj | None = None) -> list[tuple[str, str]]:
    assert k.validate is not None
    return [(c.field, c.message) for c in k.validate(new, old)]


def test_deployment_checks() -> None:
    k = kind("apps/v1", "Deployment")
    d = copy.deepcopy(DEPLOYMENT)
    assert _check(k, d) == []
    no_sel = copy.deepcopy(d)
    del no_sel["spec"]["selector"]
    assert ("spec.selector", "Required value") in _check(k, no_sel)
    mismatch = copy.deepcopy(d)
    mismatch["spec"]["template"]["metadata"]["labels"] = {"app": "other", "tier": "web"}
    assert _check(k, mismatch) == [
        (
            "spec.template.metadata.labels",
            'Invalid value: map[string]string{"app":"other", "tier":"web"}: '
            "`selector` does not match template `labels`",
        )
    ]
    changed = copy.deepcopy(d)
    changed["spec"]["selector"] = {"matchLabels": {"app": "nginx", "x": "y"}}
    changed["spec"]["template"]["metadata"]["labels"]["x"] = "y"
    assert _check(k, changed, d) == [
        (
            "spec.selector",
            'Invalid value: v1.LabelSelector{MatchLabels:map[string]string{"app":"nginx", '
            '"x":"y"}, MatchExpressions:[]v1.LabelSelectorRequirement(nil)}: field is immutable',
        )
    ]
    dup = copy.deepcopy(d)
    containers = dup["spec"]["template"]["spec"]["containers"]
    containers.append({"name": "nginx", "ports": [{"containerPort": 70000}]})
    assert _check(k, dup) == [
        ("spec.template.spec.containers[1].image", "Required value"),
        (
            "spec.template.spec.containers[1].ports[0].containerPort",
            "Invalid value: 70000: must be between 1 and 65535, inclusive",
        ),
        ("spec.template.spec.containers[1].name", 'Duplicate value: "nginx"'),
    ]
    never = copy.deepcopy(d)
    never["spec"]["template"]["spec"]["restartPolicy"] = "Never"
    assert _check(k, never) == [
        (
            "spec.template.spec.restartPolicy",
            'Unsupported value: "Never": supported values: "Always"',
        )
    ]


def test_pod_checks() -> None:
    k = kind("v1", "Pod")
    assert _check(k, {"spec": {"containers": []}}) == [("spec.containers", "Required value")]
    pod: Obj = {
        "spec": {
            "containers": [
                {"name": "a", "image": "x:1", "volumeMounts": [{"name": "v", "mountPath": "/v"}]}
            ],
            "volumes": [{"name": "w", "emptyDir": {}, "hostPath": {"path": "/"}}],
        }
    }
    assert _check(k, pod) == [
        ("spec.volumes[0].hostPath", "Forbidden: may not specify more than 1 volume type"),
        ("spec.containers[0].volumeMounts[0].name", 'Not found: "v"'),
    ]
    old: Any = {"spec": {"containers": [{"name": "a", "image": "x:1"}], "restartPolicy": "Always"}}
    new = copy.deepcopy(old)
    new["spec"]["containers"][0]["image"] = "x:2"
    new["spec"]["nodeName"] = "n1"
    new["spec"]["activeDeadlineSeconds"] = 5
    assert _check(k, new, old) == []
    new["spec"]["restartPolicy"] = "Never"
    [(field, message)] = _check(k, new, old)
    assert field == "spec"
    assert message.startswith("Forbidden: pod updates may not change fields other than ")
    # An unchanged spec (a status write) is not checked again: it was when it was stored.
    # A changed one is, whole.
    stored = copy.deepcopy(pod)
    assert _check(k, {**copy.deepcopy(pod), "status": {"phase": "Running"}}, stored) == []
    edited = copy.deepcopy(pod)
    edited["spec"]["containers"][0]["image"] = "x:2"
    assert _check(k, edited, stored) == _check(k, pod)


def test_other_checks() -> None:
    svc = kind("v1", "Service")
    two = {"spec": {"ports": [{"port": 80, "name": "http"}, {"port": 0}]}}
    assert _check(svc, two) == [
        ("spec.ports[1].name", "Required value"),
        ("spec.ports[1].port", "Invalid value: 0: must be between 1 and 65535, inclusive"),
    ]
    crd = kind("apiextensions.k8s.io/v1", "CustomResourceDefinition")
    good: Any = {
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "names": {"plural": "widgets", "kind": "Widget"},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object"}},
                }
            ],
        },
    }
    assert _check(crd, good) == []
    bad = copy.deepcopy(good)
    bad["metadata"]["name"] = "widgets"
    bad["spec"]["versions"][0]["storage"] = False
    assert [f for f, _ in _check(crd, bad)] == ["metadata.name", "spec.versions"]
    scoped = copy.deepcopy(good)
    scoped["spec"]["scope"] = "Cluster"
    assert _check(crd, scoped, good) == [
        ("spec.scope", 'Invalid value: "Cluster": field is immutable')
    ]
    cm = kind("v1", "ConfigMap")
    frozen = {"immutable": True, "data": {"a": "1"}}
    assert _check(cm, {"immutable": True, "data": {"a": "2"}}, frozen) == [
        ("data", "Forbidden: field is immutable when `immutable` is set")
    ]
    for k in KINDS:
        if k.validate is not None:
            k.validate({}, None)
            k.validate({"spec": "junk", "metadata": []}, {})
