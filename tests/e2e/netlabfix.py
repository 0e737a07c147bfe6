"""Shared pieces of the end-to-end network tests (`tests/e2e/test_net_*.py`).

`open_lab(...)` yields a started `NetLab` and tears it down; it skips the test (with the reason)
when a lab cannot run here (not root, containerd, iproute2, nsenter or kubectl missing), and
fails instead under ORCH_REQUIRE_CONTAINERD=1, as CI sets. The manifests are plain dicts of
the busybox image (`localhost/busybox:1`: httpd, wget, nslookup, nc).

busybox 1.35's `wget -T` crashes (SIGSEGV), so every request is bounded by `timeout N wget`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from orchestrator.testing.images import APP_IMAGE
from orchestrator.testing.netlab import NetLab, missing_prerequisites

REQUIRE_ENV = "ORCH_REQUIRE_CONTAINERD"
HTTP_PORT = 8080


def require_lab() -> None:
    """Skip (or, under ORCH_REQUIRE_CONTAINERD=1, fail) when no lab can run here."""
    problems = missing_prerequisites()
    if problems:
        reason = "network lab unavailable: " + "; ".join(problems)
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but {reason}", pytrace=False)
        pytest.skip(reason)


@contextmanager
def open_lab(base: Path, devices: int = 2, **kw: Any) -> Iterator[NetLab]:
    require_lab()
    with NetLab(base, devices, **kw) as lab:
        yield lab


def web_command(extra: str = "") -> list[str]:
    """httpd on HTTP_PORT serving `/` = the pod's hostname and `/ready` while /tmp/www/ready
    exists (the readiness probe's path)."""
    return [
        "sh",
        "-c",
        "mkdir -p /tmp/www && hostname > /tmp/www/index.html && echo ok > /tmp/www/ready"
        f" {extra}&& exec httpd -f -p {HTTP_PORT} -h /tmp/www",
    ]


def web_container(*, probe: bool = True) -> dict[str, Any]:
    c: dict[str, Any] = {
        "name": "web",
        "image": APP_IMAGE,
        "command": web_command(),
        "ports": [{"containerPort": HTTP_PORT, "name": "http"}],
    }
    if probe:
        c["readinessProbe"] = {
            "httpGet": {"path": "/ready", "port": HTTP_PORT},
            "periodSeconds": 1,
            "failureThreshold": 1,
            "successThreshold": 1,
        }
    return c


def pod(name: str, node: str, *, namespace: str = "default", labels: dict[str, str] | None = None,
        command: list[str] | None = None) -> dict[str, Any]:  # fmt: skip
    """A busybox pod pinned to `node` (a sleeper unless `command`)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {"app": name}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {"name": "c", "image": APP_IMAGE, "command": command or ["sleep", "100000"]}
            ],
        },
    }


def running_pods(lab: NetLab, namespace: str, selector: str) -> dict[str, dict[str, Any]]:
    """{name: pod} of the Running, Ready, not deleting pods matching `selector`."""
    items = lab.kubectl_json("get", "pods", "-n", namespace, "-l", selector)["items"]
    out = {}
    for p in items:
        st = p.get("status") or {}
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in st.get("conditions") or []
        )
        if st.get("phase") == "Running" and ready and not p["metadata"].get("deletionTimestamp"):
            out[p["metadata"]["name"]] = p
    return out


def wait_running(
    lab: NetLab, namespace: str, selector: str, n: int, timeout: float = 90.0
) -> dict[str, dict[str, Any]]:
    def enough() -> dict[str, dict[str, Any]] | None:
        pods = running_pods(lab, namespace, selector)
        return (
            pods
            if len(pods) == n and all(p["status"].get("podIP") for p in pods.values())
            else None
        )

    return lab.wait_for(enough, f"{n} running pods {selector} in {namespace}", timeout)


def fetch(lab: NetLab, pod_name: str, url: str, *, namespace: str = "default",
          seconds: int = 5) -> tuple[int, str]:  # fmt: skip
    """`wget -qO- url` inside a pod: (exit status, body or error)."""
    r = lab.pod_exec(
        pod_name, ["timeout", str(seconds), "wget", "-qO-", url], namespace=namespace,
        timeout=seconds + 10,
    )  # fmt: skip
    return r.returncode, (r.stdout if r.returncode == 0 else r.stderr).strip()


def lan_fetch(lab: NetLab, url: str, seconds: int = 5) -> tuple[int, str]:
    """`wget -qO- url` from the LAN namespace (192.0.2.1), with the host's busybox."""
    r = lab.lan_exec(
        ["timeout", str(seconds), "busybox", "wget", "-qO-", url], timeout=seconds + 10
    )
    return r.returncode, (r.stdout if r.returncode == 0 else r.stderr).strip()
