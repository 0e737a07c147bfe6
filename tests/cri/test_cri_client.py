"""`CriRuntime` against an in-process fake CRI server (grpcio, on a unix socket): status-code
mapping, deadlines, and recovery when the server goes away and comes back at the same path."""

from __future__ import annotations

import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
import trio

from orchestrator.cri import (
    ContainerConfig,
    DeadlineExceeded,
    NotFound,
    PodSandboxConfig,
    RuntimeFailure,
    Unavailable,
)
from orchestrator.cri.containerd import CriRuntime
from orchestrator.cri.gen import cri_api_pb2 as pb
from orchestrator.cri.gen import cri_api_pb2_grpc as pb_grpc


class FakeRuntime(pb_grpc.RuntimeServiceServicer):  # type: ignore[misc]  # untyped generated base
    def __init__(self) -> None:
        self.calls: list[str] = []

    def Version(self, request: Any, context: Any) -> Any:
        self.calls.append("Version")
        return pb.VersionResponse(
            version="0.1.0", runtime_name="fake", runtime_version="1", runtime_api_version="v1"
        )

    def StopContainer(self, request: Any, context: Any) -> Any:
        context.abort(grpc.StatusCode.NOT_FOUND, f'container "{request.container_id}": not found')

    def RemovePodSandbox(self, request: Any, context: Any) -> Any:
        context.abort(grpc.StatusCode.NOT_FOUND, "sandbox: not found")

    def ContainerStatus(self, request: Any, context: Any) -> Any:
        context.abort(
            grpc.StatusCode.NOT_FOUND,
            f'an error occurred when try to find container "{request.container_id}": not found',
        )

    def CreateContainer(self, request: Any, context: Any) -> Any:
        # what containerd answers for a bad config; also checks that sandbox_config is sent
        assert request.sandbox_config.metadata.name == "pod"
        assert request.sandbox_config.linux.security_context.namespace_options.network == pb.NODE
        context.abort(grpc.StatusCode.UNKNOWN, "failed to create containerd container: boom")

    def ExecSync(self, request: Any, context: Any) -> Any:
        time.sleep(3)  # longer than the client's gRPC deadline (timeout 1 s + call_timeout)
        return pb.ExecSyncResponse()


@pytest.fixture
def socket_path(tmp_path: Path) -> str:
    return str(tmp_path / "cri.sock")


def serve(path: str, servicer: FakeRuntime) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_RuntimeServiceServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix:{path}")
    server.start()
    return server


async def test_status_codes_are_mapped(socket_path: str) -> None:
    server = serve(socket_path, FakeRuntime())
    rt = CriRuntime(socket_path, call_timeout=1.0)
    try:
        with trio.fail_after(20):
            assert (await rt.version()).runtime_name == "fake"
            await rt.stop_container("gone", 5)  # NOT_FOUND on stop: done
            await rt.remove_pod_sandbox("gone")  # NOT_FOUND on remove: done
            with pytest.raises(NotFound, match='container "x"'):
                await rt.container_status("x")
            sandbox = PodSandboxConfig(name="pod", namespace="ns", uid="u", host_network=True)
            with pytest.raises(RuntimeFailure, match="boom") as failure:
                await rt.create_container("sid", ContainerConfig(name="c", image="i"), sandbox)
            assert failure.value.message == "failed to create containerd container: boom"
            with pytest.raises(DeadlineExceeded):
                await rt.exec_sync("c", ["sleep", "9"], timeout_seconds=0.5)
    finally:
        await rt.aclose()
        server.stop(None)


async def test_unavailable_then_recovers_after_restart(socket_path: str) -> None:
    rt = CriRuntime(socket_path, call_timeout=1.0, retries=1, retry_backoff=0.05)
    try:
        with trio.fail_after(30):
            with pytest.raises(Unavailable, match="unavailable"):
                await rt.version()  # nothing listens yet
            fake = FakeRuntime()
            server = serve(socket_path, fake)
            assert (await rt.version()).runtime_name == "fake"
            server.stop(None)  # the runtime "crashes"...
            with pytest.raises(Unavailable):
                await rt.version()
            server = serve(socket_path, fake)  # ...and comes back at the same path
            try:
                assert (await rt.version()).runtime_name == "fake"
            finally:
                server.stop(None)
            assert fake.calls.count("Version") == 2
    finally:
        await rt.aclose()
    with pytest.raises(Unavailable, match="closed"):
        await rt.version()
