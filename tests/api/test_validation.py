"""The schema engine (validation, pruning, defaulting), names and metadata checks, JSONPath."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.kube.errors import invalid
from orchestrator.kube.schema import jsonpath, names, validation
from orchestrator.kube.schema.validation import strict_error, unknown_warnings, validate

CONTAINER = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string"},
        "image": {"type": "string"},
        "imagePullPolicy": {"type": "string", "enum": ["Always", "IfNotPresent", "Never"]},
        "ports": {
            "type": "array",
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["containerPort", "protocol"],
            "items": {
                "type": "object",
                "properties": {
                    "containerPort": {"type": "integer", "format": "int32"},
                    "protocol": {"type": "string", "default": "TCP"},
                },
            },
        },
    },
    "x-orchestrator-name": "io.k8s.api.core.v1.Container",
}

DEPLOYMENT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "spec": {
            "type": "object",
            "required": ["selector"],
            "properties": {
                "replicas": {"type": "integer", "format": "int32", "minimum": 0, "default": 1},
                "selector": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "restartPolicy": {"type": "string", "enum": ["Always", "Never", "OnFailure"]},
                "maxSurge": {"x-kubernetes-int-or-string": True},
                "finalizers": {
                    "type": "array",
                    "items": {"type": "string"},
                    "x-kubernetes-list-type": "set",
                },
                "template": {
                    "type": "object",
                    "properties": {
                        "spec": {
                            "type": "object",
                            "properties": {"containers": {"type": "array", "items": CONTAINER}},
                        }
                    },
                },
                "nodeSelector": {"type": "object", "additionalProperties": {"type": "string"}},
                "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "embedded": {
                    "type": "object",
                    "x-kubernetes-embedded-resource": True,
                    "properties": {"spec": {"type": "object", "properties": {}}},
                },
                "stamp": {"type": "string", "format": "date-time"},
                "data": {"type": "string", "format": "byte"},
                "big": {"type": "integer", "format": "int64"},
                "ratio": {"type": "number", "maximum": 1, "exclusiveMinimum": True, "minimum": 0},
                "code": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5},
                "list": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
                "nullable": {"type": "string", "nullable": True},
                "conditions": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "type": {"type": "string"},
                            "status": {"type": "string", "default": "Unknown"},
                        },
                    },
                },
                "settings": {
                    "type": "object",
                    "additionalProperties": {
                        "type": "object",
                        "properties": {"level": {"type": "integer", "default": 3}},
                    },
                },
            },
        },
    },
}


def deployment(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, **spec},
    }


def messages(v: Any) -> list[str]:
    return [f"{c.field}: {c.message}" for c in v.causes]


def test_valid_object_is_defaulted_and_input_untouched() -> None:
    obj = deployment(
        template={"spec": {"containers": [{"name": "a", "ports": [{"containerPort": 80}]}]}}
    )
    before = copy.deepcopy(obj)
    v = validate(DEPLOYMENT, obj, strict=True)
    assert v.causes == []
    assert v.unknown == []
    assert obj == before
    assert v.obj["spec"]["replicas"] == 1
    assert v.obj["spec"]["template"]["spec"]["containers"][0]["ports"][0]["protocol"] == "TCP"
    assert v.obj is not obj
    assert v.obj["spec"]["selector"] is not obj["spec"]["selector"]


def test_stored_managed_fields_are_shared_the_rest_of_metadata_copied() -> None:
    """Every write replaces metadata.managedFields with a list it computes, so an update that
    carries the stored list along gets it handed through instead of copied."""
    schema = {
        "type": "object",
        "properties": {
            "metadata": {
                "type": "object",
                "properties": {
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "managedFields": {
                        "type": "array",
                        "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                    },
                },
            }
        },
    }
    managed = [{"manager": "m", "fieldsV1": {"f:spec": {}}}]
    stored = {"metadata": {"labels": {"a": "b"}, "managedFields": managed}}
    update = {"metadata": {**stored["metadata"]}}
    v = validate(schema, update, strict=True, old=stored)
    assert v.causes == []
    assert v.obj == update
    assert v.obj["metadata"]["managedFields"] is managed
    assert v.obj["metadata"]["labels"] is not stored["metadata"]["labels"]
    sent = validate(schema, copy.deepcopy(update), strict=True, old=stored)
    assert sent.obj == update
    assert sent.obj["metadata"]["managedFields"] is not managed  # an equal list: walked, copied


def test_parts_shared_with_the_stored_object_are_copied_not_checked() -> None:
    """An update that shares a subtree (by identity) with the stored object it replaces takes
    it as already valid; an equal copy, or `True` where `1` was stored, is checked as sent."""
    stored = validate(DEPLOYMENT, deployment(replicas=1), strict=True).obj
    stored["spec"]["template"] = {"spec": {"containers": [{"image": "x"}]}}  # no name: invalid
    update = {**stored, "spec": {**stored["spec"], "code": "ok"}}
    v = validate(DEPLOYMENT, update, strict=True, old=stored)
    assert v.causes == []
    assert v.obj["spec"]["template"] == stored["spec"]["template"]
    assert v.obj["spec"]["template"] is not stored["spec"]["template"]  # still a new object

    equal = copy.deepcopy(update)
    assert messages(validate(DEPLOYMENT, equal, strict=True, old=stored)) == [
        "spec.template.spec.containers[0].name: Required value"
    ]
    flipped = {**stored, "spec": {**stored["spec"], "replicas": True}}
    del flipped["spec"]["template"]
    assert messages(validate(DEPLOYMENT, flipped, strict=True, old=stored)) == [
        'spec.replicas: Invalid value: "boolean": spec.replicas in body must be of type '
        'integer: "boolean"'
    ]


def test_kubernetes_wording() -> None:
    v = validate(DEPLOYMENT, deployment(replicas=-1, restartPolicy="Sometimes"), strict=True)
    assert messages(v) == [
        "spec.replicas: Invalid value: -1: must be greater than or equal to 0",
        'spec.restartPolicy: Unsupported value: "Sometimes": supported values: '
        '"Always", "Never", "OnFailure"',
    ]
    assert [c.reason for c in v.causes] == ["FieldValueInvalid", "FieldValueNotSupported"]
    err = invalid("Deployment", "apps", "web", v.causes[:1])
    assert err.message == (
        'Deployment.apps "web" is invalid: spec.replicas: Invalid value: -1: '
        "must be greater than or equal to 0"
    )
    v = validate(DEPLOYMENT, deployment(replicas="string"), strict=True)
    assert messages(v) == [
        'spec.replicas: Invalid value: "string": spec.replicas in body must be of type integer: '
        '"string"'
    ]
    obj = deployment()
    del obj["spec"]["selector"]
    v = validate(DEPLOYMENT, obj, strict=True)
    assert messages(v) == ["spec.selector: Required value"]
    assert v.causes[0].reason == "FieldValueRequired"


def test_unknown_fields_are_pruned_and_reported() -> None:
    obj = deployment(
        foo=1,
        template={"spec": {"containers": [{"name": "a", "imagePullPolicyy": "Always"}]}},
        extra={"anything": {"goes": [1]}},
        embedded={"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "bogus": 1},
    )
    obj["metadata"]["surprise"] = True
    v = validate(DEPLOYMENT, obj, strict=False)
    assert v.unknown == [
        "metadata.surprise",
        "spec.foo",
        "spec.template.spec.containers[0].imagePullPolicyy",
        "spec.embedded.bogus",
    ]
    assert "foo" not in v.obj["spec"]
    assert v.obj["spec"]["extra"] == {"anything": {"goes": [1]}}
    assert v.obj["spec"]["embedded"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "x"},
    }
    assert strict_error(["spec.foo", "spec.bar"]).message == (
        'strict decoding error: unknown field "spec.foo", unknown field "spec.bar"'
    )
    assert strict_error(["spec.foo"]).code == 400
    assert unknown_warnings(["spec.foo"]) == ['unknown field "spec.foo"']


def test_nulls_defaults_in_items_and_map_values() -> None:
    v = validate(
        DEPLOYMENT,
        deployment(
            replicas=None,
            nullable=None,
            conditions=[{"type": "Ready"}],
            settings={"a": {}, "b": {"level": 1}},
        ),
        strict=True,
    )
    assert v.causes == []
    spec = v.obj["spec"]
    assert spec["replicas"] == 1
    assert spec["nullable"] is None
    assert spec["conditions"] == [{"type": "Ready", "status": "Unknown"}]
    assert spec["settings"] == {"a": {"level": 3}, "b": {"level": 1}}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"maxSurge": "25%"}, []),
        ({"maxSurge": 1}, []),
        (
            {"maxSurge": True},
            [
                'spec.maxSurge: Invalid value: "boolean": spec.maxSurge in body must be of type '
                'integer,string: "boolean"'
            ],
        ),
        ({"finalizers": ["a", "b", "a"]}, ['spec.finalizers[2]: Duplicate value: "a"']),
        (
            {
                "template": {
                    "spec": {
                        "containers": [
                            {"name": "a", "ports": [{"containerPort": 80}, {"containerPort": 80}]}
                        ]
                    }
                }
            },
            [
                "spec.template.spec.containers[0].ports[1]: Duplicate value: "
                '{"containerPort":80,"protocol":"TCP"}'
            ],
        ),
        ({"stamp": "2025-01-01T00:00:00Z"}, []),
        (
            {"stamp": "yesterday"},
            [
                'spec.stamp: Invalid value: "yesterday": spec.stamp in body must be of type '
                'date-time: "yesterday"'
            ],
        ),
        ({"data": "aGVsbG8="}, []),
        (
            {"data": "not base64!"},
            [
                'spec.data: Invalid value: "not base64!": spec.data in body must be of type '
                'byte: "not base64!"'
            ],
        ),
        (
            {"replicas": 2**31},
            [
                "spec.replicas: Invalid value: 2147483648: spec.replicas in body must be of type "
                'int32: "2147483648"'
            ],
        ),
        ({"big": 2**40}, []),
        ({"replicas": 3.0}, []),
        ({"ratio": 0}, ["spec.ratio: Invalid value: 0: must be greater than 0"]),
        ({"ratio": 1.5}, ["spec.ratio: Invalid value: 1.5: must be less than or equal to 1"]),
        (
            {"code": "ABCDEFG"},
            [
                "spec.code: Too long: may not be more than 5 bytes",
                "spec.code: Invalid value: \"ABCDEFG\": spec.code in body should match '^[a-z]+$'",
            ],
        ),
        (
            {"list": ["a", "b", "c"]},
            ["spec.list: Too many: 3: must have at most 2 items"],
        ),
        (
            {"nodeSelector": {"a": 1}},
            [
                'spec.nodeSelector[a]: Invalid value: "integer": spec.nodeSelector[a] in body '
                'must be of type string: "integer"'
            ],
        ),
        (
            {"template": {"spec": {"containers": [{"image": "x"}]}}},
            ["spec.template.spec.containers[0].name: Required value"],
        ),
    ],
)
def test_value_checks(spec: dict[str, Any], expected: list[str]) -> None:
    assert messages(validate(DEPLOYMENT, deployment(**spec), strict=True)) == expected


def test_metadata_is_type_checked() -> None:
    obj = deployment()
    obj["metadata"]["labels"] = {"app": ["x"]}
    v = validate(DEPLOYMENT, obj, strict=True)
    assert [c.field for c in v.causes] == ["metadata.labels[app]"]


def test_integral_floats_become_ints() -> None:
    v = validate(DEPLOYMENT, deployment(replicas=3.0), strict=True)
    assert v.obj["spec"]["replicas"] == 3
    assert isinstance(v.obj["spec"]["replicas"], int)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                ["spec", "replicas", "selector", "template", "containers", "name", "ports", "x"]
            )
            | st.text(max_size=4),
            children,
            max_size=5,
        )
    ),
    max_leaves=30,
)

ODD_SCHEMA = {
    "type": "object",
    "properties": {
        "a": {"type": "array", "items": [{"type": "string"}], "x-kubernetes-list-type": "map"},
        "b": {"pattern": "(", "minLength": "x", "enum": "notalist"},
        "c": {"additionalProperties": True},
        "d": {"type": "bogus"},
    },
    "required": "a",
}


@settings(max_examples=300, deadline=None, derandomize=True)
@given(value=json_values, which=st.sampled_from(["deployment", "container", "odd", "empty"]))
def test_never_raises_on_any_json(value: Any, which: str) -> None:
    schema = {"deployment": DEPLOYMENT, "container": CONTAINER, "odd": ODD_SCHEMA, "empty": {}}[
        which
    ]
    before = json.dumps(value, sort_keys=True)
    v = validate(schema, value, strict=True)
    assert json.dumps(value, sort_keys=True) == before  # input untouched
    json.dumps(v.obj)  # the result is JSON
    for c in v.causes:
        assert isinstance(c.message, str)
        assert c.message
    # Validating the result again finds nothing new to prune or default.
    again = validate(schema, v.obj, strict=True)
    assert again.unknown == []


@settings(max_examples=200, deadline=None, derandomize=True)
@given(obj=json_values)
def test_spec_wrapped_values_never_raise(obj: Any) -> None:
    validate(DEPLOYMENT, {"spec": obj, "metadata": obj}, strict=False)


# -- names ----------------------------------------------------------------------------------------


def test_name_messages() -> None:
    causes = names.validate_metadata(
        {"name": "Bad_Name", "namespace": "default"}, namespaced=True, name_rule="subdomain"
    )
    assert [f"{c.field}: {c.message}" for c in causes] == [
        'metadata.name: Invalid value: "Bad_Name": a lowercase RFC 1123 subdomain must consist '
        "of lower case alphanumeric characters, '-' or '.', and must start and end with an "
        "alphanumeric character (e.g. 'example.com', regex used for validation is "
        "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
    ]
    label = names.validate_metadata({"name": "a.b"}, namespaced=False, name_rule="label")
    assert label[0].message.startswith(
        'Invalid value: "a.b": a lowercase RFC 1123 label must consist of'
    )
    assert "(e.g. 'my-name',  or '123-abc', regex" in label[0].message
    assert names.is_dns1123_label("a" * 64)[0] == "must be no more than 63 characters"
    assert names.is_dns1123_subdomain("a" * 254)[0] == "must be no more than 253 characters"
    assert names.is_dns1123_subdomain("example.com") == []
    assert names.is_path_segment_name("..") == ["may not be '..'"]
    assert names.is_path_segment_name("a/b%") == ["may not contain '/'", "may not contain '%'"]
    assert names.validate_metadata({"name": "A b"}, namespaced=False, name_rule="path") == []


def test_metadata_required_and_namespace() -> None:
    causes = names.validate_metadata({}, namespaced=True, name_rule="subdomain")
    assert [f"{c.field}: {c.message}" for c in causes] == [
        "metadata.name: Required value: name or generateName is required",
        "metadata.namespace: Required value",
    ]
    assert (
        names.validate_metadata(
            {"generateName": "web-", "namespace": "default"}, namespaced=True, name_rule="subdomain"
        )
        == []
    )
    causes = names.validate_metadata(
        {"name": "n", "namespace": "x"}, namespaced=False, name_rule="subdomain"
    )
    assert causes[0].message == "Forbidden: not allowed on this type"


def test_labels_and_annotations() -> None:
    assert names.is_qualified_name("example.com/app") == []
    assert names.is_qualified_name("app") == []
    assert names.is_qualified_name("/app") == ["prefix part must be non-empty"]
    assert names.is_qualified_name("a/b/c")[0].startswith("a qualified name must consist")
    assert names.is_qualified_name("x" * 64) == ["name part must be no more than 63 characters"]
    assert names.is_label_value("") == []
    assert names.is_label_value("-bad")[0].startswith("a valid label must be an empty string")
    causes = names.validate_metadata(
        {"name": "n", "labels": {"bad key": "v", "ok": "bad value"}},
        namespaced=False,
        name_rule="subdomain",
    )
    assert [c.field for c in causes] == ["metadata.labels", "metadata.labels"]
    assert causes[0].message.startswith(
        'Invalid value: "bad key": name part must consist of alphanumeric characters'
    )
    assert causes[1].message.startswith('Invalid value: "bad value": a valid label must')
    big = {"a": "x" * (256 * 1024)}
    causes = names.validate_metadata(
        {"name": "n", "annotations": big}, namespaced=False, name_rule="subdomain"
    )
    assert [c.message for c in causes] == ["Too long: may not be more than 262144 bytes"]


def test_generate_name() -> None:
    rng = random.Random(7)
    name = names.generate_name("web-", rng)
    assert name.startswith("web-")
    assert len(name) == 9
    assert set(name[4:]) <= set(names.NAME_ALPHABET)
    assert len(names.generate_name("x" * 100, rng)) == 63
    assert names.generate_name("web-", random.Random(7)) == name


@settings(max_examples=200, deadline=None, derandomize=True)
@given(meta=json_values)
def test_validate_metadata_never_raises(meta: Any) -> None:
    names.validate_metadata(meta, namespaced=True, name_rule="subdomain")
    if isinstance(meta, dict):
        names.validate_metadata(
            {"labels": meta, "annotations": meta}, namespaced=False, name_rule="label"
        )


# -- jsonpath -------------------------------------------------------------------------------------

OBJ = {
    "metadata": {"labels": {"app": "web", "app.kubernetes.io/name": "n"}},
    "spec": {"replicas": 3, "items": [{"name": "a"}, {"name": "b"}]},
    "status": {
        "conditions": [{"type": "Ready", "status": "True"}, {"type": "Other", "status": "False"}]
    },
}


@pytest.mark.parametrize(
    ("expr", "found"),
    [
        (".spec.replicas", [3]),
        ('.status.conditions[?(@.type=="Ready")].status', ["True"]),
        (".status.conditions[?(@.type!='Ready')].type", ["Other"]),
        (".metadata.labels.app", ["web"]),
        (".spec.items[0].name", ["a"]),
        (".spec.items[-1].name", ["b"]),
        (".spec.items[*].name", ["a", "b"]),
        ("{.spec.items[0:1]}", [{"name": "a"}]),
        ("$.metadata.labels['app.kubernetes.io/name']", ["n"]),
        (".metadata.labels.app\\.kubernetes\\.io/name", ["n"]),
        ("..name", ["a", "b"]),
        (".spec.missing.deeper", []),
        (".spec.replicas.x", []),
    ],
)
def test_jsonpath_find(expr: str, found: list[Any]) -> None:
    assert jsonpath.compile(expr).find(OBJ) == found


@pytest.mark.parametrize(
    "expr", ["", "spec.replicas", ".spec[0", ".a[?(@.b==)]", ".a[x]", '.a[?(@.b=="x"]', ".a.."]
)
def test_jsonpath_syntax_errors(expr: str) -> None:
    with pytest.raises(jsonpath.JSONPathError):
        jsonpath.compile(expr)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(value=json_values)
def test_jsonpath_find_never_raises(value: Any) -> None:
    for expr in (".spec.replicas", '.x[?(@.name=="a")].ports[*]', "..name", ".x[0:2]"):
        jsonpath.compile(expr).find(value)


def test_builtin_deployment_schema() -> None:
    mod = pytest.importorskip("orchestrator.kube.schema.builtin")
    kind = mod.builtin_registry().by_gvk("apps/v1", "Deployment")
    container = {"name": "nginx", "image": "nginx:1.26", "imagePullPolicyy": "Always"}
    obj: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "nginx", "labels": {"app": "nginx"}},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "nginx"}},
            "template": {
                "metadata": {"labels": {"app": "nginx"}},
                "spec": {"containers": [container]},
            },
        },
    }
    v = validate(kind.schema, obj, strict=True)
    assert v.causes == []
    assert v.unknown == ["spec.template.spec.containers[0].imagePullPolicyy"]
    obj["spec"]["replicas"] = -1
    assert messages(validate(kind.schema, obj, strict=True)) == [
        "spec.replicas: Invalid value: -1: must be greater than or equal to 0"
    ]


def test_name_checks_remember_only_valid_values() -> None:
    for _ in range(2):  # the second round answers from the remembered valid values
        assert names.is_dns1123_subdomain("web-1.example") == []
        assert names.is_dns1123_label("web-1") == []
        assert names.is_label_value("v1.2_3") == []
        assert names.is_dns1123_subdomain("Bad_Name") == [names.DNS1123_SUBDOMAIN_MSG]
        assert names.is_dns1123_label("a.b") == [names.DNS1123_LABEL_MSG]
        assert names.is_label_value("-x") == [names.LABEL_VALUE_MSG]
    assert "Bad_Name" not in names._VALID["subdomain"]


def test_the_spec_walk_of_new_objects_is_memoized_with_its_findings() -> None:
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "n": {"type": "integer", "minimum": 1},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "mode": {"type": "string", "default": "on"},
                },
            }
        },
    }
    validation._SPECS.clear()
    first = validate(schema, {"spec": {"n": 0, "x": 1, "tags": ["a"]}}, strict=False)
    assert len(validation._SPECS) == 1
    again = validate(schema, {"spec": {"n": 0, "x": 1, "tags": ["a"]}}, strict=False)
    assert again.causes == first.causes
    assert [c.field for c in again.causes] == ["spec.n"]
    assert again.unknown == first.unknown == ["spec.x"]
    assert again.obj == first.obj == {"spec": {"n": 0, "tags": ["a"], "mode": "on"}}
    assert again.obj["spec"] is not first.obj["spec"]  # each caller its own copy
    first.obj["spec"]["tags"].append("b")
    again.obj["spec"]["tags"].append("c")
    third = validate(schema, {"spec": {"n": 0, "x": 1, "tags": ["a"]}}, strict=False)
    assert third.obj["spec"]["tags"] == ["a"]
    # A tuple packs like a list but is not an array to the walk: never answered from the memo.
    odd = validate(schema, {"spec": {"n": 0, "x": 1, "tags": ("a",)}}, strict=False)
    assert [c.field for c in odd.causes] == ["spec.n", "spec.tags"]


LEAVES: dict[str, Any] = {
    "type": "object",
    "properties": {
        "phase": {"type": "string", "enum": ["Pending", "Running"]},
        "since": {"type": "string", "format": "date-time"},
        "ready": {"type": "boolean"},
        "count": {"type": "integer"},
        "items": {
            "type": "array",
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
            "items": {"type": "object", "properties": {"name": {"type": "string"}}},
        },
    },
}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"phase": "Running", "since": "2025-01-01T00:00:00Z", "ready": True, "count": 2}, []),
        (
            {"phase": "Gone"},
            ['phase: Unsupported value: "Gone": supported values: "Pending", "Running"'],
        ),
        (
            {"since": "2025-13-01T00:00:00Z"},
            [
                'since: Invalid value: "2025-13-01T00:00:00Z": since in body must be of type '
                'date-time: "2025-13-01T00:00:00Z"'
            ],
        ),
        (
            {"ready": 1},
            ['ready: Invalid value: "integer": ready in body must be of type boolean: "integer"'],
        ),
        (
            {"count": True},
            ['count: Invalid value: "boolean": count in body must be of type integer: "boolean"'],
        ),
        ({"items": [{"name": "a"}, {"name": "b"}]}, []),
        (
            {"items": [{"name": "a"}, {"name": "b"}, {"name": "a"}]},
            ['items[2]: Duplicate value: {"name":"a"}'],
        ),
        ({"items": [{}, {"name": "a"}, {}]}, ["items[2]: Duplicate value: {}"]),
    ],
)
def test_leaves_and_single_key_lists_take_the_short_way_to_the_same_findings(
    value: dict[str, Any], expected: list[str]
) -> None:
    """Plain leaves (a type, an enum, the date-time format) and single-key list maps are checked
    without a full walk; the findings are the full walk's."""
    v = validate(LEAVES, value, strict=True)
    assert messages(v) == expected
    assert v.obj == value


def test_malformed_leaf_schemas_are_walked_not_trusted() -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": ["string"]},  # unhashable: no short way, and no crash
            "b": {"type": "string", "enum": [1, "x"]},
            "c": {"type": "string", "format": ["date-time"]},
        },
    }
    v = validate(schema, {"a": "x", "b": "y", "c": "z"}, strict=True)
    assert v.obj == {"a": "x", "b": "y", "c": "z"}
    assert messages(v) == ['b: Unsupported value: "y": supported values: 1, "x"']


ITEMS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "conds": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["type"],
                "properties": {
                    "type": {"type": "string"},
                    "status": {"type": "string", "default": "Unknown"},
                    "n": {"type": "integer", "minimum": 0},
                    "detail": {
                        "type": "object",
                        "properties": {"m": {"type": "integer", "minimum": 0}},
                    },
                },
            },
        },
        "maybe": {
            "type": "array",
            "items": {"type": "object", "nullable": True, "properties": {"a": {"type": "string"}}},
        },
    },
}


def test_items_of_an_object_schema_are_checked_item_by_item() -> None:
    """An array of objects takes a shorter way through its items (no `walk` per item); each
    item still gets the checks, defaults, unknown-field paths and sharing of a walked one."""
    v = validate(
        ITEMS,
        {"conds": [{"type": "A"}, {"n": -1, "x": 1}, "text", None], "maybe": [None, {"a": "b"}]},
        strict=False,
    )
    assert v.obj == {
        "conds": [{"type": "A", "status": "Unknown"}, {"n": -1, "status": "Unknown"}, "text", None],
        "maybe": [None, {"a": "b"}],
    }
    assert messages(v) == [
        "conds[1].n: Invalid value: -1: must be greater than or equal to 0",
        "conds[1].type: Required value",
        'conds[2]: Invalid value: "string": conds[2] in body must be of type object: "string"',
        'conds[3]: Invalid value: "null": conds[3] in body must be of type object: "null"',
    ]
    assert v.unknown == ["conds[1].x"]
    # An item shared with the stored object is taken as valid (copied); an equal one is checked.
    stored: dict[str, Any] = {"conds": [{"n": -5}, {"type": "B", "detail": {"m": -7}}]}
    update = {
        "conds": [
            stored["conds"][0],
            {"type": "B", "n": -2, "detail": stored["conds"][1]["detail"]},
        ]
    }
    v = validate(ITEMS, update, strict=True, old=stored)
    assert messages(v) == ["conds[1].n: Invalid value: -2: must be greater than or equal to 0"]
    assert v.obj["conds"][0] == {"n": -5}
    assert v.obj["conds"][0] is not stored["conds"][0]


def test_kept_top_level_fields_of_the_stored_object_are_shared() -> None:
    """`keep` names top-level fields the caller will not modify: the stored object's (by
    identity) go into the result as they are; anything else is copied as usual."""
    stored = validate(DEPLOYMENT, deployment(replicas=1), strict=True).obj
    update = {**stored, "status": {"replicas": 1}}
    kept = validate(DEPLOYMENT, update, strict=True, old=stored, keep=("spec",))
    assert kept.causes == []
    assert kept.obj["spec"] is stored["spec"]
    copied = validate(DEPLOYMENT, update, strict=True, old=stored)
    assert copied.obj["spec"] == stored["spec"]
    assert copied.obj["spec"] is not stored["spec"]
    # An equal spec that is not the stored one is walked (and copied) even when kept.
    equal = {**update, "spec": copy.deepcopy(stored["spec"])}
    walked = validate(DEPLOYMENT, equal, strict=True, old=stored, keep=("spec",))
    assert walked.obj["spec"] == stored["spec"]
    assert walked.obj["spec"] is not equal["spec"]
    assert walked.obj["spec"] is not stored["spec"]
    # Only top-level fields: a nested field of that name is copied.
    fresh = {**update, "spec": {**stored["spec"]}}  # a new spec holding the stored selector
    nested = validate(DEPLOYMENT, fresh, strict=True, old=stored, keep=("selector",))
    assert nested.obj["spec"]["selector"] == stored["spec"]["selector"]
    assert nested.obj["spec"]["selector"] is not stored["spec"]["selector"]
