"""Session-wide private containerd for tests that need a real container runtime.

Import the fixtures by their package path so every test module shares one daemon:

    from cri.containerd_env import containerd, containerd_instance  # noqa: F401

* `containerd` -> the socket path (str) of a containerd started by
  `orchestrator.testing.containerd.ContainerdInstance` in a temporary directory, with
  `localhost/busybox:1`
  and `localhost/pause:1` imported into namespace `k8s.io` and a CNI bridge network in the first
  free network slot from 1 (bridge `orch<N>`, pods in 10.89.<N>.0/24; slot 0 is left to a
  developer's `python -m orchestrator.testing.containerd`); its CRI gRPC target is `unix://<socket>`.
* `containerd_instance` -> the `ContainerdInstance` itself (log tail, `ctr(...)`, image refs).

The daemon starts on first use and stops once, when pytest finishes (every pod sandbox is removed
first). When it cannot run (not root, binaries missing, containerd fails to start) the tests that
use it are skipped with the reason (the daemon's log tail included), unless
`ORCH_REQUIRE_CONTAINERD=1` is set, as CI does: then they fail.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from orchestrator.testing.containerd import (
    ContainerdError,
    ContainerdInstance,
    missing_prerequisites,
)

REQUIRE_ENV = "ORCH_REQUIRE_CONTAINERD"

# The state lives on the pytest config object, not in this module: if the module is ever imported
# under two names, there is still one daemon per session (two would fight over the bridge).
_STATE_ATTR = "_orch_containerd_state"


def _unavailable(reason: str) -> None:
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but containerd is unavailable: {reason}", pytrace=False)
    pytest.skip(f"containerd unavailable: {reason}")


def _start(config: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> ContainerdInstance:
    state: ContainerdInstance | str | None = getattr(config, _STATE_ATTR, None)
    if isinstance(state, ContainerdInstance):
        return state
    if isinstance(state, str):  # an earlier attempt failed: do not wait for it again
        _unavailable(state)
    problems = missing_prerequisites()
    if problems:
        setattr(config, _STATE_ATTR, "; ".join(problems))
        _unavailable("; ".join(problems))
    base = tmp_path_factory.mktemp("containerd")
    if len(str(base / "containerd.sock.ttrpc")) > 100:  # unix socket paths are short
        base = Path(tempfile.mkdtemp(prefix="orch-containerd-"))
    instance = ContainerdInstance(base, network="auto")
    failure = ""
    try:
        instance.start()
    except ContainerdError as e:
        failure = str(e)
    if failure:  # reported outside the except block: no chained traceback in the reason
        setattr(config, _STATE_ATTR, failure)
        _unavailable(failure)
    setattr(config, _STATE_ATTR, instance)
    config.add_cleanup(instance.stop)
    return instance


@pytest.fixture(scope="session")
def containerd_instance(
    pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory
) -> ContainerdInstance:
    """The shared `ContainerdInstance` (started on first use, stopped when pytest exits)."""
    instance = _start(pytestconfig, tmp_path_factory)
    if not instance.running():
        _unavailable(f"containerd died during the session\n{instance.log_tail()}")
    return instance


@pytest.fixture(scope="session")
def containerd(containerd_instance: ContainerdInstance) -> str:
    """The socket path of the shared private containerd (CRI target `unix://<path>`)."""
    return str(containerd_instance.socket)
