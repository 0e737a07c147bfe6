"""Every bad input of issue 16, one test each, against the in-process API server; then
Hypothesis over every verb and subresource, and arbitrary Unicode in every string of every
built-in kind.

Each request is checked for three things (`Checked`): no 5xx; every error body is a
metav1.Status (JSON, strict UTF-8); a refused request leaves the store byte-identical — every
key under /registry/ with its mod_revision and value bytes, and the revision — not only the
revision. Lone UTF-16 surrogates (escaped `"\\ud800"` or raw `ED A0 80`) are replaced by U+FFFD,
as Go's decoder does: an accepted request stores no surrogate.

One server for the module (`apiharness.live_server`, no controllers, so only the test writes).
Deterministic (`derandomize=True`), bounded: the module runs in well under a minute.
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from apiharness import Live, live_server
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.security.tls import MAX_REQUEST_HEAD

NS = "bad"
MiB = 1024 * 1024
FUZZ = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
JSON = "application/json"
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"

CM = f"/api/v1/namespaces/{NS}/configmaps"
SECRETS = f"/api/v1/namespaces/{NS}/secrets"
DEPLOYS = f"/apis/apps/v1/namespaces/{NS}/deployments"
GIZMOS = f"/apis/example.com/v1/namespaces/{NS}/gizmos"


# ---------------------------------------------------------------------- examples
def _pod_spec(port_name: str = "http") -> dict[str, Any]:
    return {
        "containers": [
            {
                "name": "c",
                "image": "nginx:1",
                "ports": [{"name": port_name, "containerPort": 80}],
                "env": [{"name": "MODE", "value": "prod"}],
            }
        ]
    }


def _workload(kind: str, name: str, scaled: bool = True) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}}, "spec": _pod_spec()},
    }
    if scaled:
        spec["replicas"] = 1
    if kind == "StatefulSet":
        spec["serviceName"] = name
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name}, "spec": spec}


def example(kind: str, name: str) -> dict[str, Any]:
    """A valid object of each built-in kind, with a label, an annotation and string data."""
    meta = {"name": name, "labels": {"tier": "web"}, "annotations": {"note": "hello"}}
    core: dict[str, dict[str, Any]] = {
        "Namespace": {},
        "Pod": {"spec": _pod_spec()},
        "Node": {"spec": {"podCIDR": "10.0.0.0/24"}},
        "Event": {
            "involvedObject": {"kind": "Pod", "name": "p", "namespace": NS},
            "reason": "Started",
            "message": "started",
            "type": "Normal",
        },
        "ConfigMap": {"data": {"key": "value"}},
        "Secret": {"stringData": {"key": "value"}, "type": "Opaque"},
        "Service": {"spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "name": "http"}]}},
        "Endpoints": {
            "subsets": [{"addresses": [{"ip": "10.1.0.1"}], "ports": [{"port": 80, "name": "h"}]}]
        },
        "ServiceAccount": {},
    }
    if kind in core:
        return {"apiVersion": "v1", "kind": kind, "metadata": meta, **core[kind]}
    if kind in ("Deployment", "ReplicaSet", "StatefulSet", "DaemonSet"):
        obj = _workload(kind, name, scaled=kind != "DaemonSet")
        obj["metadata"] = {**meta, "name": name}
        return obj
    if kind == "Lease":
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": {"holderIdentity": "me", "leaseDurationSeconds": 15},
        }
    if kind == "EndpointSlice":
        return {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": meta,
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.42.0.2"], "conditions": {"ready": True}}],
            "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
        }
    raise AssertionError(kind)


# (kind, collection path, seeded name); Namespace and Node are cluster-scoped.
KINDS: list[tuple[str, str]] = [
    ("Namespace", "/api/v1/namespaces"),
    ("Pod", f"/api/v1/namespaces/{NS}/pods"),
    ("Node", "/api/v1/nodes"),
    ("Event", f"/api/v1/namespaces/{NS}/events"),
    ("ConfigMap", CM),
    ("Secret", SECRETS),
    ("Service", f"/api/v1/namespaces/{NS}/services"),
    ("Endpoints", f"/api/v1/namespaces/{NS}/endpoints"),
    ("ServiceAccount", f"/api/v1/namespaces/{NS}/serviceaccounts"),
    ("Deployment", DEPLOYS),
    ("ReplicaSet", f"/apis/apps/v1/namespaces/{NS}/replicasets"),
    ("DaemonSet", f"/apis/apps/v1/namespaces/{NS}/daemonsets"),
    ("StatefulSet", f"/apis/apps/v1/namespaces/{NS}/statefulsets"),
    ("Lease", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"),
    ("EndpointSlice", f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"),
]
SEEDED = "seed"

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
                            "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                        },
                    }
                },
            }
        ],
    },
}


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    with live_server() as server:
        http = server.http
        r = http.post("/api/v1/namespaces", json={"metadata": {"name": NS}})
        assert r.status_code == 201, r.text
        for kind, path in KINDS:
            r = http.post(
                path, json=example(kind, f"{NS}-{SEEDED}" if kind == "Namespace" else SEEDED)
            )
            assert r.status_code == 201, (kind, r.text)
        r = http.post(
            SECRETS,
            params={"fieldManager": "owner"},
            json={"metadata": {"name": "app-sec", "labels": {"a": "b"}}, "data": {"k": "dg=="}},
        )
        assert r.status_code == 201, r.text
        r = http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=GIZMO_CRD)
        assert r.status_code == 201, r.text
        yield server


def seeded_path(kind: str, path: str) -> str:
    return f"{path}/{NS}-{SEEDED}" if kind == "Namespace" else f"{path}/{SEEDED}"


# ---------------------------------------------------------------------- checks
def check_status(r: httpx.Response) -> dict[str, Any]:
    """A 4xx whose body is a metav1.Status (strict UTF-8 JSON) with the same code."""
    assert 400 <= r.status_code < 500, f"{r.request.method} {r.request.url}: {r.status_code}"
    assert r.headers.get("content-type", "").startswith(JSON), r.headers
    body: dict[str, Any] = json.loads(r.content.decode("utf-8"))
    assert body.get("kind") == "Status", body
    assert body.get("apiVersion") == "v1", body
    assert body.get("status") == "Failure", body
    assert body.get("code") == r.status_code, body
    assert body.get("message"), body
    assert body.get("reason"), body
    return body


def no_surrogates(value: Any) -> None:
    """The object holds no UTF-16 surrogate (each was replaced by U+FFFD)."""
    text = json.dumps(value, ensure_ascii=False)
    text.encode("utf-8")  # raises on a surrogate


def send(live: Live, method: str, url: str, **kwargs: Any) -> httpx.Response:
    """The request must not reach a 5xx; every error is a Status, and a refused request
    leaves the store byte-identical. Returns the response."""
    before = live.snapshot()
    r = live.http.request(method, url, **kwargs)
    assert r.status_code < 500, f"{method} {url}: {r.status_code} {r.content[:300]!r}"
    if r.status_code >= 400:
        check_status(r)
        after = live.snapshot()
        assert after == before, (
            f"{method} {url} was refused ({r.status_code}) but changed {_diff(before, after)}"
        )
    elif r.content:
        assert r.headers.get("content-type", "").startswith(JSON), r.headers
        no_surrogates(json.loads(r.content.decode("utf-8")))
    return r


def refused(
    live: Live, method: str, url: str, code: int | None = None, **kwargs: Any
) -> dict[str, Any]:
    r = send(live, method, url, **kwargs)
    assert r.status_code >= 400, f"{method} {url} was accepted: {r.status_code} {r.text[:300]}"
    body = check_status(r)
    if code is not None:
        assert r.status_code == code, body
    return body


def _diff(
    before: tuple[int, dict[str, tuple[int, bytes]]],
    after: tuple[int, dict[str, tuple[int, bytes]]],
) -> str:
    keys = {k for k in before[1].keys() | after[1].keys() if before[1].get(k) != after[1].get(k)}
    return f"revision {before[0]} -> {after[0]}, keys {sorted(keys)}"


def get(live: Live, url: str) -> dict[str, Any]:
    r = live.http.get(url)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


# ---------------------------------------------------------------------- surrogates
ESCAPED = b'"\\ud800"'  # a JSON string holding a lone high surrogate
RAW = b'"\xed\xa0\x80"'  # the same code point as (invalid) UTF-8 bytes

# Where the bad string goes, as (template with @ for the string, key) of a ConfigMap body.
PLACES = {
    "name": b'{"metadata":{"name":@}}',
    "label-value": b'{"metadata":{"name":"NAME","labels":{"k":@}}}',
    "label-key": b'{"metadata":{"name":"NAME","labels":{@:"v"}}}',
    "annotation-key": b'{"metadata":{"name":"NAME","annotations":{@:"v"}}}',
    "annotation-value": b'{"metadata":{"name":"NAME","annotations":{"k":@}}}',
    "data-value": b'{"metadata":{"name":"NAME"},"data":{"k":@}}',
    "data-key": b'{"metadata":{"name":"NAME"},"data":{@:"v"}}',
}


def _body(place: str, string: bytes, name: str) -> bytes:
    return PLACES[place].replace(b"NAME", name.encode()).replace(b"@", string)


@pytest.mark.parametrize("string", [ESCAPED, RAW], ids=["escaped", "raw"])
@pytest.mark.parametrize("place", list(PLACES))
def test_lone_surrogates_never_500(live: Live, place: str, string: bytes) -> None:
    name = f"s-{place}-{'e' if string == ESCAPED else 'r'}"
    r = send(live, "POST", CM, content=_body(place, string, name), headers={"content-type": JSON})
    if r.status_code == 201:  # a value where any text goes: stored with U+FFFD, like Go
        assert "\ufffd" in r.text
        assert "\ufffd" in json.dumps(get(live, f"{CM}/{name}"), ensure_ascii=False)
    # the same string through an update and every patch type of the seeded ConfigMap
    target = f"{CM}/{SEEDED}"
    current = get(live, target)
    put = json.dumps({**current, "metadata": {**current["metadata"], "labels": {"k": "@"}}})
    send(
        live,
        "PUT",
        target,
        content=put.encode().replace(b'"@"', string),
        headers={"content-type": JSON},
    )
    patch = _body(place, string, SEEDED)
    for ptype in (MERGE, STRATEGIC):
        send(live, "PATCH", target, content=patch, headers={"content-type": ptype})
    ops = b'[{"op":"add","path":"/data/x","value":@}]'.replace(b"@", string)
    send(live, "PATCH", target, content=ops, headers={"content-type": JSON_PATCH})
    apply = b'{"apiVersion":"v1","kind":"ConfigMap",' + patch[1:]
    send(
        live,
        "PATCH",
        target,
        params={"fieldManager": "fz"},
        content=apply,
        headers={"content-type": APPLY},
    )
    yaml_apply = (
        b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: seed\n  labels:\n    k: " + string
    )
    send(
        live,
        "PATCH",
        target,
        params={"fieldManager": "fz"},
        content=yaml_apply,
        headers={"content-type": APPLY},
    )


def test_surrogate_in_a_pruned_field_does_not_fail_after_the_write(live: Live) -> None:
    # The Secret case of the issue: an apply that added a label carried an unknown field whose
    # name was a lone surrogate; the object was stored, then the warning about the field could
    # not be encoded: a 500 for a request that had changed the Secret.
    target = f"{SECRETS}/app-sec"
    body = (
        b'{"apiVersion":"v1","kind":"Secret","metadata":{"name":"app-sec",'
        b'"labels":{"added":"1"}},"\\udc00bogus":1}'
    )
    r = send(
        live,
        "PATCH",
        target,
        params={"fieldManager": "fz"},
        content=body,
        headers={"content-type": APPLY},
    )
    assert r.status_code == 200, r.text
    warnings = [v.decode("utf-8") for k, v in r.headers.raw if k.lower() == b"warning"]
    assert any("\ufffdbogus" in w for w in warnings), warnings
    # undo: the next tests start from the Secret as seeded
    r = send(
        live,
        "PATCH",
        target,
        params={"fieldManager": "fz"},
        content=b'{"apiVersion":"v1","kind":"Secret","metadata":{"name":"app-sec"}}',
        headers={"content-type": APPLY},
    )
    assert r.status_code == 200, r.text


def test_invalid_utf8_outside_strings_is_400(live: Live) -> None:
    refused(
        live,
        "POST",
        CM,
        400,
        content=b'{"metadata":\xff{"name":"x"}}',
        headers={"content-type": JSON},
    )
    refused(
        live, "POST", CM, 400, content=b"\xed\xa0\x80", headers={"content-type": "application/yaml"}
    )


# ---------------------------------------------------------------------- status and scale
BAD_JSON_PATCHES: list[Any] = [
    [{"op": "frob", "path": "/status"}],
    {"op": "add", "path": "/status/replicas", "value": 1},
    [{"op": "add"}],
    [{"op": "replace", "path": "/status/nope/deeper", "value": 1}],
    [{"op": "add", "path": "/status/replicas", "value": "many"}],
    [{"op": "add", "path": "/status/replicas", "value": -1}],
    [{"op": "remove", "path": "/status/absent"}],
    [{"op": "test", "path": "/metadata/name", "value": "other"}],
    [{"op": "add", "path": "/metadata/name", "value": "renamed"}],
    [{"op": "replace", "path": "/kind", "value": "Pod"}],
    "not a patch",
]


@pytest.mark.parametrize("patch", BAD_JSON_PATCHES)
def test_invalid_json_patch_to_status_is_refused(live: Live, patch: Any) -> None:
    refused(
        live,
        "PATCH",
        f"{DEPLOYS}/{SEEDED}/status",
        content=json.dumps(patch).encode(),
        headers={"content-type": JSON_PATCH},
    )


SCALE = {"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": SEEDED}}


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({**SCALE, "kind": "Deployment", "spec": {"replicas": 3}}, 400),
        ({**SCALE, "apiVersion": "apps/v1", "spec": {"replicas": 3}}, 400),
        ({**SCALE, "apiVersion": "autoscaling/v2", "spec": {"replicas": 3}}, 400),
        ({"kind": "Deployment", "spec": {"replicas": 3}}, 400),
        ([{"spec": {"replicas": 3}}], 400),
        ("3", 400),
        ({**SCALE, "spec": {"replicas": -3}}, 422),
        ({**SCALE, "spec": {"replicas": "3"}}, 422),
        ({**SCALE, "spec": {"replicas": 2.5}}, 422),
        ({**SCALE, "spec": "3"}, 400),
        ({**SCALE, "metadata": {"name": "other"}, "spec": {"replicas": 3}}, 400),
        ({**SCALE, "metadata": "seed", "spec": {"replicas": 3}}, 400),
        (
            {
                **SCALE,
                "metadata": {"name": SEEDED, "resourceVersion": "1"},
                "spec": {"replicas": 3},
            },
            409,
        ),
    ],
)
def test_bad_scale_writes_change_nothing(live: Live, body: Any, code: int) -> None:
    url = f"{DEPLOYS}/{SEEDED}/scale"
    before = get(live, f"{DEPLOYS}/{SEEDED}")
    refused(live, "PUT", url, code, json=body)
    if isinstance(body, dict) and body.get("kind") != "Scale":  # the same through a patch
        refused(
            live,
            "PATCH",
            url,
            code,
            json={"kind": body.get("kind"), "spec": {"replicas": 3}},
            headers={"content-type": MERGE},
        )
    after = get(live, f"{DEPLOYS}/{SEEDED}")
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


def test_a_right_scale_still_works(live: Live) -> None:
    url = f"{DEPLOYS}/{SEEDED}/scale"
    r = send(live, "PUT", url, json={**SCALE, "spec": {"replicas": 2}})
    assert r.status_code == 200, r.text
    assert get(live, f"{DEPLOYS}/{SEEDED}")["spec"]["replicas"] == 2
    r = send(live, "PATCH", url, json={"spec": {"replicas": 1}}, headers={"content-type": MERGE})
    assert r.status_code == 200, r.text


# ---------------------------------------------------------------------- the Secret
SECRET_APPLIES = [
    'metadata:\n  name: app-sec\n  labels:\n    added: "1"\ndata:\n  k: "not base64!"\n',
    'metadata:\n  name: app-sec\n  labels:\n    added: "1"\ntype: 5\n',
    'metadata:\n  name: app-sec\n  labels:\n    added: "1"\nstringData: 5\n',
    'metadata:\n  name: app-sec\n  labels:\n    added: "1"\n    "bad key": x\n',
    'metadata:\n  name: app-sec\n  labels:\n    added: "1"\nimmutable: "x"\n',
    'metadata:\n  name: app-sec\n  resourceVersion: "1"\n  labels:\n    added: "1"\n',
    'metadata:\n  name: app-sec\n  labels:\n    added: "1"\ntype: kubernetes.io/tls\n',
    'metadata:\n  name: app-sec\n  labels:\n    added: "1"\n    "\\ud800": x\n',
    'metadata:\n  name: other\n  labels:\n    added: "1"\n',
    'metadata:\n  name: app-sec\n  labels:\n    added: "1"\n  managedFields: []\n',
    'metadata:\n  name: app-sec\n  labels:\n    added: "1"\ndata:\n  big: "'
    + "A" * (1400 * 1024)
    + '"\n',
]


@pytest.mark.parametrize("manager", ["owner", "other"])
@pytest.mark.parametrize("text", SECRET_APPLIES, ids=range(len(SECRET_APPLIES)))
def test_refused_applies_leave_the_secret_byte_identical(
    live: Live, text: str, manager: str
) -> None:
    body = "apiVersion: v1\nkind: Secret\n" + text
    refused(
        live,
        "PATCH",
        f"{SECRETS}/app-sec",
        params={"fieldManager": manager},
        content=body.encode(),
        headers={"content-type": APPLY},
    )


@pytest.mark.parametrize(
    ("ptype", "patch"),
    [
        (MERGE, {"metadata": {"labels": {"added": "1"}}, "data": {"k": "!!"}}),
        (MERGE, {"metadata": {"labels": {"added": "1"}}, "type": "other"}),
        (STRATEGIC, {"metadata": {"labels": {"added": "1"}}, "type": "other"}),
        (STRATEGIC, {"metadata": {"labels": {"added": "1"}}, "data": {"k": 5}}),
        (
            JSON_PATCH,
            [
                {"op": "add", "path": "/metadata/labels/added", "value": "1"},
                {"op": "add", "path": "/data/k", "value": "!!"},
            ],
        ),
        (
            JSON_PATCH,
            [
                {"op": "add", "path": "/metadata/labels/added", "value": "1"},
                {"op": "test", "path": "/x", "value": 1},
            ],
        ),
        (
            MERGE,
            {"metadata": {"labels": {"added": "1"}}, "stringData": {"big": "x" * (1100 * 1024)}},
        ),
    ],
)
def test_refused_patches_leave_the_secret_byte_identical(
    live: Live, ptype: str, patch: Any
) -> None:
    refused(
        live,
        "PATCH",
        f"{SECRETS}/app-sec",
        params={"fieldManager": "owner"},
        json=patch,
        headers={"content-type": ptype},
    )


# ---------------------------------------------------------------------- content types, methods
@pytest.mark.parametrize(
    "content_type", [None, "", "application/xml", "application/octet-stream", "text/plain"]
)
@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH"])
def test_bodies_need_a_known_content_type(
    live: Live, method: str, content_type: str | None
) -> None:
    url = CM if method == "POST" else f"{CM}/{SEEDED}"
    headers = {} if content_type is None else {"content-type": content_type}
    body = json.dumps(example("ConfigMap", SEEDED if method != "POST" else "ct")).encode()
    if not content_type and method != "PATCH":
        # Without a Content-Type a body is read as JSON, as kube-apiserver does (kubectl's
        # scale client relies on it): one that is not JSON is of an unknown format.
        body = b"<ConfigMap><name>ct</name></ConfigMap>"
    # httpx adds no Content-Type to raw `content`
    status = refused(live, method, url, 415, content=body, headers=headers)
    assert status["reason"] == "UnsupportedMediaType"
    if method != "PATCH":
        assert (
            "application/json, application/yaml, application/vnd.kubernetes.protobuf"
            in status["message"]
        )
    else:
        assert "application/merge-patch+json" in status["message"]


def test_what_clients_send_still_works(live: Live) -> None:
    body = example("ConfigMap", "ct-ok")
    r = send(
        live, "POST", CM, json=body, headers={"content-type": "application/json; charset=utf-8"}
    )
    assert r.status_code == 201, r.text
    r = send(
        live,
        "PUT",
        f"{CM}/ct-ok",
        content=json.dumps(r.json()).encode(),
        headers={"content-type": "application/yaml"},
    )
    assert r.status_code == 200, r.text
    # a body without a Content-Type is read as JSON (kube-apiserver does so)
    r = send(live, "POST", CM, content=json.dumps(example("ConfigMap", "no-type")).encode())
    assert r.status_code == 201, r.text
    r = send(live, "PUT", f"{CM}/no-type", content=json.dumps(r.json()).encode())
    assert r.status_code == 200, r.text
    assert send(live, "DELETE", f"{CM}/no-type").status_code == 200
    r = send(live, "DELETE", f"{CM}/ct-ok", content=b'{"gracePeriodSeconds":0}')
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("LOCK", "/readyz"),
        ("LOCK", "/api/v1/namespaces"),
        ("PROPFIND", f"{CM}/{SEEDED}"),
        ("POST", "/readyz"),
        ("DELETE", "/healthz"),
        ("PUT", "/version"),
        ("BREW", "/livez"),
    ],
)
def test_unknown_methods_are_405(live: Live, method: str, path: str) -> None:
    refused(live, method, path, 405)


# ---------------------------------------------------------------------- selectors
@pytest.mark.parametrize(
    "params",
    [
        {"labelSelector": "!!a"},
        {"labelSelector": "a in (b"},
        {"labelSelector": "a in b"},
        {"labelSelector": "a=b=c"},
        {"labelSelector": "=b"},
        {"labelSelector": "a,,b"},
        {"labelSelector": "Bad Key=x"},
        {"labelSelector": "a=" + "x" * 64},
        {"fieldSelector": "spec.x=1"},
        {"fieldSelector": "metadata.name"},
        {"fieldSelector": "=x"},
        {"fieldSelector": "metadata.name=a=b,"},
        {"fieldSelector": "metadata.labels=x"},
    ],
)
def test_invalid_selectors_are_400_before_anything_is_written(
    live: Live, params: dict[str, str]
) -> None:
    for method in ("GET", "DELETE"):
        refused(live, method, CM, 400, params=params)
    refused(live, "GET", CM, 400, params={**params, "watch": "true"})


def test_empty_set_selector_means_empty_value_as_in_apimachinery(live: Live) -> None:
    # `a in ()` parses, in apimachinery, to "a is the empty string": a valid selector. A
    # deletecollection with it removes only objects labelled a="" (here: none).
    r = send(live, "DELETE", CM, params={"labelSelector": "tier in ()"})
    assert r.status_code == 200, r.text
    assert r.json()["items"] == []
    assert get(live, f"{CM}/{SEEDED}")["metadata"]["name"] == SEEDED


# ---------------------------------------------------------------------- values, sizes
def test_invalid_values_in_put_are_422_as_in_create(live: Live) -> None:
    bad = _workload("Deployment", "ports")
    bad["spec"]["template"]["spec"] = _pod_spec("averyveryverylongname")
    refused(live, "POST", DEPLOYS, 422, json=bad)
    current = get(live, f"{DEPLOYS}/{SEEDED}")
    current["spec"]["template"]["spec"]["containers"][0]["ports"][0]["name"] = (
        "averyveryverylongname"
    )
    body = refused(live, "PUT", f"{DEPLOYS}/{SEEDED}", 422, json=current)
    assert "must be no more than 15 characters" in body["message"]
    for name in ("-http", "ht--tp", "8080", "HTTP"):
        current["spec"]["template"]["spec"]["containers"][0]["ports"][0]["name"] = name
        refused(live, "PUT", f"{DEPLOYS}/{SEEDED}", 422, json=current)


def test_config_map_and_secret_data_limit(live: Live) -> None:
    over = MiB  # with the key "k", one byte over 1 MiB
    body = refused(
        live, "POST", CM, 422, json={"metadata": {"name": "big"}, "data": {"k": "x" * over}}
    )
    assert "Too long: must have at most 1048576 bytes" in body["message"]
    split = {
        "metadata": {"name": "big"},
        "data": {"a": "x" * (MiB // 2)},
        "binaryData": {"b": base64.b64encode(b"y" * (MiB // 2)).decode()},
    }
    refused(live, "POST", CM, 422, json=split)
    refused(
        live,
        "POST",
        SECRETS,
        422,
        json={"metadata": {"name": "big"}, "data": {"k": base64.b64encode(b"x" * over).decode()}},
    )
    refused(
        live,
        "POST",
        SECRETS,
        422,
        json={"metadata": {"name": "big"}, "stringData": {"k": "x" * over}},
    )
    refused(
        live,
        "POST",
        CM,
        422,
        json={"metadata": {"name": "big"}, "data": {"k": "x" * int(1.4 * MiB)}},
    )
    # exactly at the limit is fine
    r = send(live, "POST", CM, json={"metadata": {"name": "big"}, "data": {"k": "x" * (MiB - 1)}})
    assert r.status_code == 201, r.text[:300]
    refused(
        live,
        "PATCH",
        f"{CM}/big",
        422,
        json={"data": {"k2": "xx"}},
        headers={"content-type": MERGE},
    )
    assert send(live, "DELETE", f"{CM}/big").status_code == 200


def test_objects_over_one_and_a_half_mib_are_413(live: Live) -> None:
    body = {
        "apiVersion": "example.com/v1",
        "kind": "Gizmo",
        "metadata": {"name": "huge"},
        "spec": {"blob": "x" * (1600 * 1024)},
    }
    status = refused(live, "POST", GIZMOS, 413, json=body)
    assert status["reason"] == "RequestEntityTooLarge"


# ---------------------------------------------------------------------- URLs and headers
def raw_exchange(live: Live, head: bytes) -> tuple[int, bytes, dict[str, Any]]:
    """Send `head` over a TLS connection of its own (httpx refuses URLs over 64 KiB); the
    answer's code, headers and JSON body. The server has read all of `head` when it answers
    (either it is a whole request, or the reader stopped at its limit right after it)."""
    url = urlsplit(live.harness.url)
    assert url.hostname is not None
    assert url.port is not None
    ctx = ssl.create_default_context(cadata=live.harness.ca_pem.decode())
    raw = socket.create_connection((url.hostname, url.port), timeout=10)
    with ctx.wrap_socket(raw, server_hostname=url.hostname) as tls:
        tls.sendall(head)
        answer = b""
        while b"\r\n\r\n" not in answer or not _complete(answer):
            chunk = tls.recv(65536)
            if not chunk:
                break
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    headers, _, body = rest.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in headers.lower(), answer[:300]
    return int(status_line.split()[1]), headers, json.loads(body)


def _complete(answer: bytes) -> bool:
    head, _, body = answer.partition(b"\r\n\r\n")
    for line in head.lower().split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def _auth(live: Live) -> bytes:
    host = urlsplit(live.harness.url).hostname
    return f"host: {host}\r\nauthorization: Bearer {live.harness.token}\r\n".encode()


def test_long_url_is_414_status(live: Live) -> None:
    before = live.snapshot()
    target = f"{CM}?labelSelector=" + "a" * (100 * 1024)
    code, _, status = raw_exchange(
        live, f"DELETE {target} HTTP/1.1\r\n".encode() + _auth(live) + b"\r\n"
    )
    assert code == 414
    assert status["kind"] == "Status"
    assert status["code"] == 414
    assert status["reason"] == "RequestURITooLong"
    assert live.snapshot() == before


def test_long_headers_are_431_status(live: Live) -> None:
    status = refused(live, "GET", CM, headers={"x-big": "a" * (300 * 1024)})
    assert status["code"] == 431
    assert status["reason"] == "RequestHeaderFieldsTooLarge"


def test_head_over_the_http_layer_limit_is_431_status(live: Live) -> None:
    # Over hypercorn's own limit (1 MiB of request head) the HTTP layer answers: a Status too.
    # The head is just over the limit, so that the server has read all of it when it answers
    # and closes (unread bytes would turn the close into a reset).
    start = f"GET {CM} HTTP/1.1\r\n".encode() + _auth(live) + b"x-big: "
    code, _, status = raw_exchange(live, start + b"a" * (MAX_REQUEST_HEAD + 1024 - len(start)))
    assert code == 431
    assert status["kind"] == "Status"
    assert status["code"] == 431
    assert status["reason"] == "RequestHeaderFieldsTooLarge"


def test_unreadable_http_is_400_status(live: Live) -> None:
    code, _, status = raw_exchange(live, b"GET / HTTP/1.1\r\nbad header line\r\n\r\n")
    assert code == 400
    assert status["kind"] == "Status"


# ---------------------------------------------------------------------- Hypothesis: verbs
def _leaves(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], str]]:
    """(path, "key" | "value") of every string leaf and every map key."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield (*path, k), "key"
            yield from _leaves(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, (*path, i))
    elif isinstance(value, str):
        yield path, "value"


def _replace(obj: Any, path: tuple[Any, ...], what: str, new: str) -> Any:
    """A copy of `obj` with the string (or the key) at `path` replaced by `new`."""
    out: Any = json.loads(json.dumps(obj))
    parent: Any = out
    for p in path[:-1]:
        parent = parent[p]
    last = path[-1]
    if what == "key":
        parent[new] = parent.pop(last)
    else:
        parent[last] = new
    return out


LONE = ["\ud800", "\udbff", "\udc00", "\udfff"]
unicode_text = st.builds(
    lambda pre, lone, post: pre + lone + post,
    st.text(alphabet=st.characters(exclude_categories=()), max_size=12),
    st.sampled_from([*LONE, ""]),
    st.text(max_size=6),
)


def encode(obj: Any, raw: bool) -> bytes:
    """JSON with surrogates escaped (`\\ud800`), or as raw (invalid) UTF-8 bytes."""
    if raw:
        return json.dumps(obj, ensure_ascii=False).encode("utf-8", "surrogatepass")
    return json.dumps(obj).encode()


VERBS = ["create", "update", "merge", "strategic", "json-patch", "apply"]
_counter = iter(range(10**9))


@FUZZ
@given(
    index=st.integers(0, len(KINDS) - 1),
    verb=st.sampled_from(VERBS),
    raw=st.booleans(),
    data=st.data(),
)
def test_arbitrary_unicode_in_every_string_of_every_kind(
    live: Live, index: int, verb: str, raw: bool, data: st.DataObject
) -> None:
    kind, path = KINDS[index]
    fresh = f"u{next(_counter)}"
    obj = example(
        kind, fresh if verb == "create" else (f"{NS}-{SEEDED}" if kind == "Namespace" else SEEDED)
    )
    # never the name: a create needs its fresh one, the others name the seeded object
    leaves = [
        (p, w) for p, w in _leaves(obj) if p != ("metadata", "name") and p[:1] != ("apiVersion",)
    ]
    where, what = data.draw(st.sampled_from(leaves))
    text = data.draw(unicode_text)
    mutated = _replace(obj, where, what, text)
    target = seeded_path(kind, path)
    if verb == "create":
        r = send(live, "POST", path, content=encode(mutated, raw), headers={"content-type": JSON})
        if r.status_code == 201:
            send(live, "DELETE", f"{path}/{fresh}")
        return
    if verb == "update":
        current = get(live, target)
        body = _replace(current, where, what, text) if _has(current, where) else mutated
        send(live, "PUT", target, content=encode(body, raw), headers={"content-type": JSON})
        return
    if verb == "json-patch":
        pointer = "/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in where)
        ops = [{"op": "add", "path": pointer, "value": text}]
        send(live, "PATCH", target, content=encode(ops, raw), headers={"content-type": JSON_PATCH})
        return
    ctype = {"merge": MERGE, "strategic": STRATEGIC, "apply": APPLY}[verb]
    send(
        live,
        "PATCH",
        target,
        params={"fieldManager": "fuzz"},
        content=encode(mutated, raw),
        headers={"content-type": ctype},
    )


def _has(obj: Any, path: tuple[Any, ...]) -> bool:
    """Whether `path` leads to something in `obj`."""
    cur = obj
    for p in path:
        if (isinstance(cur, dict) and p in cur) or (
            isinstance(cur, list) and isinstance(p, int) and p < len(cur)
        ):
            cur = cur[p]
        else:
            return False
    return True


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | unicode_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(unicode_text, inner, max_size=3),
    max_leaves=8,
)
SUBRESOURCES = [
    f"{DEPLOYS}/{SEEDED}",
    f"{DEPLOYS}/{SEEDED}/status",
    f"{DEPLOYS}/{SEEDED}/scale",
    f"/apis/apps/v1/namespaces/{NS}/statefulsets/{SEEDED}/scale",
    f"/api/v1/namespaces/{NS}/pods/{SEEDED}/status",
    f"/api/v1/namespaces/{NS}/services/{SEEDED}/status",
    f"{SECRETS}/app-sec",
    f"{CM}/{SEEDED}",
]


@FUZZ
@given(
    url=st.sampled_from(SUBRESOURCES),
    method=st.sampled_from(["PUT", "PATCH"]),
    ctype=st.sampled_from([JSON, MERGE, STRATEGIC, JSON_PATCH, APPLY, "application/yaml"]),
    body=json_values,
    raw=st.booleans(),
)
def test_random_bodies_on_every_subresource(
    live: Live, url: str, method: str, ctype: str, body: Any, raw: bool
) -> None:
    # Random JSON (often with lone surrogates) as any body type on objects and their status
    # and scale: never a 5xx, and a refusal changes nothing. A body that happens to be
    # accepted (a merge patch of `{}`) is fine.
    send(
        live,
        method,
        url,
        params={"fieldManager": "fuzz"},
        content=encode(body, raw),
        headers={"content-type": ctype},
    )


@FUZZ
@given(
    selector=st.one_of(
        st.text(max_size=20),
        st.lists(
            st.sampled_from(
                ["a", "!", "=", "==", "!=", " in ", " notin ", "(", ")", ",", "b", "x y"]
            ),
            max_size=8,
        ).map("".join),
    ),
    field=st.booleans(),
    method=st.sampled_from(["GET", "DELETE"]),
)
def test_random_selectors_on_list_and_deletecollection(
    live: Live, selector: str, field: bool, method: str
) -> None:
    # Only ConfigMaps labelled `tier` exist, and a deletecollection that matches them would
    # be accepted: give them a label no generated selector can name before the request.
    params = {"fieldSelector" if field else "labelSelector": selector}
    if method == "DELETE":
        # deletecollection: valid selectors may match; only the seeded ConfigMap could go,
        # so the request is made on a kind where nothing the test needs lives.
        r = send(
            live,
            "DELETE",
            f"/api/v1/namespaces/{NS}/serviceaccounts",
            params={**params, "dryRun": "All"},
        )
    else:
        r = send(live, "GET", CM, params=params)
    assert r.status_code in (200, 400), r.text
