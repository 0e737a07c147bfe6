"""The kubectl-like commands against the real API server in process (`conftest.py`): what they
print, what they send."""

from __future__ import annotations

import io
import json
import re
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import yaml
from conftest import CliApi, Run

from orchestrator.cli.main import main

KUBECONFIG = """
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://fake.invalid:6443"}}]
users: [{name: u, user: {token: secret}}]
contexts: [{name: ctx, context: {cluster: c, user: u}}]
current-context: ctx
"""


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


def pod(name: str, *containers: str) -> dict[str, Any]:
    spec = {"containers": [{"name": c, "image": "busybox"} for c in containers]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def aged(text: str) -> str:
    """`text` with every age (`0s`, `3s`: the objects are seconds old) written `#s`."""
    return re.sub(r"\b\d+s\b", lambda m: "#" * (len(m[0]) - 1) + "s", text)


# ---- get --------------------------------------------------------------------------------------


async def test_get_prints_the_table_with_kubectl_spacing(api: CliApi, run: Run) -> None:
    await api.add(deployment("nginx"))
    await api.add(deployment("web-frontend", replicas=10))
    rc, out, err = await run("get", "deploy")
    assert (rc, err) == (0, "")
    assert aged(out).splitlines() == [
        "NAME           READY   UP-TO-DATE   AVAILABLE   AGE",
        "nginx          0/3     0            0           #s",
        "web-frontend   0/10    0            0           #s",
    ]
    req = api.requests[-1]
    assert req.url.path == "/apis/apps/v1/namespaces/default/deployments"
    assert "as=Table" in req.headers["accept"]
    assert req.headers["authorization"] == f"Bearer {api.h.token}"


async def test_get_wide_all_namespaces_and_labels(api: CliApi, run: Run) -> None:
    await api.add(deployment("a", ns="prod"))
    await api.add(deployment("b"))
    rc, out, _ = await run("get", "deployments.apps", "-A", "-o", "wide", "--show-labels")
    assert rc == 0
    assert aged(out).splitlines() == [
        "NAMESPACE   NAME   READY   UP-TO-DATE   AVAILABLE   AGE   CONTAINERS   IMAGES       "
        "SELECTOR   LABELS",
        "default     b      0/3     0            0           #s    b            nginx:1.26   "
        "app=b      app=b",
        "prod        a      0/3     0            0           #s    a            nginx:1.26   "
        "app=a      app=a",
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


async def test_get_names_some_missing(api: CliApi, run: Run) -> None:
    await api.add(deployment("nginx"))
    rc, out, err = await run("get", "deployment", "nginx", "nope")
    assert rc == 1
    assert out.splitlines()[1].startswith("nginx ")
    assert err == 'Error from server (NotFound): deployments.apps "nope" not found\n'


async def test_get_several_types_prefixes_names(api: CliApi, run: Run) -> None:
    await api.add(deployment("nginx"))
    await api.add(pod("web", "app"))
    rc, out, _ = await run("get", "deploy,po")
    assert rc == 0
    lines = out.splitlines()
    assert lines[1].startswith("deployment.apps/nginx")
    assert lines[2] == ""
    assert lines[4].startswith("pod/web")


async def test_get_output_formats(api: CliApi, run: Run) -> None:
    await api.add(deployment("nginx"))
    rc, out, _ = await run("get", "deploy", "nginx", "-o", "json")
    assert rc == 0
    assert json.loads(out)["metadata"]["name"] == "nginx"
    assert api.requests[-1].headers["accept"] == "application/json"
    rc, out, _ = await run("get", "deploy", "-o", "yaml")
    doc = yaml.safe_load(out)
    assert doc["kind"] == "List"
    assert [i["metadata"]["name"] for i in doc["items"]] == ["nginx"]
    assert await run("get", "deploy", "-o", "name") == (0, "deployment.apps/nginx\n", "")


async def test_get_without_table_support_prints_name_and_age(api: CliApi, run: Run) -> None:
    api.net.tables = False  # a server that answers a Table request with the plain list
    await api.add(deployment("nginx"))
    rc, out, _ = await run("get", "deploy")
    assert rc == 0
    head, row = out.splitlines()
    assert head == "NAME    AGE"
    assert row.startswith("nginx   ")


# httpx's response streams are async generators (encode/httpx#3686): a stream left early is
# closed by the client, but trio still reports the generator objects as unexhausted at GC.
LEFT_EARLY = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


async def until_printed(out: io.StringIO, text: str) -> None:
    """Until `text` was printed to `out` (callers hold the deadline)."""
    while text not in aged(out.getvalue()):  # noqa: ASYNC110  (polling printed output)
        await trio.sleep(0.01)


@LEFT_EARLY
async def test_get_watch_prints_rows_from_events(api: CliApi, run: Run) -> None:
    await api.add(deployment("nginx"))

    async def scale(request: httpx.Request) -> None:  # between the list and its watch
        api.net.before_watch = None
        r = await api.h.client.patch(
            "/apis/apps/v1/namespaces/default/deployments/nginx",
            json={"spec": {"replicas": 5}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert r.status_code == 200, r.text

    api.net.before_watch = scale
    out = io.StringIO()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(run, "get", "deploy", "-w", out=out))
        with trio.fail_after(20):
            await until_printed(out, "nginx   0/5")
        nursery.cancel_scope.cancel()  # -w watches until interrupted
    assert aged(out.getvalue()).splitlines() == [
        "NAME    READY   UP-TO-DATE   AVAILABLE   AGE",
        "nginx   0/3     0            0           #s",
        "nginx   0/5     0            0           #s",
    ]
    watch = api.requests[-1]
    assert watch.url.params["watch"] == "true"
    scaled = await api.find(deployment("nginx"))  # the watch starts at the list, before the scale
    assert int(watch.url.params["resourceVersion"]) < int(scaled["metadata"]["resourceVersion"])


@LEFT_EARLY
async def test_get_watch_ends_on_an_expired_resource_version(api: CliApi, run: Run) -> None:
    """Writes and a compaction between the list and its watch: the server answers the watch
    with an ERROR event (410 Expired), which -w prints as kubectl does, and stops."""
    await api.add(deployment("nginx"))
    store = api.h.server.store

    async def expire(request: httpx.Request) -> None:
        api.net.before_watch = None
        await api.add(deployment("web"))
        await store.compact(await store.current_revision())

    api.net.before_watch = expire
    rc, out, err = await run("get", "deploy", "-w")
    assert rc == 1
    assert aged(out).splitlines() == [
        "NAME    READY   UP-TO-DATE   AVAILABLE   AGE",
        "nginx   0/3     0            0           #s",
    ]
    assert err.startswith("Error from server (Expired): too old resource version")


# ---- errors -----------------------------------------------------------------------------------


async def test_errors_print_like_kubectl(api: CliApi, run: Run, tmp_path: Path) -> None:
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
    wrong = tmp_path / "wrong-token.yaml"
    wrong.write_text(api.h.kubeconfig.read_text().replace(api.h.token, "not-a-token"))
    assert await run("get", "pods", kubeconfig=wrong) == (
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


async def test_apply_is_idempotent(api: CliApi, run: Run, tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    f = tmp_path / "m" / "app.yaml"
    f.write_text(yaml.safe_dump(deployment()) + "---\n" + yaml.safe_dump(pod("web", "c")) + "---\n")
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
    assert (await api.find(deployment()))["spec"]["replicas"] == 5
    req, body = api.bodies("PATCH")[-1]
    assert req.headers["content-type"] == "application/apply-patch+yaml"
    assert req.url.params["fieldManager"] == "orchestrator-cli"
    assert req.url.params["force"] == "false"
    assert body["metadata"]["namespace"] == "default"


async def test_apply_errors(run: Run, tmp_path: Path) -> None:
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
    assert await run("apply", "-f", str(f)) == (
        1,
        "",
        f'error when creating "{f}": The Deployment "invalid" is invalid: spec.replicas: '
        "Invalid value: -1: must be greater than or equal to 0\n",
    )


async def test_delete_and_scale(api: CliApi, run: Run, tmp_path: Path) -> None:
    await api.add(deployment("nginx"))
    await api.add(deployment("web"))
    assert await run("scale", "deploy/nginx", "--replicas=5") == (
        0,
        "deployment.apps/nginx scaled\n",
        "",
    )
    req, body = api.bodies("PATCH")[-1]
    assert req.url.path.endswith("/deployments/nginx/scale")
    assert req.headers["content-type"] == "application/merge-patch+json"
    assert body == {"spec": {"replicas": 5}}
    assert (await api.find(deployment("nginx")))["spec"]["replicas"] == 5
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
    assert await run("get", "deploy") == (0, "", "No resources found in default namespace.\n")


# ---- describe / logs --------------------------------------------------------------------------


async def test_describe_renders_object_and_events(api: CliApi, run: Run) -> None:
    dep = await api.add(deployment("nginx", annotations={"deployment.kubernetes.io/revision": "2"}))
    uid = dep["metadata"]["uid"]
    await api.add(
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
            "lastTimestamp": dep["metadata"]["creationTimestamp"],
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
    assert f"  Creation Timestamp:  {dep['metadata']['creationTimestamp']}" in lines
    assert "  Replicas:                   3" in lines
    assert "      app:  nginx" in lines  # label maps keep their keys
    i = lines.index("Events:")
    assert lines[i + 1].split() == ["Type", "Reason", "Age", "From", "Message"]
    assert lines[i + 3].split()[:2] == ["Normal", "ScalingReplicaSet"]
    assert lines[i + 3].endswith("deployment-controller  Scaled up replica set nginx-7c5 to 3")
    q = api.requests[-1].url.params
    assert q["fieldSelector"] == (
        f"involvedObject.name=nginx,involvedObject.namespace=default,involvedObject.uid={uid}"
    )


async def test_logs_picks_the_container(api: CliApi, run: Run) -> None:
    """Which container's log is asked for, and how; the text itself comes from the pod's node
    agent (tests/agent/test_agent_containerd.py), and here no node runs the pod."""
    await api.add(pod("web", "app", "sidecar"))
    rc, out, err = await run("logs", "web", "--tail", "2")
    assert (rc, out) == (1, "")
    assert err.splitlines()[0] == 'Defaulted container "app" out of: app, sidecar'
    q = api.requests[-1].url
    assert q.path == "/api/v1/namespaces/default/pods/web/log"
    assert (q.params["container"], q.params["tailLines"]) == ("app", "2")
    assert err.splitlines()[1] == (
        'Error from server (BadRequest): container "app" in pod "web" is waiting to start: '
        "ContainerCreating"
    )
    rc, out, err = await run("logs", "pod/web", "-c", "sidecar", "-f")
    assert rc == 1
    assert not err.startswith("Defaulted")
    q = api.requests[-1].url
    assert (q.params["container"], q.params["follow"]) == ("sidecar", "true")
    assert await run("logs", "web", "-c", "nope") == (
        1,
        "",
        "error: container nope is not valid for pod web\n",
    )


# ---- api-resources / explain ------------------------------------------------------------------


async def test_api_resources(run: Run) -> None:
    rc, out, _ = await run("api-resources")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"]
    assert lines[0].startswith("NAME                        SHORTNAMES   APIVERSION   ")
    rows = [line.split() for line in lines[1:]]
    for row in (
        ["pods", "po", "v1", "true", "Pod"],
        ["namespaces", "ns", "v1", "false", "Namespace"],
        ["secrets", "v1", "true", "Secret"],  # no short name: an empty cell
        ["deployments", "deploy", "apps/v1", "true", "Deployment"],
    ):
        assert row in rows
    groups = [row[-3] for row in rows]
    assert groups.index("v1") < groups.index("apps/v1")  # the core group first
    rc, out, _ = await run("api-resources", "--namespaced", "false", "-o", "name")
    assert out.splitlines() == [
        "namespaces",
        "nodes",
        "customresourcedefinitions.apiextensions.k8s.io",
    ]


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
        "    How old pods are replaced by new ones.",
        "    ",
        "FIELDS:",
        "  rollingUpdate\t<RollingUpdateDeployment>",
        "    Bounds for a rolling update.",
        "",
        "  type\t<string>",
        "  enum: Recreate, RollingUpdate",
        "    Recreate or RollingUpdate (default).",
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
