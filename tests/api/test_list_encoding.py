"""A list served over HTTP is encoded an object at a time as the objects are read
(`get.list_json`, `get.list_table_json`), holding bytes rather than decoded objects: its body
is byte for byte `codec.dumps` of the `<Kind>List` or Table the in-process verbs make (with
selectors, limit and continue, every `includeObject`, and a custom kind, presented in the
URL's version)."""

from __future__ import annotations

from orchestrator.apiserver import tables
from orchestrator.apiserver.codec import dumps
from orchestrator.apiserver.handler import Call
from orchestrator.apiserver.options import ListOptions, WriteOptions
from orchestrator.apiserver.request import Query
from orchestrator.security.authn import User
from tests.api.apiharness import api_server

ADMIN = User("system:admin", ("system:masters", "system:authenticated"))
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
NOW = 1_800_000_000.0


async def test_list_bodies_are_what_the_objects_encode_to() -> None:
    async with api_server(controllers=False) as h:
        h.api.clock = lambda: NOW  # the Table's ages, the same for both
        for i in range(40):
            body = {
                "metadata": {"name": f"cm-{i:02}", "labels": {"app": "a" if i % 3 else "b"}},
                "data": {"k": "é✓" * (i % 4), "n": str(i)},
            }
            r = await h.client.post("/api/v1/namespaces/default/configmaps", json=body)
            assert r.status_code == 201, r.text
        kind = h.api.kind("", "v1", "configmaps")
        call = Call(ADMIN, WriteOptions(False, "test", "Strict", False), read_only=True)
        queries = ["", "labelSelector=app%3Db", "limit=7", "fieldSelector=metadata.name%3Dcm-03"]
        for ns in ("default", ""):
            base = "/api/v1/namespaces/default/configmaps" if ns else "/api/v1/configmaps"
            for q in queries:
                r = await h.client.get(f"{base}?{q}")
                assert r.status_code == 200, r.text
                expected = await h.api.list_objects(call, kind, ns, ListOptions.parse(Query(q)))
                assert r.content == dumps(expected)
                token = expected["metadata"].get("continue")
                if token:  # the next page: the same
                    q2 = f"limit=7&continue={token}"
                    r = await h.client.get(f"{base}?{q2}")
                    opts = ListOptions.parse(Query(q2))
                    assert r.content == dumps(await h.api.list_objects(call, kind, ns, opts))
                for include in ("", "None", "Object", "Metadata"):
                    tq = f"{q}&includeObject={include}"
                    r = await h.client.get(f"{base}?{tq}", headers={"accept": TABLE})
                    assert r.status_code == 200, r.text
                    objs = await h.api.list_objects(call, kind, ns, ListOptions.parse(Query(tq)))
                    table = tables.table(
                        kind,
                        objs["items"],
                        NOW,
                        resource_version=objs["metadata"]["resourceVersion"],
                        continue_token=objs["metadata"].get("continue"),
                        include=tables.include_object(include),
                    )
                    assert r.content == dumps(table)
        # An empty list, and the errors as before: a bad includeObject after the list's own.
        r = await h.client.get("/api/v1/namespaces/none/secrets")
        assert r.status_code == 200
        assert r.json()["items"] == []
        r = await h.client.get("/api/v1/configmaps?includeObject=All", headers={"accept": TABLE})
        assert r.status_code == 400
        assert "includeObject" in r.json()["message"]
        r = await h.client.get(
            "/api/v1/configmaps?includeObject=All&fieldSelector=spec.x%3D1",
            headers={"accept": TABLE},
        )
        assert r.status_code == 400
        assert "spec.x" in r.json()["message"]
        r = await h.client.get("/api/v1/namespaces/default/nodes")
        assert r.status_code == 404
