"""Field sets (FieldsV1) and server-side apply / managedFields tracking."""

from __future__ import annotations

import contextlib
import copy
import gc
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.kube.errors import ApiError
from orchestrator.kube.patch import (
    decode_fields_v1,
    encode_fields_v1,
    fieldset_of,
    path_string,
    server_side_apply,
    track_update,
)
from orchestrator.kube.patch.managedfields import _tree_has

STR: dict[str, Any] = {"type": "string"}
INT: dict[str, Any] = {"type": "integer"}


def obj(**props: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props}


def keyed(items: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {
        "type": "array",
        "items": items,
        "x-kubernetes-patch-strategy": "merge",
        "x-kubernetes-patch-merge-key": keys[0],
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": list(keys),
    }


STRING_MAP = {"type": "object", "additionalProperties": STR}
PORT = obj(containerPort=INT, protocol={"type": "string", "default": "TCP"}, name=STR)
CONTAINER = obj(
    name=STR,
    image=STR,
    args={"type": "array", "items": STR, "x-kubernetes-list-type": "atomic"},
    ports=keyed(PORT, "containerPort", "protocol"),
    env={  # merge key only, no list-type: still keyed by name
        "type": "array",
        "items": obj(name=STR, value=STR),
        "x-kubernetes-patch-strategy": "merge",
        "x-kubernetes-patch-merge-key": "name",
    },
)
SCHEMA: dict[str, Any] = obj(
    apiVersion=STR,
    kind=STR,
    metadata=obj(
        name=STR,
        namespace=STR,
        resourceVersion=STR,
        labels=STRING_MAP,
        annotations=STRING_MAP,
        finalizers={"type": "array", "items": STR, "x-kubernetes-list-type": "set"},
        managedFields={"type": "array", "items": {"type": "object"}},
    ),
    spec=obj(
        replicas=INT,
        selector={**obj(matchLabels=STRING_MAP), "x-kubernetes-map-type": "atomic"},
        template=obj(
            metadata=obj(labels=STRING_MAP), spec=obj(containers=keyed(CONTAINER, "name"))
        ),
    ),
    status=obj(replicas=INT, conditions=keyed(obj(type=STR, status=STR), "type")),
)

T0, T1, T2 = "2025-01-01T00:00:00Z", "2025-01-01T00:01:00Z", "2025-01-01T00:02:00Z"


def deployment(replicas: int = 2, image: str = "nginx:1.25", **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "nginx", "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "template": {"spec": {"containers": [{"name": "nginx", "image": image}]}},
            **extra,
        },
    }


def apply(
    live: dict[str, Any] | None,
    config: dict[str, Any],
    manager: str = "kubectl",
    now: str = T0,
    force: bool = False,
    **kw: Any,
) -> dict[str, Any]:
    return server_side_apply(
        live,
        config,
        manager=manager,
        schema=SCHEMA,
        force=force,
        api_version="apps/v1",
        now=now,
        **kw,
    )


def update(
    old: dict[str, Any] | None, new: dict[str, Any], manager: str, now: str = T0, **kw: Any
) -> dict[str, Any]:
    return track_update(
        old, new, manager=manager, schema=SCHEMA, api_version="apps/v1", now=now, **kw
    )


def managers(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["manager"]: e for e in doc["metadata"].get("managedFields", [])}


def fields_of(doc: dict[str, Any], manager: str) -> set[str]:
    entry = managers(doc)[manager]
    return {path_string(p) for p in decode_fields_v1(entry["fieldsV1"])}


# --- field sets ----------------------------------------------------------------------------


def test_fields_v1_matches_kubernetes() -> None:
    out = apply(None, deployment())
    assert out["metadata"]["managedFields"] == [
        {
            "manager": "kubectl",
            "operation": "Apply",
            "apiVersion": "apps/v1",
            "time": T0,
            "fieldsType": "FieldsV1",
            "fieldsV1": {
                "f:spec": {
                    "f:replicas": {},
                    "f:template": {
                        "f:spec": {
                            "f:containers": {
                                'k:{"name":"nginx"}': {".": {}, "f:image": {}, "f:name": {}}
                            }
                        }
                    },
                }
            },
        }
    ]


def test_list_map_keys_sets_atomic_maps_and_path_strings() -> None:
    doc = {
        "metadata": {"labels": {"app": "x"}, "finalizers": ["a/b"]},
        "spec": {
            "selector": {"matchLabels": {"app": "x"}},
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "c",
                            "args": ["-v"],
                            "ports": [{"containerPort": 80}],
                            "env": [{"name": "E", "value": "1"}],
                        }
                    ]
                }
            },
        },
    }
    paths = {path_string(p) for p in fieldset_of(doc, SCHEMA)}
    container = '.spec.template.spec.containers[name="c"]'
    assert paths == {
        ".metadata.labels.app",
        '.metadata.finalizers[="a/b"]',
        ".spec.selector",
        container,
        container + ".name",
        container + ".args",
        container + '.ports[containerPort=80,protocol="TCP"]',
        container + '.ports[containerPort=80,protocol="TCP"].containerPort',
        container + '.env[name="E"]',
        container + '.env[name="E"].name',
        container + '.env[name="E"].value',
    }
    tree = encode_fields_v1(fieldset_of(doc, SCHEMA))
    ports = tree["f:spec"]["f:template"]["f:spec"]["f:containers"]['k:{"name":"c"}']["f:ports"]
    assert ports == {'k:{"containerPort":80,"protocol":"TCP"}': {".": {}, "f:containerPort": {}}}


def test_decode_accepts_non_canonical_keys_and_rejects_junk() -> None:
    fields = decode_fields_v1({"f:spec": {"f:c": {'k:{"b": 1, "a": 2}': {".": {}}}}})
    assert fields == {("f:spec", "f:c", 'k:{"a":2,"b":1}')}
    junk: Any
    for junk in ([], {"x:y": {}}, {"f:a": 1}, {"k:nope": {}}, {"i:x": {}}):
        with pytest.raises(ApiError) as err:
            decode_fields_v1(junk)
        assert err.value.code == 400


def test_decoding_leaves_no_cyclic_garbage() -> None:
    """Every stored write decodes field sets: garbage only the cyclic collector frees (a
    recursive closure is a cycle) would pile up between its passes, which cost the loop."""
    tree = {"f:spec": {"f:c": {'k:{"a":1}': {".": {}, "f:x": {}}}}, "f:metadata": {"f:l": {}}}
    gc.collect()
    gc.disable()
    try:
        for canonical in (False, True):
            assert decode_fields_v1(tree, canonical=canonical)
        assert gc.collect() == 0
    finally:
        gc.enable()


JSONISH = st.recursive(
    st.none() | st.integers(0, 2) | st.sampled_from(["a", "b"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["name", "image", "spec", "x"]), inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=300)
@given(doc=st.dictionaries(st.sampled_from(["metadata", "spec", "status", "x"]), JSONISH))
def test_fields_v1_roundtrip(doc: dict[str, Any]) -> None:
    fields = fieldset_of(doc, SCHEMA)
    assert decode_fields_v1(encode_fields_v1(fields)) == fields


def _reference_tree(fields: frozenset[tuple[str, ...]]) -> dict[str, Any]:
    """FieldsV1 the obvious way: a nested map of the paths, then every node's keys sorted,
    `"."` first in a member that has members under it."""
    raw: dict[str, Any] = {}
    for path in fields:
        node = raw
        for element in path:
            node = node.setdefault(element, {})

    def finish(node: dict[str, Any], prefix: tuple[str, ...]) -> dict[str, Any]:
        out: dict[str, Any] = {".": {}} if node and prefix in fields else {}
        for element in sorted(node):
            out[element] = finish(node[element], (*prefix, element))
        return out

    return finish(raw, ())


@settings(max_examples=500)
@given(
    st.frozensets(
        st.lists(st.sampled_from(["f:a", "f:b", "f:c", 'k:{"x":1}', "i:0", "v:1"]), min_size=1).map(
            tuple
        ),
        max_size=10,
    )
)
def test_fields_v1_keys_come_sorted_with_the_member_marker_first(
    fields: frozenset[tuple[str, ...]],
) -> None:
    # Key order matters: the stored JSON (and what kubectl shows) is byte for byte Kubernetes'.
    got = encode_fields_v1(fields)
    assert json.dumps(got) == json.dumps(_reference_tree(fields))


# --- server-side apply ---------------------------------------------------------------------


def test_apply_twice_is_idempotent() -> None:
    first = apply(None, deployment())
    second = apply(first, deployment(), now=T1)
    assert second == first
    assert second is not first


def test_changed_apply_moves_time_forward() -> None:
    first = apply(None, deployment())
    second = apply(first, deployment(replicas=3), now=T1)
    assert second["spec"]["replicas"] == 3
    assert managers(second)["kubectl"]["time"] == T1


def test_two_managers_share_a_field_with_the_same_value() -> None:
    first = apply(None, deployment())
    second = apply(first, deployment(), manager="other", now=T1)
    assert fields_of(second, "kubectl") == fields_of(second, "other")
    assert ".spec.replicas" in fields_of(second, "other")


def test_conflict_with_an_update_manager() -> None:
    created = update(None, deployment(), "kubectl-client-side-apply")
    with pytest.raises(ApiError) as err:
        apply(created, deployment(replicas=3))
    assert err.value.code == 409
    assert err.value.reason == "Conflict"
    assert err.value.message == (
        'Apply failed with 1 conflict: conflict with "kubectl-client-side-apply" using apps/v1: '
        ".spec.replicas"
    )
    assert err.value.details == {
        "causes": [
            {
                "reason": "FieldManagerConflict",
                "message": 'conflict with "kubectl-client-side-apply" using apps/v1',
                "field": ".spec.replicas",
            }
        ]
    }


def test_several_conflicts() -> None:
    created = apply(None, deployment(), manager="a")
    with pytest.raises(ApiError) as err:
        apply(created, deployment(replicas=3, image="nginx:2"), manager="b")
    assert err.value.message == (
        'Apply failed with 2 conflicts: conflicts with "a":\n'
        "- .spec.replicas\n"
        '- .spec.template.spec.containers[name="nginx"].image'
    )
    assert len(err.value.details["causes"]) == 2


def test_force_takes_ownership() -> None:
    created = update(None, deployment(), "kubectl-client-side-apply")
    out = apply(created, deployment(replicas=3), force=True, now=T1)
    assert out["spec"]["replicas"] == 3
    assert ".spec.replicas" in fields_of(out, "kubectl")
    assert ".spec.replicas" not in fields_of(out, "kubectl-client-side-apply")
    # The old owner keeps what it still shares.
    assert '.spec.template.spec.containers[name="nginx"].image' in fields_of(
        out, "kubectl-client-side-apply"
    )


def test_a_field_the_manager_stops_applying_is_removed() -> None:
    first = apply(None, deployment(extra="x"))
    config = deployment()
    del config["spec"]["replicas"]
    out = apply(first, config, now=T1)
    assert "replicas" not in out["spec"]
    assert ".spec.replicas" not in fields_of(out, "kubectl")


def test_a_field_another_manager_also_owns_stays() -> None:
    first = apply(None, deployment())
    shared = apply(first, {"spec": {"replicas": 2}}, manager="hpa", now=T1)
    config = deployment()
    del config["spec"]["replicas"]
    out = apply(shared, config, now=T2)
    assert out["spec"]["replicas"] == 2
    assert fields_of(out, "hpa") == {".spec.replicas"}


def test_containers_merge_by_name_across_managers() -> None:
    a = apply(None, deployment())
    sidecar = {
        "spec": {"template": {"spec": {"containers": [{"name": "envoy", "image": "envoy:1"}]}}}
    }
    b = apply(a, sidecar, manager="mesh", now=T1)
    assert [c["name"] for c in b["spec"]["template"]["spec"]["containers"]] == ["nginx", "envoy"]
    # The first manager changes its container's image: the sidecar survives.
    c = apply(b, deployment(image="nginx:1.26"), now=T2)
    assert c["spec"]["template"]["spec"]["containers"] == [
        {"name": "nginx", "image": "nginx:1.26"},
        {"name": "envoy", "image": "envoy:1"},
    ]
    # The mesh stops applying its sidecar: only the sidecar goes.
    d = apply(c, {"spec": {"template": {"spec": {"containers": []}}}}, manager="mesh", now=T2)
    assert d["spec"]["template"]["spec"]["containers"] == [{"name": "nginx", "image": "nginx:1.26"}]
    assert "mesh" not in managers(d)


def test_item_with_fields_owned_by_others_keeps_its_key() -> None:
    a = apply(None, deployment())
    b = apply(
        a,
        {"spec": {"template": {"spec": {"containers": [{"name": "nginx", "args": ["-x"]}]}}}},
        manager="other",
        now=T1,
    )
    config = deployment()
    config["spec"]["template"]["spec"]["containers"] = []
    out = apply(b, config, now=T2)
    assert out["spec"]["template"]["spec"]["containers"] == [{"name": "nginx", "args": ["-x"]}]


def test_kubectl_last_applied_follow_up_does_not_wipe_spec() -> None:
    first = apply(None, deployment())
    annotation = {"kubectl.kubernetes.io/last-applied-configuration": "{}"}
    follow_up = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "nginx", "namespace": "default", "annotations": annotation},
    }
    out = apply(first, follow_up, manager="kubectl-last-applied", now=T1)
    assert out["spec"] == first["spec"]
    assert out["metadata"]["annotations"] == annotation
    assert fields_of(out, "kubectl-last-applied") == {
        ".metadata.annotations.kubectl.kubernetes.io/last-applied-configuration"
    }


def test_apply_ignores_status_and_server_metadata() -> None:
    live = update(None, {**deployment(), "status": {"replicas": 1}}, "controller")
    config = {**deployment(replicas=2), "status": {"replicas": 9}}
    config["metadata"] = {**config["metadata"], "resourceVersion": "5"}
    out = apply(live, config, force=False)
    assert out["status"] == {"replicas": 1}
    assert not any("status" in f or "resourceVersion" in f for f in fields_of(out, "kubectl"))


def test_apply_to_status_subresource() -> None:
    live = apply(None, deployment())
    out = apply(
        live,
        {**deployment(replicas=5), "status": {"conditions": [{"type": "Ready", "status": "True"}]}},
        manager="controller",
        subresource="status",
        now=T1,
    )
    assert out["spec"]["replicas"] == 2
    assert out["status"] == {"conditions": [{"type": "Ready", "status": "True"}]}
    entry = managers(out)["controller"]
    assert entry["subresource"] == "status"
    assert fields_of(out, "controller") == {
        '.status.conditions[type="Ready"]',
        '.status.conditions[type="Ready"].status',
        '.status.conditions[type="Ready"].type',
    }


def test_managed_fields_in_the_config_are_rejected() -> None:
    config = deployment()
    config["metadata"]["managedFields"] = [{"manager": "x"}]
    with pytest.raises(ApiError) as err:
        apply(None, config)
    assert err.value.code == 400


def test_duplicate_and_keyless_items_are_invalid() -> None:
    config = deployment()
    config["spec"]["template"]["spec"]["containers"] = [{"name": "a"}, {"name": "a"}]
    with pytest.raises(ApiError) as err:
        apply(None, config)
    assert err.value.code == 422
    config["spec"]["template"]["spec"]["containers"] = [{"image": "a"}]
    with pytest.raises(ApiError) as err:
        apply(None, config)
    assert err.value.code == 422


def test_objects_without_managed_fields_belong_to_before_first_apply() -> None:
    with pytest.raises(ApiError) as err:
        apply(deployment(), deployment(replicas=4))
    assert '"before-first-apply" using apps/v1' in err.value.message


# --- updates -------------------------------------------------------------------------------


def test_create_owns_every_field() -> None:
    out = update(None, deployment(), "kubectl-create")
    assert managers(out)["kubectl-create"]["operation"] == "Update"
    assert fields_of(out, "kubectl-create") == {
        ".spec.replicas",
        '.spec.template.spec.containers[name="nginx"]',
        '.spec.template.spec.containers[name="nginx"].name',
        '.spec.template.spec.containers[name="nginx"].image',
    }


def test_update_moves_changed_fields_and_drops_empty_entries() -> None:
    created = update(None, {"spec": {"replicas": 1}}, "creator")
    scaled = copy.deepcopy(created)
    scaled["spec"]["replicas"] = 3
    out = update(created, scaled, "scaler", now=T1)
    assert set(managers(out)) == {"scaler"}
    assert managers(out)["scaler"]["time"] == T1


def test_update_without_changes_keeps_time_and_adds_nothing() -> None:
    created = update(None, deployment(), "creator")
    again = update(created, copy.deepcopy(created), "creator", now=T1)
    assert again == created
    other = update(created, copy.deepcopy(created), "someone", now=T1)
    assert other == created


def test_update_removing_a_field_removes_it_from_every_set() -> None:
    a = apply(None, deployment())
    edited = copy.deepcopy(a)
    del edited["spec"]["replicas"]
    out = update(a, edited, "kubectl-edit", now=T1)
    assert ".spec.replicas" not in fields_of(out, "kubectl")
    assert "kubectl-edit" not in managers(out)


def test_update_with_client_sent_managed_fields_starts_from_them() -> None:
    a = apply(None, deployment())
    migrated = copy.deepcopy(a)
    migrated["metadata"]["managedFields"][0]["manager"] = "renamed"
    out = update(a, migrated, "kubectl-patch", now=T1)
    assert set(managers(out)) == {"renamed"}


def test_single_empty_entry_clears_managed_fields() -> None:
    a = apply(None, deployment())
    cleared = copy.deepcopy(a)
    cleared["metadata"]["managedFields"] = [{}]
    out = update(a, cleared, "kubectl-patch", now=T1)
    assert "managedFields" not in out["metadata"]


def test_status_updates_track_only_status() -> None:
    a = apply(None, deployment())
    new = copy.deepcopy(a)
    new["status"] = {"replicas": 2}
    new["spec"]["replicas"] = 7
    out = update(a, new, "controller", now=T1, subresource="status")
    assert fields_of(out, "controller") == {".status.replicas"}
    assert managers(out)["controller"]["subresource"] == "status"
    assert ".spec.replicas" in fields_of(out, "kubectl")


def test_entries_an_update_leaves_alone_are_written_back_as_stored() -> None:
    """A status write neither decodes nor re-encodes the spec owner's entry: with copy=False
    (the caller gives up both objects) its stored tree goes into the result as it is; with the
    default copy the result shares nothing with `old`. Both give the same managedFields."""
    a = apply(None, deployment())
    new = copy.deepcopy(a)
    new["status"] = {"replicas": 2}
    kept = managers(a)["kubectl"]["fieldsV1"]
    shared = update(a, new, "controller", now=T1, subresource="status", copy=False)
    copied = update(a, copy.deepcopy(new), "controller", now=T1, subresource="status")
    assert shared["metadata"]["managedFields"] == copied["metadata"]["managedFields"]
    assert managers(shared)["kubectl"]["fieldsV1"] is kept
    assert managers(copied)["kubectl"]["fieldsV1"] is not kept
    assert fields_of(shared, "controller") == {".status.replicas"}
    # An update that takes fields from the stored entry re-encodes it.
    new2 = copy.deepcopy(shared)
    new2["spec"]["replicas"] = 9
    out = update(shared, new2, "scaler", now=T1, copy=False)
    assert ".spec.replicas" not in fields_of(out, "kubectl")
    assert fields_of(out, "scaler") == {".spec.replicas"}


@settings(max_examples=200)
@given(
    st.sets(
        st.lists(
            st.sampled_from(["f:a", "f:b", 'k:{"name":"x"}', "i:0"]), min_size=1, max_size=3
        ).map(tuple),
        max_size=8,
    ),
    st.lists(
        st.sampled_from(["f:a", "f:b", 'k:{"name":"x"}', "i:0", "f:c"]), min_size=1, max_size=4
    ),
)
def test_membership_read_from_the_tree_matches_decoding(
    fields: set[tuple[str, ...]], probe: list[str]
) -> None:
    tree = encode_fields_v1(frozenset(fields))
    decoded = decode_fields_v1(tree)
    for path in [*fields, tuple(probe), *(p[:-1] for p in fields if len(p) > 1)]:
        assert _tree_has(tree, path) == (path in decoded)


# --- properties ----------------------------------------------------------------------------

CONFIGS = st.builds(
    lambda replicas, image, labels, sidecar: {
        "metadata": {"labels": labels},
        "spec": {
            **({"replicas": replicas} if replicas is not None else {}),
            "template": {
                "spec": {
                    "containers": [{"name": "nginx", "image": image}]
                    + ([{"name": "side", "image": image}] if sidecar else [])
                }
            },
        },
    },
    st.none() | st.integers(1, 3),
    st.sampled_from(["a", "b"]),
    st.dictionaries(st.sampled_from(["x", "y"]), st.sampled_from(["1", "2"]), max_size=2),
    st.booleans(),
)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["a", "b"]), CONFIGS, st.booleans()), min_size=1, max_size=4
    )
)
def test_apply_sequences_are_idempotent_and_pure(
    steps: list[tuple[str, dict[str, Any], bool]],
) -> None:
    live: dict[str, Any] | None = None
    for number, (manager, config, force) in enumerate(steps):
        before = copy.deepcopy((live, config))
        now = f"2025-01-01T00:00:{number:02d}Z"
        try:
            out = apply(live, config, manager=manager, force=force, now=now)
        except ApiError as err:
            assert err.code == 409  # noqa: PT017 - checking a Hypothesis example
            continue
        assert (live, config) == before
        assert apply(out, config, manager=manager, force=force, now="2099-01-01T00:00:00Z") == out
        live = out


JUNK_KEYS = ["metadata", "spec", "managedFields", "fieldsV1", "operation", "f:spec", "."]
JUNK_KEYS += ["name", "template", "containers", "status", "k:{}", "replicas"]
JUNK = st.recursive(
    st.none() | st.booleans() | st.integers(-1, 1) | st.sampled_from(["a", "Apply", "f:x", "."]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(JUNK_KEYS),
            inner,
            max_size=4,
        )
    ),
    max_leaves=25,
)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(live=JUNK, config=JUNK, force=st.booleans())
def test_junk_raises_only_api_errors(live: Any, config: Any, force: bool) -> None:
    live_obj = live if isinstance(live, dict) else None
    with contextlib.suppress(ApiError):
        apply(live_obj, config, force=force)
    with contextlib.suppress(ApiError):
        update(live_obj, config, "m")


def test_set_lists_are_owned_value_by_value() -> None:
    a = apply(None, {"metadata": {"name": "x", "finalizers": ["a/one"]}}, manager="a")
    b = apply(a, {"metadata": {"finalizers": ["b/two"]}}, manager="b", now=T1)
    assert b["metadata"]["finalizers"] == ["a/one", "b/two"]
    assert fields_of(b, "b") == {'.metadata.finalizers[="b/two"]'}
    c = apply(b, {"metadata": {"name": "x"}}, manager="a", now=T2)
    assert c["metadata"]["finalizers"] == ["b/two"]


DOCS = st.dictionaries(
    st.sampled_from(["apiVersion", "metadata", "spec", "status", "x"]),
    st.recursive(
        st.none() | st.integers(0, 2) | st.booleans() | st.sampled_from(["a", "b", 1.0]),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(
                st.sampled_from(["name", "image", "spec", "replicas", "containers", "x"]),
                inner,
                max_size=3,
            )
        ),
        max_leaves=16,
    ),
)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(
    old=DOCS,
    new=DOCS,
    share=st.sets(st.sampled_from(["apiVersion", "metadata", "spec", "status", "x"])),
    subresource=st.sampled_from(["", "status"]),
    ignored=st.sampled_from([(), (("f:spec", "f:replicas"),), (("f:x",),)]),
    twist=st.booleans(),
)
def test_update_diff_skipping_equal_subtrees_matches_the_whole_walk(
    old: dict[str, Any],
    new: dict[str, Any],
    share: set[str],
    subresource: str,
    ignored: tuple[tuple[str, ...], ...],
    twist: bool,
) -> None:
    """track_update compares only fields that differ; it must find what comparing the members
    of both whole objects finds."""
    from orchestrator.kube.patch.managedfields import diff_members, member_changed, tracked_members

    def twisted(value: Any) -> Any:  # == in Python, not in JSON: True -> 1 -> 1.0
        if isinstance(value, dict):
            return {k: twisted(v) for k, v in value.items()}
        if isinstance(value, list):
            return [twisted(v) for v in value]
        if isinstance(value, bool):
            return int(value)
        return float(value) if isinstance(value, int) else value

    for key in share:  # equal subtrees, or equal-but-for-type ones
        if key in old:
            new[key] = twisted(old[key]) if twist else copy.deepcopy(old[key])
    before = tracked_members(old, SCHEMA, subresource, ignored)
    after = tracked_members(new, SCHEMA, subresource, ignored)
    want_changed = {p for p, m in after.items() if member_changed(before.get(p), m)}
    want_removed = set(before) - set(after)
    changed: set[tuple[str, ...]] = set()
    removed: set[tuple[str, ...]] = set()
    diff_members(old, new, SCHEMA, (), subresource, ignored, changed, removed)
    assert (changed, removed) == (want_changed, want_removed)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    doc=DOCS,
    meta=st.dictionaries(st.sampled_from(["name", "uid", "labels", "x"]), JSONISH, max_size=3),
    subresource=st.sampled_from(["", "status"]),
    ignored=st.sampled_from([(), (("f:spec", "f:replicas"),)]),
)
def test_create_field_sets_are_memoized_soundly(
    doc: dict[str, Any],
    meta: dict[str, Any],
    subresource: str,
    ignored: tuple[tuple[str, ...], ...],
) -> None:
    """A create's field set comes from a memo keyed by what it depends on: it must equal the
    walk, for the object itself and for variants differing in ignored or relevant metadata."""
    from orchestrator.kube.patch.managedfields import created_fields, diff_members

    def walked(obj: dict[str, Any]) -> frozenset[tuple[str, ...]]:
        changed: set[tuple[str, ...]] = set()
        diff_members({}, obj, SCHEMA, (), subresource, ignored, changed, set())
        return frozenset(changed)

    variants = [
        {**doc, "metadata": meta},
        {**doc, "metadata": {**meta, "name": "other", "uid": "u2"}},  # differs in ignored only
        {**doc, "metadata": {k: v for k, v in meta.items() if k in ("name", "uid")}},
        {**doc, "metadata": {}},
        {k: v for k, v in doc.items() if k != "metadata"},
        {**doc, "metadata": meta, "status": None},
        {k: v for k, v in doc.items() if k != "status"},
    ]
    for obj in variants * 2:  # the second round is answered by the memo
        fields, tree = created_fields(obj, SCHEMA, subresource, ignored)
        assert fields == walked(obj)
        assert tree == encode_fields_v1(fields)
