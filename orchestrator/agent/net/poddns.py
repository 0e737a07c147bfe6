"""A pod's resolv.conf (the sandbox's `DNSConfig`) as the kubelet makes it, and the node's own
resolv.conf parsed. Pure.

Policies (`spec.dnsPolicy`, default ClusterFirst):

- ClusterFirst: nameserver = the cluster DNS address(es); search `<ns>.svc.<domain>
  svc.<domain> <domain>` then the host's search domains; `options ndots:5`. A hostNetwork pod
  with ClusterFirst gets Default instead (as the kubelet: it shares the host's network, so the
  host's resolver is what it can use), and so does every pod when no cluster DNS is configured.
- ClusterFirstWithHostNet: ClusterFirst, hostNetwork or not.
- Default: the node's resolv.conf (`--resolv-conf`): its nameservers, search and options.
- None: nothing but the pod's `dnsConfig`.

`spec.dnsConfig` is then merged in (kubelet `appendDNSConfig`): its nameservers and searches
appended without duplicates, its options replacing same-named ones. Finally the kubelet's
limits: at most 3 nameservers, 32 search domains and 2048 characters of search list (extra ones
dropped; `DnsSettings.warnings` says what was dropped for an event).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from orchestrator.cri.runtime import DNSConfig
from orchestrator.kube.objects import Obj

__all__ = [
    "MAX_NAMESERVERS",
    "MAX_SEARCHES",
    "MAX_SEARCH_CHARS",
    "DnsSettings",
    "PodDNS",
    "ResolvConf",
    "parse_resolv_conf",
    "pod_dns_config",
]

MAX_NAMESERVERS = 3
MAX_SEARCHES = 32
MAX_SEARCH_CHARS = 2048
DEFAULT_OPTIONS = ("ndots:5",)


@dataclass(frozen=True)
class ResolvConf:
    """The parts of a resolv.conf a pod's is built from."""

    nameservers: tuple[str, ...] = ()
    searches: tuple[str, ...] = ()
    options: tuple[str, ...] = ()


def parse_resolv_conf(text: str) -> ResolvConf:
    """`nameserver`, `search`/`domain` (the last one wins, as in glibc) and `options` lines;
    comments and unknown lines are ignored. Trailing dots of search domains are dropped."""
    servers: list[str] = []
    searches: list[str] = []
    options: list[str] = []
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split(";", 1)[0].split()
        if not fields:
            continue
        word, args = fields[0], fields[1:]
        if word == "nameserver" and args:
            servers.append(args[0])
        elif word in ("search", "domain"):
            searches = [s.rstrip(".") for s in args if s.rstrip(".")]
        elif word == "options":
            options = _merge_options(options, args)
    return ResolvConf(tuple(servers), tuple(searches), tuple(options))


@dataclass(frozen=True)
class PodDNS:
    """What the agent knows to make pods' resolv.conf: the cluster DNS address(es) (kubelet
    `--cluster-dns`), the cluster domain and the node's resolv.conf (`--resolv-conf`)."""

    cluster_dns: tuple[str, ...] = ()
    cluster_domain: str = "cluster.local"
    host: ResolvConf = field(default_factory=ResolvConf)


@dataclass(frozen=True)
class DnsSettings:
    config: DNSConfig
    warnings: tuple[str, ...] = ()


def _option_name(option: str) -> str:
    return option.split(":", 1)[0]


def _merge_options(existing: Sequence[str], extra: Sequence[str]) -> list[str]:
    """`existing` with `extra` added, a same-named option replaced (kubelet mergeDNSOptions)."""
    out: dict[str, str] = {_option_name(o): o for o in existing}
    for o in extra:
        out[_option_name(o)] = o
    return list(out.values())


def _unique(items: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(i for i in items if i))


def _pod_options(dns_config: Obj) -> list[str]:
    out: list[str] = []
    for o in dns_config.get("options") or []:
        if not isinstance(o, dict) or not o.get("name"):
            continue
        value = o.get("value")
        out.append(f"{o['name']}:{value}" if value not in (None, "") else str(o["name"]))
    return out


def pod_dns_config(pod: Obj, dns: PodDNS) -> DnsSettings:
    """The sandbox's DNS config for `pod` (module doc)."""
    spec = pod.get("spec") or {}
    ns = str((pod.get("metadata") or {}).get("namespace") or "default")
    policy = str(spec.get("dnsPolicy") or "ClusterFirst")
    host_network = bool(spec.get("hostNetwork"))
    warnings: list[str] = []
    mode = {"ClusterFirstWithHostNet": "cluster", "Default": "host", "None": "none"}.get(
        policy, "host" if host_network else "cluster"
    )
    if mode == "cluster" and not dns.cluster_dns:
        warnings.append(
            f'pod has dnsPolicy "{policy}" but the node has no --cluster-dns; '
            'falling back to "Default"'
        )
        mode = "host"
    servers: list[str] = []
    searches: list[str] = []
    options: list[str] = []
    if mode == "cluster":
        servers = list(dns.cluster_dns)
        domain = dns.cluster_domain.strip(".")
        if domain:
            searches = [f"{ns}.svc.{domain}", f"svc.{domain}", domain]
        searches += list(dns.host.searches)
        options = list(DEFAULT_OPTIONS)
    elif mode == "host":
        servers = list(dns.host.nameservers)
        searches = list(dns.host.searches)
        options = list(dns.host.options)
    extra = spec.get("dnsConfig")
    if isinstance(extra, dict):
        servers += [str(s) for s in extra.get("nameservers") or []]
        searches += [str(s).rstrip(".") for s in extra.get("searches") or []]
        options = _merge_options(options, _pod_options(extra))
    servers, searches = _unique(servers), _unique(searches)
    if len(servers) > MAX_NAMESERVERS:
        warnings.append(
            f"nameserver limits were exceeded, some nameservers have been omitted, the applied "
            f"nameserver line is: {' '.join(servers[:MAX_NAMESERVERS])}"
        )
        servers = servers[:MAX_NAMESERVERS]
    kept = _fit_searches(searches)
    if len(kept) < len(searches):
        warnings.append(
            f"search line limits were exceeded, some search paths have been omitted, the "
            f"applied search line is: {' '.join(kept)}"
        )
    return DnsSettings(DNSConfig(tuple(servers), tuple(kept), tuple(options)), tuple(warnings))


def _fit_searches(searches: list[str]) -> list[str]:
    """The first search domains within `MAX_SEARCHES` and `MAX_SEARCH_CHARS` (joined with
    spaces), as the kubelet trims them."""
    kept = searches[:MAX_SEARCHES]
    while kept and len(" ".join(kept)) > MAX_SEARCH_CHARS:
        kept.pop()
    return kept
