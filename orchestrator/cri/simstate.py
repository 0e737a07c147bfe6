"""What `SimulatedRuntime` keeps per sandbox and container, the CRI log record format it
writes, and what a container does when it is reached: the simulated network (`http_status`,
`accepts`) and commands run in it (`run_exec`). Nothing here opens a socket or a process.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import trio

from orchestrator.cri.runtime import (
    ContainerConfig,
    ContainerState,
    DeadlineExceeded,
    ExecResult,
    PodSandboxConfig,
    Resources,
    RuntimeFailure,
    SandboxState,
)
from orchestrator.cri.simshell import (
    FOREVER,
    Behaviour,
    Timeline,
    argv_to_script,
    echo_words,
    parse_seconds,
)

__all__ = [
    "POD_UID_LABEL",
    "PodIndex",
    "PodIps",
    "SimContainer",
    "SimSandbox",
    "accepts",
    "format_cri_log_line",
    "http_status",
    "run_exec",
    "url_port",
]

# The label the kubelet (and our agent) puts on every sandbox and container of a pod, and lists
# one pod's sandboxes and containers by.
POD_UID_LABEL = "io.kubernetes.pod.uid"


class PodIps:
    """The pod IPs of the simulated node: host addresses of its podCIDR from .2 up (.1 is the
    bridge's, as with CNI's bridge plugin), released ones first, in release order.
    `set_network` (CRI `UpdateRuntimeConfig`) moves later sandboxes to a new podCIDR; sandboxes
    keep the address they have, and an address in use is never handed out twice."""

    def __init__(self, cidr: str) -> None:
        self.network = ipaddress.ip_network(cidr, strict=True)
        self._free: list[str] = []
        self._next = 2
        self._used: set[str] = set()

    def set_network(self, cidr: str) -> None:
        try:
            network = ipaddress.ip_network(cidr, strict=True)
        except ValueError as exc:
            raise RuntimeFailure(f"pod_cidr {cidr!r} is not a network: {exc}") from None
        if network.num_addresses < 4:
            raise RuntimeFailure(f"pod_cidr {cidr} is too small for a gateway and pods")
        if network != self.network:
            self.network, self._free, self._next = network, [], 2

    def allocate(self) -> str:
        while self._free:
            ip = self._free.pop(0)
            if ip not in self._used:
                self._used.add(ip)
                return ip
        while self._next < self.network.num_addresses - 1:
            ip = str(self.network.network_address + self._next)
            self._next += 1
            if ip not in self._used:
                self._used.add(ip)
                return ip
        raise RuntimeFailure(f"failed to allocate an IP: {self.network} is exhausted")

    def release(self, ip: str) -> None:
        if ip in self._used:
            self._used.discard(ip)
            if ipaddress.ip_address(ip) in self.network:
                self._free.append(ip)


class PodIndex:
    """The ids of the sandboxes and containers of each pod (by their `POD_UID_LABEL`), so that
    a list filtered by that label (every pod worker's observation, every second) looks at one
    pod's entries instead of all of them: without it, N pods cost O(N^2) per relist round."""

    def __init__(self) -> None:
        self._ids: dict[str, dict[str, None]] = {}  # pod UID -> ids, in creation order

    def add(self, ident: str, labels: Mapping[str, str]) -> None:
        uid = labels.get(POD_UID_LABEL)
        if uid is not None:
            self._ids.setdefault(uid, {})[ident] = None

    def discard(self, ident: str, labels: Mapping[str, str]) -> None:
        uid = labels.get(POD_UID_LABEL)
        if uid is None or uid not in self._ids:
            return
        ids = self._ids[uid]
        ids.pop(ident, None)
        if not ids:
            del self._ids[uid]

    def narrow(self, labels: Mapping[str, str] | None) -> list[str] | None:
        """The only ids that can match `labels` (in creation order), or None when the filter
        names no pod."""
        uid = labels.get(POD_UID_LABEL) if labels else None
        return None if uid is None else list(self._ids.get(uid, ()))


@dataclass
class SimSandbox:
    id: str
    config: PodSandboxConfig
    state: SandboxState
    created_at: int
    ip: str


@dataclass
class SimContainer:
    id: str
    sandbox_id: str
    config: ContainerConfig
    behaviour: Behaviour | None
    image_ref: str
    log_path: str
    created_at: int
    state: ContainerState = ContainerState.CREATED
    started_mono: float = 0.0
    started_at: int = 0
    finished_at: int = 0
    exit_code: int = 0
    reason: str = ""
    message: str = ""
    timeline: Timeline = field(default_factory=Timeline)
    next_event: int = 0
    files: dict[str, bytes] = field(default_factory=dict)
    resources: Resources | None = None


def format_cri_log_line(ts_ns: int, stream: str, text: str, tag: str = "F") -> str:
    """One CRI log record: `<RFC3339Nano> <stream> <F|P> <text>\\n` (fraction's zeros trimmed)."""
    secs, nanos = divmod(ts_ns, 1_000_000_000)
    stamp = datetime.fromtimestamp(secs, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    frac = f"{nanos:09d}".rstrip("0")
    return f"{stamp}{'.' + frac if frac else ''}Z {stream} {tag} {text}\n"


async def run_exec(
    c: SimContainer,
    cmd: Sequence[str],
    timeout_seconds: float,
    pod_containers: Callable[[], Iterator[SimContainer]],
) -> ExecResult:
    """`exec_sync` of `cmd` in running container `c`, interpreted by the tiny shell: `echo`,
    `cat`, `test -e/-f`, `sleep` (past the timeout: `DeadlineExceeded`), `exit`, `true`,
    `false`, `touch`, `rm` on the container's files, `wget` against `pod_containers()` (its own
    pod's); an unknown binary is a `RuntimeFailure`, as with runc."""
    commands, is_shell = argv_to_script(cmd)
    known = {"sh", "echo", "cat", "sleep", "true", "false", "exit", "touch", "rm", "test"}
    if not is_shell and os.path.basename(cmd[0]) not in known | {"ls", "wget", "["}:
        raise RuntimeFailure(
            f"failed to exec in container: failed to start exec: OCI runtime exec failed: "
            f'exec failed: unable to start container process: exec: "{cmd[0]}": '
            "executable file not found in $PATH: unknown"
        )
    limit = timeout_seconds if timeout_seconds > 0 else FOREVER
    out, err = bytearray(), bytearray()
    code = 0
    start = trio.current_time()
    for words in commands:
        name = os.path.basename(words[0])
        if name == "echo":
            text, stream, append, target = echo_words(words)
            if target:
                c.files[target] = (c.files.get(target, b"") if append else b"") + text.encode()
            else:
                (err if stream == "stderr" else out).extend(text.encode())
            code = 0
        elif name == "cat":
            code = 0
            for path in words[1:]:
                if path in c.files:
                    out.extend(c.files[path])
                else:
                    err.extend(f"cat: can't open '{path}': No such file or directory\n".encode())
                    code = 1
        elif name in ("test", "[") and len(words) >= 3 and words[1] in ("-e", "-f"):
            code = 0 if words[2] in c.files else 1
        elif name == "sleep":
            seconds = parse_seconds(words[1] if len(words) > 1 else "0")
            left = limit - (trio.current_time() - start)
            if seconds > left:
                await trio.sleep(max(0.0, left))
                raise DeadlineExceeded(
                    f"failed to exec in container: timeout {timeout_seconds:g}s exceeded: "
                    "context deadline exceeded"
                )
            await trio.sleep(seconds)
            code = 0
        elif name == "exit":
            code = int(words[1]) if len(words) > 1 else code
            break
        elif name == "true":
            code = 0
        elif name == "false":
            code = 1
        elif name == "touch":
            for path in words[1:]:
                c.files.setdefault(path, b"")
            code = 0
        elif name == "rm":
            for path in words[1:]:
                c.files.pop(path, None)
            code = 0
        elif name == "wget":
            url = next((w for w in words[1:] if "://" in w), "")
            port = url_port(url)
            # its own pod's containers answer (localhost or the pod's IP alike)
            status = http_status(pod_containers(), port) if url else None
            code = 0 if status is not None and 200 <= status < 400 else 1
        else:
            err.extend(f"sh: {words[0]}: not found\n".encode())
            code = 127
    return ExecResult(stdout=bytes(out), stderr=bytes(err), exit_code=code)


def http_status(containers: Iterator[SimContainer], port: int) -> int | None:
    """What a GET to `port` of the first of `containers` serving it answers; None: refused."""
    for c in containers:
        b = c.behaviour
        if b is not None and b.http_status is not None and (not b.ports or port in b.ports):
            return b.http_status
        if port in c.timeline.http_ports:
            return 200
    return None


def accepts(containers: Iterator[SimContainer], port: int) -> bool:
    """Whether one of `containers` accepts a TCP connection on `port`."""
    for c in containers:
        b = c.behaviour
        ports = set(c.timeline.http_ports) | set(b.ports if b else ())
        if port in ports or (b is not None and b.http_status is not None and not b.ports):
            return True
    return False


def url_port(url: str) -> int:
    rest = url.split("://", 1)[-1].split("/", 1)[0]
    if ":" in rest:
        try:
            return int(rest.rsplit(":", 1)[1])
        except ValueError:
            return 80
    return 443 if url.startswith("https") else 80
