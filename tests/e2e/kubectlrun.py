"""Drive a real `orchestrator server` process with the real kubectl binary.

    server = start_api_server(root)            # a one-server Cluster, API ready
    k = Kubectl(kubectl_binary(), server.kubeconfig, cache_dir=tmp / "cache", workdir=tmp)
    k.ok("apply", "-f", k.write("d.yaml", MANIFEST))   # exit 0, returns stdout
    err = k.fails("get", "deploy", "nope")              # exit 1, returns stderr

Every invocation gets `--kubeconfig` and its own `--cache-dir` (so the discovery cache of one
test never leaks into another) and a timeout. Manifests are written into `workdir`, which is
also kubectl's working directory, so error messages name them by their short relative path.

`parse_table` reads kubectl's column-aligned human output by the offsets of the header words,
so empty cells (a resource without short names) stay in their column.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from cluster import Cluster

KUBECTL_TIMEOUT = 60.0


def kubectl_binary() -> str:
    """The kubectl on PATH; its absence is a failure, not a skip (CI has it)."""
    path = shutil.which("kubectl")
    assert path is not None, "kubectl is not on PATH (CI installs it; so must you)"
    return path


def shipped_kubectls() -> dict[str, Path]:
    """`kubectl.1.27` ... next to the real kubectl (the google-cloud-sdk ships several
    versions): {"1.27": path, ...}, only those present."""
    real = Path(os.path.realpath(kubectl_binary()))
    found: dict[str, Path] = {}
    for p in sorted(real.parent.glob("kubectl.1.*")):
        if p.is_file() and os.access(p, os.X_OK):
            found[p.name.removeprefix("kubectl.")] = p
    return found


@dataclass
class Result:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str

    def __str__(self) -> str:
        return (
            f"$ {' '.join(self.argv)}\nexit {self.returncode}\n"
            f"--- stdout\n{self.stdout}--- stderr\n{self.stderr}"
        )


@dataclass
class Kubectl:
    binary: str | Path
    kubeconfig: Path
    cache_dir: Path
    workdir: Path
    namespace: str | None = None

    def argv(self, *args: str) -> list[str]:
        base = [
            str(self.binary),
            "--kubeconfig",
            str(self.kubeconfig),
            "--cache-dir",
            str(self.cache_dir),
        ]
        if self.namespace is not None:
            base += ["--namespace", self.namespace]
        return base + list(args)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBECTL_")}
        env.pop("KUBECONFIG", None)
        env["HOME"] = str(self.workdir)  # nothing from the developer's ~/.kube
        return env

    def run(self, *args: str, input: str | None = None) -> Result:
        argv = self.argv(*args)
        proc = subprocess.run(
            argv,
            input=input,
            capture_output=True,
            text=True,
            cwd=self.workdir,
            env=self.env(),
            timeout=KUBECTL_TIMEOUT,
            check=False,
        )
        return Result(argv, proc.returncode, proc.stdout, proc.stderr)

    def ok(self, *args: str, input: str | None = None) -> str:
        """Run, require exit 0, return stdout."""
        r = self.run(*args, input=input)
        assert r.returncode == 0, str(r)
        return r.stdout

    def fails(self, *args: str, input: str | None = None, code: int = 1) -> str:
        """Run, require exit `code` and empty stdout, return stderr."""
        r = self.run(*args, input=input)
        assert r.returncode == code, str(r)
        return r.stderr

    def json(self, *args: str) -> Any:
        """Run with `-o json`, require exit 0, return the parsed document."""
        return json.loads(self.ok(*args, "-o", "json"))

    def write(self, name: str, text: str) -> str:
        """Write a manifest into the work directory; returns the name to pass to `-f`."""
        (self.workdir / name).write_text(text)
        return name

    def popen(self, *args: str) -> list[str]:
        """argv for a background kubectl (see `Kubectl.env` and `workdir` for the rest)."""
        return self.argv(*args)

    def with_namespace(self, namespace: str) -> Kubectl:
        return Kubectl(self.binary, self.kubeconfig, self.cache_dir, self.workdir, namespace)


def parse_table(text: str) -> list[dict[str, str]]:
    """kubectl's human table output as dicts keyed by header; cells are cut at the offsets where
    the header words start (kubectl's tabwriter aligns every cell with its header)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert lines, "empty table"
    header = lines[0]
    starts = [i for i, ch in enumerate(header) if ch != " " and (i == 0 or header[i - 1] == " ")]
    names = header.split()
    assert len(starts) == len(names), header
    rows = []
    for line in lines[1:]:
        bounds = [*starts[1:], None]
        row = {
            name: line[start:end].strip()
            for name, start, end in zip(names, starts, bounds, strict=True)
        }
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------ the server
def read_kubeconfig(path: Path) -> tuple[str, str, bytes]:
    """(server URL, bearer token, CA PEM) of the first cluster/user in a kubeconfig."""
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    cluster = doc["clusters"][0]["cluster"]
    ca = base64.b64decode(cluster.get("certificate-authority-data") or "")
    return cluster["server"], doc["users"][0]["user"].get("token", ""), ca


def wait_api_ready(cluster: Cluster, i: int = 0, *, within: float = 30.0) -> None:
    """Until server i has written its kubeconfig and answers `/readyz` with 200."""
    server = cluster.servers[i]
    deadline = time.monotonic() + within
    last = "no kubeconfig yet"
    while True:
        cluster.check_alive()
        if server.kubeconfig.exists():
            try:
                url, token, ca = read_kubeconfig(server.kubeconfig)
                ctx = ssl.create_default_context(cadata=ca.decode()) if ca else False
                r = httpx.get(
                    f"{url}/readyz",
                    headers={"Authorization": f"Bearer {token}"},
                    verify=ctx,
                    timeout=2.0,
                )
                if r.status_code == 200:
                    return
                last = f"/readyz answered {r.status_code}: {r.text[:200]}"
            except (httpx.HTTPError, OSError, yaml.YAMLError, KeyError, TypeError) as e:
                last = f"{type(e).__name__}: {e}"
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"API of server {i} not ready after {within}s ({last})\n{cluster.log_tail(i, 40)}"
            )
        time.sleep(0.05)  # polling interval of a deadline-bounded wait, not a fixed delay
