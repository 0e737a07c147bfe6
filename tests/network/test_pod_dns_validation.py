"""The API's checks of a pod's dnsPolicy/dnsConfig (Kubernetes' validatePodDNSConfig limits)."""

from __future__ import annotations

import pytest

from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.core_v1_pod import validate_pod_spec


def spec(**extra: object) -> Obj:
    return {"containers": [{"name": "c", "image": "busybox"}], **extra}


def messages(s: Obj) -> list[str]:
    return [f"{c.field}: {c.message}" for c in validate_pod_spec(s)]


def test_valid_dns_configs() -> None:
    assert messages(spec()) == []
    assert messages(spec(dnsPolicy="None", dnsConfig={"nameservers": ["1.1.1.1"]})) == []
    ok = {
        "nameservers": ["10.43.0.10", "fd00::a", "1.1.1.1"],
        "searches": ["a.example", "b.example."],
        "options": [{"name": "ndots", "value": "2"}],
    }
    assert messages(spec(dnsConfig=ok)) == []


@pytest.mark.parametrize(
    ("extra", "field", "text"),
    [
        ({"dnsPolicy": "None"}, "spec.dnsConfig", "when `dnsPolicy` is None"),
        ({"dnsPolicy": "None", "dnsConfig": {}}, "spec.dnsConfig.nameservers", "at least one"),
        (
            {"dnsConfig": {"nameservers": ["1.1.1.1", "1.1.1.2", "1.1.1.3", "1.1.1.4"]}},
            "spec.dnsConfig.nameservers",
            "more than 3",
        ),
        ({"dnsConfig": {"nameservers": ["dns.example"]}}, "spec.dnsConfig.nameservers[0]", "IP"),
        (
            {"dnsConfig": {"searches": [f"d{i}.example" for i in range(33)]}},
            "spec.dnsConfig.searches",
            "more than 32",
        ),
        (
            {"dnsConfig": {"searches": ["x" * 63 + f".d{i}.example" for i in range(30)]}},
            "spec.dnsConfig.searches",
            "2048 characters",
        ),
        ({"dnsConfig": {"searches": ["Bad_Name"]}}, "spec.dnsConfig.searches[0]", ""),
        ({"dnsConfig": {"options": [{"value": "1"}]}}, "spec.dnsConfig.options[0].name", ""),
    ],
)
def test_invalid_dns_configs(extra: Obj, field: str, text: str) -> None:
    found = [m for m in messages(spec(**extra)) if m.startswith(field + ":")]
    assert found, messages(spec(**extra))
    assert text in found[0]
