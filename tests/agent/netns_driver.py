"""Run inside a network namespace that has only loopback (see test_simulated_netns.py): start an
all-in-one `orchestrator server --runtime simulated`, apply a Deployment whose pods have httpGet
and tcpSocket readiness and liveness probes, and print one JSON report on stdout.

Usage: python netns_driver.py DATA_DIR

In this namespace a connect to a simulated pod IP (10.42.x.x, from its node's podCIDR) fails
with ENETUNREACH, so a probe that dialled would fail: pods that become Ready and stay Running
without restarts prove that the probes were answered by the simulation.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

REPLICAS = 2
WATCH_SECONDS = 6.0  # after Ready: several probe periods (1 s) with failureThreshold 1
DEADLINE = 90.0  # seconds for the pods to become Ready


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pod_ip_unreachable() -> bool:
    """The namespace is what the test needs: a dial to a simulated pod IP cannot leave."""
    with socket.socket() as s:
        try:
            s.connect(("10.42.0.2", 8080))
        except OSError as exc:
            return exc.errno == errno.ENETUNREACH
    return False


def deployment() -> dict[str, Any]:
    container = {
        "name": "web",
        "image": "localhost/busybox:1",
        "command": ["httpd", "-f", "-p", "8080"],
        "ports": [{"name": "http", "containerPort": 8080}],
        "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
        "livenessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1, "failureThreshold": 1},
        "startupProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "probed", "namespace": "default"},
        "spec": {
            "replicas": REPLICAS,
            "selector": {"matchLabels": {"app": "probed"}},
            "template": {
                "metadata": {"labels": {"app": "probed"}},
                "spec": {"containers": [container]},
            },
        },
    }


def ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def main() -> int:
    data = Path(sys.argv[1])
    report: dict[str, Any] = {"pod_ip_unreachable": pod_ip_unreachable()}
    api_port = free_port()
    argv = [
        *(sys.executable, "-m", "orchestrator", "--log-level", "info", "--log-format", "text"),
        *("server", "--data-dir", str(data), "--runtime", "simulated"),
        *("--peer-listen", f"127.0.0.1:{free_port()}"),
        *("--client-listen", f"127.0.0.1:{free_port()}"),
        *("--listen", f"127.0.0.1:{api_port}", "--kubelet-port", "0", "--node-name", "netns"),
    ]
    with open(data.parent / "server.log", "wb") as log:
        server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    try:
        report.update(drive(data, api_port, server))
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    print(json.dumps(report))
    return 0


def drive(data: Path, api_port: int, server: subprocess.Popen[bytes]) -> dict[str, Any]:
    kubeconfig = data / "kubeconfig.yaml"
    end = time.monotonic() + DEADLINE
    while not kubeconfig.exists():
        if server.poll() is not None or time.monotonic() > end:
            return {"error": "the server did not write its kubeconfig"}
        time.sleep(0.1)
    doc = yaml.safe_load(kubeconfig.read_text())
    import base64

    ca = base64.b64decode(doc["clusters"][0]["cluster"]["certificate-authority-data"])
    token = doc["users"][0]["user"]["token"]
    ctx = ssl.create_default_context(cadata=ca.decode())
    url = f"https://127.0.0.1:{api_port}"
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, verify=ctx, headers=headers, timeout=10) as client:
        while True:  # the default namespace appears just after start
            r = client.post("/apis/apps/v1/namespaces/default/deployments", json=deployment())
            if r.status_code == 201:
                break
            if time.monotonic() > end:
                return {"error": f"create: {r.status_code} {r.text}"}
            time.sleep(0.2)
        selector = {"labelSelector": "app=probed"}
        pods: list[dict[str, Any]] = []
        while True:
            r = client.get("/api/v1/namespaces/default/pods", params=selector)
            pods = r.json().get("items", []) if r.status_code == 200 else []
            if len(pods) == REPLICAS and all(ready(p) for p in pods):
                break
            if time.monotonic() > end:
                return {"error": "pods not Ready in time", "pods": [p.get("status") for p in pods]}
            time.sleep(0.2)
        became_ready = [p["metadata"]["name"] for p in pods]
        time.sleep(WATCH_SECONDS)  # the probes keep running: any dial would fail them
        r = client.get("/api/v1/namespaces/default/pods", params=selector)
        pods = r.json()["items"]
        node = client.get("/api/v1/nodes/netns").json()
    return {
        "became_ready": became_ready,
        "pods": [
            {
                "name": p["metadata"]["name"],
                "podIP": (p.get("status") or {}).get("podIP", ""),
                "phase": (p.get("status") or {}).get("phase", ""),
                "ready": ready(p),
                "restarts": sum(
                    c.get("restartCount", 0)
                    for c in (p.get("status") or {}).get("containerStatuses") or []
                ),
            }
            for p in pods
        ],
        "node_addresses": (node.get("status") or {}).get("addresses", []),
    }


if __name__ == "__main__":
    sys.exit(main())
