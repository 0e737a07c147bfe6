"""`ResourceInfo`: one REST resource (group, version, plural, scope, kind) and its URL paths.

It is what discovery resolves user input to and what every `RestClient` call takes. A few
well-known built-in resources are defined here so that components which know what they talk to
(controllers, node agents, the CLI's events and ReplicaSet lookups) need no discovery round trip.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

__all__ = [
    "DAEMONSETS",
    "DEPLOYMENTS",
    "ENDPOINTS",
    "ENDPOINTSLICES",
    "EVENTS",
    "LEASES",
    "NAMESPACES",
    "NODES",
    "PODS",
    "REPLICASETS",
    "SERVICES",
    "STATEFULSETS",
    "ResourceInfo",
]


@dataclass(frozen=True, slots=True)
class ResourceInfo:
    """A resource as discovery describes it (one `APIResource` of one group/version)."""

    group: str  # "" for the core group
    version: str
    plural: str  # "deployments"; never a subresource
    kind: str  # "Deployment"
    namespaced: bool
    singular: str = ""
    short_names: tuple[str, ...] = ()
    verbs: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()  # "scale", "status", "log", ...

    @property
    def api_version(self) -> str:
        """`apps/v1`, or `v1` for the core group (the object's `apiVersion`)."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_resource(self) -> str:
        """`deployments.apps`, `pods`: how API messages name the resource."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def kind_ref(self) -> str:
        """`deployment.apps`, `pod`: how kubectl names the kind in its own output."""
        k = self.kind.lower()
        return f"{k}.{self.group}" if self.group else k

    def collection_path(self, namespace: str | None = None) -> str:
        """The list/create URL; a namespaced resource without `namespace` lists all namespaces."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{quote(namespace, safe='')}"
        return f"{base}/{self.plural}"

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        """The URL of the collection, or of one object (and its subresource) when `name` is set."""
        p = self.collection_path(namespace)
        if name is None:
            if subresource:
                raise ValueError("a subresource needs an object name")
            return p
        if not name:
            raise ValueError(f"an empty name for {self.group_resource}")
        p += f"/{quote(name, safe='')}"
        return f"{p}/{subresource}" if subresource else p


_ALL = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")

PODS = ResourceInfo(
    "", "v1", "pods", "Pod", True, "pod", ("po",), _ALL, ("all",), ("log", "status", "binding")
)
EVENTS = ResourceInfo("", "v1", "events", "Event", True, "event", ("ev",), _ALL)
NAMESPACES = ResourceInfo("", "v1", "namespaces", "Namespace", False, "namespace", ("ns",), _ALL)
NODES = ResourceInfo("", "v1", "nodes", "Node", False, "node", ("no",), _ALL, (), ("status",))
DEPLOYMENTS = ResourceInfo(
    "apps", "v1", "deployments", "Deployment", True, "deployment", ("deploy",), _ALL, ("all",),
    ("scale", "status"),
)  # fmt: skip
REPLICASETS = ResourceInfo(
    "apps", "v1", "replicasets", "ReplicaSet", True, "replicaset", ("rs",), _ALL, ("all",),
    ("scale", "status"),
)  # fmt: skip
DAEMONSETS = ResourceInfo(
    "apps", "v1", "daemonsets", "DaemonSet", True, "daemonset", ("ds",), _ALL, ("all",),
    ("status",),
)  # fmt: skip
STATEFULSETS = ResourceInfo(
    "apps", "v1", "statefulsets", "StatefulSet", True, "statefulset", ("sts",), _ALL, ("all",),
    ("scale", "status"),
)  # fmt: skip
SERVICES = ResourceInfo(
    "", "v1", "services", "Service", True, "service", ("svc",), _ALL, ("all",), ("status",)
)
ENDPOINTS = ResourceInfo("", "v1", "endpoints", "Endpoints", True, "endpoints", ("ep",), _ALL)
ENDPOINTSLICES = ResourceInfo(
    "discovery.k8s.io", "v1", "endpointslices", "EndpointSlice", True, "endpointslice", (), _ALL
)
LEASES = ResourceInfo("coordination.k8s.io", "v1", "leases", "Lease", True, "lease", (), _ALL)
