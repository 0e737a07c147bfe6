"""Remove every pod sandbox of a containerd through CRI, with no generated stubs.

`ContainerdInstance.stop()` (`orchestrator.testing.containerd`) calls `remove_all_sandboxes`
first, so that CNI releases the pods' veths and IP leases before the daemon goes away. Teardown
needs only ListPodSandbox, StopPodSandbox and RemovePodSandbox, whose messages are tiny: they are
encoded and decoded by hand (`varint`, `fields`) over a raw gRPC channel, which keeps the private
containerd independent of the generated CRI modules. Best-effort: a sandbox that will not stop
or go is left for the caller's later steps (kill tasks, kill shims, unmount).
"""

from __future__ import annotations

import contextlib
import importlib
from pathlib import Path
from typing import Any

__all__ = ["fields", "read_varint", "remove_all_sandboxes", "varint"]


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def read_varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) pairs of a protobuf message; length-delimited values as bytes."""
    out: list[tuple[int, int | bytes]] = []
    i = 0
    while i < len(buf):
        key, i = read_varint(buf, i)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, i = read_varint(buf, i)
        elif wire == 1:
            value, i = buf[i : i + 8], i + 8
        elif wire == 2:
            n, i = read_varint(buf, i)
            value, i = buf[i : i + n], i + n
        elif wire == 5:
            value, i = buf[i : i + 4], i + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        out.append((number, value))
    return out


def remove_all_sandboxes(socket: Path, timeout: float = 20.0) -> list[str]:
    """Stop and remove every CRI pod sandbox; returns the ids removed (best-effort)."""
    grpc: Any = importlib.import_module("grpc")  # deferred: only teardown needs it

    removed: list[str] = []
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        grpc.channel_ready_future(channel).result(timeout=5)

        def call(method: str, request: bytes) -> bytes:
            rpc = channel.unary_unary(f"/runtime.v1.RuntimeService/{method}")
            response: bytes = rpc(request, timeout=timeout)
            return response

        listing = call("ListPodSandbox", b"")
        ids: list[str] = []
        for number, item in fields(listing):  # ListPodSandboxResponse.items = 1
            if number == 1 and isinstance(item, bytes):
                raw_id = dict(fields(item)).get(1)  # PodSandbox.id = 1
                if isinstance(raw_id, bytes):
                    ids.append(raw_id.decode())
        for sandbox_id in filter(None, ids):
            request = b"\x0a" + varint(len(sandbox_id.encode())) + sandbox_id.encode()
            with contextlib.suppress(grpc.RpcError):
                call("StopPodSandbox", request)
                call("RemovePodSandbox", request)
                removed.append(sandbox_id)
    return removed
