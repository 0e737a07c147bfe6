"""A Kubernetes REST client for the CLI, controllers and node agents (HTTPS, trio-friendly).

Public surface: `load_kubeconfig` -> `ClientConfig`; `RestClient` (CRUD, the four patch types,
watch and streams; errors as `ApiException`); `discover` -> `ResourceMapper` (what `deploy` or
`po` means); `ResourceInfo` and well-known built-in resources. Nothing here prints.
"""

import importlib
from typing import TYPE_CHECKING, Any

from orchestrator.client.protocol import (
    APPLY_PATCH,
    JSON,
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    TABLE_ACCEPT,
    ApiConnectionError,
    ApiException,
    WatchDecoder,
    WatchEvent,
)
from orchestrator.client.resource import (
    DEPLOYMENTS,
    EVENTS,
    NAMESPACES,
    NODES,
    PODS,
    REPLICASETS,
    ResourceInfo,
)

if TYPE_CHECKING:
    from orchestrator.client.config import (
        ClientConfig,
        ConfigError,
        default_kubeconfig_paths,
        load_kubeconfig,
    )
    from orchestrator.client.discovery import (
        ResourceMapper,
        ResourceNotFound,
        discover,
        parse_resource_lists,
    )
    from orchestrator.client.rest import RestClient

# Imported on first use (`__getattr__`), not with the package: the transport (httpx) and the
# kubeconfig reader (yaml) would otherwise be loaded into every process that only needs the
# values above, such as the server, whose controllers and agent use the in-process client.
_LAZY = {
    "ClientConfig": "config",
    "ConfigError": "config",
    "default_kubeconfig_paths": "config",
    "load_kubeconfig": "config",
    "ResourceMapper": "discovery",
    "ResourceNotFound": "discovery",
    "discover": "discovery",
    "parse_resource_lists": "discovery",
    "RestClient": "rest",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "APPLY_PATCH",
    "DEPLOYMENTS",
    "EVENTS",
    "JSON",
    "JSON_PATCH",
    "MERGE_PATCH",
    "NAMESPACES",
    "NODES",
    "PODS",
    "REPLICASETS",
    "STRATEGIC_MERGE_PATCH",
    "TABLE_ACCEPT",
    "ApiConnectionError",
    "ApiException",
    "ClientConfig",
    "ConfigError",
    "ResourceInfo",
    "ResourceMapper",
    "ResourceNotFound",
    "RestClient",
    "WatchDecoder",
    "WatchEvent",
    "default_kubeconfig_paths",
    "discover",
    "load_kubeconfig",
    "parse_resource_lists",
]
