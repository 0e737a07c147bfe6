"""`describe TYPE NAME...`: a readable rendering of an object, then its events.

The rendering is kubectl's generic (unstructured) describer for every kind: `Name`,
`Namespace`, `Labels`, `Annotations` first, then the rest of the object with camelCase keys
spelled as words (`creationTimestamp` → `Creation Timestamp`), nested maps indented by two,
lists of maps item after item, `managedFields` left out. Events come from
`GET /api/v1/namespaces/NS/events?fieldSelector=involvedObject.name=..,involvedObject.namespace=..,
involvedObject.uid=..` and are printed as kubectl does (`Type Reason Age From Message`, ages like
`10s (x3 over 5m)`), or `Events:  <none>`. Everything but the two GETs is pure and takes `now`.
"""

from __future__ import annotations

import argparse
import re
import time
from typing import Any

from orchestrator.cli.kube._common import (
    Session,
    age,
    format_api_error,
    format_table,
    parse_time,
    split_targets,
)
from orchestrator.client import EVENTS, ApiException
from orchestrator.kube.objects import Obj


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    d = sub.add_parser("describe", parents=[common], help="show an object and its events")
    d.add_argument("targets", nargs="+", metavar="RESOURCE", help="TYPE [NAME...] or TYPE/NAME...")


_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z0-9]+")
_SCHEMA_KEY = re.compile(r"^[a-z][a-zA-Z0-9]*$")
_ACRONYMS = {"Uid": "UID", "Ip": "IP", "Ips": "IPs", "Api": "API", "Url": "URL", "Id": "ID"}
_VERBATIM_MAPS = {"labels", "annotations", "matchLabels", "nodeSelector", "data"}
_HEAD = 14  # width of the `Annotations:  ` column, as kubectl's generic describer


def title(key: str) -> str:
    """`creationTimestamp` → `Creation Timestamp`; keys that are not field names stay as is."""
    if not _SCHEMA_KEY.match(key):
        return key
    words = [w[:1].upper() + w[1:] for w in _WORD.findall(key)]
    return " ".join(_ACRONYMS.get(w, w) for w in words)


def _scalar(v: Any) -> str:
    if v is None:
        return "<nil>"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _map_lines(obj: Obj, indent: int, verbatim: bool = False) -> list[str]:
    lines: list[str] = []
    keys = [k for k in obj if k != "managedFields"]
    width = max((len(k if verbatim else title(k)) for k in keys), default=0)
    for k in keys:
        v = obj[k]
        label = k if verbatim else title(k)
        pad = " " * indent
        if isinstance(v, dict):
            if not v:
                continue
            lines.append(f"{pad}{label}:")
            lines += _map_lines(v, indent + 2, verbatim=k in _VERBATIM_MAPS)
        elif isinstance(v, list):
            if not v:
                continue
            lines.append(f"{pad}{label}:")
            for item in v:
                if isinstance(item, dict):
                    lines += _map_lines(item, indent + 2)
                else:
                    lines.append(f"{pad}  {_scalar(item)}")
        else:
            lines.append(f"{pad}{(label + ':').ljust(width + 3)}{_scalar(v)}")
    return lines


def _kv_block(name: str, mapping: Any, sep: str) -> list[str]:
    items = sorted(mapping.items()) if isinstance(mapping, dict) and mapping else []
    if not items:
        return [f"{name + ':':<{_HEAD}}<none>"]
    first, *rest = [f"{k}{sep}{v}" for k, v in items]
    return [f"{name + ':':<{_HEAD}}{first}"] + [f"{'':<{_HEAD}}{line}" for line in rest]


def render_object(obj: Obj) -> list[str]:
    meta = obj.get("metadata") or {}
    lines = [f"{'Name:':<{_HEAD}}{meta.get('name', '')}"]
    if "namespace" in meta:
        lines.append(f"{'Namespace:':<{_HEAD}}{meta['namespace']}")
    lines += _kv_block("Labels", meta.get("labels"), "=")
    lines += _kv_block("Annotations", meta.get("annotations"), ": ")
    rest_meta = {
        k: v for k, v in meta.items() if k not in ("name", "namespace", "labels", "annotations")
    }
    rest: Obj = {}
    for k in ("apiVersion", "kind"):
        if k in obj:
            rest[k] = obj[k]
    if rest_meta:
        rest["metadata"] = rest_meta
    for k, v in obj.items():
        if k not in ("apiVersion", "kind", "metadata"):
            rest[k] = v
    return lines + _map_lines(rest, 0)


def _event_time(ev: Obj) -> Any:
    return (
        ev.get("lastTimestamp")
        or ev.get("eventTime")
        or ev.get("firstTimestamp")
        or (ev.get("metadata") or {}).get("creationTimestamp")
    )


def event_lines(events: list[Obj], now: float) -> list[str]:
    if not events:
        return ["Events:  <none>"]
    evs = sorted(events, key=lambda e: parse_time(_event_time(e)) or 0.0)
    rows = [
        ["Type", "Reason", "Age", "From", "Message"],
        ["----", "------", "----", "----", "-------"],
    ]
    for ev in evs:
        last = age(_event_time(ev), now)
        count = ev.get("count") or (ev.get("series") or {}).get("count") or 1
        first = ev.get("firstTimestamp") or ev.get("eventTime")
        a = f"{last} (x{count} over {age(first, now)})" if count > 1 and first else last
        src = ev.get("source") or {}
        frm = (
            src.get("component")
            or ev.get("reportingComponent")
            or ev.get("reportingController")
            or ""
        )
        if src.get("host"):
            frm = f"{frm}, {src['host']}"
        msg = str(ev.get("message") or ev.get("note") or "").strip()
        rows.append([str(ev.get("type", "")), str(ev.get("reason", "")), a, frm, msg])
    return ["Events:"] + ["  " + line for line in format_table(rows, padding=2)]


async def describe(s: Session, args: argparse.Namespace) -> int:
    targets, _ = split_targets(args.targets)
    rc = 0
    first = True
    for t, names in targets:
        res = await s.resolve(t)
        if not names:
            lst = await s.client.list(res, s.ns_for(res))
            names = [str(i["metadata"]["name"]) for i in lst.get("items") or []]
        for name in names:
            try:
                obj = await s.client.get(res, name, s.ns_for(res))
            except ApiException as exc:
                s.eprint(format_api_error(exc))
                rc = 1
                continue
            meta = obj.get("metadata") or {}
            fs = [f"involvedObject.name={name}"]
            if res.namespaced:
                fs.append(f"involvedObject.namespace={meta.get('namespace', s.namespace)}")
            if meta.get("uid"):
                fs.append(f"involvedObject.uid={meta['uid']}")
            try:
                evs = await s.client.list(
                    EVENTS,
                    meta.get("namespace") if res.namespaced else None,
                    all_namespaces=not res.namespaced,
                    field_selector=",".join(fs),
                    params={"limit": 500},
                )
                events = list(evs.get("items") or [])
            except ApiException:
                events = []  # no events API (or no field selector support): still describe
            if not first:
                s.print()
                s.print()
            first = False
            for line in render_object(obj) + event_lines(events, time.time()):
                s.print(line)
    return rc
