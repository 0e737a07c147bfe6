"""`scale TYPE/NAME --replicas=N` (or `scale TYPE NAME`): a merge patch on the scale subresource.

Like kubectl: `PATCH .../NAME/scale` with `{"spec":{"replicas":N}}` as
`application/merge-patch+json`, no field manager; prints `deployment.apps/nginx scaled`.
"""

from __future__ import annotations

import argparse
from typing import Any

from orchestrator.cli.kube._common import CommandError, Session, format_api_error, split_targets
from orchestrator.client import MERGE_PATCH, ApiException


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("scale", parents=[common], help="set the replicas of a scalable resource")
    p.add_argument("targets", nargs="+", metavar="RESOURCE", help="TYPE/NAME... or TYPE NAME...")
    p.add_argument("--replicas", type=int, required=True)


async def scale(s: Session, args: argparse.Namespace) -> int:
    if args.replicas < 0:
        raise CommandError("The --replicas=COUNT flag is required, and COUNT must be >= 0")
    targets, _ = split_targets(args.targets)
    rc = 0
    for t, names in targets:
        res = await s.resolve(t)
        if not names:
            raise CommandError("resource(s) were provided, but no name was specified")
        if "scale" not in res.subresources and res.subresources:
            raise CommandError(f"{res.group_resource} cannot be scaled (no scale subresource)")
        for name in names:
            body = {"spec": {"replicas": args.replicas}}
            try:
                await s.client.patch(
                    res, name, body, s.ns_for(res), content_type=MERGE_PATCH, subresource="scale"
                )
            except ApiException as exc:
                s.eprint(format_api_error(exc))
                rc = 1
                continue
            s.print(f"{res.kind_ref}/{name} scaled")
    return rc
