"""The Prometheus text registry: output parses, escaping, cumulative histograms, get-or-create."""

from __future__ import annotations

import math
import re

import pytest

from orchestrator.controllers.runtime.metrics import WORKQUEUE_DURATION_BUCKETS, WorkqueueMetrics
from orchestrator.metrics import (
    REGISTRY,
    Counter,
    Gauge,
    Histogram,
    Registry,
    escape_label_value,
    format_value,
)

Sample = tuple[str, dict[str, str], float]

_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)\Z")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|\Z)')


def _unescape(value: str) -> str:
    out = []
    chars = iter(value)
    for c in chars:
        if c == "\\":
            nxt = next(chars)
            out.append({"n": "\n", "\\": "\\", '"': '"'}[nxt])
        else:
            out.append(c)
    return "".join(out)


def _parse_value(text: str) -> float:
    return {"+Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}.get(text) or float(text)


def parse(text: str) -> tuple[dict[str, tuple[str, str]], list[Sample]]:
    """A strict little parser for the text format 0.0.4: ({family: (type, help)}, samples)."""
    assert text.endswith("\n")
    families: dict[str, tuple[str, str]] = {}
    helps: dict[str, str] = {}
    samples: list[Sample] = []
    for line in text[:-1].split("\n"):
        if line.startswith("# HELP "):
            name, _, help_text = line[len("# HELP ") :].partition(" ")
            helps[name] = _unescape(help_text)
        elif line.startswith("# TYPE "):
            name, _, type_name = line[len("# TYPE ") :].partition(" ")
            assert type_name in {"counter", "gauge", "histogram", "summary", "untyped"}
            assert name not in families, f"TYPE twice for {name}"
            families[name] = (type_name, helps[name])
        else:
            m = _SAMPLE.match(line)
            assert m, f"not a sample line: {line!r}"
            name, _, body, value = m.groups()
            labels: dict[str, str] = {}
            pos = 0
            while body and pos < len(body):
                lm = _LABEL.match(body, pos)
                assert lm, f"bad labels in {line!r} at {body[pos:]!r}"
                labels[lm.group(1)] = _unescape(lm.group(2))
                pos = lm.end()
            family = re.sub(r"_(bucket|sum|count)\Z", "", name)
            assert name in families or family in families, f"sample {name} before its TYPE"
            samples.append((name, labels, _parse_value(value)))
    return families, samples


def values(samples: list[Sample], name: str) -> list[tuple[dict[str, str], float]]:
    return [(labels, v) for n, labels, v in samples if n == name]


def test_counter_gauge_render_and_parse() -> None:
    reg = Registry()
    c = reg.counter("requests_total", "Requests served.", ["code", "method"])
    c.labels("200", "GET").inc()
    c.labels(code="200", method="GET").inc(2)
    c.labels("500", "POST").inc()
    g = reg.gauge("temperature", "Current temperature.")
    g.set(21.5)
    g.dec(0.5)
    text = reg.render()
    families, samples = parse(text)
    assert families == {
        "requests_total": ("counter", "Requests served."),
        "temperature": ("gauge", "Current temperature."),
    }
    assert values(samples, "requests_total") == [
        ({"code": "200", "method": "GET"}, 3.0),
        ({"code": "500", "method": "POST"}, 1.0),
    ]
    assert values(samples, "temperature") == [({}, 21.0)]
    assert 'requests_total{code="200",method="GET"} 3\n' in text
    assert "temperature 21\n" in text


def test_label_values_and_help_are_escaped() -> None:
    reg = Registry()
    c = reg.counter("odd_total", 'Help with a \\ backslash\nand a newline and "quotes".', ["v"])
    nasty = 'a"b\\c\nd}e,f="g'
    c.labels(nasty).inc()
    text = reg.render()
    assert '# HELP odd_total Help with a \\\\ backslash\\nand a newline and "quotes".\n' in text
    assert 'odd_total{v="a\\"b\\\\c\\nd}e,f=\\"g"} 1\n' in text
    families, samples = parse(text)
    assert families["odd_total"][1] == 'Help with a \\ backslash\nand a newline and "quotes".'
    assert values(samples, "odd_total") == [({"v": nasty}, 1.0)]
    assert escape_label_value("plain") == "plain"


def test_histogram_buckets_are_cumulative() -> None:
    reg = Registry()
    h = reg.histogram("latency_seconds", "Latency.", ["op"], buckets=[1.0, 0.1, 10.0])
    child = h.labels("get")
    for v in (0.05, 0.1, 0.5, 2.0, 20.0, 0.0):
        child.observe(v)
    _, samples = parse(reg.render())
    buckets = values(samples, "latency_seconds_bucket")
    assert buckets == [
        ({"op": "get", "le": "0.1"}, 3.0),  # 0.0, 0.05, 0.1 (le is inclusive)
        ({"op": "get", "le": "1"}, 4.0),
        ({"op": "get", "le": "10"}, 5.0),
        ({"op": "get", "le": "+Inf"}, 6.0),
    ]
    counts = [v for _, v in buckets]
    assert counts == sorted(counts)
    assert values(samples, "latency_seconds_count") == [({"op": "get"}, 6.0)]
    assert values(samples, "latency_seconds_sum")[0][1] == pytest.approx(22.65)


def test_histogram_without_labels_and_with_explicit_inf() -> None:
    h = Histogram("h", "H.", buckets=[1.0, math.inf])
    assert h.upper_bounds == (1.0, math.inf)
    h.observe(5.0)
    text = h.render()
    assert 'h_bucket{le="1"} 0\nh_bucket{le="+Inf"} 1\nh_sum 5\nh_count 1\n' in text


def test_gauge_function_is_called_at_render_time() -> None:
    reg = Registry()
    g = reg.gauge("now_seconds", "Now.", ["name"])
    t = [1.0]
    g.labels("a").set_function(lambda: t[0])
    assert 'now_seconds{name="a"} 1\n' in reg.render()
    t[0] = 2.5
    assert 'now_seconds{name="a"} 2.5\n' in reg.render()
    g.labels("a").set(7)  # set replaces the function
    t[0] = 9.0
    assert 'now_seconds{name="a"} 7\n' in reg.render()


def test_empty_family_renders_help_and_type_only() -> None:
    reg = Registry()
    reg.counter("nothing_total", "Nothing yet.", ["x"])
    assert reg.render() == "# HELP nothing_total Nothing yet.\n# TYPE nothing_total counter\n"


def test_value_formatting() -> None:
    assert format_value(3.0) == "3"
    assert format_value(0.25) == "0.25"
    assert format_value(1e-8) == "1e-08"
    assert format_value(math.inf) == "+Inf"
    assert format_value(-math.inf) == "-Inf"
    assert format_value(math.nan) == "NaN"
    assert format_value(1e20) == "1e+20"


def test_registry_get_or_create_and_conflicts() -> None:
    reg = Registry()
    c = reg.counter("x_total", "X.", ["a"])
    assert reg.counter("x_total", "X again.", ["a"]) is c
    with pytest.raises(ValueError, match="already registered as a counter"):
        reg.gauge("x_total", "X.", ["a"])
    with pytest.raises(ValueError, match="already registered"):
        reg.counter("x_total", "X.", ["b"])
    reg.histogram("h", "H.", buckets=[1.0])
    with pytest.raises(ValueError, match="buckets"):
        reg.histogram("h", "H.", buckets=[2.0])
    with pytest.raises(ValueError, match="already registered"):
        reg.register(Counter("x_total", "X."))
    assert reg.get("x_total") is c
    reg.unregister("x_total")
    assert reg.get("x_total") is None


def test_invalid_definitions_and_uses() -> None:
    with pytest.raises(ValueError, match="metric name"):
        Counter("bad-name", "")
    with pytest.raises(ValueError, match="label name"):
        Counter("ok", "", ["bad-label"])
    with pytest.raises(ValueError, match="label name"):
        Counter("ok", "", ["__reserved"])
    with pytest.raises(ValueError, match="repeats"):
        Counter("ok", "", ["a", "a"])
    with pytest.raises(ValueError, match="'le'"):
        Histogram("ok", "", ["le"])
    with pytest.raises(ValueError, match="distinct"):
        Histogram("ok", "", buckets=[1.0, 1.0])
    c = Counter("ok_total", "", ["a"])
    with pytest.raises(ValueError, match="only goes up"):
        c.labels("x").inc(-1)
    with pytest.raises(ValueError, match=r"use \.labels"):
        c.inc()
    with pytest.raises(ValueError, match="has labels"):
        c.labels("x", "y")
    with pytest.raises(ValueError, match="has labels"):
        c.labels(b="x")
    with pytest.raises(ValueError, match="by position or by name"):
        c.labels("x", a="x")


def test_label_values_name_one_child_however_given() -> None:
    c = Counter("seen_total", "", ["code", "kind"])
    first = c.labels("200", "pod")
    assert c.labels("200", "pod") is first  # the remembered fast path
    assert c.labels(200, "pod") is first  # type: ignore[arg-type]  # values are strings
    assert c.labels(kind="pod", code="200") is first
    with pytest.raises(ValueError, match="has labels"):
        c.labels("200")  # a short tuple never matches a child


def test_remove_child() -> None:
    g = Gauge("g", "G.", ["a"])
    g.labels("x").set(1)
    g.remove("x")
    assert g.render() == "# HELP g G.\n# TYPE g gauge\n"


def test_workqueue_families_and_default_registry() -> None:
    reg = Registry()
    first = WorkqueueMetrics(reg)
    second = WorkqueueMetrics(reg)  # a second queue shares the families
    assert first.adds is second.adds
    families, _ = parse(reg.render())
    assert families.keys() == {
        "workqueue_depth",
        "workqueue_adds_total",
        "workqueue_queue_duration_seconds",
        "workqueue_work_duration_seconds",
        "workqueue_unfinished_work_seconds",
        "workqueue_longest_running_processor_seconds",
        "workqueue_retries_total",
    }
    assert families["workqueue_queue_duration_seconds"][0] == "histogram"
    assert WORKQUEUE_DURATION_BUCKETS[0] == pytest.approx(1e-8)
    assert WORKQUEUE_DURATION_BUCKETS[-1] == pytest.approx(10.0)
    assert len(WORKQUEUE_DURATION_BUCKETS) == 10
    assert isinstance(REGISTRY, Registry)
