"""orchestrator.client: kubeconfig loading, requests and Status errors, watch framing, discovery."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from orchestrator.client import (
    DEPLOYMENTS,
    NODES,
    PODS,
    ApiConnectionError,
    ApiException,
    ClientConfig,
    ConfigError,
    ResourceNotFound,
    RestClient,
    WatchDecoder,
    discover,
    load_kubeconfig,
    parse_resource_lists,
)

# ---- kubeconfig -------------------------------------------------------------------------------


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def write_config(path: Path, **over: Any) -> Path:
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "edge",
                "cluster": {
                    "server": "https://10.0.0.1:6443/",
                    "certificate-authority-data": b64(b"CA PEM"),
                },
            },
            {
                "name": "other",
                "cluster": {"server": "https://other:6443", "insecure-skip-tls-verify": True},
            },
        ],
        "users": [
            {"name": "admin", "user": {"token": "tok"}},
            {
                "name": "cert",
                "user": {"client-certificate": "cert.pem", "client-key-data": b64(b"KEY")},
            },
        ],
        "contexts": [
            {"name": "a", "context": {"cluster": "edge", "user": "admin"}},
            {"name": "b", "context": {"cluster": "other", "user": "cert", "namespace": "prod"}},
        ],
        "current-context": "a",
    }
    doc.update(over)
    path.write_text(json.dumps(doc))  # JSON is YAML
    return path


def test_kubeconfig_explicit_file_and_contexts(tmp_path: Path) -> None:
    (tmp_path / "cert.pem").write_bytes(b"CERT")
    p = write_config(tmp_path / "config")
    assert load_kubeconfig(p) == ClientConfig(
        server="https://10.0.0.1:6443", ca_pem=b"CA PEM", token="tok", namespace="default"
    )
    b = load_kubeconfig(p, "b")
    assert (b.server, b.insecure, b.cert_pem, b.key_pem, b.namespace) == (
        "https://other:6443",
        True,
        b"CERT",  # relative to the kubeconfig's directory
        b"KEY",
        "prod",
    )
    assert load_kubeconfig(p, "b", namespace="dev").namespace == "dev"
    with pytest.raises(ConfigError, match='context "zzz" not found'):
        load_kubeconfig(p, "zzz")
    with pytest.raises(ConfigError, match="does not exist"):
        load_kubeconfig(tmp_path / "missing")


def test_kubeconfig_env_merges_first_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = write_config(tmp_path / "one", **{"current-context": "b"})
    second = tmp_path / "two"
    second.write_text(
        json.dumps(
            {
                "clusters": [{"name": "edge", "cluster": {"server": "https://ignored"}}],
                "current-context": "a",
            }
        )
    )
    (tmp_path / "cert.pem").write_bytes(b"CERT")
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'nope'}:{second}:{first}")
    cfg = load_kubeconfig()
    assert cfg.server == "https://ignored"  # "two" names cluster edge first and sets context a
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "nope"))
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ConfigError, match="no kubeconfig found"):
        load_kubeconfig()


# ---- requests ---------------------------------------------------------------------------------

CFG = ClientConfig(server="https://api.test", token="sekret", namespace="team")


def client(handler: Any, **kw: Any) -> RestClient:
    return RestClient(CFG, transport=httpx.MockTransport(handler), **kw)


async def test_verbs_build_kubernetes_paths() -> None:
    seen: list[tuple[str, str, str, str]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(
            (
                req.method,
                str(req.url.raw_path.decode()),
                req.headers.get("content-type", ""),
                req.content.decode(),
            )
        )
        assert req.headers["authorization"] == "Bearer sekret"
        return httpx.Response(200, json={"kind": "X"})

    async with client(handler) as c:
        await c.get(DEPLOYMENTS, "web")
        await c.list(PODS, all_namespaces=True, label_selector="app=web")
        await c.list(NODES)
        await c.create(PODS, {"metadata": {"name": "p", "namespace": "ns1"}})
        await c.patch(DEPLOYMENTS, "web", {"spec": {"replicas": 2}}, subresource="scale")
        await c.delete(PODS, "p", "ns1")
    assert seen == [
        ("GET", "/apis/apps/v1/namespaces/team/deployments/web", "", ""),
        ("GET", "/api/v1/pods?labelSelector=app%3Dweb", "", ""),
        ("GET", "/api/v1/nodes", "", ""),
        (
            "POST",
            "/api/v1/namespaces/ns1/pods",
            "application/json",
            '{"metadata":{"name":"p","namespace":"ns1"}}',
        ),
        (
            "PATCH",
            "/apis/apps/v1/namespaces/team/deployments/web/scale",
            "application/merge-patch+json",
            '{"spec":{"replicas":2}}',
        ),
        (
            "DELETE",
            "/api/v1/namespaces/ns1/pods/p",
            "application/json",
            '{"kind":"DeleteOptions","apiVersion":"v1","propagationPolicy":"Background"}',
        ),
    ]


async def test_errors_are_parsed_from_status() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path.endswith("/nope"):
            return httpx.Response(
                404,
                json={
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "reason": "NotFound",
                    "message": 'deployments.apps "nope" not found',
                    "code": 404,
                    "details": {"name": "nope", "group": "apps", "kind": "deployments"},
                },
            )
        return httpx.Response(502, text="bad gateway\n", headers={"warning": '299 - "careful"'})

    warnings: list[str] = []
    async with client(handler, on_warning=warnings.append) as c:
        with pytest.raises(ApiException) as info:
            await c.get(DEPLOYMENTS, "nope")
        e = info.value
        assert (e.code, e.reason, e.message) == (
            404,
            "NotFound",
            'deployments.apps "nope" not found',
        )
        assert e.details["name"] == "nope"
        with pytest.raises(ApiException) as info:
            await c.request("GET", "/healthz")
        assert (info.value.code, info.value.message, info.value.status_body) == (
            502,
            "bad gateway",
            None,
        )
    assert warnings == ["careful"]


async def test_unreachable_server_is_a_connection_error() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    async with client(handler) as c:
        with pytest.raises(ApiConnectionError, match=r"https://api\.test: connection refused"):
            await c.request("GET", "/api")
    with pytest.raises(RuntimeError, match="outside"):
        await client(handler).request("GET", "/api")


# ---- watch ------------------------------------------------------------------------------------


def test_watch_decoder_frames_lines() -> None:
    d = WatchDecoder()
    a = b'{"type":"ADDED","object":{"metadata":{"name":"a"}}}\n'
    assert d.receive_data(a[:7]) == []
    assert d.receive_data(a[7:] + b"\n" + a[:3]) == [("ADDED", {"metadata": {"name": "a"}})]
    with pytest.raises(ApiException, match="bad watch line"):
        d.close()  # the stream broke off mid-line
    d.receive_data(b'{"type":"BOOKMARK","object":{}}')
    assert d.close() == [("BOOKMARK", {})]  # a whole last line without its newline counts
    with pytest.raises(ApiException) as info:
        d.receive_data(
            b'{"type":"ERROR","object":{"kind":"Status","reason":"Expired","code":410,'
            b'"message":"too old resource version: 5 (100)"}}\n'
        )
    assert (info.value.code, info.value.reason) == (410, "Expired")


async def test_watch_streams_events() -> None:
    lines = [
        json.dumps({"type": t, "object": {"metadata": {"name": n, "resourceVersion": rv}}})
        for t, n, rv in (("ADDED", "a", "5"), ("MODIFIED", "a", "6"), ("DELETED", "a", "7"))
    ]
    body = ("\n".join(lines) + "\n").encode()
    params: list[httpx.QueryParams] = []

    def handler(req: httpx.Request) -> httpx.Response:
        params.append(req.url.params)
        return httpx.Response(200, content=body, headers={"content-type": "application/json"})

    with trio.fail_after(5):
        async with (
            client(handler) as c,
            c.watch(PODS, resource_version="4", field_selector="metadata.name=a") as events,
        ):
            got = [(t, o["metadata"]["resourceVersion"]) async for t, o in events]
    assert got == [("ADDED", "5"), ("MODIFIED", "6"), ("DELETED", "7")]
    assert dict(params[0]) == {
        "watch": "true",
        "resourceVersion": "4",
        "fieldSelector": "metadata.name=a",
    }


# ---- discovery --------------------------------------------------------------------------------

CORE = {
    "groupVersion": "v1",
    "resources": [
        {
            "name": "pods",
            "singularName": "pod",
            "namespaced": True,
            "kind": "Pod",
            "verbs": ["get"],
            "shortNames": ["po"],
            "categories": ["all"],
        },
        {"name": "pods/log", "namespaced": True, "kind": "Pod", "verbs": ["get"]},
        {
            "name": "events",
            "singularName": "event",
            "namespaced": True,
            "kind": "Event",
            "verbs": ["get"],
            "shortNames": ["ev"],
        },
    ],
}
APPS = {
    "groupVersion": "apps/v1",
    "resources": [
        {
            "name": "deployments",
            "singularName": "deployment",
            "namespaced": True,
            "kind": "Deployment",
            "verbs": ["get"],
            "shortNames": ["deploy"],
            "categories": ["all"],
        },
        {"name": "deployments/scale", "namespaced": True, "kind": "Scale", "verbs": ["get"]},
    ],
}
EVENTS_V1 = {
    "groupVersion": "events.k8s.io/v1",
    "resources": [
        {
            "name": "events",
            "singularName": "event",
            "namespaced": True,
            "kind": "Event",
            "verbs": ["get"],
            "shortNames": ["ev"],
        }
    ],
}


def test_resolution_like_kubectl() -> None:
    m = parse_resource_lists([(CORE, True), (APPS, True), (EVENTS_V1, True)])
    for text in (
        "deploy",
        "deployments",
        "deployment",
        "Deployment",
        "deployment.apps",
        "deployments.v1.apps",
        "DEPLOY",
    ):
        r = m.resolve(text)
        assert (r.group, r.version, r.plural, r.kind, r.namespaced) == (
            "apps",
            "v1",
            "deployments",
            "Deployment",
            True,
        )
    assert m.resolve("deploy").subresources == ("scale",)
    assert m.resolve("po").plural == "pods"
    assert m.resolve("ev").group == ""  # the core group wins over events.k8s.io
    assert m.resolve("events.events.k8s.io").group == "events.k8s.io"
    assert m.for_kind("apps/v1", "Deployment").plural == "deployments"
    assert [r.plural for r in m.category("all")] == ["pods", "deployments"]
    with pytest.raises(ResourceNotFound, match=r'resource type "deploy\.batch"'):
        m.resolve("deploy.batch")
    with pytest.raises(ResourceNotFound):
        m.for_kind("apps/v2", "Deployment")
    assert (
        DEPLOYMENTS.path("ns", "web", "scale")
        == "/apis/apps/v1/namespaces/ns/deployments/web/scale"
    )
    assert PODS.kind_ref == "pod"
    assert DEPLOYMENTS.group_resource == "deployments.apps"


async def test_discover_reads_groups_and_tolerates_a_broken_one() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        docs: dict[str, Any] = {
            "/api": {"kind": "APIVersions", "versions": ["v1"]},
            "/apis": {
                "kind": "APIGroupList",
                "groups": [
                    {
                        "name": "apps",
                        "versions": [{"groupVersion": "apps/v1", "version": "v1"}],
                        "preferredVersion": {"groupVersion": "apps/v1", "version": "v1"},
                    },
                    {
                        "name": "broken.io",
                        "versions": [{"groupVersion": "broken.io/v1", "version": "v1"}],
                    },
                ],
            },
            "/api/v1": CORE,
            "/apis/apps/v1": APPS,
        }
        if req.url.path in docs:
            return httpx.Response(200, json=docs[req.url.path])
        return httpx.Response(
            503,
            json={
                "kind": "Status",
                "status": "Failure",
                "code": 503,
                "reason": "ServiceUnavailable",
                "message": "down",
            },
        )

    with trio.fail_after(5):
        async with client(handler) as c:
            m = await discover(c)
    assert [r.plural for r in m.resources] == ["pods", "events", "deployments"]
    assert m.failed == {"broken.io/v1": "down"}
    assert ("apps", "v1") in m.preferred
