"""`apply -f FILE|DIR|-` (server-side apply) and `delete TYPE NAME... | -f FILE`.

Apply is always **server-side apply**: per object `GET` (the previous resourceVersion, or 404),
then `PATCH` with `application/apply-patch+yaml`, `fieldManager=orchestrator-cli`,
`fieldValidation=Strict` and `force=false` unless `--force-conflicts` (kubectl's default: a
field another manager owns is a 409 Conflict the user must decide on, never silently taken).
The printed outcome is a pure function of the two resourceVersions (`apply_outcome`): no
previous object → `created`; same resourceVersion → `unchanged` (the server wrote nothing, so
applying the same manifest twice is idempotent); else `configured`. A server that refuses to
create through apply (404 on the PATCH) gets a `POST` instead.

Manifests: files, directories (`*.yaml`, `*.yml`, `*.json`; `-R` recurses) or `-` for stdin;
multi-document YAML (`yaml.safe_load_all`), `kind: List` items flattened, empty documents
skipped. Objects are applied in file order, so a CRD before its CRs works (discovery is read
again when a kind is unknown).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from orchestrator.cli.kube._common import (
    FIELD_MANAGER,
    CommandError,
    Session,
    format_api_error,
    split_targets,
)
from orchestrator.client import APPLY_PATCH, ApiException
from orchestrator.kube.objects import Obj

EXTENSIONS = (".yaml", ".yml", ".json")


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    a = sub.add_parser("apply", parents=[common], help="create or update from manifests (SSA)")
    a.add_argument("-f", "--filename", action="append", required=True, help="file, dir or -")
    a.add_argument("-R", "--recursive", action="store_true", help="recurse into directories")
    a.add_argument(
        "--force-conflicts", action="store_true", help="take over fields other managers own"
    )
    a.add_argument("--field-manager", default=FIELD_MANAGER)

    d = sub.add_parser("delete", parents=[common], help="delete resources by name or manifest")
    d.add_argument("targets", nargs="*", metavar="RESOURCE", help="TYPE NAME... or TYPE/NAME...")
    d.add_argument("-f", "--filename", action="append", help="file, dir or -")
    d.add_argument("-R", "--recursive", action="store_true")
    d.add_argument("-l", "--selector", help="delete everything matching this label selector")
    d.add_argument("--ignore-not-found", action="store_true")
    d.add_argument(
        "--cascade",
        choices=["background", "foreground", "orphan"],
        default="background",
        help="how dependents go (propagationPolicy)",
    )


# ---- manifests (pure but for reading files) ----------------------------------------------------


def manifest_files(paths: list[str], recursive: bool) -> list[str]:
    out: list[str] = []
    for p in paths:
        if p == "-":
            out.append(p)
            continue
        path = Path(p)
        if path.is_dir():
            pattern = "**/*" if recursive else "*"
            found = sorted(str(f) for f in path.glob(pattern) if f.suffix in EXTENSIONS)
            out.extend(found)
        elif path.exists():
            out.append(p)
        else:
            raise CommandError(f'the path "{p}" does not exist')
    return out


def parse_manifests(text: str, source: str) -> list[Obj]:
    """Objects of a multi-document YAML/JSON text, `List`s flattened, each checked for identity."""
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise CommandError(f'error parsing "{source}": {exc}') from exc
    out: list[Obj] = []
    for doc in docs:
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise CommandError(f'error validating "{source}": a document is not a mapping')
        items = doc.get("items") if str(doc.get("kind", "")).endswith("List") else None
        for obj in items if isinstance(items, list) else [doc]:
            missing = [k for k in ("apiVersion", "kind") if not obj.get(k)]
            if missing:
                what = ", ".join(f"{k} not set" for k in missing)
                raise CommandError(f'error validating "{source}": error validating data: [{what}]')
            if not (obj.get("metadata") or {}).get("name"):
                raise CommandError(
                    f'error validating "{source}": {obj["kind"]} has no metadata.name'
                )
            out.append(obj)
    return out


def load_manifests(paths: list[str], recursive: bool) -> list[tuple[str, Obj]]:
    out: list[tuple[str, Obj]] = []
    for f in manifest_files(paths, recursive):
        text = sys.stdin.read() if f == "-" else Path(f).read_text()
        out += [(f, o) for o in parse_manifests(text, "STDIN" if f == "-" else f)]
    return out


def apply_outcome(previous_rv: str | None, new_rv: str | None) -> str:
    """What `apply` prints for one object, from the resourceVersions before and after."""
    if previous_rv is None:
        return "created"
    return "unchanged" if new_rv == previous_rv else "configured"


def _namespace(s: Session, obj: Obj, namespaced: bool, source: str) -> str | None:
    if not namespaced:
        return None
    ns = (obj.get("metadata") or {}).get("namespace")
    if ns and s.explicit_namespace and ns != s.namespace:
        raise CommandError(
            f'the namespace from the provided object "{ns}" does not match the namespace '
            f"\"{s.namespace}\". You must pass '--namespace={ns}' to perform this operation."
        )
    return str(ns or s.namespace)


# ---- apply ------------------------------------------------------------------------------------


async def apply(s: Session, args: argparse.Namespace) -> int:
    objs = load_manifests(args.filename, args.recursive)
    if not objs:
        raise CommandError("no objects passed to apply")
    rc = 0
    for source, obj in objs:
        res = await s.for_kind(str(obj["apiVersion"]), str(obj["kind"]))
        name = str(obj["metadata"]["name"])
        ns = _namespace(s, obj, res.namespaced, source)
        body = dict(obj)
        if ns:
            body["metadata"] = {**obj["metadata"], "namespace": ns}
        params = {
            "fieldManager": args.field_manager,
            "fieldValidation": "Strict",
            "force": bool(args.force_conflicts),
        }
        try:
            prev_rv: str | None = None
            try:
                prev = await s.client.get(res, name, ns)
                prev_rv = str((prev.get("metadata") or {}).get("resourceVersion"))
            except ApiException as exc:
                if exc.code != 404:
                    raise
            try:
                new = await s.client.patch(
                    res, name, body, ns, content_type=APPLY_PATCH, params=params
                )
            except ApiException as exc:
                if exc.code != 404 or prev_rv is not None:
                    raise
                create_params = {"fieldManager": args.field_manager, "fieldValidation": "Strict"}
                new = await s.client.create(res, body, ns, params=create_params)
        except ApiException as exc:
            rc = 1
            verb = "creating" if prev_rv is None else "patching"
            msg = format_api_error(exc, f'error when {verb} "{source}": ')
            if exc.code == 409 and exc.reason == "Conflict" and not args.force_conflicts:
                msg += " (re-run with --force-conflicts to take these fields over)"
            if exc.code == 415:
                msg = "error: Server-side apply not available on the server"
            s.eprint(msg)
            continue
        new_rv = (
            (new.get("metadata") or {}).get("resourceVersion") if isinstance(new, dict) else None
        )
        outcome = apply_outcome(prev_rv, None if new_rv is None else str(new_rv))
        s.print(f"{res.kind_ref}/{name} {outcome}")
    return rc


# ---- delete -----------------------------------------------------------------------------------


async def delete(s: Session, args: argparse.Namespace) -> int:
    policy = args.cascade.capitalize()
    work: list[tuple[Any, str, str | None]] = []  # (res, name, namespace)
    if args.filename:
        if args.targets:
            raise CommandError("give either TYPE NAME... or -f FILE, not both")
        for source, obj in load_manifests(args.filename, args.recursive):
            res = await s.for_kind(str(obj["apiVersion"]), str(obj["kind"]))
            ns = _namespace(s, obj, res.namespaced, source)
            work.append((res, str(obj["metadata"]["name"]), ns))
    else:
        targets, _ = split_targets(args.targets)
        for t, names in targets:
            res = await s.resolve(t)
            if not names:
                if not args.selector:
                    raise CommandError(
                        "resource(s) were provided, but no name was specified (use NAME, "
                        "-l SELECTOR or -f FILE)"
                    )
                lst = await s.client.list(res, s.ns_for(res), label_selector=args.selector)
                names = [str(i["metadata"]["name"]) for i in lst.get("items") or []]
                if not names:
                    s.eprint("No resources found")
            work += [(res, n, s.ns_for(res)) for n in names]
    rc = 0
    for res, name, ns in work:
        try:
            await s.client.delete(res, name, ns, propagation_policy=policy)
        except ApiException as exc:
            if exc.code == 404 and args.ignore_not_found:
                continue
            s.eprint(format_api_error(exc))
            rc = 1
            continue
        s.print(f'{res.kind_ref} "{name}" deleted')
    return rc
