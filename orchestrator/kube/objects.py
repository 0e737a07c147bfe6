"""`Obj`, the type of a Kubernetes object as the code handles it: its JSON shape as a dict, and
the small helpers every layer uses to read one (`metadata_of`, dotted paths).

One definition for every module (objects travel between the API server, the store's codec,
controllers, the scheduler and the agent unchanged). The helpers never modify what they read
and never fail on a malformed object: a missing or non-dict part reads as empty.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Obj", "get_path", "metadata_of", "set_path"]

Obj = dict[str, Any]


def metadata_of(obj: Obj) -> Obj:
    """`obj["metadata"]` when it is a dict, else an empty dict (not attached to `obj`)."""
    value = obj.get("metadata")
    return value if isinstance(value, dict) else {}


def get_path(obj: Obj, dotted: str) -> Any:
    """The value at `dotted` ("spec.replicas"), or None where the path leaves the dicts."""
    cur: Any = obj
    for part in dotted.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def set_path(obj: Obj, dotted: str, value: Any) -> None:
    """Set `dotted` in `obj` (in place), making the dicts on the way as needed."""
    parts = dotted.split(".")
    cur = obj
    for part in parts[:-1]:
        nxt = cur.get(part)
        if not isinstance(nxt, dict):
            nxt = cur[part] = {}
        cur = nxt
    cur[parts[-1]] = value
