"""Object names, label keys and values, annotations: apimachinery's checks with its exact messages.

Each `is_*` function returns a list of messages (empty = valid), worded and punctuated like
`k8s.io/apimachinery/pkg/util/validation` so kubectl prints what a real cluster prints;
`validate_metadata` turns them into `Cause`s on `metadata.*` fields.

Invariants: pure functions, never raise on any JSON value (a non-string name is a cause, not a
crash); `generate_name` takes its RNG as an argument.
"""

from __future__ import annotations

import functools
import json
import random
import re
from collections.abc import Callable
from typing import Any, Literal

from orchestrator.kube.errors import Cause

NameRule = Literal["subdomain", "label", "label1035", "path"]

DNS1123_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_SUBDOMAIN_FMT = DNS1123_LABEL_FMT + r"(\." + DNS1123_LABEL_FMT + ")*"
DNS1035_LABEL_FMT = "[a-z]([-a-z0-9]*[a-z0-9])?"
QUALIFIED_NAME_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
LABEL_VALUE_FMT = "(" + QUALIFIED_NAME_FMT + ")?"

DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
QUALIFIED_NAME_MAX = 63
LABEL_VALUE_MAX = 63
TOTAL_ANNOTATION_SIZE = 256 * 1024

_LABEL_RE = re.compile(DNS1123_LABEL_FMT)
_SUBDOMAIN_RE = re.compile(DNS1123_SUBDOMAIN_FMT)
_DNS1035_RE = re.compile(DNS1035_LABEL_FMT)
_QUALIFIED_RE = re.compile(QUALIFIED_NAME_FMT)
_LABEL_VALUE_RE = re.compile(LABEL_VALUE_FMT)

# apimachinery's rand.String alphabet: no vowels (no words), no confusable 0/1/3.
NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_RANDOM_LENGTH = 5
_MAX_GENERATED_BASE = 63 - _RANDOM_LENGTH


def _regex_error(msg: str, fmt: str, *examples: str) -> str:
    """validation.RegexError, including its odd `'a', or 'b', regex ...` punctuation."""
    if not examples:
        return f"{msg} (regex used for validation is '{fmt}')"
    msg += " (e.g. "
    for i, example in enumerate(examples):
        if i > 0:
            msg += " or "
        msg += f"'{example}', "
    return msg + f"regex used for validation is '{fmt}')"


def _max_len(n: int) -> str:
    return f"must be no more than {n} characters"


def _full(regex: re.Pattern[str], value: str) -> bool:
    return regex.fullmatch(value) is not None


DNS1123_LABEL_MSG = _regex_error(
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character",
    DNS1123_LABEL_FMT,
    "my-name",
    "123-abc",
)
DNS1123_SUBDOMAIN_MSG = _regex_error(
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character",
    DNS1123_SUBDOMAIN_FMT,
    "example.com",
)
DNS1035_LABEL_MSG = _regex_error(
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
    "alphabetic character, and end with an alphanumeric character",
    DNS1035_LABEL_FMT,
    "my-name",
    "abc-123",
)
_QUALIFIED_MSG = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character"
)
LABEL_VALUE_MSG = _regex_error(
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character",
    LABEL_VALUE_FMT,
    "MyValue",
    "my_value",
    "12345",
)


# Values recently found valid, per check: every write checks the same namespace, label keys
# and values, owner names... again, and a set lookup is several times cheaper than the regex.
_VALID: dict[str, set[str]] = {}
_VALID_MAX = 4096  # per check; past it the set starts over


def _remember_valid(
    check: str,
) -> Callable[[Callable[[str], list[str]]], Callable[[str], list[str]]]:
    """Answer `[]` at once for a value the decorated check passed before (errors are not
    remembered: a new list each time, as callers may extend it)."""

    def wrap(fn: Callable[[str], list[str]]) -> Callable[[str], list[str]]:
        seen = _VALID.setdefault(check, set())

        @functools.wraps(fn)
        def checked(value: str) -> list[str]:
            if value in seen:
                return []
            errs = fn(value)
            if not errs:
                if len(seen) >= _VALID_MAX:
                    seen.clear()
                seen.add(value)
            return errs

        return checked

    return wrap


@_remember_valid("label")
def is_dns1123_label(value: str) -> list[str]:
    errs = []
    if len(value) > DNS1123_LABEL_MAX:
        errs.append(_max_len(DNS1123_LABEL_MAX))
    if not _full(_LABEL_RE, value):
        errs.append(DNS1123_LABEL_MSG)
    return errs


@_remember_valid("subdomain")
def is_dns1123_subdomain(value: str) -> list[str]:
    errs = []
    if len(value) > DNS1123_SUBDOMAIN_MAX:
        errs.append(_max_len(DNS1123_SUBDOMAIN_MAX))
    if not _full(_SUBDOMAIN_RE, value):
        errs.append(DNS1123_SUBDOMAIN_MSG)
    return errs


def is_dns1035_label(value: str) -> list[str]:
    errs = []
    if len(value) > DNS1123_LABEL_MAX:
        errs.append(_max_len(DNS1123_LABEL_MAX))
    if not _full(_DNS1035_RE, value):
        errs.append(DNS1035_LABEL_MSG)
    return errs


_PORT_NAME_CHARS = re.compile(r"[-a-z0-9]+", re.ASCII)
_PORT_NAME_LETTER = re.compile(r"[a-z]", re.ASCII)


def is_valid_port_name(value: str) -> list[str]:
    """validation.IsValidPortName (an IANA_SVC_NAME, RFC 6335): a container port's name."""
    errs = []
    if len(value) > 15:
        errs.append("must be no more than 15 characters")
    if not _full(_PORT_NAME_CHARS, value):
        errs.append("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)")
    if "--" in value:
        errs.append("must not contain consecutive hyphens")
    if value and _PORT_NAME_LETTER.search(value) is None:
        errs.append("must contain at least one letter (a-z)")
    if value.startswith("-") or value.endswith("-"):
        errs.append("must not begin or end with a hyphen")
    return errs


def is_path_segment_name(value: str) -> list[str]:
    """path.IsValidPathSegmentName: the name must be usable as one URL path segment."""
    if value in (".", ".."):
        return [f"may not be '{value}'"]
    errs = []
    for bad in ("/", "%"):
        if bad in value:
            errs.append(f"may not contain '{bad}'")
    return errs


def is_qualified_name(value: str) -> list[str]:
    """A label key or annotation key: optional DNS-subdomain prefix, '/', name (≤63)."""
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
        errs: list[str] = []
    elif len(parts) == 2:
        prefix, name = parts
        errs = []
        if not prefix:
            errs.append("prefix part must be non-empty")
        else:
            errs.extend("prefix part " + m for m in is_dns1123_subdomain(prefix))
    else:
        return [
            "a qualified name "
            + _regex_error(_QUALIFIED_MSG, QUALIFIED_NAME_FMT, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > QUALIFIED_NAME_MAX:
        errs.append("name part " + _max_len(QUALIFIED_NAME_MAX))
    if name and not _full(_QUALIFIED_RE, name):
        errs.append(
            "name part "
            + _regex_error(_QUALIFIED_MSG, QUALIFIED_NAME_FMT, "MyName", "my.name", "123-abc")
        )
    return errs


@_remember_valid("label value")
def is_label_value(value: str) -> list[str]:
    errs = []
    if len(value) > LABEL_VALUE_MAX:
        errs.append(_max_len(LABEL_VALUE_MAX))
    if not _full(_LABEL_VALUE_RE, value):
        errs.append(LABEL_VALUE_MSG)
    return errs


def name_errors(value: str, rule: NameRule, *, prefix: bool = False) -> list[str]:
    """The messages for a name under `rule`; `prefix` checks a generateName (trailing '-' ok)."""
    if prefix and len(value) > 1 and value.endswith("-"):
        value = value[:-1] + "a"  # apimachinery's maskTrailingDash
    if rule == "label":
        return is_dns1123_label(value)
    if rule == "label1035":
        return is_dns1035_label(value)
    if rule == "path":
        return is_path_segment_name(value)
    return is_dns1123_subdomain(value)


def generate_name(prefix: str, rng: random.Random) -> str:
    """apimachinery's SimpleNameGenerator: prefix (cut to 58) + 5 random chars."""
    base = prefix[:_MAX_GENERATED_BASE]
    return base + "".join(rng.choice(NAME_ALPHABET) for _ in range(_RANDOM_LENGTH))


def quote(value: Any) -> str:
    """A bad value as Go's field.Error prints it: strings quoted, numbers and bools bare."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value) if isinstance(value, float) else str(value)
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)


def _invalid(field: str, value: Any, msg: str) -> Cause:
    return Cause(field, f"Invalid value: {quote(value)}: {msg}")


def validate_labels(labels: Any, field: str = "metadata.labels") -> list[Cause]:
    if labels is None:
        return []
    if not isinstance(labels, dict):
        return [_invalid(field, labels, "must be a map of string keys to string values")]
    causes = []
    for k, v in labels.items():
        for msg in is_qualified_name(str(k)):
            causes.append(_invalid(field, k, msg))
        if not isinstance(v, str):
            causes.append(_invalid(f"{field}[{k}]", v, "must be a string"))
            continue
        for msg in is_label_value(v):
            causes.append(_invalid(field, v, msg))
    return causes


def validate_annotations(annotations: Any, field: str = "metadata.annotations") -> list[Cause]:
    if annotations is None:
        return []
    if not isinstance(annotations, dict):
        return [_invalid(field, annotations, "must be a map of string keys to string values")]
    causes = []
    total = 0
    for k, v in annotations.items():
        for msg in is_qualified_name(str(k).lower()):
            causes.append(_invalid(field, k, msg))
        if not isinstance(v, str):
            causes.append(_invalid(f"{field}[{k}]", v, "must be a string"))
            continue
        total += len(str(k).encode()) + len(v.encode())
    if total > TOTAL_ANNOTATION_SIZE:
        causes.append(
            Cause(
                field,
                f"Too long: may not be more than {TOTAL_ANNOTATION_SIZE} bytes",
                "FieldValueTooLong",
            )
        )
    return causes


def validate_metadata(meta: Any, *, namespaced: bool, name_rule: NameRule) -> list[Cause]:
    """ObjectMeta checks for create/update: name or generateName, namespace, labels, annotations.

    `meta` is the object's `metadata` as sent (any JSON value). The caller fills the namespace
    from the URL before calling, so a missing namespace on a namespaced kind is an error here.
    """
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        return [_invalid("metadata", meta, "must be an object")]
    causes: list[Cause] = []
    name = meta.get("name")
    generate = meta.get("generateName")
    if generate not in (None, ""):
        if not isinstance(generate, str):
            causes.append(_invalid("metadata.generateName", generate, "must be a string"))
        else:
            for msg in name_errors(generate, name_rule, prefix=True):
                causes.append(_invalid("metadata.generateName", generate, msg))
    if name in (None, ""):
        if generate in (None, ""):
            causes.append(
                Cause(
                    "metadata.name",
                    "Required value: name or generateName is required",
                    "FieldValueRequired",
                )
            )
    elif not isinstance(name, str):
        causes.append(_invalid("metadata.name", name, "must be a string"))
    else:
        for msg in name_errors(name, name_rule):
            causes.append(_invalid("metadata.name", name, msg))
    namespace = meta.get("namespace")
    if namespaced:
        if namespace in (None, ""):
            causes.append(Cause("metadata.namespace", "Required value", "FieldValueRequired"))
        elif not isinstance(namespace, str):
            causes.append(_invalid("metadata.namespace", namespace, "must be a string"))
        else:
            for msg in is_dns1123_label(namespace):
                causes.append(_invalid("metadata.namespace", namespace, msg))
    elif namespace not in (None, ""):
        causes.append(
            Cause(
                "metadata.namespace", "Forbidden: not allowed on this type", "FieldValueForbidden"
            )
        )
    causes.extend(validate_labels(meta.get("labels")))
    causes.extend(validate_annotations(meta.get("annotations")))
    finalizers = meta.get("finalizers")
    if isinstance(finalizers, list):
        for i, f in enumerate(finalizers):
            if isinstance(f, str):
                for msg in is_qualified_name(f):
                    causes.append(_invalid(f"metadata.finalizers[{i}]", f, msg))
    return causes
