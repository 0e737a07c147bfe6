"""coordination.k8s.io/v1 Lease: a named lock with a holder and a renew time, as `LEASE`.

Used for leader election among controllers and for node heartbeats (one Lease per node in the
`kube-node-lease` namespace, which `kubectl describe node` reads). Times are micro-times.

Invariant: no defaults and no checks beyond the schema.
"""

from __future__ import annotations

from orchestrator.kube.schema.builders import integer, micro_timestamp, obj, string
from orchestrator.kube.schema.columns import AGE, NAME
from orchestrator.kube.schema.kind import Column, Kind
from orchestrator.kube.schema.meta import get, object_schema

COORD = "io.k8s.api.coordination.v1"

LEASE_SPEC = obj(
    "Who holds the lease and until when.",
    {
        "holderIdentity": string("Identity of the current holder."),
        "leaseDurationSeconds": integer(
            "Seconds after renewTime that other candidates must wait before taking over."
        ),
        "acquireTime": micro_timestamp("When the current holder acquired the lease."),
        "renewTime": micro_timestamp("When the holder last renewed the lease."),
        "leaseTransitions": integer("Times the lease has changed holders."),
        "strategy": string("Coordinated leader election strategy."),
        "preferredHolder": string("Holder that should take over next."),
    },
    name=f"{COORD}.LeaseSpec",
)

LEASE = Kind(
    group="coordination.k8s.io",
    version="v1",
    kind="Lease",
    plural="leases",
    singular="lease",
    namespaced=True,
    schema=object_schema(f"{COORD}.Lease", "A lock held by one holder at a time.", LEASE_SPEC),
    description="A lock held by one holder at a time.",
    columns=(
        NAME,
        Column(
            "Holder",
            "string",
            "Identity of the current holder.",
            lambda o, n: str(get(o, "spec.holderIdentity", "")),
        ),
        AGE,
    ),
)
