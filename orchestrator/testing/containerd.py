"""A private containerd for tests, benchmarks and development (`ContainerdInstance`).

Everything lives under one base directory, so it runs next to a system containerd (or another
instance) without sharing state:

    <base>/config.toml          the generated configuration
    <base>/containerd.log       the daemon's stdout+stderr
    <base>/containerd.sock      gRPC socket (CRI and containerd API; ttrpc is `.sock.ttrpc`)
    <base>/root, <base>/state   containerd root and state (netns mounts under state too)
    <base>/runc                 runc's state root (runtimes.runc.options.Root)
    <base>/cni/net.d            CNI conf dir: one bridge conflist (`orch<N>`, 10.89.<N>.0/24)
    <base>/cni/ipam             host-local IPAM leases (not the global /var/lib/cni/networks)
    <base>/images               the OCI tarballs built by `orchestrator.testing.images`

Configuration (see the team reference on CRI/containerd): `sandbox_image = "localhost/pause:1"`
(imported, never pulled); `restrict_oom_score_adj = true`, which is mandatory where root lacks
CAP_SYS_RESOURCE (else every RunPodSandbox fails with "can't get final child's PID from pipe");
`runtimes.runc` with `runtime_type = "io.containerd.runc.v2"` next to its options (cgroupfs
driver); CNI binaries from Debian's /usr/lib/cni; AppArmor off so the same config works whether or
not the host has AppArmor.

Inside a network namespace (`netns="NAME"`: the daemon is started with `nsenter
--net=/run/netns/NAME`, as `orchestrator.testing.netlab` does for its devices) the pod network
belongs to that namespace: `network=None` claims no slot and writes no conflist, and
`cni_conf_dir` points containerd at the directory the node agent writes its own conflist into;
`private_dirs={"/var/lib/cni": DIR}` gives the daemon (and so its CNI plugins) its own copy of a
host directory, bind-mounted in a mount namespace of its own, as if it ran on its own machine.

The bridge and its subnet are host-wide, so each running instance holds a *network slot* N
(bridge `orch<N>`, pods in 10.89.<N>.0/24, N in 0..99) with an flock on
`/run/lock/orchestrator-cni-orch<N>.lock` until it stops. `network=0` (the default, and the
command line's) is for a developer's instance; `network="auto"` (the test fixture, benchmarks)
takes the first free slot from 1, so tests can run next to a developer's daemon.

`start()` writes the config, builds both images, launches `containerd --config`, waits for the
socket and `ctr version`, checks that the CRI plugin loaded, and imports `localhost/busybox:1` and
`localhost/pause:1` into namespace `k8s.io`. `stop()` removes every pod sandbox through CRI (so CNI
releases its veths and leases), kills leftover tasks, sends SIGTERM (then SIGKILL), kills shims
still serving this socket and unmounts whatever is left under the base directory; all best-effort.

The API is synchronous (pytest session fixtures cannot be async under pytest-trio); from trio use
`async with ContainerdInstance(...)`, which runs start and stop in a worker thread.

Developer use: `python -m orchestrator.testing.containerd --dir /tmp/x` runs one in the
foreground and prints the socket path; Ctrl-C stops it.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import ipaddress
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal

import trio

from orchestrator.systemd import exit_description
from orchestrator.testing.crisweep import remove_all_sandboxes
from orchestrator.testing.images import BUSYBOX, PAUSE_IMAGE, build_default_images

__all__ = [
    "CRI_NAMESPACE",
    "ContainerdError",
    "ContainerdInstance",
    "main",
    "missing_prerequisites",
]

CRI_NAMESPACE = "k8s.io"
DEFAULT_CNI_BIN_DIR = "/usr/lib/cni"
MAX_NETWORK_SLOT = 99
_LOCK_DIRS = ("/run/lock", "/tmp")
_BINARIES = ("containerd", "ctr", "runc", "containerd-shim-runc-v2")
_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_SOCKET_MAX = 107  # sun_path is 108 bytes including the NUL


class ContainerdError(RuntimeError):
    """containerd could not be started or prepared; the message ends with its log tail."""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = env.get("PATH", "") + ":" + _SYSTEM_PATH
    return env


def missing_prerequisites(
    cni_bin_dir: str = DEFAULT_CNI_BIN_DIR, busybox: Path = BUSYBOX
) -> list[str]:
    """Why a private containerd cannot run here (empty list: it can, as far as we can tell)."""
    problems: list[str] = []
    if os.geteuid() != 0:
        problems.append("not running as root")
    path = _env()["PATH"]
    for binary in _BINARIES:
        if shutil.which(binary, path=path) is None:
            problems.append(f"{binary} not found (Debian: containerd, runc)")
    for plugin in ("bridge", "host-local", "loopback", "portmap"):
        if not (Path(cni_bin_dir) / plugin).exists():
            problems.append(
                f"CNI plugin {cni_bin_dir}/{plugin} missing (Debian: containernetworking-plugins)"
            )
    if not busybox.is_file():
        problems.append(f"{busybox} missing (Debian: busybox-static)")
    return problems


# ------------------------------------------------------------------ the instance


class ContainerdInstance:
    """A containerd daemon confined to `base_dir`; see the module docstring."""

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        *,
        network: int | Literal["auto"] | None = 0,
        cni_bin_dir: str = DEFAULT_CNI_BIN_DIR,
        cni_conf_dir: str | os.PathLike[str] | None = None,
        netns: str | None = None,
        private_dirs: Mapping[str, str | os.PathLike[str]] | None = None,
        snapshotter: str = "overlayfs",
        log_level: str = "info",
        import_images: bool = True,
    ) -> None:
        self.base_dir = Path(base_dir).absolute()
        self.config_path = self.base_dir / "config.toml"
        self.log_path = self.base_dir / "containerd.log"
        self.socket = self.base_dir / "containerd.sock"
        self.root = self.base_dir / "root"
        self.state = self.base_dir / "state"
        self.runc_root = self.base_dir / "runc"
        self.cni_conf_dir = (
            Path(cni_conf_dir).absolute() if cni_conf_dir else self.base_dir / "cni" / "net.d"
        )
        self.netns = netns  # run the daemon inside this named network namespace
        # {host path: our directory}: bind-mounted in a mount namespace of the daemon's own
        # (slave: nothing it mounts reaches the host; all of it goes when its processes do).
        self.private_dirs = {k: Path(v).absolute() for k, v in (private_dirs or {}).items()}
        self.cni_ipam_dir = self.base_dir / "cni" / "ipam"
        self.images_dir = self.base_dir / "images"
        slot_ok = isinstance(network, int) and 0 <= network <= MAX_NETWORK_SLOT
        if not (slot_ok or network in ("auto", None)):
            raise ValueError(f"network slot must be 0..{MAX_NETWORK_SLOT}, 'auto' or None")
        self.network = network
        self.slot: int | None = None  # the claimed network slot, while running
        self._slot_lock: IO[bytes] | None = None
        self.cni_bin_dir = cni_bin_dir
        self.snapshotter = snapshotter
        self.log_level = log_level
        self.import_images = import_images
        self.images: dict[str, Path] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    # -------------------------------------------------------------- properties and helpers
    @property
    def address(self) -> str:
        """The gRPC target for CRI clients: `unix:///.../containerd.sock`."""
        return f"unix://{self.socket}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        """The last `lines` lines of the daemon log ("" if there is none yet)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def ctr(
        self, *args: str, namespace: str = CRI_NAMESPACE, timeout: float = 60.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run `ctr -a <socket> -n <namespace> <args>` and capture its output."""
        cmd = ["ctr", "-a", str(self.socket), "-n", namespace, *args]
        try:
            return subprocess.run(
                cmd, capture_output=True, text=True, timeout=timeout, check=check, env=_env()
            )
        except subprocess.CalledProcessError as e:
            raise ContainerdError(
                f"{' '.join(cmd)} failed ({e.returncode}): {e.stderr.strip() or e.stdout.strip()}"
            ) from e

    def _fail(self, message: str) -> ContainerdError:
        return ContainerdError(f"{message}\n--- {self.log_path} (tail) ---\n{self.log_tail()}")

    # -------------------------------------------------------------- network slot
    def _current_slot(self) -> int:
        if self.slot is not None:
            return self.slot
        if self.network is None:
            raise ContainerdError("no network slot: the pod network is someone else's (None)")
        if self.network == "auto":
            raise ContainerdError("network slot not claimed yet (start() claims it)")
        return self.network

    @property
    def bridge(self) -> str:
        """The Linux bridge of the pod network (`orch<slot>`)."""
        return f"orch{self._current_slot()}"

    @property
    def subnet(self) -> ipaddress.IPv4Network:
        """The pod subnet (`10.89.<slot>.0/24`); the gateway (the bridge) is `.1`."""
        return ipaddress.IPv4Network(f"10.89.{self._current_slot()}.0/24")

    def _claim_network(self) -> None:
        """Take the flock of our network slot (the first free one from 1 for `auto`)."""
        if self.network is None:
            return
        lock_dir = next((d for d in _LOCK_DIRS if os.access(d, os.W_OK)), _LOCK_DIRS[-1])
        candidates = range(1, MAX_NETWORK_SLOT + 1) if self.network == "auto" else [self.network]
        for slot in candidates:
            f = open(Path(lock_dir) / f"orchestrator-cni-orch{slot}.lock", "a+b")  # noqa: SIM115
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                f.close()
                continue
            self.slot, self._slot_lock = slot, f
            return
        raise ContainerdError(
            f"network slot {self.network} (bridge orch{self.network}) is in use by another "
            "ContainerdInstance; choose another number or 'auto'"
            if self.network != "auto"
            else f"all network slots 1..{MAX_NETWORK_SLOT} are in use"
        )

    def _release_network(self) -> None:
        if self._slot_lock is not None:
            self._slot_lock.close()  # drops the flock
            self._slot_lock = None
        self.slot = None

    # -------------------------------------------------------------- configuration
    def cni_conflist(self) -> dict[str, Any]:
        """The bridge network: `bridge` with gateway .1, no masquerade, portmap, loopback."""
        gateway = str(next(self.subnet.hosts()))
        return {
            "cniVersion": "1.0.0",
            "name": "orch",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(self.cni_ipam_dir),
                        "ranges": [[{"subnet": str(self.subnet), "gateway": gateway}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
                {"type": "loopback"},
            ],
        }

    def config_toml(self) -> str:
        """The containerd configuration (TOML; strings JSON-quoted = TOML basic strings)."""
        q = json.dumps
        cri = '[plugins."io.containerd.grpc.v1.cri"'
        return f"""\
# Generated by orchestrator.testing.containerd: a private containerd confined to {self.base_dir}
version = 2
root = {q(str(self.root))}
state = {q(str(self.state))}

[grpc]
  address = {q(str(self.socket))}

[debug]
  level = {q(self.log_level)}

[plugins."io.containerd.internal.v1.opt"]
  path = {q(str(self.base_dir / "opt"))}

{cri}]
  sandbox_image = {q(PAUSE_IMAGE)}
  restrict_oom_score_adj = true
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_unprivileged_ports = false
  enable_unprivileged_icmp = false

{cri}.cni]
  bin_dir = {q(self.cni_bin_dir)}
  conf_dir = {q(str(self.cni_conf_dir))}
  max_conf_num = 1

{cri}.containerd]
  snapshotter = {q(self.snapshotter)}
  default_runtime_name = "runc"

{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  Root = {q(str(self.runc_root))}
"""

    def write_config(self) -> None:
        """Create the directories and write config.toml and the CNI conflist."""
        if len(str(self.socket)) + len(".ttrpc") > _SOCKET_MAX:
            raise ContainerdError(f"socket path too long for a unix socket: {self.socket}")
        for d in (self.base_dir, self.root, self.state, self.runc_root, self.cni_conf_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.base_dir.chmod(0o711)
        self.config_path.write_text(self.config_toml())
        if self.network is not None:
            (self.cni_conf_dir / "10-orch.conflist").write_text(
                json.dumps(self.cni_conflist(), indent=2) + "\n"
            )

    # -------------------------------------------------------------- lifecycle
    def start(self, timeout: float = 30.0) -> None:
        """Write the config, start containerd, wait until it serves, import the images.

        Raises `ContainerdError` (with the log tail) on failure, after stopping the daemon.
        """
        if self.running():
            raise ContainerdError(f"containerd already running (pid {self.pid})")
        problems = missing_prerequisites(self.cni_bin_dir)
        if problems:
            raise ContainerdError("cannot run containerd here: " + "; ".join(problems))
        self._claim_network()
        try:
            self.write_config()
            if self.import_images:
                self.images = build_default_images(self.images_dir)
            with contextlib.suppress(FileNotFoundError):
                self.socket.unlink()  # a stale socket from a killed run would fool the wait
            self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
            self._log.write(
                f"\n=== orchestrator.testing.containerd start {time.ctime()}\n".encode()
            )
            self._log.flush()
            # nsenter, not `ip netns exec`: that remounts /sys, hiding the cgroup mount runc needs.
            netns = ["nsenter", f"--net=/run/netns/{self.netns}", "--"] if self.netns else []
            self._proc = subprocess.Popen(
                [*netns, *self._private_mounts(), "containerd", "--config", str(self.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=_env(),
                start_new_session=True,  # Ctrl-C reaches us, and we stop it in order
            )
            self._wait_ready(timeout)
            self._check_cri_plugin()
            if self.import_images:
                self._import_images()
        except BaseException:
            self.stop(teardown=False)
            raise

    def _private_mounts(self) -> list[str]:
        """The argv prefix that gives the daemon `private_dirs` ([] when there are none)."""
        if not self.private_dirs:
            return []
        script, args = "", []
        for i, (where, ours) in enumerate(sorted(self.private_dirs.items())):
            ours.mkdir(parents=True, exist_ok=True)
            Path(where).mkdir(parents=True, exist_ok=True)  # the mount point (an empty dir)
            script += f'mount --bind "${{{2 * i + 1}}}" "${{{2 * i + 2}}}" && '
            args += [str(ours), where]
        n = len(args)
        script += f'shift {n} && exec "$@"'
        return ["unshare", "--mount", "--propagation", "slave", "--", "sh", "-c", script, "sh",
                *args]  # fmt: skip

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise self._fail(f"containerd {exit_description(self._proc.returncode)}")
            if self.socket.exists():
                try:
                    result = self.ctr("version", timeout=5, check=False)
                except subprocess.TimeoutExpired:
                    last = "ctr version timed out"
                else:
                    if result.returncode == 0:
                        return
                    last = result.stderr.strip()
            if time.monotonic() > deadline:
                raise self._fail(
                    f"containerd not ready after {timeout:.0f}s ({last or 'no socket'})"
                )
            time.sleep(0.1)

    def _check_cri_plugin(self) -> None:
        listing = self.ctr("plugins", "ls").stdout
        for line in listing.splitlines():
            cols = line.split()
            if cols[:2] == ["io.containerd.grpc.v1", "cri"]:
                if cols[-1] != "ok":
                    raise self._fail(f"CRI plugin did not load (status {cols[-1]})")
                break
        else:
            raise self._fail("CRI plugin io.containerd.grpc.v1.cri not listed by ctr plugins ls")
        if "failed to load plugin io.containerd.grpc.v1.cri" in self.log_tail(10_000):
            raise self._fail("CRI plugin failed to load")

    def _import_images(self) -> None:
        for ref, tarball in self.images.items():
            self.ctr("images", "import", "--snapshotter", self.snapshotter, str(tarball))
            if ref not in self.image_refs():
                raise self._fail(f"image {ref} not listed after importing {tarball}")

    def image_refs(self) -> list[str]:
        """Image names in the CRI namespace (`ctr -n k8s.io images ls -q`)."""
        return self.ctr("images", "ls", "-q").stdout.split()

    def stop(self, *, teardown: bool = True, timeout: float = 10.0) -> None:
        """Stop containerd and clean up after it, best-effort; safe to call more than once.

        With `teardown`, pod sandboxes are first stopped and removed through CRI and leftover
        tasks killed, so no container, veth, netns or IP lease outlives the daemon.
        """
        proc = self._proc
        if proc is not None and proc.poll() is None:
            if teardown:
                self._teardown_workloads()
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._kill_own_shims()
        self._unmount_below_base()
        if self._log is not None:
            self._log.close()
            self._log = None
        self._release_network()

    def _teardown_workloads(self) -> None:
        with contextlib.suppress(Exception):
            remove_all_sandboxes(self.socket)
        with contextlib.suppress(Exception):
            namespaces = self.ctr("namespaces", "ls", "-q", timeout=10).stdout.split()
            for ns in namespaces:
                tasks = self.ctr("tasks", "ls", "-q", namespace=ns, timeout=10).stdout.split()
                for task in tasks:
                    self.ctr("tasks", "kill", "-s", "SIGKILL", task, namespace=ns, check=False)
                for task in tasks:
                    for _ in range(20):
                        r = self.ctr("tasks", "rm", "-f", task, namespace=ns, check=False)
                        if r.returncode == 0 or "not found" in r.stderr:
                            break
                        time.sleep(0.1)
                listing = self.ctr("containers", "ls", "-q", namespace=ns, timeout=10).stdout
                for c in listing.split():
                    self.ctr("containers", "rm", c, namespace=ns, check=False)

    def _kill_own_shims(self) -> None:
        """SIGKILL shims still serving this instance (identified by `-address <our socket>`)."""
        me = str(self.socket)
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if not argv or not argv[0].endswith(b"containerd-shim-runc-v2"):
                continue
            args = [a.decode(errors="replace") for a in argv]
            if any(a == "-address" and b == me for a, b in itertools.pairwise(args)):
                with contextlib.suppress(OSError):
                    os.kill(int(entry.name), signal.SIGKILL)

    def _unmount_below_base(self) -> None:
        prefix = str(self.base_dir) + "/"
        try:
            lines = Path("/proc/self/mountinfo").read_text().splitlines()
        except OSError:
            return
        points = []
        for line in lines:
            fields = line.split()
            if len(fields) > 4:
                point = fields[4].encode().decode("unicode_escape")  # octal escapes (\040)
                if point.startswith(prefix):
                    points.append(point)
        libc = ctypes.CDLL(None, use_errno=True)
        for point in sorted(points, key=len, reverse=True):
            libc.umount2(point.encode(), 2)  # MNT_DETACH

    def remove(self) -> None:
        """Stop and delete the base directory."""
        self.stop()
        shutil.rmtree(self.base_dir, ignore_errors=True)

    # -------------------------------------------------------------- context managers
    def __enter__(self) -> ContainerdInstance:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> ContainerdInstance:
        await trio.to_thread.run_sync(self.start)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(self.stop)


# ------------------------------------------------------------------ command line


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m orchestrator.testing.containerd --dir DIR`: a private containerd until Ctrl-C."""
    parser = argparse.ArgumentParser(
        prog="python -m orchestrator.testing.containerd", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--dir", required=True, help="base directory (created; state is kept)")
    parser.add_argument(
        "--network",
        default="0",
        help="network slot N: bridge orchN, pods in 10.89.N.0/24 (0..99, or 'auto')",
    )
    parser.add_argument("--log-level", default="info")
    parser.add_argument(
        "--keep-pods", action="store_true", help="on exit, leave pod sandboxes for the next run"
    )
    args = parser.parse_args(argv)

    instance = ContainerdInstance(
        args.dir,
        network="auto" if args.network == "auto" else int(args.network),
        log_level=args.log_level,
    )

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        instance.start()
    except ContainerdError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(instance.socket, flush=True)
    print(
        f"# containerd pid {instance.pid}, log {instance.log_path}\n"
        f"# pod network {instance.subnet} on bridge {instance.bridge}\n"
        f"# images {', '.join(instance.images)}\n"
        f"# ctr -a {instance.socket} -n {CRI_NAMESPACE} images ls\n"
        f"# Ctrl-C to stop",
        file=sys.stderr,
        flush=True,
    )
    try:
        while instance.running():
            time.sleep(0.5)
        print(f"containerd exited:\n{instance.log_tail()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        instance.stop(teardown=not args.keep_pods)


if __name__ == "__main__":
    sys.exit(main())
