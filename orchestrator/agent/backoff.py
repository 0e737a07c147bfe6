"""Back-off for restarting containers and retrying pulls (pure), and its Go-style durations.

Back-off (`Backoff`, pure, as the kubelet's flowcontrol.Backoff keyed by container): the first
restart is immediate and arms 10 s; while `now - finishedAt < delay` the container waits with
reason CrashLoopBackOff and message `back-off 10s restarting failed container=...`; each
restart after that doubles the delay up to 300 s; an entry idle for more than 10 min (the
container ran that long) starts again at 10 s. Image pulls and create errors back off the same
way (ImagePullBackOff).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Backoff", "go_duration"]


def go_duration(seconds: float) -> str:
    """Go's time.Duration text for the values back-offs take: 10s, 2m40s, 5m0s, 100ms."""
    if seconds < 1:
        ms = round(seconds * 1000)
        return f"{ms}ms"
    whole = round(seconds, 3)
    minutes, secs = divmod(whole, 60)
    hours, minutes = divmod(int(minutes), 60)
    sec_text = f"{secs:g}s"
    if hours:
        return f"{hours}h{minutes}m{sec_text}"
    if minutes:
        return f"{minutes}m{sec_text}"
    return sec_text


@dataclass(slots=True)
class _Entry:
    delay: float
    last: float  # event time of the last `next`


class Backoff:
    """kubelet's per-key exponential back-off (flowcontrol.Backoff), pure: times are passed in.

    `in_backoff_since(key, event, now)`: is `now` still within the delay after `event` (e.g. the
    container's finishedAt)? `next(key, event)`: arm the next delay (initial, or double up to
    `maximum`; back to initial when the entry has been idle for more than `reset`)."""

    def __init__(self, initial: float, maximum: float, reset: float) -> None:
        self.initial, self.maximum, self.reset = initial, maximum, reset
        self._entries: dict[str, _Entry] = {}

    def get(self, key: str) -> float:
        e = self._entries.get(key)
        return e.delay if e else 0.0

    def in_backoff_since(self, key: str, event: float, now: float) -> bool:
        e = self._entries.get(key)
        if e is None or event - e.last > self.reset:
            return False
        return now - event < e.delay

    def next(self, key: str, event: float) -> float:
        e = self._entries.get(key)
        if e is None or event - e.last > self.reset:
            e = self._entries[key] = _Entry(self.initial, event)
        else:
            e.delay, e.last = min(e.delay * 2, self.maximum), event
        return e.delay

    def forget(self, key: str) -> None:
        self._entries.pop(key, None)
