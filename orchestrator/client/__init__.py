"""A Kubernetes REST client for the CLI, controllers and node agents (HTTPS, trio-friendly).

Public surface: `load_kubeconfig` -> `ClientConfig`; `RestClient` (CRUD, the four patch types,
watch and streams; errors as `ApiException`); `discover` -> `ResourceMapper` (what `deploy` or
`po` means); `ResourceInfo` and well-known built-in resources. Nothing here prints.
"""

from .config import ClientConfig, ConfigError, default_kubeconfig_paths, load_kubeconfig
from .discovery import ResourceMapper, ResourceNotFound, discover, parse_resource_lists
from .resource import DEPLOYMENTS, EVENTS, NAMESPACES, NODES, PODS, REPLICASETS, ResourceInfo
from .rest import (
    APPLY_PATCH,
    JSON,
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    TABLE_ACCEPT,
    ApiConnectionError,
    ApiException,
    RestClient,
    WatchDecoder,
    WatchEvent,
)

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
