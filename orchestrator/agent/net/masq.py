"""Masquerade of pod traffic that leaves the cluster CIDR, and the node's forwarding sysctls.

Rules (pure: `masquerade_rules`), in a nat chain of ours, `ORCH-POSTROUTING`, jumped to from
POSTROUTING, as flannel's: pod -> pod (across nodes too) is RETURNed un-NATed, so a pod sees
its peer's real address; pod -> anything else except multicast is MASQUERADEd. The whole chain
is loaded with one `iptables-restore --noflush` (atomic: the chain is never half-written; the
chain declaration flushes only our chain), and the jump is added in that same input only when
`iptables -C` does not find it, so it exists exactly once.

`enable_forwarding` sets `net.ipv4.ip_forward=1` and, where the br_netfilter module is loaded,
`net.bridge.bridge-nf-call-iptables=1` (bridged pod-to-pod traffic then passes the node proxy's
rules). `netns`: run inside that named namespace (`ip netns exec`), as the tests do — they must
never change the host's own tables. A missing tool raises `MasqueradeError`, which the caller
logs and retries; it never crashes the agent.
"""

from __future__ import annotations

import ipaddress
import subprocess

import trio

__all__ = ["CHAIN", "JUMP_COMMENT", "MasqueradeError", "apply_masquerade", "enable_forwarding"]

CHAIN = "ORCH-POSTROUTING"
JUMP_COMMENT = "orchestrator pod masquerade"
_SYSCTLS = (
    ("net.ipv4.ip_forward", "/proc/sys/net/ipv4/ip_forward"),
    ("net.bridge.bridge-nf-call-iptables", "/proc/sys/net/bridge/bridge-nf-call-iptables"),
)


class MasqueradeError(RuntimeError):
    """iptables or sysctl failed (missing, or refused the input); the message says which."""


def _jump() -> list[str]:
    return ["-m", "comment", "--comment", JUMP_COMMENT, "-j", CHAIN]


def masquerade_rules(
    cluster_cidr: ipaddress.IPv4Network | ipaddress.IPv6Network, *, add_jump: bool
) -> str:
    """The `iptables-restore --noflush` input for the nat table (module doc)."""
    cidr = str(cluster_cidr)
    multicast = "224.0.0.0/4" if cluster_cidr.version == 4 else "ff00::/8"
    lines = [
        "*nat",
        f":{CHAIN} - [0:0]",
        f'-A {CHAIN} -s {cidr} -d {cidr} -m comment --comment "pod to pod: no NAT" -j RETURN',
        f"-A {CHAIN} -s {cidr} ! -d {multicast} "
        '-m comment --comment "pods to outside the cluster" -j MASQUERADE',
    ]
    if add_jump:
        lines.append(f'-I POSTROUTING 1 -m comment --comment "{JUMP_COMMENT}" -j {CHAIN}')
    lines.append("COMMIT")
    return "\n".join(lines) + "\n"


def _prefix(netns: str | None) -> list[str]:
    return ["ip", "netns", "exec", netns] if netns else []


async def _run(argv: list[str], stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    try:
        return await trio.run_process(
            argv, stdin=stdin, capture_stdout=True, capture_stderr=True, check=False
        )
    except OSError as exc:
        raise MasqueradeError(f"cannot run {argv[0]}: {exc}") from None


async def apply_masquerade(
    cluster_cidr: ipaddress.IPv4Network | ipaddress.IPv6Network, *, netns: str | None = None
) -> None:
    """Load the masquerade chain (module doc); MasqueradeError if iptables fails."""
    family = "iptables" if cluster_cidr.version == 4 else "ip6tables"
    pre = _prefix(netns)
    check = await _run([*pre, family, "-w", "-t", "nat", "-C", "POSTROUTING", *_jump()])
    rules = masquerade_rules(cluster_cidr, add_jump=check.returncode != 0)
    done = await _run([*pre, f"{family}-restore", "-w", "--noflush"], rules.encode())
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip()
        raise MasqueradeError(f"{family}-restore refused the masquerade rules: {why}")


async def enable_forwarding(*, netns: str | None = None) -> None:
    """Set the forwarding sysctls (module doc) in our namespace or `netns`."""
    for key, path in _SYSCTLS:
        if not netns:
            exists = await trio.Path(path).exists()
            if exists:
                await trio.Path(path).write_text("1\n")
            elif key == "net.ipv4.ip_forward":
                raise MasqueradeError(f"{path} is missing: cannot enable forwarding")
            continue
        done = await _run([*_prefix(netns), "sysctl", "-q", "-w", f"{key}=1"])
        if done.returncode != 0 and key == "net.ipv4.ip_forward":
            why = done.stderr.decode(errors="replace").strip()
            raise MasqueradeError(f"sysctl {key}=1 failed: {why}")
