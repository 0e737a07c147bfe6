"""The documented example of a user-written controller (examples/widget-controller) works:
against a real server, over HTTPS, as a user would run it."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import trio
import yaml
from api.apiharness import api_server

from orchestrator.client import RestClient, load_kubeconfig
from orchestrator.controllers.runtime.client import HttpClient

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "widget-controller"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "widget_controller", EXAMPLE / "widget_controller.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def poll(fn: Any, within: float = 20.0) -> Any:
    with trio.fail_after(within):
        while True:
            value = await fn()
            if value:
                return value
            await trio.sleep(0.02)


async def test_widget_controller_keeps_a_configmap_per_widget() -> None:
    example = load_example()
    crd = yaml.safe_load((EXAMPLE / "crd.yaml").read_text())
    widget = yaml.safe_load((EXAMPLE / "widget.yaml").read_text())
    async with api_server() as h:
        r = await h.client.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd)
        assert r.status_code == 201, r.text
        async with RestClient(load_kubeconfig(str(h.kubeconfig))) as rest, trio.open_nursery() as n:
            await n.start(
                example.run_controller, HttpClient(rest, field_manager="widget-controller")
            )
            widgets = "/apis/example.com/v1/namespaces/default/widgets"
            r = await h.client.post(widgets, json=widget)
            assert r.status_code == 201, r.text
            uid = r.json()["metadata"]["uid"]

            async def configmap() -> dict[str, Any] | None:
                got = await h.client.get("/api/v1/namespaces/default/configmaps/widget-demo")
                return got.json() if got.status_code == 200 else None

            cm = await poll(configmap)
            assert cm["data"] == {"size": "3", "color": "red"}
            (owner,) = cm["metadata"]["ownerReferences"]
            assert (owner["kind"], owner["uid"], owner["controller"]) == ("Widget", uid, True)

            async def ready() -> dict[str, Any] | None:
                got = (await h.client.get(f"{widgets}/demo")).json()
                return got if (got.get("status") or {}).get("ready") else None

            assert (await poll(ready))["status"]["observedGeneration"] == 1
            # A spec change is reconciled into the ConfigMap (level-based: whatever woke it).
            r = await h.client.patch(
                f"{widgets}/demo",
                json={"spec": {"size": 7}},
                headers={"Content-Type": "application/merge-patch+json"},
            )
            assert r.status_code == 200, r.text

            async def resized() -> bool:
                current = await configmap()
                return current is not None and current["data"]["size"] == "7"

            await poll(resized)
            # Deleting the ConfigMap by hand: the controller puts it back.
            r = await h.client.delete("/api/v1/namespaces/default/configmaps/widget-demo")
            assert r.status_code == 200, r.text
            await poll(resized)
            n.cancel_scope.cancel()
