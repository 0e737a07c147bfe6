"""Interning for informer caches: equal read-only sub-trees of cached objects stored once.

Theory of operation
-------------------
The pods of one ReplicaSet are alike: the same containers, tolerations, labels, owner
reference; the pods started in the same second have the same conditions; the pods of one node
the same `hostIPs`. Decoded separately, each pod holds its own copy of all of it — most of a
cached pod's memory once `managedFields` is gone. `Interner.transform`, an informer transform
(client-go's `SetTransform`), rebuilds the object's top level and its sections (`metadata`,
`spec`, `status`, ...) and replaces each member that is a dict or a list by the one equal
instance the interner holds (hash-consing: on a miss, the new value's own dict and list members
are interned in turn, so a new value that differs from a known one in one leaf still shares the
rest).

Equality is that of the msgpack encoding, which tells `1`, `1.0` and `True` apart and keys
dicts in order (pods made by one controller list their fields in one order). The members
unique to each object by construction (`status.podIPs`; a container status's IDs) are rebuilt
with their own members interned, but never enter the table, which would otherwise keep an
entry per object.

Invariants: the transform never modifies its argument; an interned value is a private deep
copy made on the first miss, never handed out mutable to anyone but read-only consumers (the
informer's contract: cached objects are read-only); the table holds no value that only it
references after a sweep (`sweep`, run whenever the table has doubled since the last one, so
the amortised cost per insertion is constant and the table stays within twice what the live
objects share).
"""

from __future__ import annotations

import sys
from typing import Any, Final

import msgpack

from orchestrator.kube.jsonvalue import copy_json
from orchestrator.kube.objects import Obj

__all__ = ["UNIQUE_MEMBERS", "Interner"]

# Section members that differ between any two objects: rebuilt (with their members interned),
# never entered in the table.
UNIQUE_MEMBERS: Final = frozenset(
    {
        ("metadata", "managedFields"),
        ("status", "podIPs"),
        ("status", "containerStatuses"),
        ("status", "initContainerStatuses"),
        ("status", "ephemeralContainerStatuses"),
    }
)
_MIN_SWEEP = 1024  # entries before the first sweep
_UNIQUE_LEAVES: Final = frozenset({"containerID", "imageID"})  # unique strings: no need to try


class Interner:
    """One table of shared sub-trees; `transform` is the informer transform (see the module
    doc). Not thread-safe (one per trio run, as the informers)."""

    def __init__(self) -> None:
        self._table: dict[bytes, Any] = {}
        self._sweep_at = _MIN_SWEEP
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._table)

    def intern(self, value: Any) -> Any:
        """The table's instance equal to `value` (a JSON value; scalars returned as they are)."""
        t = type(value)
        if t is not dict and t is not list:
            return value
        try:
            key = msgpack.packb(value)
        except (TypeError, ValueError):  # not plain JSON: leave it alone
            return value
        found = self._table.get(key)
        if found is not None:
            self.hits += 1
            return found
        self.misses += 1
        shared = self._children(value)
        self._table[key] = shared
        if len(self._table) >= self._sweep_at:
            self.sweep()
        return shared

    def _children(self, value: Any) -> Any:
        """A private copy of `value` whose dict and list members are interned."""
        if type(value) is dict:
            return {
                k: v if type(v) is not dict and type(v) is not list else self.intern(v)
                for k, v in value.items()
            }
        if type(value) is list:
            return [v if type(v) is not dict and type(v) is not list else self.intern(v)
                    for v in value]  # fmt: skip
        return copy_json(value)

    def _unique(self, value: Any) -> Any:
        """A member unique to its object (UNIQUE_MEMBERS): rebuilt, its parts interned."""
        if type(value) is list:
            return [self._unique(v) for v in value]
        if type(value) is dict:
            return {k: v if k in _UNIQUE_LEAVES else self.intern(v) for k, v in value.items()}
        return value

    def transform(self, obj: Obj) -> Obj:
        """`obj` without `metadata.managedFields`, its sections' members shared (module doc)."""
        out: Obj = {}
        for section, body in obj.items():
            if type(body) is not dict:
                out[section] = self.intern(body)
                continue
            rebuilt: dict[str, Any] = {}
            for k, v in body.items():
                if (section, k) in UNIQUE_MEMBERS:
                    if k != "managedFields":
                        rebuilt[k] = self._unique(v)
                elif type(v) is dict or type(v) is list:
                    rebuilt[k] = self.intern(v)
                else:
                    rebuilt[k] = v
            out[section] = rebuilt
        return out

    def sweep(self) -> int:
        """Drop the entries no cached object uses any more; the number dropped."""
        table = self._table
        # An unused value is held by the table alone; getrefcount's argument adds one.
        dead = [key for key in list(table) if sys.getrefcount(table[key]) <= 2]
        for key in dead:
            del table[key]
        self._sweep_at = max(_MIN_SWEEP, 2 * len(table))
        return len(dead)
