"""A small in-memory Kubernetes API server behind `httpx.MockTransport`, for client/CLI tests.

It speaks just enough of the real protocol (see /work/shared/reference/kubectl-compat.md):
legacy discovery for core/v1 and apps/v1, CRUD with Status errors, Tables (Name, Age and a
priority-1 column), label/field selectors of the `k=v` kind, the four patch types (strategic
merge approximated by a deep merge), the scale subresource, pods/log, watches replaying
scripted JSON lines, and an OpenAPI v3 index + apps/v1 document. Every request is recorded.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any
from urllib.parse import parse_qs

import httpx

Obj = dict[str, Any]

ALL = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]

CORE_V1 = {
    "kind": "APIResourceList",
    "groupVersion": "v1",
    "resources": [
        {
            "name": "pods",
            "singularName": "pod",
            "namespaced": True,
            "kind": "Pod",
            "verbs": ALL,
            "shortNames": ["po"],
            "categories": ["all"],
        },
        {
            "name": "pods/log",
            "singularName": "",
            "namespaced": True,
            "kind": "Pod",
            "verbs": ["get"],
        },
        {
            "name": "pods/status",
            "singularName": "",
            "namespaced": True,
            "kind": "Pod",
            "verbs": ["get", "patch", "update"],
        },
        {
            "name": "events",
            "singularName": "event",
            "namespaced": True,
            "kind": "Event",
            "verbs": ALL,
            "shortNames": ["ev"],
        },
        {
            "name": "namespaces",
            "singularName": "namespace",
            "namespaced": False,
            "kind": "Namespace",
            "verbs": ALL,
            "shortNames": ["ns"],
        },
        {
            "name": "nodes",
            "singularName": "node",
            "namespaced": False,
            "kind": "Node",
            "verbs": ALL,
            "shortNames": ["no"],
        },
        {
            "name": "bindings",
            "singularName": "binding",
            "namespaced": True,
            "kind": "Binding",
            "verbs": [],
        },
    ],
}
APPS_V1 = {
    "kind": "APIResourceList",
    "apiVersion": "v1",
    "groupVersion": "apps/v1",
    "resources": [
        {
            "name": "deployments",
            "singularName": "deployment",
            "namespaced": True,
            "kind": "Deployment",
            "verbs": ALL,
            "shortNames": ["deploy"],
            "categories": ["all"],
        },
        {
            "name": "deployments/scale",
            "singularName": "",
            "namespaced": True,
            "group": "autoscaling",
            "version": "v1",
            "kind": "Scale",
            "verbs": ["get", "patch", "update"],
        },
        {
            "name": "deployments/status",
            "singularName": "",
            "namespaced": True,
            "kind": "Deployment",
            "verbs": ["get", "patch", "update"],
        },
        {
            "name": "replicasets",
            "singularName": "replicaset",
            "namespaced": True,
            "kind": "ReplicaSet",
            "verbs": ALL,
            "shortNames": ["rs"],
            "categories": ["all"],
        },
    ],
}
KINDS = {
    ("", "pods"): "Pod",
    ("", "events"): "Event",
    ("", "namespaces"): "Namespace",
    ("", "nodes"): "Node",
    ("apps", "deployments"): "Deployment",
    ("apps", "replicasets"): "ReplicaSet",
}
CLUSTER_SCOPED = {"namespaces", "nodes"}

STRATEGY_DOC = "The deployment strategy to use to replace existing pods with new ones."


def ref(name: str) -> Obj:
    return {"$ref": f"#/components/schemas/{name}"}


OPENAPI_INDEX = {
    "paths": {
        "api/v1": {"serverRelativeURL": "/openapi/v3/api/v1?hash=1"},
        "apis/apps/v1": {"serverRelativeURL": "/openapi/v3/apis/apps/v1?hash=2"},
    }
}
OPENAPI_APPS = {
    "openapi": "3.0.0",
    "components": {
        "schemas": {
            "io.k8s.api.apps.v1.Deployment": {
                "description": "Deployment enables declarative updates for Pods and ReplicaSets.",
                "type": "object",
                "x-kubernetes-group-version-kind": [
                    {"group": "apps", "kind": "Deployment", "version": "v1"}
                ],
                "properties": {
                    "apiVersion": {"type": "string", "description": "APIVersion of the schema."},
                    "kind": {"type": "string", "description": "Kind is a string value."},
                    "spec": {
                        "allOf": [ref("io.k8s.api.apps.v1.DeploymentSpec")],
                        "default": {},
                        "description": "Specification of the desired behavior of the Deployment.",
                    },
                },
            },
            "io.k8s.api.apps.v1.DeploymentSpec": {
                "description": "DeploymentSpec is the specification of the desired behavior.",
                "type": "object",
                "required": ["selector", "template"],
                "properties": {
                    "replicas": {
                        "type": "integer",
                        "format": "int32",
                        "description": "Number of desired pods.",
                    },
                    "selector": {
                        "allOf": [ref("io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector")],
                        "description": "Label selector for pods.",
                    },
                    "strategy": {
                        "allOf": [ref("io.k8s.api.apps.v1.DeploymentStrategy")],
                        "default": {},
                        "description": STRATEGY_DOC,
                    },
                    "template": {"type": "object", "description": "Template describes the pods."},
                },
            },
            "io.k8s.api.apps.v1.DeploymentStrategy": {
                "description": "DeploymentStrategy describes how to replace pods.",
                "type": "object",
                "properties": {
                    "rollingUpdate": {
                        "allOf": [ref("io.k8s.api.apps.v1.RollingUpdateDeployment")],
                        "description": "Rolling update config params.",
                    },
                    "type": {
                        "type": "string",
                        "enum": ["Recreate", "RollingUpdate"],
                        "description": "Type of deployment.",
                    },
                },
            },
            "io.k8s.api.apps.v1.RollingUpdateDeployment": {
                "description": "Spec to control the desired behavior of rolling update.",
                "type": "object",
                "properties": {
                    "maxSurge": {
                        "x-kubernetes-int-or-string": True,
                        "description": "The maximum number of pods.",
                    }
                },
            },
            "io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector": {
                "description": "A label selector.",
                "type": "object",
                "properties": {
                    "matchLabels": {
                        "type": "object",
                        "additionalProperties": {"type": "string"},
                        "description": "matchLabels is a map.",
                    },
                },
            },
        }
    },
}

_PATH = re.compile(
    r"^/(?:api/(?P<cv>v1)|apis/(?P<g>[^/]+)/(?P<v>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$"
)


def status(code: int, reason: str, message: str, details: Obj | None = None) -> httpx.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return httpx.Response(code, json=body)


def deep_merge(base: Any, patch: Any) -> Any:
    if not isinstance(base, dict) or not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(base)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = deep_merge(base.get(k), v)
    return out


class FakeApi:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str, str], Obj] = {}  # (group, plural, ns, name)
        self.rv = 100
        self.uid = 0
        self.requests: list[httpx.Request] = []
        self.watch_lines: dict[str, list[bytes]] = {}  # plural -> raw watch body chunks
        self.logs: dict[tuple[str, str], str] = {}  # (pod, container) -> text
        self.tables = True
        self.fail: dict[tuple[str, str], httpx.Response] = {}  # (method, path) -> response

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    # -- state --

    def add(self, obj: Obj) -> Obj:
        api_version = obj["apiVersion"]
        group = api_version.rpartition("/")[0]
        plural = next(p for (g, p), k in KINDS.items() if g == group and k == obj["kind"])
        meta = obj.setdefault("metadata", {})
        if plural not in CLUSTER_SCOPED:
            meta.setdefault("namespace", "default")
        self._stamp(meta)
        self.objects[(group, plural, meta.get("namespace", ""), meta["name"])] = obj
        return obj

    def _stamp(self, meta: Obj) -> None:
        self.rv += 1
        meta["resourceVersion"] = str(self.rv)
        if "uid" not in meta:
            self.uid += 1
            meta["uid"] = f"uid-{self.uid}"
        meta.setdefault("creationTimestamp", "2025-01-01T00:00:00Z")

    def find(self, group: str, plural: str, ns: str, name: str) -> Obj | None:
        return self.objects.get((group, plural, ns, name))

    def bodies(self, method: str) -> list[tuple[httpx.Request, Any]]:
        out = []
        for r in self.requests:
            if r.method == method:
                out.append((r, json.loads(r.content) if r.content else None))
        return out

    # -- protocol --

    def handle(self, req: httpx.Request) -> httpx.Response:
        self.requests.append(req)
        path = req.url.path
        canned = self.fail.get((req.method, path))
        if canned is not None:
            return canned
        if path == "/api":
            return httpx.Response(200, json={"kind": "APIVersions", "versions": ["v1"]})
        if path == "/apis":
            gv = {"groupVersion": "apps/v1", "version": "v1"}
            return httpx.Response(
                200,
                json={
                    "kind": "APIGroupList",
                    "apiVersion": "v1",
                    "groups": [{"name": "apps", "versions": [gv], "preferredVersion": gv}],
                },
            )
        if path == "/api/v1":
            return httpx.Response(200, json=CORE_V1)
        if path == "/apis/apps/v1":
            return httpx.Response(200, json=APPS_V1)
        if path == "/openapi/v3":
            return httpx.Response(200, json=OPENAPI_INDEX)
        if path == "/openapi/v3/apis/apps/v1":
            return httpx.Response(200, json=OPENAPI_APPS)
        m = _PATH.match(path)
        if not m:
            return status(404, "NotFound", "the server could not find the requested resource")
        group = m["g"] or ""
        plural, ns, name, sub = m["plural"], m["ns"] or "", m["name"], m["sub"]
        if (group, plural) not in KINDS:
            return status(404, "NotFound", "the server could not find the requested resource")
        q = {k: v[-1] for k, v in parse_qs(req.url.query.decode()).items()}
        gr = f"{plural}.{group}" if group else plural
        if name is None:
            if req.method == "GET" and q.get("watch") == "true":
                return httpx.Response(
                    200,
                    headers={"content-type": "application/json"},
                    stream=_Chunks(self.watch_lines.get(plural, [])),
                )
            if req.method == "GET":
                return self._list(req, group, plural, ns, q)
            if req.method == "POST":
                obj = json.loads(req.content)
                key = (group, plural, ns, obj["metadata"]["name"])
                if key in self.objects:
                    return status(
                        409,
                        "AlreadyExists",
                        f'{gr} "{key[3]}" already exists',
                        {"name": key[3], "group": group, "kind": plural},
                    )
                obj["metadata"]["namespace"] = ns or None
                if not ns:
                    obj["metadata"].pop("namespace")
                self.add(obj)
                return httpx.Response(201, json=obj)
            return status(405, "MethodNotAllowed", "method not allowed")
        key = (group, plural, ns, name)
        obj = self.objects.get(key)
        ctype = req.headers.get("content-type", "")
        if obj is None and not (req.method == "PATCH" and "apply-patch" in ctype):
            return status(
                404,
                "NotFound",
                f'{gr} "{name}" not found',
                {"name": name, "group": group, "kind": plural},
            )
        if sub == "log":
            container = q.get("container", "")
            text = self.logs.get((name, container), "")
            if "tailLines" in q:
                text = "".join(text.splitlines(keepends=True)[-int(q["tailLines"]) :])
            return httpx.Response(200, text=text, headers={"content-type": "text/plain"})
        if req.method == "GET":
            if "as=Table" in req.headers.get("accept", "") and self.tables:
                return httpx.Response(200, json=self._table([obj], str(self.rv)))  # type: ignore[list-item]
            return httpx.Response(200, json=obj)
        if req.method == "DELETE":
            del self.objects[key]
            return httpx.Response(200, json=obj)
        if req.method == "PATCH":
            body = json.loads(req.content)
            if sub == "scale":
                assert obj is not None
                new = deep_merge(obj, {"spec": {"replicas": body["spec"]["replicas"]}})
            elif "json-patch" in ctype:
                new = copy.deepcopy(obj)
                for op in body:
                    parts = op["path"].strip("/").split("/")
                    target: Any = new
                    for p in parts[:-1]:
                        target = target[p]
                    target[parts[-1]] = op["value"]
            elif "apply-patch" in ctype and obj is None:
                body["metadata"]["namespace"] = ns
                self.add(body)
                return httpx.Response(201, json=body)
            else:
                new = deep_merge(obj, body)
            assert obj is not None
            assert isinstance(new, dict)
            old_meta = {k: v for k, v in obj["metadata"].items() if k != "resourceVersion"}
            new["metadata"] = {**new["metadata"]}
            new_cmp = {
                **new,
                "metadata": {k: v for k, v in new["metadata"].items() if k != "resourceVersion"},
            }
            if new_cmp != {**obj, "metadata": old_meta}:
                self._stamp(new["metadata"])
                if "spec" in body or sub == "scale" or "json-patch" in ctype:
                    new["metadata"]["generation"] = int(obj["metadata"].get("generation", 1)) + 1
            self.objects[key] = new
            return httpx.Response(200, json=new)
        return status(405, "MethodNotAllowed", "method not allowed")

    def _list(
        self, req: httpx.Request, group: str, plural: str, ns: str, q: dict[str, str]
    ) -> httpx.Response:
        items = [
            o
            for (g, p, n, _), o in sorted(self.objects.items())
            if g == group and p == plural and (not ns or n == ns) and _matches(o, q)
        ]
        if "as=Table" in req.headers.get("accept", "") and self.tables:
            return httpx.Response(200, json=self._table(items, str(self.rv)))
        kind = KINDS[(group, plural)] + "List"
        api_version = f"{group}/v1" if group else "v1"
        return httpx.Response(
            200,
            json={
                "kind": kind,
                "apiVersion": api_version,
                "metadata": {"resourceVersion": str(self.rv)},
                "items": items,
            },
        )

    def _table(self, items: list[Obj], rv: str) -> Obj:
        return {
            "kind": "Table",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": rv},
            "columnDefinitions": [
                {"name": "Name", "type": "string", "format": "name", "priority": 0},
                {"name": "Replicas", "type": "integer", "format": "", "priority": 0},
                {"name": "Age", "type": "string", "format": "", "priority": 0},
                {"name": "Node-Name", "type": "string", "format": "", "priority": 1},
            ],
            "rows": [
                {
                    "cells": [
                        o["metadata"]["name"],
                        (o.get("spec") or {}).get("replicas"),
                        "5m",
                        "node-1",
                    ],
                    "object": {
                        "kind": "PartialObjectMetadata",
                        "apiVersion": "meta.k8s.io/v1",
                        "metadata": o["metadata"],
                    },
                }
                for o in items
            ],
        }


def _matches(obj: Obj, q: dict[str, str]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, q.get("labelSelector", "").split(",")):
        k, _, v = term.partition("=")
        if labels.get(k) != v:
            return False
    for term in filter(None, q.get("fieldSelector", "").split(",")):
        k, _, v = term.partition("=")
        cur: Any = obj
        for part in k.split("."):
            cur = cur.get(part) if isinstance(cur, dict) else None
        if str(cur) != v:
            return False
    return True


class _Chunks(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks

    async def __aiter__(self) -> Any:
        for c in self._chunks:
            yield c
