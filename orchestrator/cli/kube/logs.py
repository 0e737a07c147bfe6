"""`logs POD|TYPE/NAME [-c C] [-f] [--tail N] [--timestamps] [--previous] [--since S]`.

Reads the `pods/log` subresource. Like kubectl it first GETs the pod to pick the container:
`-c`, else the `kubectl.kubernetes.io/default-container` annotation, else the first container
(saying so on stderr when there are several). `deploy/NAME` (or any type with a
`spec.selector.matchLabels`) picks the first pod the selector matches. With `-f` the body is
streamed and written as it arrives until the server ends it or the user interrupts.
"""

from __future__ import annotations

import argparse
import codecs
from typing import Any

from orchestrator.cli.kube._common import CommandError, Session, label_selector, parse_duration
from orchestrator.client import PODS
from orchestrator.kube.objects import Obj

DEFAULT_CONTAINER = "kubectl.kubernetes.io/default-container"


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("logs", parents=[common], help="print a container's logs")
    p.add_argument("pod", metavar="POD | TYPE/NAME")
    p.add_argument("-c", "--container")
    p.add_argument("-f", "--follow", action="store_true")
    p.add_argument("--tail", type=int, default=-1, help="last N lines (-1: all)")
    p.add_argument("--timestamps", action="store_true")
    p.add_argument("-p", "--previous", action="store_true")
    p.add_argument("--since", help="only newer than this duration (5s, 2m, 3h)")
    p.add_argument("--limit-bytes", type=int)


def pick_container(pod: Obj, wanted: str | None) -> tuple[str, str | None]:
    """The container to read and, when it was chosen for the user, a note for stderr."""
    spec = pod.get("spec") or {}
    names = [str(c.get("name")) for c in spec.get("containers") or []]
    pod_name = (pod.get("metadata") or {}).get("name", "")
    if wanted:
        init = [str(c.get("name")) for c in spec.get("initContainers") or []]
        if wanted not in names + init:
            raise CommandError(f"container {wanted} is not valid for pod {pod_name}")
        return wanted, None
    annotated = ((pod.get("metadata") or {}).get("annotations") or {}).get(DEFAULT_CONTAINER)
    if annotated in names:
        return str(annotated), None
    if not names:
        raise CommandError(f"pod {pod_name} has no containers")
    note = None
    if len(names) > 1:
        note = f'Defaulted container "{names[0]}" out of: {", ".join(names)}'
    return names[0], note


async def _pod_for(s: Session, target: str) -> Obj:
    t, sep, name = target.partition("/")
    if not sep:
        return dict(await s.client.get(PODS, target, s.namespace))
    res = await s.resolve(t)
    if res.group == "" and res.plural == "pods":
        return dict(await s.client.get(PODS, name, s.namespace))
    owner = await s.client.get(res, name, s.ns_for(res))
    sel = label_selector(((owner.get("spec") or {}).get("selector") or {}).get("matchLabels"))
    if not sel:
        raise CommandError(f"cannot find the pods of {res.kind_ref}/{name} (no selector)")
    pods = (await s.client.list(PODS, s.namespace, label_selector=sel)).get("items") or []
    if not pods:
        raise CommandError(f"no pods found for {res.kind_ref}/{name}")
    return dict(sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp", ""))[0])


async def logs(s: Session, args: argparse.Namespace) -> int:
    pod = await _pod_for(s, args.pod)
    container, note = pick_container(pod, args.container)
    if note:
        s.eprint(note)
    name = str(pod["metadata"]["name"])
    params: dict[str, Any] = {"container": container}
    if args.tail >= 0:
        params["tailLines"] = args.tail
    if args.timestamps:
        params["timestamps"] = True
    if args.previous:
        params["previous"] = True
    if args.since:
        params["sinceSeconds"] = max(1, int(parse_duration(args.since)))
    if args.limit_bytes:
        params["limitBytes"] = args.limit_bytes
    path = PODS.path(s.namespace, name, "log")
    if not args.follow:
        text = await s.client.request("GET", path, params=params, accept="*/*")
        if text:
            s.out.write(text if isinstance(text, str) else str(text))
            s.out.flush()
        return 0
    params["follow"] = True
    decoder = codecs.getincrementaldecoder("utf-8")("replace")  # chunks may split characters
    async with s.client.stream("GET", path, params=params, accept="*/*") as chunks:
        async for chunk in chunks:
            s.out.write(decoder.decode(chunk))
            s.out.flush()
    s.out.write(decoder.decode(b"", final=True))
    return 0
