"""The node agent: registers a Node, runs the pods bound to it through a CRI `RuntimeService`,
reports their status, and keeps them running while the API server is unreachable (edge
autonomy; see `agent.py`, `podworker.py` and the modules it names, `localstore.py`, `node.py`).

Public surface: `Agent`, `AgentOptions`, `WorkerOptions`, `LocalStore`, `host_facts`,
`HostFacts`, `node_client` (an in-process client acting as a node).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.agent.agent import Agent, AgentOptions, ObjectCache
from orchestrator.agent.localstore import LocalStore, StoredPod
from orchestrator.agent.node import HostFacts, NodeReporter, host_facts
from orchestrator.agent.podcontext import WorkerOptions
from orchestrator.agent.podworker import PodWorker

if TYPE_CHECKING:  # the embedded agent's: a standalone one (HTTPS only) never loads the API layers
    from orchestrator.apiserver.resources import Api
    from orchestrator.controllers.runtime import InProcessClient

__all__ = [
    "FIELD_MANAGER",
    "Agent",
    "AgentOptions",
    "HostFacts",
    "LocalStore",
    "NodeReporter",
    "ObjectCache",
    "PodWorker",
    "StoredPod",
    "WorkerOptions",
    "host_facts",
    "node_client",
]

FIELD_MANAGER = "kubelet"


def node_client(api: Api, node_name: str, *, field_manager: str = FIELD_MANAGER) -> InProcessClient:
    """An in-process client acting as node `node_name` (system:node:<name>, system:nodes), so
    NodeRestriction applies to the embedded agent exactly as to a remote one."""
    from orchestrator.controllers.runtime import InProcessClient
    from orchestrator.security.authn import User

    user = User(f"system:node:{node_name}", ("system:nodes", "system:authenticated"))
    return InProcessClient(api, user, field_manager=field_manager)
