"""`explain TYPE[.field.path] [--recursive]`: field documentation from the server's OpenAPI v3.

Like kubectl: resolve TYPE by discovery, `GET /openapi/v3` (the index), then the GV document
at its `serverRelativeURL`; find the schema in `components.schemas` whose
`x-kubernetes-group-version-kind` list holds the kind's GVK; walk the field path through
`properties`, following `$ref`, single-element `allOf` wrappers and array `items`. Output:

    GROUP:      apps            (left out for the core group)
    KIND:       Deployment
    VERSION:    v1

    FIELD: strategy <DeploymentStrategy>

    DESCRIPTION:
        ...
    FIELDS:
      rollingUpdate\t<RollingUpdateDeployment>
        ...

Schema walking and rendering are pure (`find_kind_schema`, `walk`, `render`).
"""

from __future__ import annotations

import argparse
import textwrap
from typing import Any

from orchestrator.cli.kube._common import CommandError, Session
from orchestrator.client import ApiException
from orchestrator.kube.objects import Obj


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("explain", parents=[common], help="documentation of a resource's fields")
    p.add_argument("target", metavar="TYPE[.field.path]")
    p.add_argument("--recursive", action="store_true", help="list nested fields too")


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def deref(doc: Obj, schema: Obj) -> Obj:
    """Follow `$ref` and single `allOf` wrappers; keep the outer description if there is one."""
    seen = 0
    out = schema
    while seen < 50:
        seen += 1
        if "$ref" in out:
            target = (doc.get("components") or {}).get("schemas", {}).get(_ref_name(out["$ref"]))
            if target is None:
                raise CommandError(f"the OpenAPI document has no schema {out['$ref']}")
            desc = out.get("description")
            out = {**target, **({"description": desc} if desc else {})}
        elif (
            isinstance(out.get("allOf"), list)
            and len(out["allOf"]) == 1
            and not out.get("properties")
        ):
            inner = dict(out["allOf"][0])
            desc = out.get("description")
            rest = {k: v for k, v in out.items() if k != "allOf"}
            out = {**inner, **rest}
            if desc:
                out["description"] = desc
        else:
            return out
    raise CommandError("the OpenAPI document has a reference cycle")


def type_name(schema: Obj) -> str:
    """`<DeploymentStrategy>`-style names: refs by their last segment, arrays as `[]T`."""
    if "$ref" in schema:
        return _ref_name(schema["$ref"]).rsplit(".", 1)[-1]
    all_of = schema.get("allOf")
    if isinstance(all_of, list) and len(all_of) == 1 and "$ref" in all_of[0]:
        return type_name(all_of[0])
    t = schema.get("type")
    if t == "array":
        return "[]" + type_name(schema.get("items") or {})
    if t == "object" or (t is None and "properties" in schema):
        ap = schema.get("additionalProperties")
        if isinstance(ap, dict) and ap:
            return f"map[string]{type_name(ap)}"
        return "Object"
    if t == "string" and schema.get("format") in ("int-or-string",):
        return "IntOrString"
    if schema.get("x-kubernetes-int-or-string"):
        return "IntOrString"
    return str(t or "Object")


def find_kind_schema(doc: Obj, group: str, version: str, kind: str) -> tuple[str, Obj]:
    for name, schema in ((doc.get("components") or {}).get("schemas") or {}).items():
        gvks = schema.get("x-kubernetes-group-version-kind") or []
        if isinstance(gvks, dict):
            gvks = [gvks]
        for g in gvks:
            if (g.get("group", ""), g.get("version"), g.get("kind")) == (group, version, kind):
                return name, schema
    gv = f"{group}/{version}" if group else version
    raise CommandError(f'couldn\'t find resource for "{gv}, Kind={kind}"')


def walk(doc: Obj, root: Obj, path: list[str]) -> tuple[Obj, Obj, bool]:
    """The schema at `path` (as written, its type source) and whether it is required."""
    current = root
    written = root
    required = False
    for i, f in enumerate(path):
        node = deref(doc, current)
        while node.get("type") == "array" and "properties" not in node:
            node = deref(doc, node.get("items") or {})
        props = node.get("properties") or {}
        if f not in props:
            where = ".".join(path[:i]) or "the top level"
            raise CommandError(f'field "{f}" does not exist (in {where})')
        required = f in (node.get("required") or [])
        written = props[f]
        current = written
    return deref(doc, current), written, required


def _wrap(text: str, indent: int, width: int = 80) -> list[str]:
    pad = " " * indent
    out: list[str] = []
    for para in (text or "").split("\n"):
        if not para.strip():
            out.append(pad.rstrip())
            continue
        out += textwrap.wrap(para, width=width - indent, initial_indent=pad, subsequent_indent=pad)
    return out


def _fields(doc: Obj, schema: Obj, indent: int, recursive: bool, depth: int = 0) -> list[str]:
    node = schema
    while node.get("type") == "array" and "properties" not in node:
        node = deref(doc, node.get("items") or {})
    props = node.get("properties") or {}
    req = set(node.get("required") or [])
    out: list[str] = []
    for name in sorted(props):
        sub = props[name]
        line = " " * indent + f"{name}\t<{type_name(sub)}>"
        if name in req:
            line += " -required-"
        out.append(line)
        if recursive:
            if depth < 15:
                out += _fields(doc, deref(doc, sub), indent + 2, True, depth + 1)
            continue
        target = deref(doc, sub)
        enum = target.get("enum") or sub.get("enum")
        if enum:
            out.append(" " * indent + "enum: " + ", ".join(str(e) for e in enum))
        out += _wrap(str(target.get("description") or sub.get("description") or ""), indent + 2)
        out.append("")
    return out


def render(
    doc: Obj, group: str, version: str, kind: str, path: list[str], recursive: bool = False
) -> list[str]:
    _, root = find_kind_schema(doc, group, version, kind)
    schema, written, required = walk(doc, root, path)
    lines = []
    if group:
        lines.append(f"GROUP:      {group}")
    lines += [f"KIND:       {kind}", f"VERSION:    {version}", ""]
    if path:
        head = f"FIELD: {path[-1]} <{type_name(written)}>"
        lines += [head + (" -required-" if required else ""), ""]
    enum = schema.get("enum")
    lines.append("DESCRIPTION:")
    lines += _wrap(str(schema.get("description") or "<empty>"), 4)
    if enum:
        lines.append("    ENUM:")
        lines += [f"    {e}" for e in enum]
    fields = _fields(doc, schema, 2, recursive)
    if fields:
        lines += ["    ", "FIELDS:", *fields]
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


async def explain(s: Session, args: argparse.Namespace) -> int:
    type_text, *path = args.target.split(".")
    # `deployment.apps.spec` style is ambiguous; kubectl treats the first segment as the type.
    res = await s.resolve(type_text)
    try:
        index = await s.client.request("GET", "/openapi/v3")
    except ApiException as exc:
        if exc.code == 404:
            raise CommandError("the server has no OpenAPI v3 document (/openapi/v3)") from exc
        raise
    key = f"apis/{res.group}/{res.version}" if res.group else f"api/{res.version}"
    entry = ((index or {}).get("paths") or {}).get(key)
    if not entry:
        raise CommandError(
            f'couldn\'t find resource for "{res.api_version}, Resource={res.plural}"'
        )
    doc = await s.client.request("GET", entry.get("serverRelativeURL") or f"/openapi/v3/{key}")
    for line in render(doc, res.group, res.version, res.kind, path, args.recursive):
        s.print(line)
    return 0
