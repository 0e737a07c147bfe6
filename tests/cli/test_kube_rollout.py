"""`rollout`: kubectl's status messages, revision selection for undo, and what is sent."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import trio
from kubefake import FakeApi
from test_kube_cli import KUBECONFIG, deployment

from orchestrator.cli import kube
from orchestrator.cli.kube._common import CommandError
from orchestrator.cli.kube.rollout import (
    deployment_status,
    history_rows,
    owned_replicasets,
    rollback_patch,
    select_revision,
)
from orchestrator.cli.main import _build_parser

# httpx's response streams are async generators (encode/httpx#3686): a stream left early is
# closed by the client, but trio still reports the generator objects as unexhausted at GC.
LEFT_EARLY = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def rs(
    rev: int | None, image: str, owner_uid: str = "dep-uid", controller: bool = True
) -> dict[str, Any]:
    ann = {} if rev is None else {"deployment.kubernetes.io/revision": str(rev)}
    ann["kubernetes.io/change-cause"] = f"set image {image}"
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": f"nginx-{image.replace(':', '').replace('.', '')}",
            "namespace": "default",
            "labels": {"app": "nginx", "pod-template-hash": "abc"},
            "annotations": ann,
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": "nginx",
                    "uid": owner_uid,
                    "controller": controller,
                }
            ],
        },
        "spec": {
            "template": {
                "metadata": {"labels": {"app": "nginx", "pod-template-hash": "abc"}},
                "spec": {"containers": [{"name": "nginx", "image": image}]},
            }
        },
    }


# ---- pure -------------------------------------------------------------------------------------


def test_status_messages_follow_kubectl() -> None:
    d = deployment()
    d["metadata"]["generation"] = 2
    d["status"] = {"observedGeneration": 1}
    assert deployment_status(d) == ("Waiting for deployment spec update to be observed...", False)
    d["status"] = {"observedGeneration": 2, "replicas": 3, "updatedReplicas": 1}
    assert deployment_status(d)[0] == (
        'Waiting for deployment "nginx" rollout to finish: 1 out of 3 new replicas have been '
        "updated..."
    )
    d["status"] = {"observedGeneration": 2, "replicas": 4, "updatedReplicas": 3}
    assert "1 old replicas are pending termination" in deployment_status(d)[0]
    d["status"] = {
        "observedGeneration": 2,
        "replicas": 3,
        "updatedReplicas": 3,
        "availableReplicas": 2,
    }
    assert "2 of 3 updated replicas are available" in deployment_status(d)[0]
    d["status"]["availableReplicas"] = 3
    assert deployment_status(d) == ('deployment "nginx" successfully rolled out', True)
    d["status"]["conditions"] = [
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}
    ]
    with pytest.raises(CommandError, match="exceeded its progress deadline"):
        deployment_status(d)


def test_select_revision_previous_or_explicit() -> None:
    rss = [rs(1, "nginx:1.25"), rs(3, "nginx:1.27"), rs(2, "nginx:1.26"), rs(None, "x")]
    assert (
        select_revision("nginx", rss)["spec"]["template"]["spec"]["containers"][0]["image"]
        == "nginx:1.26"
    )
    assert (
        select_revision("nginx", rss, 1)["metadata"]["annotations"][
            "deployment.kubernetes.io/revision"
        ]
        == "1"
    )
    with pytest.raises(CommandError, match="unable to find specified revision 7 in history"):
        select_revision("nginx", rss, 7)
    with pytest.raises(CommandError, match='no rollout history found for deployment "nginx"'):
        select_revision("nginx", [rs(1, "nginx:1.25")])


def test_owned_and_rollback_patch() -> None:
    dep = deployment()
    dep["metadata"]["uid"] = "dep-uid"
    dep["metadata"]["annotations"] = {"deployment.kubernetes.io/revision": "2"}
    mine, other, weak = rs(1, "a"), rs(2, "b", owner_uid="x"), rs(3, "c", controller=False)
    assert owned_replicasets(dep, [mine, other, weak]) == [mine]
    ops = rollback_patch(dep, mine)
    assert ops is not None
    assert ops[0]["path"] == "/spec/template"
    assert ops[0]["value"]["metadata"]["labels"] == {"app": "nginx"}  # no pod-template-hash
    assert ops[1] == {
        "op": "replace",
        "path": "/metadata/annotations",
        "value": {
            "deployment.kubernetes.io/revision": "2",
            "kubernetes.io/change-cause": "set image a",
        },
    }
    same = rs(1, "nginx:1.26")
    assert rollback_patch(dep, same) is None
    assert history_rows([rs(2, "b"), rs(1, "a")]) == [
        ["REVISION", "CHANGE-CAUSE"],
        ["1", "set image a"],
        ["2", "set image b"],
    ]


# ---- commands ---------------------------------------------------------------------------------


@pytest.fixture
def api() -> FakeApi:
    return FakeApi()


@pytest.fixture
def run(api: FakeApi, tmp_path: Path) -> Any:
    cfg = tmp_path / "kubeconfig.yaml"
    cfg.write_text(KUBECONFIG)

    async def go(*argv: str) -> tuple[int, str, str]:
        args = _build_parser().parse_args([*argv, "--kubeconfig", str(cfg)])
        out, err = io.StringIO(), io.StringIO()
        with trio.fail_after(5):
            rc = await kube.run(args, out=out, err=err, transport=api.transport())
        return rc, out.getvalue(), err.getvalue()

    return go


async def test_undo_restart_history(api: FakeApi, run: Any) -> None:
    dep = api.add(deployment())
    uid = dep["metadata"]["uid"]
    api.add(rs(1, "nginx:1.25", owner_uid=uid))
    api.add(rs(2, "nginx:1.26", owner_uid=uid))
    api.add(rs(5, "evil:1", owner_uid="someone-else"))
    assert await run("rollout", "history", "deployment/nginx") == (
        0,
        "deployment.apps/nginx\nREVISION  CHANGE-CAUSE\n1         set image nginx:1.25\n"
        "2         set image nginx:1.26\n",
        "",
    )
    assert api.requests[-1].url.params["labelSelector"] == "app=nginx"
    assert await run("rollout", "undo", "deploy/nginx") == (
        0,
        "deployment.apps/nginx rolled back\n",
        "",
    )
    req, body = api.bodies("PATCH")[-1]
    assert req.headers["content-type"] == "application/json-patch+json"
    assert body[0]["value"]["spec"]["containers"][0]["image"] == "nginx:1.25"
    image = api.find("apps", "deployments", "default", "nginx")["spec"]["template"]["spec"]  # type: ignore[index]
    assert image["containers"][0]["image"] == "nginx:1.25"
    assert await run("rollout", "undo", "deploy/nginx", "--to-revision", "1") == (
        0,
        "deployment.apps/nginx skipped rollback (current template already matches revision 1)\n",
        "",
    )
    assert await run("rollout", "restart", "deployment/nginx") == (
        0,
        "deployment.apps/nginx restarted\n",
        "",
    )
    req, body = api.bodies("PATCH")[-1]
    assert req.headers["content-type"] == "application/strategic-merge-patch+json"
    assert req.url.params["fieldManager"] == "kubectl-rollout"
    assert (
        "kubectl.kubernetes.io/restartedAt" in body["spec"]["template"]["metadata"]["annotations"]
    )
    assert await run("rollout", "undo", "pod/web") == (
        1,
        "",
        'error: no rollout support for "pods" (only deployments)\n',
    )


@LEFT_EARLY
async def test_status_follows_the_watch(api: FakeApi, run: Any) -> None:
    d = deployment()
    d["metadata"]["generation"] = 1
    d["status"] = {"observedGeneration": 1, "replicas": 3, "updatedReplicas": 1}
    api.add(d)

    def event(updated: int, available: int) -> bytes:
        obj = json.loads(json.dumps(d))
        obj["metadata"]["resourceVersion"] = str(500 + updated + available)
        obj["status"].update(updatedReplicas=updated, availableReplicas=available)
        return json.dumps({"type": "MODIFIED", "object": obj}).encode() + b"\n"

    never_sent = b'{"type":"MODIFIED","object":{}}\n'
    api.watch_lines["deployments"] = [event(3, 1), event(3, 3), never_sent]
    rc, out, _ = await run("rollout", "status", "deployment/nginx", "--timeout", "1m")
    assert rc == 0
    assert out.splitlines() == [
        'Waiting for deployment "nginx" rollout to finish: 1 out of 3 new replicas have been '
        "updated...",
        'Waiting for deployment "nginx" rollout to finish: 1 of 3 updated replicas are '
        "available...",
        'deployment "nginx" successfully rolled out',
    ]
    q = api.requests[-1].url.params
    assert q["fieldSelector"] == "metadata.name=nginx"
    assert q["watch"] == "true"


async def test_status_times_out(api: FakeApi, run: Any, autojump_clock: Any) -> None:
    d = deployment()
    d["status"] = {"replicas": 3, "updatedReplicas": 0}
    api.add(d)
    api.watch_lines["deployments"] = []  # every watch ends at once: re-watch until the timeout

    rc, _, err = await run("rollout", "status", "deployment/nginx", "--timeout", "2s")
    assert rc == 1
    assert err == "error: timed out waiting for the condition\n"
