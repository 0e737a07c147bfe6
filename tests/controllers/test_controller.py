"""Controller: outcome -> queue action as controller-runtime (on a MockClock, no I/O), watches
and owner mapping, a toy ConfigMap controller end to end on the API harness, and EventRecorder
deduplication."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing
from api.apiharness import Harness, api_server

from orchestrator.controllers.runtime.client import CONFIGMAPS, EVENTS, Client
from orchestrator.controllers.runtime.controller import (
    Controller,
    Result,
    TerminalError,
    enqueue_owner,
)
from orchestrator.controllers.runtime.events import EventRecorder
from orchestrator.controllers.runtime.informer import SharedInformer
from orchestrator.controllers.runtime.inprocess import InProcessClient
from orchestrator.controllers.runtime.ratelimit import ItemExponential
from orchestrator.kube.errors import ApiError
from orchestrator.metrics import Registry
from orchestrator.security.authn import User

CONTROLLER = User("system:kube-controller-manager", ("system:authenticated",))
Obj = dict[str, Any]


async def until(predicate: Callable[[], bool]) -> None:
    """Poll a condition (callers hold the deadline with `trio.fail_after`)."""
    while not predicate():  # noqa: ASYNC110  (the condition is data, not an event to wait on)
        await trio.sleep(0.01)


class Scripted:
    """A reconciler that plays one scripted outcome per call for each key, then succeeds."""

    def __init__(self, script: dict[str, list[Any]]) -> None:
        self.script = script
        self.calls: list[tuple[str, float]] = []

    async def reconcile(self, key: str) -> Result:
        self.calls.append((key, trio.current_time()))
        await trio.lowlevel.checkpoint()
        steps = self.script.get(key) or []
        step = steps.pop(0) if steps else Result()
        if isinstance(step, BaseException):
            raise step
        assert isinstance(step, Result)
        return step


def value(reg: Registry, sample: str) -> float:
    for line in reg.render().splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    return 0.0


async def test_outcomes_map_to_queue_actions(autojump_clock: trio.testing.MockClock) -> None:
    reg = Registry()
    rec = Scripted(
        {
            "err": [RuntimeError("boom"), RuntimeError("boom")],  # then success
            "terminal": [TerminalError("bad spec")],
            "later": [Result(requeue_after=30.0)],
            "again": [Result(requeue=True)],
        }
    )
    c = Controller("toy", rec, workers=2, rate_limiter=ItemExponential(1.0, 100.0), metrics=reg)
    with trio.fail_after(1000):
        async with trio.open_nursery() as nursery:
            t0 = trio.current_time()
            await nursery.start(c.run)
            for key in ("err", "terminal", "later", "again", "ok"):
                c.enqueue(key)
            await trio.sleep(100)
            nursery.cancel_scope.cancel()
    times: dict[str, list[float]] = {}
    for key, at in rec.calls:
        times.setdefault(key, []).append(round(at - t0, 3))
    assert times["ok"] == [0.0]
    assert times["terminal"] == [0.0]  # never retried
    assert times["err"] == [0.0, 1.0, 3.0]  # rate limited: 1 s, then 2 s
    assert times["later"] == [0.0, 30.0]
    assert times["again"] == [0.0, 1.0]
    assert c.queue.num_requeues("err") == 0  # forgotten after the success
    name = 'controller="toy"'
    assert value(reg, f'controller_runtime_reconcile_total{{{name},result="error"}}') == 3
    assert value(reg, f'controller_runtime_reconcile_total{{{name},result="success"}}') == 4
    assert value(reg, f'controller_runtime_reconcile_total{{{name},result="requeue_after"}}') == 1
    assert value(reg, f'controller_runtime_reconcile_total{{{name},result="requeue"}}') == 1
    assert value(reg, f"controller_runtime_reconcile_errors_total{{{name}}}") == 3
    assert value(reg, f"controller_runtime_terminal_reconcile_errors_total{{{name}}}") == 1
    assert value(reg, f"controller_runtime_reconcile_time_seconds_count{{{name}}}") == 9
    assert value(reg, f"controller_runtime_active_workers{{{name}}}") == 0
    assert c.queue.shutting_down  # cancelled: the queue was shut down


def test_enqueue_owner_maps_to_the_controller_owner() -> None:
    to_rs = enqueue_owner("ReplicaSet")
    pod: Obj = {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "ownerReferences": [
                {"kind": "ReplicaSet", "name": "other", "uid": "1"},
                {"kind": "ReplicaSet", "name": "web", "uid": "2", "controller": True},
            ],
        }
    }
    assert to_rs(pod) == "ns/web"
    assert enqueue_owner("Deployment")(pod) is None
    assert enqueue_owner("ReplicaSet", "apps/v1")(pod) is None
    assert to_rs({"metadata": {"name": "orphan"}}) is None


def test_workers_must_be_positive() -> None:
    with pytest.raises(ValueError, match="workers"):
        Controller("bad", Scripted({}), workers=0, metrics=Registry())


# ---------------------------------------------------------------- end to end on the harness
@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    async with api_server() as harness:
        yield harness


def in_process(h: Harness) -> InProcessClient:
    assert h.server.api is not None
    return InProcessClient(h.server.api.api, CONTROLLER)


class Mirror:
    """Level-based toy: every ConfigMap labelled mirror=yes has a copy `<name>-copy` with the
    same data, owned by it; a copy without its source is deleted."""

    def __init__(self, client: Client, sources: SharedInformer, events: EventRecorder) -> None:
        self.client = client
        self.sources = sources
        self.events = events

    async def reconcile(self, key: str) -> Result:
        ns, _, name = key.partition("/")
        copy_name = f"{name}-copy"
        src = self.sources.get(key)
        if src is None:
            try:
                await self.client.delete(CONFIGMAPS, copy_name, ns)
            except ApiError as exc:
                if exc.code != 404:
                    raise
            return Result()
        ref = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": name,
            "uid": src["metadata"]["uid"],
            "controller": True,
        }
        want = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": copy_name, "namespace": ns, "ownerReferences": [ref]},
            "data": dict(src.get("data") or {}),
        }
        await self.client.apply(CONFIGMAPS, want, force=True)
        self.events.record(src, "Normal", "Mirrored", f"copied to {copy_name}")
        return Result()


async def test_configmap_controller_end_to_end(h: Harness) -> None:
    client = in_process(h)
    reg = Registry()
    with trio.fail_after(30):
        await client.create(
            CONFIGMAPS,
            {"metadata": {"name": "a", "namespace": "default", "labels": {"mirror": "yes"}},
             "data": {"x": "1"}},
        )  # fmt: skip
        sources = SharedInformer(client, CONFIGMAPS, label_selector="mirror=yes", metrics=reg)
        copies = SharedInformer(client, CONFIGMAPS, metrics=reg)
        events = EventRecorder(client, "mirror-controller", metrics=reg)
        c = Controller("mirror", Mirror(client, sources, events), workers=2, metrics=reg)
        c.watches(sources)
        c.watches(copies, enqueue_owner("ConfigMap"))  # a copy changed -> its source

        def copy_data(name: str) -> Any:
            obj = copies.get(f"default/{name}-copy")
            return None if obj is None else obj.get("data")

        async with trio.open_nursery() as nursery:
            await nursery.start(sources.run)
            await nursery.start(copies.run)
            await nursery.start(events.run)
            await nursery.start(c.run)
            await until(lambda: copy_data("a") == {"x": "1"})

            await client.patch(CONFIGMAPS, "a", {"data": {"x": "2"}}, "default")
            await until(lambda: copy_data("a") == {"x": "2"})

            # Someone edits the copy: the owner mapping brings the source's reconcile back.
            await client.patch(CONFIGMAPS, "a-copy", {"data": {"x": "tampered"}}, "default")
            await until(lambda: copy_data("a") == {"x": "2"})

            await client.delete(CONFIGMAPS, "a", "default")
            await until(lambda: copies.get("default/a-copy") is None)

            listed = await client.list(EVENTS, "default", field_selector="reason=Mirrored")
            assert listed["items"]
            nursery.cancel_scope.cancel()


async def test_event_recorder_deduplicates_and_never_raises(h: Harness) -> None:
    client = in_process(h)
    reg = Registry()
    obj = await client.create(CONFIGMAPS, {"metadata": {"name": "e", "namespace": "default"}})
    clock = [1000.0]
    rec = EventRecorder(client, "tester", "host-1", buffer=2, metrics=reg, clock=lambda: clock[0])
    with trio.fail_after(30):
        for _ in range(3):  # the third does not fit: dropped, counted, no exception
            rec.record(obj, "Warning", "Broken", "it broke")
        assert value(reg, 'events_dropped_total{component="tester"}') == 1
        async with trio.open_nursery() as nursery:
            await nursery.start(rec.run)

            async def events() -> list[Obj]:
                listed = await client.list(EVENTS, "default", field_selector="reason=Broken")
                return list(listed["items"])

            # Polled against the fail_after above: the writes happen in the recorder's task.
            while not (evs := await events()) or evs[0].get("count") != 2:  # noqa: ASYNC110
                await trio.sleep(0.01)
            assert len(evs) == 1
            ev = evs[0]
            assert ev["involvedObject"]["name"] == "e"
            assert ev["involvedObject"]["uid"] == obj["metadata"]["uid"]
            assert ev["source"] == {"component": "tester", "host": "host-1"}
            assert ev["type"] == "Warning"

            clock[0] += 700  # beyond the 10 min window: a new Event
            rec.record(obj, "Warning", "Broken", "it broke")
            while len(await events()) != 2:  # noqa: ASYNC110  (polled, as above)
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()


class NeverSyncs:
    """An informer whose cache never syncs."""

    def add_event_handler(self, **handlers: Any) -> None:
        pass

    async def wait_for_cache_sync(self) -> None:
        await trio.sleep_forever()


async def test_cancelled_during_cache_sync_shuts_the_queue_down(
    autojump_clock: trio.testing.MockClock,
) -> None:
    c = Controller("toy", Scripted({}), metrics=Registry())
    c.watches(NeverSyncs())  # type: ignore[arg-type]
    with trio.move_on_after(5):
        await c.run()
    assert c.queue.shutting_down
