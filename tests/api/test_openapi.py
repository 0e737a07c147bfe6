"""OpenAPI v3 documents, checked the way kubectl reads them (apply's fieldValidation probe,
`kubectl explain`'s walk), on a hand-written registry and on the built-in kinds."""

from __future__ import annotations

import json
from typing import Any

import pytest

from orchestrator.kube.schema.columns import AGE, NAME
from orchestrator.kube.schema.kind import Kind, Registry, ScaleSpec
from orchestrator.kube.schema.openapi import (
    document_hash,
    openapi_document,
    openapi_index,
    schema_name,
)

REF = "#/components/schemas/"

STRATEGY = {
    "type": "object",
    "description": "How to replace pods.",
    "properties": {
        "type": {"type": "string", "enum": ["Recreate", "RollingUpdate"]},
        "rollingUpdate": {
            "type": "object",
            "properties": {"maxSurge": {"x-kubernetes-int-or-string": True}},
            "x-orchestrator-name": "io.k8s.api.apps.v1.RollingUpdateDeployment",
        },
    },
    "x-orchestrator-name": "io.k8s.api.apps.v1.DeploymentStrategy",
}
CONTAINER = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "image": {"type": "string"}},
    "x-orchestrator-name": "io.k8s.api.core.v1.Container",
}
META = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "namespace": {"type": "string"}},
    "x-orchestrator-name": "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
}


def _kind(
    group: str, version: str, kind: str, plural: str, spec: dict[str, Any], **kw: Any
) -> Kind:
    return Kind(
        group=group,
        version=version,
        kind=kind,
        plural=plural,
        singular=kind.lower(),
        namespaced=kw.pop("namespaced", True),
        schema={
            "type": "object",
            "description": f"A {kind}.",
            "properties": {
                "apiVersion": {"type": "string"},
                "kind": {"type": "string"},
                "metadata": {**META, "description": "Standard object metadata."},
                "spec": spec,
            },
        },
        columns=(NAME, AGE),
        **kw,
    )


DEPLOYMENT = _kind(
    "apps",
    "v1",
    "Deployment",
    "deployments",
    {
        "type": "object",
        "properties": {
            "replicas": {"type": "integer"},
            "strategy": {
                **STRATEGY,
                "description": "The deployment strategy.",
                "x-kubernetes-patch-strategy": "retainKeys",
            },
            "containers": {
                "type": "array",
                "items": CONTAINER,
                "x-kubernetes-patch-strategy": "merge",
                "x-kubernetes-patch-merge-key": "name",
            },
            "labels": {"type": "object", "additionalProperties": CONTAINER},
        },
        "x-orchestrator-name": "io.k8s.api.apps.v1.DeploymentSpec",
    },
    subresources=frozenset({"status", "scale"}),
    scale=ScaleSpec(),
)
NAMESPACE = _kind("", "v1", "Namespace", "namespaces", {"type": "object"}, namespaced=False)
POD = _kind(
    "",
    "v1",
    "Pod",
    "pods",
    {"type": "object", "properties": {"containers": {"type": "array", "items": CONTAINER}}},
    subresources=frozenset({"status", "binding", "log"}),
)
WIDGET = _kind(
    "example.com",
    "v1",
    "Widget",
    "widgets",
    {"type": "object", "properties": {"size": {"type": "integer"}}},
    custom=True,
)


def registry() -> Registry:
    return Registry([DEPLOYMENT, NAMESPACE, POD, WIDGET])


# -- what kubectl does with the documents ---------------------------------------------------------


def supports_field_validation(doc: dict[str, Any], gvk: dict[str, str]) -> bool:
    """cli-runtime's supportsQueryParamV3: every PATCH op with the GVK must have the param."""
    found = False
    for item in doc["paths"].values():
        op = item.get("patch")
        if op is None or op.get("x-kubernetes-group-version-kind") != gvk:
            continue
        found = True
        names = {p["name"] for p in op.get("parameters", []) if p["in"] == "query"}
        if "fieldValidation" not in names:
            return False
    return found


def explain(doc: dict[str, Any], gvk: dict[str, str], fields: list[str]) -> dict[str, Any]:
    """kubectl explain v2: GVK on an op, schema by GVK list, walk properties via allOf/$ref."""
    assert any(
        op.get("x-kubernetes-group-version-kind") == gvk
        for item in doc["paths"].values()
        for op in item.values()
        if isinstance(op, dict)
    )
    schemas = doc["components"]["schemas"]
    tagged = [s for s in schemas.values() if gvk in s.get("x-kubernetes-group-version-kind", [])]
    assert len(tagged) == 1
    node = tagged[0]

    def resolve(n: dict[str, Any]) -> dict[str, Any]:
        while True:
            if "$ref" in n:
                n = schemas[n["$ref"].removeprefix(REF)]
            elif "allOf" in n:
                n = schemas[n["allOf"][0]["$ref"].removeprefix(REF)]
            elif n.get("type") == "array":
                n = n["items"]
            else:
                return n

    for f in fields:
        node = resolve(resolve(node)["properties"][f])
    out: dict[str, Any] = node
    return out


def refs(value: Any) -> set[str]:
    if isinstance(value, dict):
        out = {value["$ref"]} if isinstance(value.get("$ref"), str) else set()
        for v in value.values():
            out |= refs(v)
        return out
    if isinstance(value, list):
        out = set()
        for v in value:
            out |= refs(v)
        return out
    return set()


def keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        out = set(value)
        for v in value.values():
            out |= keys(v)
        return out
    if isinstance(value, list):
        out = set()
        for v in value:
            out |= keys(v)
        return out
    return set()


# -- tests ----------------------------------------------------------------------------------------


def test_index_lists_every_group_version_with_a_stable_hash() -> None:
    idx = openapi_index(registry())
    assert sorted(idx["paths"]) == ["api/v1", "apis/apps/v1", "apis/example.com/v1"]
    url = idx["paths"]["apis/apps/v1"]["serverRelativeURL"]
    doc = openapi_document(registry(), "apps", "v1")
    assert doc is not None
    assert url == f"/openapi/v3/apis/apps/v1?hash={document_hash(doc)}"
    assert openapi_index(registry()) == idx
    assert openapi_document(registry(), "nope", "v1") is None


def test_documents_are_json_deterministic_and_self_contained() -> None:
    for group, version in (("", "v1"), ("apps", "v1"), ("example.com", "v1")):
        doc = openapi_document(registry(), group, version)
        assert doc is not None
        text = json.dumps(doc)
        assert json.dumps(openapi_document(registry(), group, version)) == text
        assert doc["openapi"].startswith("3.0")
        schemas = doc["components"]["schemas"]
        for ref in refs(doc):
            assert ref.removeprefix(REF) in schemas, ref
        assert not any(k.startswith("x-orchestrator-") for k in keys(doc))


def test_patch_ops_advertise_field_validation() -> None:
    reg = registry()
    apps = openapi_document(reg, "apps", "v1")
    core = openapi_document(reg, "", "v1")
    custom = openapi_document(reg, "example.com", "v1")
    assert apps is not None
    assert core is not None
    assert custom is not None
    deployment = {"group": "apps", "version": "v1", "kind": "Deployment"}
    assert supports_field_validation(apps, deployment)
    namespace = {"group": "", "version": "v1", "kind": "Namespace"}
    assert supports_field_validation(core, namespace)
    assert "patch" in core["paths"]["/api/v1/namespaces/{name}"]
    assert supports_field_validation(
        custom, {"group": "example.com", "version": "v1", "kind": "Widget"}
    )

    patch = apps["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"]
    assert patch["x-kubernetes-action"] == "patch"
    assert {p["name"] for p in patch["parameters"]} >= {
        "fieldValidation",
        "fieldManager",
        "force",
        "dryRun",
    }
    assert set(patch["requestBody"]["content"]) == {
        "application/json-patch+json",
        "application/merge-patch+json",
        "application/apply-patch+yaml",
        "application/strategic-merge-patch+json",
    }
    widget = custom["paths"]["/apis/example.com/v1/namespaces/{namespace}/widgets/{name}"]
    assert "application/strategic-merge-patch+json" not in widget["patch"]["requestBody"]["content"]


def test_paths_and_subresources() -> None:
    apps = openapi_document(registry(), "apps", "v1")
    core = openapi_document(registry(), "", "v1")
    assert apps is not None
    assert core is not None
    paths = apps["paths"]
    assert set(paths) == {
        "/apis/apps/v1/namespaces/{namespace}/deployments",
        "/apis/apps/v1/namespaces/{namespace}/deployments/{name}",
        "/apis/apps/v1/namespaces/{namespace}/deployments/{name}/status",
        "/apis/apps/v1/namespaces/{namespace}/deployments/{name}/scale",
        "/apis/apps/v1/deployments",
    }
    assert paths["/apis/apps/v1/deployments"]["get"]["x-kubernetes-action"] == "list"
    assert paths["/apis/apps/v1/namespaces/{namespace}/deployments"]["post"]["operationId"] == (
        "createAppsV1NamespacedDeployment"
    )
    scale = paths["/apis/apps/v1/namespaces/{namespace}/deployments/{name}/scale"]
    assert scale["patch"]["x-kubernetes-group-version-kind"] == {
        "group": "autoscaling",
        "version": "v1",
        "kind": "Scale",
    }
    scale_schema = apps["components"]["schemas"]["io.k8s.api.autoscaling.v1.Scale"]
    assert scale_schema["x-kubernetes-group-version-kind"] == [
        {"group": "autoscaling", "version": "v1", "kind": "Scale"}
    ]
    assert "/api/v1/namespaces/{namespace}/pods/{name}/binding" in core["paths"]
    log = core["paths"]["/api/v1/namespaces/{namespace}/pods/{name}/log"]["get"]
    assert "tailLines" in {p["name"] for p in log["parameters"]}
    assert "/api/v1/namespaces" in core["paths"]  # cluster-scoped collection


def test_components_named_once_and_referenced() -> None:
    apps = openapi_document(registry(), "apps", "v1")
    assert apps is not None
    schemas = apps["components"]["schemas"]
    top = schemas["io.k8s.api.apps.v1.Deployment"]
    assert top["x-kubernetes-group-version-kind"] == [
        {"group": "apps", "version": "v1", "kind": "Deployment"}
    ]
    assert schemas["io.k8s.api.apps.v1.DeploymentList"]["x-kubernetes-group-version-kind"] == [
        {"group": "apps", "version": "v1", "kind": "DeploymentList"}
    ]
    spec = schemas["io.k8s.api.apps.v1.DeploymentSpec"]
    strategy = spec["properties"]["strategy"]
    assert strategy["allOf"] == [{"$ref": REF + "io.k8s.api.apps.v1.DeploymentStrategy"}]
    assert strategy["description"] == "The deployment strategy."
    assert strategy["x-kubernetes-patch-strategy"] == "retainKeys"
    assert spec["properties"]["containers"]["items"] == {
        "$ref": REF + "io.k8s.api.core.v1.Container"
    }
    assert spec["properties"]["labels"]["additionalProperties"] == {
        "$ref": REF + "io.k8s.api.core.v1.Container"
    }
    assert spec["properties"]["containers"]["x-kubernetes-patch-merge-key"] == "name"
    assert schema_name(WIDGET) == "com.example.v1.Widget"
    custom = openapi_document(registry(), "example.com", "v1")
    assert custom is not None
    assert "com.example.v1.Widget" in custom["components"]["schemas"]


def test_explain_walks_properties_through_refs() -> None:
    apps = openapi_document(registry(), "apps", "v1")
    assert apps is not None
    gvk = {"group": "apps", "version": "v1", "kind": "Deployment"}
    strategy = explain(apps, gvk, ["spec", "strategy"])
    assert set(strategy["properties"]) == {"type", "rollingUpdate"}
    rolling = explain(apps, gvk, ["spec", "strategy", "rollingUpdate"])
    assert "maxSurge" in rolling["properties"]
    assert explain(apps, gvk, ["spec", "containers", "image"]) == {"type": "string"}
    assert "name" in explain(apps, gvk, ["metadata"])["properties"]


# -- the built-in kinds ---------------------------------------------------------------------------


def builtin() -> Registry:
    mod = pytest.importorskip("orchestrator.kube.schema.builtin")
    reg: Registry = mod.builtin_registry()
    return reg


def test_builtin_documents() -> None:
    reg = builtin()
    idx = openapi_index(reg)
    assert "api/v1" in idx["paths"]
    assert "apis/apps/v1" in idx["paths"]
    core = openapi_document(reg, "", "v1")
    apps = openapi_document(reg, "apps", "v1")
    assert core is not None
    assert apps is not None
    assert supports_field_validation(core, {"group": "", "version": "v1", "kind": "Namespace"})
    for kind in reg:
        doc = openapi_document(reg, kind.group, kind.version)
        assert doc is not None
        gvk = {"group": kind.group, "version": kind.version, "kind": kind.kind}
        assert supports_field_validation(doc, gvk), kind.kind
        for ref in refs(doc):
            assert ref.removeprefix(REF) in doc["components"]["schemas"], ref
        assert not any(k.startswith("x-orchestrator-") for k in keys(doc))
    strategy = explain(
        apps, {"group": "apps", "version": "v1", "kind": "Deployment"}, ["spec", "strategy"]
    )
    assert "rollingUpdate" in strategy["properties"]
    containers = explain(
        apps,
        {"group": "apps", "version": "v1", "kind": "Deployment"},
        ["spec", "template", "spec", "containers"],
    )
    assert "image" in containers["properties"]
    patch = apps["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"]
    assert "application/strategic-merge-patch+json" in patch["requestBody"]["content"]
