"""The Service environment variables of a pod's containers, as the kubelet's
`envvars.FromServices` writes them. Pure.

Which Services: `default/kubernetes` always (the API's address, `KUBERNETES_SERVICE_HOST`...),
and when `spec.enableServiceLinks` is true (the default) every Service of the pod's namespace;
a Service of the pod's own namespace named `kubernetes` wins over `default/kubernetes`. Only
Services with a ClusterIP count (not headless, not ExternalName, not yet allocated), and only
with at least one port.

For a Service `my-svc` (name upper-cased, `-` → `_`) with ClusterIP 10.43.0.7 and ports
`http` 80/TCP and 53/UDP::

    MY_SVC_SERVICE_HOST=10.43.0.7
    MY_SVC_SERVICE_PORT=80                 (the first port)
    MY_SVC_SERVICE_PORT_HTTP=80            (each named port)
    MY_SVC_PORT=tcp://10.43.0.7:80         (the first port, Docker links)
    MY_SVC_PORT_80_TCP=tcp://10.43.0.7:80  (each port: _PROTO, _PORT, _ADDR too)
    MY_SVC_PORT_80_TCP_PROTO=tcp
    MY_SVC_PORT_80_TCP_PORT=80
    MY_SVC_PORT_80_TCP_ADDR=10.43.0.7

The container's own env and envFrom win over these (`merge_service_env`); `$(VAR)` references in
the container's env may use them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from orchestrator.kube.objects import Obj

__all__ = ["MASTER_SERVICE", "service_env", "services_for_pod"]

MASTER_SERVICE = ("default", "kubernetes")


def _env_name(name: str) -> str:
    return name.upper().replace("-", "_")


def _cluster_ip(service: Obj) -> str:
    spec = service.get("spec") or {}
    ip = str(spec.get("clusterIP") or "")
    return "" if ip in ("", "None") or spec.get("type") == "ExternalName" else ip


def _host_port(ip: str, port: object) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def services_for_pod(
    services: Mapping[tuple[str, str], Obj], namespace: str, enable_service_links: bool
) -> list[Obj]:
    """The Services whose variables a pod in `namespace` gets (module doc), by name."""
    chosen: dict[str, Obj] = {}
    master = services.get(MASTER_SERVICE)
    if master is not None and _cluster_ip(master):
        chosen[MASTER_SERVICE[1]] = master
    if enable_service_links:
        for (ns, name), svc in services.items():
            if ns == namespace and _cluster_ip(svc):
                chosen[name] = svc
    return [chosen[n] for n in sorted(chosen)]


def service_env(services: Iterable[Obj]) -> dict[str, str]:
    """The variables of `services` (module doc), in the kubelet's order."""
    env: dict[str, str] = {}
    for svc in services:
        ip = _cluster_ip(svc)
        ports = [p for p in (svc.get("spec") or {}).get("ports") or [] if isinstance(p, dict)]
        name = str((svc.get("metadata") or {}).get("name") or "")
        if not ip or not ports or not name:
            continue
        prefix = _env_name(name)
        env[f"{prefix}_SERVICE_HOST"] = ip
        env[f"{prefix}_SERVICE_PORT"] = str(ports[0].get("port", ""))
        for p in ports:
            if p.get("name"):
                env[f"{prefix}_SERVICE_PORT_{_env_name(str(p['name']))}"] = str(p.get("port", ""))
        for i, p in enumerate(ports):
            proto = str(p.get("protocol") or "TCP")
            url = f"{proto.lower()}://{_host_port(ip, p.get('port', ''))}"
            if i == 0:
                env[f"{prefix}_PORT"] = url
            port_prefix = f"{prefix}_PORT_{p.get('port', '')}_{proto.upper()}"
            env[port_prefix] = url
            env[f"{port_prefix}_PROTO"] = proto.lower()
            env[f"{port_prefix}_PORT"] = str(p.get("port", ""))
            env[f"{port_prefix}_ADDR"] = ip
    return env
