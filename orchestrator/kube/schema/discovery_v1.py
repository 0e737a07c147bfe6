"""discovery.k8s.io/v1 EndpointSlice: the schema, defaults, validation and Table columns, as
`ENDPOINT_SLICE`.

An EndpointSlice lists some of the backends of a Service (the label
`kubernetes.io/service-name` names it): `addressType` (IPv4, IPv6 or FQDN, immutable), up to
1000 `endpoints` (each 1-100 `addresses` of that type, `conditions` ready/serving/terminating,
`hostname`, `nodeName`, `zone`, `targetRef`, `hints`) and the `ports` they all serve. The
EndpointSlice controller (`orchestrator.controllers.endpointslice`) writes them; the node proxy
and the node-local DNS read them. As upstream, each port defaults `name` to "" and `protocol`
to TCP. No protobuf form: no typed client creates slices (JSON only).

Invariants: defaults are idempotent; validation follows upstream's `ValidateEndpointSlice`
(address syntax per `addressType`, hostname a DNS label, port names unique DNS labels);
Table cells follow kubectl's `printEndpointSlice` (`formatDiscoveryPorts`,
`formatDiscoveryEndpoints`).
"""

from __future__ import annotations

import ipaddress
from typing import Any

from orchestrator.kube.errors import Cause
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.builders import array, boolean, integer, obj, string, string_map
from orchestrator.kube.schema.columns import AGE, NAME
from orchestrator.kube.schema.core_v1_service import OBJECT_REFERENCE, PROTOCOLS
from orchestrator.kube.schema.kind import Column, Kind
from orchestrator.kube.schema.meta import (
    dict_list,
    duplicate,
    get,
    invalid,
    object_schema,
    port_range,
    required,
)
from orchestrator.kube.schema.names import is_dns1123_label, is_dns1123_subdomain

DISCOVERY = "io.k8s.api.discovery.v1"
ADDRESS_TYPES = ("IPv4", "IPv6", "FQDN")
MAX_ENDPOINTS = 1000  # per slice (upstream's maxEndpoints)
MAX_ADDRESSES = 100  # per endpoint
MAX_PORTS = 20000

LABEL_SERVICE_NAME = "kubernetes.io/service-name"
LABEL_MANAGED_BY = "endpointslice.kubernetes.io/managed-by"

_FOR_ZONE = obj(
    "A zone an endpoint should serve.",
    {"name": string("Name of the zone.")},
    required=("name",),
    name=f"{DISCOVERY}.ForZone",
)
_FOR_NODE = obj(
    "A node an endpoint should serve.",
    {"name": string("Name of the node.")},
    required=("name",),
    name=f"{DISCOVERY}.ForNode",
)

ENDPOINT_CONDITIONS = obj(
    "The current state of an endpoint.",
    {
        "ready": boolean("The endpoint is ready to receive traffic (serving and not terminating)."),
        "serving": boolean("The endpoint passes its readiness checks, even while terminating."),
        "terminating": boolean("The endpoint is terminating (its pod is being deleted)."),
    },
    name=f"{DISCOVERY}.EndpointConditions",
)

ENDPOINT = obj(
    "One backend of the service.",
    {
        "addresses": array(
            {"type": "string"},
            "Addresses of the backend, of the slice's addressType (at most 100).",
            list_type="set",
        ),
        "conditions": ENDPOINT_CONDITIONS,
        "hostname": string("Host name of the backend, a DNS label (for DNS records)."),
        "targetRef": OBJECT_REFERENCE,
        "deprecatedTopology": string_map("Topology labels (deprecated: use nodeName and zone)."),
        "nodeName": string("Node hosting the backend."),
        "zone": string("Zone of the backend."),
        "hints": obj(
            "Where the endpoint should be consumed (topology aware routing).",
            {
                "forZones": array(_FOR_ZONE, "Zones to serve.", list_type="atomic"),
                "forNodes": array(_FOR_NODE, "Nodes to serve.", list_type="atomic"),
            },
            name=f"{DISCOVERY}.EndpointHints",
        ),
    },
    required=("addresses",),
    name=f"{DISCOVERY}.Endpoint",
)

ENDPOINT_PORT = obj(
    "A port every endpoint of the slice serves.",
    {
        "name": string("Name of the service port; empty for an unnamed port."),
        "protocol": string("Transport protocol; TCP by default.", enum=PROTOCOLS),
        "port": integer("Port number; unset means every port."),
        "appProtocol": string("Application protocol hint."),
    },
    name=f"{DISCOVERY}.EndpointPort",
    map_type="atomic",
)


def default_endpoint_slice(slice_: Obj) -> None:
    if slice_.get("endpoints") is None:
        slice_["endpoints"] = []  # Go clients send `null` for an empty list
    for port in dict_list(slice_, "ports"):
        port.setdefault("name", "")
        port.setdefault("protocol", "TCP")


def _address_errors(address_type: str, value: Any) -> list[str]:
    if not isinstance(value, str):
        return ["must be a string"]
    if address_type == "FQDN":
        return is_dns1123_subdomain(value)
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        return [f"must be a valid {address_type} address"]
    if (address_type == "IPv4") != (ip.version == 4):
        return [f"must be a valid {address_type} address"]
    return []


def validate_endpoint_slice(new: Obj, old: Obj | None) -> list[Cause]:
    causes: list[Cause] = []
    address_type = new.get("addressType")
    if not address_type:
        causes.append(required("addressType"))
    elif address_type not in ADDRESS_TYPES:
        causes.append(
            Cause(
                "addressType",
                f'Unsupported value: "{address_type}": supported values: '
                + ", ".join(f'"{t}"' for t in ADDRESS_TYPES),
                "FieldValueNotSupported",
            )
        )
    if old is not None and old.get("addressType") != address_type:
        causes.append(invalid("addressType", address_type, "field is immutable"))
    endpoints = dict_list(new, "endpoints")
    if len(endpoints) > MAX_ENDPOINTS:
        causes.append(
            Cause("endpoints", f"Too many: {len(endpoints)}: must have at most {MAX_ENDPOINTS}")
        )
    for i, ep in enumerate(endpoints):
        path = f"endpoints[{i}]"
        addresses = ep.get("addresses") or []
        if not addresses:
            causes.append(required(f"{path}.addresses", "must contain at least 1 address"))
        elif len(addresses) > MAX_ADDRESSES:
            causes.append(
                Cause(
                    f"{path}.addresses",
                    f"Too many: {len(addresses)}: must have at most {MAX_ADDRESSES} items",
                )
            )
        if address_type in ADDRESS_TYPES:
            for j, addr in enumerate(addresses):
                causes.extend(
                    invalid(f"{path}.addresses[{j}]", addr, m)
                    for m in _address_errors(str(address_type), addr)
                )
        hostname = ep.get("hostname")
        if isinstance(hostname, str) and hostname:
            causes.extend(
                invalid(f"{path}.hostname", hostname, m) for m in is_dns1123_label(hostname)
            )
        node = ep.get("nodeName")
        if isinstance(node, str) and node:
            causes.extend(invalid(f"{path}.nodeName", node, m) for m in is_dns1123_subdomain(node))
    ports = dict_list(new, "ports")
    if len(ports) > MAX_PORTS:
        causes.append(Cause("ports", f"Too many: {len(ports)}: must have at most {MAX_PORTS}"))
    names: set[str] = set()
    for i, port in enumerate(ports):
        path = f"ports[{i}]"
        name = port.get("name")
        if isinstance(name, str) and name:
            causes.extend(invalid(f"{path}.name", name, m) for m in is_dns1123_label(name))
        if isinstance(name, str):
            if name in names:
                causes.append(duplicate(f"{path}.name", name))
            names.add(name)
        causes.extend(port_range(f"{path}.port", port.get("port")))
    return causes


def _more(items: list[str], count: int, limit: int = 3) -> str:
    """kubectl's listWithMoreString."""
    text = ",".join(items[:limit])
    if count > limit:
        return f"{text} + {count - limit} more..."
    return text or "<unset>"


def ports_cell(slice_: Obj, now: float) -> str:
    shown = []
    ports = dict_list(slice_, "ports")
    for p in ports:
        if p.get("port") is not None:
            shown.append(str(p["port"]))
        elif p.get("name") is not None:
            shown.append(str(p["name"]))
        else:
            shown.append("*")
    return _more(shown, len(ports))


def endpoints_cell(slice_: Obj, now: float) -> str:
    addresses = [str(a) for ep in dict_list(slice_, "endpoints") for a in ep.get("addresses") or []]
    return _more(addresses, len(addresses))


ENDPOINT_SLICE = Kind(
    group="discovery.k8s.io",
    version="v1",
    kind="EndpointSlice",
    plural="endpointslices",
    singular="endpointslice",
    namespaced=True,
    schema=object_schema(
        f"{DISCOVERY}.EndpointSlice",
        "A subset of the endpoints of a service.",
        None,
        fields={
            "addressType": string("Type of the addresses: IPv4, IPv6 or FQDN (immutable)."),
            "endpoints": array(
                ENDPOINT, "Backends of the slice (at most 1000).", list_type="atomic"
            ),
            "ports": array(
                ENDPOINT_PORT, "Ports every endpoint of the slice serves.", list_type="atomic"
            ),
        },
        required=("addressType",),
    ),
    description="A subset of the endpoints of a service.",
    columns=(
        NAME,
        Column(
            "AddressType",
            "string",
            "Type of the addresses.",
            lambda o, n: str(get(o, "addressType", "")),
        ),
        Column("Ports", "string", "Ports of the endpoints.", ports_cell),
        Column("Endpoints", "string", "Addresses of the endpoints.", endpoints_cell),
        AGE,
    ),
    validate=validate_endpoint_slice,
    default=default_endpoint_slice,
)

__all__ = [
    "ADDRESS_TYPES",
    "ENDPOINT_SLICE",
    "LABEL_MANAGED_BY",
    "LABEL_SERVICE_NAME",
    "default_endpoint_slice",
    "validate_endpoint_slice",
]
