"""core/v1 Service and Endpoints: schemas, defaults, validation, columns and their Kinds.

Service ports merge by `port` (SSA keys port+protocol); `selector` is an atomic map for SSA.
A Service gets `type: ClusterIP`, `sessionAffinity: None`, `internalTrafficPolicy: Cluster`,
and each port `protocol: TCP` and `targetPort` = `port` by default; cluster IPs are allocated
elsewhere (not a default). Endpoints are written by the endpoints controller.

Invariants: defaults are idempotent; Table cells follow kubectl's `printService` and
`formatEndpoints`.
"""

from __future__ import annotations

from typing import Any

from orchestrator.kube.errors import Cause
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.builders import (
    array,
    boolean,
    int_or_string,
    integer,
    obj,
    string,
    string_map,
    strings,
)
from orchestrator.kube.schema.columns import AGE, NAME, NONE
from orchestrator.kube.schema.core_v1_container import V1
from orchestrator.kube.schema.kind import Column, Kind
from orchestrator.kube.schema.meta import (
    condition,
    conditions,
    dict_list,
    duplicate,
    ensure,
    format_labels,
    get,
    invalid,
    object_schema,
    port_range,
    required,
    sub,
)
from orchestrator.kube.schema.names import is_dns1123_label
from orchestrator.kube.schema.proto import INT32, MESSAGE, STRING, message, ptr, wire

PROTOCOLS = ("TCP", "UDP", "SCTP")
SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName")

OBJECT_REFERENCE = obj(
    "A reference to an object, possibly a field within it.",
    {
        "kind": string("Kind of the referent."),
        "namespace": string("Namespace of the referent."),
        "name": string("Name of the referent."),
        "uid": string("UID of the referent."),
        "apiVersion": string("API version of the referent."),
        "resourceVersion": string("Resource version the reference was made at."),
        "fieldPath": string("A field within the referent, e.g. spec.containers{web}."),
    },
    name=f"{V1}.ObjectReference",
    map_type="atomic",
    proto={
        "kind": 1,
        "namespace": 2,
        "name": 3,
        "uid": 4,
        "apiVersion": 5,
        "resourceVersion": 6,
        "fieldPath": 7,
    },
)

SERVICE_PORT = obj(
    "A port the service exposes.",
    {
        "name": string("Port name; required when there are several ports."),
        "protocol": string("Transport protocol; TCP by default.", default="TCP", enum=PROTOCOLS),
        "appProtocol": string("Application protocol hint, e.g. http or kubernetes.io/h2c."),
        "port": integer("Port the service listens on."),
        "targetPort": int_or_string("Pod port number or named port; `port` by default."),
        "nodePort": integer("Port on every node, for NodePort and LoadBalancer services."),
    },
    required=("port",),
    name=f"{V1}.ServicePort",
    proto={
        "name": 1,
        "protocol": 2,
        "port": 3,
        "targetPort": 4,
        "nodePort": 5,
        "appProtocol": ptr(6),
    },
)

SERVICE_SPEC = obj(
    "How the service is exposed and which pods back it.",
    {
        "type": string("How the service is exposed; ClusterIP by default.", enum=SERVICE_TYPES),
        "selector": string_map("Pods with these labels back the service.", map_type="atomic"),
        "ports": array(
            SERVICE_PORT,
            "Ports the service exposes.",
            patch_strategy="merge",
            merge_key="port",
            list_type="map",
            map_keys=("port", "protocol"),
        ),
        "clusterIP": string('Virtual IP of the service; "None" for a headless service.'),
        "clusterIPs": strings("Virtual IPs, one per IP family; the first equals clusterIP."),
        "externalIPs": strings("Extra IPs that route to the service."),
        "externalName": string("DNS name an ExternalName service aliases."),
        "sessionAffinity": string(
            "ClientIP keeps a client on one pod; None by default.", enum=("ClientIP", "None")
        ),
        "externalTrafficPolicy": string(
            "Whether external traffic may leave the node.", enum=("Cluster", "Local")
        ),
        "internalTrafficPolicy": string(
            "Whether in-cluster traffic may leave the node.", enum=("Cluster", "Local")
        ),
        "loadBalancerIP": string("Requested load balancer IP (deprecated)."),
        "loadBalancerSourceRanges": strings("Client CIDRs allowed through the load balancer."),
        "loadBalancerClass": string("Which load balancer implementation to use."),
        "allocateLoadBalancerNodePorts": boolean("Allocate node ports for a LoadBalancer."),
        "publishNotReadyAddresses": boolean("Include pods that are not ready in endpoints."),
        "ipFamilies": strings("IP families of the service: IPv4, IPv6."),
        "ipFamilyPolicy": string(
            "Single or dual stack.", enum=("SingleStack", "PreferDualStack", "RequireDualStack")
        ),
    },
    name=f"{V1}.ServiceSpec",
    proto={
        "ports": 1,
        "selector": 2,
        "clusterIP": 3,
        "type": 4,
        "externalIPs": 5,
        "sessionAffinity": 7,
        "loadBalancerIP": 8,
        "loadBalancerSourceRanges": 9,
        "externalName": 10,
        "externalTrafficPolicy": 11,
        "healthCheckNodePort": wire(12, INT32),
        "publishNotReadyAddresses": 13,
        "sessionAffinityConfig": wire(
            14,
            MESSAGE,
            msg=message(
                "v1.SessionAffinityConfig",
                {
                    "clientIP": wire(
                        1,
                        MESSAGE,
                        msg=message(
                            "v1.ClientIPConfig", {"timeoutSeconds": wire(1, INT32, keep=True)}
                        ),
                    )
                },
            ),
        ),
        "ipFamilyPolicy": ptr(17),
        "clusterIPs": 18,
        "ipFamilies": 19,
        "allocateLoadBalancerNodePorts": ptr(20),
        "loadBalancerClass": ptr(21),
        "internalTrafficPolicy": ptr(22),
        "trafficDistribution": wire(23, STRING, keep=True),
    },
)

LOAD_BALANCER_INGRESS = obj(
    "One ingress point of a load balancer.",
    {
        "ip": string("IP address."),
        "hostname": string("DNS name."),
        "ipMode": string("VIP or Proxy.", enum=("VIP", "Proxy")),
    },
    name=f"{V1}.LoadBalancerIngress",
    proto={
        "ip": 1,
        "hostname": 2,
        "ipMode": ptr(3),
        "ports": wire(
            4,
            MESSAGE,
            repeated=True,
            msg=message(
                "v1.PortStatus",
                {
                    "port": wire(1, INT32),
                    "protocol": wire(2, STRING),
                    "error": wire(3, STRING, keep=True),
                },
            ),
        ),
    },
)

SERVICE_STATUS = obj(
    "Observed state of the service.",
    {
        "loadBalancer": obj(
            "The load balancer, if any.",
            {"ingress": array(LOAD_BALANCER_INGRESS, "Ingress points.", list_type="atomic")},
            name=f"{V1}.LoadBalancerStatus",
            proto={"ingress": 1},
        ),
        "conditions": conditions(
            condition(
                "io.k8s.apimachinery.pkg.apis.meta.v1.Condition",
                "A condition.",
                extra={"observedGeneration": integer("Generation observed.", fmt="int64")},
                proto={
                    "type": 1,
                    "status": 2,
                    "observedGeneration": 3,
                    "lastTransitionTime": 4,
                    "reason": 5,
                    "message": 6,
                },
            )
        ),
    },
    name=f"{V1}.ServiceStatus",
    proto={"loadBalancer": 1, "conditions": 2},
)


def default_service(svc: Obj) -> None:
    spec = ensure(svc, "spec")
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    if spec.get("type") != "ExternalName":
        spec.setdefault("internalTrafficPolicy", "Cluster")
    if spec.get("type") in ("NodePort", "LoadBalancer"):
        spec.setdefault("externalTrafficPolicy", "Cluster")
    for port in dict_list(spec, "ports"):
        port.setdefault("protocol", "TCP")
        if port.get("targetPort") in (None, 0, "") and port.get("port") is not None:
            port["targetPort"] = port["port"]
    ensure(svc, "status").setdefault("loadBalancer", {})


def validate_service(new: Obj, old: Obj | None) -> list[Cause]:
    spec = sub(new, "spec")
    causes: list[Cause] = []
    ports = dict_list(spec, "ports")
    if not ports and spec.get("type") != "ExternalName" and spec.get("clusterIP") != "None":
        causes.append(required("spec.ports"))
    names: set[str] = set()
    keys: set[tuple[Any, Any]] = set()
    for i, p in enumerate(ports):
        path = f"spec.ports[{i}]"
        name = p.get("name")
        if len(ports) > 1 and not name:
            causes.append(required(f"{path}.name"))
        elif isinstance(name, str) and name:
            if name in names:
                causes.append(duplicate(f"{path}.name", name))
            names.add(name)
            causes.extend(invalid(f"{path}.name", name, m) for m in is_dns1123_label(name))
        causes.extend(port_range(f"{path}.port", p.get("port")))
        target = p.get("targetPort")
        if isinstance(target, int):
            causes.extend(port_range(f"{path}.targetPort", target))
        key = (p.get("port"), p.get("protocol", "TCP"))
        if key in keys:
            causes.append(duplicate(path, {"port": key[0], "protocol": key[1]}))
        keys.add(key)
        if p.get("nodePort") and spec.get("type") not in ("NodePort", "LoadBalancer"):
            causes.append(
                Cause(
                    f"{path}.nodePort",
                    "Forbidden: may not be used when `type` is 'ClusterIP'",
                    "FieldValueForbidden",
                )
            )
    if spec.get("type") == "ExternalName" and not spec.get("externalName"):
        causes.append(required("spec.externalName"))
    if old is not None:
        old_ip = get(old, "spec.clusterIP")
        if (
            old_ip
            and spec.get("clusterIP") not in (None, old_ip)
            and spec.get("type") != "ExternalName"
        ):
            causes.append(invalid("spec.clusterIP", spec.get("clusterIP"), "field is immutable"))
    return causes


def _ports_cell(svc: Obj, now: float) -> str:
    out = []
    for p in dict_list(get(svc, "spec"), "ports"):
        proto = p.get("protocol", "TCP")
        if p.get("nodePort"):
            out.append(f"{p.get('port')}:{p['nodePort']}/{proto}")
        else:
            out.append(f"{p.get('port')}/{proto}")
    return ",".join(out) or NONE


def _lb_ingress(svc: Obj, wide: bool) -> str:
    ips = [
        str(i.get("ip") or i.get("hostname") or "")
        for i in dict_list(get(svc, "status.loadBalancer"), "ingress")
    ]
    text = ",".join(i for i in ips if i)
    if not wide and len(text) > 16:
        return text[:13] + "..."
    return text


def external_ip_cell(svc: Obj, now: float) -> str:
    spec = sub(svc, "spec")
    external = [str(x) for x in spec.get("externalIPs") or []]
    kind = spec.get("type", "ClusterIP")
    if kind in ("ClusterIP", "NodePort"):
        return ",".join(external) or NONE
    if kind == "LoadBalancer":
        lb = _lb_ingress(svc, wide=False)
        joined = [*(lb.split(",") if lb else []), *external]
        return ",".join(joined) or "<pending>"
    if kind == "ExternalName":
        return str(spec.get("externalName", ""))
    return "<unknown>"


SERVICE_COLUMNS = (
    NAME,
    Column(
        "Type", "string", "How the service is exposed.", lambda o, n: str(get(o, "spec.type", ""))
    ),
    Column(
        "Cluster-IP",
        "string",
        "Virtual IP of the service.",
        lambda o, n: str(get(o, "spec.clusterIP") or NONE),
    ),
    Column("External-IP", "string", "IPs reachable from outside the cluster.", external_ip_cell),
    Column("Port(s)", "string", "Ports the service exposes.", _ports_cell),
    AGE,
    Column(
        "Selector",
        "string",
        "Labels of the pods behind the service.",
        lambda o, n: format_labels(get(o, "spec.selector")),
        priority=1,
    ),
)

SERVICE = Kind(
    group="",
    version="v1",
    kind="Service",
    plural="services",
    singular="service",
    namespaced=True,
    schema=object_schema(
        f"{V1}.Service",
        "A stable virtual IP and DNS name for a set of pods.",
        SERVICE_SPEC,
        SERVICE_STATUS,
        proto={"metadata": 1, "spec": 2, "status": 3},
    ),
    description="A stable virtual IP and DNS name for a set of pods.",
    short_names=("svc",),
    categories=("all",),
    subresources=frozenset({"status"}),
    columns=SERVICE_COLUMNS,
    validate=validate_service,
    default=default_service,
)

# -- Endpoints -------------------------------------------------------------------------------

ENDPOINT_ADDRESS = obj(
    "One backend address.",
    {
        "ip": string("IP of the backend."),
        "hostname": string("Host name of the backend."),
        "nodeName": string("Node hosting the backend."),
        "targetRef": OBJECT_REFERENCE,
    },
    required=("ip",),
    name=f"{V1}.EndpointAddress",
    map_type="atomic",
)

ENDPOINT_PORT = obj(
    "A port of the backends.",
    {
        "name": string("Name of the service port."),
        "port": integer("Port number."),
        "protocol": string("Transport protocol.", enum=PROTOCOLS),
        "appProtocol": string("Application protocol hint."),
    },
    required=("port",),
    name="io.k8s.api.core.v1.EndpointPort",
    map_type="atomic",
)

ENDPOINT_SUBSET = obj(
    "A set of addresses that all serve the same ports.",
    {
        "addresses": array(ENDPOINT_ADDRESS, "Ready backends.", list_type="atomic"),
        "notReadyAddresses": array(ENDPOINT_ADDRESS, "Backends not ready.", list_type="atomic"),
        "ports": array(ENDPOINT_PORT, "Ports of the backends.", list_type="atomic"),
    },
    name=f"{V1}.EndpointSubset",
)


def endpoints_cell(ep: Obj, now: float) -> str:
    """kubectl's formatEndpoints: up to three ip:port pairs, then ` + N more...`."""
    subsets = dict_list(ep, "subsets")
    if not subsets:
        return NONE
    shown: list[str] = []
    count = 0
    more = False
    limit = 3
    for ss in subsets:
        addresses = dict_list(ss, "addresses")
        ports = dict_list(ss, "ports")
        targets = [None] if not ports else [p.get("port") for p in ports]
        for port in targets:
            count += len(addresses)
            for a in addresses:
                if len(shown) == limit:
                    more = True
                    break
                ip = str(a.get("ip", ""))
                if port is None:
                    shown.append(ip)
                else:
                    shown.append(f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}")
    text = ",".join(shown)
    return f"{text} + {count - limit} more..." if more else text


ENDPOINTS = Kind(
    group="",
    version="v1",
    kind="Endpoints",
    plural="endpoints",
    singular="endpoints",
    namespaced=True,
    schema=object_schema(
        f"{V1}.Endpoints",
        "The addresses behind a service, kept by the endpoints controller.",
        None,
        fields={"subsets": array(ENDPOINT_SUBSET, "Groups of backends.", list_type="atomic")},
    ),
    description="The addresses behind a service.",
    short_names=("ep",),
    columns=(
        NAME,
        Column("Endpoints", "string", "Backend addresses.", endpoints_cell),
        AGE,
    ),
)
