"""Discovery: which resources the server has, and what the user means by `deploy` or `po`.

`discover(client)` reads legacy discovery (`GET /api`, `/api/<v>`, `/apis`, `/apis/<g>/<v>`, the
group/version lists fetched concurrently) into a `ResourceMapper`. The mapper is plain data with
no I/O, so resolution is a pure function of the discovery documents:

* `resolve("deploy" | "deployments" | "deployment" | "Deployment" | "deployment.apps" |
  "deployments.v1.apps")` matches, case-insensitively, a resource's plural, singular, short
  names or kind, restricted to a group (and version) when the input names one. Among several
  matches the order is discovery's: the core group first, then groups in `/apis` order, and the
  preferred version of a group before the others; exact plural beats singular beats short name
  beats kind, as in kubectl's RESTMapper and shortcut expander.
* `for_kind("apps/v1", "Deployment")` maps a manifest's apiVersion/kind to its resource.

Subresources (`deployments/scale`) are not resources of their own: they are listed in
`ResourceInfo.subresources` of their parent. Groups whose list fails are recorded in `failed`
(kubectl: "unable to retrieve the complete list of server APIs") and skipped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import trio

from orchestrator.client.protocol import ApiException
from orchestrator.client.resource import ResourceInfo
from orchestrator.client.rest import RestClient

__all__ = ["ResourceMapper", "ResourceNotFound", "discover", "parse_resource_lists"]


class ResourceNotFound(LookupError):
    """No resource matches the user's input (kubectl: `the server doesn't have a resource type`)."""

    def __init__(self, text: str) -> None:
        super().__init__(f'the server doesn\'t have a resource type "{text}"')
        self.text = text


@dataclass
class ResourceMapper:
    """Resources in discovery order (core first, preferred versions first within a group)."""

    resources: list[ResourceInfo] = field(default_factory=list)
    preferred: set[tuple[str, str]] = field(default_factory=set)  # (group, version)
    failed: dict[str, str] = field(default_factory=dict)  # group/version -> error message

    def resolve(self, text: str) -> ResourceInfo:
        """The resource the user means by `text`; raises `ResourceNotFound`."""
        arg = text.strip()
        if not arg:
            raise ResourceNotFound(text)
        for name, group, version in _interpretations(arg):
            hit = self._match(name, group, version)
            if hit is not None:
                return hit
        raise ResourceNotFound(text)

    def _match(self, name: str, group: str | None, version: str | None) -> ResourceInfo | None:
        low = name.lower()
        cands = [
            r
            for r in self.resources
            if (group is None or r.group == group) and (version is None or r.version == version)
        ]
        tests = (
            lambda r: r.plural == low,
            lambda r: r.singular == low,
            lambda r: low in r.short_names,
            lambda r: r.kind.lower() == low,
        )
        for test in tests:
            for r in cands:
                if test(r):
                    return r
        return None

    def for_kind(self, api_version: str, kind: str) -> ResourceInfo:
        """The resource of objects with this `apiVersion` and `kind`; raises `ResourceNotFound`."""
        group, _, version = api_version.rpartition("/")
        for r in self.resources:
            if r.group == group and r.version == version and r.kind == kind:
                return r
        raise ResourceNotFound(f"{kind}.{version}.{group}" if group else f"{kind}.{version}")

    def category(self, name: str) -> list[ResourceInfo]:
        """Resources in a category (`all`), preferred versions only, in discovery order."""
        return [
            r
            for r in self.resources
            if name in r.categories and (r.group, r.version) in self.preferred
        ]


def _interpretations(arg: str) -> list[tuple[str, str | None, str | None]]:
    """`name`, `name.group`, `name.version.group` readings of the input, most specific first."""
    out: list[tuple[str, str | None, str | None]] = []
    parts = arg.split(".")
    if len(parts) >= 3 and parts[1][:1] == "v" and parts[1][1:2].isdigit():
        out.append((parts[0], ".".join(parts[2:]), parts[1]))
    if len(parts) >= 2:
        out.append((parts[0], ".".join(parts[1:]), None))
    out.append((arg, None, None))
    return out


def parse_resource_lists(
    lists: Iterable[tuple[Mapping[str, Any], bool]],
) -> ResourceMapper:
    """Build a mapper from `(APIResourceList, preferred)` pairs, in discovery order."""
    m = ResourceMapper()
    for doc, preferred in lists:
        gv = str(doc.get("groupVersion", ""))
        group, _, version = gv.rpartition("/")
        if preferred:
            m.preferred.add((group, version))
        subs: dict[str, list[str]] = {}
        mains: list[Mapping[str, Any]] = []
        for r in doc.get("resources") or []:
            name = str(r.get("name", ""))
            if "/" in name:
                parent, _, sub = name.partition("/")
                subs.setdefault(parent, []).append(sub)
            elif name:
                mains.append(r)
        for r in mains:
            name = str(r["name"])
            m.resources.append(
                ResourceInfo(
                    group=group,
                    version=version,
                    plural=name,
                    kind=str(r.get("kind", "")),
                    namespaced=bool(r.get("namespaced", False)),
                    singular=str(r.get("singularName") or "") or str(r.get("kind", "")).lower(),
                    short_names=tuple(r.get("shortNames") or ()),
                    verbs=tuple(r.get("verbs") or ()),
                    categories=tuple(r.get("categories") or ()),
                    subresources=tuple(subs.get(name, ())),
                )
            )
    return m


async def discover(client: RestClient) -> ResourceMapper:
    """Fetch legacy discovery and build a `ResourceMapper` (per-GV lists concurrently)."""
    gvs: list[tuple[str, bool]] = []  # (path, preferred)
    try:
        core = await client.request("GET", "/api")
    except ApiException as exc:
        if exc.code != 404:  # a server without the core group is tolerated
            raise
        core = {}
    for i, v in enumerate((core or {}).get("versions") or []):
        gvs.append((f"/api/{v}", i == 0))
    groups = await client.request("GET", "/apis")
    for g in (groups or {}).get("groups") or []:
        pref = (g.get("preferredVersion") or {}).get("groupVersion")
        versions = [v.get("groupVersion") for v in g.get("versions") or []]
        if pref in versions:  # preferred first
            versions.remove(pref)
            versions.insert(0, pref)
        for i, gv in enumerate(versions):
            if gv:
                gvs.append((f"/apis/{gv}", gv == pref or (pref is None and i == 0)))

    results: list[Any] = [None] * len(gvs)
    failed: dict[str, str] = {}

    async def fetch(i: int, path: str) -> None:
        try:
            results[i] = await client.request("GET", path)
        except ApiException as exc:
            failed[_gv(path)] = exc.message

    async with trio.open_nursery() as nursery:
        for i, (path, _) in enumerate(gvs):
            nursery.start_soon(fetch, i, path)
    m = parse_resource_lists(
        (doc, pref) for doc, (_, pref) in zip(results, gvs, strict=True) if isinstance(doc, dict)
    )
    m.failed = failed
    return m


def _gv(path: str) -> str:
    return path.removeprefix("/apis/").removeprefix("/api/")
