"""A tiny Prometheus registry: counters, gauges and histograms with labels, rendered as text.

Theory of operation
-------------------
A metric *family* (`Counter`, `Gauge`, `Histogram`) has a name, a help text and label names; it
holds one *child* per combination of label values, created on first use by `labels(...)`. A
family without label names is its own single child (`counter.inc()`). A `Registry` owns
families by name and renders them in the Prometheus text exposition format 0.0.4:

    # HELP workqueue_adds_total Total number of adds handled by workqueue
    # TYPE workqueue_adds_total counter
    workqueue_adds_total{name="pods"} 3

Label values are escaped (backslash, double quote, newline), help texts too (backslash,
newline). Histograms have fixed upper bounds; rendering emits *cumulative* `_bucket{le="..."}`
samples ending with `le="+Inf"`, then `_sum` and `_count`. A gauge child may instead get its
value from a function called at render time (`set_function`), for values that are a function of
time such as the work queue's "longest running processor".

Families are created with `Registry.counter/gauge/histogram`, which return the existing family
when one with the same name, type and labels is already registered (so every work queue can ask
for the shared `workqueue_*` families) and raise `ValueError` on a conflicting definition.
`REGISTRY` is the process-wide default. Everything is synchronous and meant for one thread (the
trio thread); nothing here does I/O — serving `render()` over HTTP belongs to a driver (the API
server's `/metrics`).

A leaf module: it imports nothing of the project, so every layer (Raft, store, API server,
controller runtime, scheduler, agent) can define its metrics here without importing another.
The metric families of one component live beside it (the work queue's in
`controllers.runtime.metrics`, the process and storage ones in `observability`).
"""

from __future__ import annotations

import bisect
import math
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Generic, TypeVar

__all__ = [
    "DEFAULT_BUCKETS",
    "REGISTRY",
    "Counter",
    "CounterChild",
    "Gauge",
    "GaugeChild",
    "Histogram",
    "HistogramChild",
    "Registry",
    "escape_label_value",
    "format_value",
]

DEFAULT_BUCKETS: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
"""The Prometheus client libraries' default histogram buckets (seconds)."""

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")


def format_value(value: float) -> str:
    """A sample value as Prometheus text: `+Inf`, `-Inf`, `NaN`, integers without `.0`."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def escape_label_value(value: str) -> str:
    """Escape a label value for the text format: backslash, double quote and newline."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _format_labels(pairs: Iterable[tuple[str, str]]) -> str:
    body = ",".join(f'{name}="{escape_label_value(value)}"' for name, value in pairs)
    return f"{{{body}}}" if body else ""


_Child = TypeVar("_Child")


class _Family(ABC, Generic[_Child]):
    """What the three metric types share: name, help, label names, children by label values."""

    type_name = ""

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()) -> None:
        if not _METRIC_NAME.match(name):
            raise ValueError(f"metric name {name!r} is not valid: use [a-zA-Z_:][a-zA-Z0-9_:]*")
        for label in labelnames:
            if not _LABEL_NAME.match(label) or label.startswith("__"):
                raise ValueError(
                    f"label name {label!r} of metric {name!r} is not valid: use "
                    "[a-zA-Z_][a-zA-Z0-9_]* not starting with '__'"
                )
        if len(set(labelnames)) != len(labelnames):
            raise ValueError(f"metric {name!r} repeats a label name: {list(labelnames)}")
        self.name = name
        self.help = help
        self.labelnames: tuple[str, ...] = tuple(labelnames)
        self._children: dict[tuple[str, ...], _Child] = {}

    @abstractmethod
    def _new_child(self) -> _Child: ...

    def labels(self, *values: str, **by_name: str) -> _Child:
        """The child for these label values (positional in `labelnames` order, or by name)."""
        if not by_name:
            child = self._children.get(values)  # the usual call: string values, seen before
            if child is not None:
                return child
        if values and by_name:
            raise ValueError(f"metric {self.name!r}: give label values by position or by name")
        if by_name:
            if set(by_name) != set(self.labelnames):
                raise ValueError(
                    f"metric {self.name!r} has labels {list(self.labelnames)}, "
                    f"got {sorted(by_name)}"
                )
            values = tuple(by_name[label] for label in self.labelnames)
        if len(values) != len(self.labelnames):
            raise ValueError(
                f"metric {self.name!r} has labels {list(self.labelnames)}, got {len(values)} values"
            )
        key = tuple(str(v) for v in values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._new_child()
        return child

    def remove(self, *values: str) -> None:
        """Drop the child for these label values (it is no longer rendered)."""
        self._children.pop(tuple(str(v) for v in values), None)

    def _only_child(self) -> _Child:
        if self.labelnames:
            raise ValueError(
                f"metric {self.name!r} has labels {list(self.labelnames)}: use .labels(...) first"
            )
        return self.labels()

    def _sorted_children(self) -> Iterator[tuple[tuple[tuple[str, str], ...], _Child]]:
        for key in sorted(self._children):
            yield tuple(zip(self.labelnames, key, strict=True)), self._children[key]

    @abstractmethod
    def _samples(self) -> Iterator[str]: ...

    def render(self) -> str:
        """This family in text format: HELP and TYPE lines, then one line per sample."""
        lines = [
            f"# HELP {self.name} {_escape_help(self.help)}",
            f"# TYPE {self.name} {self.type_name}",
            *self._samples(),
        ]
        return "\n".join(lines) + "\n"


class CounterChild:
    """One labelled counter: a value that only goes up (or, with `set_function`, a count kept
    elsewhere and read at render time, e.g. CPU seconds from /proc)."""

    def __init__(self) -> None:
        self._value = 0.0
        self._function: Callable[[], float] | None = None

    @property
    def value(self) -> float:
        return self._function() if self._function is not None else self._value

    def inc(self, amount: float = 1.0) -> None:
        if not amount >= 0:
            raise ValueError(f"a counter only goes up: inc({amount!r})")
        self._value += amount

    def set_function(self, function: Callable[[], float]) -> None:
        """Read the value by calling `function` at render time (it must never go down)."""
        self._function = function


class Counter(_Family[CounterChild]):
    """A monotonically increasing count (name it `..._total`)."""

    type_name = "counter"

    def _new_child(self) -> CounterChild:
        return CounterChild()

    def inc(self, amount: float = 1.0) -> None:
        self._only_child().inc(amount)

    def set_function(self, function: Callable[[], float]) -> None:
        self._only_child().set_function(function)

    def _samples(self) -> Iterator[str]:
        for labels, child in self._sorted_children():
            yield f"{self.name}{_format_labels(labels)} {format_value(child.value)}"


class GaugeChild:
    """One labelled gauge: a value set directly or computed by a function at render time."""

    def __init__(self) -> None:
        self._value = 0.0
        self._function: Callable[[], float] | None = None

    @property
    def value(self) -> float:
        return self._function() if self._function is not None else self._value

    def set(self, value: float) -> None:
        self._function = None
        self._value = float(value)

    def inc(self, amount: float = 1.0) -> None:
        self.set(self.value + amount)

    def dec(self, amount: float = 1.0) -> None:
        self.set(self.value - amount)

    def set_function(self, function: Callable[[], float]) -> None:
        """Compute the value by calling `function` whenever it is read (at render time)."""
        self._function = function


class Gauge(_Family[GaugeChild]):
    """A value that goes up and down."""

    type_name = "gauge"

    def _new_child(self) -> GaugeChild:
        return GaugeChild()

    def set(self, value: float) -> None:
        self._only_child().set(value)

    def inc(self, amount: float = 1.0) -> None:
        self._only_child().inc(amount)

    def dec(self, amount: float = 1.0) -> None:
        self._only_child().dec(amount)

    def set_function(self, function: Callable[[], float]) -> None:
        self._only_child().set_function(function)

    def _samples(self) -> Iterator[str]:
        for labels, child in self._sorted_children():
            yield f"{self.name}{_format_labels(labels)} {format_value(child.value)}"


class HistogramChild:
    """One labelled histogram: per-bucket counts (not cumulative), sum and count."""

    def __init__(self, upper_bounds: tuple[float, ...]) -> None:
        self.upper_bounds = upper_bounds  # sorted, ends with +Inf
        self.bucket_counts = [0] * len(upper_bounds)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        # The first bucket whose upper bound is >= value ("le" = less than or equal).
        self.bucket_counts[bisect.bisect_left(self.upper_bounds, value)] += 1
        self.sum += value
        self.count += 1

    def observe_many(self, value: float, n: int) -> None:
        """`n` observations of the same value (e.g. every proposal of one batch)."""
        self.bucket_counts[bisect.bisect_left(self.upper_bounds, value)] += n
        self.sum += value * n
        self.count += n

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations <= bound) for every bucket, ending with +Inf."""
        out: list[tuple[float, int]] = []
        total = 0
        for bound, n in zip(self.upper_bounds, self.bucket_counts, strict=True):
            total += n
            out.append((bound, total))
        return out


class Histogram(_Family[HistogramChild]):
    """Observations counted into fixed buckets (upper bounds, `+Inf` added), with sum and count."""

    type_name = "histogram"

    def __init__(
        self,
        name: str,
        help: str,
        labelnames: Sequence[str] = (),
        buckets: Sequence[float] = DEFAULT_BUCKETS,
    ) -> None:
        if "le" in labelnames:
            raise ValueError(f"histogram {name!r} cannot have a label named 'le' (used by buckets)")
        super().__init__(name, help, labelnames)
        bounds = sorted(float(b) for b in buckets)
        if any(math.isnan(b) for b in bounds) or len(set(bounds)) != len(bounds):
            raise ValueError(f"histogram {name!r}: buckets must be distinct numbers: {buckets!r}")
        if not bounds or bounds[-1] != math.inf:
            bounds.append(math.inf)
        self.upper_bounds: tuple[float, ...] = tuple(bounds)

    def _new_child(self) -> HistogramChild:
        return HistogramChild(self.upper_bounds)

    def observe(self, value: float) -> None:
        self._only_child().observe(value)

    def _samples(self) -> Iterator[str]:
        for labels, child in self._sorted_children():
            for bound, total in child.cumulative():
                le = _format_labels((*labels, ("le", format_value(bound))))
                yield f"{self.name}_bucket{le} {total}"
            yield f"{self.name}_sum{_format_labels(labels)} {format_value(child.sum)}"
            yield f"{self.name}_count{_format_labels(labels)} {child.count}"


_F = TypeVar("_F", Counter, Gauge, Histogram)


class Registry:
    """Metric families by name, rendered together in the text exposition format 0.0.4."""

    CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

    def __init__(self) -> None:
        self._families: dict[str, Counter | Gauge | Histogram] = {}

    def register(self, family: _F) -> _F:
        """Add a family; `ValueError` if the name is taken."""
        if family.name in self._families:
            raise ValueError(f"a metric named {family.name!r} is already registered")
        self._families[family.name] = family
        return family

    def _get_or_register(self, family: _F) -> _F:
        existing = self._families.get(family.name)
        if existing is None:
            return self.register(family)
        same = type(existing) is type(family) and existing.labelnames == family.labelnames
        if same and isinstance(existing, Histogram) and isinstance(family, Histogram):
            same = existing.upper_bounds == family.upper_bounds
        if not same or not isinstance(existing, type(family)):
            raise ValueError(
                f"metric {family.name!r} is already registered as a {existing.type_name} with "
                f"labels {list(existing.labelnames)}; cannot redefine it as a {family.type_name} "
                f"with labels {list(family.labelnames)} (or other buckets)"
            )
        return existing

    def counter(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Counter:
        """The counter `name`, created on first call."""
        return self._get_or_register(Counter(name, help, labelnames))

    def gauge(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Gauge:
        """The gauge `name`, created on first call."""
        return self._get_or_register(Gauge(name, help, labelnames))

    def histogram(
        self,
        name: str,
        help: str,
        labelnames: Sequence[str] = (),
        buckets: Sequence[float] = DEFAULT_BUCKETS,
    ) -> Histogram:
        """The histogram `name`, created on first call."""
        return self._get_or_register(Histogram(name, help, labelnames, buckets))

    def get(self, name: str) -> Counter | Gauge | Histogram | None:
        return self._families.get(name)

    def unregister(self, name: str) -> None:
        self._families.pop(name, None)

    def render(self) -> str:
        """Every family, sorted by name, in the text exposition format."""
        return "".join(self._families[name].render() for name in sorted(self._families))


REGISTRY = Registry()
"""The process-wide default registry."""
