"""RFC 6902 JSON patch and RFC 7386 JSON merge patch."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.kube.errors import ApiError
from orchestrator.kube.patch import apply_json_patch, apply_merge_patch, create_merge_patch

DOC: dict[str, Any] = {
    "metadata": {"name": "web", "labels": {"a/b": "1", "m~n": "2"}},
    "spec": {"replicas": 1, "args": ["x", "y"]},
}


def test_add_remove_replace() -> None:
    out = apply_json_patch(
        DOC,
        [
            {"op": "add", "path": "/spec/paused", "value": True},
            {"op": "add", "path": "/spec/args/1", "value": "inserted"},
            {"op": "add", "path": "/spec/args/-", "value": "last"},
            {"op": "remove", "path": "/metadata/labels/a~1b"},
            {"op": "replace", "path": "/metadata/labels/m~0n", "value": "3"},
            {"op": "replace", "path": "/spec/replicas", "value": 5},
        ],
    )
    assert out == {
        "metadata": {"name": "web", "labels": {"m~n": "3"}},
        "spec": {"replicas": 5, "args": ["x", "inserted", "y", "last"], "paused": True},
    }
    assert DOC["spec"]["replicas"] == 1  # input untouched


def test_move_copy_test() -> None:
    out = apply_json_patch(
        DOC,
        [
            {"op": "test", "path": "/spec/replicas", "value": 1},
            {"op": "copy", "from": "/spec/args", "path": "/spec/command"},
            {"op": "move", "from": "/metadata/name", "path": "/spec/name"},
        ],
    )
    assert out["spec"]["command"] == ["x", "y"]
    assert out["spec"]["name"] == "web"
    assert "name" not in out["metadata"]
    out["spec"]["command"].append("z")
    assert out["spec"]["args"] == ["x", "y"]  # copies do not alias


def test_replace_whole_document() -> None:
    assert apply_json_patch(DOC, [{"op": "replace", "path": "", "value": {"a": 1}}]) == {"a": 1}


def test_failed_test_is_422_with_a_clear_message() -> None:
    with pytest.raises(ApiError) as err:
        apply_json_patch(DOC, [{"op": "test", "path": "/spec/replicas", "value": 2}])
    assert err.value.code == 422
    assert "jsonpatch test operation does not apply" in err.value.message


def test_test_distinguishes_bools_from_numbers() -> None:
    with pytest.raises(ApiError):
        apply_json_patch({"a": 1}, [{"op": "test", "path": "/a", "value": True}])


@pytest.mark.parametrize(
    ("op", "message"),
    [
        ({"op": "remove", "path": "/spec/foo"}, 'doc is missing path: "/spec/foo"'),
        ({"op": "replace", "path": "/nope/x", "value": 1}, 'doc is missing path: "/nope/x"'),
        ({"op": "add", "path": "/spec/args/5", "value": 1}, "out of bounds"),
        ({"op": "remove", "path": "/spec/args/2"}, "out of bounds"),
        ({"op": "add", "path": "/spec/args/01", "value": 1}, "invalid array index"),
        ({"op": "move", "from": "/spec", "path": "/spec/x"}, "own child"),
    ],
)
def test_operations_that_do_not_apply_are_422(op: dict[str, Any], message: str) -> None:
    with pytest.raises(ApiError) as err:
        apply_json_patch(DOC, [op])
    assert err.value.code == 422
    assert message in err.value.message


@pytest.mark.parametrize(
    "ops",
    [
        {"op": "add"},
        [{"op": "add", "path": "/a"}],
        [{"op": "jump", "path": "/a"}],
        [{"op": "add", "path": "a", "value": 1}],
        [{"op": "add", "path": "/a~2", "value": 1}],
        [{"op": "move", "path": "/a"}],
        ["add"],
    ],
)
def test_malformed_patches_are_400(ops: Any) -> None:
    with pytest.raises(ApiError) as err:
        apply_json_patch(DOC, ops)
    assert err.value.code == 400


def test_kubectl_managed_fields_migration_patch() -> None:
    live = {"metadata": {"managedFields": [{"manager": "old"}], "resourceVersion": "7"}}
    ops = [
        {"op": "replace", "path": "/metadata/managedFields", "value": [{"manager": "new"}]},
        {"op": "replace", "path": "/metadata/resourceVersion", "value": "7"},
    ]
    out = apply_json_patch(live, ops)
    assert out["metadata"]["managedFields"] == [{"manager": "new"}]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from(["a", "b", "-", "0"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["a", "b", "0", "-", "~"]), inner, max_size=3)
    ),
    max_leaves=15,
)
POINTERS = st.lists(
    st.sampled_from(["a", "b", "0", "1", "-", "~0", "~1", "~", "01"]), max_size=3
).map(lambda parts: "".join("/" + p for p in parts))
OPS = st.fixed_dictionaries(
    {"op": st.sampled_from(["add", "remove", "replace", "move", "copy", "test", "x"])},
    optional={"path": POINTERS | JSON, "from": POINTERS, "value": JSON},
)


@settings(max_examples=500)
@given(doc=JSON, ops=st.lists(OPS, max_size=4) | JSON)
def test_json_patch_junk_raises_only_api_errors(doc: Any, ops: Any) -> None:
    before = copy.deepcopy((doc, ops))
    try:
        apply_json_patch(doc, ops)
    except ApiError as err:
        assert err.code in (400, 422)  # noqa: PT017 - checking a Hypothesis example, not a case
    assert (doc, ops) == before


# --- merge patch ---------------------------------------------------------------------------


def test_merge_patch_rfc7386_examples() -> None:
    doc = {"a": "b", "c": {"d": "e", "f": "g"}}
    assert apply_merge_patch(doc, {"a": "z", "c": {"f": None}}) == {"a": "z", "c": {"d": "e"}}
    assert apply_merge_patch({"a": [1, 2]}, {"a": [3]}) == {"a": [3]}
    assert apply_merge_patch({"a": "x"}, {"a": {"b": {"c": None, "d": 1}}}) == {
        "a": {"b": {"d": 1}}
    }
    assert apply_merge_patch({}, {}) == {}


def test_merge_patch_must_be_an_object() -> None:
    with pytest.raises(ApiError) as err:
        apply_merge_patch({}, [1])
    assert err.value.code == 400


def test_kubectl_scale_merge_patch() -> None:
    live = {"spec": {"replicas": 1, "selector": {"app": "x"}}}
    assert apply_merge_patch(live, {"spec": {"replicas": 5}}) == {
        "spec": {"replicas": 5, "selector": {"app": "x"}}
    }


NULL_FREE = st.recursive(
    st.booleans() | st.integers(-3, 3) | st.sampled_from(["a", "b"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3)
    ),
    max_leaves=15,
)
OBJECTS = st.dictionaries(st.sampled_from(["a", "b", "c"]), NULL_FREE, max_size=3)


@settings(max_examples=300)
@given(original=OBJECTS, modified=OBJECTS)
def test_merge_patch_roundtrip(original: dict[str, Any], modified: dict[str, Any]) -> None:
    before = copy.deepcopy((original, modified))
    patch = create_merge_patch(original, modified)
    assert apply_merge_patch(original, patch) == modified
    assert create_merge_patch(original, original) == {}
    assert (original, modified) == before


@settings(max_examples=300)
@given(
    doc=st.dictionaries(st.text(max_size=3), JSON), patch=st.dictionaries(st.text(max_size=3), JSON)
)
def test_merge_patch_sharing_the_document_gives_the_same_result_and_leaves_it_alone(
    doc: dict[str, Any], patch: dict[str, Any]
) -> None:
    before, patch_before = copy.deepcopy(doc), copy.deepcopy(patch)
    shared = apply_merge_patch(doc, patch, share=True)
    assert shared == apply_merge_patch(before, patch)
    assert doc == before
    assert patch == patch_before


def test_merge_patch_sharing_takes_the_patch_values_as_they_are() -> None:
    items = [1, 2]
    shared = apply_merge_patch({"a": {"b": 1}}, {"a": {"items": items}}, share=True)
    assert shared == {"a": {"b": 1, "items": [1, 2]}}
    assert shared["a"]["items"] is items
    assert apply_merge_patch({}, {"items": items})["items"] is not items
