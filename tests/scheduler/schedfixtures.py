"""Builders for the scheduler tests: Nodes and Pods as the API returns them (plain dicts)."""

from __future__ import annotations

from typing import Any

from orchestrator.scheduler import NodeInfo, PodInfo, SchedulerCache

Obj = dict[str, Any]


def node(
    name: str,
    *,
    cpu: str | None = "4",
    memory: str | None = "8Gi",
    pods: str | None = "110",
    extra: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    taints: list[Obj] | None = None,
    ready: bool | None = True,
    unschedulable: bool = False,
) -> Obj:
    allocatable = {k: v for k, v in (("cpu", cpu), ("memory", memory), ("pods", pods)) if v}
    allocatable.update(extra or {})
    status: Obj = {"allocatable": allocatable, "capacity": dict(allocatable)}
    if ready is not None:
        status["conditions"] = [
            {"type": "MemoryPressure", "status": "False"},
            {"type": "Ready", "status": "True" if ready else "False"},
        ]
    spec: Obj = {}
    if taints:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": f"uid-{name}", "labels": dict(labels or {})},
        "spec": spec,
        "status": status,
    }


def taint(key: str, value: str = "", effect: str = "NoSchedule") -> Obj:
    out = {"key": key, "effect": effect}
    if value:
        out["value"] = value
    return out


def pod(
    name: str,
    *,
    cpu: str | None = None,
    memory: str | None = None,
    requests: dict[str, str] | None = None,
    namespace: str = "default",
    node_name: str | None = None,
    node_selector: dict[str, str] | None = None,
    affinity: Obj | None = None,
    tolerations: list[Obj] | None = None,
    host_ports: list[int | tuple[int, str, str]] | None = None,
    owner: str | None = None,
    priority: int | None = None,
    uid: str | None = None,
    phase: str = "Pending",
) -> Obj:
    reqs: dict[str, str] = dict(requests or {})
    if cpu is not None:
        reqs["cpu"] = cpu
    if memory is not None:
        reqs["memory"] = memory
    container: Obj = {"name": "app", "image": "app:1"}
    if reqs:
        container["resources"] = {"requests": reqs}
    if host_ports:
        ports = []
        for p in host_ports:
            if isinstance(p, int):
                ports.append({"containerPort": p, "hostPort": p})
            else:
                port, protocol, ip = p
                entry: Obj = {"containerPort": port, "hostPort": port, "protocol": protocol}
                if ip:
                    entry["hostIP"] = ip
                ports.append(entry)
        container["ports"] = ports
    spec: Obj = {"containers": [container]}
    if node_name:
        spec["nodeName"] = node_name
    if node_selector:
        spec["nodeSelector"] = node_selector
    if affinity:
        spec["affinity"] = affinity
    if tolerations:
        spec["tolerations"] = tolerations
    if priority is not None:
        spec["priority"] = priority
    meta: Obj = {"name": name, "namespace": namespace, "uid": uid or f"uid-{namespace}-{name}"}
    if owner:
        meta["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": owner,
                "uid": f"rs-{owner}",
                "controller": True,
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": spec,
        "status": {"phase": phase},
    }


def bound(p: Obj, node_name: str, phase: str = "Running") -> Obj:
    """`p` as the watch shows it after binding to `node_name`."""
    return {**p, "spec": {**p["spec"], "nodeName": node_name}, "status": {"phase": phase}}


def required(*terms: list[Obj], fields: list[Obj] | None = None) -> Obj:
    """Required node affinity, one term per argument (a list of matchExpressions)."""
    node_terms: list[Obj] = [{"matchExpressions": t} for t in terms]
    if fields is not None:
        node_terms.append({"matchFields": fields})
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": node_terms}
        }
    }


def preferred(*weighted: tuple[int, list[Obj]]) -> Obj:
    return {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": w, "preference": {"matchExpressions": exprs}} for w, exprs in weighted
            ]
        }
    }


def expr(key: str, operator: str, *values: str) -> Obj:
    out: Obj = {"key": key, "operator": operator}
    if values:
        out["values"] = list(values)
    return out


def node_info(n: Obj, *pods_on_it: Obj) -> NodeInfo:
    info = NodeInfo(n["metadata"]["name"])
    info.set_node(n)
    for p in pods_on_it:
        info.add_pod(PodInfo.from_pod(p))
    return info


def cache_with(*nodes: Obj) -> SchedulerCache:
    cache = SchedulerCache()
    for n in nodes:
        cache.add_node(n)
    return cache
