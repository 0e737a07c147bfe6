"""The CNI configuration of the node's pod network, written by the agent for containerd.

`conflist(pod_cidr, ...)` (pure) is the network config list containerd's CRI plugin loads
from `--cni-conf-dir` when it has no `conf_template`: the `bridge` plugin (bridge `cni0`, the
pods' default gateway = the podCIDR's first address, `ipMasq` false because masquerade is the
agent's own chain, `hairpinMode` true so a pod reaches itself through a Service) with
`host-local` IPAM over the podCIDR and a default route, then `portmap` (hostPort). No
`loopback` entry: containerd's CRI plugin sets up the pod's `lo` itself.

`write_conflist(dir, text)` writes `10-orchestrator.conflist` atomically (temporary file in the
same directory, fsync, rename), and only when the content changes (containerd re-reads the
directory on every change). Blocking: call it through `trio.to_thread.run_sync`.
"""

from __future__ import annotations

import ipaddress
import json
import os
from pathlib import Path

from orchestrator.kube.objects import Obj

__all__ = ["CONFLIST_NAME", "NETWORK_NAME", "conflist", "render", "write_conflist"]

CONFLIST_NAME = "10-orchestrator.conflist"
NETWORK_NAME = "cbr0"  # flannel's network name: tools that look for it find it
CNI_VERSION = "1.0.0"
DEFAULT_BRIDGE = "cni0"


def conflist(
    pod_cidr: str,
    *,
    bridge: str = DEFAULT_BRIDGE,
    ipam_data_dir: str = "",
    mtu: int = 0,
) -> Obj:
    """The conflist for a node whose podCIDR is `pod_cidr` (ValueError if it is not a network
    with room for a gateway and a pod)."""
    network = ipaddress.ip_network(pod_cidr, strict=True)
    if network.num_addresses < 4:
        raise ValueError(f"podCIDR {pod_cidr} is too small for a gateway and pods")
    gateway = network.network_address + 1
    default = "0.0.0.0/0" if network.version == 4 else "::/0"
    ipam: Obj = {
        "type": "host-local",
        "ranges": [[{"subnet": str(network), "gateway": str(gateway)}]],
        "routes": [{"dst": default}],
    }
    if ipam_data_dir:
        ipam["dataDir"] = ipam_data_dir
    plugin: Obj = {
        "type": "bridge",
        "bridge": bridge,
        "isGateway": True,
        "isDefaultGateway": False,
        "ipMasq": False,
        "hairpinMode": True,
        "ipam": ipam,
    }
    if mtu:
        plugin["mtu"] = mtu
    return {
        "cniVersion": CNI_VERSION,
        "name": NETWORK_NAME,
        "plugins": [plugin, {"type": "portmap", "capabilities": {"portMappings": True}}],
    }


def render(config: Obj) -> str:
    return json.dumps(config, indent=2, sort_keys=True) + "\n"


def write_conflist(conf_dir: Path, text: str, name: str = CONFLIST_NAME) -> bool:
    """Write `text` as `conf_dir/name` atomically if it differs; whether it was written."""
    path = conf_dir / name
    try:
        if path.read_text() == text:
            return False
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    conf_dir.mkdir(parents=True, exist_ok=True)
    tmp = conf_dir / f".{name}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return True
