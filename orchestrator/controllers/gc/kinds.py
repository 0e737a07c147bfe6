"""Which resources the garbage collector and the namespace controller look at: every kind the
server serves with list, watch and delete (custom kinds included; Events only when asked, as
they never own anything and are too many to cache), as `ResourceInfo`s that reuse the
well-known constants so informers are shared with the other controllers."""

from __future__ import annotations

from orchestrator.client import ResourceInfo
from orchestrator.client import resource as _known
from orchestrator.kube.schema.kind import Kind
from orchestrator.kube.schema.kind import Registry as KindRegistry

_SKIPPED = {("", "events")}  # never owners in practice; too many to cache


# ------------------------------------------------------------------------------ kinds
def resource_info(kind: Kind) -> ResourceInfo:
    """The `ResourceInfo` of a served kind: the well-known constant when there is one (so
    informers are shared with other controllers), else one built from the kind."""
    for value in vars(_known).values():
        if isinstance(value, ResourceInfo) and (value.group, value.version, value.plural) == (
            kind.group,
            kind.version,
            kind.plural,
        ):
            return value
    return ResourceInfo(
        kind.group,
        kind.version,
        kind.plural,
        kind.kind,
        kind.namespaced,
        kind.singular,
        kind.short_names,
        kind.verbs,
        kind.categories,
        tuple(sorted(kind.subresources)),
    )


def served_resources(
    registry: KindRegistry, *, namespaced_only: bool = False, events: bool = False
) -> list[ResourceInfo]:
    """One resource per (group, plural) the server serves with list, watch and delete (the
    first version seen for kinds served in several); Events only when `events`."""
    out: dict[tuple[str, str], ResourceInfo] = {}
    for kind in registry:
        key = (kind.group, kind.plural)
        if key in out or (key in _SKIPPED and not events):
            continue
        if namespaced_only and not kind.namespaced:
            continue
        if not {"list", "watch", "delete"} <= set(kind.verbs):
            continue
        out[key] = resource_info(kind)
    return list(out.values())
