"""core/v1 Pod: defaults, validation and `kubectl get` columns, and the `POD` Kind.

The pod-spec pieces (`default_pod_spec`, `validate_pod_spec`) are shared with the workload kinds,
whose pod templates get exactly the same treatment under their own field path.

Invariants: every `default_*` function is idempotent (applying it twice equals applying it once)
and only fills absent fields; validators never raise on malformed input (the schema engine has
already reported type errors, so they skip what they cannot read); Table cells follow kubectl's
`printPod` so `kubectl get pods` reads as it does against a real cluster.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestrator.kube.conditions import condition_true
from orchestrator.kube.errors import Cause
from orchestrator.kube.jsonvalue import copy_json
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.builders import Schema
from orchestrator.kube.schema.columns import AGE, NAME, NONE, human_duration, parse_rfc3339
from orchestrator.kube.schema.core_v1_container import V1
from orchestrator.kube.schema.core_v1_pod_schema import POD_SPEC, POD_STATUS
from orchestrator.kube.schema.core_v1_volume import VOLUME_SOURCES
from orchestrator.kube.schema.kind import Column, Kind
from orchestrator.kube.schema.meta import (
    dict_list,
    duplicate,
    ensure,
    field_label,
    flag_label,
    forbidden,
    get,
    invalid,
    not_found,
    object_schema,
    port_range,
    required,
    sub,
)
from orchestrator.kube.schema.names import (
    is_dns1123_label,
    is_dns1123_subdomain,
    is_valid_port_name,
)

# -- defaults --------------------------------------------------------------------------------


def image_pull_policy(image: str) -> str:
    """Always for `:latest` or untagged images, IfNotPresent for any other tag or a digest."""
    ref = image.split("@", 1)
    if len(ref) == 2:
        base, digest = ref
    else:
        base, digest = ref[0], ""
    last = base.rsplit("/", 1)[-1]
    tag = last.rsplit(":", 1)[1] if ":" in last else ""
    if not tag and not digest:
        tag = "latest"
    return "Always" if tag == "latest" else "IfNotPresent"


def _default_probe(probe: Any) -> None:
    if not isinstance(probe, dict):
        return
    probe.setdefault("timeoutSeconds", 1)
    probe.setdefault("periodSeconds", 10)
    probe.setdefault("successThreshold", 1)
    probe.setdefault("failureThreshold", 3)
    http = probe.get("httpGet")
    if isinstance(http, dict):
        http.setdefault("path", "/")
        http.setdefault("scheme", "HTTP")


def _default_container(c: Obj) -> None:
    if isinstance(c.get("image"), str):
        c.setdefault("imagePullPolicy", image_pull_policy(c["image"]))
    c.setdefault("terminationMessagePath", "/dev/termination-log")
    c.setdefault("terminationMessagePolicy", "File")
    for port in dict_list(c, "ports"):
        port.setdefault("protocol", "TCP")
    for env in dict_list(c, "env"):
        field_ref = get(env, "valueFrom.fieldRef")
        if isinstance(field_ref, dict):
            field_ref.setdefault("apiVersion", "v1")
    resources = ensure(c, "resources")
    limits = resources.get("limits")
    if isinstance(limits, dict) and limits:
        requests = ensure(resources, "requests")
        for name, value in limits.items():
            requests.setdefault(name, value)
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        _default_probe(c.get(probe))


def _default_volume(v: Obj) -> None:
    if not any(k in v for k in VOLUME_SOURCES):
        v["emptyDir"] = {}
    for source in ("configMap", "secret"):
        if isinstance(v.get(source), dict):
            v[source].setdefault("defaultMode", 0o644)
    if isinstance(v.get("hostPath"), dict):
        v["hostPath"].setdefault("type", "")


def default_pod_spec(spec: Obj) -> None:
    """Fill a PodSpec's defaults in place (also used for workload pod templates)."""
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("enableServiceLinks", True)
    ensure(spec, "securityContext")
    if spec.get("serviceAccountName") and not spec.get("serviceAccount"):
        spec["serviceAccount"] = spec["serviceAccountName"]
    elif spec.get("serviceAccount") and not spec.get("serviceAccountName"):
        spec["serviceAccountName"] = spec["serviceAccount"]
    for c in dict_list(spec, "initContainers") + dict_list(spec, "containers"):
        _default_container(c)
    for v in dict_list(spec, "volumes"):
        _default_volume(v)
    for t in dict_list(spec, "tolerations"):
        if t.get("operator") is None and t.get("key") is not None:
            t["operator"] = "Equal"


def default_pod_template(template: Obj) -> None:
    default_pod_spec(ensure(template, "spec"))


def qos_class(spec: Obj) -> str:
    """BestEffort (no cpu/memory requests or limits), Guaranteed (limits == requests for both
    in every container), else Burstable. Expects defaulted requests."""
    containers = dict_list(spec, "initContainers") + dict_list(spec, "containers")
    compute = ("cpu", "memory")
    any_set = False
    guaranteed = True
    for c in containers:
        res = sub(c, "resources")
        limits = sub(res, "limits")
        requests = sub(res, "requests")
        if any(k in limits or k in requests for k in compute):
            any_set = True
        for k in compute:
            if k not in limits or str(requests.get(k, limits[k])) != str(limits[k]):
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


# The DefaultTolerationSeconds admission plugin: every pod tolerates a not-ready or unreachable
# node for 300 s before the taint manager evicts it (unless it says otherwise).
DEFAULT_TOLERATION_SECONDS = 300
_DEFAULT_TOLERATION_KEYS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def _default_tolerations(spec: Obj) -> None:
    tolerations = dict_list(spec, "tolerations")
    for key in _DEFAULT_TOLERATION_KEYS:
        if not any(
            t.get("key") in (key, None, "") and t.get("effect") in ("NoExecute", None, "")
            for t in tolerations
        ):
            spec.setdefault("tolerations", []).append(
                {
                    "key": key,
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": DEFAULT_TOLERATION_SECONDS,
                }
            )


def default_pod(pod: Obj) -> None:
    spec = ensure(pod, "spec")
    default_pod_spec(spec)
    _default_tolerations(spec)
    status = ensure(pod, "status")
    status.setdefault("phase", "Pending")
    if "qosClass" not in status:
        status["qosClass"] = qos_class(spec)


# -- validation ------------------------------------------------------------------------------

_POD_UPDATE_FORBIDDEN = (
    "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` "
    "(only additions to existing tolerations),`spec.terminationGracePeriodSeconds` "
    "(allow it to be set to 1 if it was previously negative)"
)


def _validate_container(c: Obj, path: str, volumes: set[str], causes: list[Cause]) -> None:
    name = c.get("name")
    if isinstance(name, str):
        if not name:
            causes.append(required(f"{path}.name"))
        else:
            causes.extend(invalid(f"{path}.name", name, m) for m in is_dns1123_label(name))
    image = c.get("image")
    if image is None or (isinstance(image, str) and not image.strip()):
        causes.append(required(f"{path}.image"))
    port_names: set[str] = set()
    for j, port in enumerate(dict_list(c, "ports")):
        p = f"{path}.ports[{j}]"
        pname = port.get("name")
        if isinstance(pname, str) and pname:
            causes.extend(invalid(f"{p}.name", pname, m) for m in is_valid_port_name(pname))
            if pname in port_names:
                causes.append(duplicate(f"{p}.name", pname))
            port_names.add(pname)
        causes.extend(port_range(f"{p}.containerPort", port.get("containerPort")))
        if port.get("hostPort"):
            causes.extend(port_range(f"{p}.hostPort", port.get("hostPort")))
    for j, mount in enumerate(dict_list(c, "volumeMounts")):
        mname = mount.get("name")
        if isinstance(mname, str) and mname and mname not in volumes:
            causes.append(not_found(f"{path}.volumeMounts[{j}].name", mname))
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        pr = c.get(probe)
        if isinstance(pr, dict):
            for kind in ("httpGet", "tcpSocket"):
                port = get(pr, f"{kind}.port")
                if isinstance(port, int):
                    causes.extend(port_range(f"{path}.{probe}.{kind}.port", port))


# The order apimachinery checks volume sources in: every source after the first is reported.
_VOLUME_SOURCE_ORDER = (
    "emptyDir",
    "hostPath",
    "secret",
    "persistentVolumeClaim",
    "configMap",
    "downwardAPI",
    "projected",
)
assert set(_VOLUME_SOURCE_ORDER) == set(VOLUME_SOURCES)


def validate_pod_spec(spec: Any, path: str = "spec") -> list[Cause]:
    """Checks on a PodSpec beyond its schema, with fields under `path`."""
    if not isinstance(spec, dict):
        return []
    causes: list[Cause] = []
    volumes: set[str] = set()
    for i, v in enumerate(dict_list(spec, "volumes")):
        vname = v.get("name")
        if isinstance(vname, str):
            if vname in volumes:
                causes.append(duplicate(f"{path}.volumes[{i}].name", vname))
            elif vname:
                causes.extend(
                    invalid(f"{path}.volumes[{i}].name", vname, m) for m in is_dns1123_label(vname)
                )
            volumes.add(vname)
        sources = [k for k in _VOLUME_SOURCE_ORDER if k in v]
        causes.extend(
            forbidden(f"{path}.volumes[{i}].{extra}", "may not specify more than 1 volume type")
            for extra in sources[1:]
        )
    if not isinstance(spec.get("containers"), list) or not spec["containers"]:
        causes.append(required(f"{path}.containers"))
    names: set[str] = set()
    for field in ("initContainers", "containers"):
        for i, c in enumerate(dict_list(spec, field)):
            cpath = f"{path}.{field}[{i}]"
            _validate_container(c, cpath, volumes, causes)
            name = c.get("name")
            if isinstance(name, str) and name:
                if name in names:
                    causes.append(duplicate(f"{cpath}.name", name))
                names.add(name)
    _validate_dns(spec, path, causes)
    return causes


MAX_DNS_NAMESERVERS = 3  # the resolver's limit (glibc MAXNS)
MAX_DNS_SEARCHES = 32
MAX_DNS_SEARCH_CHARS = 2048  # the search line, spaces included


def _validate_dns(spec: Obj, path: str, causes: list[Cause]) -> None:
    """dnsPolicy None needs a dnsConfig with a nameserver; dnsConfig's limits (Kubernetes'
    validatePodDNSConfig): nameservers IPs, at most 3; searches DNS names, at most 32 and 2048
    characters; options named."""
    import ipaddress

    config = spec.get("dnsConfig")
    cpath = f"{path}.dnsConfig"
    if spec.get("dnsPolicy") == "None" and not isinstance(config, dict):
        causes.append(required(cpath, "must provide `dnsConfig` when `dnsPolicy` is None"))
        return
    if not isinstance(config, dict):
        return
    servers = config.get("nameservers") or []
    if spec.get("dnsPolicy") == "None" and not servers:
        causes.append(
            required(
                f"{cpath}.nameservers",
                "must provide at least one DNS nameserver when `dnsPolicy` is None",
            )
        )
    if isinstance(servers, list):
        if len(servers) > MAX_DNS_NAMESERVERS:
            causes.append(
                invalid(
                    f"{cpath}.nameservers",
                    servers,
                    f"must not have more than {MAX_DNS_NAMESERVERS} nameservers",
                )
            )
        for i, ns in enumerate(servers):
            try:
                ipaddress.ip_address(str(ns))
            except ValueError:
                causes.append(invalid(f"{cpath}.nameservers[{i}]", ns, "must be valid IP address"))
    searches = config.get("searches") or []
    if isinstance(searches, list):
        if len(searches) > MAX_DNS_SEARCHES:
            causes.append(
                invalid(
                    f"{cpath}.searches",
                    searches,
                    f"must not have more than {MAX_DNS_SEARCHES} search paths",
                )
            )
        if len(" ".join(str(s) for s in searches)) > MAX_DNS_SEARCH_CHARS:
            causes.append(
                invalid(
                    f"{cpath}.searches",
                    searches,
                    f"must not have more than {MAX_DNS_SEARCH_CHARS} characters (including "
                    "spaces) in the search list",
                )
            )
        for i, s in enumerate(searches):
            name = str(s)[:-1] if str(s).endswith(".") else str(s)
            causes.extend(
                invalid(f"{cpath}.searches[{i}]", s, m) for m in is_dns1123_subdomain(name)
            )
    for i, o in enumerate(config.get("options") or []):
        if not isinstance(o, dict) or not o.get("name"):
            causes.append(required(f"{cpath}.options[{i}].name"))


def _tolerations_only_added(new: Any, old: Any) -> bool:
    new_list = new if isinstance(new, list) else []
    return all(t in new_list for t in (old if isinstance(old, list) else []))


def validate_pod_update(new_spec: Any, old_spec: Any) -> list[Cause]:
    """Only images, activeDeadlineSeconds, added tolerations, the grace period and a first
    nodeName (binding) may change in a pod's spec."""
    if not isinstance(new_spec, dict) or not isinstance(old_spec, dict):
        return []
    if new_spec == old_spec:  # nothing changed (a status write, a label edit): nothing to check
        return []
    a, b = copy_json(new_spec), copy_json(old_spec)
    if not _tolerations_only_added(a.get("tolerations"), b.get("tolerations")):
        return [
            forbidden(
                "spec.tolerations",
                "existing toleration can not be modified except its tolerationSeconds",
            )
        ]
    for field in ("initContainers", "containers"):
        for c in dict_list(a, field) + dict_list(b, field):
            c.pop("image", None)
    for field in ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds"):
        a.pop(field, None)
        b.pop(field, None)
    if not b.get("nodeName"):
        a.pop("nodeName", None)
        b.pop("nodeName", None)
    if a != b:
        return [Cause("spec", _POD_UPDATE_FORBIDDEN, "FieldValueForbidden")]
    return []


def validate_pod(new: Obj, old: Obj | None) -> list[Cause]:
    spec = new.get("spec")
    if old is None:
        return validate_pod_spec(spec)
    old_spec = old.get("spec")
    if spec == old_spec:
        # Unchanged (a status write, a label edit): it passed these checks when it was stored,
        # and Kubernetes, too, does not re-validate the spec of a status update.
        return []
    return validate_pod_spec(spec) + validate_pod_update(spec, old_spec)


# -- table -----------------------------------------------------------------------------------


def _terminated_reason(t: Obj, prefix: str = "") -> str:
    if t.get("reason"):
        return f"{prefix}{t['reason']}"
    if t.get("signal"):
        return f"{prefix}Signal:{t['signal']}"
    return f"{prefix}ExitCode:{t.get('exitCode', 0)}"


def pod_summary(pod: Obj, now: float) -> tuple[str, str, str]:
    """(Ready "1/2", Status, Restarts) exactly as kubectl's `printPod` computes them."""
    spec = sub(pod, "spec")
    status = sub(pod, "status")
    init_specs = {c.get("name"): c for c in dict_list(spec, "initContainers")}
    sidecars = {n for n, c in init_specs.items() if c.get("restartPolicy") == "Always"}
    total = len(dict_list(spec, "containers")) + len(sidecars)
    ready = 0
    restarts = 0
    sidecar_restarts = 0
    last_restart = 0.0
    sidecar_last_restart = 0.0
    phase = str(status.get("phase") or "")
    reason = str(status.get("reason") or phase)
    for cond in dict_list(status, "conditions"):
        if cond.get("type") == "PodScheduled" and cond.get("reason") == "SchedulingGated":
            reason = "SchedulingGated"

    def finished(cs: Obj) -> float:
        return parse_rfc3339(str(get(cs, "lastState.terminated.finishedAt", ""))) or 0.0

    initializing = False
    init_statuses = dict_list(status, "initContainerStatuses")
    for i, cs in enumerate(init_statuses):
        count = int(cs.get("restartCount") or 0)
        restarts += count
        last_restart = max(last_restart, finished(cs))
        is_sidecar = cs.get("name") in sidecars
        if is_sidecar:
            sidecar_restarts += count
            sidecar_last_restart = max(sidecar_last_restart, finished(cs))
        term = get(cs, "state.terminated")
        waiting = get(cs, "state.waiting")
        if isinstance(term, dict) and term.get("exitCode", 0) == 0:
            continue
        if is_sidecar and cs.get("started"):
            if cs.get("ready"):
                ready += 1
            continue
        if isinstance(term, dict):
            reason = _terminated_reason(term, "Init:")
        elif (
            isinstance(waiting, dict)
            and waiting.get("reason")
            and waiting.get("reason") != "PodInitializing"
        ):
            reason = f"Init:{waiting['reason']}"
        else:
            reason = f"Init:{i}/{len(init_specs)}"
        initializing = True
        break

    if not initializing or condition_true(status, "Initialized"):
        restarts, last_restart = sidecar_restarts, sidecar_last_restart
        has_running = False
        for cs in reversed(dict_list(status, "containerStatuses")):
            restarts += int(cs.get("restartCount") or 0)
            last_restart = max(last_restart, finished(cs))
            waiting = get(cs, "state.waiting")
            term = get(cs, "state.terminated")
            if isinstance(waiting, dict) and waiting.get("reason"):
                reason = str(waiting["reason"])
            elif isinstance(term, dict):
                reason = _terminated_reason(term)
            elif cs.get("ready") and isinstance(get(cs, "state.running"), dict):
                has_running = True
                ready += 1
        if reason == "Completed" and has_running:
            reason = "Running" if condition_true(status, "Ready") else "NotReady"

    deleting = bool(get(pod, "metadata.deletionTimestamp"))
    if deleting and status.get("reason") == "NodeLost":
        reason = "Unknown"
    elif deleting and phase not in ("Succeeded", "Failed"):
        reason = "Terminating"

    restarts_text = str(restarts)
    if restarts and last_restart:
        restarts_text = f"{restarts} ({human_duration(now - last_restart)} ago)"
    return f"{ready}/{total}", reason, restarts_text


def _pod_ip(pod: Obj, now: float) -> str:
    ips = dict_list(pod.get("status"), "podIPs")
    ip = ips[0].get("ip") if ips else get(pod, "status.podIP")
    return str(ip) if ip else NONE


def _readiness_gates(pod: Obj, now: float) -> str:
    gates = dict_list(pod.get("spec"), "readinessGates")
    if not gates:
        return NONE
    status = sub(pod, "status")
    conds = {c.get("type"): c.get("status") for c in reversed(dict_list(status, "conditions"))}
    true = sum(1 for g in gates if conds.get(g.get("conditionType")) == "True")
    return f"{true}/{len(gates)}"


POD_COLUMNS = (
    NAME,
    Column(
        "Ready",
        "string",
        "Ready containers out of all containers.",
        lambda o, n: pod_summary(o, n)[0],
    ),
    Column("Status", "string", "Aggregate status of the pod.", lambda o, n: pod_summary(o, n)[1]),
    Column(
        "Restarts",
        "string",
        "Container restarts, with the time since the last one.",
        lambda o, n: pod_summary(o, n)[2],
    ),
    AGE,
    Column("IP", "string", "IP address of the pod.", _pod_ip, priority=1),
    Column(
        "Node",
        "string",
        "Node the pod is bound to.",
        lambda o, n: str(get(o, "spec.nodeName") or NONE),
        priority=1,
    ),
    Column(
        "Nominated Node",
        "string",
        "Node the pod may run on after preemption.",
        lambda o, n: str(get(o, "status.nominatedNodeName") or NONE),
        priority=1,
    ),
    Column(
        "Readiness Gates",
        "string",
        "Readiness gates that are true out of all of them.",
        _readiness_gates,
        priority=1,
    ),
)


POD_FIELD_LABELS: dict[str, Callable[[Obj], str | None]] = {
    p: field_label(p)
    for p in (
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    )
}
POD_FIELD_LABELS["spec.hostNetwork"] = flag_label("spec.hostNetwork")

POD_SCHEMA: Schema = object_schema(
    f"{V1}.Pod",
    "A group of containers scheduled together onto one node, sharing network and volumes.",
    POD_SPEC,
    POD_STATUS,
    proto={"metadata": 1, "spec": 2, "status": 3},
)

POD = Kind(
    group="",
    version="v1",
    kind="Pod",
    plural="pods",
    singular="pod",
    namespaced=True,
    schema=POD_SCHEMA,
    description="A group of containers scheduled together onto one node.",
    short_names=("po",),
    categories=("all",),
    subresources=frozenset({"status", "binding", "log"}),
    columns=POD_COLUMNS,
    field_labels=POD_FIELD_LABELS,
    validate=validate_pod,
    default=default_pod,
)
