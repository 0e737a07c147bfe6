"""Taints and tolerations: the one `Toleration.ToleratesTaint` of the project (pure).

Kubernetes' rule (k8s.io/api core/v1 toleration.go), used by the scheduler's filters and scores,
the DaemonSet controller and the node lifecycle's taint eviction alike:

1. a toleration with an effect matches only taints of that effect; an empty effect matches all;
2. a toleration with a key matches only taints of that key; an empty key matches every key;
3. operator `Exists` matches any value; `Equal`, or an empty operator (which means `Equal`),
   matches only the same value; any other operator tolerates nothing.

Validation (not this module) rejects an empty key with an operator other than `Exists`; this
function still answers for such a toleration as upstream's does (any key, same value).

Two forms: `tolerates` takes a toleration parsed once into a `Toleration` tuple (the scheduler
calls it per node and taint, so it avoids dict lookups); `tolerates_taint` takes the API objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["Taint", "Toleration", "taint_of", "tolerates", "tolerates_taint", "toleration_of"]

Toleration = tuple[str, str, str, str]
"""(key, operator, value, effect) with "" for absent fields."""
Taint = tuple[str, str, str]
"""(key, value, effect) with "" for absent fields."""


def toleration_of(obj: Mapping[str, Any]) -> Toleration:
    """A `spec.tolerations[]` item as a `Toleration` tuple."""
    return (
        str(obj.get("key") or ""),
        str(obj.get("operator") or ""),
        str(obj.get("value") or ""),
        str(obj.get("effect") or ""),
    )


def taint_of(obj: Mapping[str, Any]) -> Taint:
    """A `spec.taints[]` item as a `Taint` tuple."""
    return (str(obj.get("key") or ""), str(obj.get("value") or ""), str(obj.get("effect") or ""))


def tolerates(toleration: Toleration, key: str, value: str, effect: str) -> bool:
    """Does `toleration` tolerate the taint (key, value, effect)? (module doc)"""
    t_key, t_op, t_value, t_effect = toleration
    if t_effect and t_effect != effect:
        return False
    if t_key and t_key != key:
        return False
    if t_op in ("", "Equal"):
        return t_value == value
    return t_op == "Exists"


def tolerates_taint(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """`tolerates` over the API objects: a toleration item and a taint item."""
    return tolerates(toleration_of(toleration), *taint_of(taint))
