"""Field selectors, parsed and matched exactly like apimachinery does.

Pure code: no I/O, no clock. Every parsing problem is an `ApiError` 400 BadRequest.

Field selectors (`fields.ParseSelector`): comma-separated `field=value`, `field==value`,
`field!=value`; in values `\\`, `\\,` and `\\=` escape; a missing field reads as "". Which fields a
kind supports is the caller's business (`check_field_labels` with `Kind.field_labels`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from orchestrator.kube.errors import bad_request


@dataclass(frozen=True, slots=True)
class FieldRequirement:
    field: str
    operator: str  # "=" or "!="
    value: str  # unescaped

    def __str__(self) -> str:
        return f"{self.field}{self.operator}{escape_field_value(self.value)}"


@dataclass(frozen=True, slots=True)
class FieldSelector:
    """An AND of field requirements, sorted as apimachinery sorts the raw terms."""

    requirements: tuple[FieldRequirement, ...] = field(default=())

    def empty(self) -> bool:
        return not self.requirements

    def matches(self, getter: Callable[[str], str | None]) -> bool:
        """`getter(field)` gives the object's value for a field label; None reads as ""."""
        for r in self.requirements:
            have = getter(r.field) or ""
            if (have == r.value) != (r.operator == "="):
                return False
        return True

    def exact(self, field_name: str) -> str | None:
        """The value `field_name` must equal, if some requirement pins it (for index lookups)."""
        for r in self.requirements:
            if r.field == field_name and r.operator == "=":
                return r.value
        return None

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)


def escape_field_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")


def _unescape_field_value(s: str) -> str:
    out: list[str] = []
    in_slash = False
    for c in s:
        if in_slash:
            if c not in "\\,=":
                raise bad_request(f"invalid field selector: invalid escape sequence: \\{c}")
            out.append(c)
            in_slash = False
        elif c == "\\":
            in_slash = True
        elif c in ",=":
            raise bad_request(f"invalid field selector: unescaped character in value: {c}")
        else:
            out.append(c)
    if in_slash:
        raise bad_request("invalid field selector: invalid escape sequence: \\")
    return "".join(out)


def _split_terms(text: str) -> list[str]:
    terms: list[str] = []
    start = 0
    in_slash = False
    for i, c in enumerate(text):
        if in_slash:
            in_slash = False
        elif c == "\\":
            in_slash = True
        elif c == ",":
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    return terms


def parse_field_selector(text: str) -> FieldSelector:
    """`?fieldSelector=` → FieldSelector (empty text = everything)."""
    if not text:
        return FieldSelector()
    reqs: list[FieldRequirement] = []
    for part in sorted(_split_terms(text)):
        if not part:
            continue
        for i in range(len(part)):
            rest = part[i:]
            op = next((o for o in ("!=", "==", "=") if rest.startswith(o)), None)
            if op is not None:
                lhs, rhs = part[:i], part[i + len(op) :]
                break
        else:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        reqs.append(FieldRequirement(lhs, "!=" if op == "!=" else "=", _unescape_field_value(rhs)))
    return FieldSelector(tuple(reqs))


ALWAYS_SUPPORTED_FIELDS = frozenset({"metadata.name", "metadata.namespace"})


def check_field_labels(selector: FieldSelector, supported: Iterable[str]) -> None:
    """400 `field label not supported: X` for a field that is neither metadata.* nor `supported`."""
    allowed = ALWAYS_SUPPORTED_FIELDS | set(supported)
    for r in selector.requirements:
        if r.field not in allowed:
            raise bad_request(f"field label not supported: {r.field}")
