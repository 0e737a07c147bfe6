"""The `RuntimeService` conformance suite: one behaviour, checked on every implementation.

Subclass `RuntimeConformance` in a test module as `Test<Impl>` and provide a `runtime` fixture
(a `RuntimeService`); the inherited tests then run against it. The suite uses only what both a
real containerd with the busybox test image and `SimulatedRuntime` support: `sleep`, `sh -c` with
`echo`, `touch`, `rm`, `exit`. Waiting for an asynchronous outcome (a container's exit) polls,
since a real runtime has no events; under a MockClock the polls cost nothing.

Every sandbox a test makes goes through `Pods`, which stops and removes them afterwards.
"""

from __future__ import annotations

import ipaddress
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
import trio
from trio.abc import Clock

from orchestrator.cri import (
    ContainerConfig,
    ContainerState,
    ContainerStatus,
    CriError,
    DeadlineExceeded,
    NotFound,
    PodSandboxConfig,
    Resources,
    RuntimeFailure,
    RuntimeService,
    SandboxState,
)

IMAGE = "localhost/busybox:1"
TEST_LABEL = "orchestrator.test/conformance"
CRI_LOG_LINE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z (stdout|stderr) (F|P) (.*)$"
)
T = TypeVar("T")


async def eventually(
    fn: Callable[[], Awaitable[T]], ok: Callable[[T], bool], *, within: float = 20.0
) -> T:
    """Poll `fn` until `ok(result)`; fail with the last result after `within` seconds."""
    last: T | None = None
    with trio.move_on_after(within):
        while True:
            last = await fn()
            if ok(last):
                return last
            await trio.sleep(0.05)
    pytest.fail(f"condition not reached within {within}s; last value: {last!r}")


class Pods:
    """Makes sandboxes and containers for one test and removes them afterwards."""

    def __init__(self, runtime: RuntimeService, log_dir: Path) -> None:
        self.runtime = runtime
        self.log_dir = log_dir
        self.label = uuid.uuid4().hex[:12]
        self.sandbox_ids: list[str] = []

    def sandbox_config(self, name: str = "pod", *, host_network: bool = True) -> PodSandboxConfig:
        uid = uuid.uuid4().hex
        return PodSandboxConfig(
            name=name,
            namespace="conformance",
            uid=uid,
            hostname="" if host_network else name,
            labels={TEST_LABEL: self.label, "pod": name},
            annotations={"note": "conformance"},
            log_directory=str(self.log_dir / uid),
            host_network=host_network,
        )

    async def sandbox(
        self, name: str = "pod", *, host_network: bool = True
    ) -> tuple[str, PodSandboxConfig]:
        config = self.sandbox_config(name, host_network=host_network)
        sid = await self.runtime.run_pod_sandbox(config)
        self.sandbox_ids.append(sid)
        return sid, config

    async def container(
        self,
        sandbox: tuple[str, PodSandboxConfig],
        *command: str,
        name: str = "main",
        labels: dict[str, str] | None = None,
        start: bool = True,
    ) -> str:
        sid, sconfig = sandbox
        config = ContainerConfig(
            name=name,
            image=IMAGE,
            command=command,
            labels={TEST_LABEL: self.label, **(labels or {})},
            log_path=f"{name}/0.log",
        )
        cid = await self.runtime.create_container(sid, config, sconfig)
        if start:
            await self.runtime.start_container(cid)
        return cid

    async def wait_state(self, cid: str, state: ContainerState) -> ContainerStatus:
        async def get() -> ContainerStatus:
            return await self.runtime.container_status(cid)

        return await eventually(get, lambda s: s.state == state)

    async def cleanup(self) -> None:
        for sid in self.sandbox_ids:
            await self.runtime.stop_pod_sandbox(sid)
            await self.runtime.remove_pod_sandbox(sid)


class RuntimeConformance:
    """Inherit as `Test<Impl>` and provide a `runtime` fixture (and `clock`, to run on one).

    Every test takes `clock` because pytest-trio only runs a test on a Clock passed to the test
    itself; a simulated runtime overrides it with `MockClock(autojump_threshold=0)`.
    """

    @pytest.fixture
    def clock(self) -> Clock | None:
        return None

    @pytest.fixture
    async def pods(self, runtime: RuntimeService, tmp_path: Path) -> AsyncIterator[Pods]:
        p = Pods(runtime, tmp_path)
        try:
            yield p
        finally:
            with trio.fail_after(60):
                await p.cleanup()

    # ------------------------------------------------------------------ runtime

    async def test_version_and_status(self, clock: Clock | None, runtime: RuntimeService) -> None:
        with trio.fail_after(30):
            v = await runtime.version()
            assert v.runtime_api_version == "v1"
            assert v.runtime_name
            st = await runtime.status()
            assert st.runtime_ready
            assert st.condition("NetworkReady") is not None

    async def test_update_runtime_config(
        self, clock: Clock | None, runtime: RuntimeService, pods: Pods
    ) -> None:
        """The agent hands over its node's podCIDR as the kubelet does; "" changes nothing.
        (Without a CNI conf_template containerd only records it.)"""
        with trio.fail_after(30):
            await runtime.update_runtime_config("10.42.7.0/24")
            await runtime.update_runtime_config("")
            assert (await runtime.status()).runtime_ready

    # ------------------------------------------------------------------ sandboxes

    async def test_host_network_sandbox_lifecycle(
        self, clock: Clock | None, runtime: RuntimeService, pods: Pods
    ) -> None:
        with trio.fail_after(60):
            sid, config = await pods.sandbox("hostnet")
            st = await runtime.pod_sandbox_status(sid)
            assert st.id == sid
            assert st.state == SandboxState.READY
            assert (st.name, st.namespace, st.uid, st.attempt) == (
                config.name,
                config.namespace,
                config.uid,
                0,
            )
            assert st.ip == ""
            assert st.host_network
            assert st.labels[TEST_LABEL] == pods.label
            assert st.annotations == {"note": "conformance"}
            assert st.created_at > 0

            listed = await runtime.list_pod_sandbox(labels={TEST_LABEL: pods.label})
            assert [s.id for s in listed] == [sid]
            assert listed[0].state == SandboxState.READY

            await runtime.stop_pod_sandbox(sid)
            assert (await runtime.pod_sandbox_status(sid)).state == SandboxState.NOTREADY
            ready = await runtime.list_pod_sandbox(
                labels={TEST_LABEL: pods.label}, state=SandboxState.READY
            )
            assert ready == []
            await runtime.stop_pod_sandbox(sid)  # idempotent
            await runtime.remove_pod_sandbox(sid)
            await runtime.remove_pod_sandbox(sid)  # idempotent
            await runtime.stop_pod_sandbox(sid)  # unknown id: success
            with pytest.raises(NotFound):
                await runtime.pod_sandbox_status(sid)
            assert await runtime.list_pod_sandbox(sandbox_id=sid) == []

    async def test_pod_network_sandbox_gets_an_ip(
        self, clock: Clock | None, runtime: RuntimeService, pods: Pods
    ) -> None:
        with trio.fail_after(60):
            if not (await runtime.status()).network_ready:
                pytest.skip("runtime reports NetworkReady=false")
            a, _ = await pods.sandbox("net-a", host_network=False)
            b, _ = await pods.sandbox("net-b", host_network=False)
            sa = await runtime.pod_sandbox_status(a)
            sb = await runtime.pod_sandbox_status(b)
            assert not sa.host_network
            assert isinstance(ipaddress.ip_address(sa.ip), ipaddress.IPv4Address)
            assert sa.ip != sb.ip

    async def test_same_sandbox_name_twice_is_refused(
        self, clock: Clock | None, runtime: RuntimeService, pods: Pods
    ) -> None:
        with trio.fail_after(60):
            sid, config = await pods.sandbox("dup")
            with pytest.raises(RuntimeFailure, match="reserve"):
                pods.sandbox_ids.append(await runtime.run_pod_sandbox(config))
            assert sid

    # ------------------------------------------------------------------ containers

    async def test_container_lifecycle(
        self, clock: Clock | None, runtime: RuntimeService, pods: Pods
    ) -> None:
        with trio.fail_after(60):
            sandbox = await pods.sandbox()
            cid = await pods.container(sandbox, "sleep", "3600", start=False)
            st = await runtime.container_status(cid)
            assert st.state == ContainerState.CREATED
            assert st.name == "main"
            assert st.image == IMAGE
            assert st.created_at > 0

            await runtime.start_container(cid)
            st = await pods.wait_state(cid, ContainerState.RUNNING)
            assert st.started_at >= st.created_at
            assert st.image_ref.startswith("sha256:")
            assert st.log_path.endswith("main/0.log")

            # PID 1 without a SIGTERM handler ignores it: killed when the grace period ends
            await runtime.stop_container(cid, 1)
            st = await runtime.container_status(cid)
            assert st.state == ContainerState.EXITED
            assert (st.exit_code, st.reason) == (137, "Error"), st
            assert st.finished_at >= st.started_at
            await runtime.stop_container(cid, 1)  # already exited: success

            await runtime.remove_container(cid)
            await runtime.remove_container(cid)  # idempotent
            await runtime.stop_container(cid, 0)  # unknown id: success
            with pytest.raises(NotFound):
                await runtime.container_status(cid)

    async def test_shell_ignoring_sigterm_is_killed_after_grace(
        self, clock: Clock | None, runtime: RuntimeService, pods: Pods
    ) -> None:
        with trio.fail_after(60):
            sandbox = await pods.sandbox()
            cid = await pods.container(sandbox, "sh", "-c", "echo up; sleep 3600")
            await pods.wait_state(cid, ContainerState.RUNNING)
            start = trio.current_time()
            await runtime.stop_container(cid, 1)
            st = await runtime.container_status(cid)
            assert st.state == ContainerState.EXITED
            assert st.exit_code == 137
            assert trio.current_time() - start >= 0.9

    async def test_exit_codes(
        self, clock: Clock | None, runtime: RuntimeService, pods: Pods
    ) -> None:
        with trio.fail_after(60):
            sandbox = await pods.sandbox()
            failing = await pods.container(sandbox, "sh", "-c", "exit 3", name="fails")
            ok = await pods.container(sandbox, "sh", "-c", "exit 0", name="ok")
            st = await pods.wait_state(failing, ContainerState.EXITED)
            assert st.exit_code == 3
            assert st.reason == "Error"
            st = await pods.wait_state(ok, ContainerState.EXITED)
            assert st.exit_code == 0
            assert st.reason == "Completed"

    async def test_exec_sync(
        self, clock: Clock | None, runtime: RuntimeService, pods: Pods
    ) -> None:
        with trio.fail_after(60):
            sandbox = await pods.sandbox()
            cid = await pods.container(sandbox, "sh", "-c", "touch /tmp/healthy; sleep 3600")
            await pods.wait_state(cid, ContainerState.RUNNING)

            r = await runtime.exec_sync(cid, ["sh", "-c", "echo out; echo err >&2; exit 4"], 10)
            assert (r.stdout, r.stderr, r.exit_code) == (b"out\n", b"err\n", 4)

            async def cat() -> int:
                return (await runtime.exec_sync(cid, ["cat", "/tmp/healthy"], 10)).exit_code

            assert await eventually(cat, lambda code: code == 0) == 0
            await runtime.exec_sync(cid, ["rm", "-f", "/tmp/healthy"], 10)
            assert await cat() == 1

            with pytest.raises(DeadlineExceeded):
                await runtime.exec_sync(cid, ["sleep", "10"], 1)
            with pytest.raises(RuntimeFailure):
                await runtime.exec_sync(cid, ["no-such-binary"], 10)

    async def test_logs_are_written_in_cri_format(
        self, clock: Clock | None, runtime: RuntimeService, pods: Pods
    ) -> None:
        with trio.fail_after(60):
            sandbox = await pods.sandbox()
            script = "echo hello; echo oops >&2; echo bye"
            cid = await pods.container(sandbox, "sh", "-c", script)
            st = await pods.wait_state(cid, ContainerState.EXITED)
            path = Path(st.log_path)
            assert path == Path(sandbox[1].log_directory) / "main/0.log"
            records = []
            for line in (await trio.Path(path).read_text()).splitlines():
                m = CRI_LOG_LINE.match(line)
                assert m, f"not a CRI log line: {line!r}"
                records.append((m.group(2), m.group(3), m.group(4)))
            assert ("stdout", "F", "hello") in records
            assert ("stderr", "F", "oops") in records
            assert [r for r in records if r[0] == "stdout"] == [
                ("stdout", "F", "hello"),
                ("stdout", "F", "bye"),
            ]

    async def test_list_containers_filters(
        self, clock: Clock | None, runtime: RuntimeService, pods: Pods
    ) -> None:
        with trio.fail_after(60):
            s1 = await pods.sandbox("one")
            s2 = await pods.sandbox("two")
            a = await pods.container(s1, "sleep", "3600", name="a", labels={"role": "web"})
            b = await pods.container(s1, "sh", "-c", "exit 0", name="b", labels={"role": "job"})
            c = await pods.container(s2, "sleep", "3600", name="c", labels={"role": "web"})
            await pods.wait_state(b, ContainerState.EXITED)
            await pods.wait_state(a, ContainerState.RUNNING)
            await pods.wait_state(c, ContainerState.RUNNING)
            mine = {TEST_LABEL: pods.label}

            async def ids(
                *,
                labels: dict[str, str] | None = None,
                sandbox_id: str | None = None,
                state: ContainerState | None = None,
                container_id: str | None = None,
            ) -> set[str]:
                found = await runtime.list_containers(
                    labels=labels, sandbox_id=sandbox_id, state=state, container_id=container_id
                )
                return {x.id for x in found}

            assert await ids(labels=mine) == {a, b, c}
            assert await ids(labels={**mine, "role": "web"}) == {a, c}
            assert await ids(labels=mine, sandbox_id=s1[0]) == {a, b}
            assert await ids(labels=mine, state=ContainerState.EXITED) == {b}
            assert await ids(container_id=c) == {c}
            (entry,) = await runtime.list_containers(container_id=a)
            assert (entry.sandbox_id, entry.name, entry.image) == (s1[0], "a", IMAGE)
            assert entry.labels["role"] == "web"

            await runtime.remove_pod_sandbox(s1[0])  # removes its containers too
            assert await ids(labels=mine) == {c}

    async def test_unknown_ids(self, clock: Clock | None, runtime: RuntimeService) -> None:
        with trio.fail_after(30):
            missing = "0" * 64
            with pytest.raises(NotFound):
                await runtime.container_status(missing)
            with pytest.raises(NotFound):
                await runtime.pod_sandbox_status(missing)
            await runtime.stop_container(missing, 0)
            await runtime.remove_container(missing)
            await runtime.stop_pod_sandbox(missing)
            await runtime.remove_pod_sandbox(missing)

    async def test_create_in_unknown_sandbox_or_with_missing_image(
        self, clock: Clock | None, runtime: RuntimeService, pods: Pods
    ) -> None:
        with trio.fail_after(60):
            sandbox = await pods.sandbox()
            config = ContainerConfig(name="x", image="localhost/does-not-exist:1")
            with pytest.raises(CriError, match="does-not-exist"):
                await runtime.create_container(sandbox[0], config, sandbox[1])
            with pytest.raises(CriError):
                await runtime.create_container(
                    "0" * 64, ContainerConfig(name="y", image=IMAGE), sandbox[1]
                )

    async def test_update_container_resources(
        self, clock: Clock | None, runtime: RuntimeService, pods: Pods
    ) -> None:
        with trio.fail_after(60):
            sandbox = await pods.sandbox()
            cid = await pods.container(sandbox, "sleep", "3600")
            await pods.wait_state(cid, ContainerState.RUNNING)
            await runtime.update_container_resources(
                cid, Resources(memory_limit_in_bytes=128 * 1024 * 1024, cpu_shares=512)
            )
            with pytest.raises(NotFound):
                await runtime.update_container_resources("0" * 64, Resources(cpu_shares=2))

    # ------------------------------------------------------------------ images

    async def test_images(self, clock: Clock | None, runtime: RuntimeService) -> None:
        with trio.fail_after(30):
            assert await runtime.image_status("localhost/does-not-exist:1") is None
            info = await runtime.image_status(IMAGE)
            assert info is not None
            assert info.id.startswith("sha256:")
            assert IMAGE in info.repo_tags
            by_id = await runtime.image_status(info.id)
            assert by_id is not None
            assert by_id.id == info.id
            assert info.id in {i.id for i in await runtime.list_images()}
