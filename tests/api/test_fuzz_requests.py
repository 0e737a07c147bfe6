"""Malformed requests against the in-process API server, generated with Hypothesis.

Every request here is wrong in some way (bodies that are not JSON, objects of the wrong kind,
invalid names, wrongly typed fields, absurd numbers, huge bodies, bad query parameters, unknown
paths and methods, unknown patch types, broken JSON patches, strategic-merge directives in the
wrong places), and the server must answer as the apiserver does: a 4xx (never a 5xx) whose body
is a metav1.Status with `status: Failure`, and nothing written (the store revision is the same
before and after). Where a generated request might by chance be valid, the test only asks for
"no 5xx, and a failure changes nothing".

One server for the module runs in its own thread (its own trio loop), so Hypothesis drives plain
synchronous tests against it with a blocking httpx client; the store revision is read through
`trio.from_thread.run`. Deterministic (`derandomize=True`), bounded (`max_examples`), no deadline.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml
from apiharness import Live, live_server
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

NS = "fuzz"
FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    with live_server() as server:
        _seed(server)
        yield server


def _seed(live: Live) -> None:
    """A namespace with one ConfigMap, one Deployment, and a CRD with one custom object."""
    http = live.http
    ok = {200, 201}
    assert http.post("/api/v1/namespaces", json={"metadata": {"name": NS}}).status_code in ok
    r = http.post(
        f"/api/v1/namespaces/{NS}/configmaps",
        json={"metadata": {"name": "cm", "labels": {"a": "b"}}, "data": {"k": "v"}},
    )
    assert r.status_code == 201, r.text
    r = http.post(f"/apis/apps/v1/namespaces/{NS}/deployments", json=deployment("web"))
    assert r.status_code == 201, r.text
    r = http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=GIZMO_CRD)
    assert r.status_code == 201, r.text
    r = http.post(  # the custom kind is served as soon as the CRD is stored
        f"/apis/example.com/v1/namespaces/{NS}/gizmos",
        json={"apiVersion": "example.com/v1", "kind": "Gizmo", "metadata": {"name": "g"}},
    )
    assert r.status_code == 201, r.text


def deployment(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [{"name": "c", "image": "i", "ports": [{"containerPort": 80}]}]
                },
            },
        },
    }


GIZMO_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "gizmos.example.com"},
    "spec": {
        "group": "example.com",
        "scope": "Namespaced",
        "names": {"plural": "gizmos", "singular": "gizmo", "kind": "Gizmo"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "properties": {
                                    "size": {"type": "integer", "maximum": 10},
                                    "ratio": {"type": "number"},
                                    "extra": {
                                        "type": "object",
                                        "x-kubernetes-preserve-unknown-fields": True,
                                    },
                                },
                            }
                        },
                    }
                },
            }
        ],
    },
}

# Collections a create may target, with the kind's identity.
COLLECTIONS = [
    (f"/api/v1/namespaces/{NS}/configmaps", "v1", "ConfigMap"),
    (f"/apis/apps/v1/namespaces/{NS}/deployments", "apps/v1", "Deployment"),
    (f"/api/v1/namespaces/{NS}/pods", "v1", "Pod"),
    ("/api/v1/namespaces", "v1", "Namespace"),
    (f"/apis/example.com/v1/namespaces/{NS}/gizmos", "example.com/v1", "Gizmo"),
    ("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", "apiextensions.k8s.io/v1", None),
]
OBJECTS = [
    f"/api/v1/namespaces/{NS}/configmaps/cm",
    f"/apis/apps/v1/namespaces/{NS}/deployments/web",
    f"/apis/example.com/v1/namespaces/{NS}/gizmos/g",
]


# ---------------------------------------------------------------------- checks
def check_failure(r: httpx.Response, *, head: bool = False) -> dict[str, Any] | None:
    """A 4xx whose body is a metav1.Status with status Failure and the same code."""
    assert 400 <= r.status_code < 500, (
        f"{r.request.method} {r.request.url}: {r.status_code} {r.text[:500]}"
    )
    assert r.headers.get("content-type", "").startswith("application/json"), r.headers
    if head:
        return None
    body: dict[str, Any] = r.json()
    assert body.get("kind") == "Status", body
    assert body.get("apiVersion") == "v1", body
    assert body.get("status") == "Failure", body
    assert body.get("code") == r.status_code, body
    assert isinstance(body.get("message"), str), body
    assert body["message"], body
    assert isinstance(body.get("reason"), str), body
    assert body["reason"], body
    return body


def must_fail(live: Live, method: str, url: str, **kwargs: Any) -> dict[str, Any] | None:
    """The request is wrong: 4xx Status, store unchanged."""
    before = live.revision()
    r = live.http.request(method, url, **kwargs)
    body = check_failure(r, head=method == "HEAD")
    assert live.revision() == before, f"{method} {url} failed with {r.status_code} but wrote"
    return body


def may_fail(live: Live, method: str, url: str, **kwargs: Any) -> httpx.Response:
    """The request may be right by chance: never a 5xx, and a failure writes nothing."""
    before = live.revision()
    r = live.http.request(method, url, **kwargs)
    assert r.status_code < 500, f"{method} {url}: {r.status_code} {r.text[:500]}"
    if r.status_code >= 400:
        check_failure(r, head=method == "HEAD")
        assert live.revision() == before, f"{method} {url} failed with {r.status_code} but wrote"
    return r


# ---------------------------------------------------------------------- strategies
def _not_json(data: bytes) -> bool:
    try:
        json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return True
    return False


json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
non_object_json = json_values.filter(lambda v: not isinstance(v, dict))

invalid_names = st.one_of(
    st.sampled_from(
        ["UPPER", "has space", "-lead", "trail-", "a..b", "a_b", ".", "..", "a/b", "ä", "x" * 254]
    ),
    st.text(min_size=1, max_size=20).filter(
        lambda s: any(not (c.islower() or c.isdigit() or c in "-.") or not c.isascii() for c in s)
    ),
    st.integers(),
    st.lists(st.text(max_size=3), max_size=2),
    st.just({"name": "x"}),
    st.just(None),
)


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for i in range(depth):
        value = {"n": value} if i % 2 else [value]
    return value


HUGE = [2**31, -(2**31) - 1, 2**63, 2**64 + 1, 10**30, -(10**40), 10**400]

# (collection index, dotted field, bad value) — every one is wrong for that kind.
WRONG_TYPES: list[tuple[int, str, Any]] = [
    (0, "data", 5),
    (0, "data", ["a"]),
    (0, "data.k", 1),
    (0, "data.k", {"x": "y"}),
    (0, "binaryData.k", "not base64!"),
    (0, "metadata.labels", ["a"]),
    (0, "metadata.labels.k", 3),
    (0, "metadata.labels.k", "bad value with spaces"),
    (0, "metadata.annotations", "x"),
    (0, "metadata.namespace", 7),
    (0, "metadata.finalizers", "x"),
    (0, "metadata.ownerReferences", {"a": 1}),
    (0, "metadata.generateName", 3),
    (0, "immutable", "yes"),
    (1, "spec", "x"),
    (1, "spec.replicas", "three"),
    (1, "spec.replicas", -1),
    (1, "spec.replicas", 1.5),
    (1, "spec.replicas", True),
    (1, "spec.selector", "app=x"),
    (1, "spec.selector.matchLabels", {"app": "other"}),
    (1, "spec.template.spec.containers", {}),
    (1, "spec.template.spec.containers", []),
    (1, "spec.template.spec.containers", [{"image": "i"}]),
    (1, "spec.template.spec.containers", [{"name": 5, "image": "i"}]),
    (1, "spec.template.spec.containers", [{"name": "c", "image": "i", "ports": "80"}]),
    (1, "spec.strategy.type", "Sideways"),
    (1, "spec.template.spec.restartPolicy", "Sometimes"),
    (2, "spec.containers", [{"name": "c", "image": "i", "env": [{"value": "v"}]}]),
    (2, "spec.containers", "c"),
    (2, "spec", None),
    (4, "spec.size", "big"),
    (4, "spec.size", 11),
    (4, "spec", [1]),
    (5, "spec.scope", "Galactic"),
    (5, "spec.names", "x"),
]


def valid_body(index: int, name: str = "fuzzed") -> dict[str, Any]:
    _path, api_version, kind = COLLECTIONS[index]
    if index == 1:
        return deployment(name)
    body: dict[str, Any] = {"apiVersion": api_version, "kind": kind, "metadata": {"name": name}}
    if index == 2:
        body["spec"] = {"containers": [{"name": "c", "image": "i"}]}
    if index == 5:
        body = json.loads(json.dumps(GIZMO_CRD))
        body["metadata"]["name"] = "things.example.com"
        body["spec"]["names"] = {"plural": "things", "singular": "thing", "kind": "Thing"}
    return body


def set_dotted(obj: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    cur = obj
    for part in parts[:-1]:
        if not isinstance(cur.get(part), dict):
            cur[part] = {}
        cur = cur[part]
    cur[parts[-1]] = value


@st.composite
def bad_create(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """(collection path, httpx request kwargs) for a create that must fail."""
    index = draw(st.integers(0, len(COLLECTIONS) - 1))
    path = COLLECTIONS[index][0]
    how = draw(
        st.sampled_from(
            [
                "bytes",
                "non-object",
                "yaml",
                "kind",
                "name",
                "wrong-type",
                "nesting",
                "huge",
                "nan",
                "namespace",
            ]
        )
    )
    headers = {"content-type": "application/json"}
    if how == "bytes":
        data = draw(st.binary(min_size=1, max_size=200).filter(_not_json))
        return path, {"content": data, "headers": headers}
    if how == "non-object":
        return path, {"content": json.dumps(draw(non_object_json)).encode(), "headers": headers}
    if how == "yaml":
        text = draw(
            st.sampled_from(
                [
                    "a: &x [1]\nb: *x\n",  # aliases are refused
                    "- just\n- a list\n",
                    "key: [unclosed\n",
                    "!!python/object:os.system {}\n",
                    "metadata: {name: 5}\n",
                    "\t- tab\n",
                    "plain scalar",
                ]
            )
            | st.text(max_size=60).filter(lambda t: ":" not in t)
        )
        return path, {"content": text.encode(), "headers": {"content-type": "application/yaml"}}
    body = valid_body(index)
    if how == "kind":
        wrong = draw(
            st.sampled_from(
                [
                    ("v2", body["kind"]),
                    ("apps/v1", "ConfigMap"),
                    ("v1", "Secret"),
                    (body["apiVersion"], "Something"),
                    (5, body["kind"]),
                ]
            )
        )
        if index == 5 and wrong[1] is None:
            wrong = ("v1", "ConfigMap")
        body["apiVersion"], body["kind"] = wrong
    elif how == "name":
        body["metadata"]["name"] = draw(invalid_names)
    elif how == "wrong-type":
        choices = [w for w in WRONG_TYPES if w[0] == index] or [(index, "metadata.labels", 5)]
        _i, dotted, value = draw(st.sampled_from(choices))
        set_dotted(body, dotted, value)
    elif how == "nesting":
        depth = draw(st.sampled_from([50, 500, 5000, 100_000]))
        # Only into typed fields: an unknown field would just be pruned.
        field = {0: "data", 1: "spec.replicas", 2: "spec.containers", 4: "spec.size"}.get(
            index, "metadata.labels"
        )
        set_dotted(body, field, nested(depth))
    elif how == "huge":
        value = draw(st.sampled_from(HUGE))
        field = {1: "spec.replicas", 4: "spec.size"}.get(index, "metadata.generation")
        if index == 2:  # a port number: 1..65535
            body["spec"]["containers"][0]["ports"] = [{"containerPort": value}]
        elif field == "metadata.generation":  # server-owned, ignored: make the name bad too
            body["metadata"]["name"] = "Bad Name"
            set_dotted(body, field, value)
        else:
            set_dotted(body, field, value)
    elif how == "nan":
        literal = draw(st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1e400"]))
        text = json.dumps(body)[:-1] + f', "x": {literal}}}'
        return path, {"content": text.encode(), "headers": headers}
    elif how == "namespace":
        if index in (3, 5):
            body["metadata"]["name"] = "Bad_Name"
        else:
            body["metadata"]["namespace"] = draw(st.sampled_from(["default", "other", "Bad"]))
    try:
        data = json.dumps(body).encode()
    except (RecursionError, ValueError):
        data = b"{" * 10
    return path, {"content": data, "headers": headers}


# ---------------------------------------------------------------------- tests
@FUZZ
@given(request=bad_create())
def test_malformed_creates_fail_cleanly(live: Live, request: tuple[str, dict[str, Any]]) -> None:
    path, kwargs = request
    must_fail(live, "POST", path, **kwargs)


@FUZZ
@given(
    target=st.sampled_from(OBJECTS),
    how=st.sampled_from(["bytes", "non-object", "kind", "name", "rv", "meta"]),
    data=st.data(),
)
def test_malformed_updates_fail_cleanly(
    live: Live, target: str, how: str, data: st.DataObject
) -> None:
    current = live.http.get(target).json()
    if how == "bytes":
        body = data.draw(st.binary(min_size=1, max_size=100).filter(_not_json))
        must_fail(live, "PUT", target, content=body)
        return
    if how == "non-object":
        body = json.dumps(data.draw(non_object_json)).encode()
        must_fail(live, "PUT", target, content=body)
        return
    if how == "kind":
        current["kind"] = data.draw(st.sampled_from(["Secret", "Pod", "", "configmap"]))
        if current["kind"] == "":
            current["apiVersion"] = "v9"
    elif how == "name":
        current["metadata"]["name"] = data.draw(st.sampled_from(["other", "Bad Name", 5]))
    elif how == "rv":
        current["metadata"]["resourceVersion"] = data.draw(
            st.sampled_from(["1", "abc", "-5", "99999999999", "1.5"])
        )
    elif how == "meta":
        current["metadata"] = data.draw(st.sampled_from(["x", [1], 5]))
    must_fail(live, "PUT", target, json=current)


@FUZZ
@given(
    params=st.one_of(
        st.fixed_dictionaries(
            {"limit": st.sampled_from(["abc", "1.5", "-1", "0x10", "1e3", " 5"])}
        ),
        st.fixed_dictionaries({"watch": st.sampled_from(["maybe", "yes", "no", "2", "tru"])}),
        st.fixed_dictionaries(
            {
                "labelSelector": st.sampled_from(
                    [
                        "a in (b",
                        "a notin",
                        "=b",
                        "a=b=c",
                        "!",
                        "a!",
                        "a in b",
                        "a b",
                        "((",
                        "a=b c",
                    ]
                )
            }
        ),
        st.fixed_dictionaries(
            {
                "fieldSelector": st.sampled_from(
                    ["spec.foo=bar", "status.bogus=1", "metadata.labels=x", "=x", "a", "x==="]
                )
            }
        ),
        st.fixed_dictionaries(
            {"resourceVersion": st.sampled_from(["abc", "-1", "1.0"]), "watch": st.just("true")}
        ),
        st.fixed_dictionaries(
            {"timeoutSeconds": st.sampled_from(["abc", "1m"]), "watch": st.just("1")}
        ),
        st.fixed_dictionaries({"continue": st.text(min_size=1, max_size=30)}),
        st.fixed_dictionaries(
            {"allowWatchBookmarks": st.sampled_from(["perhaps", "9"]), "watch": st.just("true")}
        ),
    ),
    collection=st.sampled_from([c[0] for c in COLLECTIONS]),
)
def test_bad_list_and_watch_parameters(live: Live, params: dict[str, str], collection: str) -> None:
    must_fail(live, "GET", collection, params=params)


@FUZZ
@given(
    params=st.one_of(
        st.fixed_dictionaries({"dryRun": st.sampled_from(["Some", "true", "all", "None"])}),
        st.fixed_dictionaries({"fieldValidation": st.sampled_from(["Loose", "yes", "1"])}),
        st.fixed_dictionaries({"fieldManager": st.just("m" * 129)}),
        st.fixed_dictionaries({"force": st.sampled_from(["maybe", "2"])}),
    ),
    index=st.integers(0, len(COLLECTIONS) - 1),
)
def test_bad_write_parameters(live: Live, params: dict[str, str], index: int) -> None:
    # The body alone would be valid: only the parameters are wrong.
    must_fail(live, "POST", COLLECTIONS[index][0], params=params, json=valid_body(index, "p"))


@FUZZ
@given(text=st.text(max_size=40))
def test_random_label_selectors(live: Live, text: str) -> None:
    # A random selector may be valid; if it is not, the answer is a 400 Status.
    r = may_fail(live, "GET", COLLECTIONS[0][0], params={"labelSelector": text})
    assert r.status_code in (200, 400), r.text


segment = st.one_of(
    st.sampled_from(
        [
            "v1",
            "v2",
            "apps",
            "namespaces",
            NS,
            "configmaps",
            "deployments",
            "pods",
            "cm",
            "web",
            "status",
            "scale",
            "log",
            "binding",
            "example.com",
            "gizmos",
            "nodes",
            "%00",
            "..",
            "%2F",
            "~",
            "x" * 300,
        ]
    ),
    st.text(
        alphabet=st.characters(
            codec="ascii", categories=["L", "N", "P"], exclude_characters="/?#%"
        ),
        min_size=1,
        max_size=12,
    ),
)


@FUZZ
@given(
    root=st.sampled_from(["/api", "/apis"]),
    segments=st.lists(segment, max_size=7),
    method=st.sampled_from(["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "FROB"]),
    content_type=st.sampled_from(
        [
            "application/json",
            "application/merge-patch+json",
            "application/json-patch+json",
            "application/strategic-merge-patch+json",
            "application/apply-patch+yaml",
            "text/plain",
        ]
    ),
)
def test_random_paths_and_methods(
    live: Live, root: str, segments: list[str], method: str, content_type: str
) -> None:
    # The body is never valid JSON/YAML, so no write can succeed; GET/HEAD may (a real path).
    body = b"{\x00not json" if method not in ("GET", "HEAD") else None
    path = "/".join([root, *segments])
    headers = {"content-type": content_type}
    r = may_fail(live, method, path, content=body, headers=headers)
    if method not in ("GET", "HEAD"):
        assert r.status_code >= 400, f"{method} {path} accepted a broken body: {r.status_code}"


@FUZZ
@given(
    target=st.sampled_from(OBJECTS),
    content_type=st.one_of(
        st.sampled_from(
            [
                "text/plain",
                "application/xml",
                "application/patch+json",
                "application/json-patch",
                "application/x-www-form-urlencoded",
                "application/merge-patch",
                "application/vnd.kubernetes.protobuf",
                "application/yaml",
                "application/json",
            ]
        ),
        st.from_regex(r"\A[a-z]{1,8}/[a-z+.-]{1,16}\Z"),
    ),
)
def test_unknown_patch_content_types(live: Live, target: str, content_type: str) -> None:
    known = {
        "application/json-patch+json",
        "application/merge-patch+json",
        "application/strategic-merge-patch+json",
        "application/apply-patch+yaml",
    }
    if content_type in known:
        return
    body = must_fail(
        live, "PATCH", target, content=b'{"metadata":{}}', headers={"content-type": content_type}
    )
    assert body is not None
    assert body["code"] == 415, body


json_pointer = st.one_of(
    st.sampled_from(
        [
            "",
            "/",
            "spec",
            "/spec/replicas/x",
            "/metadata/name",  # changing the name is refused
            "/metadata/labels/~2",
            "/data/k/0",
            "/spec/template/spec/containers/5",
            "/spec/template/spec/containers/-/x",
            "/nope/deeper",
            "/metadata/uid/x",
            "/kind",
            "/apiVersion",
        ]
    ),
    st.lists(st.text(max_size=5), min_size=1, max_size=4).map(lambda p: "/" + "/".join(p)),
)
bad_ops = st.one_of(
    st.fixed_dictionaries({"op": st.sampled_from(["frob", "", "ADD", 5]), "path": json_pointer}),
    st.fixed_dictionaries({"op": st.just("add")}),  # no path
    st.fixed_dictionaries({"op": st.just("remove"), "path": json_pointer}),
    st.fixed_dictionaries({"op": st.just("replace"), "path": json_pointer}),  # no value
    st.fixed_dictionaries(
        {"op": st.sampled_from(["move", "copy"]), "from": json_pointer, "path": json_pointer}
    ),
    st.fixed_dictionaries({"op": st.just("test"), "path": json_pointer, "value": json_values}),
    st.fixed_dictionaries({"op": st.just("add"), "path": json_pointer, "value": json_values}),
    json_values,
)


@FUZZ
@given(target=st.sampled_from(OBJECTS), ops=st.lists(bad_ops, min_size=1, max_size=4) | json_values)
def test_random_json_patches(live: Live, target: str, ops: Any) -> None:
    # Some generated patches are valid (an `add` of a label, say); those may succeed. Make the
    # last op a failing `test` so that, valid or not, the whole patch must be refused.
    if isinstance(ops, list):
        ops = [*ops, {"op": "test", "path": "/metadata/name", "value": "not-the-name"}]
    must_fail(
        live,
        "PATCH",
        target,
        content=json.dumps(ops).encode(),
        headers={"content-type": "application/json-patch+json"},
    )


# Strategic merge patches that must be refused: on any object, on the Deployment, on the
# ConfigMap. (Directives in the wrong place, values of the wrong type, immutable fields.)
SMP_WRONG_ANY: list[dict[str, Any]] = [
    {"metadata": {"labels": {"$patch": "bogus"}}},
    {"metadata": {"labels": "x"}},
    {"metadata": {"finalizers": {"$patch": "replace"}}},
    {"metadata": {"$deleteFromPrimitiveList/finalizers": "notalist"}},
    {"metadata": {"name": "renamed"}},
    {"metadata": "x"},
    {"$patch": "bogus"},
    {"kind": "Secret"},
    {"apiVersion": "v2"},
]
SMP_WRONG_DEPLOYMENT: list[dict[str, Any]] = [
    {"spec": {"replicas": {"$patch": "replace"}}},
    {"spec": {"replicas": "many"}},
    {"spec": {"template": {"spec": {"containers": {"$patch": "replace"}}}}},
    {"spec": {"template": {"spec": {"containers": [{"$patch": "delete"}]}}}},
    {"spec": {"template": {"spec": {"containers": [{"$patch": "bogus", "name": "c"}]}}}},
    {"spec": {"template": {"spec": {"containers": ["c"]}}}},
    {"spec": {"template": {"spec": {"containers": [{"name": "c", "ports": "80"}]}}}},
    {"spec": {"template": {"spec": {"$setElementOrder/containers": "c"}}}},
    {"spec": {"template": {"spec": {"$setElementOrder/containers": [{"nome": "c"}]}}}},
    {
        "spec": {
            "template": {
                "spec": {
                    "$setElementOrder/containers": [{"name": "c"}],
                    "containers": [{"name": "zz", "image": "x"}],
                }
            }
        }
    },
    {"spec": {"strategy": {"$retainKeys": 5}}},
    {"spec": {"strategy": {"$retainKeys": ["type"], "rollingUpdate": {"maxSurge": 1}}}},
    {"spec": {"selector": {"matchLabels": {"app": "other"}}}},
    {"spec": {"template": {"spec": {"containers": [{"$patch": "replace"}]}}}},
]
SMP_WRONG_CONFIGMAP: list[dict[str, Any]] = [
    {"data": {"$patch": "merge-ish"}},
    {"data": ["k"]},
    {"data": {"k": 5}},
]
SMP_CASES = (
    [(t, p) for t in OBJECTS[:2] for p in SMP_WRONG_ANY]
    + [(OBJECTS[1], p) for p in SMP_WRONG_DEPLOYMENT]
    + [(OBJECTS[0], p) for p in SMP_WRONG_CONFIGMAP]
)
DIRECTIVES = ["$patch", "$retainKeys", "$setElementOrder/x", "$deleteFromPrimitiveList/x"]


@pytest.mark.parametrize(("target", "patch"), SMP_CASES)
def test_strategic_merge_patches_that_must_fail(
    live: Live, target: str, patch: dict[str, Any]
) -> None:
    must_fail(
        live,
        "PATCH",
        target,
        content=json.dumps(patch).encode(),
        headers={"content-type": "application/strategic-merge-patch+json"},
    )


@FUZZ
@given(
    target=st.sampled_from(OBJECTS[:2]),
    base=st.sampled_from(
        [p for _, p in SMP_CASES] + [{"metadata": {"labels": {}}}, {"data": {}}, {"spec": {}}]
    ),
    where=st.sampled_from(["", "metadata", "metadata.labels", "spec", "spec.template.spec"]),
    directive=st.sampled_from(DIRECTIVES),
    value=st.sampled_from([5, "x", None, [], {}, [5], [{"a": 1}], "replace", "delete"]),
)
def test_random_strategic_merge_directives(
    live: Live, target: str, base: dict[str, Any], where: str, directive: str, value: Any
) -> None:
    # A directive dropped somewhere: it may happen to be meaningful (a "$patch": "delete" on a
    # map), so only "no 5xx, and a failure writes nothing". The object is restored afterwards.
    patch = json.loads(json.dumps(base))
    if where:
        set_dotted(patch, f"{where}.{directive}", value)
    else:
        patch[directive] = value
    before = live.http.get(target).json()
    r = may_fail(
        live,
        "PATCH",
        target,
        content=json.dumps(patch).encode(),
        headers={"content-type": "application/strategic-merge-patch+json"},
    )
    if (
        r.status_code < 300
        and r.json()["metadata"]["resourceVersion"] != (before["metadata"]["resourceVersion"])
    ):
        before["metadata"].pop("resourceVersion")
        restored = live.http.put(target, json=before)
        assert restored.status_code == 200, restored.text


def test_strategic_merge_patch_on_custom_object_is_415(live: Live) -> None:
    body = must_fail(
        live,
        "PATCH",
        OBJECTS[2],
        content=b'{"spec":{"size":2}}',
        headers={"content-type": "application/strategic-merge-patch+json"},
    )
    assert body is not None
    assert body["code"] == 415


def _apply_identity(text: str) -> bool:
    """Whether `text` parses (as YAML) to a mapping that names an apiVersion and kind."""
    try:
        doc = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError, ValueError):
        return False
    return isinstance(doc, dict) and bool(doc.get("apiVersion")) and bool(doc.get("kind"))


@FUZZ
@given(
    target=st.sampled_from(OBJECTS),
    text=st.one_of(
        st.text(max_size=60),
        st.sampled_from(
            [
                "spec:\n  replicas: 3\n",
                "metadata:\n  name: web\n",
                "apiVersion: v1\n",
                "kind: Deployment\n",
                "apiVersion: apps/v1\nkind: Deployment\nmetadata: [1]\n",
                "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: other}\n",
                "apiVersion: v1\nkind: Secret\nmetadata: {name: web}\n",
                "a: &x 1\nb: *x\n",
                "- 1\n- 2\n",
                "{",
                "? complex\n: key\n",
                "!!binary aGVsbG8=\n",
            ]
        ),
    ),
)
def test_server_side_apply_bodies(live: Live, target: str, text: str) -> None:
    # Without apiVersion and kind (or with another object's identity) an apply is refused.
    if _apply_identity(text) and "other" not in text and "Secret" not in text and "[1]" not in text:
        return
    must_fail(
        live,
        "PATCH",
        target,
        params={"fieldManager": "fuzz"},
        content=text.encode(),
        headers={"content-type": "application/apply-patch+yaml"},
    )


@pytest.mark.parametrize(
    ("content_type", "text"),
    [
        ("application/json", '{"spec": {"ratio": 1e999}}'),
        ("application/json", '{"spec": {"extra": {"x": [-1e400]}}}'),
        ("application/json", '{"spec": {"extra": {"x": NaN}}}'),
        ("application/yaml", "spec:\n  ratio: .inf\n"),
        ("application/yaml", "spec:\n  extra: {x: .nan}\n"),
        ("application/yaml", "spec:\n  extra: {x: [-.Inf]}\n"),
    ],
)
def test_non_finite_numbers_are_refused(live: Live, content_type: str, text: str) -> None:
    # They would be stored and then served as NaN/Infinity, which no JSON client can read.
    head = {"apiVersion": "example.com/v1", "kind": "Gizmo", "metadata": {"name": "nonfinite"}}
    if content_type == "application/json":
        body = json.dumps(head)[:-1] + ", " + text[1:]
    else:
        body = yaml.safe_dump(head) + text
    must_fail(
        live,
        "POST",
        COLLECTIONS[4][0],
        content=body.encode(),
        headers={"content-type": content_type},
    )
    if content_type == "application/json":
        patch, patch_type = text, "application/merge-patch+json"
    else:
        head["metadata"]["name"] = "g"
        patch, patch_type = yaml.safe_dump(head) + text, "application/apply-patch+yaml"
    must_fail(
        live,
        "PATCH",
        OBJECTS[2],
        content=patch.encode(),
        headers={"content-type": patch_type},
        params={"fieldManager": "fuzz"},
    )


def _chunks(total: int) -> Iterator[bytes]:
    piece = b'{"metadata":{"name":"big"},"data":{"k":"' + b"x" * (64 * 1024)
    sent = 0
    while sent < total:
        yield piece
        sent += len(piece)
    yield b'"}}'


@pytest.mark.parametrize(
    ("method", "path", "content_type", "streamed"),
    [
        ("POST", COLLECTIONS[0][0], "application/json", False),
        ("POST", COLLECTIONS[0][0], "application/json", True),
        ("PUT", OBJECTS[0], "application/json", False),
        ("PATCH", OBJECTS[0], "application/merge-patch+json", True),
        ("PATCH", OBJECTS[1], "application/apply-patch+yaml", False),
    ],
)
def test_bodies_over_3_mib_are_413(
    live: Live, method: str, path: str, content_type: str, streamed: bool
) -> None:
    size = 3 * MiB + 1024
    content: Any = (
        _chunks(size)
        if streamed
        else b'{"metadata":{"name":"big"},"data":{"k":"' + b"x" * size + b'"}}'
    )
    body = must_fail(live, method, path, content=content, headers={"content-type": content_type})
    assert body is not None
    assert body["code"] == 413, body


def test_just_under_the_body_limit_is_read(live: Live) -> None:
    # Under 3 MiB the body is read and decoded; the object is then too large for the store
    # (a 413 about the object, not the body) or stored. Never a 5xx.
    data = b'{"metadata":{"name":"almost"},"data":{"k":"' + b"x" * (3 * MiB - 100) + b'"}}'
    r = may_fail(live, "POST", COLLECTIONS[0][0], content=data)
    assert "request body is larger" not in r.text
    if r.status_code == 201:
        assert live.http.delete(f"{COLLECTIONS[0][0]}/almost").status_code == 200
