"""Strategic merge patch: the rules of kubectl-compat.md §7, and Hypothesis properties."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.kube.errors import ApiError
from orchestrator.kube.patch import (
    apply_strategic_merge_patch,
    create_three_way_merge_patch,
    create_two_way_merge_patch,
)

STR: dict[str, Any] = {"type": "string"}
INT: dict[str, Any] = {"type": "integer"}


def obj(**props: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props}


def merge_list(key: str, items: dict[str, Any], strategy: str = "merge") -> dict[str, Any]:
    return {
        "type": "array",
        "items": items,
        "x-kubernetes-patch-strategy": strategy,
        "x-kubernetes-patch-merge-key": key,
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": [key],
    }


STRING_MAP = {"type": "object", "additionalProperties": STR}
ATOMIC_STRINGS = {"type": "array", "items": STR, "x-kubernetes-list-type": "atomic"}
CONTAINER = obj(
    name=STR,
    image=STR,
    command=ATOMIC_STRINGS,
    ports=merge_list("containerPort", obj(containerPort=INT, protocol=STR, name=STR)),
    env=merge_list("name", obj(name=STR, value=STR)),
)
VOLUME = obj(name=STR, emptyDir=obj(medium=STR), configMap=obj(name=STR))
POD_SPEC = obj(
    containers=merge_list("name", CONTAINER),
    volumes=merge_list("name", VOLUME, "merge,retainKeys"),
    tolerations={
        "type": "array",
        "x-kubernetes-list-type": "atomic",
        "items": obj(key=STR, operator=STR, value=STR, effect=STR),
    },
    nodeSelector={**STRING_MAP, "x-kubernetes-map-type": "atomic"},
)
SCHEMA: dict[str, Any] = obj(
    apiVersion=STR,
    kind=STR,
    metadata=obj(
        name=STR,
        labels=STRING_MAP,
        annotations=STRING_MAP,
        finalizers={
            "type": "array",
            "items": STR,
            "x-kubernetes-patch-strategy": "merge",
            "x-kubernetes-list-type": "set",
        },
        ownerReferences=merge_list("uid", obj(uid=STR, kind=STR, name=STR)),
    ),
    spec=obj(
        replicas=INT,
        strategy={
            **obj(type=STR, rollingUpdate=obj(maxSurge={"x-kubernetes-int-or-string": True})),
            "x-kubernetes-patch-strategy": "retainKeys",
        },
        template=obj(metadata=obj(labels=STRING_MAP), spec=POD_SPEC),
    ),
    status=obj(replicas=INT, conditions=merge_list("type", obj(type=STR, status=STR, reason=STR))),
)


def smp(original: dict[str, Any], patch: Any) -> dict[str, Any]:
    return apply_strategic_merge_patch(original, patch, SCHEMA)


def pod_spec(**spec: Any) -> dict[str, Any]:
    return {"spec": {"template": {"spec": spec}}}


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = doc["spec"]["template"]["spec"]["containers"]
    return result


def names(items: list[dict[str, Any]]) -> list[str]:
    return [i["name"] for i in items]


# --- maps ----------------------------------------------------------------------------------


def test_maps_merge_recursively_and_null_deletes() -> None:
    doc = {"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"replicas": 1}}
    out = smp(doc, {"metadata": {"labels": {"b": None, "c": "3"}}, "spec": {"replicas": 2}})
    assert out == {"metadata": {"labels": {"a": "1", "c": "3"}}, "spec": {"replicas": 2}}


def test_patch_replace_in_a_map_replaces_it() -> None:
    doc = {"metadata": {"labels": {"a": "1", "b": "2"}}}
    out = smp(doc, {"metadata": {"labels": {"$patch": "replace", "c": "3"}}})
    assert out == {"metadata": {"labels": {"c": "3"}}}


def test_patch_delete_in_a_map_deletes_it() -> None:
    doc = {"metadata": {"labels": {"a": "1"}, "name": "x"}}
    assert smp(doc, {"metadata": {"labels": {"$patch": "delete"}}}) == {"metadata": {"name": "x"}}


def test_patch_merge_is_the_default() -> None:
    doc = {"metadata": {"labels": {"a": "1"}}}
    out = smp(doc, {"metadata": {"labels": {"$patch": "merge", "b": "2"}}})
    assert out == {"metadata": {"labels": {"a": "1", "b": "2"}}}


def test_unknown_patch_directive_is_a_bad_request() -> None:
    with pytest.raises(ApiError) as err:
        smp({}, {"metadata": {"$patch": "explode"}})
    assert err.value.code == 400
    assert "explode" in err.value.message


def test_atomic_map_type_still_merges_in_smp() -> None:
    doc = pod_spec(nodeSelector={"a": "1"})
    out = smp(doc, pod_spec(nodeSelector={"b": "2"}))
    assert out["spec"]["template"]["spec"]["nodeSelector"] == {"a": "1", "b": "2"}


# --- merge lists of maps -------------------------------------------------------------------


def test_containers_merge_by_name_and_new_ones_append() -> None:
    doc = pod_spec(
        containers=[
            {"name": "a", "image": "a:1", "ports": [{"containerPort": 80}]},
            {"name": "b", "image": "b:1"},
        ]
    )
    out = smp(doc, pod_spec(containers=[{"name": "a", "image": "a:2"}, {"name": "c"}]))
    assert containers(out) == [
        {"name": "b", "image": "b:1"},
        {"name": "a", "image": "a:2", "ports": [{"containerPort": 80}]},
        {"name": "c"},
    ]


def test_element_delete_directive_removes_every_match() -> None:
    doc = pod_spec(containers=[{"name": "a"}, {"name": "b"}, {"name": "a", "image": "dup"}])
    out = smp(doc, pod_spec(containers=[{"name": "a", "$patch": "delete"}]))
    assert containers(out) == [{"name": "b"}]


def test_element_replace_directive_replaces_the_whole_list() -> None:
    doc = pod_spec(containers=[{"name": "a", "image": "x"}, {"name": "b"}])
    out = smp(doc, pod_spec(containers=[{"$patch": "replace"}, {"name": "c", "image": "y"}]))
    assert containers(out) == [{"name": "c", "image": "y"}]


def test_element_without_merge_key_is_a_bad_request() -> None:
    doc = pod_spec(containers=[{"name": "a"}])
    with pytest.raises(ApiError) as err:
        smp(doc, pod_spec(containers=[{"image": "x"}]))
    assert err.value.code == 400
    assert "merge key: name" in err.value.message


def test_nested_merge_lists_merge_too() -> None:
    doc = pod_spec(
        containers=[
            {"name": "a", "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}]}
        ]
    )
    out = smp(doc, pod_spec(containers=[{"name": "a", "env": [{"name": "Y", "value": "3"}]}]))
    assert containers(out)[0]["env"] == [{"name": "X", "value": "1"}, {"name": "Y", "value": "3"}]


def test_owner_references_merge_by_uid_and_conditions_by_type() -> None:
    doc = {
        "metadata": {"ownerReferences": [{"uid": "1", "name": "a"}]},
        "status": {"conditions": [{"type": "Ready", "status": "False"}]},
    }
    out = smp(
        doc,
        {
            "metadata": {"ownerReferences": [{"uid": "2", "name": "b"}]},
            "status": {
                "conditions": [
                    {"type": "Ready", "status": "True"},
                    {"type": "Available", "status": "True"},
                ]
            },
        },
    )
    assert out["metadata"]["ownerReferences"] == [
        {"uid": "1", "name": "a"},
        {"uid": "2", "name": "b"},
    ]
    assert out["status"]["conditions"] == [
        {"type": "Ready", "status": "True"},
        {"type": "Available", "status": "True"},
    ]


# --- primitive lists and lists without a strategy -----------------------------------------


def test_finalizers_are_a_set_union_with_delete_from_primitive_list() -> None:
    doc = {"metadata": {"finalizers": ["a", "b"]}}
    out = smp(
        doc, {"metadata": {"finalizers": ["c", "a"], "$deleteFromPrimitiveList/finalizers": ["b"]}}
    )
    assert out["metadata"]["finalizers"] == ["c", "a"]
    out = smp(doc, {"metadata": {"finalizers": ["b", "c", "c"]}})
    assert out["metadata"]["finalizers"] == ["a", "b", "c"]


def test_lists_without_strategy_are_replaced() -> None:
    doc = pod_spec(
        containers=[{"name": "a", "command": ["x", "y"]}],
        tolerations=[{"key": "k1"}, {"key": "k2"}],
    )
    out = smp(
        doc,
        pod_spec(containers=[{"name": "a", "command": ["z"]}], tolerations=[{"key": "k3"}]),
    )
    assert containers(out)[0]["command"] == ["z"]
    assert out["spec"]["template"]["spec"]["tolerations"] == [{"key": "k3"}]


def test_unknown_fields_merge_maps_and_replace_lists() -> None:
    doc = {"spec": {"extra": {"a": [1, 2], "b": {"c": 1}}}}
    out = smp(doc, {"spec": {"extra": {"a": [3], "b": {"d": 2}}}})
    assert out == {"spec": {"extra": {"a": [3], "b": {"c": 1, "d": 2}}}}


# --- $setElementOrder ----------------------------------------------------------------------


def test_set_element_order_puts_unlisted_live_items_first() -> None:
    doc = pod_spec(containers=[{"name": "a"}, {"name": "x"}, {"name": "b"}, {"name": "y"}])
    patch = pod_spec(
        **{
            "$setElementOrder/containers": [{"name": "b"}, {"name": "ghost"}, {"name": "a"}],
            "containers": [{"name": "b", "image": "new"}],
        }
    )
    out = smp(doc, patch)
    assert names(containers(out)) == ["x", "y", "b", "a"]
    assert containers(out)[2] == {"name": "b", "image": "new"}


def test_set_element_order_alone_reorders() -> None:
    doc = {"metadata": {"finalizers": ["a", "b", "c"]}}
    out = smp(doc, {"metadata": {"$setElementOrder/finalizers": ["c", "a", "b"]}})
    assert out["metadata"]["finalizers"] == ["c", "a", "b"]


def test_set_element_order_rejects_contradicting_patch_order() -> None:
    doc = pod_spec(containers=[{"name": "a"}, {"name": "b"}])
    patch = pod_spec(
        **{
            "$setElementOrder/containers": [{"name": "a"}, {"name": "b"}],
            "containers": [{"name": "b"}, {"name": "a"}],
        }
    )
    with pytest.raises(ApiError) as err:
        smp(doc, patch)
    assert err.value.code == 400
    assert "contradicts" in err.value.message


def test_set_element_order_rejects_patch_items_not_in_it() -> None:
    doc = pod_spec(containers=[{"name": "a"}])
    patch = pod_spec(
        **{"$setElementOrder/containers": [{"name": "a"}], "containers": [{"name": "c"}]}
    )
    with pytest.raises(ApiError) as err:
        smp(doc, patch)
    assert err.value.code == 400


# --- $retainKeys ---------------------------------------------------------------------------


def test_retain_keys_clears_unlisted_fields() -> None:
    doc = {"spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}}}
    out = smp(doc, {"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}})
    assert out == {"spec": {"strategy": {"type": "Recreate"}}}


def test_retain_keys_must_list_the_patched_fields() -> None:
    with pytest.raises(ApiError) as err:
        smp({}, {"spec": {"strategy": {"$retainKeys": ["type"], "rollingUpdate": {}}}})
    assert err.value.code == 400
    assert "rollingUpdate" in err.value.message


def test_volumes_retain_keys_per_element() -> None:
    doc = pod_spec(volumes=[{"name": "v", "emptyDir": {}}, {"name": "w", "emptyDir": {}}])
    patch = pod_spec(
        volumes=[{"name": "v", "configMap": {"name": "cm"}, "$retainKeys": ["configMap", "name"]}]
    )
    out = smp(doc, patch)
    assert out["spec"]["template"]["spec"]["volumes"] == [
        {"name": "w", "emptyDir": {}},
        {"name": "v", "configMap": {"name": "cm"}},
    ]


# --- kubectl's patches ---------------------------------------------------------------------


LIVE = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "nginx", "annotations": {"deployment.kubernetes.io/revision": "1"}},
    "spec": {
        "replicas": 2,
        "template": {
            "metadata": {"labels": {"app": "nginx"}},
            "spec": {
                "containers": [
                    {"name": "nginx", "image": "nginx:1.25", "ports": [{"containerPort": 80}]},
                    {"name": "sidecar", "image": "envoy"},
                ]
            },
        },
    },
    "status": {"replicas": 2},
}


def test_kubectl_client_side_apply_patch_keeps_ports() -> None:
    patch = {
        "metadata": {"annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}\n"}},
        "spec": {
            "replicas": 3,
            "template": {
                "spec": {
                    "$setElementOrder/containers": [{"name": "nginx"}],
                    "containers": [{"image": "nginx:1.26", "name": "nginx"}],
                }
            },
        },
    }
    out = smp(LIVE, patch)
    assert containers(out)[1] == {
        "name": "nginx",
        "image": "nginx:1.26",
        "ports": [{"containerPort": 80}],
    }
    assert names(containers(out)) == ["sidecar", "nginx"]
    assert out["spec"]["replicas"] == 3


def test_three_way_deletes_what_the_manifest_dropped_and_keeps_live_only_fields() -> None:
    last: dict[str, Any] = {
        "metadata": {"name": "nginx", "labels": {"team": "a", "old": "x"}},
        "spec": {
            "replicas": 2,
            "template": {
                "spec": {
                    "containers": [
                        {"name": "nginx", "image": "nginx:1.25", "command": ["a"]},
                        {"name": "gone", "image": "busybox"},
                    ]
                }
            },
        },
    }
    current: dict[str, Any] = copy.deepcopy(last)
    current["metadata"]["labels"]["added-by-controller"] = "y"
    current["spec"]["template"]["spec"]["containers"].append({"name": "injected", "image": "i"})
    current["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = "Always"
    current["status"] = {"replicas": 2}
    modified = {
        "metadata": {"name": "nginx", "labels": {"team": "b"}},
        "spec": {
            "template": {"spec": {"containers": [{"name": "nginx", "image": "nginx:1.26"}]}},
        },
    }
    patch = create_three_way_merge_patch(last, modified, current, SCHEMA)
    out = smp(current, patch)
    assert out["metadata"]["labels"] == {"team": "b", "added-by-controller": "y"}
    assert "replicas" not in out["spec"]
    assert out["status"] == {"replicas": 2}
    assert containers(out) == [
        {"name": "injected", "image": "i"},
        {"name": "nginx", "image": "nginx:1.26", "imagePullPolicy": "Always"},
    ]
    # Nothing left to do: the same apply again is empty.
    assert create_three_way_merge_patch(modified, modified, out, SCHEMA) == {}


def test_three_way_primitive_list_keeps_live_only_values() -> None:
    last = {"metadata": {"finalizers": ["a", "b"]}}
    current = {"metadata": {"finalizers": ["a", "b", "server"]}}
    modified = {"metadata": {"finalizers": ["a", "c"]}}
    out = smp(current, create_three_way_merge_patch(last, modified, current, SCHEMA))
    assert out["metadata"]["finalizers"] == ["server", "a", "c"]


def test_two_way_patch_looks_like_kubectls() -> None:
    modified = copy.deepcopy(LIVE)
    containers(modified)[0]["image"] = "nginx:1.26"
    patch = create_two_way_merge_patch(LIVE, modified, SCHEMA)
    assert patch == {
        "spec": {
            "template": {
                "spec": {
                    "$setElementOrder/containers": [{"name": "nginx"}, {"name": "sidecar"}],
                    "containers": [{"image": "nginx:1.26", "name": "nginx"}],
                }
            }
        }
    }
    assert create_two_way_merge_patch(LIVE, LIVE, SCHEMA) == {}


def test_two_way_retain_keys() -> None:
    original = {"spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}}}
    modified = {"spec": {"strategy": {"type": "Recreate"}}}
    patch = create_two_way_merge_patch(original, modified, SCHEMA)
    assert patch["spec"]["strategy"]["$retainKeys"] == ["type"]
    assert smp(original, patch) == modified


def test_non_object_patch_is_a_bad_request() -> None:
    with pytest.raises(ApiError) as err:
        smp({}, [1, 2])
    assert err.value.code == 400


def test_deep_nesting_is_a_bad_request() -> None:
    deep: Any = {}
    for _ in range(5000):
        deep = {"a": deep}
    with pytest.raises(ApiError):
        smp({}, deep)


# --- properties ----------------------------------------------------------------------------


def from_schema(schema: dict[str, Any] | None, depth: int = 0) -> st.SearchStrategy[Any]:
    """Documents that conform to `schema` (null-free, keyed lists with unique keys)."""
    if schema is None or depth > 20:
        return st.sampled_from(["p", "q"])
    if schema.get("x-kubernetes-int-or-string"):
        return st.one_of(st.integers(0, 3), st.sampled_from(["25%", "1"]))
    kind = schema.get("type")
    if kind == "string":
        return st.sampled_from(["a", "b", "c"])
    if kind == "integer":
        return st.integers(0, 3)
    if kind == "array":
        items = from_schema(schema.get("items"), depth + 1)
        key = schema.get("x-kubernetes-patch-merge-key")
        if key:
            key_schema = schema["items"]["properties"][key]
            keyed = st.builds(lambda d, k: {**d, key: k}, items, from_schema(key_schema, depth))
            return st.lists(keyed, max_size=3, unique_by=lambda e: json.dumps(e[key]))
        is_set = schema.get("x-kubernetes-list-type") == "set"
        if schema.get("x-kubernetes-patch-strategy") or is_set:
            return st.lists(items, max_size=4, unique=True)
        return st.lists(items, max_size=3)
    if "properties" in schema:
        props = {k: from_schema(v, depth + 1) for k, v in schema["properties"].items()}
        return st.fixed_dictionaries({}, optional=props)
    if "additionalProperties" in schema:
        return st.dictionaries(
            st.sampled_from(["x", "y", "z"]),
            from_schema(schema["additionalProperties"], depth + 1),
            max_size=3,
        )
    return st.sampled_from(["p", "q"])


DOCS = from_schema(SCHEMA)

JUNK_KEYS = st.sampled_from(
    [
        "$patch",
        "$retainKeys",
        "$setElementOrder/containers",
        "$setElementOrder/finalizers",
        "$deleteFromPrimitiveList/finalizers",
        "$deleteFromPrimitiveList/containers",
        "containers",
        "finalizers",
        "metadata",
        "spec",
        "template",
        "name",
        "strategy",
        "volumes",
        "x",
    ]
)
JUNK_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 2),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["replace", "delete", "merge", "a", "name", ""]),
)
JUNK = st.recursive(
    JUNK_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(JUNK_KEYS, inner, max_size=5),
    max_leaves=30,
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(original=DOCS, modified=DOCS)
def test_two_way_roundtrip(original: dict[str, Any], modified: dict[str, Any]) -> None:
    before = (copy.deepcopy(original), copy.deepcopy(modified))
    patch = create_two_way_merge_patch(original, modified, SCHEMA)
    assert smp(original, patch) == modified
    assert (original, modified) == before
    assert create_two_way_merge_patch(original, original, SCHEMA) == {}


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(last=DOCS, modified=DOCS, current=DOCS)
def test_three_way_sets_every_manifest_field(
    last: dict[str, Any], modified: dict[str, Any], current: dict[str, Any]
) -> None:
    patch = create_three_way_merge_patch(last, modified, current, SCHEMA)
    out = smp(current, patch)
    # Scalars the manifest sets end up set as in the manifest.
    for key in ("replicas",):
        if key in modified.get("spec", {}):
            assert out["spec"][key] == modified["spec"][key]
    # With last-applied == current it is the two-way patch.
    assert smp(current, create_three_way_merge_patch(current, modified, current, SCHEMA)) == (
        modified
    )


@settings(max_examples=200)
@given(doc=DOCS)
def test_empty_patch_is_identity(doc: dict[str, Any]) -> None:
    assert smp(doc, {}) == doc


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(doc=DOCS, patch=JUNK)
def test_junk_patches_raise_only_api_errors(doc: dict[str, Any], patch: Any) -> None:
    before = copy.deepcopy(doc), copy.deepcopy(patch)
    code = 0
    try:
        first = smp(doc, patch)
    except ApiError as err:
        code = err.code
    else:
        assert smp(doc, patch) == first  # deterministic
        json.dumps(first)
    assert code in (0, 400)
    assert (doc, patch) == before


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(a=JUNK, b=JUNK, c=JUNK)
def test_diffing_junk_raises_only_api_errors(a: Any, b: Any, c: Any) -> None:
    docs = [x if isinstance(x, dict) else {"x": x} for x in (a, b, c)]
    try:
        patch = create_three_way_merge_patch(docs[0], docs[1], docs[2], SCHEMA)
        smp(docs[2], patch)
    except ApiError:
        pass
