"""GET /metrics on an in-process server: process, Raft, store, API and agent families, parsed
from the Prometheus text format, with values that make sense after some requests."""

from __future__ import annotations

import math
import re
import time
from typing import Any

import trio
from api.apiharness import Harness, api_server

from orchestrator.agent.service import AgentConfig
from orchestrator.cri.simulated import SimulatedRuntime
from orchestrator.observability import TimedRuntime

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse_metrics(text: str) -> tuple[Samples, dict[str, str]]:
    """Samples by (name, labels) and each family's TYPE; asserts the text is well formed."""
    samples: Samples = {}
    types: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            types[name] = kind
            continue
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        assert m, f"malformed sample line {line!r}"
        labels = frozenset(_LABEL.findall(m.group(2) or ""))
        samples[m.group(1), labels] = float(m.group(3))
    return samples, types


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[name, frozenset(labels.items())]


def total(samples: Samples, name: str, **labels: str) -> float:
    """Sum over the samples of `name` whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


async def scrape(h: Harness) -> tuple[Samples, dict[str, str]]:
    r = await h.client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return parse_metrics(r.text)


def configmap(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"a": "b"}}


async def test_metrics_families_after_requests() -> None:
    async with api_server(controllers=False) as h:
        base = "/api/v1/namespaces/default/configmaps"
        before, _ = await scrape(h)
        for i in range(3):
            assert (await h.client.post(base, json=configmap(f"cm{i}"))).status_code == 201
        assert (await h.client.get(base)).status_code == 200
        assert (await h.client.get(f"{base}/cm0")).status_code == 200
        assert (await h.client.get(f"{base}/missing")).status_code == 404
        r = await h.client.patch(
            f"{base}/cm0",
            json={"data": {"a": "c"}},
            headers={"content-type": "application/merge-patch+json"},
        )
        assert r.status_code == 200
        # an open watch is a registered watcher until it ends
        async with trio.open_nursery() as nursery:
            nursery.start_soon(h.client.get, f"{base}?watch=true&timeoutSeconds=1")
            with trio.fail_after(10):
                while True:
                    during, _ = await scrape(h)
                    if total(during, "apiserver_registered_watchers", resource="configmaps"):
                        break
                    await trio.sleep(0.02)
        assert value(during, "apiserver_registered_watchers", resource="configmaps") == 1
        rev = int(r.json()["metadata"]["resourceVersion"])
        await h.server.store.compact(rev - 1)
        with trio.fail_after(10):
            while True:
                s, types = await scrape(h)
                if value(s, "apiserver_registered_watchers", resource="configmaps") == 0:
                    break
                await trio.sleep(0.02)

    # --- process
    assert types["process_cpu_seconds_total"] == "counter"
    assert 0 < value(s, "process_cpu_seconds_total") < 24 * 3600
    assert value(s, "process_resident_memory_bytes") > 10 * 1024**2
    assert value(s, "process_open_fds") >= 3
    assert value(s, "process_max_fds") >= value(s, "process_open_fds")
    assert time.time() - 24 * 3600 < value(s, "process_start_time_seconds") <= time.time()

    # --- Raft (a single server that elected itself)
    assert value(s, "raft_is_leader") == 1
    assert value(s, "raft_term") >= 1
    assert 0 < value(s, "raft_applied_index") <= value(s, "raft_commit_index")
    assert value(s, "raft_leader_changes_total") >= 1
    assert value(s, "raft_proposals_failed_total") >= 0
    for hist in ("raft_commit_duration_seconds", "raft_wal_fsync_duration_seconds"):
        assert types[hist] == "histogram"
        grew = value(s, f"{hist}_count") - value(before, f"{hist}_count")
        assert grew >= 4, hist  # three creates and a patch at least
        assert value(s, f"{hist}_bucket", le="+Inf") == value(s, f"{hist}_count")
        assert 0 < value(s, f"{hist}_sum") / value(s, f"{hist}_count") < 5

    # --- store
    assert value(s, "store_revision") >= rev
    assert value(s, "store_compact_revision") == rev - 1
    assert value(s, "store_compactions_total") >= 1
    assert value(s, "store_db_size_bytes") > 0
    assert value(s, "store_wal_size_bytes") >= 0

    # --- API
    assert types["apiserver_request_total"] == "counter"
    assert value(s, "apiserver_request_total", verb="POST", resource="configmaps", code="201") >= 3
    assert value(s, "apiserver_request_total", verb="LIST", resource="configmaps", code="200") >= 1
    assert value(s, "apiserver_request_total", verb="GET", resource="configmaps", code="404") >= 1
    assert value(s, "apiserver_request_total", verb="PATCH", resource="configmaps", code="200") >= 1
    assert value(s, "apiserver_request_total", verb="WATCH", resource="configmaps", code="200") >= 1
    assert total(s, "apiserver_request_total", verb="GET", resource="") >= 1  # /metrics itself
    posts = value(s, "apiserver_request_duration_seconds_count", verb="POST", resource="configmaps")
    assert posts >= 3
    assert (
        value(
            s,
            "apiserver_request_duration_seconds_bucket",
            verb="POST",
            resource="configmaps",
            le="60",
        )
        == posts
    )
    assert types["apiserver_registered_watchers"] == "gauge"

    # --- agent families are registered (observed in the test below)
    assert types["agent_pod_start_duration_seconds"] == "histogram"
    assert types["agent_cri_call_duration_seconds"] == "histogram"
    for (name, _), v in s.items():
        assert not math.isnan(v), name


async def test_agent_metrics_pod_start_and_cri_calls() -> None:
    agent = AgentConfig(runtime="simulated", node_name="edge-m", kubelet_port=0)
    async with api_server(controllers=False, agent=agent) as h:
        before, _ = await scrape(h)
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p"},
            "spec": {
                "nodeName": "edge-m",
                "containers": [
                    {"name": "app", "image": "localhost/busybox:1", "command": ["sleep", "1d"]}
                ],
            },
        }
        r = await h.client.post("/api/v1/namespaces/default/pods", json=pod)
        assert r.status_code == 201, r.text
        with trio.fail_after(30):
            while True:
                r = await h.client.get("/api/v1/namespaces/default/pods/p")
                if (r.json().get("status") or {}).get("phase") == "Running":
                    break
                await trio.sleep(0.05)
        s, _ = await scrape(h)
    started = value(s, "agent_pod_start_duration_seconds_count") - value(
        before, "agent_pod_start_duration_seconds_count"
    )
    assert started == 1
    assert (
        0
        < value(s, "agent_pod_start_duration_seconds_sum")
        < 60 + value(before, "agent_pod_start_duration_seconds_sum")
    )
    for method in ("run_pod_sandbox", "create_container", "start_container"):
        assert value(s, "agent_cri_call_duration_seconds_count", method=method) >= 1, method
    assert value(s, "apiserver_request_total", verb="POST", resource="pods", code="201") >= 1


async def test_timed_runtime_times_calls_and_forwards_attributes() -> None:
    from orchestrator.metrics import REGISTRY

    rt = SimulatedRuntime()
    timed: Any = TimedRuntime(rt)
    child = REGISTRY.get("agent_cri_call_duration_seconds")
    assert child is not None
    n = child.labels("version").count  # type: ignore[union-attr]
    assert (await timed.version()).runtime_name == (await rt.version()).runtime_name
    assert child.labels("version").count == n + 1  # type: ignore[union-attr]
    assert timed.version is timed.version  # wrapped once
    await timed.aclose()
