"""The API servers a standalone agent knows: learnt from the cluster, kept for later starts.

`orchestrator agent --server URL[,URL...]` starts with the servers it is given (the seeds) and
learns the rest from the cluster: `ServerLearner` reads the Endpoints `default/kubernetes`
(which every server keeps listing the API address of each Raft member, see
`orchestrator.cluster.apiendpoints`) right after start and then every `LEARN_INTERVAL`, through
the agent's own failover client, and hands the URLs to the agent's `EndpointSet` (the
requests' load balancer, `orchestrator.client.endpoints`). So when the server the agent joined
through is powered off, its Lease, pod status and watches go on through another one.

The learnt list is persisted in `DATA_DIR/apiservers.json` (`{"servers": [URL, ...]}`, written
atomically, only when it changed) and loaded at start as the learnt part of the set: a restarted
agent whose `--server` is down still finds the cluster. The seeds are never replaced (a seed may
be a name the cluster does not publish).

Invariants: an empty or unreadable answer never replaces a known list (a cluster briefly
without the object must not make the agent forget its servers); learning failures are logged
and retried, never fatal: the agent runs on its local store meanwhile.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import trio

from orchestrator.client.endpoints import EndpointSet, split_servers, urls_from_endpoints
from orchestrator.client.protocol import ApiConnectionError, ApiException
from orchestrator.client.resource import ENDPOINTS
from orchestrator.client.rest import RestClient
from orchestrator.security.pki import atomic_write

__all__ = ["LEARN_INTERVAL", "SERVERS_FILE", "ServerLearner", "load_servers", "save_servers"]

log = logging.getLogger(__name__)

SERVERS_FILE = "apiservers.json"
LEARN_INTERVAL = 10.0  # seconds between reads of default/kubernetes
LEARN_TIMEOUT = 10.0
SERVICE_NAMESPACE, SERVICE_NAME = "default", "kubernetes"


def load_servers(data_dir: Path) -> list[str]:
    """The servers learnt by an earlier run (empty if none or unreadable)."""
    path = data_dir / SERVERS_FILE
    try:
        doc: Any = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        log.warning("ignoring %s: %s", path, exc)
        return []
    servers = doc.get("servers") if isinstance(doc, dict) else None
    if not isinstance(servers, list):
        log.warning("ignoring %s: no server list", path)
        return []
    return split_servers(s for s in servers if isinstance(s, str))


def save_servers(data_dir: Path, servers: list[str]) -> None:
    """Persist the learnt servers (atomically; blocking: call from a worker thread)."""
    data = json.dumps({"servers": servers}, indent=2).encode() + b"\n"
    atomic_write(data_dir / SERVERS_FILE, data, 0o644)


class ServerLearner:
    """Keeps `endpoints`' learnt servers equal to `default/kubernetes` (module doc)."""

    def __init__(
        self,
        rest: RestClient,
        endpoints: EndpointSet,
        data_dir: Path,
        *,
        interval: float = LEARN_INTERVAL,
    ) -> None:
        self.rest = rest
        self.endpoints = endpoints
        self.data_dir = data_dir
        self.interval = interval
        self._saved = load_servers(data_dir)

    async def learn_once(self) -> bool:
        """Read the servers once; True if the known set changed. Raises `ApiException`,
        `ApiConnectionError` or `trio.TooSlowError`."""
        with trio.fail_after(LEARN_TIMEOUT):
            obj = await self.rest.get(ENDPOINTS, SERVICE_NAME, SERVICE_NAMESPACE)
        urls = urls_from_endpoints(obj if isinstance(obj, dict) else {})
        if not urls:
            log.info("default/kubernetes lists no API server yet; keeping %s", self.endpoints.urls)
            return False
        changed = self.endpoints.update(urls)
        if urls != self._saved:
            await trio.to_thread.run_sync(save_servers, self.data_dir, urls)
            self._saved = urls
        if changed:
            log.info("API servers: %s (using %s)", ", ".join(self.endpoints.urls), self.current)
        return changed

    @property
    def current(self) -> str:
        return self.endpoints.current

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Learn now and every `interval` until cancelled; `started` at once."""
        task_status.started()
        while True:
            try:
                await self.learn_once()
            except (ApiException, ApiConnectionError, trio.TooSlowError) as exc:
                log.info("could not read the API servers from default/kubernetes: %s", exc)
            await trio.sleep(self.interval)
