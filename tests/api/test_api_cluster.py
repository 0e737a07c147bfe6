"""The Kubernetes API on a 3-server cluster: one kubeconfig works against every server (shared
CA and tokens), and objects and CRDs written through one server are served by the others."""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx
import pytest
import trio
from apiharness import read_kubeconfig
from cluster import Cluster

pytestmark = pytest.mark.slow


async def wait_api(
    url: str, client: httpx.AsyncClient, path: str, *, within: float = 30.0
) -> httpx.Response:
    with trio.fail_after(within):
        while True:
            try:
                r = await client.get(url + path)
                if r.status_code == 200:
                    return r
            except httpx.TransportError:
                pass
            await trio.sleep(0.05)


async def test_one_kubeconfig_for_every_server(tmp_path: Path) -> None:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "gadgets.example.com"},
        "spec": {
            "group": "example.com",
            "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }
    with trio.fail_after(90), Cluster(tmp_path, 3) as cluster:
        cluster.start()
        await cluster.wait_leader()
        for i in range(3):
            await cluster.wait_api(i)
        _, token, ca = read_kubeconfig(cluster.servers[0].kubeconfig)
        # Every server's kubeconfig names the same CA and admin token.
        for s in cluster.servers[1:]:
            _, other_token, other_ca = read_kubeconfig(s.kubeconfig)
            assert (other_token, other_ca) == (token, ca)
        verify = ssl.create_default_context(cadata=ca.decode())
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(verify=verify, headers=headers, timeout=10) as client:
            urls = [f"https://127.0.0.1:{s.api_port}" for s in cluster.servers]
            for u in urls:
                await wait_api(u, client, "/api/v1/namespaces/default")
            r = await client.post(
                urls[0] + "/api/v1/namespaces/default/configmaps",
                json={"metadata": {"name": "c1"}, "data": {"k": "v"}},
            )
            assert r.status_code == 201, r.text
            r = await client.post(
                urls[1] + "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd
            )
            assert r.status_code == 201, r.text
            for u in urls:
                got = await wait_api(u, client, "/api/v1/namespaces/default/configmaps/c1")
                assert got.json()["data"] == {"k": "v"}
                # The CRD written through server 2 is served by every server.
                await wait_api(u, client, "/apis/example.com/v1/namespaces/default/gadgets")
