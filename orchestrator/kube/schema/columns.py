"""Helpers for Table cells: kubectl's human durations, timestamps, and the generic columns.

`human_duration` follows apimachinery's `duration.HumanDuration` so `Age` reads exactly as it does
against a real cluster ("10s", "5m", "3h5m", "3d", "2y"). Cells are computed on the server (a Table
is printed verbatim by kubectl), so every cell function takes `now` as an argument.
"""

from __future__ import annotations

import datetime as dt
import functools

from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.kind import Column

NONE = "<none>"


def now_rfc3339(now: float) -> str:
    return _rfc3339_second(int(now))


@functools.lru_cache(maxsize=64)
def _rfc3339_second(second: int) -> str:
    # Every write stamps the current second (often several times): format each second once.
    return dt.datetime.fromtimestamp(second, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str) -> float | None:
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except (ValueError, AttributeError, TypeError):
        return None


def human_duration(seconds: float) -> str:
    """apimachinery HumanDuration: `<invalid>` for the far future, else the two largest units."""
    if seconds < -1:
        return "<invalid>"
    s = max(int(seconds), 0)
    if s < 60 * 2:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        rem = s % 60
        return f"{minutes}m{rem}s" if rem else f"{minutes}m"
    if minutes < 60 * 3:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        rem = (s % 3600) // 60
        return f"{hours}h{rem}m" if rem else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rem = hours % 24
        return f"{hours // 24}d{rem}h" if rem else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y{days}d" if days else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"


def age_of(timestamp: str | None, now: float) -> str:
    if not timestamp:
        return "<unknown>"
    t = parse_rfc3339(timestamp)
    return "<unknown>" if t is None else human_duration(now - t)


def name_cell(obj: Obj, now: float) -> str:
    return str(obj.get("metadata", {}).get("name", ""))


def age_cell(obj: Obj, now: float) -> str:
    return age_of(obj.get("metadata", {}).get("creationTimestamp"), now)


NAME = Column("Name", "string", "Name must be unique within a namespace.", name_cell, format="name")
AGE = Column(
    "Age",
    "string",
    "Time since the object was created (metadata.creationTimestamp).",
    age_cell,
)
