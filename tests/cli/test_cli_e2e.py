"""End to end: the kubectl-like CLI against a real `orchestrator server` process over HTTPS.

One server (`tests/cluster.py`, `--no-agent`), its own `kubeconfig.yaml` (CA + admin token);
commands run in-process through `orchestrator.cli.kube.run` (same parser as the `orchestrator`
command) and, for the wiring of `main`, once as a real `python -m orchestrator` process.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
import trio
import yaml
from cluster import Cluster

from orchestrator.cli import kube
from orchestrator.cli.main import _build_parser
from orchestrator.client import (
    ApiConnectionError,
    ApiException,
    ConfigError,
    RestClient,
    load_kubeconfig,
)

MANIFEST = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "nginx", "labels": {"app": "nginx"}},
    "spec": {
        "replicas": 2,
        "selector": {"matchLabels": {"app": "nginx"}},
        "template": {
            "metadata": {"labels": {"app": "nginx"}},
            "spec": {"containers": [{"name": "nginx", "image": "nginx:1.26"}]},
        },
    },
}


async def wait_api(kubeconfig: Path, within: float = 30.0) -> None:
    """Until the server wrote its kubeconfig and answers for the default namespace."""
    with trio.fail_after(within):
        while True:
            try:
                async with RestClient(load_kubeconfig(kubeconfig), timeout=5) as c:
                    await c.request("GET", "/api/v1/namespaces/default")
                return
            except (ConfigError, ApiException, ApiConnectionError):
                await trio.sleep(0.1)


@pytest.mark.slow
async def test_cli_against_a_real_server(tmp_path: Path) -> None:
    with Cluster(tmp_path, size=1, extra_args=["--no-agent"]) as cluster:
        cluster.start()
        kubeconfig = cluster.servers[0].kubeconfig
        await wait_api(kubeconfig)

        async def run(*argv: str) -> tuple[int, str, str]:
            args = _build_parser().parse_args([*argv, "--kubeconfig", str(kubeconfig)])
            out, err = io.StringIO(), io.StringIO()
            with trio.fail_after(20):
                rc = await kube.run(args, out=out, err=err)
            return rc, out.getvalue(), err.getvalue()

        rc, out, _ = await run("api-resources")
        assert rc == 0
        assert out.splitlines()[0].split() == [
            "NAME",
            "SHORTNAMES",
            "APIVERSION",
            "NAMESPACED",
            "KIND",
        ]
        assert ["deployments", "deploy", "apps/v1", "true", "Deployment"] in [
            line.split() for line in out.splitlines()
        ]

        f = tmp_path / "nginx.yaml"
        f.write_text(yaml.safe_dump(MANIFEST))
        assert await run("apply", "-f", str(f)) == (0, "deployment.apps/nginx created\n", "")
        assert await run("apply", "-f", str(f)) == (0, "deployment.apps/nginx unchanged\n", "")
        MANIFEST["spec"]["replicas"] = 3  # type: ignore[index]
        f.write_text(yaml.safe_dump(MANIFEST))
        assert await run("apply", "-f", str(f)) == (0, "deployment.apps/nginx configured\n", "")

        rc, out, _ = await run("get", "deploy")
        assert rc == 0
        head, row = out.splitlines()
        assert head.split() == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]
        assert head.startswith("NAME    READY   ")
        assert row.split()[:2] == ["nginx", "0/3"]
        assert await run("get", "deployments.apps", "nope") == (
            1,
            "",
            'Error from server (NotFound): deployments.apps "nope" not found\n',
        )

        assert await run("scale", "deploy/nginx", "--replicas=4") == (
            0,
            "deployment.apps/nginx scaled\n",
            "",
        )
        rc, out, _ = await run("get", "deploy", "nginx", "-o", "json")
        assert json.loads(out)["spec"]["replicas"] == 4

        rc, out, _ = await run("describe", "deploy", "nginx")
        assert rc == 0
        assert out.startswith("Name:         nginx\nNamespace:    default\n")
        assert "Events:" in out

        rc, out, _ = await run("explain", "deploy.spec.strategy")
        assert rc == 0
        assert "FIELD: strategy <DeploymentStrategy>" in out
        assert "  rollingUpdate\t<RollingUpdateDeployment>" in out

        assert await run("rollout", "restart", "deployment/nginx") == (
            0,
            "deployment.apps/nginx restarted\n",
            "",
        )

        # The real command, through `main`, as a user runs it.
        proc = await trio.run_process(
            [
                sys.executable,
                "-m",
                "orchestrator",
                "delete",
                "deploy",
                "nginx",
                "--kubeconfig",
                str(kubeconfig),
            ],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        assert (proc.returncode, proc.stdout, proc.stderr) == (
            0,
            b'deployment.apps "nginx" deleted\n',
            b"",
        )
        assert await run("get", "deploy") == (0, "", "No resources found in default namespace.\n")
