"""The private containerd fixture and the offline test images.

The image tests need only busybox-static; the daemon tests need root and containerd (skipped
without them unless ORCH_REQUIRE_CONTAINERD=1).
"""

from __future__ import annotations

import hashlib
import io
import json
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest
from cri import containerd_env

from orchestrator.testing.containerd import ContainerdError, ContainerdInstance
from orchestrator.testing.crisweep import fields, varint
from orchestrator.testing.images import (
    APP_IMAGE,
    BUSYBOX,
    PAUSE_IMAGE,
    build_default_images,
    build_image_tar,
)

containerd = containerd_env.containerd
containerd_instance = containerd_env.containerd_instance

needs_busybox = pytest.mark.skipif(not BUSYBOX.is_file(), reason=f"{BUSYBOX} missing")


def _members(tar_path: Path) -> dict[str, bytes]:
    with tarfile.open(tar_path) as tar:
        return {
            m.name: (tar.extractfile(m) or io.BytesIO()).read()
            for m in tar.getmembers()
            if m.isfile()
        }


@needs_busybox
def test_image_tarballs_are_reproducible_oci_layouts(tmp_path: Path) -> None:
    first = build_default_images(tmp_path / "a")
    second = build_default_images(tmp_path / "b")
    for ref in (APP_IMAGE, PAUSE_IMAGE):
        assert first[ref].read_bytes() == second[ref].read_bytes()

    files = _members(first[APP_IMAGE])
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    for name, blob in files.items():
        if name.startswith("blobs/sha256/"):
            assert name.rsplit("/", 1)[1] == hashlib.sha256(blob).hexdigest()
    (desc,) = json.loads(files["index.json"])["manifests"]
    assert desc["annotations"]["io.containerd.image.name"] == APP_IMAGE
    assert desc["annotations"]["org.opencontainers.image.ref.name"] == "1"
    manifest = json.loads(files["blobs/sha256/" + desc["digest"].split(":")[1]])
    config = json.loads(files["blobs/sha256/" + manifest["config"]["digest"].split(":")[1]])
    (layer_desc,) = manifest["layers"]
    assert layer_desc["mediaType"] == "application/vnd.oci.image.layer.v1.tar"
    assert config["rootfs"]["diff_ids"] == [layer_desc["digest"]]  # uncompressed layer
    assert config["config"] == {"Cmd": ["sh"], "Env": ["PATH=/bin"]}

    layer = files["blobs/sha256/" + layer_desc["digest"].split(":")[1]]
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        entries = {m.name: m for m in tar.getmembers()}
    assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 for m in entries.values())
    assert stat.S_IMODE(entries["bin/busybox"].mode) == 0o755
    for applet in ("sh", "sleep", "echo", "httpd", "wget", "true", "false"):
        assert entries[f"bin/{applet}"].linkname == "busybox"
    assert {"tmp", "proc", "sys", "dev", "etc"} <= set(entries)


@needs_busybox
def test_pause_image_cmd_and_tag_required(tmp_path: Path) -> None:
    files = _members(build_default_images(tmp_path)[PAUSE_IMAGE])
    (desc,) = json.loads(files["index.json"])["manifests"]
    assert desc["annotations"]["io.containerd.image.name"] == PAUSE_IMAGE
    manifest = json.loads(files["blobs/sha256/" + desc["digest"].split(":")[1]])
    config = json.loads(files["blobs/sha256/" + manifest["config"]["digest"].split(":")[1]])
    assert config["config"]["Cmd"] == ["sleep", "2147483647"]
    with pytest.raises(ValueError, match="tag"):
        build_image_tar(tmp_path / "x.tar", "localhost/untagged", ["sh"])


def test_protobuf_helpers_round_trip() -> None:
    sandbox_id = "a" * 200
    item = b"\x0a" + varint(len(sandbox_id)) + sandbox_id.encode() + b"\x10" + varint(300)
    response = b"\x0a" + varint(len(item)) + item
    ((number, value),) = fields(response)
    assert number == 1
    assert isinstance(value, bytes)
    assert dict(fields(value)) == {1: sandbox_id.encode(), 2: 300}


@pytest.mark.slow
def test_containerd_serves_cri_with_images(
    containerd: str, containerd_instance: ContainerdInstance
) -> None:
    assert stat.S_ISSOCK(Path(containerd).stat().st_mode)
    listing = subprocess.run(
        ["ctr", "-a", containerd, "-n", "k8s.io", "images", "ls", "-q"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout.split()
    assert APP_IMAGE in listing
    assert PAUSE_IMAGE in listing

    plugins = containerd_instance.ctr("plugins", "ls").stdout
    cri = [
        line.split()
        for line in plugins.splitlines()
        if line.split()[:2] == ["io.containerd.grpc.v1", "cri"]
    ]
    assert cri
    assert cri[0][-1] == "ok"
    log = containerd_instance.log_path.read_text()
    assert "failed to load plugin io.containerd.grpc.v1.cri" not in log
    config = containerd_instance.config_path.read_text()
    assert "restrict_oom_score_adj = true" in config
    assert 'sandbox_image = "localhost/pause:1"' in config


@pytest.mark.slow
def test_network_slots_are_exclusive(
    containerd_instance: ContainerdInstance, tmp_path: Path
) -> None:
    slot = containerd_instance.slot
    assert slot is not None
    assert slot >= 1
    conflist = json.loads((containerd_instance.cni_conf_dir / "10-orch.conflist").read_text())
    bridge = conflist["plugins"][0]
    assert bridge["bridge"] == f"orch{slot}"
    assert bridge["ipam"]["ranges"] == [
        [{"subnet": f"10.89.{slot}.0/24", "gateway": f"10.89.{slot}.1"}]
    ]
    other = ContainerdInstance(tmp_path / "other", network=slot)
    with pytest.raises(ContainerdError, match="in use"):
        other.start()
    assert not other.running()
