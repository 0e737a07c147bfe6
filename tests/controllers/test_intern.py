"""The informer transform that shares equal sub-trees between cached objects."""

from __future__ import annotations

import copy
import gc
from typing import Any

from orchestrator.controllers.runtime.intern import Interner

Obj = dict[str, Any]


def pod(name: str, node: str, ip: str, started: str = "2026-01-01T00:00:00Z") -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "uid": "uid-" + name,
            "labels": {"app": "a", "pod-template-hash": "h"},
            "ownerReferences": [{"kind": "ReplicaSet", "name": "rs", "controller": True}],
            "managedFields": [{"manager": "m", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "1"}}}],
            "tolerations": [{"key": "k", "operator": "Exists", "tolerationSeconds": 300}],
        },
        "status": {
            "phase": "Running",
            "hostIPs": [{"ip": "10.0.0." + node[-1]}],
            "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": started}],
            "containerStatuses": [
                {
                    "name": "c",
                    "containerID": "cid-" + name,
                    "state": {"running": {"startedAt": started}},
                }
            ],
        },
    }


def test_transform_strips_managed_fields_and_leaves_its_argument_alone() -> None:
    interner = Interner()
    original = pod("a", "n1", "10.1.0.1")
    before = copy.deepcopy(original)
    out = interner.transform(original)
    assert original == before
    expected = copy.deepcopy(before)
    del expected["metadata"]["managedFields"]
    assert out == expected


def test_siblings_share_equal_sub_trees() -> None:
    interner = Interner()
    a = interner.transform(pod("a", "n1", "10.1.0.1"))
    b = interner.transform(pod("b", "n1", "10.1.0.2"))
    c = interner.transform(pod("c", "n2", "10.1.0.3", started="2026-01-01T00:00:09Z"))
    for path in (("metadata", "labels"), ("metadata", "ownerReferences"),
                 ("spec", "containers"), ("spec", "tolerations"), ("status", "conditions"),
                 ("status", "hostIPs")):  # fmt: skip
        assert a[path[0]][path[1]] is b[path[0]][path[1]], path
    assert a["spec"]["containers"] is c["spec"]["containers"]
    assert a["status"]["hostIPs"] is not c["status"]["hostIPs"]  # another node
    assert a["status"]["conditions"] is not c["status"]["conditions"]  # another second
    # per-object members are rebuilt with their parts shared, and never enter the table
    sa, sb = a["status"]["containerStatuses"][0], b["status"]["containerStatuses"][0]
    assert sa["state"] is sb["state"]
    assert sa["containerID"] == "cid-a"
    assert a["status"]["podIPs"] == [{"ip": "10.1.0.1"}]
    assert a["status"]["podIPs"][0] is not b["status"]["podIPs"][0]
    assert a["metadata"] is not b["metadata"]


def test_equality_is_exact_and_values_are_private_copies() -> None:
    interner = Interner()
    one, real, true = ({"x": [1]}, {"x": [1.0]}, {"x": [True]})
    assert interner.intern(one) is not interner.intern(real)
    assert interner.intern(true) is not interner.intern(one)
    assert interner.intern(real) == {"x": [1.0]}
    shared = interner.intern(one)
    assert shared is not one  # a copy: changing the caller's value later changes nothing
    one["x"].append(2)
    assert interner.intern({"x": [1]}) is shared
    assert shared == {"x": [1]}


def test_sweep_drops_only_what_no_object_uses() -> None:
    interner = Interner()
    kept = interner.transform(pod("a", "n1", "10.1.0.1"))
    gone = interner.transform(pod("b", "n2", "10.1.0.2", started="2026-01-01T00:00:05Z"))
    size = len(interner)
    del gone
    gc.collect()
    dropped = interner.sweep() + interner.sweep()  # a dead parent first, then its children
    assert dropped > 0
    assert len(interner) == size - dropped
    again = interner.transform(pod("c", "n1", "10.1.0.3"))
    assert again["spec"]["containers"] is kept["spec"]["containers"]
    assert again["status"]["hostIPs"] is kept["status"]["hostIPs"]


def test_the_table_is_swept_as_it_grows() -> None:
    interner = Interner()
    for i in range(5000):  # every pod its own second and node: nothing shared but the spec
        interner.transform(pod(f"p{i}", f"n{i}", f"10.1.{i // 250}.{i % 250}", started=str(i)))
    assert len(interner) < 2 * 1024 + 10
