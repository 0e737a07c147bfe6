"""What a request asks for: its URL parsed into a `RequestInfo`, and its query string as a `Query`
(typed accessors; the typed options built from it are in `options`).

Paths (as kube-apiserver's RequestInfoFactory reads them):
  /api/v1[/namespaces/NS]/RESOURCE[/NAME[/SUB]]        core group
  /apis/GROUP/VERSION[/namespaces/NS]/RESOURCE[/NAME[/SUB]]
`/api/v1/namespaces/NS` itself is the Namespace NAME (and `/api/v1/namespaces/NS/status` its
status subresource). The verb follows from the method, whether a name is present and `watch`.
Unknown query parameters are ignored (kubectl sends `timeout=32s` everywhere); malformed known
ones are 400s. Booleans parse like Go's strconv.ParseBool (Python sends `watch=True`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qs

from orchestrator.kube import errors

_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}
_INTEGER = re.compile(r"[+-]?[0-9]{1,20}", re.ASCII)


@dataclass(frozen=True, slots=True)
class RequestInfo:
    group: str
    version: str
    resource: str
    namespace: str = ""
    name: str = ""
    subresource: str = ""
    verb: str = ""  # get list watch create update patch delete deletecollection


def parse_path(method: str, path: str, query: Query) -> RequestInfo | None:
    """The resource request a path names, or None when it is not one (discovery, probes...)."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    if not rest:
        return None
    namespace = ""
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    elif rest[0] == "namespaces" and len(rest) == 2 and group == "":
        rest = ["namespaces", rest[1]]
    if len(rest) > 3:
        return None
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    sub = rest[2] if len(rest) > 2 else ""
    if namespace and resource == "namespaces" and group == "":
        return None  # /api/v1/namespaces/NS/namespaces/... is not a thing
    watching = query.flag("watch")
    method = method.upper()
    if method in ("GET", "HEAD"):
        verb = ("watch" if watching else "get") if name else ("watch" if watching else "list")
    elif method == "POST":
        verb = "create"
    elif method == "PUT":
        verb = "update"
    elif method == "PATCH":
        verb = "patch"
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        raise errors.method_not_allowed(f"method {method} is not supported")
    return RequestInfo(group, version, resource, namespace, name, sub, verb)


class Query:
    """The query string, with typed accessors that raise 400 on malformed values."""

    def __init__(self, raw: str | bytes) -> None:
        text = raw.decode("latin-1") if isinstance(raw, bytes) else raw
        self._values = parse_qs(text, keep_blank_values=True)

    def get(self, name: str, default: str = "") -> str:
        vals = self._values.get(name)
        return vals[-1] if vals else default

    def get_all(self, name: str) -> list[str]:
        return list(self._values.get(name, []))

    def has(self, name: str) -> bool:
        return name in self._values

    def flag(self, name: str, default: bool = False) -> bool:
        text = self.get(name)
        if not text:
            return default
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise errors.bad_request(f"invalid boolean value {text!r} for query parameter {name!r}")

    def number(self, name: str, default: int | None = None) -> int | None:
        text = self.get(name)
        if not text:
            return default
        # Go's strconv.ParseInt: ASCII digits with an optional sign, 64 bits. Python's int()
        # would also take " 5", "1_000" and non-ASCII digits.
        if _INTEGER.fullmatch(text) is None or not -(2**63) <= int(text) < 2**63:
            raise errors.bad_request(f"invalid integer value {text!r} for query parameter {name!r}")
        return int(text)
