"""ControllerManager: controllers run only while this server leads, are rebuilt per term and
write fenced to it; the server wires it in (and `--no-controllers` leaves it out); /metrics."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import trio
import trio.testing
from api.apiharness import Harness, api_server

from orchestrator.assembly import default_controllers
from orchestrator.cli.main import _build_parser
from orchestrator.controllers.runtime.client import CONFIGMAPS
from orchestrator.controllers.runtime.controller import Controller, Result
from orchestrator.controllers.runtime.manager import ControllerContext, ControllerManager
from orchestrator.metrics import Registry

Obj = dict[str, Any]


async def until(predicate: Callable[[], bool]) -> None:
    """Poll a condition (callers hold the deadline with `trio.fail_after`)."""
    while not predicate():  # noqa: ASYNC110  (the condition is data, not an event to wait on)
        await trio.sleep(0.01)


class FakeLeadership:
    def __init__(self) -> None:
        self.state = (False, 0)
        self._changed = trio.Event()

    def set(self, leads: bool, term: int) -> None:
        self.state = (leads, term)
        self._changed.set()
        self._changed = trio.Event()

    def leadership(self) -> tuple[bool, int]:
        return self.state

    async def wait_role_change(self) -> None:
        await self._changed.wait()


class Stamp:
    """Marks each ConfigMap it reconciles with the term it runs in (a fenced write)."""

    def __init__(self, ctx: ControllerContext) -> None:
        self.ctx = ctx
        self.cache = ctx.informers.informer(CONFIGMAPS, "default")

    async def reconcile(self, key: str) -> Result:
        obj = self.cache.get(key)
        if obj is not None and obj.get("data", {}).get("term") != str(self.ctx.term):
            ns, _, name = key.partition("/")
            stamp = {"data": {"term": str(self.ctx.term)}}
            await self.ctx.client.patch(CONFIGMAPS, name, stamp, ns)
        return Result()


def stamping(built: list[ControllerContext]) -> Callable[[ControllerContext], list[Controller]]:
    def factory(ctx: ControllerContext) -> list[Controller]:
        built.append(ctx)
        rec = Stamp(ctx)
        c = Controller(f"stamp-{ctx.term}", rec, metrics=ctx.metrics)
        c.watches(rec.cache)
        return [c]

    return factory


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    async with api_server() as harness:
        yield harness


async def test_controllers_follow_leadership(h: Harness) -> None:
    assert h.server.api is not None
    leadership = FakeLeadership()
    built: list[ControllerContext] = []
    reg = Registry()
    manager = ControllerManager(
        h.server.api.api, stamping(built), leadership=leadership, metrics=reg
    )
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(manager.run)
            await trio.testing.wait_all_tasks_blocked()
            assert built == []  # a follower runs nothing
            assert manager.term is None

            leadership.set(True, 1)
            await until(lambda: manager.term == 1 and bool(manager.controllers))
            first = manager.controllers[0]
            # Running, not just built: a controller stopped while its caches sync never
            # reaches the `try` that shuts its queue down.
            informer = built[0].informers.informer(CONFIGMAPS, "default")
            await until(lambda: informer.has_synced)
            await trio.testing.wait_all_tasks_blocked()
            assert manager.informers is built[0].informers  # shared with in-process observers
            assert 'leader_election_master_status{name="controller-manager"} 1' in reg.render()

            leadership.set(False, 2)  # deposed: everything of term 1 stops
            await until(lambda: manager.term is None)
            assert first.queue.shutting_down
            assert manager.informers is None
            assert 'leader_election_master_status{name="controller-manager"} 0' in reg.render()

            leadership.set(True, 3)  # leader again: a fresh world for term 3
            await until(lambda: manager.term == 3)
            assert [ctx.term for ctx in built] == [1, 3]
            assert built[1].informers is not built[0].informers
            assert manager.informers is built[1].informers
            assert manager.terms_led == [1, 3]
            nursery.cancel_scope.cancel()


async def test_server_runs_fenced_controllers_as_leader(h: Harness) -> None:
    assert h.server.controllers is not None  # the server's own manager (no controllers yet)
    assert h.server.controllers.factory is default_controllers
    node = h.server.node
    built: list[ControllerContext] = []
    assert h.server.api is not None
    manager = ControllerManager(
        h.server.api.api, stamping(built), leadership=node, metrics=Registry()
    )
    with trio.fail_after(30):
        own = h.server.controllers  # the server's manager leads too
        await until(lambda: own.term is not None)
        async with trio.open_nursery() as nursery:
            await nursery.start(manager.run)
            await until(lambda: manager.term is not None)
            leads, term = node.leadership()
            assert leads
            assert manager.term == term
            assert built[0].client.fence_term == term

            await built[0].client.create(
                CONFIGMAPS, {"metadata": {"name": "s", "namespace": "default"}}
            )
            r = await h.client.get("/api/v1/namespaces/default/configmaps/s")
            while r.json().get("data", {}).get("term") != str(term):
                await trio.sleep(0.01)
                r = await h.client.get("/api/v1/namespaces/default/configmaps/s")
            nursery.cancel_scope.cancel()


async def test_metrics_endpoint(h: Harness) -> None:
    with trio.fail_after(30):
        r = await h.client.get("/metrics")
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert "leader_election_master_status" in r.text
        anonymous = await h.client.get("/metrics", headers={"Authorization": ""})
        assert anonymous.status_code == 401


def test_cli_flag() -> None:
    args = _build_parser().parse_args(["server", "--data-dir", "/tmp/x", "--no-controllers"])
    assert args.no_controllers
    args = _build_parser().parse_args(["server", "--data-dir", "/tmp/x"])
    assert not args.no_controllers
