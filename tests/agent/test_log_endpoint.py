"""Logs end to end over loopback: an `ApiApp` (pods from a fake `Api`) with the real
`AgentLogProxy`, and a real `LogEndpoint` (HTTPS, client certificates from the cluster CA)
serving log files this test writes."""

from __future__ import annotations

import ssl
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import trio

from orchestrator.agent.logfiles import log_dir
from orchestrator.agent.logs import AUTHORIZED_USER, EndpointTLS, LogEndpoint
from orchestrator.apiserver.app import ApiApp
from orchestrator.apiserver.flowcontrol import FlowControl
from orchestrator.apiserver.logproxy import KUBELET_CLIENT_USER, AgentLogProxy, kubelet_client_cert
from orchestrator.kube.errors import ApiError, not_found
from orchestrator.kube.schema.builtin import builtin_registry
from orchestrator.kube.schema.kind import Kind
from orchestrator.metrics import Registry
from orchestrator.security.pki import Pki, ensure_pki, issue_client_cert
from orchestrator.security.tls import serve

Obj = dict[str, Any]
UID = "uid-1"

# httpx reads a body through a chain of nested async generators; a stream abandoned half-way
# (a follow that the client or the proxy stops) leaves the inner ones for trio to finalize,
# which it does, with a ResourceWarning (ignored by default outside tests).
pytestmark = pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning")


def line(i: int, text: str, tag: str = "F") -> bytes:
    return f"2026-11-30T05:58:{i:02d}.5Z stdout {tag} {text}\n".encode()


@dataclass
class FakeApi:
    """What `ApiApp._logs` needs of `Api`: kinds, `get`, `authorize` and the overload gate."""

    pods: dict[str, Obj] = field(default_factory=dict)
    registry: Any = field(default_factory=builtin_registry)
    flowcontrol: FlowControl = field(default_factory=lambda: FlowControl(registry=Registry()))

    def kind(self, group: str, version: str, plural: str) -> Kind:
        kind = self.registry.by_resource(group, version, plural)
        assert kind is not None
        return cast(Kind, kind)

    def authorize(self, *args: Any) -> None:
        pass

    async def get(self, call: Any, kind: Kind, ns: str, name: str, **kw: Any) -> Obj:
        await trio.lowlevel.checkpoint()
        if name not in self.pods:
            raise not_found("pods", "", name)
        return self.pods[name]


REQUIRED = {"ready": False, "restartCount": 1, "image": "bb", "imageID": ""}


def make_pod(name: str, *, node: str = "n1", **status: Any) -> Obj:
    return {
        "metadata": {"name": name, "namespace": "default", "uid": UID},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "app", "image": "bb"}, {"name": "side", "image": "bb"}],
        },
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "app",
                    **REQUIRED,
                    "state": {"running": {"startedAt": "2026-11-30T05:58:00Z"}},
                    "lastState": {"terminated": {"exitCode": 1, "containerID": "x://0"}},
                    **status,
                },
                {
                    "name": "side",
                    **REQUIRED,
                    "state": {"waiting": {"reason": "ContainerCreating"}},
                },
            ],
        },
    }


@dataclass
class Env:
    api_url: str
    agent_port: int
    data_dir: Path
    pki: Pki
    api: FakeApi
    agent_pods: dict[str, Obj]
    nodes: dict[str, Obj]
    endpoint: LogEndpoint

    def log_file(self, attempt: int, container: str = "app", pod: str = "p") -> Path:
        path = log_dir(self.data_dir, "default", pod, UID) / container / f"{attempt}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def append(self, attempt: int, data: bytes) -> None:
        with self.log_file(attempt).open("ab") as f:
            f.write(data)


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    pki = ensure_pki(tmp_path, [])
    api = FakeApi()
    agent_pods: dict[str, Obj] = {}
    nodes: dict[str, Obj] = {}

    async def get_node(name: str) -> Obj | None:
        await trio.lowlevel.checkpoint()
        return nodes.get(name)

    endpoint = LogEndpoint(
        tmp_path,
        lambda ns, name: agent_pods.get(name),
        # A certificate of its own (the server test below reuses the API server's).
        tls=EndpointTLS.issue(pki, "n1", ["127.0.0.1"], tmp_path / "agent-pki"),
        host="127.0.0.1",
        port=0,
        poll_interval=0.02,
    )
    proxy = await AgentLogProxy.for_pki(pki, get_node)
    app = ApiApp(cast(Any, api), None, logs=proxy)
    async with trio.open_nursery() as nursery:
        with trio.fail_after(10):
            agent_port = await nursery.start(endpoint.run)
            api_port = await nursery.start(partial(serve, app, host="127.0.0.1", port=0))
        nodes["n1"] = {
            "metadata": {"name": "n1"},
            "status": {
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": agent_port}},
            },
        }
        pod = make_pod("p")
        api.pods["p"] = agent_pods["p"] = pod
        yield Env(
            f"http://127.0.0.1:{api_port}",
            agent_port,
            tmp_path,
            pki,
            api,
            agent_pods,
            nodes,
            endpoint,
        )
        nursery.cancel_scope.cancel()


async def get(env: Env, path: str) -> httpx.Response:
    with trio.fail_after(10):
        async with httpx.AsyncClient(base_url=env.api_url) as client:
            return await client.get(path)


LOG = "/api/v1/namespaces/default/pods/p/log"


async def test_tail_lines_through_the_api(env: Env) -> None:
    env.append(0, line(1, "old attempt"))
    env.append(1, line(1, "one") + line(2, "two") + line(3, "thr", "P") + line(3, "ee"))
    r = await get(env, f"{LOG}?container=app&tailLines=2")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "text/plain"
    assert r.text == "two\nthree\n"
    r = await get(env, f"{LOG}?container=app&timestamps=true&limitBytes=34")
    assert r.text == "2026-11-30T05:58:01.500000000Z one"
    r = await get(env, f"{LOG}?container=app&sinceTime=2026-11-30T05:58:02Z")
    assert r.text == "two\nthree\n"


async def test_previous_serves_the_attempt_before(env: Env) -> None:
    env.append(0, line(1, "first run"))
    env.append(1, line(2, "second run"))
    r = await get(env, f"{LOG}?container=app&previous=true")
    assert (r.status_code, r.text) == (200, "first run\n")
    env.api.pods["p"] = env.agent_pods["p"] = make_pod("p", lastState={})
    r = await get(env, f"{LOG}?container=app&previous=true")
    assert r.status_code == 400
    assert r.json()["message"] == 'previous terminated container "app" in pod "p" not found'


async def test_errors_are_statuses(env: Env) -> None:
    r = await get(env, f"{LOG}?container=nope")
    assert r.status_code == 400
    assert r.json()["kind"] == "Status"
    assert r.json()["message"] == "container nope is not valid for pod p"
    r = await get(env, f"{LOG}?container=side")
    assert r.status_code == 400
    assert r.json() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'container "side" in pod "p" is waiting to start: ContainerCreating',
        "reason": "BadRequest",
        "code": 400,
    }
    r = await get(env, f"{LOG}?container=app&tailLines=-1")
    assert r.status_code == 400
    assert "tailLines" in r.json()["message"]
    # The agent does not know the pod (yet).
    del env.agent_pods["p"]
    r = await get(env, f"{LOG}?container=app")
    assert (r.status_code, r.json()["message"]) == (404, 'pod "default/p" does not exist')


async def test_unreachable_agent_is_503(env: Env) -> None:
    sock = trio.socket.socket()
    await sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    env.nodes["n1"]["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] = port
    r = await get(env, f"{LOG}?container=app&tailLines=1")
    assert r.status_code == 503
    assert r.json()["message"] == (
        f'Get "https://127.0.0.1:{port}/containerLogs/default/p/app?tailLines=1": '
        f"dial tcp 127.0.0.1:{port}: connect: connection refused"
    )
    del env.nodes["n1"]
    r = await get(env, f"{LOG}?container=app")
    assert (r.status_code, r.json()["message"]) == (404, 'nodes "n1" not found')


async def test_follow_streams_new_lines_until_the_container_stops(env: Env) -> None:
    env.append(1, line(1, "before"))
    received: list[str] = []
    with trio.fail_after(10):
        async with (
            httpx.AsyncClient(base_url=env.api_url, timeout=10) as client,
            client.stream("GET", f"{LOG}?container=app&follow=true") as r,
        ):
            assert r.status_code == 200
            lines = cast(AsyncGenerator[str, None], r.aiter_lines())
            received.append(await lines.__anext__())
            env.append(1, line(2, "after"))
            received.append(await lines.__anext__())
            env.append(1, line(3, "split ", "P"))
            env.append(1, line(3, "line"))
            received.append(await lines.__anext__())
            # The container exits: the stream sends what is left and ends.
            env.append(1, line(4, "last words"))
            env.agent_pods["p"] = make_pod(
                "p", state={"terminated": {"exitCode": 0, "containerID": "x://1"}}
            )
            received.extend([text async for text in lines])
    assert received == ["before", "after", "split line", "last words"]


async def test_follow_stops_when_a_new_attempt_starts(env: Env) -> None:
    env.append(1, line(1, "attempt one"))
    with trio.fail_after(10):
        async with (
            httpx.AsyncClient(base_url=env.api_url, timeout=10) as client,
            client.stream("GET", f"{LOG}?container=app&follow=1") as r,
        ):
            lines = cast(AsyncGenerator[str, None], r.aiter_lines())
            assert await lines.__anext__() == "attempt one"
            env.append(2, line(2, "attempt two"))
            assert [text async for text in lines] == []


async def test_client_disconnect_ends_the_follow(env: Env) -> None:
    env.append(1, line(1, "x"))
    for _ in range(3):  # each follower goes away; the agent must not pile them up
        with trio.fail_after(10):
            async with (
                httpx.AsyncClient(base_url=env.api_url, timeout=10) as client,
                client.stream("GET", f"{LOG}?container=app&follow=true") as r,
            ):
                lines = cast(AsyncGenerator[str, None], r.aiter_lines())
                async with aclosing(lines):
                    assert await lines.__anext__() == "x"
        with trio.fail_after(10):
            while env.endpoint.statistics()["open_streams"]:  # noqa: ASYNC110  (no event to wait on)
                await trio.sleep(0.01)
    r = await get(env, f"{LOG}?container=app")
    assert r.text == "x\n"


def _client_ctx(env: Env, cert: tuple[bytes, bytes] | None, tmp: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=env.pki.ca_pem.decode())
    if cert is not None:
        (tmp / "c.crt").write_bytes(cert[0])
        (tmp / "c.key").write_bytes(cert[1])
        ctx.load_cert_chain(tmp / "c.crt", tmp / "c.key")
    return ctx


async def test_only_the_api_server_may_read(env: Env, tmp_path: Path) -> None:
    """The agent listener's matrix: only the API server's kubelet-client certificate is served;
    no certificate, another CA's, the agent's own node certificates, another node's and an
    admin's (system:masters) are refused — at the handshake or with 403, /healthz included."""
    url = f"https://127.0.0.1:{env.agent_port}/containerLogs/default/p/app"
    health = f"https://127.0.0.1:{env.agent_port}/healthz"
    env.append(1, line(1, "secret"))

    async def fetch(ctx: ssl.SSLContext, target: str = url) -> httpx.Response:
        with trio.fail_after(10):
            async with httpx.AsyncClient(verify=ctx) as client:
                return await client.get(target)

    # No client certificate: the TLS handshake itself is refused.
    with pytest.raises(httpx.HTTPError):
        await fetch(_client_ctx(env, None, tmp_path))
    # Another CA's certificate, even with the API server's name: refused at the handshake.
    other = ensure_pki(tmp_path / "other-cluster", [])
    with pytest.raises(httpx.HTTPError):
        await fetch(_client_ctx(env, issue_client_cert(other, KUBELET_CLIENT_USER), tmp_path))
    # The agent's own certificates: its serving certificate (server auth only) is no client
    # certificate at all; its node client identity, another node's and an admin's are 403.
    serving = (env.endpoint.tls.cert_path.read_bytes(), env.endpoint.tls.key_path.read_bytes())
    with pytest.raises(httpx.HTTPError):
        await fetch(_client_ctx(env, serving, tmp_path))
    for user, groups in (
        ("system:node:n1", ["system:nodes"]),
        ("system:node:n2", ["system:nodes"]),
        ("admin", ["system:masters"]),
        ("system:apiserver", ["system:masters"]),
        ("alice", ["dev"]),
    ):
        ctx = _client_ctx(env, issue_client_cert(env.pki, user, groups), tmp_path)
        for target in (url, health):
            r = await fetch(ctx, target)
            assert r.status_code == 403, (user, target, r.text)
            assert r.json()["reason"] == "Forbidden"
    # The API server's own identity.
    cert, key = kubelet_client_cert(env.pki)
    ctx = _client_ctx(env, (cert.read_bytes(), key.read_bytes()), tmp_path)
    r = await fetch(ctx)
    assert (r.status_code, r.text) == (200, "secret\n")
    assert (await fetch(ctx, health)).text == "ok"


async def _impostor(env: Env, nursery: trio.Nursery, tls: EndpointTLS) -> None:
    """Another process on the node's advertised port: an endpoint with `tls`."""
    endpoint = LogEndpoint(
        env.data_dir, lambda ns, name: env.agent_pods.get(name), tls=tls, host="127.0.0.1", port=0
    )
    port = await nursery.start(endpoint.run)
    env.nodes["n1"]["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] = port


async def test_the_proxy_names_an_impostor(env: Env, tmp_path: Path) -> None:
    """Whatever holds the node's port must prove it is that node's agent; the 503 says why
    not — a certificate verification failure is not reported as a dial error."""
    env.append(1, line(1, "secret"))
    async with trio.open_nursery() as nursery:
        # Another cluster's agent (or any TLS server): its CA is unknown here.
        other = ensure_pki(tmp_path / "other-cluster", [])
        await _impostor(env, nursery, EndpointTLS.issue(other, "n1", ["127.0.0.1"], tmp_path / "o"))
        port = env.nodes["n1"]["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
        r = await get(env, f"{LOG}?container=app")
        assert r.status_code == 503
        assert r.json()["message"] == (
            f'Get "https://127.0.0.1:{port}/containerLogs/default/p/app": the process on '
            f'127.0.0.1:{port} is not the agent of node "n1": its certificate is signed by an '
            "unknown authority (x509: certificate signed by unknown authority)"
        )
        # Another node's agent of this cluster (same CA, its SANs cover 127.0.0.1 too).
        await _impostor(env, nursery, EndpointTLS.issue(env.pki, "n2", [], tmp_path / "n2"))
        port = env.nodes["n1"]["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
        r = await get(env, f"{LOG}?container=app")
        assert r.status_code == 503
        assert r.json()["message"] == (
            f'Get "https://127.0.0.1:{port}/containerLogs/default/p/app": the process on '
            f'127.0.0.1:{port} is not the agent of node "n1": its certificate is for '
            '"system:node:n2", not "system:node:n1"'
        )
        nursery.cancel_scope.cancel()
    # A Node whose agent serves no log endpoint advertises port 0: said plainly.
    env.nodes["n1"]["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] = 0
    r = await get(env, f"{LOG}?container=app")
    assert r.status_code == 503
    assert "serves no log endpoint" in r.json()["message"]


def test_the_endpoint_admits_the_identity_the_proxy_presents() -> None:
    assert AUTHORIZED_USER == KUBELET_CLIENT_USER


def test_api_error_shape() -> None:
    # The agent's error bodies are the API's Status objects (relayed verbatim by the proxy).
    assert ApiError(400, "BadRequest", "x").status()["status"] == "Failure"


async def test_api_server_wiring(tmp_path: Path) -> None:
    """The real server: its `ApiServer` proxies `pods/log` to an agent's endpoint on the node's
    InternalIP and kubelet port, with the kubelet-client identity it issued at start."""
    from api.apiharness import api_server  # tests/ is on sys.path

    pods: dict[str, Obj] = {}
    async with api_server(tmp_path / "server", controllers=False) as h, trio.open_nursery() as n:
        with trio.fail_after(30):
            pki = ensure_pki(h.data_dir, [])  # the server's own (already created) PKI
            endpoint = LogEndpoint(
                tmp_path / "agent",
                lambda ns, name: pods.get(name),
                tls=EndpointTLS.issue(pki, "n1", ["127.0.0.1"], tmp_path / "agent-pki"),
                host="127.0.0.1",
                port=0,
            )
            port = await n.start(endpoint.run)
            node = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": "n1"},
                "status": {
                    "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                    "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
                },
            }
            r = await h.client.post("/api/v1/nodes", json=node)
            assert r.status_code == 201, r.text
            r = await h.client.put("/api/v1/nodes/n1/status", json={**node, **r.json()})
            assert r.status_code == 200, r.text
            pod = make_pod("p")
            created = await h.client.post(
                "/api/v1/namespaces/default/pods",
                json={"apiVersion": "v1", "kind": "Pod", **{**pod, "metadata": {"name": "p"}}},
            )
            assert created.status_code == 201, created.text
            r = await h.client.get(f"{LOG}?container=app")
            assert r.status_code == 400  # Pending, no container statuses yet
            assert "is waiting to start: ContainerCreating" in r.json()["message"]
            live = created.json()
            live["status"] = pod["status"]
            r = await h.client.put("/api/v1/namespaces/default/pods/p/status", json=live)
            assert r.status_code == 200, r.text
            pods["p"] = r.json()
            uid = r.json()["metadata"]["uid"]
            path = log_dir(tmp_path / "agent", "default", "p", uid) / "app" / "1.log"
            path.parent.mkdir(parents=True)
            path.write_bytes(line(1, "a") + line(2, "b") + line(3, "c"))
            r = await h.client.get(f"{LOG}?container=app&tailLines=2")
            assert (r.status_code, r.text) == (200, "b\nc\n")
        n.cancel_scope.cancel()
