"""A lab of "devices" on one machine, for the end-to-end network tests (`NetLab`).

Layout (every namespace is made here by `netns.NamespaceSet`, which also sweeps the namespaces of
labs whose test process died; names unique to the lab: `<prefix><6 hex>-<role>`):

    <id>-lan    a Linux bridge `br0` and the LAN's own address 192.0.2.1 (a person on the LAN:
                `lab.kubectl`, `lab.lan_exec`, NodePort checks run here)
    <id>-srv    the server, `orchestrator server --no-agent`, API on 192.0.2.10:6443
    <id>-dns    a stub upstream DNS server (`orchestrator.testing.stubdns`) on 192.0.2.53 that
                knows `EXTERNAL_NAME` only
    <id>-d1..3  a device: 192.0.2.11.., a private containerd (`ContainerdInstance(netns=...)`)
                and one `orchestrator agent --runtime containerd --node-ip 192.0.2.1N`

Each namespace other than the LAN has one veth `eth0` whose peer is a port of `br0`; the addresses
are from 192.0.2.0/24 (the documentation range) and NO namespace has a default route, so nothing
can leave the lab and a missing rule fails closed. Nothing is done in the root namespace: veths
are created straight into the lab's namespaces (`ip -n`), and processes run under `nsenter
--net=/run/netns/<ns>` (not `ip netns exec`, whose remount of /sys hides the cgroup mount runc
needs), so they share the host's mounts; containerd unmounts its own on stop.

The agents' network flags (`--cni-conf-dir`, `--flannel-backend`, `--resolv-conf`, ...) are passed
only when `orchestrator agent --help` lists them, so the lab also runs against an agent that does
not program the pod network yet: then the lab writes a bridge conflist (`cni0`,
10.42.<N>.0/24 on device N) itself, so pods still get distinct IPs. The devices' resolv.conf
names the stub upstream DNS.

`start()` brings everything up and waits until every device's Node is Ready; `stop()` (also on
leaving the `with` block, and when `start()` fails) stops the agents, containerd (removing its
pod sandboxes through CRI), the DNS stub and the server, kills whatever still runs in the lab's
namespaces and deletes them; best-effort and safe to call twice. Logs: `<base>/*.log`, shown by
`lab.log_tails()`.

The API is synchronous, like `ContainerdInstance` (module-scoped pytest fixtures). Helpers:
`exec(device, argv)`, `kubectl(*args)`, `kubectl_json`, `apply(manifest)`, `pod_exec(pod, argv)`
(a command inside a running pod's namespaces, through nsenter: the product has no `kubectl
exec`; while the server is stopped it finds the pod on the node the API last named),
`pod_net_exec(pod, argv)` (a host binary in the pod's network namespace only),
`wait_for(fn, what, timeout)` (polls with a deadline; fails fast if a lab process died).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import yaml

from orchestrator.testing import containerd as ctd
from orchestrator.testing.netns import NamespaceSet, NetnsError, NetnsProcess, enter, sh

__all__ = [
    "API_PORT",
    "EXTERNAL_ADDRESS",
    "EXTERNAL_NAME",
    "LAN_ADDRESS",
    "LAN_NETWORK",
    "SERVER_ADDRESS",
    "UPSTREAM_DNS_ADDRESS",
    "Device",
    "LabError",
    "NetLab",
    "missing_prerequisites",
]

T = TypeVar("T")

LAN_NETWORK = ipaddress.IPv4Network("192.0.2.0/24")
LAN_ADDRESS = "192.0.2.1"
SERVER_ADDRESS = "192.0.2.10"
UPSTREAM_DNS_ADDRESS = "192.0.2.53"
API_PORT = 6443
EXTERNAL_NAME = "ext.example.org"
EXTERNAL_ADDRESS = "192.0.2.99"  # answered by the stub; nothing listens there
MAX_DEVICES = 3
_TOKEN = "orch-netlab"
_REPO_ROOT = Path(__file__).resolve().parents[2]
_AGENT_NET_FLAGS = ("--cni-conf-dir", "--cni-bin-dir", "--flannel-backend", "--resolv-conf")


class LabError(NetnsError):
    """The lab could not be built, a lab process died, or a waited-for condition never held."""


def missing_prerequisites() -> list[str]:
    """Why a lab cannot run here (empty: it can, as far as we can tell)."""
    problems = ctd.missing_prerequisites()
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin:/usr/bin:/bin"
    for binary, package in (("ip", "iproute2"), ("nsenter", "util-linux"), ("kubectl", "")):
        if shutil.which(binary, path=path) is None:
            problems.append(f"{binary} not found" + (f" (Debian: {package})" if package else ""))
    return problems


@dataclass
class Device:
    """One device: its namespace, address, node name, containerd and agent."""

    index: int  # 1-based
    netns: str
    address: str
    node_name: str
    dir: Path
    containerd: ctd.ContainerdInstance | None = None
    agent: NetnsProcess | None = None
    extra_agent_args: list[str] = field(default_factory=list)

    @property
    def cni_conf_dir(self) -> Path:
        return self.dir / "cni" / "net.d"

    @property
    def resolv_conf(self) -> Path:
        return self.dir / "resolv.conf"

    @property
    def agent_dir(self) -> Path:
        return self.dir / "agent"


class NetLab:
    """A server, a LAN, a stub upstream DNS and 1-3 devices; see the module docstring."""

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        devices: int = 2,
        *,
        prefix: str = "nl",
        flannel_backend: str | None = None,
        agent_args: Sequence[str] = (),
        server_args: Sequence[str] = (),
        records: Mapping[str, str] | None = None,
        log_level: str = "info",
        ready_timeout: float = 90.0,
    ) -> None:
        if not 1 <= devices <= MAX_DEVICES:
            raise ValueError(f"a lab has 1..{MAX_DEVICES} devices, not {devices}")
        self.base_dir = Path(base_dir).absolute()
        self._netns = NamespaceSet(prefix)
        self.id = self._netns.id
        self.lan_ns = f"{self.id}-lan"
        self.server_ns = f"{self.id}-srv"
        self.dns_ns = f"{self.id}-dns"
        self.flannel_backend = flannel_backend
        self.agent_args = list(agent_args)
        self.server_args = list(server_args)
        self.records = dict(records or {EXTERNAL_NAME: EXTERNAL_ADDRESS})
        self.log_level = log_level
        self.ready_timeout = ready_timeout
        self.devices = [
            Device(
                i,
                f"{self.id}-d{i}",
                str(LAN_NETWORK.network_address + 10 + i),
                f"edge-{i}",
                self.base_dir / f"d{i}",
            )
            for i in range(1, devices + 1)
        ]
        self.server_dir = self.base_dir / "server"
        self.server = NetnsProcess("server", self.base_dir / "server.log")
        self.dns = NetnsProcess("upstream-dns", self.base_dir / "upstream-dns.log")
        self.join_token = ""
        self.agent_flags: frozenset[str] = frozenset()
        self._lock = threading.Lock()
        self._pod_nodes: dict[tuple[str, str], str] = {}  # for pod_exec while the server is down

    # -------------------------------------------------------------- addresses and lookups
    @property
    def namespaces(self) -> list[str]:
        return [self.lan_ns, self.server_ns, self.dns_ns, *(d.netns for d in self.devices)]

    @property
    def kubeconfig(self) -> Path:
        return self.server_dir / "kubeconfig.yaml"

    @property
    def api_url(self) -> str:
        return f"https://{SERVER_ADDRESS}:{API_PORT}"

    def device(self, which: int | str | Device) -> Device:
        """A device by 1-based index, node name, namespace or the Device itself."""
        if isinstance(which, Device):
            return which
        for d in self.devices:
            if which in (d.index, d.node_name, d.netns, f"d{d.index}"):
                return d
        raise KeyError(f"no device {which!r} in lab {self.id}")

    def supports(self, flag: str) -> bool:
        """Whether `orchestrator agent` has this flag (e.g. `--flannel-backend`)."""
        return flag in self.agent_flags

    # -------------------------------------------------------------- running commands
    def netns_exec(
        self,
        netns: str,
        argv: Sequence[str],
        *,
        timeout: float = 30.0,
        check: bool = False,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run argv inside a lab namespace and capture its output (never raises on exit code
        unless `check`)."""
        if netns not in self.namespaces:
            raise LabError(f"{netns!r} is not a namespace of lab {self.id}")
        cmd = [*enter(netns), *argv]
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=timeout, input=input, check=False
            )
        except subprocess.TimeoutExpired as e:
            raise LabError(f"{' '.join(cmd)} timed out after {timeout:.0f}s") from e
        if check and proc.returncode != 0:
            raise LabError(
                f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
            )
        return proc

    def exec(
        self, device: int | str | Device, argv: Sequence[str], **kw: Any
    ) -> subprocess.CompletedProcess[str]:
        """Run argv in a device's namespace (the host's binaries, the device's network)."""
        return self.netns_exec(self.device(device).netns, argv, **kw)

    def lan_exec(self, argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        """Run argv on the LAN (192.0.2.1), outside every device."""
        return self.netns_exec(self.lan_ns, argv, **kw)

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """The real kubectl with the lab's admin kubeconfig, run on the LAN."""
        argv = [
            "kubectl",
            "--kubeconfig",
            str(self.kubeconfig),
            "--cache-dir",
            str(self.base_dir / "kube-cache"),
            *args,
        ]
        return self.netns_exec(self.lan_ns, argv, check=check, input=input, timeout=timeout)

    def kubectl_json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def apply(self, *manifests: Mapping[str, Any] | str) -> str:
        """`kubectl apply -f -` of manifests (dicts or YAML text)."""
        docs = [m if isinstance(m, str) else yaml.safe_dump(dict(m)) for m in manifests]
        return self.kubectl("apply", "-f", "-", input="\n---\n".join(docs)).stdout

    def pod_exec(
        self,
        pod: str,
        argv: Sequence[str],
        *,
        namespace: str = "default",
        container: str | None = None,
        timeout: float = 30.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run argv inside a running pod's container (its mounts, network, pid, uts, ipc
        namespaces; its own binaries and resolv.conf), like `kubectl exec` would."""
        dev = self.device(self._pod_node(pod, namespace))
        pid = self._container_pid(dev, pod, namespace, container)
        nsenter = (
            shutil.which("nsenter") or "/usr/bin/nsenter"
        )  # found with our PATH, not the pod's
        cmd = [nsenter, "-t", str(pid), "-m", "-u", "-i", "-n", "-p", "--", *argv]
        try:
            # The container's own environment, as `kubectl exec` gives (never the test's).
            raw = Path(f"/proc/{pid}/environ").read_bytes()
            env = dict(
                v.split("=", 1) for v in raw.decode(errors="replace").split("\0") if "=" in v
            )
        except OSError as e:
            raise LabError(f"pod {namespace}/{pod}: container process {pid} gone ({e})") from e
        env.setdefault("PATH", "/bin:/usr/bin:/sbin:/usr/sbin")
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired as e:
            raise LabError(f"{' '.join(cmd)} in pod {pod} timed out after {timeout}s") from e

    def pod_net_exec(
        self, pod: str, argv: Sequence[str], *, namespace: str = "default", timeout: float = 30.0
    ) -> subprocess.CompletedProcess[str]:
        """Run a host binary in a running pod's network namespace only (its addresses, routes
        and the node's rules as the pod meets them; the host's files and resolv.conf)."""
        dev = self.device(self._pod_node(pod, namespace))
        pid = self._container_pid(dev, pod, namespace, None)
        cmd = [shutil.which("nsenter") or "/usr/bin/nsenter", "-t", str(pid), "-n", "--", *argv]
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise LabError(f"{' '.join(cmd)} in pod {pod} timed out after {timeout}s") from e

    def _pod_node(self, pod: str, namespace: str) -> str:
        """The pod's node: from the API, or (server stopped: an outage) the last one seen."""
        r = self.kubectl("get", "pod", pod, "-n", namespace, "-o", "json", check=False, timeout=20)
        if r.returncode == 0:
            node = (json.loads(r.stdout).get("spec") or {}).get("nodeName")
            if not node:
                raise LabError(f"pod {namespace}/{pod} is not scheduled")
            self._pod_nodes[namespace, pod] = str(node)
            return str(node)
        known = self._pod_nodes.get((namespace, pod))
        if known is None:
            raise LabError(f"pod {namespace}/{pod}: no node known and the API says:\n{r.stderr}")
        return known

    def _container_pid(self, dev: Device, pod: str, namespace: str, container: str | None) -> int:
        if dev.containerd is None:
            raise LabError(f"device {dev.node_name} has no containerd")
        c = dev.containerd
        tasks: dict[str, int] = {}
        for line in c.ctr("tasks", "ls").stdout.splitlines()[1:]:
            cols = line.split()
            if len(cols) >= 3 and cols[2] == "RUNNING":
                tasks[cols[0]] = int(cols[1])
        for cid in tasks:
            info = json.loads(c.ctr("containers", "info", cid).stdout)
            labels = info.get("Labels") or {}
            if (
                labels.get("io.kubernetes.pod.name") == pod
                and labels.get("io.kubernetes.pod.namespace") == namespace
                and labels.get("io.cri-containerd.kind") == "container"
                and container in (None, labels.get("io.kubernetes.container.name"))
            ):
                return tasks[cid]
        raise LabError(f"no running container of pod {namespace}/{pod} on {dev.node_name}")

    # -------------------------------------------------------------- waiting
    def check_alive(self) -> None:
        """Raise LabError with the log tail if a lab process has died unexpectedly."""
        procs = [self.server, self.dns, *(d.agent for d in self.devices if d.agent)]
        for p in procs:
            if p.popen is not None and not p.expected_exit and not p.running:
                raise LabError(f"{p.name} exited ({p.popen.returncode})\n{p.tail()}")
        for d in self.devices:
            if d.containerd is not None and d.containerd.pid and not d.containerd.running():
                raise LabError(f"containerd of {d.node_name} died\n{d.containerd.log_tail()}")

    def wait_for(
        self, fn: Callable[[], T | None], what: str, timeout: float = 60.0, interval: float = 0.25
    ) -> T:
        """Poll fn until it returns something truthy (returned), or fail after `timeout` s.
        LabError from fn counts as "not yet"; the last one is shown on timeout."""
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while True:
            self.check_alive()
            try:
                value = fn()
            except NetnsError as e:  # LabError included
                last, value = e, None
            if value:
                return value
            if time.monotonic() > deadline:
                raise LabError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last}")
            time.sleep(interval)

    def nodes_ready(self) -> dict[str, dict[str, Any]] | None:
        """{node name: Node} once every device's Node is Ready, else None."""
        r = self.kubectl("get", "nodes", "-o", "json", check=False, timeout=20)
        if r.returncode != 0:
            return None
        nodes = {n["metadata"]["name"]: n for n in json.loads(r.stdout)["items"]}
        for d in self.devices:
            conds = ((nodes.get(d.node_name) or {}).get("status") or {}).get("conditions") or []
            if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds):
                return None
        return nodes

    def log_tails(self, lines: int = 40) -> str:
        parts = [self.server.tail(lines), self.dns.tail(10)]
        for d in self.devices:
            if d.agent is not None:
                parts.append(d.agent.tail(lines))
            if d.containerd is not None:
                parts.append(f"----- containerd {d.node_name} -----\n{d.containerd.log_tail(15)}")
        return "\n".join(parts)

    # -------------------------------------------------------------- lifecycle
    def start(self) -> NetLab:
        problems = missing_prerequisites()
        if problems:
            raise LabError("cannot build a network lab here: " + "; ".join(problems))
        self.base_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._build_network()
            self.agent_flags = self._agent_flags()
            self._start_dns()
            self._start_server()
            self.join_token = self._create_token()
            for d in self.devices:
                self._start_device(d)
            self.wait_for(self.nodes_ready, "every device's Node Ready", self.ready_timeout)
        except BaseException:
            tails = self.log_tails()
            self.stop()
            print(tails, file=sys.stderr)
            raise
        return self

    def _ip(self, *args: str) -> None:
        sh(["ip", *args])

    def _add_netns(self, name: str) -> None:
        self._netns.create(name.removeprefix(self.id + "-"))

    def _build_network(self) -> None:
        self._add_netns(self.lan_ns)
        self._ip("-n", self.lan_ns, "link", "add", "br0", "type", "bridge")
        self._ip("-n", self.lan_ns, "addr", "add", f"{LAN_ADDRESS}/24", "dev", "br0")
        self._ip("-n", self.lan_ns, "link", "set", "br0", "up")
        ends = [("srv", self.server_ns, SERVER_ADDRESS), ("dns", self.dns_ns, UPSTREAM_DNS_ADDRESS)]
        ends += [(f"d{d.index}", d.netns, d.address) for d in self.devices]
        for port, ns, address in ends:
            self._add_netns(ns)
            # Both ends are born inside lab namespaces: the root namespace never sees them.
            self._veth(port, ns)
            self._ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            self._ip("-n", ns, "link", "set", "eth0", "up")
            # Devices route pod traffic for each other (host-gw) and for their pods.
            sh([*enter(ns), "sysctl", "-qw", "net.ipv4.ip_forward=1"])

    def _veth(self, port: str, ns: str) -> None:
        self._ip(
            "-n", self.lan_ns, "link", "add", port, "type", "veth", "peer", "name", "eth0",
            "netns", ns,
        )  # fmt: skip
        self._ip("-n", self.lan_ns, "link", "set", "dev", port, "master", "br0", "up")

    def _agent_flags(self) -> frozenset[str]:
        out = sh(self._python("agent", "--help"), timeout=60)
        return frozenset(f for f in _AGENT_NET_FLAGS if f in out)

    def _python(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "orchestrator", *args]

    def _env(self) -> dict[str, str]:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("NOTIFY_SOCKET", None)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_REPO_ROOT), env.get("PYTHONPATH")]))
        return env

    def _spawn(
        self, proc: NetnsProcess, netns: str, argv: Sequence[str], *, hide: str = ""
    ) -> None:
        proc.start(netns, argv, env=self._env(), cwd=_REPO_ROOT, secret=hide)

    def _start_dns(self) -> None:
        argv = [sys.executable, "-m", "orchestrator.testing.stubdns", "--listen"]
        argv += [UPSTREAM_DNS_ADDRESS, *(f"--record={n}={a}" for n, a in self.records.items())]
        self._spawn(self.dns, self.dns_ns, argv)

    def server_argv(self) -> list[str]:
        return self._python(
            "--log-level", self.log_level, "--log-format", "text", "server",
            "--data-dir", str(self.server_dir), "--listen", f"{SERVER_ADDRESS}:{API_PORT}",
            "--tls-san", SERVER_ADDRESS, "--no-agent", "--token", _TOKEN,
            "--node-monitor-grace-period", "10s", *self.server_args,
        )  # fmt: skip

    def _start_server(self) -> None:
        self.server_dir.mkdir(parents=True, exist_ok=True)
        self._spawn(self.server, self.server_ns, self.server_argv())

        def api_up() -> bool:
            if not self.kubeconfig.exists():
                return False
            return self.kubectl("get", "ns", "default", check=False, timeout=20).returncode == 0

        self.wait_for(api_up, "the server's API on the LAN", 60)

    def stop_server(self) -> None:
        """Stop the server (an outage: the devices are cut off from the control plane)."""
        self.server.stop()

    def start_server(self) -> None:
        """Start the server again after `stop_server` (same data) and wait for its API."""
        if not self.server.running:
            self._start_server()

    def _create_token(self) -> str:
        argv = self._python("token", "create", "--data-dir", str(self.server_dir))
        out = self.netns_exec(self.server_ns, [*argv, "--ttl", "0"], check=True, timeout=60)
        token = out.stdout.strip().splitlines()[-1].strip()
        if not token.startswith("K10"):
            raise LabError(f"token create printed no K10 token:\n{out.stdout}\n{out.stderr}")
        return token

    def agent_argv(self, d: Device) -> list[str]:
        assert d.containerd is not None
        argv = self._python(
            "--log-level", self.log_level, "--log-format", "text", "agent",
            "--server", self.api_url, "--token", self.join_token,
            "--data-dir", str(d.agent_dir), "--node-name", d.node_name, "--node-ip", d.address,
            "--runtime", "containerd", "--containerd-socket", str(d.containerd.socket),
            "--lease-renew-interval", "1",
        )  # fmt: skip
        if self.supports("--cni-conf-dir"):
            argv += ["--cni-conf-dir", str(d.cni_conf_dir)]
        if self.supports("--cni-bin-dir"):
            argv += ["--cni-bin-dir", d.containerd.cni_bin_dir]
        if self.supports("--resolv-conf"):
            argv += ["--resolv-conf", str(d.resolv_conf)]
        if self.flannel_backend is not None:
            if not self.supports("--flannel-backend"):
                raise LabError("the agent has no --flannel-backend flag (pod network not built)")
            argv += ["--flannel-backend", self.flannel_backend]
        return argv + self.agent_args + d.extra_agent_args

    def _start_device(self, d: Device) -> None:
        d.dir.mkdir(parents=True, exist_ok=True)
        d.cni_conf_dir.mkdir(parents=True, exist_ok=True)
        d.resolv_conf.write_text(f"nameserver {UPSTREAM_DNS_ADDRESS}\n")
        if not self.supports("--cni-conf-dir"):
            self._write_fallback_conflist(d)
        d.containerd = ctd.ContainerdInstance(
            d.dir / "ctd",
            network=None,
            cni_conf_dir=d.cni_conf_dir,
            netns=d.netns,
            # host-local's default lease store, per device as on separate machines
            private_dirs={"/var/lib/cni": d.dir / "var-lib-cni"},
        )
        d.containerd.start()
        d.agent = NetnsProcess(f"agent {d.node_name}", d.dir / "agent.log")
        self.start_agent(d)

    def start_agent(self, device: int | str | Device) -> None:
        d = self.device(device)
        if d.agent is None:
            d.agent = NetnsProcess(f"agent {d.node_name}", d.dir / "agent.log")
        if not d.agent.running:
            self._spawn(d.agent, d.netns, self.agent_argv(d), hide=self.join_token)

    def stop_agent(self, device: int | str | Device) -> None:
        d = self.device(device)
        if d.agent is not None:
            d.agent.stop()

    def _write_fallback_conflist(self, d: Device) -> None:
        """Today's agent writes no conflist: a bridge `cni0` in 10.42.<N>.0/24 instead."""
        subnet = ipaddress.IPv4Network(f"10.42.{d.index}.0/24")
        conf = {
            "cniVersion": "1.0.0",
            "name": "netlab",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "cni0",
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": str(subnet), "gateway": str(subnet[1])}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
                {"type": "loopback"},
            ],
        }
        (d.cni_conf_dir / "10-netlab.conflist").write_text(json.dumps(conf, indent=2) + "\n")

    def stop(self) -> None:
        """Tear everything down, best-effort; safe to call more than once."""
        with self._lock:
            for d in self.devices:
                if d.agent is not None:
                    with contextlib.suppress(Exception):
                        d.agent.stop()
            for d in self.devices:
                if d.containerd is not None:
                    with contextlib.suppress(Exception):
                        d.containerd.stop()
            for p in (self.dns, self.server):
                with contextlib.suppress(Exception):
                    p.stop()
            self._netns.delete()

    def __enter__(self) -> NetLab:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            print(self.log_tails(), file=sys.stderr)
        self.stop()
