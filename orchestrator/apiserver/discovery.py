"""Legacy discovery documents (/api, /apis, /api/v1, /apis/GROUP[/VERSION]) and /version.

Built from the Registry on every call (cheap: a few dozen kinds), so a CRD appears in /apis the
moment it is created, as kubectl's `create -f cr.yaml` right after the CRD requires.
Subresources are listed as "<plural>/<sub>"; `*/scale` says autoscaling/v1 Scale, `pods/binding`
Binding with verb create, `pods/log` verb get only.
"""

from __future__ import annotations

from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.kind import Kind, Registry

VERSION = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0-orchestrator",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-11-30T00:00:00Z",
    "goVersion": "python3",
    "compiler": "cpython",
    "platform": "linux/amd64",
}


def api_versions(server_address: str) -> Obj:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
        ],
    }


def _group(name: str, versions: list[str]) -> Obj:
    vs = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": vs, "preferredVersion": vs[0]}


def _ordered_versions(versions: list[str]) -> list[str]:
    # Kubernetes version priority: GA before beta before alpha, higher numbers first.
    def key(v: str) -> tuple[int, int, int]:
        import re

        m = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", v)
        if not m:
            return (3, 0, 0)
        stage = {"": 0, "beta": 1, "alpha": 2}[m.group(2) or ""]
        return (stage, -int(m.group(1)), -int(m.group(3) or 0))

    return sorted(versions, key=key)


def api_group_list(registry: Registry) -> Obj:
    groups = registry.group_versions()
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [_group(g, _ordered_versions(vs)) for g, vs in sorted(groups.items()) if g != ""],
    }


def api_group(registry: Registry, group: str) -> Obj | None:
    vs = registry.group_versions().get(group)
    if not vs or not group:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(group, _ordered_versions(vs))}


def _resource(kind: Kind) -> list[Obj]:
    main: Obj = {
        "name": kind.plural,
        "singularName": kind.singular,
        "namespaced": kind.namespaced,
        "kind": kind.kind,
        "verbs": sorted(kind.verbs),
    }
    if kind.short_names:
        main["shortNames"] = list(kind.short_names)
    if kind.categories:
        main["categories"] = list(kind.categories)
    out = [main]
    for sub in sorted(kind.subresources):
        entry: Obj = {
            "name": f"{kind.plural}/{sub}",
            "singularName": "",
            "namespaced": kind.namespaced,
        }
        if sub == "scale":
            entry.update(
                group="autoscaling", version="v1", kind="Scale", verbs=["get", "patch", "update"]
            )
        elif sub == "binding":
            entry.update(kind="Binding", verbs=["create"])
        elif sub == "log":
            entry.update(kind="Pod", verbs=["get"])
        else:
            entry.update(kind=kind.kind, verbs=["get", "patch", "update"])
        out.append(entry)
    return out


def api_resource_list(registry: Registry, group: str, version: str) -> Obj | None:
    kinds = sorted(
        (k for k in registry if k.group == group and k.version == version), key=lambda k: k.plural
    )
    if not kinds:
        return None
    gv = f"{group}/{version}" if group else version
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": gv,
        "resources": [r for k in kinds for r in _resource(k)],
    }
