"""The kubectl-like commands against `kubefake.FakeApi`: what they print, what they send."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml
from kubefake import FakeApi, status

from orchestrator.cli import kube
from orchestrator.cli.main import _build_parser, main

KUBECONFIG = """
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://fake.invalid:6443"}}]
users: [{name: u, user: {token: secret}}]
contexts: [{name: ctx, context: {cluster: c, user: u}}]
current-context: ctx
"""


@pytest.fixture
def api() -> FakeApi:
    return FakeApi()


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Path:
    p = tmp_path / "kubeconfig.yaml"
    p.write_text(KUBECONFIG)
    return p


Run = Any


@pytest.fixture
def run(api: FakeApi, kubeconfig: Path) -> Run:
    async def go(*argv: str) -> tuple[int, str, str]:
        args = _build_parser().parse_args([*argv, "--kubeconfig", str(kubeconfig)])
        out, err = io.StringIO(), io.StringIO()
        with trio.fail_after(5):
            rc = await kube.run(args, out=out, err=err, transport=api.transport())
        return rc, out.getvalue(), err.getvalue()

    return go


def deployment(
    name: str = "nginx", replicas: int = 3, ns: str = "default", **meta: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}, **meta},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": name, "image": "nginx:1.26"}]},
            },
        },
    }


# ---- get --------------------------------------------------------------------------------------


async def test_get_prints_the_table_with_kubectl_spacing(api: FakeApi, run: Run) -> None:
    api.add(deployment("nginx"))
    api.add(deployment("web-frontend", replicas=10))
    rc, out, err = await run("get", "deploy")
    assert (rc, err) == (0, "")
    assert out.splitlines() == [
        "NAME           REPLICAS   AGE",
        "nginx          3          5m",
        "web-frontend   10         5m",
    ]
    req = api.requests[-1]
    assert req.url.path == "/apis/apps/v1/namespaces/default/deployments"
    assert "as=Table" in req.headers["accept"]
    assert req.headers["authorization"] == "Bearer secret"


async def test_get_wide_all_namespaces_and_labels(api: FakeApi, run: Run) -> None:
    api.add(deployment("a", ns="prod"))
    api.add(deployment("b"))
    rc, out, _ = await run("get", "deployments.apps", "-A", "-o", "wide", "--show-labels")
    assert rc == 0
    assert out.splitlines() == [
        "NAMESPACE   NAME   REPLICAS   AGE   NODE-NAME   LABELS",
        "default     b      3          5m    node-1      app=b",
        "prod        a      3          5m    node-1      app=a",
    ]
    assert api.requests[-1].url.path == "/apis/apps/v1/deployments"


async def test_get_nothing_says_so_on_stderr(run: Run) -> None:
    assert await run("get", "po") == (0, "", "No resources found in default namespace.\n")
    assert await run("get", "po", "-n", "kube-system") == (
        0,
        "",
        "No resources found in kube-system namespace.\n",
    )
    assert await run("get", "nodes") == (0, "", "No resources found\n")


async def test_get_names_some_missing(api: FakeApi, run: Run) -> None:
    api.add(deployment("nginx"))
    rc, out, err = await run("get", "deployment", "nginx", "nope")
    assert rc == 1
    assert out.splitlines()[1].startswith("nginx ")
    assert err == 'Error from server (NotFound): deployments.apps "nope" not found\n'


async def test_get_several_types_prefixes_names(api: FakeApi, run: Run) -> None:
    api.add(deployment("nginx"))
    api.add({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"}, "spec": {}})
    rc, out, _ = await run("get", "deploy,po")
    assert rc == 0
    lines = out.splitlines()
    assert lines[1].startswith("deployment.apps/nginx")
    assert lines[2] == ""
    assert lines[4].startswith("pod/web")


async def test_get_output_formats(api: FakeApi, run: Run) -> None:
    api.add(deployment("nginx"))
    rc, out, _ = await run("get", "deploy", "nginx", "-o", "json")
    assert rc == 0
    assert json.loads(out)["metadata"]["name"] == "nginx"
    assert api.requests[-1].headers["accept"] == "application/json"
    rc, out, _ = await run("get", "deploy", "-o", "yaml")
    doc = yaml.safe_load(out)
    assert doc["kind"] == "List"
    assert [i["metadata"]["name"] for i in doc["items"]] == ["nginx"]
    assert await run("get", "deploy", "-o", "name") == (0, "deployment.apps/nginx\n", "")


async def test_get_without_table_support_prints_name_and_age(api: FakeApi, run: Run) -> None:
    api.tables = False
    api.add(deployment("nginx"))
    rc, out, _ = await run("get", "deploy")
    assert rc == 0
    head, row = out.splitlines()
    assert head == "NAME    AGE"
    assert row.startswith("nginx   ")


# httpx's response streams are async generators (encode/httpx#3686): a stream left early is
# closed by the client, but trio still reports the generator objects as unexhausted at GC.
LEFT_EARLY = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@LEFT_EARLY
async def test_get_watch_prints_rows_from_events(api: FakeApi, run: Run) -> None:
    api.add(deployment("nginx"))
    ev = {
        "type": "MODIFIED",
        "object": {
            "kind": "Table",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": "200"},
            "columnDefinitions": [
                {"name": "Name", "type": "string", "priority": 0},
                {"name": "Replicas", "type": "integer", "priority": 0},
                {"name": "Age", "type": "string", "priority": 0},
            ],
            "rows": [
                {
                    "cells": ["nginx", 5, "6m"],
                    "object": {"kind": "PartialObjectMetadata", "metadata": {"name": "nginx"}},
                }
            ],
        },
    }
    line = json.dumps(ev).encode() + b"\n"
    # Split mid-line: the decoder must wait for the newline. The stream then ends: -w would
    # re-watch, so an ERROR event (410) stops the test the way a real expiry would.
    gone = {"kind": "Status", "status": "Failure", "message": "too old resource version"}
    expired = {"type": "ERROR", "object": {**gone, "reason": "Expired", "code": 410}}
    api.watch_lines["deployments"] = [line[:10], line[10:], json.dumps(expired).encode() + b"\n"]
    rc, out, err = await run("get", "deploy", "-w")
    assert rc == 1
    assert out.splitlines() == [
        "NAME    REPLICAS   AGE",
        "nginx   3          5m",
        "nginx   5          6m",
    ]
    assert err == "Error from server (Expired): too old resource version\n"
    watch = api.requests[-1]
    assert watch.url.params["watch"] == "true"
    assert watch.url.params["resourceVersion"] == str(api.rv)


# ---- errors -----------------------------------------------------------------------------------


async def test_errors_print_like_kubectl(api: FakeApi, run: Run) -> None:
    assert await run("get", "deploy", "nope") == (
        1,
        "",
        'Error from server (NotFound): deployments.apps "nope" not found\n',
    )
    assert await run("get", "widgets") == (
        1,
        "",
        'error: the server doesn\'t have a resource type "widgets"\n',
    )
    api.fail[("GET", "/api/v1/namespaces/default/pods")] = status(
        401, "Unauthorized", "Unauthorized"
    )
    assert await run("get", "pods") == (
        1,
        "",
        "error: You must be logged in to the server (Unauthorized)\n",
    )


def test_main_prints_connection_errors_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "kc"
    cfg.write_text(KUBECONFIG.replace("https://fake.invalid:6443", "http://127.0.0.1:9"))
    assert main(["get", "pods", "--kubeconfig", str(cfg), "--request-timeout", "5"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot reach the API server at http://127.0.0.1:9")
    assert "Traceback" not in err
    assert main(["get", "pods", "--kubeconfig", str(tmp_path / "missing")]) == 1
    assert capsys.readouterr().err == f"error: kubeconfig {tmp_path / 'missing'} does not exist\n"


# ---- apply / delete / scale -------------------------------------------------------------------


async def test_apply_is_idempotent(api: FakeApi, run: Run, tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    f = tmp_path / "m" / "app.yaml"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    f.write_text(yaml.safe_dump(deployment()) + "---\n" + yaml.safe_dump(pod) + "---\n")
    assert await run("apply", "-f", str(f)) == (
        0,
        "deployment.apps/nginx created\npod/web created\n",
        "",
    )
    assert await run("apply", "-f", str(f)) == (
        0,
        "deployment.apps/nginx unchanged\npod/web unchanged\n",
        "",
    )
    f.write_text(yaml.safe_dump(deployment(replicas=5)))
    assert await run("apply", "-f", str(tmp_path / "m")) == (
        0,
        "deployment.apps/nginx configured\n",
        "",
    )
    assert api.find("apps", "deployments", "default", "nginx")["spec"]["replicas"] == 5  # type: ignore[index]
    req, body = api.bodies("PATCH")[-1]
    assert req.headers["content-type"] == "application/apply-patch+yaml"
    assert req.url.params["fieldManager"] == "orchestrator-cli"
    assert req.url.params["force"] == "false"
    assert body["metadata"]["namespace"] == "default"


async def test_apply_errors(api: FakeApi, run: Run, tmp_path: Path) -> None:
    f = tmp_path / "d.yaml"
    f.write_text(yaml.safe_dump(deployment(ns="prod")))
    rc, _, err = await run("apply", "-f", str(f), "-n", "dev")
    assert rc == 1
    assert 'namespace from the provided object "prod" does not match the namespace "dev"' in err
    f.write_text("kind: Deployment\nmetadata: {name: x}\n")
    assert await run("apply", "-f", str(f)) == (
        1,
        "",
        f'error: error validating "{f}": error validating data: [apiVersion not set]\n',
    )
    f.write_text(yaml.safe_dump(deployment("invalid", replicas=-1)))
    api.fail[("PATCH", "/apis/apps/v1/namespaces/default/deployments/invalid")] = status(
        422,
        "Invalid",
        'Deployment.apps "invalid" is invalid: spec.replicas: Invalid value: -1: must be '
        "greater than or equal to 0",
        {
            "name": "invalid",
            "group": "apps",
            "kind": "Deployment",
            "causes": [
                {
                    "reason": "FieldValueInvalid",
                    "field": "spec.replicas",
                    "message": "Invalid value: -1: must be greater than or equal to 0",
                }
            ],
        },
    )
    assert await run("apply", "-f", str(f)) == (
        1,
        "",
        f'error when creating "{f}": The Deployment "invalid" is invalid: spec.replicas: '
        "Invalid value: -1: must be greater than or equal to 0\n",
    )


async def test_delete_and_scale(api: FakeApi, run: Run, tmp_path: Path) -> None:
    api.add(deployment("nginx"))
    api.add(deployment("web"))
    assert await run("scale", "deploy/nginx", "--replicas=5") == (
        0,
        "deployment.apps/nginx scaled\n",
        "",
    )
    req, body = api.bodies("PATCH")[-1]
    assert req.url.path.endswith("/deployments/nginx/scale")
    assert req.headers["content-type"] == "application/merge-patch+json"
    assert body == {"spec": {"replicas": 5}}
    assert await run("delete", "deployment", "nginx", "nope") == (
        1,
        'deployment.apps "nginx" deleted\n',
        'Error from server (NotFound): deployments.apps "nope" not found\n',
    )
    assert api.bodies("DELETE")[0][1]["propagationPolicy"] == "Background"
    f = tmp_path / "web.yaml"
    f.write_text(yaml.safe_dump(deployment("web")))
    assert await run("delete", "-f", str(f)) == (0, 'deployment.apps "web" deleted\n', "")
    assert await run("delete", "deploy", "web", "--ignore-not-found") == (0, "", "")


# ---- describe / logs --------------------------------------------------------------------------


async def test_describe_renders_object_and_events(api: FakeApi, run: Run) -> None:
    dep = api.add(deployment("nginx", annotations={"deployment.kubernetes.io/revision": "2"}))
    uid = dep["metadata"]["uid"]
    api.add(
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": "nginx.1", "namespace": "default"},
            "involvedObject": {
                "kind": "Deployment",
                "name": "nginx",
                "namespace": "default",
                "uid": uid,
            },
            "type": "Normal",
            "reason": "ScalingReplicaSet",
            "count": 1,
            "message": "Scaled up replica set nginx-7c5 to 3",
            "source": {"component": "deployment-controller"},
            "lastTimestamp": "2025-01-01T00:00:00Z",
        }
    )
    rc, out, _ = await run("describe", "deployment", "nginx")
    assert rc == 0
    lines = out.splitlines()
    assert lines[:4] == [
        "Name:         nginx",
        "Namespace:    default",
        "Labels:       app=nginx",
        "Annotations:  deployment.kubernetes.io/revision: 2",
    ]
    assert "API Version:  apps/v1" in lines
    assert "  Creation Timestamp:  2025-01-01T00:00:00Z" in lines
    assert "  Replicas:  3" in lines
    assert "      app:  nginx" in lines  # label maps keep their keys
    i = lines.index("Events:")
    assert lines[i + 1].split() == ["Type", "Reason", "Age", "From", "Message"]
    assert lines[i + 3].split()[:2] == ["Normal", "ScalingReplicaSet"]
    assert lines[i + 3].endswith("deployment-controller  Scaled up replica set nginx-7c5 to 3")
    q = api.requests[-1].url.params
    assert q["fieldSelector"] == (
        f"involvedObject.name=nginx,involvedObject.namespace=default,involvedObject.uid={uid}"
    )


async def test_logs_picks_the_container(api: FakeApi, run: Run) -> None:
    api.add(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web"},
            "spec": {"containers": [{"name": "app"}, {"name": "sidecar"}]},
        }
    )
    api.logs[("web", "app")] = "one\ntwo\nthree\n"
    api.logs[("web", "sidecar")] = "side\n"
    assert await run("logs", "web", "--tail", "2") == (
        0,
        "two\nthree\n",
        'Defaulted container "app" out of: app, sidecar\n',
    )
    assert await run("logs", "pod/web", "-c", "sidecar", "-f") == (0, "side\n", "")
    assert api.requests[-1].url.params["follow"] == "true"
    assert await run("logs", "web", "-c", "nope") == (
        1,
        "",
        "error: container nope is not valid for pod web\n",
    )


# ---- api-resources / explain ------------------------------------------------------------------


async def test_api_resources(run: Run) -> None:
    rc, out, _ = await run("api-resources")
    assert rc == 0
    assert out.splitlines() == [
        "NAME          SHORTNAMES   APIVERSION   NAMESPACED   KIND",
        "pods          po           v1           true         Pod",
        "events        ev           v1           true         Event",
        "namespaces    ns           v1           false        Namespace",
        "nodes         no           v1           false        Node",
        "deployments   deploy       apps/v1      true         Deployment",
        "replicasets   rs           apps/v1      true         ReplicaSet",
    ]
    rc, out, _ = await run("api-resources", "--namespaced", "false", "-o", "name")
    assert out.splitlines() == ["namespaces", "nodes"]


async def test_explain_walks_refs(run: Run) -> None:
    rc, out, _ = await run("explain", "deploy.spec.strategy")
    assert rc == 0
    assert out.splitlines() == [
        "GROUP:      apps",
        "KIND:       Deployment",
        "VERSION:    v1",
        "",
        "FIELD: strategy <DeploymentStrategy>",
        "",
        "DESCRIPTION:",
        "    The deployment strategy to use to replace existing pods with new ones.",
        "    ",
        "FIELDS:",
        "  rollingUpdate\t<RollingUpdateDeployment>",
        "    Rolling update config params.",
        "",
        "  type\t<string>",
        "  enum: Recreate, RollingUpdate",
        "    Type of deployment.",
    ]
    rc, out, _ = await run("explain", "deployment.spec")
    assert "  selector\t<LabelSelector> -required-" in out.splitlines()
    assert "  replicas\t<integer>" in out.splitlines()
    rc, out, _ = await run("explain", "deployments.spec.strategy.rollingUpdate.maxSurge")
    assert "FIELD: maxSurge <IntOrString>" in out
    assert await run("explain", "deploy.spec.nope") == (
        1,
        "",
        'error: field "nope" does not exist (in spec)\n',
    )
