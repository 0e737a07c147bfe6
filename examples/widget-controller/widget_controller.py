"""An example of a user-written controller for a custom resource, on the orchestrator's runtime.

It imports only the runtime's public face, `orchestrator.controllers.runtime`.

For every Widget (crd.yaml) it keeps a ConfigMap `widget-<name>` holding the widget's size and
color, owned by the Widget (so the garbage collector removes it with the Widget), and reports
`status.ready` and `status.observedGeneration`. The reconcile function is level-based: it reads
the desired state and the actual state and makes them match, whatever event woke it; the
runtime owns retries (a failed reconcile is retried with per-key exponential backoff).

Run it against a server (any process with a kubeconfig, e.g. on another device):

    kubectl apply -f examples/widget-controller/crd.yaml
    python examples/widget-controller/widget_controller.py --kubeconfig data/kubeconfig.yaml &
    kubectl apply -f examples/widget-controller/widget.yaml
    kubectl get widgets; kubectl get configmap widget-demo -o yaml
"""

from __future__ import annotations

import argparse
from typing import Any

import trio

from orchestrator.controllers.runtime import (
    ApiError,
    Client,
    Controller,
    HttpClient,
    ResourceInfo,
    RestClient,
    Result,
    SharedInformer,
    enqueue_owner,
    load_kubeconfig,
)

WIDGETS = ResourceInfo("example.com", "v1", "widgets", "Widget", namespaced=True)
CONFIGMAPS = ResourceInfo("", "v1", "configmaps", "ConfigMap", namespaced=True)


class WidgetReconciler:
    def __init__(self, client: Client, widgets: SharedInformer, configmaps: SharedInformer):
        self.client = client
        self.widgets = widgets
        self.configmaps = configmaps

    async def reconcile(self, key: str) -> Result:
        widget = self.widgets.get(key)
        if widget is None or widget["metadata"].get("deletionTimestamp"):
            return Result()  # gone: the ConfigMap goes with it (ownerReference)
        ns, name = widget["metadata"]["namespace"], widget["metadata"]["name"]
        spec = widget.get("spec") or {}
        want = {"size": str(spec.get("size", 1)), "color": str(spec.get("color", "blue"))}
        cm_name = f"widget-{name}"
        current = self.configmaps.get(f"{ns}/{cm_name}")
        if current is None:
            try:
                await self.client.create(CONFIGMAPS, self._configmap(widget, cm_name, want), ns)
            except ApiError as exc:
                if exc.code != 409:  # 409: our cache lags a create we already made
                    raise
        elif current.get("data") != want:
            await self.client.patch(CONFIGMAPS, cm_name, {"data": want}, ns)
        status = {
            "ready": True,
            "observedGeneration": widget["metadata"].get("generation", 1),
            "configMap": cm_name,
        }
        if widget.get("status") != status:
            await self.client.patch(WIDGETS, name, {"status": status}, ns, subresource="status")
        return Result()

    @staticmethod
    def _configmap(widget: dict[str, Any], name: str, data: dict[str, str]) -> dict[str, Any]:
        meta = widget["metadata"]
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": meta["namespace"],
                "ownerReferences": [
                    {
                        "apiVersion": WIDGETS.api_version,
                        "kind": "Widget",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "data": data,
        }


async def run_controller(
    client: Client, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Informers on Widgets and ConfigMaps, one controller; runs until cancelled."""
    widgets = SharedInformer(client, WIDGETS)
    configmaps = SharedInformer(client, CONFIGMAPS)
    controller = Controller("widgets", WidgetReconciler(client, widgets, configmaps), workers=2)
    controller.watches(widgets)
    controller.watches(configmaps, enqueue_owner("Widget", WIDGETS.api_version))
    async with trio.open_nursery() as nursery:
        await nursery.start(widgets.run)
        await nursery.start(configmaps.run)
        await nursery.start(controller.run)
        task_status.started()


async def main(kubeconfig: str) -> None:
    async with RestClient(load_kubeconfig(kubeconfig)) as rest:
        await run_controller(HttpClient(rest, field_manager="widget-controller"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    trio.run(main, parser.parse_args().kubeconfig)
