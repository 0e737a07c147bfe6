"""The official Python client (`kubernetes==32.x`) against a real `orchestrator server` process.

One server for the module (`--runtime simulated --no-agent`: no controllers, pods stay Pending),
one `ApiClient` built from the kubeconfig the server wrote (never the client's global default).
Each test works in its own namespace so counts and selectors see only its objects. The client is
synchronous, so these are plain test functions; every watch is bounded by `timeout_seconds` or
`_request_timeout` so a server bug fails the test instead of hanging it.

The 410 test compacts the store's history through the server's client port: it runs last in
the file, and every other test only watches from resourceVersions it just read.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from cluster import Cluster, ServerProc
from kubernetes import client, config, dynamic, watch
from kubernetes.client.rest import ApiException

from orchestrator.store.client import StoreClient

pytestmark = pytest.mark.slow

_names = itertools.count(1)
WIDGETS_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.example.com"},
    "spec": {
        "group": "example.com",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
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
                                    "size": {"type": "integer"},
                                    "color": {"type": "string"},
                                },
                            }
                        },
                    }
                },
            }
        ],
    },
}


# ---------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    root = tmp_path_factory.mktemp("pyclient")
    # The API on its own (no controllers, no nodes): what the objects look like is what was
    # written, so the expectations are exact.
    args = ["--runtime", "simulated", "--no-agent", "--no-controllers"]
    with Cluster(root, size=1, extra_args=args) as cluster:
        cluster.start()
        cluster.wait_leader_blocking(within=30)
        proc = cluster.servers[0]
        deadline = time.monotonic() + 30
        while not proc.kubeconfig.exists():  # written once the HTTPS API listens
            cluster.check_alive()
            assert time.monotonic() < deadline, "the server wrote no kubeconfig within 30 s"
            time.sleep(0.05)
        yield proc


@pytest.fixture(scope="module")
def api(server: ServerProc) -> Iterator[client.ApiClient]:
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(server.kubeconfig), client_configuration=cfg)
    with client.ApiClient(cfg) as api_client:
        core = client.CoreV1Api(api_client)
        deadline = time.monotonic() + 30
        while True:  # the default namespace appears once the server's bootstrap wrote it
            try:
                core.read_namespace("default", _request_timeout=5)
                break
            except ApiException:
                assert time.monotonic() < deadline, "namespace default never appeared"
                time.sleep(0.05)
        yield api_client


@pytest.fixture
def ns(api: client.ApiClient) -> str:
    name = f"t{next(_names)}"
    client.CoreV1Api(api).create_namespace({"metadata": {"name": name}})
    return name


@pytest.fixture
def apps(api: client.ApiClient) -> client.AppsV1Api:
    return client.AppsV1Api(api)


@pytest.fixture
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest.fixture
def custom(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


@pytest.fixture
def dyn(api: client.ApiClient, tmp_path: Path) -> dynamic.DynamicClient:
    # The discovery cache goes to tmp_path, not $TMPDIR/osrcp-<md5>.json.
    return dynamic.DynamicClient(api, cache_file=str(tmp_path / "discovery.json"))


def deployment(name: str, *, replicas: int = 2, image: str = "nginx:1.26") -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {"name": "web", "image": image, "ports": [{"containerPort": 80}]}
                    ]
                },
            },
        },
    }


def status_of(exc: ApiException) -> dict[str, Any]:
    """The metav1.Status in an ApiException's body."""
    body: dict[str, Any] = json.loads(exc.body)
    assert body["kind"] == "Status", body
    assert body["apiVersion"] == "v1", body
    assert body["status"] == "Failure", body
    assert body["code"] == exc.status, body
    return body


# ---------------------------------------------------------------------- typed CRUD and errors
def test_deployment_create_read_typed_models(apps: client.AppsV1Api, ns: str) -> None:
    created = apps.create_namespaced_deployment(ns, deployment("web"))
    assert isinstance(created, client.V1Deployment)
    assert created.metadata.generation == 1
    assert created.metadata.uid
    assert created.metadata.creation_timestamp is not None

    got = apps.read_namespaced_deployment("web", ns)
    assert got.metadata.resource_version == created.metadata.resource_version
    assert got.spec.selector.match_labels == {"app": "web"}
    assert got.spec.template.metadata.labels == {"app": "web"}
    (container,) = got.spec.template.spec.containers
    assert (container.name, container.image) == ("web", "nginx:1.26")
    assert [p.container_port for p in container.ports] == [80]
    assert container.ports[0].protocol == "TCP"  # defaulted
    assert got.spec.strategy.type == "RollingUpdate"
    assert got.spec.strategy.rolling_update.max_surge == "25%"
    assert got.spec.strategy.rolling_update.max_unavailable == "25%"

    listed = apps.list_namespaced_deployment(ns)
    assert isinstance(listed, client.V1DeploymentList)
    assert [d.metadata.name for d in listed.items] == ["web"]
    assert int(listed.metadata.resource_version) >= int(got.metadata.resource_version)


def test_errors_are_status_objects(apps: client.AppsV1Api, ns: str) -> None:
    with pytest.raises(ApiException) as missing:
        apps.read_namespaced_deployment("missing", ns)
    assert missing.value.status == 404
    assert missing.value.reason == "Not Found"  # the HTTP reason phrase, as Go sends it
    body = status_of(missing.value)
    assert body["reason"] == "NotFound"
    assert body["message"] == 'deployments.apps "missing" not found'
    assert body["details"] == {"name": "missing", "group": "apps", "kind": "deployments"}

    apps.create_namespaced_deployment(ns, deployment("dup"))
    with pytest.raises(ApiException) as dup:
        apps.create_namespaced_deployment(ns, deployment("dup"))
    assert dup.value.status == 409
    body = status_of(dup.value)
    assert body["reason"] == "AlreadyExists"
    assert body["message"] == 'deployments.apps "dup" already exists'

    bad = deployment("bad")
    bad["spec"]["replicas"] = -1
    with pytest.raises(ApiException) as invalid:
        apps.create_namespaced_deployment(ns, bad)
    assert invalid.value.status == 422
    body = status_of(invalid.value)
    assert body["reason"] == "Invalid"
    assert body["message"].startswith('Deployment.apps "bad" is invalid: spec.replicas:')
    assert body["details"]["kind"] == "Deployment"
    causes = body["details"]["causes"]
    assert [(c["field"], c["reason"]) for c in causes] == [("spec.replicas", "FieldValueInvalid")]


# ---------------------------------------------------------------------- lists
def test_list_label_and_field_selectors(core: client.CoreV1Api, ns: str) -> None:
    tiers = ["front", "back", "db", "front", "back", "db"]
    for i, tier in enumerate(tiers):
        labels = {"tier": tier} | ({"canary": "yes"} if i % 2 else {})
        core.create_namespaced_config_map(
            ns, {"metadata": {"name": f"cm{i}", "labels": labels}, "data": {"i": str(i)}}
        )

    def names(**kwargs: Any) -> list[str]:
        return sorted(c.metadata.name for c in core.list_namespaced_config_map(ns, **kwargs).items)

    assert names() == [f"cm{i}" for i in range(6)]
    assert names(label_selector="tier=front") == ["cm0", "cm3"]
    assert names(label_selector="tier==back") == ["cm1", "cm4"]
    assert names(label_selector="tier!=front") == ["cm1", "cm2", "cm4", "cm5"]
    assert names(label_selector="tier in (front, db)") == ["cm0", "cm2", "cm3", "cm5"]
    assert names(label_selector="tier notin (front,db)") == ["cm1", "cm4"]
    assert names(label_selector="canary") == ["cm1", "cm3", "cm5"]
    assert names(label_selector="!canary") == ["cm0", "cm2", "cm4"]
    assert names(label_selector="canary,tier=back") == ["cm1"]
    assert names(label_selector="nope") == []
    assert names(field_selector="metadata.name=cm4") == ["cm4"]
    assert names(field_selector="metadata.name!=cm4") == ["cm0", "cm1", "cm2", "cm3", "cm5"]
    assert names(field_selector=f"metadata.namespace={ns}", label_selector="tier=db") == [
        "cm2",
        "cm5",
    ]

    with pytest.raises(ApiException) as unsupported:
        names(field_selector="spec.foo=bar")
    assert unsupported.value.status == 400
    body = status_of(unsupported.value)
    assert body["reason"] == "BadRequest"
    assert "field label not supported: spec.foo" in body["message"]

    with pytest.raises(ApiException) as garbage:
        names(label_selector="tier in (front")
    assert garbage.value.status == 400
    status_of(garbage.value)


def test_list_paging_with_limit_and_continue(core: client.CoreV1Api, ns: str) -> None:
    wanted = {f"page-{i:02d}" for i in range(30)}
    for name in sorted(wanted):
        core.create_namespaced_config_map(ns, {"metadata": {"name": name}})

    seen: list[str] = []
    pages = 0
    token: str | None = None
    while True:
        kwargs: dict[str, Any] = {"limit": 7}
        if token:
            kwargs["_continue"] = token
        page = core.list_namespaced_config_map(ns, **kwargs)
        pages += 1
        assert len(page.items) <= 7
        seen += [c.metadata.name for c in page.items]
        token = page.metadata._continue
        if not token:
            break
        assert pages < 20, "paging does not terminate"
    assert pages == 5  # 7 + 7 + 7 + 7 + 2
    assert len(seen) == len(set(seen)) == 30
    assert set(seen) == wanted

    with pytest.raises(ApiException) as bad:
        core.list_namespaced_config_map(ns, limit=5, _continue="not-a-token")
    assert bad.value.status in (400, 410)
    status_of(bad.value)


# ---------------------------------------------------------------------- writes
def test_patch_types(
    apps: client.AppsV1Api, custom: client.CustomObjectsApi, core: client.CoreV1Api, ns: str
) -> None:
    apps.create_namespaced_deployment(ns, deployment("web"))

    # A dict body on a typed patch is a strategic merge patch: containers merge by name, so the
    # container keeps its ports although the patch does not mention them.
    patched = apps.patch_namespaced_deployment(
        "web",
        ns,
        {"spec": {"template": {"spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]}}}},
    )
    (container,) = patched.spec.template.spec.containers
    assert container.image == "nginx:1.27"
    assert [p.container_port for p in container.ports] == [80]
    assert patched.metadata.generation == 2

    # CustomObjectsApi sends merge patches, also for built-in kinds.
    merged = custom.patch_namespaced_custom_object(
        "apps", "v1", ns, "deployments", "web", {"metadata": {"labels": {"team": "edge"}}}
    )
    assert merged["metadata"]["labels"] == {"app": "web", "team": "edge"}
    assert merged["spec"]["template"]["spec"]["containers"][0]["ports"] == [
        {"containerPort": 80, "protocol": "TCP"}
    ]

    # A list body is a JSON patch.
    jp = apps.patch_namespaced_deployment(
        "web",
        ns,
        [
            {"op": "test", "path": "/spec/replicas", "value": 2},
            {"op": "replace", "path": "/spec/replicas", "value": 4},
            {"op": "add", "path": "/metadata/annotations", "value": {"note": "json-patch"}},
        ],
    )
    assert jp.spec.replicas == 4
    assert jp.metadata.annotations == {"note": "json-patch"}

    # A failing `test` op changes nothing.
    before = apps.read_namespaced_deployment("web", ns).metadata.resource_version
    with pytest.raises(ApiException) as failed:
        apps.patch_namespaced_deployment(
            "web", ns, [{"op": "test", "path": "/spec/replicas", "value": 99}]
        )
    assert 400 <= failed.value.status < 500
    status_of(failed.value)
    assert apps.read_namespaced_deployment("web", ns).metadata.resource_version == before

    # Strategic merge patch directives on a ConfigMap's data map.
    core.create_namespaced_config_map(
        ns, {"metadata": {"name": "cfg"}, "data": {"a": "1", "b": "2"}}
    )
    cm = core.patch_namespaced_config_map("cfg", ns, {"data": {"a": None, "c": "3"}})
    assert cm.data == {"b": "2", "c": "3"}


def test_replace_with_stale_resource_version_conflicts(apps: client.AppsV1Api, ns: str) -> None:
    apps.create_namespaced_deployment(ns, deployment("web"))
    stale = apps.read_namespaced_deployment("web", ns)
    apps.patch_namespaced_deployment("web", ns, {"spec": {"replicas": 3}})

    stale.spec.replicas = 5
    with pytest.raises(ApiException) as conflict:
        apps.replace_namespaced_deployment("web", ns, stale)
    assert conflict.value.status == 409
    body = status_of(conflict.value)
    assert body["reason"] == "Conflict"
    assert body["message"] == (
        'Operation cannot be fulfilled on deployments.apps "web": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )
    assert apps.read_namespaced_deployment("web", ns).spec.replicas == 3

    fresh = apps.read_namespaced_deployment("web", ns)
    fresh.spec.replicas = 5
    replaced = apps.replace_namespaced_deployment("web", ns, fresh)
    assert replaced.spec.replicas == 5
    assert int(replaced.metadata.resource_version) > int(fresh.metadata.resource_version)


def test_scale_subresource(apps: client.AppsV1Api, ns: str) -> None:
    apps.create_namespaced_deployment(ns, deployment("web", replicas=2))
    scale = apps.read_namespaced_deployment_scale("web", ns)
    assert isinstance(scale, client.V1Scale)
    assert (scale.kind, scale.api_version) == ("Scale", "autoscaling/v1")
    assert scale.spec.replicas == 2
    assert scale.status.selector == "app=web"

    scaled = apps.patch_namespaced_deployment_scale("web", ns, {"spec": {"replicas": 5}})
    assert scaled.spec.replicas == 5
    assert apps.read_namespaced_deployment("web", ns).spec.replicas == 5
    assert apps.read_namespaced_deployment_scale("web", ns).spec.replicas == 5

    current = apps.read_namespaced_deployment_scale("web", ns)
    current.spec.replicas = 1
    assert apps.replace_namespaced_deployment_scale("web", ns, current).spec.replicas == 1

    current.spec.replicas = 7  # `current` now carries a stale resourceVersion
    with pytest.raises(ApiException) as conflict:
        apps.replace_namespaced_deployment_scale("web", ns, current)
    assert conflict.value.status == 409
    assert apps.read_namespaced_deployment("web", ns).spec.replicas == 1


def test_delete_then_not_found(apps: client.AppsV1Api, core: client.CoreV1Api, ns: str) -> None:
    apps.create_namespaced_deployment(ns, deployment("web"))
    apps.delete_namespaced_deployment("web", ns)
    with pytest.raises(ApiException) as gone:
        apps.read_namespaced_deployment("web", ns)
    assert gone.value.status == 404
    assert status_of(gone.value)["message"] == 'deployments.apps "web" not found'
    with pytest.raises(ApiException) as again:
        apps.delete_namespaced_deployment("web", ns)
    assert again.value.status == 404

    core.create_namespaced_config_map(ns, {"metadata": {"name": "a", "labels": {"x": "1"}}})
    core.create_namespaced_config_map(ns, {"metadata": {"name": "b", "labels": {"x": "1"}}})
    core.create_namespaced_config_map(ns, {"metadata": {"name": "c"}})
    core.delete_collection_namespaced_config_map(ns, label_selector="x=1")
    assert [c.metadata.name for c in core.list_namespaced_config_map(ns).items] == ["c"]


def test_dry_run_stores_nothing(apps: client.AppsV1Api, core: client.CoreV1Api, ns: str) -> None:
    rv_before = core.list_namespaced_config_map(ns).metadata.resource_version
    dry = core.create_namespaced_config_map(
        ns, {"metadata": {"name": "dry"}, "data": {"k": "v"}}, dry_run="All"
    )
    assert dry.metadata.name == "dry"
    assert dry.data == {"k": "v"}
    with pytest.raises(ApiException) as missing:
        core.read_namespaced_config_map("dry", ns)
    assert missing.value.status == 404
    assert core.list_namespaced_config_map(ns).items == []

    live = apps.create_namespaced_deployment(ns, deployment("web"))
    dry_patch = apps.patch_namespaced_deployment(
        "web", ns, {"spec": {"replicas": 9}}, dry_run="All"
    )
    assert dry_patch.spec.replicas == 9
    after = apps.read_namespaced_deployment("web", ns)
    assert after.spec.replicas == 2
    assert after.metadata.resource_version == live.metadata.resource_version

    apps.delete_namespaced_deployment("web", ns, dry_run="All")
    assert apps.read_namespaced_deployment("web", ns).metadata.uid == live.metadata.uid
    assert int(rv_before) < int(live.metadata.resource_version)


def test_status_subresource_and_generation(apps: client.AppsV1Api, ns: str) -> None:
    created = apps.create_namespaced_deployment(ns, deployment("web"))
    assert created.metadata.generation == 1

    with_status = apps.patch_namespaced_deployment_status(
        "web", ns, {"status": {"replicas": 2, "observedGeneration": 1}}
    )
    assert with_status.status.replicas == 2
    assert with_status.status.observed_generation == 1
    assert with_status.spec.replicas == 2
    assert with_status.metadata.generation == 1  # status writes never bump generation

    # The status endpoint ignores spec changes.
    only_status = apps.patch_namespaced_deployment_status(
        "web", ns, {"spec": {"replicas": 7}, "status": {"readyReplicas": 1}}
    )
    assert only_status.spec.replicas == 2
    assert only_status.status.ready_replicas == 1

    # The main endpoint ignores status changes.
    main = apps.patch_namespaced_deployment("web", ns, {"status": {"replicas": 99}})
    assert main.status.replicas == 2
    assert main.metadata.generation == 1

    # Metadata-only changes keep the generation; spec changes bump it.
    labelled = apps.patch_namespaced_deployment("web", ns, {"metadata": {"labels": {"x": "y"}}})
    assert labelled.metadata.generation == 1
    assert int(labelled.metadata.resource_version) > int(main.metadata.resource_version)
    bumped = apps.patch_namespaced_deployment("web", ns, {"spec": {"replicas": 3}})
    assert bumped.metadata.generation == 2
    unchanged = apps.patch_namespaced_deployment("web", ns, {"spec": {"replicas": 3}})
    assert unchanged.metadata.generation == 2
    assert unchanged.metadata.resource_version == bumped.metadata.resource_version

    # Replacing the whole object with a status in it: status ignored, spec taken.
    obj = apps.read_namespaced_deployment("web", ns)
    obj.spec.replicas = 4
    obj.status.replicas = 42
    replaced = apps.replace_namespaced_deployment("web", ns, obj)
    assert (replaced.spec.replicas, replaced.status.replicas) == (4, 2)
    assert replaced.metadata.generation == 3


# ---------------------------------------------------------------------- CRDs, dynamic client, SSA
@pytest.fixture(scope="module")
def widgets_crd(api: client.ApiClient) -> str:
    ext = client.ApiextensionsV1Api(api)
    created = ext.create_custom_resource_definition(WIDGETS_CRD)
    assert created.metadata.name == "widgets.example.com"
    deadline = time.monotonic() + 10
    while True:
        crd = ext.read_custom_resource_definition("widgets.example.com")
        conditions = {c.type: c.status for c in (crd.status.conditions or [])}
        if conditions.get("Established") == "True":
            break
        assert time.monotonic() < deadline, f"CRD not established: {conditions}"
        time.sleep(0.05)
    assert crd.status.accepted_names.kind == "Widget"
    assert crd.status.stored_versions == ["v1"]
    return "widgets.example.com"


def widget(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": spec,
    }


def test_custom_objects_api(custom: client.CustomObjectsApi, widgets_crd: str, ns: str) -> None:
    gvp = ("example.com", "v1", ns, "widgets")
    created = custom.create_namespaced_custom_object(*gvp, widget("w1", size=1, color="red"))
    assert created["metadata"]["generation"] == 1
    assert created["spec"] == {"size": 1, "color": "red"}
    custom.create_namespaced_custom_object(*gvp, widget("w2", size=2, color="blue"))

    got = custom.get_namespaced_custom_object(*gvp, "w1")
    assert (got["apiVersion"], got["kind"]) == ("example.com/v1", "Widget")
    listed = custom.list_namespaced_custom_object(*gvp)
    assert listed["kind"] == "WidgetList"
    assert sorted(i["metadata"]["name"] for i in listed["items"]) == ["w1", "w2"]
    cluster_wide = custom.list_cluster_custom_object("example.com", "v1", "widgets")
    assert {(i["metadata"]["namespace"], i["metadata"]["name"]) for i in cluster_wide["items"]} >= {
        (ns, "w1"),
        (ns, "w2"),
    }

    patched = custom.patch_namespaced_custom_object(*gvp, "w1", {"spec": {"size": 5}})
    assert patched["spec"] == {"size": 5, "color": "red"}
    assert patched["metadata"]["generation"] == 2

    # Pruning: fields not in the schema are dropped (or rejected with Strict validation).
    pruned = custom.patch_namespaced_custom_object(*gvp, "w1", {"spec": {"bogus": 1}})
    assert "bogus" not in pruned["spec"]

    custom.delete_namespaced_custom_object(*gvp, "w1")
    with pytest.raises(ApiException) as gone:
        custom.get_namespaced_custom_object(*gvp, "w1")
    assert gone.value.status == 404
    assert status_of(gone.value)["message"] == 'widgets.example.com "w1" not found'


def test_dynamic_client(dyn: dynamic.DynamicClient, widgets_crd: str, ns: str) -> None:
    deployments = dyn.resources.get(api_version="apps/v1", kind="Deployment")
    dyn_dep = deployments.create(body=deployment("web"), namespace=ns)
    assert dyn_dep.spec.selector.matchLabels.app == "web"
    # The DynamicClient's default patch type is strategic merge: ports survive.
    patched = deployments.patch(
        name="web",
        namespace=ns,
        body={"spec": {"template": {"spec": {"containers": [{"name": "web", "image": "x:2"}]}}}},
    )
    (container,) = patched.spec.template.spec.containers
    assert container.image == "x:2"
    assert container.ports[0].containerPort == 80

    widgets = dyn.resources.get(api_version="example.com/v1", kind="Widget")
    start = widgets.get(namespace=ns).metadata.resourceVersion
    widgets.create(body=widget("d1", size=1), namespace=ns)
    assert widgets.get(name="d1", namespace=ns).spec.size == 1
    assert [w.metadata.name for w in widgets.get(namespace=ns).items] == ["d1"]
    merged = widgets.patch(
        name="d1",
        namespace=ns,
        body={"spec": {"color": "red"}},
        content_type="application/merge-patch+json",
    )
    assert merged.spec.color == "red"
    assert merged.spec.size == 1

    # Strategic merge patch is for built-in kinds only: on a custom resource it is a 415.
    with pytest.raises(ApiException) as smp:
        widgets.patch(name="d1", namespace=ns, body={"spec": {"size": 2}})
    assert smp.value.status == 415
    assert status_of(smp.value)["reason"] == "UnsupportedMediaType"

    widgets.delete(name="d1", namespace=ns)
    with pytest.raises(dynamic.exceptions.NotFoundError):
        widgets.get(name="d1", namespace=ns)

    # The DynamicClient's watch sees the whole history since `start`, in order.
    w = watch.Watch()
    seen = []
    for ev in widgets.watch(namespace=ns, resource_version=start, timeout=5, watcher=w):
        seen.append((ev["type"], ev["object"].metadata.name, ev["object"].spec.size))
        if len(seen) == 3:
            w.stop()
    assert seen == [("ADDED", "d1", 1), ("MODIFIED", "d1", 1), ("DELETED", "d1", 1)]


def test_server_side_apply_managers_and_conflicts(
    dyn: dynamic.DynamicClient, widgets_crd: str, ns: str
) -> None:
    widgets = dyn.resources.get(api_version="example.com/v1", kind="Widget")
    body = widget("ssa", size=1, color="red")
    body["metadata"]["namespace"] = ns

    created = widgets.server_side_apply(body=body, namespace=ns, field_manager="alice")
    assert created.spec.size == 1
    managers = {m.manager: m.operation for m in created.metadata.managedFields}
    assert managers == {"alice": "Apply"}

    # Applying the same manifest again is a no-op.
    again = widgets.server_side_apply(body=body, namespace=ns, field_manager="alice")
    assert again.metadata.resourceVersion == created.metadata.resourceVersion

    # bob applies alice's value for a field: both own it, both managers listed.
    bob_body = widget("ssa", color="red")  # same value as alice: shared, no conflict
    bob_body["metadata"]["namespace"] = ns
    shared = widgets.server_side_apply(body=bob_body, namespace=ns, field_manager="bob")
    assert {m.manager for m in shared.metadata.managedFields} == {"alice", "bob"}

    # bob changes alice's field: 409 Conflict naming alice and the field.
    bob_body["spec"] = {"size": 3}
    with pytest.raises(ApiException) as conflict:
        widgets.server_side_apply(body=bob_body, namespace=ns, field_manager="bob")
    assert conflict.value.status == 409
    status = status_of(conflict.value)
    assert status["reason"] == "Conflict"
    assert status["message"].startswith("Apply failed with 1 conflict")
    assert [(c["reason"], c["field"]) for c in status["details"]["causes"]] == [
        ("FieldManagerConflict", ".spec.size")
    ]
    assert 'conflict with "alice"' in status["details"]["causes"][0]["message"]
    assert widgets.get(name="ssa", namespace=ns).spec.size == 1

    forced = widgets.server_side_apply(
        body=bob_body, namespace=ns, field_manager="bob", force_conflicts=True
    )
    assert forced.spec.size == 3
    assert forced.spec.color == "red"  # still alice's
    owners = {m["manager"]: m["fieldsV1"] for m in forced.to_dict()["metadata"]["managedFields"]}
    assert owners["bob"]["f:spec"] == {"f:size": {}}  # bob's apply no longer names color
    assert owners["alice"]["f:spec"] == {"f:color": {}}  # size was taken from alice

    # A typed built-in through SSA: created with 201, then a second manager conflicts.
    deployments = dyn.resources.get(api_version="apps/v1", kind="Deployment")
    dep = deployment("applied")
    dep["metadata"]["namespace"] = ns
    applied = deployments.server_side_apply(body=dep, namespace=ns, field_manager="kubectl")
    assert applied.spec.replicas == 2
    dep["spec"]["replicas"] = 4
    with pytest.raises(ApiException) as dep_conflict:
        deployments.server_side_apply(body=dep, namespace=ns, field_manager="other")
    assert dep_conflict.value.status == 409
    forced_dep = deployments.server_side_apply(
        body=dep, namespace=ns, field_manager="other", force_conflicts=True
    )
    assert forced_dep.spec.replicas == 4
    assert forced_dep.spec.template.spec.containers[0].ports[0].containerPort == 80


# ---------------------------------------------------------------------- watch
def _config_map_events(
    core: client.CoreV1Api, ns: str, rv: str, want: int, **kwargs: Any
) -> tuple[list[tuple[str, str, str]], watch.Watch]:
    """Up to `want` (type, name, resourceVersion) events from a watch starting after `rv`."""
    w = watch.Watch()
    out: list[tuple[str, str, str]] = []
    for ev in w.stream(
        core.list_namespaced_config_map, ns, resource_version=rv, timeout_seconds=5, **kwargs
    ):
        obj = ev["raw_object"]
        out.append(
            (ev["type"], obj["metadata"].get("name", ""), obj["metadata"]["resourceVersion"])
        )
        if len(out) == want:
            w.stop()
    return out, w


def test_watch_in_order_and_resume(core: client.CoreV1Api, ns: str) -> None:
    start = core.list_namespaced_config_map(ns).metadata.resource_version
    a = core.create_namespaced_config_map(ns, {"metadata": {"name": "a"}})
    b = core.patch_namespaced_config_map("a", ns, {"data": {"k": "v"}})
    core.delete_namespaced_config_map("a", ns)

    events, w = _config_map_events(core, ns, start, 3)
    assert [(t, n) for t, n, _ in events] == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]
    rvs = [int(rv) for _, _, rv in events]
    assert rvs[0] == int(a.metadata.resource_version)
    assert rvs[1] == int(b.metadata.resource_version)
    assert rvs[0] < rvs[1] < rvs[2]  # DELETED carries the deleting revision
    assert w.resource_version == str(rvs[2])

    # Resume from the last seen resourceVersion: only later changes, none twice, none lost.
    names = [f"r{i}" for i in range(5)]
    for name in names:
        core.create_namespaced_config_map(ns, {"metadata": {"name": name}})
    first, w1 = _config_map_events(core, ns, str(rvs[2]), 2)
    second, _ = _config_map_events(core, ns, w1.resource_version, 3)
    seen = first + second
    assert [(t, n) for t, n, _ in seen] == [("ADDED", n) for n in names]
    revs = [int(rv) for _, _, rv in seen]
    assert revs == sorted(set(revs))

    # A label-filtered watch: an object that stops matching is DELETED for that watcher.
    rv = core.list_namespaced_config_map(ns).metadata.resource_version
    core.create_namespaced_config_map(ns, {"metadata": {"name": "l", "labels": {"w": "1"}}})
    core.create_namespaced_config_map(ns, {"metadata": {"name": "other"}})
    core.patch_namespaced_config_map("l", ns, {"metadata": {"labels": {"w": "2"}}})
    filtered, _ = _config_map_events(core, ns, rv, 2, label_selector="w=1")
    assert [(t, n) for t, n, _ in filtered] == [("ADDED", "l"), ("DELETED", "l")]


def test_watch_from_zero_lists_current_objects(core: client.CoreV1Api, ns: str) -> None:
    for name in ("x", "y"):
        core.create_namespaced_config_map(ns, {"metadata": {"name": name}})
    events, _ = _config_map_events(core, ns, "0", 2)
    assert sorted((t, n) for t, n, _ in events) == [("ADDED", "x"), ("ADDED", "y")]


def test_watch_bookmarks(core: client.CoreV1Api, ns: str) -> None:
    rv = core.list_namespaced_config_map(ns).metadata.resource_version
    w = watch.Watch()
    bookmarks: list[dict[str, Any]] = []
    # The store sends progress notifications every 5 s; the watch asks for bookmarks.
    for ev in w.stream(
        core.list_namespaced_config_map,
        ns,
        resource_version=rv,
        allow_watch_bookmarks=True,
        timeout_seconds=12,
    ):
        assert ev["type"] == "BOOKMARK", ev
        bookmarks.append(ev["raw_object"])
        w.stop()
    assert bookmarks, "no BOOKMARK within 12 s"
    (mark,) = bookmarks
    assert (mark["kind"], mark["apiVersion"]) == ("ConfigMap", "v1")
    assert int(mark["metadata"]["resourceVersion"]) >= int(rv)


def _compact(endpoint: str) -> int:
    from cluster import admin_tls

    async def run() -> int:
        with trio.fail_after(10):
            async with StoreClient([endpoint], tls=admin_tls()) as store:
                revision = await store.revision()
                await store.compact(revision)
                return revision

    return trio.run(run)


def test_watch_expired_after_compaction_then_relist(
    server: ServerProc, core: client.CoreV1Api, ns: str
) -> None:
    """Runs last: compacting the whole store's history affects every resourceVersion so far."""
    old_rv = core.list_namespaced_config_map(ns).metadata.resource_version
    core.create_namespaced_config_map(ns, {"metadata": {"name": "before"}})
    core.create_namespaced_config_map(ns, {"metadata": {"name": "before-2"}})
    compacted = _compact(server.endpoint)
    assert compacted > int(old_rv)

    # Without timeout_seconds the client retries once on the in-stream 410, then raises.
    stream = watch.Watch().stream(
        core.list_namespaced_config_map, ns, resource_version=old_rv, _request_timeout=10
    )
    with pytest.raises(ApiException) as expired:
        list(stream)  # no event may come from an expired resourceVersion
    assert expired.value.status == 410
    assert expired.value.reason.startswith("Expired: too old resource version")

    # With timeout_seconds (no retries) the same ERROR also surfaces as a 410.
    with pytest.raises(ApiException) as once:
        list(
            watch.Watch().stream(
                core.list_namespaced_config_map, ns, resource_version=old_rv, timeout_seconds=5
            )
        )
    assert once.value.status == 410

    # Re-list, then watch from the list's resourceVersion: works, and sees new changes only.
    relist = core.list_namespaced_config_map(ns)
    assert sorted(c.metadata.name for c in relist.items) == ["before", "before-2"]
    new_rv = relist.metadata.resource_version
    assert int(new_rv) >= compacted
    core.create_namespaced_config_map(ns, {"metadata": {"name": "after"}})
    events, _ = _config_map_events(core, ns, new_rv, 1)
    assert [(t, n) for t, n, _ in events] == [("ADDED", "after")]


def test_discovery_v1_endpointslices(api: client.ApiClient, ns: str) -> None:
    """The typed `DiscoveryV1Api` reads and writes EndpointSlices (issue 19)."""
    disc = client.DiscoveryV1Api(api)
    body = client.V1EndpointSlice(
        metadata=client.V1ObjectMeta(name="web-x1", labels={"kubernetes.io/service-name": "web"}),
        address_type="IPv4",
        endpoints=[
            client.V1Endpoint(
                addresses=["10.42.0.2"],
                conditions=client.V1EndpointConditions(ready=True, serving=True),
                node_name="n1",
                target_ref=client.V1ObjectReference(kind="Pod", name="web-0", namespace=ns),
            )
        ],
        ports=[client.DiscoveryV1EndpointPort(name="http", port=8080, protocol="TCP")],
    )
    created = disc.create_namespaced_endpoint_slice(ns, body)
    assert isinstance(created, client.V1EndpointSlice)
    listed = disc.list_namespaced_endpoint_slice(
        ns, label_selector="kubernetes.io/service-name=web"
    )
    (item,) = listed.items
    assert item.address_type == "IPv4"
    assert item.endpoints[0].addresses == ["10.42.0.2"]
    assert item.endpoints[0].conditions.ready is True
    assert item.endpoints[0].target_ref.name == "web-0"
    assert item.ports[0].port == 8080
    disc.delete_namespaced_endpoint_slice("web-x1", ns)
    assert disc.list_namespaced_endpoint_slice(ns).items == []
