"""Label selectors, parsed and matched exactly like apimachinery does (`labels.Parse`).

Pure code: no I/O, no clock. Every parsing or validation problem is an `ApiError` 400 BadRequest
(never another exception), with apimachinery's wording so kubectl users see familiar messages.

Label selectors (`labels.Parse`): a comma-separated AND of requirements

    key            exists            !key              does not exist
    key=v, key==v  equals            key!=v            not equal (or absent)
    key in (a,b)   one of            key notin (a,b)   none of (or absent)
    key>1, key<1   integer compare (apimachinery extension; absent or non-integer never matches)

Theory of operation: a small lexer (identifiers are runs of anything but whitespace and the
special symbols `=!(),<>`; the longest known operator wins among runs of special symbols; `in` and
`notin` are keywords only where an operator is expected) feeds a recursive-descent parser that
mirrors `apimachinery/pkg/labels/selector.go` branch for branch, including its quirks: `a=` means
"value is empty", `a in ()` means "value is empty", `(,x)` adds the empty value.

Invariants: a `LabelSelector` holds its requirements sorted by key (stable, as apimachinery), each
with its values sorted and deduplicated; `==` is normalised to `=`; so `str(sel)` is a normal form
and `parse_label_selector(str(sel)) == sel`. The empty selector matches everything;
`LabelSelector.nothing()` (from a nil metav1.LabelSelector) matches nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.kube.errors import ApiError, Cause, bad_request

# -------------------------------------------------------------------------------------------------
# Validation of label keys and values (apimachinery util/validation)

_NAME_FMT = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_NAME_RE = re.compile(f"^{_NAME_FMT}$")
_VALUE_FMT = f"({_NAME_FMT})?"
_VALUE_RE = re.compile(f"^{_VALUE_FMT}$")
_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN_RE = re.compile(rf"^{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*$")

_NAME_MSG = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
    "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
    f"validation is '{_NAME_FMT}')"
)
_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  "
    f"or '12345', regex used for validation is '{_VALUE_FMT}')"
)
_PREFIX_MSG = (
    "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
    "characters, '-' or '.', and must start and end with an alphanumeric character (e.g. "
    "'example.com', regex used for validation is "
    f"'{_DNS1123_LABEL}(\\.{_DNS1123_LABEL})*')"
)


def label_key_errors(key: str) -> list[str]:
    """Problems with a label key (a qualified name: optional DNS-subdomain prefix + "/" + name)."""
    errs: list[str] = []
    parts = key.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errs.append("prefix part must be non-empty")
        elif len(prefix) > 253:
            errs.append("prefix part must be no more than 253 characters")
        elif not _DNS1123_SUBDOMAIN_RE.match(prefix):
            errs.append(_PREFIX_MSG)
    else:
        return [
            "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and "
            "must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  "
            f"or '123-abc', regex used for validation is '{_NAME_FMT}') with an optional DNS "
            "subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > 63:
        errs.append("name part must be no more than 63 characters")
    elif not _NAME_RE.match(name):
        errs.append(_NAME_MSG)
    return errs


def label_value_errors(value: str) -> list[str]:
    """Problems with a label value: "" or <= 63 chars of [-A-Za-z0-9_.], alnum at both ends."""
    errs: list[str] = []
    if len(value) > 63:
        errs.append("must be no more than 63 characters")
    if not _VALUE_RE.match(value):
        errs.append(_VALUE_MSG)
    return errs


def _quote(s: str) -> str:
    """Go's %q, close enough for messages."""
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _invalid(path: str, value: str, msgs: list[str]) -> str:
    return f"{path}: Invalid value: {_quote(value)}: {'; '.join(msgs)}"


# -------------------------------------------------------------------------------------------------
# Label selectors

EXISTS = "exists"
DOES_NOT_EXIST = "!"
EQUALS = "="
NOT_EQUALS = "!="
IN = "in"
NOT_IN = "notin"
GREATER_THAN = ">"
LESS_THAN = "<"
_OPERATORS = frozenset(
    {EXISTS, DOES_NOT_EXIST, EQUALS, NOT_EQUALS, IN, NOT_IN, GREATER_THAN, LESS_THAN}
)


_INT_RE = re.compile(r"[+-]?[0-9]{1,19}")


def _int64(text: str) -> int | None:
    """Go's strconv.ParseInt(text, 10, 64), or None."""
    if not _INT_RE.fullmatch(text):
        return None
    n = int(text)
    return n if -(2**63) <= n < 2**63 else None


@dataclass(frozen=True, slots=True)
class Requirement:
    """One label requirement; build with `requirement()` to get validation and normal form."""

    key: str
    operator: str  # one of EXISTS, DOES_NOT_EXIST, EQUALS, NOT_EQUALS, IN, NOT_IN, >, <
    values: tuple[str, ...] = ()  # sorted, deduplicated

    def matches(self, labels: Mapping[str, str]) -> bool:
        op = self.operator
        present = self.key in labels
        if op == EXISTS:
            return present
        if op == DOES_NOT_EXIST:
            return not present
        if op in (EQUALS, IN):
            return present and labels[self.key] in self.values
        if op in (NOT_EQUALS, NOT_IN):
            return not present or labels[self.key] not in self.values
        # GREATER_THAN / LESS_THAN: both sides must be integers.
        if not present:
            return False
        have = _int64(labels[self.key])
        want = _int64(self.values[0])
        if have is None or want is None:
            return False
        return have > want if op == GREATER_THAN else have < want

    def __str__(self) -> str:
        op = self.operator
        if op == EXISTS:
            return self.key
        if op == DOES_NOT_EXIST:
            return f"!{self.key}"
        if op in (IN, NOT_IN):
            return f"{self.key} {op} ({','.join(self.values)})"
        return f"{self.key}{op}{self.values[0]}"


def requirement(key: str, operator: str, values: Iterable[str] = (), path: str = "") -> Requirement:
    """labels.NewRequirement: validate and normalise (values sorted; `==` becomes `=`)."""
    if operator == "==":
        operator = EQUALS
    vals = tuple(sorted(set(values)))
    prefix = f"{path}." if path else ""
    if operator not in _OPERATORS:
        raise bad_request(f"{prefix}operator: Unsupported value: {_quote(operator)}")
    key_errs = label_key_errors(key)
    if key_errs:
        raise bad_request(_invalid(f"{prefix}key", key, key_errs))
    n = len(vals)
    if operator in (IN, NOT_IN) and n == 0:
        raise bad_request(
            f"{prefix}values: Invalid value: []: for 'in', 'notin' operators, "
            "values set can't be empty"
        )
    if operator in (EQUALS, NOT_EQUALS) and n != 1:
        raise bad_request(
            f"{prefix}values: Invalid value: [{','.join(vals)}]: exact-match compatibility "
            "requires one single value"
        )
    if operator in (EXISTS, DOES_NOT_EXIST) and n != 0:
        raise bad_request(
            f"{prefix}values: Invalid value: [{','.join(vals)}]: values set must be empty for "
            "exists and does not exist"
        )
    if operator in (GREATER_THAN, LESS_THAN):
        if n != 1:
            raise bad_request(
                f"{prefix}values: Invalid value: [{','.join(vals)}]: for 'Gt', 'Lt' operators, "
                "exactly one value is required"
            )
        if _int64(vals[0]) is None:
            raise bad_request(
                f"{prefix}values[0]: Invalid value: {_quote(vals[0])}: for 'Gt', 'Lt' operators, "
                "the value must be an integer"
            )
    for i, v in enumerate(vals):
        errs = label_value_errors(v)
        if errs:
            raise bad_request(_invalid(f"{prefix}values[{i}][{key}]", v, errs))
    return Requirement(key, operator, vals)


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """An AND of requirements (sorted by key). Empty = everything; `nothing()` = nothing."""

    requirements: tuple[Requirement, ...] = ()
    match_nothing: bool = False

    @staticmethod
    def everything() -> LabelSelector:
        return LabelSelector()

    @staticmethod
    def nothing() -> LabelSelector:
        return LabelSelector((), True)

    @staticmethod
    def of(requirements: Iterable[Requirement]) -> LabelSelector:
        return LabelSelector(tuple(sorted(requirements, key=lambda r: r.key)))

    def empty(self) -> bool:
        return not self.requirements and not self.match_nothing

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        if self.match_nothing:
            return False
        lbls = labels or {}
        return all(r.matches(lbls) for r in self.requirements)

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)


# --- lexer ---------------------------------------------------------------------------------------

_T_ID = "identifier"
_T_END = "end of string"
_T_ERROR = "error"
_T_IN = "in"
_T_NOTIN = "notin"
_SYMBOLS = {
    "!": "!",
    "!=": "!=",
    "(": "(",
    ")": ")",
    ",": ",",
    "=": "=",
    "==": "==",
    ">": ">",
    "<": "<",
}
_SPECIAL = frozenset("=!(),<>")
_WHITESPACE = frozenset(" \t\r\n")


def _lex(text: str) -> list[tuple[str, str]]:
    """All tokens as (kind, literal), ending with the end-of-string token."""
    out: list[tuple[str, str]] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in _WHITESPACE:
            i += 1
        if i >= n:
            out.append((_T_END, ""))
            return out
        ch = text[i]
        if ch in _SPECIAL:
            buf = ""
            last: tuple[str, str] | None = None
            j = i
            while j < n and text[j] in _SPECIAL:
                buf += text[j]
                if buf in _SYMBOLS:
                    last = (_SYMBOLS[buf], buf)
                elif last is not None:
                    break
                j += 1
            if last is None:
                out.append((_T_ERROR, f"error expected: keyword found '{buf}'"))
                out.append((_T_END, ""))
                return out
            out.append(last)
            i += len(last[1])
        else:
            j = i
            while j < n and text[j] not in _WHITESPACE and text[j] not in _SPECIAL:
                j += 1
            word = text[i:j]
            out.append((_T_IN if word == "in" else _T_NOTIN if word == "notin" else _T_ID, word))
            i = j


class _Parser:
    """Recursive descent over the tokens; `values` mode turns `in`/`notin` into identifiers."""

    def __init__(self, text: str) -> None:
        self.toks = _lex(text)
        self.pos = 0

    def lookahead(self, values: bool) -> tuple[str, str]:
        tok, lit = self.toks[self.pos]
        if values and tok in (_T_IN, _T_NOTIN):
            tok = _T_ID
        return tok, lit

    def consume(self, values: bool) -> tuple[str, str]:
        t = self.lookahead(values)
        if self.pos < len(self.toks) - 1:
            self.pos += 1
        return t

    def parse(self) -> list[Requirement]:
        reqs: list[Requirement] = []
        while True:
            tok, lit = self.lookahead(True)
            if tok in (_T_ID, "!"):
                try:
                    reqs.append(self.requirement())
                except ApiError as e:
                    raise bad_request(f"unable to parse requirement: {e.message}") from None
                t, lit = self.consume(True)
                if t == _T_END:
                    return reqs
                if t == ",":
                    t2, l2 = self.lookahead(True)
                    if t2 not in (_T_ID, "!"):
                        raise bad_request(f"found '{l2}', expected: identifier after ','")
                else:
                    raise bad_request(f"found '{lit}', expected: ',' or 'end of string'")
            elif tok == _T_END:
                return reqs
            else:
                raise bad_request(f"found '{lit}', expected: !, identifier, or 'end of string'")

    def requirement(self) -> Requirement:
        op = ""
        tok, lit = self.consume(True)
        if tok == "!":
            op = DOES_NOT_EXIST
            tok, lit = self.consume(True)
        if tok != _T_ID:
            raise bad_request(f"found '{lit}', expected: identifier")
        key = lit
        errs = label_key_errors(key)
        if errs:
            raise bad_request(_invalid("key", key, errs))
        t, _ = self.lookahead(True)
        if t in (_T_END, ","):
            return requirement(key, op or EXISTS)
        if op == DOES_NOT_EXIST:
            raise bad_request(f"found '{key}', expected: ',' or 'end of string'")
        tok, lit = self.consume(False)
        if tok == _T_IN:
            return requirement(key, IN, self.set_values())
        if tok == _T_NOTIN:
            return requirement(key, NOT_IN, self.set_values())
        if tok in ("=", "==", "!=", ">", "<"):
            return requirement(key, tok, self.exact_value())
        raise bad_request(f"found '{lit}', expected: in, notin, =, ==, !=, gt, lt")

    def exact_value(self) -> list[str]:
        tok, _ = self.lookahead(True)
        if tok in (_T_END, ","):
            return [""]
        tok, lit = self.consume(True)
        if tok == _T_ID:
            return [lit]
        raise bad_request(f"found '{lit}', expected: identifier")

    def set_values(self) -> list[str]:
        tok, lit = self.consume(True)
        if tok != "(":
            raise bad_request(f"found '{lit}' expected: '('")
        tok, lit = self.lookahead(True)
        if tok in (_T_ID, ","):
            values = self.identifiers()
            tok, _ = self.consume(True)
            if tok != ")":
                raise bad_request(f"found '{lit}', expected: ')'")
            return values
        if tok == ")":
            self.consume(True)
            return [""]
        raise bad_request(f"found '{lit}', expected: ',', ')' or identifier")

    def identifiers(self) -> list[str]:
        s: list[str] = []
        while True:
            tok, lit = self.consume(True)
            if tok == _T_ID:
                s.append(lit)
                t2, l2 = self.lookahead(True)
                if t2 == ",":
                    continue
                if t2 == ")":
                    return s
                raise bad_request(f"found '{l2}', expected: ',' or ')'")
            if tok == ",":
                if not s:
                    s.append("")  # "(,"
                t2, _ = self.lookahead(True)
                if t2 == ")":
                    s.append("")  # ",)"
                    return s
                if t2 == ",":
                    self.consume(True)
                    s.append("")  # ",,"
            else:
                raise bad_request(f"found '{lit}', expected: ',', or identifier")


def parse_label_selector(text: str) -> LabelSelector:
    """`?labelSelector=` → LabelSelector (empty or blank text = everything)."""
    return LabelSelector.of(_Parser(text).parse())


def selector_from_set(labels: Mapping[str, str]) -> LabelSelector:
    """labels.SelectorFromSet: every key must equal its value."""
    return LabelSelector.of(requirement(k, EQUALS, [v]) for k, v in labels.items())


# --- metav1.LabelSelector objects ----------------------------------------------------------------

_EXPR_OPS = {"In": IN, "NotIn": NOT_IN, "Exists": EXISTS, "DoesNotExist": DOES_NOT_EXIST}


def validate_label_selector_object(obj: Any, path: str = "spec.selector") -> list[Cause]:
    """metav1validation.ValidateLabelSelector: field causes (for a kind's 422 validation)."""
    if obj is None:
        return []
    if not isinstance(obj, dict):
        return [Cause(path, "Invalid value: must be an object", "FieldValueTypeInvalid")]
    causes: list[Cause] = []
    match_labels = obj.get("matchLabels") or {}
    if not isinstance(match_labels, dict):
        causes.append(Cause(f"{path}.matchLabels", "Invalid value: must be an object"))
        match_labels = {}
    for k, v in match_labels.items():
        kerrs = label_key_errors(str(k))
        if kerrs:
            causes.append(
                Cause(f"{path}.matchLabels", f"Invalid value: {_quote(str(k))}: {'; '.join(kerrs)}")
            )
        if not isinstance(v, str):
            causes.append(Cause(f"{path}.matchLabels", f"Invalid value: {v!r}: must be a string"))
            continue
        verrs = label_value_errors(v)
        if verrs:
            causes.append(
                Cause(f"{path}.matchLabels", f"Invalid value: {_quote(v)}: {'; '.join(verrs)}")
            )
    exprs = obj.get("matchExpressions") or []
    if not isinstance(exprs, list):
        causes.append(Cause(f"{path}.matchExpressions", "Invalid value: must be a list"))
        exprs = []
    for i, expr in enumerate(exprs):
        p = f"{path}.matchExpressions[{i}]"
        if not isinstance(expr, dict):
            causes.append(Cause(p, "Invalid value: must be an object"))
            continue
        op = expr.get("operator")
        values = expr.get("values") or []
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            causes.append(Cause(f"{p}.values", "Invalid value: must be a list of strings"))
            values = []
        if op in ("In", "NotIn"):
            if not values:
                causes.append(
                    Cause(
                        f"{p}.values",
                        "Required value: must be specified when `operator` is 'In' or 'NotIn'",
                        "FieldValueRequired",
                    )
                )
        elif op in ("Exists", "DoesNotExist"):
            if values:
                causes.append(
                    Cause(
                        f"{p}.values",
                        "Forbidden: may not be specified when `operator` is 'Exists' or "
                        "'DoesNotExist'",
                        "FieldValueForbidden",
                    )
                )
        else:
            causes.append(
                Cause(
                    f"{p}.operator",
                    f"Unsupported value: {_quote(str(op))}: supported values: "
                    '"In", "NotIn", "Exists", "DoesNotExist"',
                    "FieldValueNotSupported",
                )
            )
        key = expr.get("key")
        if not isinstance(key, str) or not key:
            causes.append(Cause(f"{p}.key", "Required value", "FieldValueRequired"))
        else:
            kerrs = label_key_errors(key)
            if kerrs:
                causes.append(
                    Cause(f"{p}.key", f"Invalid value: {_quote(key)}: {'; '.join(kerrs)}")
                )
        for j, v in enumerate(values):
            verrs = label_value_errors(v)
            if verrs:
                causes.append(
                    Cause(f"{p}.values[{j}]", f"Invalid value: {_quote(v)}: {'; '.join(verrs)}")
                )
    return causes


def from_label_selector_object(obj: Any, path: str = "spec.selector") -> LabelSelector:
    """metav1.LabelSelectorAsSelector: None = nothing, {} = everything; invalid → 400, causes."""
    if obj is None:
        return LabelSelector.nothing()
    causes = validate_label_selector_object(obj, path)
    if causes:
        listed = "; ".join(f"{c.field}: {c.message}" for c in causes)
        raise bad_request(f"invalid label selector: {listed}", causes)
    reqs = [requirement(k, EQUALS, [v]) for k, v in (obj.get("matchLabels") or {}).items()]
    for expr in obj.get("matchExpressions") or []:
        reqs.append(requirement(expr["key"], _EXPR_OPS[expr["operator"]], expr.get("values") or []))
    return LabelSelector.of(reqs)


def selector_to_string(obj: Any) -> str:
    """A metav1.LabelSelector as `a=b,c in (d)` (Scale.status.selector); "" for None or {}."""
    if obj is None:
        return ""
    return str(from_label_selector_object(obj))
