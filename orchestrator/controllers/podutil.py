"""What the workload controllers share: pod state, template hashes, owner references, claims
and expectations. Pure code (no I/O; `now` is always an argument).

Theory of operation
-------------------
*Pod state.* A pod is **active** while it is neither finished (phase Succeeded/Failed) nor being
deleted (deletionTimestamp set): only active pods count towards a ReplicaSet's replicas. It is
**ready** when its `Ready` condition is True, and **available** when it has been ready for at
least `minReadySeconds` (measured from the Ready condition's lastTransitionTime).

*Template hash.* `pod_template_hash(template, collision_count)` is the `pod-template-hash` label
value of a Deployment's ReplicaSet: FNV-1a (32 bit) of the template's canonical JSON (sorted
keys), plus the collision count when set, printed in decimal and spelled with apimachinery's
`SafeEncodeString` alphabet (no vowels, no look-alike digits), e.g. `7c5ddbdf54`. Stable across
processes and runs: the same template always names the same ReplicaSet, which is how a rollback
(`kubectl rollout undo`) finds and reuses the old one.

*Claims.* `claim(owner_uid, selector, objects)` is controller-runtime's / kube's
`ControllerRefManager` as a pure function: an object whose controller reference is the owner
is kept while the selector still matches it and released (orphaned) otherwise; an object with
no controller reference that matches is adopted (unless the owner or the object is being
deleted); objects controlled by someone else are never touched.

*Expectations.* Upstream's `ControllerExpectations` count pod add/delete events so a controller
never acts twice on a cache that has not yet seen its own writes. Ours are the same promise,
checked level-based against the cache instead of counted from events:

* creations: the API's resourceVersions are one global revision, so "the cache has seen every
  pod I created" is `cache.resource_version >= the largest resourceVersion of my creates` (this
  also covers a pod created and deleted again before the cache looked: a count would wait for
  an ADDED event forever, a revision does not);
* deletions: every pod deleted (by uid) is gone from the cache, or is there with a
  deletionTimestamp (so no longer counted as active);
* a record older than `EXPECTATIONS_TIMEOUT` (5 min, as upstream) is treated as satisfied, so a
  lost watch event can delay a controller but never wedge it.

Invariant: while a key's expectations are unsatisfied its controller creates and deletes
nothing for it (it still writes status), so a lagging watch can never cause double creation.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from orchestrator.controllers.runtime.informer import (
    NAMESPACE_INDEX,
    SharedInformer,
    deleted_object,
    object_key,
)
from orchestrator.kube.conditions import condition_true, get_condition
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.columns import parse_rfc3339
from orchestrator.kube.selectors import LabelSelector

__all__ = [
    "EXPECTATIONS_TIMEOUT",
    "ORPHAN_INDEX",
    "POD_TEMPLATE_HASH_LABEL",
    "Cache",
    "Claims",
    "Expectations",
    "Obj",
    "claim",
    "controller_ref",
    "creation_time",
    "enqueue_selecting_services",
    "ensure_orphan_index",
    "int_value",
    "is_pod_active",
    "is_pod_available",
    "is_pod_ready",
    "labels_of",
    "meta",
    "pod_ready_since",
    "pod_template_hash",
    "safe_encode",
    "selector_matches",
    "target_port",
]


POD_TEMPLATE_HASH_LABEL = "pod-template-hash"
EXPECTATIONS_TIMEOUT = 300.0  # seconds (upstream ExpectationsTimeout)

_SAFE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # apimachinery util/rand
_FNV_OFFSET = 0x811C9DC5
_FNV_PRIME = 0x01000193


class Cache(Protocol):
    """The part of a `SharedInformer` the workload controllers read (a fake in tests)."""

    resource_version: str

    def get(self, key: str) -> Obj | None: ...

    def by_index(self, name: str, value: str) -> list[Obj]: ...


# ------------------------------------------------------------------------------ small accessors
def meta(obj: Obj) -> Obj:
    m = obj.get("metadata")
    return m if isinstance(m, dict) else {}


def labels_of(obj: Obj) -> dict[str, str]:
    labels = meta(obj).get("labels")
    return labels if isinstance(labels, dict) else {}


def int_value(value: Any, default: int = 0) -> int:
    """An integer field that may be missing (None) or, in a cache of JSON, a float."""
    if isinstance(value, bool) or value is None:
        return default
    if isinstance(value, int | float):
        return int(value)
    try:
        return int(str(value))
    except ValueError:
        return default


def creation_time(obj: Obj) -> float:
    return parse_rfc3339(str(meta(obj).get("creationTimestamp") or "")) or 0.0


# ------------------------------------------------------------------------------ pod state
def is_pod_active(pod: Obj) -> bool:
    """Not finished and not being deleted (upstream `IsPodActive`)."""
    phase = (pod.get("status") or {}).get("phase")
    return phase not in ("Succeeded", "Failed") and not meta(pod).get("deletionTimestamp")


def is_pod_ready(pod: Obj) -> bool:
    return condition_true(pod.get("status"), "Ready")


def pod_ready_since(pod: Obj) -> float | None:
    """When the pod became ready (its Ready condition's lastTransitionTime), None if not ready;
    0.0 when ready but the time is unknown."""
    cond = get_condition(pod.get("status"), "Ready")
    if cond is None or cond.get("status") != "True":
        return None
    return parse_rfc3339(str(cond.get("lastTransitionTime") or "")) or 0.0


def is_pod_available(pod: Obj, min_ready_seconds: int, now: float) -> bool:
    """Ready for at least `min_ready_seconds` (upstream `IsPodAvailable`)."""
    since = pod_ready_since(pod)
    if since is None:
        return False
    return min_ready_seconds <= 0 or since + min_ready_seconds <= now


# ------------------------------------------------------------------------------ template hash
def _fnv1a32(data: bytes) -> int:
    h = _FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFF
    return h


def safe_encode(text: str) -> str:
    """apimachinery's `rand.SafeEncodeString`: each byte mapped into a vowel-free alphabet."""
    return "".join(_SAFE_ALPHABET[ord(c) % len(_SAFE_ALPHABET)] for c in text)


def pod_template_hash(template: Obj, collision_count: int | None = None) -> str:
    """The `pod-template-hash` of a pod template (see the module doc)."""
    data = json.dumps(template, sort_keys=True, separators=(",", ":"), default=str).encode()
    if collision_count:
        data += str(collision_count).encode()
    return safe_encode(str(_fnv1a32(data)))


# ------------------------------------------------------------------------------ owner references
def controller_ref(owner: Obj, api_version: str, kind: str) -> Obj:
    """The ownerReference a controller puts on what it creates or adopts."""
    m = meta(owner)
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": m.get("name", ""),
        "uid": m.get("uid", ""),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _controller_uid(obj: Obj) -> str | None:
    for ref in meta(obj).get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller"):
            return str(ref.get("uid") or "")
    return None


@dataclass(slots=True)
class Claims:
    """What `claim` decided: `owned` (kept, including adoptions), `adopt`, `release`."""

    owned: list[Obj] = field(default_factory=list)
    adopt: list[Obj] = field(default_factory=list)
    release: list[Obj] = field(default_factory=list)


def claim(
    owner: Obj, selector: LabelSelector, objects: Iterable[Obj], *, can_adopt: bool = True
) -> Claims:
    """Sort `objects` into kept, to adopt and to release for `owner` (see the module doc).
    `can_adopt` False (the owner is being deleted) adopts nothing and releases nothing."""
    uid = str(meta(owner).get("uid") or "")
    owner_deleting = bool(meta(owner).get("deletionTimestamp"))
    out = Claims()
    for obj in objects:
        ref_uid = _controller_uid(obj)
        matches = selector.matches(labels_of(obj))
        if ref_uid is not None:
            if ref_uid != uid:
                continue
            if matches or owner_deleting or not can_adopt:
                out.owned.append(obj)
            else:
                out.release.append(obj)
            continue
        if not matches or owner_deleting or not can_adopt or meta(obj).get("deletionTimestamp"):
            continue
        out.adopt.append(obj)
        out.owned.append(obj)
    return out


ORPHAN_INDEX = "workloads:orphans-by-namespace"


def orphan_namespace(obj: Obj) -> list[str]:
    """Indexer: the namespace of an object without a controller reference (adoption
    candidates), so a sync looks at its orphans instead of at the whole namespace."""
    if _controller_uid(obj) is not None:
        return []
    return [str(meta(obj).get("namespace") or "")]


def ensure_orphan_index(informer: Any) -> None:
    """Add `ORPHAN_INDEX` to a shared informer once (several controllers may share it)."""
    with contextlib.suppress(ValueError):  # already there
        informer.add_indexer(ORPHAN_INDEX, orphan_namespace)


# ------------------------------------------------------------------------------ expectations
@dataclass(slots=True)
class _Record:
    created_rv: int  # the cache must reach this resourceVersion
    deleting: dict[str, str]  # pod key -> uid, each must leave the cache or be terminating
    at: float  # when the record was last raised


def _rv(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        return 0


class Expectations:
    """Per-controller-key expectations, checked against a pod cache (see the module doc)."""

    def __init__(self, timeout: float = EXPECTATIONS_TIMEOUT) -> None:
        self.timeout = timeout
        self._records: dict[str, _Record] = {}

    def _record(self, key: str, now: float) -> _Record:
        rec = self._records.get(key)
        if rec is None:
            rec = self._records[key] = _Record(0, {}, now)
        rec.at = now
        return rec

    def created(self, key: str, resource_version: str, now: float) -> None:
        """A create for `key` succeeded and returned this resourceVersion."""
        rec = self._record(key, now)
        rec.created_rv = max(rec.created_rv, _rv(resource_version))

    def deleted(self, key: str, pod_key: str, uid: str, now: float) -> None:
        """A delete for `key` of pod `pod_key` (with `uid`) succeeded."""
        self._record(key, now).deleting[pod_key] = uid

    def forget(self, key: str) -> None:
        """Drop the record (the controller object is gone)."""
        self._records.pop(key, None)

    def pending(self, key: str) -> bool:
        return key in self._records

    def satisfied(self, key: str, cache: Cache, now: float) -> bool:
        """True when `cache` has seen every write recorded for `key` (or the record expired);
        a satisfied record is dropped."""
        rec = self._records.get(key)
        if rec is None:
            return True
        if now - rec.at >= self.timeout:
            del self._records[key]
            return True
        if rec.created_rv and _rv(cache.resource_version) < rec.created_rv:
            return False
        for pod_key, uid in list(rec.deleting.items()):
            pod = cache.get(pod_key)
            if pod is None or meta(pod).get("uid") != uid or meta(pod).get("deletionTimestamp"):
                del rec.deleting[pod_key]
        if rec.deleting:
            return False
        del self._records[key]
        return True

    def expires_in(self, key: str, now: float) -> float | None:
        rec = self._records.get(key)
        return None if rec is None else max(0.0, rec.at + self.timeout - now)


def selector_matches(selector: dict[str, Any], labels: dict[str, Any]) -> bool:
    """A Service's map selector: non-empty, and each of its pairs among `labels`."""
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def target_port(pod: Obj, target: Any) -> int | None:
    """A Service port's `targetPort` on `pod`: a number as is, a name looked up among the
    pod's container ports (None: the pod has no port of that name)."""
    if isinstance(target, int) and not isinstance(target, bool):
        return target
    text = str(target)
    if text.isdigit():
        return int(text)
    for c in (pod.get("spec") or {}).get("containers") or []:
        for p in (c or {}).get("ports") or []:
            if isinstance(p, dict) and p.get("name") == text and p.get("containerPort"):
                return int(p["containerPort"])
    return None


def enqueue_selecting_services(
    pods: SharedInformer, services: SharedInformer, enqueue: Callable[[str], None]
) -> None:
    """On each pod event, `enqueue` the key of every Service of the pod's namespace whose
    selector matches the pod's new or old labels (`services` indexed by `NAMESPACE_INDEX`)."""

    def changed(pod: Obj, old: Obj | None = None) -> None:
        meta = pod.get("metadata") or {}
        labels = [meta.get("labels") or {}]
        if old is not None:
            labels.append((old.get("metadata") or {}).get("labels") or {})
        for svc in services.by_index(NAMESPACE_INDEX, str(meta.get("namespace") or "")):
            selector = (svc.get("spec") or {}).get("selector") or {}
            if any(selector_matches(selector, lb) for lb in labels):
                enqueue(object_key(svc))

    pods.add_event_handler(
        on_add=changed,
        on_update=lambda old, new: changed(new, old),
        on_delete=lambda obj: changed(deleted_object(obj)),
    )
