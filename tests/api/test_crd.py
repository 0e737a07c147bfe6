"""CRDs: validation messages, the custom Kinds they serve (schema, columns, scale), their status."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.kube.schema.crd import crd_status, kinds_from_crd
from orchestrator.kube.schema.crd_validation import validate_crd
from orchestrator.kube.schema.kind import Registry, ScaleSpec
from orchestrator.kube.schema.openapi import openapi_document
from orchestrator.kube.schema.validation import validate

NOW = 1735689600.0  # 2025-01-01T00:00:00Z


def widget_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {
                "plural": "widgets",
                "singular": "widget",
                "kind": "Widget",
                "shortNames": ["wd"],
                "categories": ["all"],
            },
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "A widget.",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "required": ["color"],
                                    "properties": {
                                        "size": {"type": "integer", "default": 3, "minimum": 1},
                                        "color": {"type": "string", "enum": ["red", "blue"]},
                                        "extra": {
                                            "type": "object",
                                            "x-kubernetes-preserve-unknown-fields": True,
                                        },
                                    },
                                },
                                "status": {
                                    "type": "object",
                                    "properties": {
                                        "replicas": {"type": "integer"},
                                        "selector": {"type": "string"},
                                        "conditions": {
                                            "type": "array",
                                            "items": {
                                                "type": "object",
                                                "properties": {
                                                    "type": {"type": "string"},
                                                    "status": {"type": "string"},
                                                },
                                            },
                                        },
                                    },
                                },
                            },
                        }
                    },
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.size",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": [
                        {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
                        {"name": "Color", "type": "string", "jsonPath": ".spec.color"},
                        {
                            "name": "Ready",
                            "type": "string",
                            "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
                        },
                        {
                            "name": "Extra",
                            "type": "string",
                            "priority": 1,
                            "jsonPath": ".spec.extra",
                        },
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                },
                {
                    "name": "v1beta1",
                    "served": False,
                    "storage": False,
                    "schema": {"openAPIV3Schema": {"type": "object"}},
                },
            ],
        },
    }


def messages(crd: Any) -> list[str]:
    return [f"{c.field}: {c.message}" for c in validate_crd(crd)]


def test_valid_crd() -> None:
    assert validate_crd(widget_crd()) == []


def test_names_group_scope_messages() -> None:
    crd = widget_crd()
    crd["metadata"]["name"] = "widgets"
    crd["spec"]["group"] = "example"
    crd["spec"]["scope"] = "Global"
    crd["spec"]["names"]["plural"] = "Widgets"
    crd["spec"]["names"]["kind"] = "my-widget"
    assert messages(crd) == [
        'metadata.name: Invalid value: "widgets": must be spec.names.plural+"."+spec.group',
        'spec.group: Invalid value: "example": should be a domain with at least one dot',
        'spec.names.plural: Invalid value: "Widgets": a lowercase RFC 1123 label must consist of '
        "lower case alphanumeric characters or '-', and must start and end with an alphanumeric "
        "character (e.g. 'my-name',  or '123-abc', regex used for validation is "
        "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
        'spec.names.kind: Invalid value: "my-widget": must be a CamelCase name of letters and '
        "digits, e.g. Widget",
        'spec.scope: Unsupported value: "Global": supported values: "Cluster", "Namespaced"',
    ]


def test_versions_messages() -> None:
    crd = widget_crd()
    crd["spec"]["versions"][1]["storage"] = True
    assert messages(crd) == [
        'spec.versions: Invalid value: ["v1","v1beta1"]: must have exactly one version marked '
        "as storage version"
    ]
    crd = widget_crd()
    del crd["spec"]["versions"][0]["schema"]
    crd["spec"]["versions"][1]["name"] = "v1"
    assert messages(crd) == [
        "spec.versions[0].schema.openAPIV3Schema: Required value: schemas are required",
        'spec.versions[1].name: Duplicate value: "v1"',
    ]
    crd = widget_crd()
    crd["spec"]["versions"] = []
    assert messages(crd)[-1].startswith("spec.versions: Required value")


def test_structural_schema_messages() -> None:
    crd = widget_crd()
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    root["properties"]["spec"]["properties"]["untyped"] = {"description": "no type"}
    root["properties"]["spec"]["properties"]["list"] = {"type": "array"}
    root["properties"]["spec"]["properties"]["both"] = {
        "type": "object",
        "properties": {"a": {"type": "string"}},
        "additionalProperties": {"type": "string"},
    }
    root["properties"]["spec"]["properties"]["size"]["default"] = "big"
    root["properties"]["spec"]["properties"]["keys"] = {
        "type": "array",
        "x-kubernetes-list-type": "map",
        "items": {"type": "object", "properties": {"name": {"type": "string"}}},
    }
    prefix = "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties"
    assert messages(crd) == [
        f"{prefix}[both].additionalProperties: Forbidden: additionalProperties and properties "
        "are mutual exclusive",
        f"{prefix}[keys].x-kubernetes-list-map-keys: Required value: must not be empty if "
        "x-kubernetes-list-type is map",
        f"{prefix}[list].items: Required value: must be specified",
        f'{prefix}[size].default: Invalid value: "string": body must be of type integer: "string"',
        f"{prefix}[untyped].type: Required value: must not be empty for specified object fields",
    ]
    crd = widget_crd()
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["type"] = "string"
    assert messages(crd) == [
        'spec.versions[0].schema.openAPIV3Schema.type: Invalid value: "string": must be object '
        "at the root"
    ]


def test_scale_and_column_messages() -> None:
    crd = widget_crd()
    version = crd["spec"]["versions"][0]
    version["subresources"]["scale"]["specReplicasPath"] = ".status.size"
    version["additionalPrinterColumns"][0]["jsonPath"] = ".spec.items[0"
    version["additionalPrinterColumns"][1]["type"] = "color"
    got = messages(crd)
    assert got[0] == (
        'spec.versions[0].subresources.scale.specReplicasPath: Invalid value: ".status.size": '
        "should be a json path under .spec"
    )
    assert got[1].startswith(
        'spec.versions[0].additionalPrinterColumns[0].jsonPath: Invalid value: ".spec.items[0": '
    )
    assert got[2] == (
        'spec.versions[0].additionalPrinterColumns[1].type: Unsupported value: "color": '
        'supported values: "boolean", "date", "integer", "number", "string"'
    )


def test_kinds_from_crd() -> None:
    crd = widget_crd()
    before = copy.deepcopy(crd)
    (kind,) = kinds_from_crd(crd)  # v1beta1 is not served
    assert crd == before
    assert (kind.group, kind.version, kind.kind, kind.plural, kind.singular) == (
        "example.com",
        "v1",
        "Widget",
        "widgets",
        "widget",
    )
    assert kind.namespaced
    assert kind.custom
    assert kind.short_names == ("wd",)
    assert kind.categories == ("all",)
    assert kind.subresources == frozenset({"status", "scale"})
    assert kind.scale == ScaleSpec("spec.size", "status.replicas", "status.selector")
    assert kind.description == "A widget."
    assert [(c.name, c.type, c.priority) for c in kind.columns] == [
        ("Name", "string", 0),
        ("Size", "integer", 0),
        ("Color", "string", 0),
        ("Ready", "string", 0),
        ("Extra", "string", 1),
        ("Age", "date", 0),
    ]


def test_custom_objects_are_validated_pruned_defaulted() -> None:
    (kind,) = kinds_from_crd(widget_crd())
    obj = {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": "w", "namespace": "default", "labels": {"a": "b"}},
        "spec": {"color": "red", "bogus": 1, "extra": {"kept": True}},
    }
    v = validate(kind.schema, obj, strict=False)
    assert v.causes == []
    assert v.unknown == ["spec.bogus"]
    assert v.obj["spec"] == {"color": "red", "extra": {"kept": True}, "size": 3}
    assert v.obj["metadata"] == obj["metadata"]
    bad = {**obj, "spec": {"size": 0, "color": "green"}}
    assert [f"{c.field}: {c.message}" for c in validate(kind.schema, bad, strict=True).causes] == [
        "spec.size: Invalid value: 0: must be greater than or equal to 1",
        'spec.color: Unsupported value: "green": supported values: "red", "blue"',
    ]
    labels = {**obj, "metadata": {"name": "w", "labels": {"a": 1}}}
    assert [c.field for c in validate(kind.schema, labels, strict=True).causes] == [
        "metadata.labels[a]"
    ]


def test_columns_render_cells() -> None:
    (kind,) = kinds_from_crd(widget_crd())
    obj = {
        "metadata": {"name": "w", "creationTimestamp": "2025-01-01T00:00:00Z"},
        "spec": {"size": 3.0, "color": "red", "extra": {"a": [1]}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    assert [c.cell(obj, NOW + 300) for c in kind.columns] == [
        "w",
        3,
        "red",
        "True",
        '{"a":[1]}',
        "5m",
    ]
    assert [c.cell({"metadata": {"name": "x"}}, NOW) for c in kind.columns] == [
        "x",
        None,
        None,
        None,
        None,
        None,
    ]


def test_default_columns_and_cluster_scope() -> None:
    crd = widget_crd()
    crd["spec"]["scope"] = "Cluster"
    del crd["spec"]["versions"][0]["additionalPrinterColumns"]
    del crd["spec"]["names"]["singular"]
    (kind,) = kinds_from_crd(crd)
    assert [c.name for c in kind.columns] == ["Name", "Age"]
    assert not kind.namespaced
    assert kind.singular == "widget"


def test_user_schema_cannot_name_components() -> None:
    crd = widget_crd()
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["x-orchestrator-name"] = "io.k8s.api.core.v1.Pod"
    (kind,) = kinds_from_crd(crd)
    assert "x-orchestrator-name" not in kind.schema["properties"]["spec"]
    doc = openapi_document(Registry([kind]), "example.com", "v1")
    assert doc is not None
    schemas = doc["components"]["schemas"]
    assert "io.k8s.api.core.v1.Pod" not in schemas
    widget = schemas["com.example.v1.Widget"]
    assert widget["x-kubernetes-group-version-kind"] == [
        {"group": "example.com", "version": "v1", "kind": "Widget"}
    ]
    assert widget["properties"]["metadata"]["allOf"] == [
        {"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
    ]


def test_status() -> None:
    status = crd_status(widget_crd(), "2025-01-01T00:00:00Z")
    assert status == {
        "conditions": [
            {
                "type": "NamesAccepted",
                "status": "True",
                "lastTransitionTime": "2025-01-01T00:00:00Z",
                "reason": "NoConflicts",
                "message": "no conflicts found",
            },
            {
                "type": "Established",
                "status": "True",
                "lastTransitionTime": "2025-01-01T00:00:00Z",
                "reason": "InitialNamesAccepted",
                "message": "the initial names have been accepted",
            },
        ],
        "acceptedNames": {
            "plural": "widgets",
            "singular": "widget",
            "kind": "Widget",
            "listKind": "WidgetList",
            "shortNames": ["wd"],
            "categories": ["all"],
        },
        "storedVersions": ["v1"],
    }
    # Level-based: an update keeps transition times and every version ever stored.
    crd = widget_crd()
    crd["status"] = {**status, "storedVersions": ["v1alpha1"]}
    later = crd_status(crd, "2025-02-01T00:00:00Z")
    assert later["storedVersions"] == ["v1alpha1", "v1"]
    assert {c["lastTransitionTime"] for c in later["conditions"]} == {"2025-01-01T00:00:00Z"}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                ["spec", "names", "versions", "schema", "openAPIV3Schema", "type", "properties"]
            )
            | st.text(max_size=3),
            children,
            max_size=4,
        )
    ),
    max_leaves=25,
)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(junk=json_values, where=st.sampled_from(["crd", "spec", "names", "version", "schema"]))
def test_validate_crd_never_raises(junk: Any, where: str) -> None:
    crd = widget_crd()
    if where == "crd":
        crd = junk
    elif where == "spec":
        crd["spec"] = junk
    elif where == "names":
        crd["spec"]["names"] = junk
    elif where == "version":
        crd["spec"]["versions"][0] = junk
    else:
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"] = junk
    validate_crd(crd)
    if isinstance(crd, dict):
        kinds_from_crd(crd)
        crd_status(crd, "2025-01-01T00:00:00Z")


@pytest.mark.parametrize("kind", ["Widget", "WidgetV2"])
def test_kind_names_accepted(kind: str) -> None:
    crd = widget_crd()
    crd["spec"]["names"]["kind"] = kind
    assert validate_crd(crd) == []
