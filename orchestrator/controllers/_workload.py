"""Pod-state helpers the DaemonSet and StatefulSet controllers add to `podutil` (private).

`podutil` (shared with the ReplicaSet/Deployment controllers) has readiness, availability,
template hashes, controller references and level-based expectations; this module adds what
only these two controllers need: the `controller-revision-hash` label, int-or-percent scaling
(`intstr.GetScaledValueFromIntOrPercent`), "available in how long" for minReadySeconds
requeues, and slow-start batches for creates.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import trio

from orchestrator.controllers.podutil import is_pod_ready, meta, pod_ready_since
from orchestrator.kube.objects import Obj

T = TypeVar("T")

REVISION_LABEL = "controller-revision-hash"


def spec(obj: Obj) -> Obj:
    s = obj.get("spec")
    return s if isinstance(s, dict) else {}


def scaled_value(value: Any, total: int, *, round_up: bool) -> int:
    """An int-or-percent ("25%") against `total`; invalid values count as 0."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(0, value)
    if isinstance(value, str) and value.endswith("%"):
        try:
            pct = int(value[:-1])
        except ValueError:
            return 0
        exact = pct * total / 100
        return max(0, math.ceil(exact) if round_up else math.floor(exact))
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return 0


def is_terminating(obj: Obj) -> bool:
    return bool(meta(obj).get("deletionTimestamp"))


def phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase") or "")


def is_running_and_ready(pod: Obj) -> bool:
    return phase(pod) == "Running" and is_pod_ready(pod)


def available_in(pod: Obj, min_ready_seconds: int, now: float) -> float | None:
    """Seconds until a ready pod counts as available (0: it is); None: not ready."""
    since = pod_ready_since(pod)
    if since is None:
        return None
    if min_ready_seconds <= 0 or not since:
        return 0.0
    return max(0.0, since + min_ready_seconds - now)


async def slow_start(
    items: Sequence[T], fn: Callable[[T], Awaitable[None]], *, burst: int
) -> tuple[int, list[BaseException]]:
    """Run `fn` over at most `burst` items in batches of 1, 2, 4, ... (each batch concurrently);
    stop after the first batch with a failure. Returns (items attempted, errors)."""
    done = 0
    batch = 1
    todo = list(items[:burst])
    errors: list[BaseException] = []

    async def one(item: T) -> None:
        try:
            await fn(item)
        except Exception as exc:
            errors.append(exc)

    while done < len(todo) and not errors:
        chunk = todo[done : done + batch]
        async with trio.open_nursery() as nursery:
            for item in chunk:
                nursery.start_soon(one, item)
        done += len(chunk)
        batch *= 2
    return done, errors
