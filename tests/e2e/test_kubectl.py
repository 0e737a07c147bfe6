"""End to end: the real kubectl binary against one real `orchestrator server` process.

One server (a one-member `Cluster`, simulated runtime, no node agent, so no controllers: pods
stay Pending and Deployments get no status) serves the whole module. Each test works in its own
namespace (named after the test) and with its own kubectl `--cache-dir`, so tests do not see
each other's objects or discovery caches and may run in any order.

What is asserted is what a user sees: exit codes, and stdout/stderr verbatim where kubectl's
output is stable (tables are compared cell by cell, since column widths follow the content and
`AGE` follows the clock). Waits poll with a deadline; nothing sleeps for a fixed time.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio
import yaml
from cluster import Cluster, ServerProc
from kubectlrun import Kubectl, kubectl_binary, parse_table, shipped_kubectls, wait_api_ready

pytestmark = pytest.mark.slow

AGE = re.compile(r"^\d+(s|m\d*s?|h\d*m?|d\d*h?)$")

DEPLOYMENT = textwrap.dedent(
    """\
    apiVersion: apps/v1
    kind: Deployment
    metadata:
      name: nginx
      labels:
        app: nginx
    spec:
      replicas: 2
      selector:
        matchLabels:
          app: nginx
      template:
        metadata:
          labels:
            app: nginx
        spec:
          containers:
          - name: nginx
            image: nginx:1.26
            ports:
            - containerPort: 80
    """
)

CRD = textwrap.dedent(
    """\
    apiVersion: apiextensions.k8s.io/v1
    kind: CustomResourceDefinition
    metadata:
      name: widgets.example.com
    spec:
      group: example.com
      scope: Namespaced
      names:
        plural: widgets
        singular: widget
        kind: Widget
        shortNames: [wd]
      versions:
      - name: v1
        served: true
        storage: true
        subresources:
          status: {}
        additionalPrinterColumns:
        - name: Size
          type: integer
          jsonPath: .spec.size
        schema:
          openAPIV3Schema:
            type: object
            properties:
              spec:
                type: object
                description: The desired widget.
                properties:
                  size:
                    type: integer
                    minimum: 1
                    description: How big the widget is.
                  color:
                    type: string
              status:
                type: object
                properties:
                  phase:
                    type: string
    """
)


def widget(name: str, spec: str) -> str:
    body = textwrap.indent(textwrap.dedent(spec), "  ")
    return f"apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: {name}\nspec:\n{body}"


# ---------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    kubectl_binary()  # fail before starting anything if kubectl is missing
    root = tmp_path_factory.mktemp("kubectl-e2e")
    # The API on its own (no controllers, no nodes): what the objects look like is what was
    # written, so the expectations are exact.
    args = ["--runtime", "simulated", "--no-agent", "--no-controllers"]
    with Cluster(root, size=1, extra_args=args) as cluster:
        cluster.start()
        wait_api_ready(cluster, 0)
        yield cluster.servers[0]
        cluster.check_alive()


@pytest.fixture
def kube(server: ServerProc, tmp_path: Path) -> Kubectl:
    """kubectl without a namespace, with this test's own discovery cache."""
    return Kubectl(kubectl_binary(), server.kubeconfig, tmp_path / "kube-cache", tmp_path)


@pytest.fixture
def k(kube: Kubectl, request: pytest.FixtureRequest) -> Kubectl:
    """kubectl in a fresh namespace named after the test."""
    ns = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:63].strip("-")
    manifest = kube.write(
        "namespace.yaml", f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n"
    )
    assert kube.ok("create", "-f", manifest) == f"namespace/{ns} created\n"
    return kube.with_namespace(ns)


def apply_nginx(k: Kubectl) -> str:
    out = k.ok("apply", "-f", k.write("nginx.yaml", DEPLOYMENT))
    assert out == "deployment.apps/nginx created\n"
    return "nginx.yaml"


# ---------------------------------------------------------------------------------- 1. get
def test_apply_deployment_then_get_in_every_output(k: Kubectl) -> None:
    apply_nginx(k)

    wide = parse_table(k.ok("get", "deploy", "-o", "wide"))
    assert list(wide[0]) == [
        "NAME",
        "READY",
        "UP-TO-DATE",
        "AVAILABLE",
        "AGE",
        "CONTAINERS",
        "IMAGES",
        "SELECTOR",
    ]
    assert len(wide) == 1
    row = wide[0]
    assert AGE.match(row.pop("AGE")), row
    assert row == {
        "NAME": "nginx",
        "READY": "0/2",
        "UP-TO-DATE": "0",
        "AVAILABLE": "0",
        "CONTAINERS": "nginx",
        "IMAGES": "nginx:1.26",
        "SELECTOR": "app=nginx",
    }
    narrow = parse_table(k.ok("get", "deploy"))
    assert list(narrow[0]) == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]

    doc = k.json("get", "deploy", "nginx")
    assert doc["apiVersion"] == "apps/v1"
    assert doc["kind"] == "Deployment"
    meta = doc["metadata"]
    assert meta["name"] == "nginx"
    assert meta["namespace"] == k.namespace
    assert meta["generation"] == 1
    assert meta["labels"] == {"app": "nginx"}
    assert "kubectl.kubernetes.io/last-applied-configuration" in meta["annotations"]
    assert meta["uid"]
    assert meta["resourceVersion"]
    spec = doc["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"},
    }
    assert spec["revisionHistoryLimit"] == 10
    assert spec["progressDeadlineSeconds"] == 600
    (container,) = spec["template"]["spec"]["containers"]
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert container["ports"] == [{"containerPort": 80, "protocol": "TCP"}]
    assert spec["template"]["spec"]["restartPolicy"] == "Always"

    as_yaml = yaml.safe_load(k.ok("get", "deploy", "nginx", "-o", "yaml"))
    assert as_yaml == doc

    listed = k.json("get", "deploy")
    assert listed["kind"] == "List"  # kubectl wraps -o json of a list in a v1 List
    assert [item["metadata"]["name"] for item in listed["items"]] == ["nginx"]

    assert k.ok("get", "deploy", "nginx", "-o", "name") == "deployment.apps/nginx\n"
    assert k.ok("get", "deploy", "-o", "name") == "deployment.apps/nginx\n"


# ---------------------------------------------------------------------------------- 2. watch
async def test_get_watch_prints_the_change(k: Kubectl) -> None:
    await trio.to_thread.run_sync(apply_nginx, k)
    with trio.fail_after(60):
        proc = await trio.lowlevel.open_process(
            k.argv("get", "deploy", "-w"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=k.workdir,
            env=k.env(),
        )
        assert proc.stdout is not None
        assert proc.stderr is not None
        stdout = proc.stdout
        lines: list[str] = []
        buf = b""

        async def until(pred: Callable[[list[str]], bool], what: str) -> list[str]:
            """The cells of the first line (read so far or next) that `pred` accepts."""
            nonlocal buf
            while True:
                for line in lines:
                    if pred(line.split()):
                        return line.split()
                data = await stdout.receive_some(65536)
                if not data:
                    raise AssertionError(f"kubectl get -w ended before {what}: {lines!r}")
                buf += data
                *complete, buf = buf.split(b"\n")
                lines.extend(c.decode() for c in complete)

        try:
            header = await until(lambda c: c[:1] == ["NAME"], "the header")
            assert header == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]
            await until(lambda c: c[:2] == ["nginx", "0/2"], "the initial row")

            out = await trio.to_thread.run_sync(k.ok, "scale", "deploy", "nginx", "--replicas=5")
            assert out == "deployment.apps/nginx scaled\n"
            cells = await until(lambda c: c[:2] == ["nginx", "0/5"], "the scaled row")
            assert cells[2:4] == ["0", "0"]
            assert AGE.match(cells[4]), cells
            assert sum(line.split()[:1] == ["NAME"] for line in lines) == 1, lines
        finally:
            proc.terminate()
            await proc.wait()
        stderr = b""
        while chunk := await proc.stderr.receive_some(65536):
            stderr += chunk
    assert stderr == b""


# ---------------------------------------------------------------------------------- 3. describe
def test_describe_deployment(k: Kubectl) -> None:
    apply_nginx(k)
    out = k.ok("describe", "deploy", "nginx")
    fields = {}
    for line in out.splitlines():
        key, sep, value = line.partition(":")
        if sep and not line.startswith(" "):
            fields[key] = value.strip()
    assert fields["Name"] == "nginx"
    assert fields["Namespace"] == k.namespace
    assert fields["Labels"] == "app=nginx"
    assert fields["Selector"] == "app=nginx"
    assert fields["Replicas"] == ("2 desired | 0 updated | 0 total | 0 available | 0 unavailable")
    assert fields["StrategyType"] == "RollingUpdate"
    assert fields["RollingUpdateStrategy"] == "25% max unavailable, 25% max surge"
    assert "Events" in fields
    assert "    Image:         nginx:1.26\n" in out
    assert "    Port:          80/TCP\n" in out


# ---------------------------------------------------------------------------------- 4. scale
def test_scale_with_and_without_preconditions(k: Kubectl) -> None:
    apply_nginx(k)
    replicas = ["get", "deploy", "nginx", "-o", "jsonpath={.spec.replicas}"]

    assert k.ok("scale", "deploy", "nginx", "--replicas=5") == "deployment.apps/nginx scaled\n"
    assert k.ok(*replicas) == "5"

    out = k.ok("scale", "deploy", "nginx", "--current-replicas=5", "--replicas=3")
    assert out == "deployment.apps/nginx scaled\n"
    assert k.ok(*replicas) == "3"

    err = k.fails("scale", "deploy", "nginx", "--current-replicas=99", "--replicas=7")
    assert err == "error: Expected replicas to be 99, was 3\n"
    assert k.ok(*replicas) == "3"

    path = f"/apis/apps/v1/namespaces/{k.namespace}/deployments/nginx/scale"
    scale = json.loads(k.ok("get", "--raw", path))
    assert scale["apiVersion"] == "autoscaling/v1"
    assert scale["kind"] == "Scale"
    assert scale["spec"] == {"replicas": 3}
    assert k.json("get", "deploy", "nginx")["metadata"]["generation"] == 3


# ---------------------------------------------------------------------------------- 5. unchanged
def test_apply_same_manifest_is_unchanged(k: Kubectl) -> None:
    manifest = apply_nginx(k)
    rv = ["get", "deploy", "nginx", "-o", "jsonpath={.metadata.resourceVersion}"]
    before = k.ok(*rv)
    assert k.ok("apply", "-f", manifest) == "deployment.apps/nginx unchanged\n"
    assert k.ok(*rv) == before
    assert k.json("get", "deploy", "nginx")["metadata"]["generation"] == 1


# ---------------------------------------------------------------------------------- 6. configure
def test_apply_changed_image_keeps_ports_and_bumps_generation(k: Kubectl) -> None:
    apply_nginx(k)
    before = k.json("get", "deploy", "nginx")
    changed = k.write("nginx-1.27.yaml", DEPLOYMENT.replace("nginx:1.26", "nginx:1.27"))
    assert k.ok("apply", "-f", changed) == "deployment.apps/nginx configured\n"

    after = k.json("get", "deploy", "nginx")
    (container,) = after["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "nginx:1.27"
    assert container["ports"] == [{"containerPort": 80, "protocol": "TCP"}]
    assert after["metadata"]["generation"] == before["metadata"]["generation"] + 1
    assert int(after["metadata"]["resourceVersion"]) > int(before["metadata"]["resourceVersion"])
    last = json.loads(
        after["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
    )
    assert last["spec"]["template"]["spec"]["containers"][0]["image"] == "nginx:1.27"
    assert k.ok("apply", "-f", changed) == "deployment.apps/nginx unchanged\n"


# ---------------------------------------------------------------------------------- 7. delete
def test_delete_by_file_and_by_name(k: Kubectl) -> None:
    manifest = apply_nginx(k)
    gone = 'Error from server (NotFound): deployments.apps "nginx" not found\n'

    assert k.ok("delete", "-f", manifest) == 'deployment.apps "nginx" deleted\n'
    assert k.fails("get", "deploy", "nginx") == gone

    apply_nginx(k)
    assert k.ok("delete", "deploy", "nginx") == 'deployment.apps "nginx" deleted\n'
    assert k.fails("get", "deploy", "nginx") == gone
    assert k.fails("delete", "deploy", "nginx") == gone
    r = k.run("get", "deploy")
    assert (r.returncode, r.stdout) == (0, "")
    assert r.stderr == f"No resources found in {k.namespace} namespace.\n"


# ---------------------------------------------------------------------------------- 8. discovery
def test_api_resources_and_api_versions(kube: Kubectl) -> None:
    table = parse_table(kube.ok("api-resources"))
    assert list(table[0]) == ["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"]
    rows = {(r["NAME"], r["APIVERSION"]): r for r in table}
    expected = [
        ("pods", "po", "v1", "true", "Pod"),
        ("nodes", "no", "v1", "false", "Node"),
        ("namespaces", "ns", "v1", "false", "Namespace"),
        ("configmaps", "cm", "v1", "true", "ConfigMap"),
        ("secrets", "", "v1", "true", "Secret"),
        ("services", "svc", "v1", "true", "Service"),
        ("serviceaccounts", "sa", "v1", "true", "ServiceAccount"),
        ("events", "ev", "v1", "true", "Event"),
        ("deployments", "deploy", "apps/v1", "true", "Deployment"),
        ("replicasets", "rs", "apps/v1", "true", "ReplicaSet"),
        (
            "customresourcedefinitions",
            "crd,crds",
            "apiextensions.k8s.io/v1",
            "false",
            "CustomResourceDefinition",
        ),
        ("leases", "", "coordination.k8s.io/v1", "true", "Lease"),
        ("endpointslices", "", "discovery.k8s.io/v1", "true", "EndpointSlice"),
    ]
    for name, short, gv, namespaced, kind in expected:
        assert rows.get((name, gv)) == {
            "NAME": name,
            "SHORTNAMES": short,
            "APIVERSION": gv,
            "NAMESPACED": namespaced,
            "KIND": kind,
        }, name
    # subresources are not resources of their own
    assert not [r for r in table if "/" in r["NAME"]]

    cluster_scoped = kube.ok("api-resources", "--namespaced=false", "-o", "name").split()
    assert {"nodes", "namespaces", "customresourcedefinitions.apiextensions.k8s.io"} <= set(
        cluster_scoped
    )
    assert "pods" not in cluster_scoped
    in_all = kube.ok("api-resources", "--categories=all", "-o", "name").split()
    assert {"pods", "services", "deployments.apps", "replicasets.apps"} <= set(in_all)

    versions = kube.ok("api-versions").splitlines()
    assert versions == sorted(versions)
    assert {"v1", "apps/v1", "apiextensions.k8s.io/v1", "coordination.k8s.io/v1"} <= set(versions)


# ---------------------------------------------------------------------------------- 9. explain
def test_explain_builtin_fields(kube: Kubectl) -> None:
    out = kube.ok("explain", "deployment.spec.strategy")
    assert out.startswith("GROUP:      apps\nKIND:       Deployment\nVERSION:    v1\n\n")
    assert "\nFIELD: strategy <DeploymentStrategy>\n" in out
    assert "\nDESCRIPTION:\n" in out
    assert "\nFIELDS:\n" in out
    assert "\n  rollingUpdate\t<RollingUpdateDeployment>\n" in out
    assert "\n  type\t<string>\n" in out

    out = kube.ok("explain", "pods.spec.containers.ports")
    assert out.startswith("KIND:       Pod\nVERSION:    v1\n\n")  # the core group has no GROUP line
    assert "\nFIELD: ports <[]ContainerPort>\n" in out
    assert "\n  containerPort\t<integer> -required-\n" in out
    assert "\n  protocol\t<string>\n" in out

    err = kube.fails("explain", "deployment.spec.nope")
    assert 'field "nope" does not exist' in err


# ---------------------------------------------------------------------------------- 10. CRDs
def test_crd_then_custom_resources(k: Kubectl) -> None:
    assert k.ok("get", "deploy") == ""  # warm the discovery cache before the CRD exists
    out = k.ok("apply", "-f", k.write("crd.yaml", CRD))
    assert out == "customresourcedefinition.apiextensions.k8s.io/widgets.example.com created\n"
    # A separate kubectl right away: its disk cache lacks Widget, which forces a refetch.
    out = k.ok("create", "-f", k.write("w1.yaml", widget("w1", "size: 3\ncolor: red\n")))
    assert out == "widget.example.com/w1 created\n"

    table = parse_table(k.ok("get", "widgets"))
    assert table == [{"NAME": "w1", "SIZE": "3"}]
    assert parse_table(k.ok("get", "wd")) == table
    assert k.ok("get", "widget.example.com", "w1", "-o", "name") == "widget.example.com/w1\n"
    doc = k.json("get", "wd", "w1")
    assert doc["apiVersion"] == "example.com/v1"
    assert doc["kind"] == "Widget"
    assert doc["spec"] == {"size": 3, "color": "red"}

    # the status subresource: writes through it change status only, the main resource ignores it
    out = k.ok(
        "patch",
        "wd",
        "w1",
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"status":{"phase":"Ready"},"spec":{"size":9}}',
    )
    assert out == "widget.example.com/w1 patched\n"
    doc = k.json("get", "wd", "w1")
    assert doc["status"] == {"phase": "Ready"}
    assert doc["spec"]["size"] == 3

    err = k.fails("create", "-f", k.write("w2.yaml", widget("w2", "size: 0\n")))
    assert err == (
        'The Widget "w2" is invalid: spec.size: Invalid value: 0: '
        "must be greater than or equal to 1\n"
    )
    err = k.fails("create", "-f", k.write("w3.yaml", widget("w3", "size: 2\nbogus: true\n")))
    assert err == (
        'Error from server (BadRequest): error when creating "w3.yaml": '
        'strict decoding error: unknown field "spec.bogus"\n'
    )
    assert k.ok("get", "wd", "-o", "name") == "widget.example.com/w1\n"

    out = k.ok("explain", "widget.spec")
    assert out.startswith("GROUP:      example.com\nKIND:       Widget\nVERSION:    v1\n\n")
    assert "\nFIELD: spec <Object>\n" in out
    assert "The desired widget." in out
    assert "\n  size\t<integer>\n    How big the widget is.\n" in out
    assert "\n  color\t<string>\n" in out


# ---------------------------------------------------------------------------------- 11. SSA
def test_server_side_apply_managers_and_conflicts(k: Kubectl) -> None:
    mine = k.write(
        "cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ssa\n"
        "data:\n  key: one\n  mine: kept\n",
    )
    theirs = k.write(
        "cm-other.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ssa\ndata:\n  key: two\n",
    )
    rv = ["get", "cm", "ssa", "-o", "jsonpath={.metadata.resourceVersion}"]

    assert k.ok("apply", "--server-side", "-f", mine) == "configmap/ssa serverside-applied\n"
    before = k.ok(*rv)
    assert k.ok("apply", "--server-side", "-f", mine) == "configmap/ssa serverside-applied\n"
    assert k.ok(*rv) == before, "a no-op apply must not write"

    err = k.fails("apply", "--server-side", "--field-manager=other", "-f", theirs)
    assert 'Apply failed with 1 conflict: conflict with "kubectl"' in err
    assert err.startswith(
        'error: Apply failed with 1 conflict: conflict with "kubectl": .data.key\n'
    )
    assert "--force-conflicts" in err
    assert k.ok(*rv) == before

    out = k.ok("apply", "--server-side", "--field-manager=other", "--force-conflicts", "-f", theirs)
    assert out == "configmap/ssa serverside-applied\n"
    doc = yaml.safe_load(k.ok("get", "cm", "ssa", "-o", "yaml", "--show-managed-fields"))
    assert doc["data"] == {"key": "two", "mine": "kept"}
    managers = {m["manager"]: m for m in doc["metadata"]["managedFields"]}
    assert set(managers) == {"kubectl", "other"}
    assert managers["other"]["operation"] == "Apply"
    assert managers["other"]["fieldsV1"] == {"f:data": {"f:key": {}}}
    assert managers["kubectl"]["fieldsV1"] == {"f:data": {"f:mine": {}}}
    plain = yaml.safe_load(k.ok("get", "cm", "ssa", "-o", "yaml"))
    assert "managedFields" not in plain["metadata"]


# ---------------------------------------------------------------------------------- 12. errors
def test_error_messages(k: Kubectl) -> None:
    assert k.fails("get", "deploy", "nope") == (
        'Error from server (NotFound): deployments.apps "nope" not found\n'
    )
    manifest = apply_nginx(k)
    assert k.fails("create", "-f", manifest) == (
        'Error from server (AlreadyExists): error when creating "nginx.yaml": '
        'deployments.apps "nginx" already exists\n'
    )

    bad = k.write(
        "bad.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: Bad_Name\ndata:\n  a: b\n"
    )
    err = k.fails("apply", "-f", bad)
    assert err.startswith(
        'The ConfigMap "Bad_Name" is invalid: metadata.name: Invalid value: "Bad_Name": '
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters"
    ), err
    assert err.count("\n") == 1

    malformed = k.write(
        "malformed.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n data: [\n"
    )
    err = k.fails("apply", "-f", malformed)
    assert err == (
        "error: error parsing malformed.yaml: error converting YAML to JSON: "
        "yaml: line 4: did not find expected key\n"
    )
    negative = k.write("neg.yaml", DEPLOYMENT.replace("replicas: 2", "replicas: -1"))
    err = k.fails("apply", "-f", negative)
    assert err == (
        'The Deployment "nginx" is invalid: spec.replicas: Invalid value: -1: '
        "must be greater than or equal to 0\n"
    )


# ---------------------------------------------------------------------------------- 13. kinds
KINDS = textwrap.dedent(
    """\
    apiVersion: v1
    kind: Namespace
    metadata:
      name: kinds-e2e
    ---
    apiVersion: v1
    kind: ConfigMap
    metadata:
      name: settings
      namespace: kinds-e2e
    data:
      mode: fast
    ---
    apiVersion: v1
    kind: Secret
    metadata:
      name: creds
      namespace: kinds-e2e
    stringData:
      password: hunter2
    ---
    apiVersion: v1
    kind: Service
    metadata:
      name: web
      namespace: kinds-e2e
    spec:
      selector:
        app: web
      ports:
      - port: 80
        targetPort: 8080
    ---
    apiVersion: v1
    kind: ServiceAccount
    metadata:
      name: robot
      namespace: kinds-e2e
    ---
    apiVersion: coordination.k8s.io/v1
    kind: Lease
    metadata:
      name: lock
      namespace: kinds-e2e
    spec:
      holderIdentity: me
      leaseDurationSeconds: 15
    ---
    apiVersion: v1
    kind: Pod
    metadata:
      name: web
      namespace: kinds-e2e
      labels:
        app: web
    spec:
      containers:
      - name: web
        image: nginx:1.26
    """
)


def test_other_kinds_round_trip(kube: Kubectl) -> None:
    manifest = kube.write("kinds.yaml", KINDS)
    assert kube.ok("apply", "-f", manifest) == (
        "namespace/kinds-e2e created\n"
        "configmap/settings created\n"
        "secret/creds created\n"
        "service/web created\n"
        "serviceaccount/robot created\n"
        "lease.coordination.k8s.io/lock created\n"
        "pod/web created\n"
    )
    k = kube.with_namespace("kinds-e2e")

    (ns,) = parse_table(kube.ok("get", "ns", "kinds-e2e"))
    assert (ns["NAME"], ns["STATUS"]) == ("kinds-e2e", "Active")

    assert k.json("get", "cm", "settings")["data"] == {"mode": "fast"}

    secret = k.json("get", "secret", "creds")
    assert secret["type"] == "Opaque"
    assert secret["data"] == {"password": base64.b64encode(b"hunter2").decode()}
    assert "stringData" not in secret

    svc_table = parse_table(k.ok("get", "svc"))
    assert list(svc_table[0]) == ["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE"]
    (svc,) = svc_table
    assert (svc["NAME"], svc["TYPE"], svc["PORT(S)"]) == ("web", "ClusterIP", "80/TCP")
    (svc_wide,) = parse_table(k.ok("get", "svc", "-o", "wide"))
    assert svc_wide["SELECTOR"] == "app=web"
    svc_doc = k.json("get", "svc", "web")
    assert svc_doc["spec"]["type"] == "ClusterIP"
    assert svc_doc["spec"]["ports"] == [{"port": 80, "protocol": "TCP", "targetPort": 8080}]

    (sa,) = parse_table(k.ok("get", "sa", "robot"))
    assert sa["NAME"] == "robot"
    (lease,) = parse_table(k.ok("get", "lease"))
    assert (lease["NAME"], lease["HOLDER"]) == ("lock", "me")
    assert k.json("get", "lease", "lock")["spec"]["leaseDurationSeconds"] == 15

    pods = parse_table(k.ok("get", "pods"))
    assert list(pods[0]) == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    (pod,) = pods
    assert (pod["NAME"], pod["READY"], pod["STATUS"], pod["RESTARTS"]) == (
        "web",
        "0/1",
        "Pending",
        "0",
    )
    assert k.ok("get", "po", "-o", "name") == "pod/web\n"

    everything = k.ok("get", "all")
    sections = [parse_table(s) for s in everything.split("\n\n") if s.strip()]
    names = sorted(row["NAME"] for section in sections for row in section)
    assert names == ["pod/web", "service/web"]

    # Again: nothing to do, except the Secret, whose `stringData` kubectl always re-sends.
    again = kube.ok("apply", "-f", manifest).splitlines()
    assert again[:2] == ["namespace/kinds-e2e unchanged", "configmap/settings unchanged"]
    assert again[2] in ("secret/creds unchanged", "secret/creds configured")
    assert again[3:] == [
        "service/web unchanged",
        "serviceaccount/robot unchanged",
        "lease.coordination.k8s.io/lock unchanged",
        "pod/web unchanged",
    ]


# ---------------------------------------------------------------------------------- 14. versions
VERSIONS = ["1.27", "1.28", "1.29", "1.30", "1.31", "1.32", "1.33"]


def versioned(kube: Kubectl, version: str) -> Kubectl:
    binary = shipped_kubectls().get(version)
    if binary is None:
        pytest.skip(f"kubectl.{version} is not installed next to kubectl")
    cache = kube.cache_dir.with_name(f"kube-cache-{version}")
    return Kubectl(binary, kube.kubeconfig, cache, kube.workdir, kube.namespace)


def test_oldest_and_newest_kubectl_are_shipped() -> None:
    assert {"1.27", "1.33"} <= set(shipped_kubectls()), shipped_kubectls()


@pytest.mark.parametrize("version", VERSIONS)
def test_kubectl_version_reads(k: Kubectl, version: str) -> None:
    cm = k.write(
        "cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: v\ndata:\n  a: b\n"
    )
    k.ok("apply", "-f", cm)
    kv = versioned(k, version)
    doc = kv.json("get", "cm", "v")
    assert (doc["kind"], doc["data"]) == ("ConfigMap", {"a": "b"})
    names = {r["NAME"] for r in parse_table(kv.ok("api-resources"))}
    assert {"pods", "deployments", "configmaps", "customresourcedefinitions"} <= names


@pytest.mark.parametrize("version", VERSIONS)
def test_kubectl_version_apply_and_explain(k: Kubectl, version: str) -> None:
    kv = versioned(k, version)
    cm = kv.write(
        "cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: v\ndata:\n  a: b\n"
    )
    assert kv.ok("apply", "-f", cm) == "configmap/v created\n"
    assert kv.ok("apply", "-f", cm) == "configmap/v unchanged\n"
    assert kv.json("get", "cm", "v")["data"] == {"a": "b"}
    out = kv.ok("explain", "deployment.spec.strategy")
    assert "KIND:       Deployment" in out
    assert "rollingUpdate" in out


# ---------------------------------------------------------------------------- EndpointSlices
ENDPOINT_SLICE = textwrap.dedent(
    """\
    apiVersion: discovery.k8s.io/v1
    kind: EndpointSlice
    metadata:
      name: web-abc12
      labels:
        kubernetes.io/service-name: web
    addressType: IPv4
    ports:
      - name: http
        port: 8080
    endpoints:
      - addresses: ["10.42.0.2"]
        conditions: {ready: true}
      - addresses: ["10.42.0.3"]
      - addresses: ["10.42.1.2"]
      - addresses: ["10.42.1.3"]
    """
)


def test_endpointslices_get_and_validation(k: Kubectl) -> None:
    """`kubectl get endpointslices` finds the kind by discovery and prints kubectl's columns."""
    manifest = k.write("slice.yaml", ENDPOINT_SLICE)
    assert k.ok("apply", "-f", manifest) == "endpointslice.discovery.k8s.io/web-abc12 created\n"
    (row,) = parse_table(k.ok("get", "endpointslices"))
    assert list(row) == ["NAME", "ADDRESSTYPE", "PORTS", "ENDPOINTS", "AGE"]
    assert row["NAME"] == "web-abc12"
    assert row["ADDRESSTYPE"] == "IPv4"
    assert row["PORTS"] == "8080"
    assert row["ENDPOINTS"] == "10.42.0.2,10.42.0.3,10.42.1.2 + 1 more..."
    got = json.loads(k.ok("get", "endpointslice", "web-abc12", "-o", "json"))
    assert got["ports"] == [{"name": "http", "port": 8080, "protocol": "TCP"}]  # defaults
    assert k.ok("get", "endpointslices", "-l", "kubernetes.io/service-name=web", "-o", "name") == (
        "endpointslice.discovery.k8s.io/web-abc12\n"
    )
    bad = k.write("bad.yaml", ENDPOINT_SLICE.replace("10.42.0.2", "fd00::2"))
    err = k.fails("apply", "-f", bad)
    assert "endpoints[0].addresses[0]" in err
    assert "must be a valid IPv4 address" in err
    changed = k.write("v6.yaml", ENDPOINT_SLICE.replace("addressType: IPv4", "addressType: FQDN"))
    assert "field is immutable" in k.fails("apply", "-f", changed)
