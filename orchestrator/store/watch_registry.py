"""The watch hub's registry of active watchers (`store/watch.py`).

Unsynced watchers are a set; synced ones are grouped by prefix, with the sorted distinct prefix
lengths in use, so that `WatchHub.publish` finds a key's watchers by looking up `key[:L]` for
each length `L` only (invariant 5 of `store/watch.py`): `lens` always holds exactly the lengths
of the prefixes in `groups`, and `len_count[L]` how many groups have length `L`.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar


class Prefixed(Protocol):
    """A watcher, as the registry sees it: hashable, with the key prefix it watches."""

    @property
    def prefix(self) -> str: ...


W = TypeVar("W", bound=Prefixed)


@dataclass
class WatcherRegistry(Generic[W]):
    """Active watchers. Synced ones are grouped by prefix for `publish`."""

    unsynced: dict[W, None] = field(default_factory=dict)
    groups: dict[str, dict[W, None]] = field(default_factory=dict)
    lens: list[int] = field(default_factory=list)  # sorted distinct len(prefix) of groups
    len_count: dict[int, int] = field(default_factory=dict)  # groups per prefix length
    progress: dict[W, None] = field(default_factory=dict)  # progress_notify watchers

    def add_synced(self, w: W) -> None:
        group = self.groups.get(w.prefix)
        if group is None:
            group = self.groups[w.prefix] = {}
            n = len(w.prefix)
            self.len_count[n] = self.len_count.get(n, 0) + 1
            if self.len_count[n] == 1:
                self.lens.insert(bisect_left(self.lens, n), n)
        group[w] = None

    def remove_synced(self, w: W) -> None:
        group = self.groups.get(w.prefix)
        if group is None or w not in group:
            return
        del group[w]
        if not group:
            del self.groups[w.prefix]
            n = len(w.prefix)
            self.len_count[n] -= 1
            if self.len_count[n] == 0:
                del self.len_count[n]
                self.lens.remove(n)
