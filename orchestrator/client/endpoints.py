"""Which API server to talk to, among several: the pure core of a client-side load balancer.

Theory of operation
-------------------
An agent is given one or more servers (`--server`, the *seeds*) and later learns the servers
the cluster publishes (the `default/kubernetes` Endpoints, see `urls_from_endpoints`; the
*learnt* list, which replaces the previous one each time). `EndpointSet` keeps both, seeds
first, without duplicates, and picks the one to use:

* it is **sticky**: the current endpoint is used for as long as it works, so a client's
  requests and watches all go to one server (no needless moves, no reordering of writes);
* `failed(url, now)` puts `url` in a cool-down (`backoff_initial` doubled per consecutive
  failure, up to `backoff_max`); the next `pick(now)` moves on to the next endpoint in order
  (cyclically after the current one) that is not cooling down;
* if every endpoint is cooling down, `pick` returns the one whose cool-down ends first: there
  is always something to try, and the caller's own back-off paces the attempts;
* `succeeded(url)` clears the failures of `url` (it does not move the current endpoint: a
  late answer from a server we left does not pull us back to it);
* `update(learnt)` replaces the learnt list; seeds always stay (a seed may be a name or an
  address the cluster does not publish). The current endpoint stays if it is still known, else
  the first known one becomes current.

Nothing here does I/O or reads a clock: `now` is passed in (trio time in `RestClient`), so the
selection is deterministic and unit-tested as such. `urls_from_endpoints` turns an Endpoints
object into `https://IP:PORT` URLs (ready addresses only; the port named `http` means plain
HTTP, any other name HTTPS).

Invariants: `urls` is never empty and has no duplicates; `current` is always one of `urls`;
`pick` never returns an endpoint that is cooling down while another one is not.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["EndpointSet", "normalize_url", "split_servers", "urls_from_endpoints"]

BACKOFF_INITIAL = 1.0  # seconds a failed endpoint is avoided after its first failure
BACKOFF_MAX = 30.0


def normalize_url(url: str) -> str:
    """`url` without surrounding blanks and trailing slashes (how URLs are compared here)."""
    return url.strip().rstrip("/")


def split_servers(values: Iterable[str]) -> list[str]:
    """Server URLs from `--server` values, each possibly comma-separated; normalized, in order,
    without duplicates or empty items."""
    out: dict[str, None] = {}
    for value in values:
        for part in value.split(","):
            url = normalize_url(part)
            if url:
                out[url] = None
    return list(out)


@dataclass
class _Health:
    failures: int = 0  # consecutive failures
    retry_at: float = float("-inf")  # avoided until then


class EndpointSet:
    """The known API servers and the one in use (module doc). Not thread-safe; trio-safe (no
    awaits)."""

    def __init__(
        self,
        seeds: Iterable[str],
        learnt: Iterable[str] = (),
        *,
        backoff_initial: float = BACKOFF_INITIAL,
        backoff_max: float = BACKOFF_MAX,
    ) -> None:
        self._seeds = split_servers(seeds)
        self._learnt = split_servers(learnt)
        if not self._seeds and not self._learnt:
            raise ValueError("an endpoint set needs at least one server URL")
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self._urls = self._merge()
        self._health: dict[str, _Health] = {}
        self.current = self._urls[0]

    def _merge(self) -> list[str]:
        return list(dict.fromkeys([*self._seeds, *self._learnt]))

    # ------------------------------------------------------------------ reading
    @property
    def urls(self) -> list[str]:
        """Every known endpoint: the seeds, then the learnt ones."""
        return list(self._urls)

    @property
    def learnt(self) -> list[str]:
        return list(self._learnt)

    def healthy(self, url: str, now: float) -> bool:
        h = self._health.get(url)
        return h is None or h.retry_at <= now

    # ------------------------------------------------------------------ choosing
    def pick(self, now: float) -> str:
        """The endpoint to send the next request to (module doc); it becomes `current`."""
        if self.healthy(self.current, now):
            return self.current
        start = self._urls.index(self.current)
        n = len(self._urls)
        for step in range(1, n):
            url = self._urls[(start + step) % n]
            if self.healthy(url, now):
                self.current = url
                return url
        # Everything is cooling down: the one that will be ready first (ties: list order).
        self.current = min(self._urls, key=lambda u: self._health[u].retry_at)
        return self.current

    def failed(self, url: str, now: float) -> None:
        """A request to `url` failed in a way that says the server cannot serve (refused,
        reset, timed out, no quorum): avoid it for a while."""
        url = normalize_url(url)
        if url not in self._urls:
            return
        h = self._health.setdefault(url, _Health())
        h.failures += 1
        delay = min(self.backoff_initial * 2 ** (h.failures - 1), self.backoff_max)
        h.retry_at = now + delay

    def succeeded(self, url: str) -> None:
        """A request to `url` was answered: forget its failures."""
        self._health.pop(normalize_url(url), None)

    # ------------------------------------------------------------------ learning
    def update(self, learnt: Iterable[str]) -> bool:
        """Replace the learnt endpoints; True if the set of known endpoints changed."""
        new = split_servers(learnt)
        if new == self._learnt:
            return False
        before = self._urls
        self._learnt = new
        self._urls = self._merge()
        self._health = {u: h for u, h in self._health.items() if u in self._urls}
        if self.current not in self._urls:
            self.current = self._urls[0]
        return self._urls != before


def _url(scheme: str, host: str, port: int) -> str:
    try:
        if ipaddress.ip_address(host).version == 6:
            host = f"[{host}]"
    except ValueError:
        pass  # a name
    return f"{scheme}://{host}:{port}"


def urls_from_endpoints(endpoints: Mapping[str, Any]) -> list[str]:
    """The server URLs an Endpoints object lists (each ready address at its port), in order,
    without duplicates. A subset's port named `http` is plain HTTP; any other is HTTPS; a
    subset with several ports uses the one named `https`, else the first."""
    out: dict[str, None] = {}
    subsets = endpoints.get("subsets")
    for subset in subsets if isinstance(subsets, list) else []:
        if not isinstance(subset, dict):
            continue
        ports = [p for p in subset.get("ports") or [] if isinstance(p, dict)]
        port = next((p for p in ports if p.get("name") == "https"), ports[0] if ports else None)
        if port is None or not isinstance(port.get("port"), int):
            continue
        scheme = "http" if port.get("name") == "http" else "https"
        for addr in subset.get("addresses") or []:
            ip = addr.get("ip") if isinstance(addr, dict) else None
            if isinstance(ip, str) and ip:
                out[_url(scheme, ip, port["port"])] = None
    return list(out)
