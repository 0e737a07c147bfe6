"""`kube.taints`: Kubernetes' Toleration.ToleratesTaint, the one implementation that the
scheduler, the DaemonSet controller and the node lifecycle share."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.controllers.nodelifecycle import tolerates as lifecycle_tolerates
from orchestrator.kube.taints import tolerates, tolerates_taint, toleration_of
from orchestrator.scheduler import PodInfo

TAINT = {"key": "gpu", "value": "yes", "effect": "NoSchedule"}


def tol(key: str = "", op: str = "", value: str = "", effect: str = "") -> dict[str, Any]:
    return {k: v for k, v in (("key", key), ("operator", op), ("value", value),
                              ("effect", effect)) if v}  # fmt: skip


CASES = [
    (tol("", "Exists"), True),  # empty key with Exists: every taint
    (tol("", "Exists", effect="NoExecute"), False),  # ...of that effect only
    (tol("gpu", "Exists"), True),  # Exists ignores the value
    (tol("other", "Exists"), False),
    (tol("gpu", "Equal", "yes"), True),  # empty effect: every effect
    (tol("gpu", "Equal", "yes", "NoSchedule"), True),
    (tol("gpu", "Equal", "yes", "NoExecute"), False),
    (tol("gpu", "", "yes"), True),  # an empty operator means Equal
    (tol("gpu", "Equal", "no"), False),  # value mismatch
    (tol("gpu", "", "no"), False),
    (tol("gpu", "Equal"), False),  # no value: only a taint without one
    (tol("", "Equal", "yes"), True),  # empty key: any key, the value still compared
    (tol("", "Equal", "no"), False),
    (tol("gpu", "Lt", "yes"), False),  # an unknown operator tolerates nothing
    (tol("gpu", "exists", "yes"), False),  # operators are case-sensitive
    (tol("", "Gt"), False),
]


@pytest.mark.parametrize(("toleration", "tolerated"), CASES)
def test_tolerates_taint(toleration: dict[str, Any], tolerated: bool) -> None:
    assert tolerates_taint(toleration, TAINT) is tolerated
    assert tolerates(toleration_of(toleration), "gpu", "yes", "NoSchedule") is tolerated


@pytest.mark.parametrize(("toleration", "tolerated"), CASES)
def test_the_scheduler_and_the_node_lifecycle_agree(
    toleration: dict[str, Any], tolerated: bool
) -> None:
    assert lifecycle_tolerates(toleration, TAINT) is tolerated
    pod = PodInfo.from_pod(
        {"metadata": {"name": "p", "namespace": "d"}, "spec": {"tolerations": [toleration]}}
    )
    assert any(tolerates(t, "gpu", "yes", "NoSchedule") for t in pod.tolerations) is tolerated


def test_a_taint_without_value_or_effect() -> None:
    bare = {"key": "k"}
    assert tolerates_taint(tol("k", "Equal"), bare)
    assert tolerates_taint(tol("k", "Exists", effect="NoSchedule"), bare) is False
    assert tolerates_taint(tol("k", "Equal", "v"), bare) is False
