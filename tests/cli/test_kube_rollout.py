"""`rollout`: kubectl's status messages, revision selection for undo, and what is sent (the
commands against the real API server in process, `conftest.py`)."""

from __future__ import annotations

import io
from typing import Any

import pytest
import trio
from conftest import CliApi, Run
from test_kube_cli import deployment, until_printed

from orchestrator.cli.kube._common import CommandError
from orchestrator.cli.kube.rollout import (
    deployment_status,
    history_rows,
    owned_replicasets,
    rollback_patch,
    select_revision,
)

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
            "selector": {"matchLabels": {"app": "nginx", "pod-template-hash": "abc"}},
            "template": {
                "metadata": {"labels": {"app": "nginx", "pod-template-hash": "abc"}},
                "spec": {"containers": [{"name": "nginx", "image": image}]},
            },
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


async def test_undo_restart_history(api: CliApi, run: Run) -> None:
    # As the deployment controller leaves it: its revision annotation exists (the rollback's
    # JSON patch replaces the annotations, as kubectl's does, so they must exist).
    dep = await api.add(deployment(annotations={"deployment.kubernetes.io/revision": "2"}))
    uid = dep["metadata"]["uid"]
    await api.add(rs(1, "nginx:1.25", owner_uid=uid))
    await api.add(rs(2, "nginx:1.26", owner_uid=uid))
    await api.add(rs(5, "evil:1", owner_uid="someone-else"))
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
    template = (await api.find(deployment()))["spec"]["template"]["spec"]
    assert template["containers"][0]["image"] == "nginx:1.25"
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
    restarted = "kubectl.kubernetes.io/restartedAt"
    assert restarted in body["spec"]["template"]["metadata"]["annotations"]
    stored = await api.find(deployment())
    assert restarted in stored["spec"]["template"]["metadata"]["annotations"]
    assert await run("rollout", "undo", "pod/web") == (
        1,
        "",
        'error: no rollout support for "pods" (only deployments)\n',
    )


@LEFT_EARLY
async def test_status_follows_the_watch(api: CliApi, run: Run) -> None:
    """No controllers run: the test writes the status a deployment controller would, one step
    after each message."""
    d = await api.add(deployment())
    await api.patch_status(d, {"observedGeneration": 1, "replicas": 3, "updatedReplicas": 1})
    out = io.StringIO()
    async with trio.open_nursery() as nursery:

        async def status() -> None:
            result = await run("rollout", "status", "deployment/nginx", "--timeout", "1m", out=out)
            assert result[0] == 0, result

        nursery.start_soon(status)
        with trio.fail_after(20):
            await until_printed(out, "1 out of 3 new replicas have been updated")
            await api.patch_status(d, {"updatedReplicas": 3, "availableReplicas": 1})
            await until_printed(out, "1 of 3 updated replicas are available")
            await api.patch_status(d, {"availableReplicas": 3})
    assert out.getvalue().splitlines() == [
        'Waiting for deployment "nginx" rollout to finish: 1 out of 3 new replicas have been '
        "updated...",
        'Waiting for deployment "nginx" rollout to finish: 1 of 3 updated replicas are '
        "available...",
        'deployment "nginx" successfully rolled out',
    ]
    q = api.requests[-1].url.params
    assert q["fieldSelector"] == "metadata.name=nginx"
    assert q["watch"] == "true"


async def test_status_times_out(api: CliApi, run: Run) -> None:
    d = await api.add(deployment())
    await api.patch_status(d, {"replicas": 3, "updatedReplicas": 0})
    rc, _, err = await run("rollout", "status", "deployment/nginx", "--timeout", "1s")
    assert rc == 1
    assert err == "error: timed out waiting for the condition\n"
