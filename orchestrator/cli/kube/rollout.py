"""`rollout status|restart|undo|history deployment/NAME`, as kubectl does them.

* status: `deployment_status` is kubectl's DeploymentStatusViewer (pure): waiting while the
  spec change is unobserved (`generation > observedGeneration`), while updated < desired,
  while old replicas remain, while updated ones are not available; failing on the Progressing
  condition `ProgressDeadlineExceeded`. The driver GETs the object, then watches it by name
  from its resourceVersion (re-watching when the server ends a stream), printing each new
  message, until done or `--timeout` (0 = wait forever).
* restart: strategic merge patch setting the pod template annotation
  `kubectl.kubernetes.io/restartedAt` (fieldManager `kubectl-rollout`) → a new ReplicaSet.
* undo: the ReplicaSets the Deployment controls (ownerReference with its uid and
  `controller: true`), chosen by `deployment.kubernetes.io/revision` (`select_revision`: the
  previous one, or `--to-revision`), then a JSON patch replacing `/spec/template` (without the
  `pod-template-hash` label) and `/metadata/annotations`.
* history: REVISION and CHANGE-CAUSE (`kubernetes.io/change-cause`) of those ReplicaSets.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
from typing import Any

import trio

from orchestrator.cli.kube._common import (
    CommandError,
    Session,
    format_table,
    label_selector,
    parse_duration,
)
from orchestrator.client import JSON_PATCH, REPLICASETS, STRATEGIC_MERGE_PATCH, ResourceInfo
from orchestrator.kube.objects import Obj

REVISION = "deployment.kubernetes.io/revision"
CHANGE_CAUSE = "kubernetes.io/change-cause"
RESTARTED_AT = "kubectl.kubernetes.io/restartedAt"
HASH_LABEL = "pod-template-hash"
REWATCH_DELAY = 1.0  # seconds between a watch the server ended and the next one
# Annotations a rollback does not copy from the ReplicaSet (kubectl's annotationsToSkip).
SKIP_ANNOTATIONS = {
    "kubectl.kubernetes.io/last-applied-configuration",
    REVISION,
    "deployment.kubernetes.io/revision-history",
    "deployment.kubernetes.io/desired-replicas",
    "deployment.kubernetes.io/max-replicas",
    "deprecated.deployment.rollback.to",
}


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    r = sub.add_parser("rollout", help="manage the rollout of a deployment")
    rs = r.add_subparsers(dest="rollout_command", required=True)
    st = rs.add_parser("status", parents=[common], help="wait for the rollout to finish")
    st.add_argument("target", metavar="deployment/NAME")
    st.add_argument("--timeout", default="0s", help="give up after this long (0: never)")
    st.add_argument("-w", "--watch", default="true", choices=["true", "false"])
    u = rs.add_parser("undo", parents=[common], help="roll back to an earlier revision")
    u.add_argument("target", metavar="deployment/NAME")
    u.add_argument("--to-revision", type=int, default=0)
    re_ = rs.add_parser("restart", parents=[common], help="restart all pods (new ReplicaSet)")
    re_.add_argument("target", metavar="deployment/NAME")
    h = rs.add_parser("history", parents=[common], help="revisions and their change causes")
    h.add_argument("target", metavar="deployment/NAME")
    h.add_argument("--revision", type=int, default=0, help="show this revision's pod template")


# ---- pure -------------------------------------------------------------------------------------


def deployment_status(dep: Obj) -> tuple[str, bool]:
    """kubectl's message for a Deployment and whether the rollout is done.

    Raises `CommandError` when the rollout failed (progress deadline exceeded).
    """
    meta, spec, st = dep.get("metadata") or {}, dep.get("spec") or {}, dep.get("status") or {}
    name = meta.get("name", "")
    if int(meta.get("generation") or 0) > int(st.get("observedGeneration") or 0):
        return "Waiting for deployment spec update to be observed...", False
    for c in st.get("conditions") or []:
        if c.get("type") == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded":
            raise CommandError(f'deployment "{name}" exceeded its progress deadline')
    desired = spec.get("replicas", 1)
    updated = int(st.get("updatedReplicas") or 0)
    replicas = int(st.get("replicas") or 0)
    available = int(st.get("availableReplicas") or 0)
    if desired is not None and updated < int(desired):
        return (
            f'Waiting for deployment "{name}" rollout to finish: {updated} out of {desired} '
            "new replicas have been updated...",
            False,
        )
    if replicas > updated:
        return (
            f'Waiting for deployment "{name}" rollout to finish: {replicas - updated} old '
            "replicas are pending termination...",
            False,
        )
    if available < updated:
        return (
            f'Waiting for deployment "{name}" rollout to finish: {available} of {updated} '
            "updated replicas are available...",
            False,
        )
    return f'deployment "{name}" successfully rolled out', True


def owned_replicasets(dep: Obj, rss: list[Obj]) -> list[Obj]:
    uid = (dep.get("metadata") or {}).get("uid")
    return [
        rs
        for rs in rss
        if any(
            o.get("uid") == uid and o.get("controller") is True
            for o in (rs.get("metadata") or {}).get("ownerReferences") or []
        )
    ]


def revision(obj: Obj) -> int | None:
    v = ((obj.get("metadata") or {}).get("annotations") or {}).get(REVISION)
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def select_revision(dep_name: str, rss: list[Obj], to_revision: int = 0) -> Obj:
    """The ReplicaSet to roll back to: `to_revision`, else the second-newest revision."""
    latest: tuple[int, Obj | None] = (-1, None)
    previous: tuple[int, Obj | None] = (-1, None)
    for rs in rss:
        v = revision(rs)
        if v is None:
            continue
        if to_revision:
            if v == to_revision:
                return rs
        elif v > latest[0]:
            previous, latest = latest, (v, rs)
        elif v > previous[0]:
            previous = (v, rs)
    if to_revision:
        raise CommandError(f"unable to find specified revision {to_revision} in history")
    if previous[1] is None:
        raise CommandError(f'no rollout history found for deployment "{dep_name}"')
    return previous[1]


def template_without_hash(template: Obj) -> Obj:
    t = copy.deepcopy(template)
    labels = (t.get("metadata") or {}).get("labels")
    if isinstance(labels, dict):
        labels.pop(HASH_LABEL, None)
    return t


def rollback_patch(dep: Obj, rs: Obj) -> list[Obj] | None:
    """The JSON patch that rolls `dep` back to `rs`'s template; None if it already matches."""
    tmpl = template_without_hash((rs.get("spec") or {}).get("template") or {})
    if tmpl == template_without_hash((dep.get("spec") or {}).get("template") or {}):
        return None
    annotations = dict((dep.get("metadata") or {}).get("annotations") or {})
    for k, v in ((rs.get("metadata") or {}).get("annotations") or {}).items():
        if k not in SKIP_ANNOTATIONS:
            annotations[k] = v
    return [
        {"op": "replace", "path": "/spec/template", "value": tmpl},
        {"op": "replace", "path": "/metadata/annotations", "value": annotations},
    ]


def history_rows(rss: list[Obj]) -> list[list[str]]:
    revs = sorted(
        (v, ((rs.get("metadata") or {}).get("annotations") or {}).get(CHANGE_CAUSE) or "<none>")
        for rs in rss
        if (v := revision(rs)) is not None
    )
    return [["REVISION", "CHANGE-CAUSE"]] + [[str(v), str(c)] for v, c in revs]


# ---- driver -----------------------------------------------------------------------------------


async def _target(s: Session, text: str) -> tuple[ResourceInfo, str]:
    t, sep, name = text.partition("/")
    if not sep or not name:
        raise CommandError(f'expected TYPE/NAME like deployment/nginx, got "{text}"')
    res = await s.resolve(t)
    if (res.group, res.plural) != ("apps", "deployments"):
        raise CommandError(f'no rollout support for "{res.group_resource}" (only deployments)')
    return res, name


async def _owned(s: Session, dep: Obj) -> list[Obj]:
    sel = label_selector(((dep.get("spec") or {}).get("selector") or {}).get("matchLabels"))
    ns = (dep.get("metadata") or {}).get("namespace") or s.namespace
    lst = await s.client.list(REPLICASETS, ns, label_selector=sel or None)
    return owned_replicasets(dep, list(lst.get("items") or []))


async def rollout(s: Session, args: argparse.Namespace) -> int:
    res, name = await _target(s, args.target)
    ns = s.ns_for(res)
    cmd = args.rollout_command
    if cmd == "status":
        timeout = parse_duration(args.timeout)
        with trio.move_on_after(timeout if timeout > 0 else float("inf")) as scope:
            return await _status(s, res, name, ns, follow=args.watch == "true")
        if scope.cancelled_caught:
            raise CommandError("timed out waiting for the condition")
        return 1  # pragma: no cover  (move_on_after either returns or is caught above)
    if cmd == "restart":
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        patch = {"spec": {"template": {"metadata": {"annotations": {RESTARTED_AT: now}}}}}
        await s.client.patch(
            res,
            name,
            patch,
            ns,
            content_type=STRATEGIC_MERGE_PATCH,
            params={"fieldManager": "kubectl-rollout"},
        )
        s.print(f"{res.kind_ref}/{name} restarted")
        return 0
    dep = await s.client.get(res, name, ns)
    rss = await _owned(s, dep)
    if cmd == "history":
        if args.revision:
            rs = select_revision(name, rss, args.revision)
            s.print(f"{res.kind_ref}/{name} with revision #{args.revision}")
            from orchestrator.cli.kube._common import dump

            s.out.write(dump((rs.get("spec") or {}).get("template") or {}, "yaml"))
            return 0
        s.print(f"{res.kind_ref}/{name}")
        for line in format_table(history_rows(rss), padding=2):
            s.print(line)
        return 0
    rs = select_revision(name, rss, args.to_revision)
    patch_ops = rollback_patch(dep, rs)
    if patch_ops is None:
        s.print(
            f"{res.kind_ref}/{name} skipped rollback (current template already matches "
            f"revision {revision(rs)})"
        )
        return 0
    await s.client.patch(res, name, patch_ops, ns, content_type=JSON_PATCH)
    s.print(f"{res.kind_ref}/{name} rolled back")
    return 0


async def _status(s: Session, res: ResourceInfo, name: str, ns: str | None, follow: bool) -> int:
    dep = await s.client.get(res, name, ns)
    last = ""

    def show(obj: Obj) -> bool:
        nonlocal last
        msg, done = deployment_status(obj)
        if msg != last:
            s.print(msg)
            last = msg
        return done

    if show(dep) or not follow:
        return 0
    rv = str((dep.get("metadata") or {}).get("resourceVersion") or "0")
    while True:
        async with s.client.watch(
            res, ns, resource_version=rv, field_selector=f"metadata.name={name}"
        ) as events:
            async for etype, obj in events:
                rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                if etype == "DELETED":
                    raise CommandError(f'deployment "{name}" was deleted')
                if etype in ("ADDED", "MODIFIED") and show(obj):
                    return 0
        await trio.sleep(REWATCH_DELAY)  # the server ended the stream: watch again, gently
