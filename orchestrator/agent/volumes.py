"""Pod volumes on the node: emptyDir, hostPath, configMap and secret, materialised under
`{pod_dir}/volumes/<plugin>/<volume>` (`kubernetes.io~empty-dir`, `kubernetes.io~configmap`,
`kubernetes.io~secret`), and a container's mounts over them (subPath included).

ConfigMap and Secret volumes are projected files (items, modes) written atomically, stale files
removed, and mounted read-only; any other volume type, a missing key or an unsafe path is a
`ContainerWaiting` (CreateContainerConfigError) for the worker to report. File work runs in a
thread (`trio.to_thread`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path

import trio

from orchestrator.agent.podcontext import WorkerContext
from orchestrator.agent.podspec import (
    ContainerWaiting,
    lookup_object,
    object_data,
    pod_dir,
    spec_of,
)
from orchestrator.cri.runtime import Mount
from orchestrator.kube.objects import Obj

__all__ = ["container_mounts", "mkdirs", "volume_paths"]


async def volume_paths(ctx: WorkerContext, pod: Obj) -> dict[str, tuple[Path, bool]]:
    """Materialise the pod's volumes; volume name -> (host path, read-only)."""
    base = pod_dir(ctx.data_dir, pod) / "volumes"
    out: dict[str, tuple[Path, bool]] = {}
    for v in spec_of(pod).get("volumes") or []:
        name = str(v.get("name", ""))
        if isinstance(v.get("emptyDir"), dict):
            path = base / "kubernetes.io~empty-dir" / name
            await trio.to_thread.run_sync(mkdirs, path)
            out[name] = (path, False)
        elif isinstance(v.get("hostPath"), dict):
            hp = v["hostPath"]
            path = Path(str(hp.get("path", "")))
            err = await trio.to_thread.run_sync(_host_path, path, str(hp.get("type") or ""))
            if err:
                raise ContainerWaiting("CreateContainerConfigError", f'volume "{name}": {err}')
            out[name] = (path, False)
        elif isinstance(v.get("configMap"), dict) or isinstance(v.get("secret"), dict):
            is_secret = isinstance(v.get("secret"), dict)
            src = v["secret"] if is_secret else v["configMap"]
            kind = "Secret" if is_secret else "ConfigMap"
            ref = str(src.get("secretName" if is_secret else "name", ""))
            plugin = "kubernetes.io~secret" if is_secret else "kubernetes.io~configmap"
            obj = await lookup_object(ctx.objects, pod, kind, ref, bool(src.get("optional")))
            data = object_data(kind, obj) if obj is not None else {}
            files = _projection(data, src, kind, ref)
            path = base / plugin / name
            await trio.to_thread.run_sync(_write_files, path, files)
            out[name] = (path, True)
        else:
            kinds = [k for k in v if k != "name"]
            raise ContainerWaiting(
                "CreateContainerConfigError",
                f'volume "{name}": unsupported volume type {", ".join(kinds) or "(none)"} '
                "(this agent supports emptyDir, hostPath, configMap and secret)",
            )
    return out


async def container_mounts(ctx: WorkerContext, pod: Obj, c: Obj) -> list[Mount]:
    """The CRI mounts of container `c` (its volumeMounts over `volume_paths`)."""
    if not c.get("volumeMounts"):
        return []
    volumes = await volume_paths(ctx, pod)
    mounts = []
    for vm in c.get("volumeMounts") or []:
        vname = str(vm.get("name", ""))
        if vname not in volumes:
            raise ContainerWaiting("CreateContainerConfigError", f'volume "{vname}" is not defined')
        path, readonly = volumes[vname]
        sub = str(vm.get("subPath") or "")
        if sub:
            if sub.startswith("/") or ".." in Path(sub).parts:
                raise ContainerWaiting("CreateContainerConfigError", f"invalid subPath {sub!r}")
            path = path / sub
            if not readonly:
                await trio.to_thread.run_sync(mkdirs, path)
        mounts.append(
            Mount(
                host_path=str(path.absolute()),
                container_path=str(vm.get("mountPath", "")),
                readonly=readonly or bool(vm.get("readOnly")),
            )
        )
    return mounts


def mkdirs(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)


def _host_path(path: Path, type_: str) -> str:
    """Prepare or check a hostPath volume; an error text, or ""."""
    if type_ == "DirectoryOrCreate":
        path.mkdir(parents=True, exist_ok=True)
        os.chmod(path, 0o755)
    elif type_ == "FileOrCreate":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(exist_ok=True)
    elif type_ == "Directory" and not path.is_dir():
        return f"hostPath type check failed: {path} is not a directory"
    elif type_ == "File" and not path.is_file():
        return f"hostPath type check failed: {path} is not a file"
    elif type_ == "Socket" and not path.is_socket():
        return f"hostPath type check failed: {path} is not a socket file"
    return ""


def _projection(
    data: Mapping[str, bytes], src: Obj, kind: str, ref: str
) -> dict[str, tuple[bytes, int]]:
    """Files of a configMap/secret volume: relative path -> (content, mode)."""
    raw_mode = src.get("defaultMode")
    default_mode = int(raw_mode) if raw_mode is not None else 0o644
    items = src.get("items")
    if not items:
        return {k: (v, default_mode) for k, v in data.items()}
    out = {}
    for item in items:
        key = str(item.get("key", ""))
        if key not in data:
            if src.get("optional"):
                continue
            raise ContainerWaiting(
                "CreateContainerConfigError", f"couldn't find key {key} in {kind} {ref}"
            )
        rel = str(item.get("path") or key)
        if rel.startswith("/") or ".." in Path(rel).parts:
            raise ContainerWaiting("CreateContainerConfigError", f"invalid item path {rel!r}")
        mode = item.get("mode")
        out[rel] = (data[key], int(mode) if mode is not None else default_mode)
    return out


def _write_files(path: Path, files: Mapping[str, tuple[bytes, int]]) -> None:
    """Make `path` hold exactly `files` (atomically per file; stale files removed)."""
    path.mkdir(parents=True, exist_ok=True)
    wanted = {path / rel for rel in files}
    for rel, (content, mode) in files.items():
        target = path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_bytes(content)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    for existing in path.rglob("*"):
        if existing.is_file() and existing not in wanted:
            with contextlib.suppress(OSError):
                existing.unlink()
