"""Authorization: may this user do this verb on this resource (or path)? Plus NodeRestriction.

Theory of operation: a user gets roles from its groups and name (`roles_of`); each role is a
tuple of `Rule`s in `ROLES`; a request is allowed when any rule of any of the user's roles
matches, else `authorize` raises 403 Forbidden with Kubernetes' wording. A second, object-aware
layer, `admit_node` (the NodeRestriction admission plugin), runs on writes once the object is
known, because "its own Node / its own pods" cannot be decided from URL attributes alone.

Role table (who → what):

    admin        group system:masters            every verb on every resource and path
    controller   users system:kube-controller-manager, system:kube-scheduler, or group
                 system:controllers              every verb on every resource, except writes to
                                                 customresourcedefinitions (their /status is ok)
    viewer       group system:viewers            get/list/watch on everything but secrets
    node         group system:nodes AND user system:node:<name> (both, as Kubernetes' Node
                 authorizer requires)
                   get/list/watch  pods services endpoints nodes configmaps secrets namespaces
                                   persistentvolumeclaims, endpointslices
                   create/update/patch   nodes named <name>; update/patch nodes/status of <name>
                   get/update/patch      pods/status (admission: only pods bound to <name>)
                   delete                pods (admission: only pods bound to <name>, to finish
                                         graceful deletion)
                   get/create/update/patch/delete  leases in kube-node-lease named <name>
                   create/patch/update   events (core and events.k8s.io)
                   post                  /orchestrator/v1/node-certificate (its own serving
                                         certificate, `tokenapi`)
                   not: create pods, pods/log, pods/exec, anything else
    bootstrapper group system:bootstrappers      create/get/list/watch certificatesigningrequests
                                                 (certificates.k8s.io), like kubeadm's
                                                 system:node-bootstrapper; post the path
                                                 /orchestrator/v1/join (node credentials,
                                                 `tokenapi`); nothing else
    discovery    group system:authenticated      get on /api, /apis, /openapi, /version and the
                                                 health paths; create self-subject reviews

Invariants: no rule grants a node a write that `admit_node` does not then check against the
object; "only system identities write status" (`may_write_status`): masters, controllers and
nodes (nodes further narrowed by `admit_node`). The role table is fixed at build time, so a
decision is a pure function of the user and the attributes and is remembered (`_DECISIONS`, by
what the rules read: the name only as none / the node's own / another); roles that could change
at run time would have to clear that memory.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from orchestrator.kube.errors import ApiError, forbidden
from orchestrator.kube.objects import Obj
from orchestrator.security.authn import AUTHENTICATED, User
from orchestrator.security.tokens import BOOTSTRAPPERS, CONTROLLERS, MASTERS, NODE_PREFIX, NODES

VIEWERS = "system:viewers"
CONTROLLER_USERS = frozenset({"system:kube-controller-manager", "system:kube-scheduler"})
NODE_LEASE_NAMESPACE = "kube-node-lease"

ALL = "*"
READ = frozenset({"get", "list", "watch"})
WRITE = frozenset({"create", "update", "patch", "delete", "deletecollection"})
_ALL = frozenset({ALL})


@dataclass(frozen=True, slots=True)
class Attributes:
    """What a request wants (Kubernetes' authorizer.Attributes). `path` is for non-resource
    requests (`resource == ""`), and is then matched against the rules' `paths`."""

    verb: str  # get list watch create update patch delete deletecollection; or an HTTP verb
    group: str = ""
    resource: str = ""  # plural, "" for a non-resource request
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    path: str = ""


@dataclass(frozen=True, slots=True)
class Rule:
    verbs: frozenset[str]
    groups: frozenset[str] = _ALL  # API groups
    resources: frozenset[str] = frozenset()  # "pods", "pods/status", "*"
    except_resources: frozenset[str] = frozenset()  # exact "resource" or "resource/sub"
    namespaces: frozenset[str] | None = None  # None = any namespace (and cluster scope)
    own_name: bool = False  # a named request must name the node itself (node rules)
    paths: frozenset[str] = frozenset()  # non-resource: exact, or "prefix/*", or "*"

    def matches(self, attrs: Attributes, node_name: str | None) -> bool:
        if ALL not in self.verbs and attrs.verb not in self.verbs:
            return False
        if not attrs.resource:
            return any(_path_matches(p, attrs.path) for p in self.paths)
        if ALL not in self.groups and attrs.group not in self.groups:
            return False
        full = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
        if ALL not in self.resources and full not in self.resources:
            return False
        if full in self.except_resources:
            return False
        if self.namespaces is not None and attrs.namespace not in self.namespaces:
            return False
        return not (self.own_name and attrs.name and attrs.name != node_name)


def _path_matches(pattern: str, path: str) -> bool:
    if pattern == ALL:
        return True
    if pattern.endswith("/*"):
        return path == pattern[:-2] or path.startswith(pattern[:-1])
    return path == pattern


def _rule(
    verbs: Iterable[str],
    groups: Iterable[str] = (ALL,),
    resources: Iterable[str] = (),
    **kw: Any,
) -> Rule:
    return Rule(frozenset(verbs), frozenset(groups), frozenset(resources), **kw)


_CORE = ("",)
ROLES: dict[str, tuple[Rule, ...]] = {
    "admin": (_rule([ALL], [ALL], [ALL], paths=_ALL),),
    "controller": (
        _rule(READ, [ALL], [ALL]),
        _rule(WRITE, [ALL], [ALL], except_resources=frozenset({"customresourcedefinitions"})),
    ),
    "viewer": (_rule(READ, [ALL], [ALL], except_resources=frozenset({"secrets"})),),
    "node": (
        _rule(
            READ,
            _CORE,
            [
                "pods",
                "services",
                "endpoints",
                "nodes",
                "configmaps",
                "secrets",
                "namespaces",
                "persistentvolumeclaims",
            ],
        ),
        _rule(READ, ["discovery.k8s.io"], ["endpointslices"]),
        _rule(["create", "get", "update", "patch"], _CORE, ["nodes"], own_name=True),
        _rule(["get", "update", "patch"], _CORE, ["nodes/status"], own_name=True),
        _rule(["get", "update", "patch"], _CORE, ["pods/status"]),
        _rule(["delete"], _CORE, ["pods"]),
        _rule(
            ["get", "create", "update", "patch", "delete"],
            ["coordination.k8s.io"],
            ["leases"],
            namespaces=frozenset({NODE_LEASE_NAMESPACE}),
            own_name=True,
        ),
        _rule(["create", "update", "patch"], ["", "events.k8s.io"], ["events"]),
        _rule(["post"], paths=frozenset({"/orchestrator/v1/node-certificate"})),
    ),
    "bootstrapper": (
        _rule(
            ["create", "get", "list", "watch"],
            ["certificates.k8s.io"],
            ["certificatesigningrequests"],
        ),
        _rule(["post"], paths=frozenset({"/orchestrator/v1/join"})),
    ),
    "discovery": (
        _rule(
            ["get"],
            paths=frozenset(
                {
                    "/api/*",
                    "/apis/*",
                    "/openapi/*",
                    "/version/*",
                    "/healthz",
                    "/livez",
                    "/readyz",
                }
            ),
        ),
        _rule(
            ["create"],
            ["authorization.k8s.io", "authentication.k8s.io"],
            ["selfsubjectaccessreviews", "selfsubjectrulesreviews", "selfsubjectreviews"],
        ),
    ),
}


def node_name(user: User) -> str | None:
    """`<name>` for a node identity (group system:nodes and user system:node:<name>), else None."""
    if NODES in user.groups and user.name.startswith(NODE_PREFIX):
        return user.name[len(NODE_PREFIX) :] or None
    return None


def roles_of(user: User) -> list[str]:
    roles: list[str] = []
    if MASTERS in user.groups:
        roles.append("admin")
    if user.name in CONTROLLER_USERS or CONTROLLERS in user.groups:
        roles.append("controller")
    if VIEWERS in user.groups:
        roles.append("viewer")
    if node_name(user) is not None:
        roles.append("node")
    if BOOTSTRAPPERS in user.groups:
        roles.append("bootstrapper")
    if AUTHENTICATED in user.groups:
        roles.append("discovery")
    return roles


def _decision_key(
    user: User, verb: str, group: str, resource: str, sub: str, ns: str, name: str, path: str
) -> tuple[Any, ...]:
    """What a decision depends on. The roles are fixed, so only the user and the attributes;
    and a rule reads the name only to compare it with the node's own (`own_name`)."""
    who = 0 if not name else 1 if name == node_name(user) else 2
    return (user.name, user.groups, verb, group, resource, sub, ns, who, path)


def allowed(user: User, attrs: Attributes) -> bool:
    # Remembered: every write asks, and most ask what was asked just before.
    a = attrs
    key = _decision_key(
        user, a.verb, a.group, a.resource, a.subresource, a.namespace, a.name, a.path
    )
    decision = _DECISIONS.get(key)
    if decision is None:
        node = node_name(user)
        decision = any(rule.matches(attrs, node) for role in roles_of(user) for rule in ROLES[role])
        if len(_DECISIONS) >= _DECISIONS_MAX:
            _DECISIONS.clear()
        _DECISIONS[key] = decision
    return decision


_DECISIONS: dict[tuple[Any, ...], bool] = {}
_DECISIONS_MAX = 4096


def authorize_resource(
    user: User, verb: str, group: str, resource: str, sub: str, ns: str, name: str
) -> None:
    """`authorize(user, Attributes(verb, group, resource, sub, ns, name))`, without building
    the attributes when the decision is remembered as allowed (the API server's every call)."""
    if not _DECISIONS.get(_decision_key(user, verb, group, resource, sub, ns, name, "")):
        authorize(user, Attributes(verb, group, resource, sub, ns, name, ""))


def authorize(user: User, attrs: Attributes) -> None:
    """Return if `user` may do `attrs`, else raise 403 Forbidden (a Status kubectl prints)."""
    if allowed(user, attrs):
        return
    if not attrs.resource:
        raise ApiError(
            403,
            "Forbidden",
            f'forbidden: User "{user.name}" cannot {attrs.verb} path "{attrs.path}"',
        )
    err = forbidden(user.name, attrs.verb, attrs.resource, attrs.group, attrs.namespace, attrs.name)
    if attrs.subresource:
        full = f"{attrs.resource}/{attrs.subresource}"
        err.message = err.message.replace(
            f'cannot {attrs.verb} resource "{attrs.resource}"',
            f'cannot {attrs.verb} resource "{full}"',
            1,
        )
    raise err


@functools.lru_cache(maxsize=1024)  # pure: users are immutable and the roles fixed
def may_write_status(user: User) -> bool:
    """Only system identities write status: masters, controllers, nodes (see `admit_node`)."""
    return MASTERS in user.groups or "controller" in roles_of(user) or node_name(user) is not None


# -------------------------------------------------------------------------------------------------
# NodeRestriction


def _meta(obj: Obj | None) -> Obj:
    meta = (obj or {}).get("metadata")
    return meta if isinstance(meta, dict) else {}


def _bound_node(pod: Obj | None) -> str | None:
    spec = (pod or {}).get("spec")
    return spec.get("nodeName") if isinstance(spec, dict) else None


def _denied(resource: str, group: str, name: str, why: str) -> ApiError:
    what = f"{resource}.{group}" if group else resource
    details: Obj = {"kind": resource, "group": group}
    if name:
        details["name"] = name
    return ApiError(403, "Forbidden", f'{what} "{name}" is forbidden: {why}', details)


def admit_node(
    user: User, verb: str, kind_name: str, subresource: str, obj: Obj | None, old: Obj | None
) -> None:
    """NodeRestriction: a node may write only its own Node, Lease, and pods bound to it.

    `obj` is the proposed object (for delete: the live one), `old` the live object or None.
    Users that are not nodes pass untouched. Kinds a node may write: Node, Pod (status and
    delete), Lease, Event; any other write by a node is refused.
    """
    node = node_name(user)
    if node is None:
        return
    name = str(_meta(obj).get("name") or _meta(old).get("name") or "")
    if kind_name == "Node":
        for o in (obj, old):
            other = _meta(o).get("name")
            if o is not None and other != node:
                raise _denied(
                    "nodes", "", name, f'node "{node}" is not allowed to modify node "{other}"'
                )
        if verb == "delete":
            raise _denied("nodes", "", name, f'node "{node}" is not allowed to delete nodes')
        return
    if kind_name == "Pod":
        if verb == "delete" or subresource == "status":
            for o in (old, obj):
                if o is not None and _bound_node(o) != node:
                    what = "delete" if verb == "delete" else "update pod status for"
                    why = f'node "{node}" can only {what} pods with spec.nodeName set to itself'
                    raise _denied("pods", "", name, why)
            return
        raise _denied(
            "pods", "", name, f'node "{node}" can only update pod status and delete its pods'
        )
    if kind_name == "Lease":
        for o in (obj, old):
            if o is None:
                continue
            meta = _meta(o)
            if meta.get("name") != node or meta.get("namespace") != NODE_LEASE_NAMESPACE:
                raise _denied(
                    "leases",
                    "coordination.k8s.io",
                    name,
                    "can only access node lease with the same name as the requesting node "
                    f'in namespace "{NODE_LEASE_NAMESPACE}"',
                )
        return
    if kind_name == "Event":
        return
    raise _denied(kind_name.lower(), "", name, f'node "{node}" may not write {kind_name} objects')


def _pod_references(pod: Obj, kind_name: str) -> set[str]:
    """Names of Secrets or ConfigMaps a pod uses (volumes, env, envFrom, imagePullSecrets)."""
    spec = pod.get("spec") or {}
    out: set[str] = set()
    secret = kind_name == "Secret"
    for vol in spec.get("volumes") or []:
        if secret and (vol.get("secret") or {}).get("secretName"):
            out.add(vol["secret"]["secretName"])
        if not secret and (vol.get("configMap") or {}).get("name"):
            out.add(vol["configMap"]["name"])
        for src in (vol.get("projected") or {}).get("sources") or []:
            ref = src.get("secret" if secret else "configMap") or {}
            if ref.get("name"):
                out.add(ref["name"])
    if secret:
        out.update(r.get("name", "") for r in spec.get("imagePullSecrets") or [])
    containers = [
        *(spec.get("containers") or []),
        *(spec.get("initContainers") or []),
        *(spec.get("ephemeralContainers") or []),
    ]
    key = "secretKeyRef" if secret else "configMapKeyRef"
    ref_key = "secretRef" if secret else "configMapRef"
    for c in containers:
        for env in c.get("env") or []:
            ref = (env.get("valueFrom") or {}).get(key) or {}
            if ref.get("name"):
                out.add(ref["name"])
        for env_from in c.get("envFrom") or []:
            ref = env_from.get(ref_key) or {}
            if ref.get("name"):
                out.add(ref["name"])
    out.discard("")
    return out


def node_may_read(user: User, kind_name: str, obj: Obj, pods: Iterable[Obj]) -> bool:
    """The Node authorizer's graph check for Secrets and ConfigMaps: a node may read one only
    if a pod bound to it (in the object's namespace) references it. `pods` are candidate pods
    (e.g. those with spec.nodeName = the node). Non-nodes and other kinds: True."""
    node = node_name(user)
    if node is None or kind_name not in ("Secret", "ConfigMap"):
        return True
    meta = _meta(obj)
    name, ns = meta.get("name"), meta.get("namespace")
    for pod in pods:
        if _bound_node(pod) != node or _meta(pod).get("namespace") != ns:
            continue
        if name in _pod_references(pod, kind_name):
            return True
    return False
