"""Which priority level a request belongs to: the FlowSchemas, as data and one pure function.

Modelled on kube-apiserver's default (suggested and mandatory) FlowSchemas, cut to what this
server serves. First match wins:

    flow schema              priority level    who / what                           flow
    exempt                   exempt            user system:apiserver (this server)  -
    system-node-high         node-high         nodes: their Node, its status and    user
                                               their Leases (heartbeats)
    system-leader-election   leader-election   controllers and kube-system service  user
                                               accounts: Leases
    system-nodes             system            nodes: everything else (pods, ...)   user
    system-controllers       system            the controller manager, the          user
                                               scheduler, kube-system service accounts
    workload-high            workload-high     group system:masters (admins)        user
    service-accounts         workload-low      other service accounts               user+namespace
    global-default           global-default    everyone else                        user

Decision: `system:masters` is *not* exempt here (it is in Kubernetes). An admin's bulk work
(`kubectl apply` of a thousand objects, a benchmark's creates) runs on the same event loop as
the lease renewals; exempting it would let it starve them, which is the failure this gate
exists to prevent. Admins get their own level with a large share (they can borrow every
unguaranteed seat) and wait in its queues like anybody. Only the server's own loopback user
is exempt.

Nodes (user `system:node:<name>` or group `system:nodes`) get `node-high` for exactly what
keeps them alive — `leases` (coordination.k8s.io) and `nodes` (with `nodes/status`) — and
`system` for the rest (pod status, events, watches), so a node busy with pods cannot crowd out
another node's heartbeat. The `leader-election` level is kube-apiserver's: leases taken by
controllers (this server's controllers are elected by Raft and take none today; a user's
controller in kube-system may).

Width: every request takes one seat. APF's work estimate (more seats for lists of big
collections) is not applied: the fair queuing charges each flow the seat-seconds it really
used (`fairqueue`), so a flow of slow lists already gets fewer turns; the core accepts wider
requests if a later estimate wants them. Watches hold their seat only while they open, not
while they stream (as kube-apiserver does for long-running requests); Raft traffic is not
HTTP and never meets this gate. Nor do the probes, `/version`, discovery, OpenAPI, `/metrics`
and `/orchestrator/v1/` (joins): cheap or cached, and needed to see and mend an overload.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.apiserver.flowcontrol.fairqueue import LevelConfig
from orchestrator.security.authn import User

__all__ = ["DEFAULT_LEVELS", "Route", "classify"]

# kube-apiserver's suggested configuration (shares, lendable %, queues, hand size, length).
DEFAULT_LEVELS: tuple[LevelConfig, ...] = (
    LevelConfig("exempt", 0, exempt=True, queues=0),
    LevelConfig("leader-election", 10, 0, queues=16, hand_size=4),
    LevelConfig("node-high", 40, 25, queues=64, hand_size=6),
    LevelConfig("system", 30, 33, queues=64, hand_size=6),
    LevelConfig("workload-high", 40, 50, queues=128, hand_size=6),
    LevelConfig("workload-low", 100, 90, queues=128, hand_size=6),
    LevelConfig("global-default", 20, 50, queues=128, hand_size=6),
)

_SELF = "system:apiserver"
_NODE_PREFIX = "system:node:"
_NODES_GROUP = "system:nodes"
_CONTROLLER_USERS = frozenset({"system:kube-controller-manager", "system:kube-scheduler"})
_CONTROLLERS_GROUP = "system:controllers"
_KUBE_SYSTEM_SA = "system:serviceaccount:kube-system:"
_SERVICE_ACCOUNTS_GROUP = "system:serviceaccounts"
_MASTERS = "system:masters"
_LEASES = ("coordination.k8s.io", "leases")


@dataclass(frozen=True, slots=True)
class Route:
    """Where a request goes: its flow schema, its priority level, how its flow is named."""

    schema: str
    level: str
    by_namespace: bool = False  # flow = user and namespace (else the user alone)


EXEMPT = Route("exempt", "exempt")
NODE_HIGH = Route("system-node-high", "node-high")
LEADER_ELECTION = Route("system-leader-election", "leader-election")
SYSTEM_NODES = Route("system-nodes", "system")
SYSTEM_CONTROLLERS = Route("system-controllers", "system")
WORKLOAD_HIGH = Route("workload-high", "workload-high")
SERVICE_ACCOUNTS = Route("service-accounts", "workload-low", by_namespace=True)
GLOBAL_DEFAULT = Route("global-default", "global-default")


def classify(user: User, group: str, resource: str) -> Route:
    """The route of a request by `user` on `resource` (plural) of API `group` (module doc).
    The verb and subresource do not matter to these schemas (`nodes/status` is `nodes`)."""
    name = user.name
    if name == _SELF:
        return EXEMPT
    groups = user.groups
    if name.startswith(_NODE_PREFIX) or _NODES_GROUP in groups:
        if (group, resource) == _LEASES or (group == "" and resource == "nodes"):
            return NODE_HIGH
        return SYSTEM_NODES
    if (
        name in _CONTROLLER_USERS
        or _CONTROLLERS_GROUP in groups
        or name.startswith(_KUBE_SYSTEM_SA)
    ):
        return LEADER_ELECTION if (group, resource) == _LEASES else SYSTEM_CONTROLLERS
    if _MASTERS in groups:
        return WORKLOAD_HIGH
    if _SERVICE_ACCOUNTS_GROUP in groups:
        return SERVICE_ACCOUNTS
    return GLOBAL_DEFAULT
