"""Kubernetes resource quantities ("500m", "128Mi", "1e3", "2k") as exact numbers.

Theory of operation: a quantity is a signed decimal number followed by one suffix, as in
apimachinery's `resource.Quantity`::

    <quantity> ::= <sign><digits>[.<digits>]<suffix>      ("1", "0.5", ".5", "1.", "+2")
    <suffix>   ::= Ki | Mi | Gi | Ti | Pi | Ei             (binary, powers of 1024)
                 | n | u | m | "" | k | M | G | T | P | E   (decimal SI)
                 | e<sign><digits> | E<sign><digits>       (decimal exponent: "1e3" = 1000)

`parse_quantity` returns the exact value as a `Fraction` (no float rounding). The scheduler
counts in integers: CPU in milli-cores (`parse_cpu_milli`) and everything else in whole units,
bytes for memory (`parse_value`). Both round *up*, as `Quantity.MilliValue()`/`Value()` do, so
"0.1m" of CPU reserves 1 milli-core rather than nothing. JSON numbers (an int or float in the
object) are accepted too, since the API stores int-or-string. Anything else is a `ValueError`
that quotes the offending text.

The parse functions are memoised: a cluster uses a handful of distinct quantity strings, and
the scheduler parses the same template's requests for every replica.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from functools import lru_cache

__all__ = ["parse_cpu_milli", "parse_quantity", "parse_value"]

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}

_QUANTITY_RE = re.compile(
    r"(?P<sign>[+-]?)(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?P<suffix>[eE][+-]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]?)"
)

# Upstream caps quantities far below this; the limit only keeps "1e999999999" from building a
# number with a billion digits.
_MAX_EXPONENT = 1000
_MAX_LENGTH = 128
_TEN = Fraction(10)


def parse_quantity(text: str | int | float) -> Fraction:
    """The exact value of a quantity: `parse_quantity("1.5Gi") == 1610612736`.

    Raises `ValueError` for anything that is not a Kubernetes quantity (empty, spaces,
    unknown suffix, "1.2.3", a bool, NaN or infinity).
    """
    if isinstance(text, bool):
        raise ValueError(f"invalid quantity {text!r}: expected a string like '500m' or '128Mi'")
    if isinstance(text, int):
        return Fraction(text)
    if isinstance(text, float):
        if not math.isfinite(text):
            raise ValueError(f"invalid quantity {text!r}: not a finite number")
        return Fraction(text)
    if not isinstance(text, str):
        raise ValueError(f"invalid quantity {text!r}: expected a string like '500m' or '128Mi'")
    return _parse_string(text)


@lru_cache(maxsize=4096)
def _parse_string(text: str) -> Fraction:
    match = _QUANTITY_RE.fullmatch(text) if len(text) <= _MAX_LENGTH else None
    if match is None:
        raise ValueError(
            f"invalid quantity {text!r}: expected a number with an optional suffix "
            "(m, k, M, G, Ki, Mi, Gi, e3, ...), e.g. '500m' or '128Mi'"
        )
    value = Fraction(match["num"])
    if match["sign"] == "-":
        value = -value
    suffix = match["suffix"]
    if suffix in _BINARY:
        return value * (1 << (10 * _BINARY[suffix]))
    if suffix in _DECIMAL:
        exponent = _DECIMAL[suffix]
    else:
        exponent = int(suffix[1:])
        if abs(exponent) > _MAX_EXPONENT:
            raise ValueError(f"invalid quantity {text!r}: exponent out of range")
    return value * _TEN**exponent


def _ceil(value: Fraction) -> int:
    return -((-value.numerator) // value.denominator)


@lru_cache(maxsize=4096)
def _cpu_milli_string(text: str) -> int:
    return _ceil(_parse_string(text) * 1000)


@lru_cache(maxsize=4096)
def _value_string(text: str) -> int:
    return _ceil(_parse_string(text))


def parse_cpu_milli(text: str | int | float) -> int:
    """Milli-units, rounded up: "100m" → 100, "0.5" → 500, "2" → 2000, "0.1m" → 1."""
    if isinstance(text, str):
        return _cpu_milli_string(text)
    return _ceil(parse_quantity(text) * 1000)


def parse_value(text: str | int | float) -> int:
    """Whole units, rounded up: "128Mi" → 134217728, "1k" → 1000, "500m" → 1."""
    if isinstance(text, str):
        return _value_string(text)
    return _ceil(parse_quantity(text))
