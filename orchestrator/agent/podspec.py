"""The pod's sandbox and containers as the runtime needs them: `PodSandboxConfig` and the labels
that find them again, CRI resources, the container environment (`$(VAR)` expansion, ConfigMap and
Secret keys, the downward API), and the image per imagePullPolicy.

The config builders are pure: the same pod and attempt give the same `PodSandboxConfig` (the
worker passes that one to every `create_container` of a sandbox). The async helpers read
ConfigMaps/Secrets through the worker context's `ObjectSource` and the image through the
runtime; a container that cannot be configured now raises `ContainerWaiting` with its waiting
reason (CreateContainerConfigError, ErrImagePull, ...), which the worker reports and retries.

Log layout (shared with `agent/logs.py`): `{data_dir}/pods/{namespace}_{name}_{uid}/` is the
sandbox's `log_directory`; a container logs to `{container_name}/{attempt}.log` under it.
Volumes live in `.../volumes/<plugin>/<volume>` under the same directory.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Mapping
from pathlib import Path

import trio

from orchestrator.agent.net.poddns import PodDNS, pod_dns_config
from orchestrator.agent.net.svcenv import service_env, services_for_pod
from orchestrator.agent.podcontext import RUNTIME_TIMEOUT, ObjectSource, WorkerContext
from orchestrator.cri.runtime import CriError, PodSandboxConfig, PortMapping, Resources
from orchestrator.kube.objects import Obj
from orchestrator.scheduler.quantity import parse_cpu_milli, parse_value

__all__ = [
    "LABEL_AGENT",
    "LABEL_CONTAINER_KIND",
    "LABEL_CONTAINER_NAME",
    "LABEL_POD_NAME",
    "LABEL_POD_NAMESPACE",
    "LABEL_POD_UID",
    "ContainerWaiting",
    "container_env",
    "ensure_image",
    "expand",
    "field_ref",
    "linux_resources",
    "lookup_object",
    "meta_of",
    "object_data",
    "pod_dir",
    "referenced_objects",
    "resource_field",
    "sandbox_config",
    "spec_of",
]

LABEL_AGENT = "orchestrator.io/agent"
LABEL_POD_UID = "io.kubernetes.pod.uid"
LABEL_POD_NAME = "io.kubernetes.pod.name"
LABEL_POD_NAMESPACE = "io.kubernetes.pod.namespace"
LABEL_CONTAINER_NAME = "io.kubernetes.container.name"
LABEL_CONTAINER_KIND = "orchestrator.io/container-kind"  # "init" or "regular"


class ContainerWaiting(Exception):
    """A container cannot be started now: its waiting reason and message."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


def meta_of(obj: Obj) -> Obj:
    m = obj.get("metadata")
    return m if isinstance(m, dict) else {}


def spec_of(obj: Obj) -> Obj:
    s = obj.get("spec")
    return s if isinstance(s, dict) else {}


def pod_dir(data_dir: Path, pod: Obj) -> Path:
    """`{data_dir}/pods/{namespace}_{name}_{uid}`: log directory and volumes of the pod."""
    m = meta_of(pod)
    return data_dir / "pods" / f"{m.get('namespace', '')}_{m.get('name', '')}_{m.get('uid', '')}"


def sandbox_config(
    pod: Obj, attempt: int, *, node: str, data_dir: Path, dns: PodDNS | None = None
) -> PodSandboxConfig:
    """The sandbox config for `pod` (pure: the same pod and attempt give the same config); its
    resolv.conf from `dns` (dnsPolicy, dnsConfig: `agent.net.poddns`), else the runtime's."""
    m, spec = meta_of(pod), spec_of(pod)
    host_network = bool(spec.get("hostNetwork"))
    labels = {str(k): str(v) for k, v in (m.get("labels") or {}).items()}
    labels.update(
        {
            LABEL_AGENT: node,
            LABEL_POD_UID: str(m.get("uid", "")),
            LABEL_POD_NAME: str(m.get("name", "")),
            LABEL_POD_NAMESPACE: str(m.get("namespace", "")),
        }
    )
    ports: list[PortMapping] = []
    for c in spec.get("containers") or []:
        for p in c.get("ports") or []:
            if p.get("hostPort"):
                ports.append(
                    PortMapping(
                        container_port=int(p.get("containerPort") or 0),
                        host_port=int(p["hostPort"]),
                        protocol=str(p.get("protocol") or "TCP"),
                        host_ip=str(p.get("hostIP") or ""),
                    )
                )
    hostname = "" if host_network else str(spec.get("hostname") or m.get("name", ""))[:63]
    return PodSandboxConfig(
        name=str(m.get("name", "")),
        namespace=str(m.get("namespace", "")),
        uid=str(m.get("uid", "")),
        attempt=attempt,
        hostname=hostname,
        labels=labels,
        annotations={str(k): str(v) for k, v in (m.get("annotations") or {}).items()},
        log_directory=str(pod_dir(data_dir, pod).absolute()),
        host_network=host_network,
        port_mappings=tuple(ports),
        dns=pod_dns_config(pod, dns).config if dns is not None else None,
    )


def linux_resources(container: Obj) -> Resources | None:
    """CRI linux resources (cgroup v1 units) from a container's requests and limits."""
    res = container.get("resources") or {}
    requests, limits = res.get("requests") or {}, res.get("limits") or {}
    if not requests and not limits:
        return Resources(cpu_shares=2)  # BestEffort: the minimum share, as the kubelet
    cpu_request = requests.get("cpu", limits.get("cpu"))
    shares = 2
    if cpu_request is not None:
        shares = max(2, parse_cpu_milli(cpu_request) * 1024 // 1000)
    quota = period = 0
    if limits.get("cpu") is not None:
        period = 100_000
        quota = max(1000, parse_cpu_milli(limits["cpu"]) * period // 1000)
    memory = parse_value(limits["memory"]) if limits.get("memory") is not None else 0
    return Resources(
        cpu_shares=shares, cpu_quota=quota, cpu_period=period, memory_limit_in_bytes=memory
    )


_VAR_RE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion: defined variables are replaced, `$$` escapes a `$`,
    undefined references stay as written."""

    def repl(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)

    return _VAR_RE.sub(repl, text)


def _subscript(path: str, prefix: str) -> str | None:
    m = re.fullmatch(re.escape(prefix) + r"\['(.+)'\]", path)
    return m.group(1) if m else None


def field_ref(pod: Obj, path: str, *, pod_ip: str, host_ip: str) -> str:
    """The value of a downward-API fieldRef; raises ValueError for an unsupported path."""
    m, spec = meta_of(pod), spec_of(pod)
    simple = {
        "metadata.name": m.get("name"),
        "metadata.namespace": m.get("namespace"),
        "metadata.uid": m.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
        "status.hostIP": host_ip,
        "status.hostIPs": host_ip,
    }
    if path in simple:
        return str(simple[path] or "")
    for prefix, source in (("metadata.labels", "labels"), ("metadata.annotations", "annotations")):
        key = _subscript(path, prefix)
        if key is not None:
            return str((m.get(source) or {}).get(key, ""))
    raise ValueError(f"unsupported fieldRef fieldPath {path!r}")


def referenced_objects(pod: Obj) -> set[tuple[str, str]]:
    """(kind, name) of every ConfigMap and Secret the pod uses (env, envFrom, volumes)."""
    out: set[tuple[str, str]] = set()
    spec = spec_of(pod)
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        for e in c.get("env") or []:
            vf = e.get("valueFrom") or {}
            if (vf.get("configMapKeyRef") or {}).get("name"):
                out.add(("ConfigMap", vf["configMapKeyRef"]["name"]))
            if (vf.get("secretKeyRef") or {}).get("name"):
                out.add(("Secret", vf["secretKeyRef"]["name"]))
        for ef in c.get("envFrom") or []:
            if (ef.get("configMapRef") or {}).get("name"):
                out.add(("ConfigMap", ef["configMapRef"]["name"]))
            if (ef.get("secretRef") or {}).get("name"):
                out.add(("Secret", ef["secretRef"]["name"]))
    for v in spec.get("volumes") or []:
        if (v.get("configMap") or {}).get("name"):
            out.add(("ConfigMap", v["configMap"]["name"]))
        if (v.get("secret") or {}).get("secretName"):
            out.add(("Secret", v["secret"]["secretName"]))
    return out


def object_data(kind: str, obj: Obj) -> dict[str, bytes]:
    """A ConfigMap's data/binaryData or a Secret's (base64-decoded) data, as bytes."""
    out: dict[str, bytes] = {}
    if kind == "Secret":
        for k, v in (obj.get("data") or {}).items():
            out[str(k)] = base64.b64decode(str(v))
        for k, v in (obj.get("stringData") or {}).items():
            out[str(k)] = str(v).encode()
        return out
    for k, v in (obj.get("data") or {}).items():
        out[str(k)] = str(v).encode()
    for k, v in (obj.get("binaryData") or {}).items():
        out[str(k)] = base64.b64decode(str(v))
    return out


async def lookup_object(
    objects: ObjectSource, pod: Obj, kind: str, name: str, optional: bool
) -> Obj | None:
    """The ConfigMap/Secret `name` in the pod's namespace; None if absent and `optional`."""
    ns = str(meta_of(pod).get("namespace", ""))
    obj = await objects.get(kind, ns, name)
    if obj is None and not optional:
        raise ContainerWaiting("CreateContainerConfigError", f'{kind.lower()} "{name}" not found')
    return obj


async def container_env(ctx: WorkerContext, pod: Obj, c: Obj, pod_ip: str) -> dict[str, str]:
    """The environment of container `c`: envFrom, then env (values, `$(VAR)` expansion,
    ConfigMap/Secret keys, the downward API's fieldRef and resourceFieldRef), then the Service
    variables (`agent.net.svcenv`) the container does not set itself; `$(VAR)` sees them."""
    env: dict[str, str] = {}
    spec = spec_of(pod)
    links = spec.get("enableServiceLinks")
    svc_env = service_env(
        services_for_pod(
            ctx.cluster.services(),
            str(meta_of(pod).get("namespace") or ""),
            links is None or bool(links),
        )
    )
    host_ip = ctx.host_ip
    if spec_of(pod).get("hostNetwork"):
        pod_ip = host_ip
    for ef in c.get("envFrom") or []:
        prefix = str(ef.get("prefix") or "")
        for kind, ref_key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            ref = ef.get(ref_key)
            if not isinstance(ref, dict):
                continue
            obj = await lookup_object(
                ctx.objects, pod, kind, str(ref.get("name", "")), bool(ref.get("optional"))
            )
            if obj is not None:
                for k, v in object_data(kind, obj).items():
                    env[prefix + k] = v.decode("utf-8", "replace")
    for e in c.get("env") or []:
        name = str(e.get("name", ""))
        vf = e.get("valueFrom")
        if not isinstance(vf, dict):
            env[name] = expand(str(e.get("value") or ""), {**svc_env, **env})
            continue
        for kind, ref_key in (("ConfigMap", "configMapKeyRef"), ("Secret", "secretKeyRef")):
            ref = vf.get(ref_key)
            if not isinstance(ref, dict):
                continue
            optional = bool(ref.get("optional"))
            obj = await lookup_object(ctx.objects, pod, kind, str(ref.get("name", "")), optional)
            key = str(ref.get("key", ""))
            data = object_data(kind, obj) if obj is not None else {}
            if key in data:
                env[name] = data[key].decode("utf-8", "replace")
            elif not optional:
                raise ContainerWaiting(
                    "CreateContainerConfigError",
                    f"couldn't find key {key} in {kind} "
                    f"{meta_of(pod).get('namespace', '')}/{ref.get('name', '')}",
                )
        if isinstance(vf.get("fieldRef"), dict):
            path = str(vf["fieldRef"].get("fieldPath", ""))
            try:
                env[name] = field_ref(pod, path, pod_ip=pod_ip, host_ip=host_ip)
            except ValueError as exc:
                raise ContainerWaiting("CreateContainerConfigError", str(exc)) from None
        if isinstance(vf.get("resourceFieldRef"), dict):
            env[name] = resource_field(ctx, c, vf["resourceFieldRef"])
    return {**svc_env, **env}  # the container's own variables win


def resource_field(ctx: WorkerContext, c: Obj, ref: Obj) -> str:
    """The value of a downward-API resourceFieldRef (node capacity for an unset limit)."""
    resource = str(ref.get("resource", ""))
    res = c.get("resources") or {}
    section, _, what = resource.partition(".")
    value = (res.get(section) or {}).get(what)
    try:
        if what == "cpu":
            milli = parse_cpu_milli(value) if value is not None else ctx.node_cpus * 1000
            divisor = parse_cpu_milli(ref.get("divisor") or "1")
            return str(max(1, math.ceil(milli / max(1, divisor))))
        amount = parse_value(value) if value is not None else ctx.node_memory
        return str(math.ceil(amount / max(1, parse_value(ref.get("divisor") or "1"))))
    except ValueError as exc:
        raise ContainerWaiting("CreateContainerConfigError", f"resourceFieldRef: {exc}") from None


async def ensure_image(ctx: WorkerContext, pod: Obj, c: Obj) -> str:
    """Pull `c`'s image as its imagePullPolicy says; the image reference to run (or raises
    `ContainerWaiting`: ErrImagePull, ErrImageNeverPull, InvalidImageName)."""
    image = str(c.get("image") or "")
    if not image:
        raise ContainerWaiting("InvalidImageName", "the container has no image")
    policy = c.get("imagePullPolicy") or (
        "Always"
        if ":" not in image.rsplit("/", 1)[-1] or image.endswith(":latest")
        else "IfNotPresent"
    )
    rt = ctx.runtime
    with trio.fail_after(RUNTIME_TIMEOUT):
        present = await rt.image_status(image)
    if policy == "Never":
        if present is None:
            raise ContainerWaiting(
                "ErrImageNeverPull",
                f'Container image "{image}" is not present with pull policy of Never',
            )
        return present.id
    if policy == "IfNotPresent" and present is not None:
        return present.id
    ctx.events.record(pod, "Normal", "Pulling", f'Pulling image "{image}"')
    try:
        with trio.fail_after(ctx.options.pull_timeout):
            ref = await rt.pull_image(image)
    except (CriError, trio.TooSlowError) as exc:
        why = exc.message if isinstance(exc, CriError) else "timed out"
        if present is not None:  # offline with the image at hand: run what we have
            ctx.events.record(
                pod,
                "Warning",
                "Failed",
                f'Failed to pull image "{image}": {why}; using the image present on the node',
            )
            return present.id
        raise ContainerWaiting(
            "ErrImagePull",
            f'failed to pull image "{image}": {why} (the image is not on this node and could '
            "not be pulled: is the registry reachable? import it with "
            "`ctr -n k8s.io images import`, or set imagePullPolicy)",
        ) from None
    ctx.events.record(pod, "Normal", "Pulled", f'Successfully pulled image "{image}"')
    return ref or image
