"""What the node-local DNS server and the pods' Service variables read of the cluster:
`ClusterView`, a snapshot of Services and EndpointSlices with a change counter.

The agent's Service cache (`agent.net.svccache`, fed by informers and kept in the local store
for outages) is the real source; this module only states the small protocol both sides meet
at, plus `SnapshotView`, a plain in-memory implementation for tests, and `BoundView`, which
the agent hands to its DNS server and pod workers before it opens its Service cache and binds
to that cache's view (`svccache.ServiceCacheView`) once open. Until bound (an agent without the
cache: the simulated runtime) it is empty: pods get only their own env, DNS answers NXDOMAIN
inside the cluster domain and forwards the rest.

Invariants: `generation` changes whenever what `services()` or `endpoint_slices()` return
changes (readers rebuild their indexes only then); the mappings returned are not mutated
afterwards by the view (a change replaces them), so a reader may keep them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from orchestrator.kube.objects import Obj

__all__ = ["SERVICE_NAME_LABEL", "BoundView", "ClusterView", "ServiceKey", "SnapshotView"]

ServiceKey = tuple[str, str]  # (namespace, name)
SERVICE_NAME_LABEL = "kubernetes.io/service-name"  # an EndpointSlice's owning Service


class ClusterView(Protocol):
    """Services and their EndpointSlices as the agent last saw them."""

    @property
    def generation(self) -> int:
        """Changes whenever the snapshot does."""
        ...

    def services(self) -> Mapping[ServiceKey, Obj]:
        """Every Service by (namespace, name)."""
        ...

    def endpoint_slices(self) -> Mapping[ServiceKey, Sequence[Obj]]:
        """The EndpointSlices of each Service, by the Service's (namespace, name)."""
        ...


def _meta(obj: Obj) -> tuple[str, str]:
    m = obj.get("metadata") or {}
    return str(m.get("namespace") or ""), str(m.get("name") or "")


class SnapshotView:
    """An in-memory `ClusterView`, updated object by object (as an informer's handlers would)
    or replaced whole; each change makes new mappings and bumps `generation`."""

    def __init__(self, services: Sequence[Obj] = (), slices: Sequence[Obj] = ()) -> None:
        self._generation = 0
        self._services: dict[ServiceKey, Obj] = {}
        self._slices: dict[ServiceKey, dict[str, Obj]] = {}
        self._slice_view: dict[ServiceKey, tuple[Obj, ...]] = {}
        self.replace(services, slices)

    @property
    def generation(self) -> int:
        return self._generation

    def services(self) -> Mapping[ServiceKey, Obj]:
        return self._services

    def endpoint_slices(self) -> Mapping[ServiceKey, Sequence[Obj]]:
        return self._slice_view

    def replace(self, services: Sequence[Obj], slices: Sequence[Obj]) -> None:
        """The whole snapshot at once (an informer's initial list)."""
        self._services = {_meta(s): s for s in services}
        self._slices = {}
        for sl in slices:
            key = self._slice_owner(sl)
            if key is not None:
                self._slices.setdefault(key, {})[_meta(sl)[1]] = sl
        self._publish()

    def apply(self, obj: Obj) -> None:
        """A Service or EndpointSlice added or changed."""
        kind = obj.get("kind")
        if kind == "Service":
            self._services = {**self._services, _meta(obj): obj}
        elif kind == "EndpointSlice":
            key = self._slice_owner(obj)
            if key is None:
                return
            self._slices = {**self._slices, key: {**self._slices.get(key, {}), _meta(obj)[1]: obj}}
        else:
            raise ValueError(f"a ClusterView holds Services and EndpointSlices, not {kind!r}")
        self._publish()

    def delete(self, obj: Obj) -> None:
        """A Service or EndpointSlice deleted (unknown ones are ignored)."""
        if obj.get("kind") == "Service":
            self._services = {k: v for k, v in self._services.items() if k != _meta(obj)}
        elif obj.get("kind") == "EndpointSlice":
            key = self._slice_owner(obj)
            if key is None or key not in self._slices:
                return
            rest = {n: s for n, s in self._slices[key].items() if n != _meta(obj)[1]}
            self._slices = {**self._slices, key: rest}
        self._publish()

    @staticmethod
    def _slice_owner(sl: Obj) -> ServiceKey | None:
        ns, _ = _meta(sl)
        owner = ((sl.get("metadata") or {}).get("labels") or {}).get(SERVICE_NAME_LABEL)
        return (ns, str(owner)) if owner else None

    def _publish(self) -> None:
        self._slice_view = {k: tuple(v.values()) for k, v in self._slices.items() if v}
        self._generation += 1


class BoundView:
    """A `ClusterView` that reads another one bound later (`bind`), and is empty before.
    `generation` stays increasing across the bind."""

    def __init__(self) -> None:
        self._source: ClusterView = SnapshotView()
        self._base = 0

    def bind(self, source: ClusterView) -> None:
        self._base = self.generation + 1
        self._source = source

    @property
    def generation(self) -> int:
        return self._base + self._source.generation

    def services(self) -> Mapping[ServiceKey, Obj]:
        return self._source.services()

    def endpoint_slices(self) -> Mapping[ServiceKey, Sequence[Obj]]:
        return self._source.endpoint_slices()
