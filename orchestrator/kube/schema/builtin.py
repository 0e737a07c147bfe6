"""The built-in kinds the API server always serves, and a Registry holding them.

`builtin_kinds()` is the single list every other part reads (discovery, OpenAPI, handlers,
controllers). Adding a built-in kind means writing its module and adding it here.

Invariant: plurals are unique per group and kinds unique per group/version.
"""

from __future__ import annotations

from orchestrator.kube.schema.apiextensions_v1 import CRD
from orchestrator.kube.schema.apps_v1 import APPS_V1_KINDS
from orchestrator.kube.schema.coordination_v1 import LEASE
from orchestrator.kube.schema.core_v1 import CORE_V1_KINDS
from orchestrator.kube.schema.discovery_v1 import ENDPOINT_SLICE
from orchestrator.kube.schema.kind import Kind, Registry


def builtin_kinds() -> list[Kind]:
    return [*CORE_V1_KINDS, *APPS_V1_KINDS, LEASE, ENDPOINT_SLICE, CRD]


def builtin_registry() -> Registry:
    """A fresh Registry of the built-in kinds (custom kinds are added to it as CRDs appear)."""
    return Registry(builtin_kinds())
