"""`get TYPE [NAME...] [-n NS | -A] [-l SEL] [-o wide|yaml|json|name] [-w]` and `api-resources`.

Human output asks the server for a Table (`TABLE_ACCEPT`) and prints its cells verbatim:
uppercase headers, columns of `priority` 0 (all with `-o wide`), 3 spaces between columns, a
`NAMESPACE` column first with `-A`, `kind.group/` name prefixes when several types are listed.
A server that answers with a plain List instead gets NAME and AGE columns computed here.
`-w` then watches from the list's resourceVersion and prints one row per event, aligned with
the first table. Empty results print `No resources found in NS namespace.` on stderr.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import trio

from orchestrator.cli.kube._common import (
    CommandError,
    Session,
    age,
    cell,
    column_widths,
    dump,
    format_api_error,
    format_table,
    split_targets,
)
from orchestrator.client import JSON, TABLE_ACCEPT, ApiException, ResourceInfo
from orchestrator.kube.objects import Obj

REWATCH_DELAY = 1.0  # seconds between a watch the server ended and the next one


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    g = sub.add_parser("get", parents=[common], help="list resources (kubectl get)")
    g.add_argument(
        "targets", nargs="+", metavar="RESOURCE", help="TYPE[,TYPE] [NAME...], TYPE/NAME..., or all"
    )
    g.add_argument("-A", "--all-namespaces", action="store_true")
    g.add_argument("-l", "--selector", help="label selector (app=web,tier!=db)")
    g.add_argument("--field-selector", help="field selector (metadata.name=x)")
    g.add_argument("-o", "--output", choices=["wide", "yaml", "json", "name"])
    g.add_argument("-w", "--watch", action="store_true", help="after listing, watch for changes")
    g.add_argument("--show-labels", action="store_true", help="add a LABELS column")

    a = sub.add_parser("api-resources", parents=[common], help="resource types the server has")
    a.add_argument("--namespaced", choices=["true", "false"], help="only (non-)namespaced types")
    a.add_argument("--api-group", help="only this group ('' for core)")
    a.add_argument("-o", "--output", choices=["wide", "name"])


# ---- tables (pure) ----------------------------------------------------------------------------


def table_rows(
    table: Obj,
    *,
    wide: bool,
    namespace_column: bool,
    prefix: str = "",
    show_labels: bool = False,
    header: bool = True,
) -> list[list[str]]:
    """A server Table as printable rows (header first when `header`)."""
    cols = table.get("columnDefinitions") or []
    keep = [i for i, c in enumerate(cols) if wide or not c.get("priority")]
    out: list[list[str]] = []
    if header:
        h = [str(cols[i].get("name", "")).upper() for i in keep]
        if namespace_column:
            h.insert(0, "NAMESPACE")
        if show_labels:
            h.append("LABELS")
        out.append(h)
    for row in table.get("rows") or []:
        cells = row.get("cells") or []
        vals = [cell(cells[i]) if i < len(cells) else "" for i in keep]
        meta = (row.get("object") or {}).get("metadata") or {}
        if prefix and vals:
            vals[0] = prefix + vals[0]
        if namespace_column:
            vals.insert(0, str(meta.get("namespace", "")))
        if show_labels:
            labels = meta.get("labels") or {}
            vals.append(",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "<none>")
        out.append(vals)
    return out


def list_rows(
    items: list[Obj],
    now: float,
    *,
    namespace_column: bool,
    prefix: str = "",
    header: bool = True,
) -> list[list[str]]:
    """NAME/AGE rows for a server that sent no Table."""
    out: list[list[str]] = []
    if header:
        out.append((["NAMESPACE"] if namespace_column else []) + ["NAME", "AGE"])
    for it in items:
        meta = it.get("metadata") or {}
        row = [prefix + str(meta.get("name", "")), age(meta.get("creationTimestamp"), now)]
        out.append(([str(meta.get("namespace", ""))] if namespace_column else []) + row)
    return out


def no_resources(res: ResourceInfo, namespace: str, all_namespaces: bool) -> str:
    if res.namespaced and not all_namespaces:
        return f"No resources found in {namespace} namespace."
    return "No resources found"


# ---- get --------------------------------------------------------------------------------------


async def _fetch(
    s: Session, res: ResourceInfo, names: list[str], args: argparse.Namespace, accept: str
) -> tuple[list[Obj], bool]:
    """The server's answers (Tables or Lists/objects) and whether one name failed."""
    failed = False
    docs: list[Obj] = []
    if names:
        for n in names:
            try:
                docs.append(await s.client.get(res, n, s.ns_for(res), accept=accept))
            except ApiException as exc:
                if exc.code != 404:
                    raise
                s.eprint(format_api_error(exc))
                failed = True
    else:
        docs.append(
            await s.client.list(
                res,
                s.ns_for(res),
                all_namespaces=args.all_namespaces,
                label_selector=args.selector,
                field_selector=args.field_selector,
                accept=accept,
            )
        )
    return docs, failed


def _without_managed_fields(obj: Obj) -> Obj:
    """kubectl hides `metadata.managedFields` unless asked (`--show-managed-fields`)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    return obj


async def _category(s: Session, text: str) -> list[ResourceInfo]:
    """`all` (any category name no resource is called): its resources, in discovery order."""
    m = await s.mapper()
    try:
        m.resolve(text)
        return []
    except LookupError:
        return m.category(text)


def _items(doc: Obj) -> list[Obj]:
    if doc.get("kind") == "Table":
        return [r.get("object") or {} for r in doc.get("rows") or []]
    if isinstance(doc.get("items"), list):
        return list(doc["items"])
    return [doc]


async def get(s: Session, args: argparse.Namespace) -> int:
    targets, _slash = split_targets(args.targets)
    types: list[tuple[ResourceInfo, list[str]]] = []
    for t, names in targets:
        category = await _category(s, t) if not names else []
        types += [(r, []) for r in category] or [(await s.resolve(t), names)]
    if args.watch and len(types) > 1:
        raise CommandError("you may only specify a single resource type with --watch")
    fmt = args.output
    rc = 0
    many = len(types) > 1  # kubectl prefixes names with kind.group/ then
    structured: list[Obj] = []
    printed_any = False
    last_widths: list[int] = []
    last_rv = ""
    for res, names in types:
        accept = TABLE_ACCEPT if fmt in (None, "wide") else JSON
        docs, failed = await _fetch(s, res, names, args, accept)
        rc |= int(failed)
        if docs and not names:
            last_rv = str((docs[0].get("metadata") or {}).get("resourceVersion") or "")
        ns_col = bool(args.all_namespaces and res.namespaced)
        prefix = f"{res.kind_ref}/" if many else ""
        if fmt in ("yaml", "json"):
            for d in docs:
                structured.extend(_without_managed_fields(i) for i in _items(d))
            continue
        if fmt == "name":
            for d in docs:
                for it in _items(d):
                    s.print(f"{res.kind_ref}/{(it.get('metadata') or {}).get('name', '')}")
                    printed_any = True
            continue
        rows: list[list[str]] = []
        for d in docs:
            if d.get("kind") == "Table":
                rows += table_rows(
                    d,
                    wide=fmt == "wide",
                    namespace_column=ns_col,
                    prefix=prefix,
                    show_labels=args.show_labels,
                    header=not rows,
                )
            else:
                rows += list_rows(
                    _items(d), time.time(), namespace_column=ns_col, prefix=prefix, header=not rows
                )
        if len(rows) <= 1:
            if not names and not failed and not many:
                s.eprint(no_resources(res, s.namespace, args.all_namespaces))
            continue
        if printed_any:
            s.print()
        for line in format_table(rows):
            s.print(line)
        last_widths = column_widths(rows)
        printed_any = True
    if many and fmt in (None, "wide") and not printed_any and not rc:
        s.eprint(no_resources(types[0][0], s.namespace, args.all_namespaces))
    if fmt in ("yaml", "json") and structured:
        single = len(types) == 1 and len(types[0][1]) == 1 and len(structured) == 1
        doc: Any = (
            structured[0]
            if single
            else {
                "apiVersion": "v1",
                "kind": "List",
                "items": structured,
                "metadata": {"resourceVersion": ""},
            }
        )
        s.out.write(dump(doc, fmt) + ("\n" if fmt == "json" else ""))
        s.out.flush()
    elif (
        fmt in ("yaml", "json", "name")
        and not (structured or printed_any or rc)
        and not any(n for _, n in types)
    ):
        s.eprint(no_resources(types[0][0], s.namespace, args.all_namespaces))
    if args.watch:
        res, names = types[0]
        await _watch(s, res, names, args, last_rv, last_widths)
    return rc


async def _watch(
    s: Session,
    res: ResourceInfo,
    names: list[str],
    args: argparse.Namespace,
    rv: str,
    widths: list[int],
) -> None:
    fmt = args.output
    accept = TABLE_ACCEPT if fmt in (None, "wide") else JSON
    field_selector = args.field_selector
    if len(names) == 1:
        field_selector = f"metadata.name={names[0]}"
        rv = rv or "0"
    header_done = bool(widths)
    ns_col = bool(args.all_namespaces and res.namespaced)
    cols: Obj = {}
    while True:
        async with s.client.watch(
            res,
            s.ns_for(res),
            all_namespaces=args.all_namespaces,
            resource_version=rv or None,
            label_selector=args.selector,
            field_selector=field_selector,
            accept=accept,
        ) as events:
            async for _etype, obj in events:
                rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                if obj.get("kind") == "Table":
                    if obj.get("columnDefinitions"):
                        cols = obj
                    rows_obj = obj.get("rows") or []
                    if rows_obj:
                        rv = str(
                            ((rows_obj[-1].get("object") or {}).get("metadata") or {}).get(
                                "resourceVersion"
                            )
                            or rv
                        )
                    t = {"columnDefinitions": cols.get("columnDefinitions"), "rows": rows_obj}
                    rows = table_rows(
                        t,
                        wide=fmt == "wide",
                        namespace_column=ns_col,
                        show_labels=args.show_labels,
                        header=not header_done,
                    )
                    header_done = True
                    for line in format_table(rows, widths=widths):
                        s.print(line)
                elif fmt in ("yaml", "json"):
                    text = dump(_without_managed_fields(obj), fmt)
                    s.out.write(text + ("\n" if fmt == "json" else "---\n"))
                    s.out.flush()
                elif fmt == "name":
                    s.print(f"{res.kind_ref}/{(obj.get('metadata') or {}).get('name', '')}")
                else:
                    rows = list_rows(
                        [obj], time.time(), namespace_column=ns_col, header=not header_done
                    )
                    header_done = True
                    for line in format_table(rows, widths=widths):
                        s.print(line)
        # The server ended the stream (its timeout): watch again from the last resourceVersion.
        if not rv:
            return
        await trio.sleep(REWATCH_DELAY)


# ---- api-resources ----------------------------------------------------------------------------


def api_resource_rows(resources: list[ResourceInfo], wide: bool) -> list[list[str]]:
    head = ["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"]
    if wide:
        head += ["VERBS", "CATEGORIES"]
    rows = [head]
    for r in sorted(resources, key=lambda r: r.group):  # stable: discovery order within a group
        row = [r.plural, ",".join(r.short_names), r.api_version, cell(r.namespaced), r.kind]
        if wide:
            row += [",".join(r.verbs), ",".join(r.categories)]
        rows.append(row)
    return rows


async def api_resources(s: Session, args: argparse.Namespace) -> int:
    m = await s.mapper(refresh=True)
    chosen = [
        r
        for r in m.resources
        if r.verbs
        and (r.group, r.version) in m.preferred
        and (args.namespaced is None or r.namespaced == (args.namespaced == "true"))
        and (args.api_group is None or r.group == args.api_group)
    ]
    if args.output == "name":
        for r in sorted(chosen, key=lambda r: r.group):
            s.print(r.group_resource)
    else:
        for line in format_table(api_resource_rows(chosen, args.output == "wide")):
            s.print(line)
    if m.failed:
        gvs = ", ".join(f"{gv}: {msg}" for gv, msg in sorted(m.failed.items()))
        s.eprint(f"error: unable to retrieve the complete list of server APIs: {gvs}")
        return 1
    return 0
