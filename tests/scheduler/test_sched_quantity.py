"""Kubernetes quantity parsing: exact values, rounding up to milli-units and units, errors."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.scheduler import parse_cpu_milli, parse_quantity, parse_value


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("1", 1),
        ("100m", Fraction(1, 10)),
        ("0.5", Fraction(1, 2)),
        (".5", Fraction(1, 2)),
        ("1.", 1),
        ("+2", 2),
        ("-1", -1),
        ("1.5", Fraction(3, 2)),
        ("128Mi", 128 * 2**20),
        ("1Gi", 2**30),
        ("1.5Gi", 3 * 2**29),
        ("1Ki", 1024),
        ("2Ti", 2 * 2**40),
        ("1Pi", 2**50),
        ("1Ei", 2**60),
        ("2k", 2000),
        ("1M", 10**6),
        ("1G", 10**9),
        ("1T", 10**12),
        ("1P", 10**15),
        ("1E", 10**18),
        ("1n", Fraction(1, 10**9)),
        ("1u", Fraction(1, 10**6)),
        ("1e3", 1000),
        ("1E3", 1000),
        ("1e+3", 1000),
        ("1e-3", Fraction(1, 1000)),
        ("2.5e2", 250),
        (1, 1),
        (0.25, Fraction(1, 4)),
    ],
)
def test_parse_quantity(text: str | int | float, value: Fraction | int) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ",
        "1 ",
        " 1",
        "abc",
        "1.2.3",
        "1KB",
        "1kb",
        "1mi",
        "1K",
        "Mi",
        ".",
        "1e",
        "e3",
        "1e3.5",
        "--1",
        "1_000",
        "\u0661",  # an Arabic-Indic digit: not a digit for Kubernetes
        "1e99999",
        "9" * 200,
        True,
        None,
        float("nan"),
        float("inf"),
        [],
    ],
)
def test_invalid_quantities_raise_value_error(text: object) -> None:
    with pytest.raises(ValueError, match="invalid quantity"):
        parse_quantity(text)  # type: ignore[arg-type]  # deliberately wrong types too


@pytest.mark.parametrize(
    ("text", "milli"),
    [
        ("100m", 100),
        ("0.5", 500),
        ("1", 1000),
        ("2", 2000),
        ("0.1m", 1),
        ("1n", 1),
        ("250m", 250),
        ("1e-3", 1),
        (3, 3000),
        ("0", 0),
        ("1k", 1_000_000),
    ],
)
def test_cpu_milli_rounds_up(text: str | int, milli: int) -> None:
    assert parse_cpu_milli(text) == milli


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("128Mi", 134217728),
        ("1Gi", 1073741824),
        ("1k", 1000),
        ("500m", 1),
        ("1.5", 2),
        ("1e3", 1000),
        (7, 7),
        ("0", 0),
        ("100M", 10**8),
    ],
)
def test_value_rounds_up(text: str | int, value: int) -> None:
    assert parse_value(text) == value


def test_parse_errors_name_the_text() -> None:
    with pytest.raises(ValueError, match="'12Q'"):
        parse_cpu_milli("12Q")
    with pytest.raises(ValueError, match="'x'"):
        parse_value("x")


@given(
    st.integers(min_value=0, max_value=10**12),
    st.sampled_from(["", "k", "M", "G", "Ki", "Mi", "Gi", "m", "e2", "e-2"]),
)
def test_integer_with_suffix_scales_exactly(n: int, suffix: str) -> None:
    scale = {
        "": 1, "k": 10**3, "M": 10**6, "G": 10**9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30,
        "m": Fraction(1, 1000), "e2": 100, "e-2": Fraction(1, 100),
    }[suffix]  # fmt: skip
    assert isinstance(scale, int | Fraction)
    assert parse_quantity(f"{n}{suffix}") == n * scale
    assert parse_cpu_milli(f"{n}{suffix}") * Fraction(1, 1000) >= n * scale


@given(st.decimals(min_value=0, max_value=10**6, places=3, allow_nan=False))
def test_decimal_strings_round_trip(d: object) -> None:
    text = str(d)
    assert parse_cpu_milli(text) == int(Fraction(text) * 1000)
