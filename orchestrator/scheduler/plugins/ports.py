"""NodePorts: the host ports a pod asks for are free on the node."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Final

from orchestrator.scheduler.info import NodeInfo, PodInfo
from orchestrator.scheduler.plugins.base import NodeFilter, Reasons

__all__ = ["ERR_PORTS", "NodePorts"]

ERR_PORTS: Final = "node(s) didn't have free ports for the requested pod ports"
_PORTS: Final = (ERR_PORTS,)


@dataclass(frozen=True)
class NodePorts:
    """Host ports the pod wants are free on the node."""

    name: str = "NodePorts"

    def cache_key(self, pod: PodInfo) -> Hashable | None:
        return None if pod.host_ports else ()

    def prepare(self, pod: PodInfo) -> NodeFilter | None:
        ports = pod.host_ports
        if not ports:
            return None

        def run(nodes: list[NodeInfo], reasons: dict[str, Reasons]) -> list[NodeInfo]:
            kept = []
            for n in nodes:
                if n.ports and n.port_conflict(ports):
                    reasons[n.name] = _PORTS
                else:
                    kept.append(n)
            return kept

        return run
