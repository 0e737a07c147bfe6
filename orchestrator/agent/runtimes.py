"""Which container runtime a node agent runs on: `--runtime containerd|simulated|auto`.

`auto` uses containerd when its socket exists and answers `Version` within `PROBE_TIMEOUT`,
else the simulated runtime, loudly: a WARNING, and the Node labelled
`orchestrator.dev/runtime=simulated`, so nobody mistakes such a node for a real one. The gRPC
stack is imported only when a containerd socket exists.
"""

from __future__ import annotations

import logging

import trio

from orchestrator.cri.runtime import RuntimeService

__all__ = [
    "PROBE_TIMEOUT",
    "RUNTIMES",
    "RUNTIME_LABEL",
    "choose_runtime",
    "detect_runtime",
    "make_runtime",
]

log = logging.getLogger(__name__)

RUNTIMES = ("auto", "containerd", "simulated")
RUNTIME_LABEL = "orchestrator.dev/runtime"  # = "simulated" on nodes whose pods run nowhere
PROBE_TIMEOUT = 2.0  # seconds containerd has to answer `Version` for `--runtime auto`


def make_runtime(kind: str, containerd_socket: str | None = None) -> RuntimeService:
    if kind == "simulated":
        from orchestrator.cri.simulated import SimulatedRuntime

        return SimulatedRuntime()
    if kind == "containerd":
        from orchestrator.cri.containerd import DEFAULT_SOCKET, CriRuntime

        return CriRuntime(containerd_socket or DEFAULT_SOCKET)
    raise ValueError(f"unknown runtime {kind!r} (containerd or simulated)")


async def detect_runtime(containerd_socket: str | None = None) -> tuple[str, str]:
    """For `--runtime auto`: ("containerd", "") if containerd's socket exists and answers
    `Version` within `PROBE_TIMEOUT`, else ("simulated", why not containerd). The gRPC stack
    is imported only when the socket exists."""
    path = containerd_socket or "/run/containerd/containerd.sock"
    if not await trio.Path(path).exists():
        return "simulated", f"no containerd socket at {path}"
    from orchestrator.cri.containerd import CriRuntime
    from orchestrator.cri.runtime import CriError

    probe = CriRuntime(path, call_timeout=PROBE_TIMEOUT, retries=0)
    try:
        with trio.fail_after(PROBE_TIMEOUT + 1.0):
            await probe.version()
        return "containerd", ""
    except (CriError, OSError, trio.TooSlowError) as exc:
        return "simulated", f"containerd at {path} does not answer: {exc or type(exc).__name__}"
    finally:
        await probe.aclose()


async def choose_runtime(
    kind: str, containerd_socket: str | None, labels: dict[str, str]
) -> tuple[str, RuntimeService]:
    """The runtime to run on (resolving `auto`, see the module doc) and the Node labels to
    register with (`labels` plus the simulated marker where it applies)."""
    if kind == "auto":
        kind, why = await detect_runtime(containerd_socket)
        if kind == "simulated":
            log.warning(
                "WARNING: %s; using the SIMULATED container runtime: pods will be reported "
                "Running but NO container process starts (node labelled %s=simulated; start "
                "containerd or pass --containerd-socket for real containers)",
                why,
                RUNTIME_LABEL,
            )
    if kind == "simulated":
        labels[RUNTIME_LABEL] = "simulated"
    return kind, make_runtime(kind, containerd_socket)
