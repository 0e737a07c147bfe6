"""core/v1 Node: schema, `kubectl get nodes` columns and field labels, and the `NODE` Kind.

Nodes are cluster-scoped and registered by their agents, which report status (conditions,
addresses, capacity, nodeInfo) through the status subresource. Taints are atomic (replaced
wholesale by patches); conditions merge by `type`, addresses by `type` too (as upstream tags
them, although two addresses may share a type; SSA treats the list as atomic).

Invariants: no defaults (as upstream); Table cells follow kubectl's `printNode`.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from orchestrator.kube.errors import Cause
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.builders import (
    array,
    boolean,
    integer,
    obj,
    quantity_map,
    string,
    strings,
    timestamp,
)
from orchestrator.kube.schema.columns import AGE, NAME, NONE
from orchestrator.kube.schema.core_v1_container import V1
from orchestrator.kube.schema.kind import Column, Kind
from orchestrator.kube.schema.meta import (
    condition,
    conditions,
    dict_list,
    flag_label,
    get,
    object_schema,
    sub,
)

TAINT = obj(
    "Repels pods that do not tolerate it.",
    {
        "key": string("Taint key."),
        "value": string("Taint value."),
        "effect": string(
            "What happens to pods that do not tolerate the taint.",
            enum=("NoSchedule", "PreferNoSchedule", "NoExecute"),
        ),
        "timeAdded": timestamp("When a NoExecute taint was added."),
    },
    required=("key", "effect"),
    name=f"{V1}.Taint",
)

NODE_SPEC = obj(
    "How the node is configured for scheduling.",
    {
        "podCIDR": string("IP range assigned to the node's pods."),
        "podCIDRs": array(
            {"type": "string"},
            "IP ranges assigned to the node's pods, one per family.",
            patch_strategy="merge",
            list_type="set",
        ),
        "unschedulable": boolean("Keep new pods off the node (kubectl cordon)."),
        "taints": array(TAINT, "The node's taints.", list_type="atomic"),
        "providerID": string("Id of the node at its infrastructure provider."),
    },
    name=f"{V1}.NodeSpec",
)

NODE_ADDRESS = obj(
    "An address of the node.",
    {
        "type": string("Hostname, InternalIP, ExternalIP, InternalDNS or ExternalDNS."),
        "address": string("The address."),
    },
    required=("type", "address"),
    name=f"{V1}.NodeAddress",
)

NODE_SYSTEM_INFO = obj(
    "Facts about the node's system, reported by its agent.",
    {
        "machineID": string("Contents of /etc/machine-id."),
        "systemUUID": string("Hardware UUID."),
        "bootID": string("Id of the current boot."),
        "kernelVersion": string("Kernel version (uname -r)."),
        "osImage": string("Operating system name and version."),
        "containerRuntimeVersion": string("Container runtime: <name>://<version>."),
        "kubeletVersion": string("Version of the node agent."),
        "kubeProxyVersion": string("Version of the service proxy (deprecated)."),
        "operatingSystem": string("linux or windows."),
        "architecture": string("CPU architecture, e.g. amd64, arm64."),
    },
    required=(
        "machineID",
        "systemUUID",
        "bootID",
        "kernelVersion",
        "osImage",
        "containerRuntimeVersion",
        "kubeletVersion",
        "kubeProxyVersion",
        "operatingSystem",
        "architecture",
    ),
    name=f"{V1}.NodeSystemInfo",
)

NODE_STATUS = obj(
    "Observed state of the node.",
    {
        "capacity": quantity_map("Total resources of the node."),
        "allocatable": quantity_map("Resources available to pods."),
        "phase": string("Deprecated lifecycle phase."),
        "conditions": conditions(
            condition(f"{V1}.NodeCondition", "A node condition.", "lastHeartbeatTime"),
        ),
        "addresses": array(
            NODE_ADDRESS,
            "Addresses the node is reachable at.",
            patch_strategy="merge",
            merge_key="type",
            list_type="atomic",
        ),
        "daemonEndpoints": obj(
            "Ports the node's agent listens on.",
            {
                "kubeletEndpoint": obj(
                    "The agent's endpoint.",
                    {"Port": integer("Port number.")},
                    required=("Port",),
                    name=f"{V1}.DaemonEndpoint",
                )
            },
            name=f"{V1}.NodeDaemonEndpoints",
        ),
        "nodeInfo": NODE_SYSTEM_INFO,
        "images": array(
            obj(
                "An image present on the node.",
                {
                    "names": strings("Names (tags and digests) of the image."),
                    "sizeBytes": integer("Size in bytes.", fmt="int64"),
                },
                name=f"{V1}.ContainerImage",
            ),
            "Images on the node.",
            list_type="atomic",
        ),
    },
    name=f"{V1}.NodeStatus",
)


def node_status_cell(node: Obj, now: float) -> str:
    """`Ready`, `NotReady`, `Unknown`, plus `,SchedulingDisabled` when cordoned."""
    status: list[str] = []
    ready = [c for c in dict_list(get(node, "status"), "conditions") if c.get("type") == "Ready"]
    if ready:
        status.append("Ready" if ready[-1].get("status") == "True" else "NotReady")
    else:
        status.append("Unknown")
    if get(node, "spec.unschedulable"):
        status.append("SchedulingDisabled")
    return ",".join(status)


ROLE_PREFIX = "node-role.kubernetes.io/"


def node_roles(node: Obj, now: float) -> str:
    """Roles from `node-role.kubernetes.io/<role>` labels and `kubernetes.io/role`, sorted."""
    roles: set[str] = set()
    for key, value in sub(node.get("metadata"), "labels").items():
        if key.startswith(ROLE_PREFIX) and key[len(ROLE_PREFIX) :]:
            roles.add(key[len(ROLE_PREFIX) :])
        elif key == "kubernetes.io/role" and value:
            roles.add(str(value))
    return ",".join(sorted(roles)) or NONE


def _address(kind: str) -> Any:
    def cell(node: Obj, now: float) -> str:
        for a in dict_list(get(node, "status"), "addresses"):
            if a.get("type") == kind:
                return str(a.get("address", ""))
        return NONE

    return cell


def _info(key: str) -> Any:
    return lambda node, now: str(get(node, f"status.nodeInfo.{key}") or "<unknown>")


NODE_COLUMNS = (
    NAME,
    Column("Status", "string", "Readiness, and whether it is cordoned.", node_status_cell),
    Column("Roles", "string", "Roles from node-role.kubernetes.io/* labels.", node_roles),
    AGE,
    Column(
        "Version",
        "string",
        "Version of the node agent.",
        lambda o, n: str(get(o, "status.nodeInfo.kubeletVersion", "")),
    ),
    Column("Internal-IP", "string", "First internal IP.", _address("InternalIP"), priority=1),
    Column("External-IP", "string", "First external IP.", _address("ExternalIP"), priority=1),
    Column("OS-Image", "string", "Operating system image.", _info("osImage"), priority=1),
    Column("Kernel-Version", "string", "Kernel version.", _info("kernelVersion"), priority=1),
    Column(
        "Container-Runtime",
        "string",
        "Container runtime and version.",
        _info("containerRuntimeVersion"),
        priority=1,
    ),
)


def validate_node(new: Obj, old: Obj | None) -> list[Cause]:
    """`spec.podCIDR(s)`: CIDRs, `podCIDRs[0]` equal to `podCIDR`, and set once (the node
    IPAM controller assigns them; a Node keeps them for life, as Kubernetes)."""
    spec = new.get("spec") if isinstance(new.get("spec"), dict) else {}
    assert isinstance(spec, dict)
    causes: list[Cause] = []
    cidr = spec.get("podCIDR")
    cidrs = spec.get("podCIDRs")
    for i, value in enumerate([cidr, *(cidrs if isinstance(cidrs, list) else [])]):
        if value in (None, ""):
            continue
        path = "spec.podCIDR" if i == 0 else f"spec.podCIDRs[{i - 1}]"
        try:
            ipaddress.ip_network(str(value), strict=True)
        except ValueError:
            causes.append(Cause(path, f"Invalid value: {value!r}: must be a valid CIDR"))
    if cidr and isinstance(cidrs, list) and cidrs and cidrs[0] != cidr:
        causes.append(
            Cause("spec.podCIDRs[0]", f"Invalid value: {cidrs[0]!r}: must match spec.podCIDR")
        )
    if old is not None:
        old_spec = old.get("spec") if isinstance(old.get("spec"), dict) else {}
        assert isinstance(old_spec, dict)
        for field in ("podCIDR", "podCIDRs"):
            before = old_spec.get(field)
            if before and spec.get(field) != before:
                causes.append(
                    Cause(
                        f"spec.{field}",
                        f'Forbidden: node updates may not change {field} except from "" '
                        "to a valid value",
                        "FieldValueForbidden",
                    )
                )
    return causes


NODE = Kind(
    group="",
    version="v1",
    kind="Node",
    plural="nodes",
    singular="node",
    namespaced=False,
    schema=object_schema(
        f"{V1}.Node", "A machine that runs pods, registered by its agent.", NODE_SPEC, NODE_STATUS
    ),
    description="A machine that runs pods, registered by its agent.",
    short_names=("no",),
    subresources=frozenset({"status"}),
    columns=NODE_COLUMNS,
    field_labels={"spec.unschedulable": flag_label("spec.unschedulable")},
    validate=validate_node,
)
