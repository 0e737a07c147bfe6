"""RFC 7386 JSON Merge Patch (`application/merge-patch+json`).

Theory of operation: a patch object is walked key by key; `null` removes the key, an object merges
recursively into the target's object (or into `{}` when the target is not an object), and any
other value (lists included) replaces the target value wholesale. `create_merge_patch` is the
inverse for documents without nulls: `apply(a, create(a, b)) == b`.

Merge patch cannot express "set this to null", nor edit a list in place; strategic merge patch
exists for that. Nothing here fails except a patch whose top level is not an object (400),
because the API server always patches objects.
"""

from __future__ import annotations

from typing import Any

from orchestrator.kube.errors import bad_request
from orchestrator.kube.patch._util import copy_json, json_equal

__all__ = ["apply_merge_patch", "create_merge_patch"]


def _merge(target: Any, patch: Any, share: bool) -> Any:
    if not isinstance(patch, dict):
        return patch if share else copy_json(patch)
    if not isinstance(target, dict):
        target = {}
    out = dict(target) if share else copy_json(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(out.get(key), value, share)
    return out


def apply_merge_patch(doc: Any, patch: Any, *, share: bool = False) -> dict[str, Any]:
    """Apply the merge patch `patch` (a JSON object) to `doc`; returns a new document (`doc` is
    never modified). `share=True`: the parts of `doc` the patch does not touch, and the values
    the patch sets, are shared with the result instead of copied — for a caller that only reads
    the result."""
    if not isinstance(patch, dict):
        raise bad_request("merge patch must be a JSON object")
    try:
        result: dict[str, Any] = _merge(doc, patch, share)
    except RecursionError:
        raise bad_request("merge patch is nested too deeply") from None
    return result


def _diff(original: dict[str, Any], modified: dict[str, Any]) -> dict[str, Any]:
    patch: dict[str, Any] = {}
    for key in original:
        if key not in modified:
            patch[key] = None
    for key, value in modified.items():
        if key not in original:
            patch[key] = copy_json(value)
            continue
        old = original[key]
        if isinstance(old, dict) and isinstance(value, dict):
            sub = _diff(old, value)
            if sub:
                patch[key] = sub
        elif not json_equal(old, value):
            patch[key] = copy_json(value)
    return patch


def create_merge_patch(original: dict[str, Any], modified: dict[str, Any]) -> dict[str, Any]:
    """The smallest merge patch turning `original` into `modified` (`{}` when they are equal)."""
    return _diff(original, modified)
