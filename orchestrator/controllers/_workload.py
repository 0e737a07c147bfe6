"""Pod-state helpers shared by the DaemonSet and StatefulSet controllers (private).

These are small, synchronous and free of I/O except `slow_start`. They mirror upstream's
`podutil` (readiness, availability), `controller.ComputeHash` (template hashes) and
`intstr.GetScaledValueFromIntOrPercent`. When `orchestrator/controllers/podutil.py` (written
for the ReplicaSet/Deployment controllers) settles, these can be replaced by it.

`Expectations` is a level-based variant of upstream's ControllerExpectations: instead of
counting informer events it remembers *which* writes a controller made and asks the cache
whether it shows them yet (a created pod's resourceVersion is at or below the informer's; a
deleted pod is gone, replaced (another uid) or terminating). A controller acts only when its
own last writes are visible, so it never acts twice on a stale cache (two pods on one node,
two old pods deleted where maxUnavailable allowed one). Records expire after `timeout`
(upstream's 5 minutes) so a lost event cannot wedge a controller.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import trio

from ..api.schema.columns import parse_rfc3339
from .runtime.informer import SharedInformer

Obj = dict[str, Any]
T = TypeVar("T")

REVISION_LABEL = "controller-revision-hash"
EXPECTATIONS_TIMEOUT = 300.0  # seconds, upstream's ExpectationsTimeout
_SAFE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # apimachinery rand.SafeEncodeString


def meta(obj: Obj) -> Obj:
    m = obj.get("metadata")
    return m if isinstance(m, dict) else {}


def spec(obj: Obj) -> Obj:
    s = obj.get("spec")
    return s if isinstance(s, dict) else {}


def template_hash(template: Obj, collision_count: int = 0) -> str:
    """A short, stable, DNS-label-safe hash of a pod template (upstream's ComputeHash shape:
    FNV-1a 32 over a canonical encoding, plus the collision count, safe-encoded)."""
    data = json.dumps(template, sort_keys=True, separators=(",", ":")).encode()
    if collision_count:
        data += str(collision_count).encode()
    h = 0x811C9DC5
    for byte in data:
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return "".join(_SAFE_ALPHABET[ord(c) % len(_SAFE_ALPHABET)] for c in str(h))


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


def is_terminating(pod: Obj) -> bool:
    return bool(meta(pod).get("deletionTimestamp"))


def phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase") or "")


def _ready_condition(pod: Obj) -> Obj | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == "Ready":
            return cond
    return None


def is_ready(pod: Obj) -> bool:
    """The pod's Ready condition is True."""
    cond = _ready_condition(pod)
    return cond is not None and cond.get("status") == "True"


def is_running_and_ready(pod: Obj) -> bool:
    return phase(pod) == "Running" and is_ready(pod)


def available_in(pod: Obj, min_ready_seconds: int, now: float) -> float | None:
    """Seconds until a ready pod counts as available (0: it is); None: not ready."""
    cond = _ready_condition(pod)
    if cond is None or cond.get("status") != "True":
        return None
    if min_ready_seconds <= 0:
        return 0.0
    since = parse_rfc3339(str(cond.get("lastTransitionTime") or ""))
    if since is None:
        return 0.0
    return max(0.0, since + min_ready_seconds - now)


def is_available(pod: Obj, min_ready_seconds: int, now: float) -> bool:
    """Ready for at least `min_ready_seconds` (upstream's IsPodAvailable)."""
    return available_in(pod, min_ready_seconds, now) == 0.0


def created_at(pod: Obj) -> float:
    return parse_rfc3339(str(meta(pod).get("creationTimestamp") or "")) or 0.0


def owner_reference(owner: Obj) -> Obj:
    m = meta(owner)
    return {
        "apiVersion": owner.get("apiVersion", "apps/v1"),
        "kind": owner.get("kind", ""),
        "name": m.get("name", ""),
        "uid": m.get("uid", ""),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _int_rv(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


@dataclass
class _Pending:
    since: float
    create_rv: int = 0
    deleted: dict[str, str] = field(default_factory=dict)  # pod key -> uid


class Expectations:
    """Writes each controller key made that the pod cache may not show yet (module doc)."""

    def __init__(
        self, timeout: float = EXPECTATIONS_TIMEOUT, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.timeout = timeout
        self.clock = clock
        self._pending: dict[str, _Pending] = {}

    def _record(self, key: str) -> _Pending:
        p = self._pending.get(key)
        if p is None:
            p = self._pending[key] = _Pending(self.clock())
        return p

    def created(self, key: str, pod: Obj) -> None:
        p = self._record(key)
        p.create_rv = max(p.create_rv, _int_rv(meta(pod).get("resourceVersion")))

    def deleted(self, key: str, pod: Obj) -> None:
        m = meta(pod)
        self._record(key).deleted[f"{m.get('namespace', '')}/{m.get('name', '')}"] = str(
            m.get("uid", "")
        )

    def forget(self, key: str) -> None:
        self._pending.pop(key, None)

    def satisfied(self, key: str, pods: SharedInformer) -> bool:
        """True when the cache shows every recorded write of `key` (or the record expired);
        a satisfied record is dropped."""
        p = self._pending.get(key)
        if p is None:
            return True
        if self.clock() - p.since > self.timeout:
            del self._pending[key]
            return True
        if _int_rv(pods.resource_version) < p.create_rv:
            return False
        for pod_key, uid in p.deleted.items():
            cached = pods.get(pod_key)
            if cached is not None and meta(cached).get("uid") == uid and not is_terminating(cached):
                return False
        del self._pending[key]
        return True


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
