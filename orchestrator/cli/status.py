"""The cluster overview of `orchestrator status`, besides the per-server Raft table.

From the servers' status answers: the members (voters, learners) and the leader as the servers
with the highest term report them. With a kubeconfig (`--kubeconfig FILE`, or `--data-dir DIR`
for `DIR/kubeconfig.yaml` of a server on this host): the Nodes with their readiness, and the
Pods per phase (from the API server, through `orchestrator.client.RestClient`).

Nothing here raises for an unreachable API server: the overview then says why it is missing.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path
from typing import Any

PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kubeconfig", type=Path, help="also list nodes and pods through this kubeconfig"
    )
    # --data-dir (the store credentials, `storecreds`) also names the kubeconfig.yaml there.


def kubeconfig_of(args: argparse.Namespace) -> Path | None:
    if getattr(args, "kubeconfig", None):
        return Path(args.kubeconfig)
    if getattr(args, "data_dir", None):
        path = Path(args.data_dir) / "kubeconfig.yaml"
        return path if path.exists() else None  # a store-only server (--listen none) has none
    return None


def raft_summary(rows: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Members and leader as the reachable servers with the highest term see them."""
    live = [st for _, st in rows if "error" not in st]
    if not live:
        return {"leader": None, "term": None, "voters": [], "learners": []}
    top = max(live, key=lambda st: (st["term"], st["role"] == "leader", st["commit"]))
    leader = next(
        (st["id"] for st in live if st["role"] == "leader" and st["term"] == top["term"]),
        top["leader"] or None,
    )
    return {
        "leader": leader,
        "term": top["term"],
        "voters": list(top["voters"]),
        "learners": list(top["learners"]),
    }


def summarize_nodes(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> dict[str, Any]:
    """Nodes (name, status as `get nodes` shows it, pods bound to it) and pods per phase."""
    from orchestrator.kube.schema.core_v1_node import node_status_cell

    now = time.time()
    per_node = Counter(str((p.get("spec") or {}).get("nodeName") or "") for p in pods)
    phases = Counter(str((p.get("status") or {}).get("phase") or "Pending") for p in pods)
    terminating = sum(1 for p in pods if (p.get("metadata") or {}).get("deletionTimestamp"))
    out_nodes = []
    for n in sorted(nodes, key=lambda n: str((n.get("metadata") or {}).get("name"))):
        name = str((n.get("metadata") or {}).get("name"))
        status = node_status_cell(n, now)
        out_nodes.append(
            {
                "name": name,
                "status": status,
                "ready": status.split(",")[0] == "Ready",
                "pods": per_node.get(name, 0),
            }
        )
    pod_phases = {ph: phases.get(ph, 0) for ph in PHASES}
    pod_phases.update({ph: c for ph, c in phases.items() if ph not in pod_phases})
    return {
        "nodes": out_nodes,
        "pods": {
            "total": len(pods),
            "phases": pod_phases,
            "terminating": terminating,
            "unscheduled": per_node.get("", 0),
        },
    }


async def kube_summary(kubeconfig: Path, request_timeout: float) -> dict[str, Any]:
    """Nodes and pods through the API server; {"error": ...} if it cannot be read."""
    from orchestrator.client import (
        NODES,
        PODS,
        ApiConnectionError,
        ApiException,
        ConfigError,
        RestClient,
        load_kubeconfig,
    )

    try:
        cfg = load_kubeconfig(kubeconfig)
        async with RestClient(cfg, timeout=request_timeout) as client:
            nodes = await client.list(NODES)
            pods = await client.list(PODS, all_namespaces=True)
    except (ConfigError, ApiException, ApiConnectionError, OSError) as exc:
        return {"error": str(exc) or type(exc).__name__, "kubeconfig": str(kubeconfig)}
    return summarize_nodes(list(nodes.get("items") or []), list(pods.get("items") or []))


def print_overview(summary: dict[str, Any], kube: dict[str, Any] | None) -> None:
    members = ",".join(map(str, summary["voters"])) or "-"
    if summary["learners"]:
        members += " (learners " + ",".join(map(str, summary["learners"])) + ")"
    leader = summary["leader"] or "none"
    print(f"\nCLUSTER: members {members}; leader {leader}; term {summary['term']}")
    if kube is None:
        return
    if "error" in kube:
        print(f"KUBERNETES: unavailable ({kube['kubeconfig']}): {kube['error']}")
        return
    nodes = kube["nodes"]
    ready = sum(1 for n in nodes if n["ready"])
    print(f"NODES: {ready}/{len(nodes)} ready")
    if nodes:
        width = max(4, *(len(n["name"]) for n in nodes))
        print(f"  {'NAME':{width}}  {'STATUS':28} PODS")
        for n in nodes:
            print(f"  {n['name']:{width}}  {n['status']:28} {n['pods']}")
    pods = kube["pods"]
    phases = ", ".join(f"{ph} {c}" for ph, c in pods["phases"].items())
    extra = []
    if pods["terminating"]:
        extra.append(f"terminating {pods['terminating']}")
    if pods["unscheduled"]:
        extra.append(f"unscheduled {pods['unscheduled']}")
    tail = f" ({', '.join(extra)})" if extra else ""
    print(f"PODS: {pods['total']}: {phases}{tail}")
