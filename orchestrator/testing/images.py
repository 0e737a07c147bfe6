"""Tiny OCI images built offline from a static busybox, for tests, benchmarks and development.

No registry and no network: the node agent's tests import these tarballs into a private containerd
(`orchestrator.testing.containerd`) with `ctr -n k8s.io images import`.

* `localhost/busybox:1` (`APP_IMAGE`): the app image; `Cmd ["sh"]`, busybox applets as symlinks in
  `/bin` (`sh`, `sleep`, `echo`, `httpd`, `wget`, `nc`, ...), `PATH=/bin`.
* `localhost/pause:1` (`PAUSE_IMAGE`): the sandbox ("pause") image, the same layer with
  `Cmd ["sleep", "2147483647"]`.

Layout (an OCI image layout in a tar, as `ctr images import` reads it): `oci-layout`, `index.json`
with one manifest descriptor annotated `io.containerd.image.name` (the full reference, which is the
name containerd gives the image) and `org.opencontainers.image.ref.name` (the tag), and the blobs
under `blobs/sha256/<hex>`: one uncompressed layer (so its digest is also its diff_id), the image
config and the manifest.

Every tar entry has mtime 0, uid/gid 0 and no user/group names, and JSON is serialised with sorted
keys, so the same busybox binary always yields the same digests.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import subprocess
import tarfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "APP_APPLETS",
    "APP_CMD",
    "APP_IMAGE",
    "BUSYBOX",
    "PAUSE_CMD",
    "PAUSE_IMAGE",
    "build_default_images",
    "build_image_tar",
    "build_layer",
    "oci_arch",
]

BUSYBOX = Path("/bin/busybox")
"""Debian `busybox-static` installs a statically linked busybox here."""

APP_IMAGE = "localhost/busybox:1"
PAUSE_IMAGE = "localhost/pause:1"
APP_CMD: tuple[str, ...] = ("sh",)
PAUSE_CMD: tuple[str, ...] = ("sleep", "2147483647")

APP_APPLETS: tuple[str, ...] = (
    "sh",
    "sleep",
    "echo",
    "ls",
    "cat",
    "httpd",
    "wget",
    "true",
    "false",
    "env",
    "printf",
    "head",
    "tail",
    "mkdir",
    "touch",
    "rm",
    "kill",
    "grep",
    "nc",
    "id",
    "ps",
    "hostname",
    "date",
    "test",
    "wc",
    "seq",
    "yes",
    "dd",
    "timeout",
    "ip",
)
"""Symlinks to `busybox` in `/bin` (only those the binary has are created)."""

_DIRS: tuple[tuple[str, int], ...] = (
    ("bin", 0o755),
    ("dev", 0o755),
    ("etc", 0o755),
    ("proc", 0o555),
    ("sys", 0o555),
    ("tmp", 0o1777),
)

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"

_ARCHES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def oci_arch(machine: str | None = None) -> str:
    """The OCI/GOARCH name of a `platform.machine()` value (default: this machine)."""
    m = machine or platform.machine()
    return _ARCHES.get(m.lower(), m.lower())


def _available_applets(busybox: Path) -> set[str] | None:
    """Applets compiled into `busybox` (`busybox --list`), or None when it cannot be asked."""
    try:
        out = subprocess.run(
            [str(busybox), "--list"], capture_output=True, text=True, timeout=10, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {line.strip() for line in out.splitlines() if line.strip()}


def _info(name: str, kind: bytes, mode: int, size: int = 0, linkname: str = "") -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.mode = mode
    ti.size = size
    ti.linkname = linkname
    ti.mtime = 0
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    return ti


def build_layer(busybox: Path = BUSYBOX, applets: Iterable[str] = APP_APPLETS) -> bytes:
    """The uncompressed root filesystem layer: dirs, `bin/busybox` (0755) and applet symlinks."""
    data = busybox.read_bytes()
    have = _available_applets(busybox)
    links = sorted({a for a in applets if have is None or a in have} - {"busybox"})
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, mode in _DIRS:
            tar.addfile(_info(name, tarfile.DIRTYPE, mode))
        tar.addfile(_info("bin/busybox", tarfile.REGTYPE, 0o755, len(data)), io.BytesIO(data))
        for applet in links:
            tar.addfile(_info(f"bin/{applet}", tarfile.SYMTYPE, 0o777, linkname="busybox"))
    return buf.getvalue()


def _json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _digest(blob: bytes) -> str:
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def _descriptor(media_type: str, blob: bytes) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": _digest(blob), "size": len(blob)}


def build_image_tar(
    path: str | os.PathLike[str],
    ref: str,
    cmd: Sequence[str],
    *,
    busybox: Path = BUSYBOX,
    applets: Iterable[str] = APP_APPLETS,
    env: Sequence[str] = ("PATH=/bin",),
    layer: bytes | None = None,
) -> Path:
    """Write an OCI layout tarball for image `ref` (e.g. `localhost/busybox:1`) to `path`.

    `cmd` becomes the config's `Cmd`. `layer` reuses a layer from `build_layer` (building two
    images from one layer avoids reading busybox twice; the blob is then shared in containerd).
    The file is written atomically (temporary name, then rename). Returns `path`.
    """
    if ":" not in ref.rsplit("/", 1)[-1]:
        raise ValueError(f"image reference {ref!r} needs an explicit tag")
    tag = ref.rsplit(":", 1)[1]
    arch = oci_arch()
    layer_blob = layer if layer is not None else build_layer(busybox, applets)
    config = {
        "architecture": arch,
        "os": "linux",
        "config": {"Cmd": list(cmd), "Env": list(env)},
        "rootfs": {"type": "layers", "diff_ids": [_digest(layer_blob)]},
    }
    config_blob = _json(config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": _descriptor(MEDIA_CONFIG, config_blob),
        "layers": [_descriptor(MEDIA_LAYER, layer_blob)],
    }
    manifest_blob = _json(manifest)
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                **_descriptor(MEDIA_MANIFEST, manifest_blob),
                "annotations": {
                    "io.containerd.image.name": ref,
                    "org.opencontainers.image.ref.name": tag,
                },
                "platform": {"architecture": arch, "os": "linux"},
            }
        ],
    }
    files: list[tuple[str, bytes]] = [
        ("oci-layout", _json({"imageLayoutVersion": "1.0.0"})),
        ("index.json", _json(index)),
    ]
    for blob in (layer_blob, config_blob, manifest_blob):
        files.append((f"blobs/sha256/{hashlib.sha256(blob).hexdigest()}", blob))

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with tarfile.open(tmp, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for dirname in ("blobs", "blobs/sha256"):
                tar.addfile(_info(dirname, tarfile.DIRTYPE, 0o755))
            for name, blob in files:
                tar.addfile(_info(name, tarfile.REGTYPE, 0o644, len(blob)), io.BytesIO(blob))
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def build_default_images(
    directory: str | os.PathLike[str], busybox: Path = BUSYBOX
) -> dict[str, Path]:
    """Build `localhost/busybox:1` and `localhost/pause:1` into `directory`; ref -> tarball."""
    d = Path(directory)
    layer = build_layer(busybox)
    return {
        APP_IMAGE: build_image_tar(d / "busybox.tar", APP_IMAGE, APP_CMD, layer=layer),
        PAUSE_IMAGE: build_image_tar(d / "pause.tar", PAUSE_IMAGE, PAUSE_CMD, layer=layer),
    }
