"""Server-side apply matches list items whose key field the server defaulted: a container port
applied without `protocol` is the live port with `protocol: TCP`, not a second one."""

from __future__ import annotations

import json

from apiharness import api_server

DEPLOY = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "web", "namespace": "default"},
    "spec": {
        "selector": {"matchLabels": {"app": "web"}},
        "template": {
            "metadata": {"labels": {"app": "web"}},
            "spec": {
                "containers": [{"name": "c", "image": "nginx", "ports": [{"containerPort": 80}]}]
            },
        },
    },
}


async def test_apply_after_create_keeps_one_port() -> None:
    async with api_server() as h:
        url = "/apis/apps/v1/namespaces/default/deployments"
        r = await h.client.post(url, json=DEPLOY)
        assert r.status_code == 201, r.text
        for _ in range(3):
            r = await h.client.patch(
                f"{url}/web?fieldManager=kubectl&force=true",
                content=json.dumps(DEPLOY),
                headers={"Content-Type": "application/apply-patch+yaml"},
            )
            assert r.status_code == 200, r.text
            ports = r.json()["spec"]["template"]["spec"]["containers"][0]["ports"]
            assert ports == [{"containerPort": 80, "protocol": "TCP"}]
