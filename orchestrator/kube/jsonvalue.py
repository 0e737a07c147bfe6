"""JSON values as `json.loads` makes them (dict, list, str, int, float, bool, None).

`copy_json` is the deep copy the API server uses everywhere: objects are plain JSON trees, so
it needs none of `copy.deepcopy`'s memo and dispatch, and is several times faster (deep copies
were among the largest costs of a write).
"""

from __future__ import annotations

from typing import Any

SCALAR_TYPES = frozenset({str, int, float, bool, type(None)})  # the JSON values that are leaves


def copy_json(value: Any) -> Any:
    """A deep copy of a JSON value (dicts and lists are new; scalars are immutable).

    Exact dicts and lists (all `json.loads`/msgpack make) copy their scalar members without a
    call each — most members are scalars — which makes the copy about a third cheaper."""
    t = type(value)
    if t is dict:
        return {k: v if type(v) in SCALAR_TYPES else copy_json(v) for k, v in value.items()}
    if t is list:
        return [v if type(v) in SCALAR_TYPES else copy_json(v) for v in value]
    if isinstance(value, dict):
        return {k: copy_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [copy_json(v) for v in value]
    return value
